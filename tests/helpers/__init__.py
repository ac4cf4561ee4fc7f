"""Helpers shared by several test modules (import them from here, not from another test module)."""
