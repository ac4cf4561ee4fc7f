"""The package version (one place: the root ``__init__``, the CLI and the reports read it here)."""

__version__ = "0.1.0"
