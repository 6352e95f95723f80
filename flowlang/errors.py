"""The one error hierarchy of flowlang: every error carries a source position."""

from __future__ import annotations


class FlowError(Exception):
    """Base of every error flowlang raises on purpose.

    ``str(error)`` is ``FILE:LINE:COL: message`` (``LINE:COL: message`` when
    the text had no file name), the form editors and CI logs understand.
    """

    def __init__(self, message: str, line: int = 0, column: int = 0, file: str | None = None):
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column
        self.file = file

    def located(self, file: str | None) -> FlowError:
        """Attach the file name (errors are raised before the caller knows it)."""
        self.file = file
        return self

    def __str__(self) -> str:
        where = f"{self.line}:{self.column}" if self.line else ""
        if self.file:
            where = f"{self.file}:{where}" if where else self.file
        return f"{where}: {self.message}" if where else self.message


class FlowSyntaxError(FlowError):
    """Raised when the text does not follow the grammar (a stray arrow, a bad character)."""


class FlowLiteralError(FlowError):
    """Raised when a YAML or JSON literal does not parse or is not an object or array."""


class FlowLabelError(FlowError):
    """Raised when labels do not connect: defined twice, never defined, misplaced."""


class FlowDeclarationError(FlowError):
    """Raised for a bad `@flow`/`@task` declaration or a parameter type clash."""


class FlowStructureError(FlowError):
    """Raised when a flow has no statement, or a subflow is empty."""


class FlowPolicyError(FlowError):
    """Raised for an unknown reserved ``$`` parameter (``$retrys``) or a bad
    ``$retries``/``$backoff``/``$timeout`` value in a task's parameters."""


class FlowCycleError(FlowError):
    """Raised when a cycle can go round without starting a task (a workflow would loop
    forever); its position is a node on the cycle."""


class FlowRuntimeError(FlowError):
    """Raised when data breaks a rule at run time (merging a non-object, iterating a non-list).

    Its position is the step's position in the flow text.
    """
