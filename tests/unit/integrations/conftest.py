"""Without the ``train`` extra, skip the helper modules that import TRL (the tests skip themselves)."""

from __future__ import annotations

import importlib.util

collect_ignore: list[str] = [] if importlib.util.find_spec("trl") else ["tiny_trainer.py", "launch_callback.py"]
