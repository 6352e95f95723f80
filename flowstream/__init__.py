"""Composition: the engine (``lifecycle``) together with the task workers (``workers``).

The only package allowed to import both: ``python -m lifecycle`` runs the program
assembled here (:func:`flowstream.cli.main`), so ``worker`` also serves ``wait:``
tasks and ``demo`` runs a whole deployment in one process, while the
``lifecycle`` package itself knows no task worker.
"""
