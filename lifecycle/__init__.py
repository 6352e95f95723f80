"""lifecycle: runs workflows on Redis — the worker, submission, inspection, replay."""
