"""Corrective fine-tuning on TRL's ``GRPOTrainer``: GRPO, GDPO or GDPO with dynamic channel weights.

``collapse-doctor retrain`` is :func:`collapse_doctor.retrain.run.run_retrain`. Modules:

``settings``   the ``--config`` keys (JSON/TOML), algorithm resolution
``rewards``    built-in reward functions and the ``name=module:function`` resolver
``data``       JSONL/Parquet prompt datasets
``demo``       the ``--demo`` tiny model, tokenizer and arithmetic task (built in code)
``plan``       options -> plan -> TRL ``GRPOConfig``; ``--from-scan`` remedies
``dynamic``    gdpo-dynamic's EMA state (the math is in :mod:`collapse_doctor.advantages`)
``trainer``    the seam: a ``GRPOTrainer`` subclass (needs the ``train`` extra)
``callbacks``  Ctrl-C / ``--fail-on`` stops, adaptive KL, checkpointed state
``monitor``    rollout Parquet parts and TensorBoard scalars while training
``run``        ``run_retrain`` and ``plan_retrain``

Only ``trainer``, ``callbacks`` and ``run`` (inside its functions) import TRL.
"""
