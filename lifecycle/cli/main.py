"""``python -m lifecycle``: the parser and the dispatch of its commands.

Each command module adds its subcommands with ``set_defaults(func=...)``;
:func:`main` parses, configures logging and hands the chosen function to
:func:`lifecycle.cli.support.dispatch`. :data:`LIFECYCLE_COMMANDS` is the
engine's own set; a composition (the ``flowstream`` package) passes its own
list, e.g. with a worker that also serves ``wait:`` tasks and the demo.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from lifecycle.cli import audit, control, dead_letters, look, run, schedule, status, worker
from lifecycle.cli import limits as kind_limits
from lifecycle.cli.support import EXIT_CODES_HELP, Registrar, common_options, dispatch

__all__ = ["ENGINE_COMMANDS", "LIFECYCLE_COMMANDS", "Registrar", "build_parser", "main"]

# Every command but the worker, which a composition builds with its companions.
ENGINE_COMMANDS: tuple[Registrar, ...] = (
    run.add_commands,
    look.add_commands,
    control.add_commands,
    audit.add_commands,
    status.add_commands,
    dead_letters.add_commands,
    schedule.add_commands,
    kind_limits.add_commands,
)
LIFECYCLE_COMMANDS: tuple[Registrar, ...] = (worker.worker_command(), *ENGINE_COMMANDS)

EXAMPLES = """\
examples:
  python -m lifecycle worker                          # run a lifecycle worker
  python -m lifecycle run examples/orders.flow --wait # start a workflow, wait for its output
  python -m lifecycle demo                            # everything in one process, embedded Redis

"""


def build_parser(commands: Sequence[Registrar] = LIFECYCLE_COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lifecycle",
        description="Run workflows on Redis Streams.",
        epilog=EXAMPLES + EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = common_options()
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in commands:
        register(subparsers, common)
    return parser


def main(argv: list[str] | None = None, commands: Sequence[Registrar] = LIFECYCLE_COMMANDS) -> int:
    """Parse ``argv`` (default: sys.argv), run the command, return its exit code."""
    args = build_parser(commands).parse_args(argv)
    narrates = getattr(args, "narrates", False)  # workers log their progress; the rest is quiet
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO if narrates else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return dispatch(args)
