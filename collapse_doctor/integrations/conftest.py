"""pytest (doctests): without the ``train`` extra, skip the module that imports transformers."""

from __future__ import annotations

import importlib.util

collect_ignore: list[str] = [] if importlib.util.find_spec("trl") else ["trl.py"]
