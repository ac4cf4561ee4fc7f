"""collapse-doctor: find advantage and reward collapse in multi-reward GRPO fine-tuning, and fix it.

Importing the package is cheap: torch and pyarrow load only when a function that needs them runs.
"""

__version__ = "0.1.0"
