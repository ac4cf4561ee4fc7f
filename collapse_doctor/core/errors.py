"""User-facing errors.

Every problem a user can fix (bad file, bad column, bad option) raises a subclass of
:class:`CollapseDoctorError` whose message names the input and says what to do. The CLI prints
``error: <message>`` on one line and exits with code 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations


class CollapseDoctorError(Exception):
    """Base class of every error whose message is meant for the user."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(self.one_line())

    def __reduce__(self) -> tuple[object, ...]:
        # Picklable with its hint (a Ray task's error comes back to the driver as it was raised).
        return _rebuild, (type(self), self.message, self.hint)

    def one_line(self) -> str:
        text = self.message if not self.hint else f"{self.message}. Hint: {self.hint}"
        # One line, always: file names or values may carry newlines.
        return " ".join(text.split())


class InputError(CollapseDoctorError):
    """An input file is missing, unreadable or does not match the expected layout."""


class SchemaError(InputError):
    """Columns are missing, mistyped or hold values that cannot be used."""


class UsageError(CollapseDoctorError):
    """Options contradict each other or name things that do not exist."""


class DeviceError(CollapseDoctorError):
    """The requested compute device is not available."""


class OutputError(CollapseDoctorError):
    """The output cannot be written where the user asked."""


def _rebuild(kind: type[CollapseDoctorError], message: str, hint: str | None) -> CollapseDoctorError:
    return kind(message, hint=hint)
