"""``python -m lifecycle``: the engine's command line (parser and dispatch in
:mod:`lifecycle.cli.main`, shared options and error handling in
:mod:`lifecycle.cli.support`, one module per group of commands)."""

from lifecycle.cli.main import LIFECYCLE_COMMANDS, build_parser, main
from lifecycle.cli.support import EXIT_ERROR, EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError

__all__ = [
    "EXIT_ERROR",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "LIFECYCLE_COMMANDS",
    "CliError",
    "build_parser",
    "main",
]
