"""The audit: the receipts archive, replay and recover.

:mod:`~lifecycle.audit.receipts` is the worker that archives every engine event
(:mod:`~lifecycle.audit.archive` the line format and reader,
:mod:`~lifecycle.audit.segments` the files); :mod:`~lifecycle.audit.verify` checks
the hash chain; :mod:`~lifecycle.audit.replay` rebuilds workflows through the
engine's transition; :mod:`~lifecycle.audit.report` audits a whole archive;
:mod:`~lifecycle.audit.recover` restores what Redis lost.
"""
