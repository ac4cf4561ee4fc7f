"""pytest (doctests): without the ``train`` extra, skip the modules that import TRL or transformers."""

from __future__ import annotations

import importlib.util

collect_ignore: list[str] = [] if importlib.util.find_spec("trl") else ["callbacks.py", "demo.py", "recipe_callback.py"]
