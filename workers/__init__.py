"""Task workers: one EventListener per task kind, built-in tasks, simulators."""
