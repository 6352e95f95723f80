"""The ``python -m lifecycle`` program as shipped: the engine's commands, a worker that
also serves the built-in ``wait:`` tasks, and the demo."""

from __future__ import annotations

from flowstream.api.serve import add_commands as serve_commands
from flowstream.demo import add_commands as demo_commands
from flowstream.worker import WaitCompanion
from lifecycle.cli.main import ENGINE_COMMANDS
from lifecycle.cli.main import main as lifecycle_main
from lifecycle.cli.support import Registrar
from lifecycle.cli.worker import worker_command

__all__ = ["COMMANDS", "main"]

COMMANDS: tuple[Registrar, ...] = (
    worker_command([WaitCompanion()]),
    *ENGINE_COMMANDS,
    demo_commands,
    serve_commands,
)


def main(argv: list[str] | None = None) -> int:
    """``python -m lifecycle`` and the ``flow-lifecycle`` script."""
    return lifecycle_main(argv, COMMANDS)
