"""Corrective fine-tuning on TRL's ``GRPOTrainer``: GRPO, GDPO or GDPO with dynamic channel weights.

``collapse-doctor retrain`` is :func:`collapse_doctor.retrain.run.run_retrain`. Modules:

``settings``   the ``--config`` keys (JSON/TOML), algorithm resolution
``rewards``    built-in reward functions and the ``name=module:function`` resolver
``data``       JSONL/Parquet prompt datasets
``demo``       the ``--demo`` tiny model, tokenizer and tasks (digit copy, sums; built in code)
``plan``       options -> plan -> TRL ``GRPOConfig``; ``--output-dir`` and hub-id checks
``from_scan``  ``--from-scan``: a scan's remedy actions resolved into one set of changes (weights, drops, recipes)
``schedule``   the recipe keys (temperature schedule, hybrid switch, channel starts, conditions, std clip)
``recipes``    the advantages a schedule implies, step by step (the seam's ``advantage_transform``)
``recipe_callback``  the on-finding hybrid switch and the schedule's checkpointed state
``dynamic``    gdpo-dynamic's EMA state (the math is in :mod:`collapse_doctor.engine.advantages`)
``callbacks``  Ctrl-C stop with a checkpoint, adaptive KL, checkpointed gdpo-dynamic state
``run``        ``run_retrain`` and ``plan_retrain``: a plain ``GRPOTrainer`` with
               :class:`collapse_doctor.integrations.trl.CollapseDoctorCallback` (the seam, the rollouts,
               the scalars, ``--fail-on``) and the ``callbacks`` above

Only ``callbacks``, ``recipe_callback``, ``demo`` and ``run`` (inside its functions) import TRL or transformers.
"""
