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
        """The message and its hint on one line (file names or values may carry newlines); no doubled
        punctuation where the message ends with its own (``?``, ``!``, ``.``, ``:``).

        >>> InputError("a.parquet: the same file given twice?", hint="remove one").one_line()
        'a.parquet: the same file given twice? Hint: remove one'
        >>> InputError("bad value", hint="fix it.").one_line()
        'bad value. Hint: fix it.'
        """
        message = self.message.rstrip()
        if self.hint:
            end = "" if message.endswith((".", "?", "!", ":")) else "."
            message = f"{message}{end} Hint: {self.hint}"
        return " ".join(message.split())


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
