"""The engine: advance workflows on Redis.

:mod:`~lifecycle.engine.transition` is the pure transition (a stored record and
events in, every write out); :mod:`~lifecycle.engine.advance` and
:mod:`~lifecycle.engine.commit` are the I/O around it (load, then one MULTI/EXEC
or ``scripts/advance.lua``); :mod:`~lifecycle.engine.store` reads records and
graphs; :mod:`~lifecycle.engine.timers` fires durable timers.
"""
