"""The lifecycle worker as deployed: it serves the built-in ``wait:`` tasks beside the
lifecycle unless ``--no-wait`` (then run ``python -m workers wait`` elsewhere)."""

from __future__ import annotations

import argparse
from typing import Any

from lifecycle.cli.worker import Running
from lifecycle.keys import Keys

__all__ = ["WaitCompanion"]


class WaitCompanion:
    """Runs a :class:`workers.wait.WaitWorker` thread beside the lifecycle worker. Its
    state lives in Redis, so stopping the thread loses no registered wait."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--no-wait",
            action="store_true",
            help="do not serve the built-in wait: tasks (run python -m workers wait elsewhere)",
        )

    def start(self, args: argparse.Namespace, pool: Any, keys: Keys) -> Running | None:
        if args.no_wait:
            return None
        from workers.wait import WaitWorker

        wait = WaitWorker(
            keys,
            pool=pool,
            consumer=args.consumer,
            claim_idle=args.claim_idle,
            handle_signals=False,
        )
        wait.start()
        return wait
