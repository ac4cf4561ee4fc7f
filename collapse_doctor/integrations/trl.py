"""collapse-doctor inside a TRL training script: one callback on a plain ``trl.GRPOTrainer`` or ``trl.RLOOTrainer``.

>>> from collapse_doctor.integrations.trl import CollapseDoctorCallback   # doctest: +SKIP
>>> trainer = GRPOTrainer(..., callbacks=[CollapseDoctorCallback(fail_on="critical")])   # doctest: +SKIP

Per training step the callback keeps what the trainer scored: the rewards per function (gathered over
processes, NaN where a function returned None) and the advantages the loss used. It writes them as the
canonical rollout table (``OUTPUT/rollouts/part-*.parquet``, ``OUTPUT`` = ``args.output_dir`` unless
``output_dir`` is given) with per-step TensorBoard scalars (``OUTPUT/tensorboard``), the layout of
``collapse-doctor retrain``, so ``collapse-doctor scan OUTPUT`` works during and after the run. It hands the
``collapse_doctor/*`` scalars (per-channel rel_gain, signal share, zero-variance share, weight; the
zero-advantage share, the advantage std) to the trainer's own ``log``, so they reach whatever ``report_to``
is (W&B, TensorBoard, Trackio, MLflow, ``trainer_state.json``). After each part it runs ``scan``'s detectors on
the run so far, prints each finding once, when it first appears, and with ``fail_on`` stops the run
with a checkpoint (TRL's ``should_save`` + ``should_training_stop``).

The seam, on the trainer instance (no subclass; the method signatures are checked against the tested TRL; TRL's
``RLOOTrainer`` has the same three methods with the same signatures and ``_logs``):

``_calculate_rewards``
    returns the ``[N, C]`` rewards of the generation batch, gathered over processes: kept as they are.
``_generate_and_score_completions``
    after TRL's own, ``trainer._logs`` holds the batch's prompts, completions and the advantages of every
    process (the tensor the loss's slices come from, kept by TRL for ``log_completions``): read from there.
``log``
    the ``collapse_doctor/*`` scalars of the steps reduced since the last log join ``logs`` first.

Under ``RLOOTrainer`` the advantages are TRL's leave-one-out ones (``normalize_advantages``: z-scored over the
batch), which ``scan`` fingerprints as ``rloo``. With ``beta != 0`` TRL subtracts ``beta`` times each completion's
KL from its reward before the baseline: the rollouts do not carry that KL, so the advantages go to the column
``advantage_with_kl`` (kept, never compared: CD202 is skipped, not raised) and the callback says so once.

It never breaks training: an exception of its own is reported once (a :class:`CollapseDoctorWarning`) and
the callback switches itself off; TRL goes on. Under accelerate every process records (so all agree on when
to stop) and only the main process writes.
"""

from __future__ import annotations

import inspect
import logging
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import TrainerCallback  # type: ignore[import-untyped,unused-ignore]

from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.findings import VERDICTS, Finding, check_fail_on, severity_counts
from collapse_doctor.core.result import signal_sentence
from collapse_doctor.core.schema import UNCHECKED_ADVANTAGE
from collapse_doctor.core.text_safety import printable
from collapse_doctor.integrations.live import LiveDiagnosis
from collapse_doctor.integrations.rollouts import RolloutMonitor, StepExtras, StepRecord

if TYPE_CHECKING:
    from collapse_doctor.core.config import Config
    from collapse_doctor.core.result import Diagnosis

TESTED_TRL = ">=1.16,<2"
DEFAULT_WRITE_EVERY = 20
"""Steps per rollout part: a part's statistics cost about the same for 1 step as for 20 (fixed overhead)."""
CHECK_BUDGET = 0.01
"""The detectors run after a part only while their total time stays within this share of the training time."""
LOGGER = logging.getLogger("collapse_doctor")

_SEAM = {
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_generate_and_score_completions": ["self", "inputs"],
    "log": ["self", "logs", "start_time"],
}

AdvantageTransform = Callable[
    [torch.Tensor, int], tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, StepExtras]
]
"""``(rewards [N, C] of every process, group size) -> (advantages [N], weights [C][, extras])``: advantages that
replace TRL's (``retrain --algo gdpo-dynamic`` and the recipes); this process's slice goes to the loss. ``extras``
(:class:`~collapse_doctor.integrations.rollouts.StepExtras`) adds the recipe's columns and scalars to the step."""


class CollapseDoctorWarning(UserWarning):
    """collapse-doctor's monitoring failed and switched itself off; training went on."""


def check_trl_seam(trainer_type: type | None = None) -> None:
    """Fail early, with the tested range, when the trainer lacks the methods the callback hooks."""
    import trl  # type: ignore[import-untyped,unused-ignore]

    if trainer_type is None:
        trainer_type = trl.GRPOTrainer
    for name, expected in _SEAM.items():
        method = getattr(trainer_type, name, None)
        params = list(inspect.signature(method).parameters) if method is not None else None
        if params != expected:
            raise UsageError(
                f"installed trl {trl.__version__} changed {trainer_type.__name__}.{name} (collapse-doctor hooks it)",
                hint=f"install a tested version: pip install 'trl{TESTED_TRL}'",
            )


def _import_what_steps_use() -> None:
    """Import, before the first step, what the first part and check need: a few hundred ms once, not in a step."""
    import pyarrow.parquet  # noqa: F401
    import tensorboard.compat.proto.event_pb2  # noqa: F401

    import collapse_doctor.engine.stats
    import collapse_doctor.judge.detectors
    import collapse_doctor.pipeline.scan
    import collapse_doctor.pipeline.watch  # noqa: F401


def is_rloo(trainer: Any) -> bool:
    """Whether ``trainer`` is a ``trl.RLOOTrainer`` (or a subclass)."""
    try:
        from trl import RLOOTrainer  # type: ignore[import-untyped,unused-ignore]
    except ImportError:  # pragma: no cover - the callback is used with trl installed
        return False
    return isinstance(trainer, RLOOTrainer)


def _algo_of(trainer: Any) -> str:
    if is_rloo(trainer):
        return "rloo"
    return "gdpo" if getattr(trainer, "multi_objective_aggregation", "") == "normalize_then_sum" else "grpo"


def kl_in_advantages(trainer: Any) -> float | None:
    """``beta`` when the trainer's advantages include a per-row KL penalty the rollouts do not carry (TRL's
    ``RLOOTrainer`` with ``beta != 0``: ``reward - beta * kl`` before the leave-one-out baseline), else None."""
    beta = float(getattr(trainer, "beta", 0.0) or 0.0)
    return beta if is_rloo(trainer) and beta != 0.0 else None


def cut_at_cap(trainer: Any, completion_ids: list[Any]) -> list[bool] | None:
    """Per completion, whether generation cut it at ``max_completion_length``, by TRL's own rule (the one behind
    ``completions/clipped_ratio``): its last token is neither an end-of-sequence token nor padding. None when the
    trainer does not say its end tokens; never raises (this runs inside the trainer's reward step).

    >>> class T:
    ...     eos_token_ids, pad_token_id = [2], 0
    >>> cut_at_cap(T(), [[5, 6, 7], [5, 6, 2], [5, 0], []])
    [True, False, False, False]
    """
    try:
        tokenizer = getattr(trainer, "_tokenizer", None) or getattr(trainer, "processing_class", None)
        ends = list(getattr(trainer, "eos_token_ids", None) or [])
        if not ends:
            eos = getattr(tokenizer, "eos_token_id", None)
            ends = [] if eos is None else [eos]
        pad = getattr(trainer, "pad_token_id", None)
        if pad is None:
            pad = getattr(tokenizer, "pad_token_id", None)
        if not ends:
            return None
        stops = {int(t) for t in [*ends, *([] if pad is None else [pad])]}
        return [bool(len(ids) and int(ids[-1]) not in stops) for ids in completion_ids]
    except Exception:
        return None


def _print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class CollapseDoctorCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]
    """Monitors a ``trl.GRPOTrainer`` or ``trl.RLOOTrainer`` run: rollouts, ``collapse_doctor/*`` scalars, findings,
    ``fail_on``.

    ``fail_on``: "info", "warning" or "critical" stops training with a checkpoint at the first finding at or above
    that level (None: never stops). ``output_dir``: where rollouts and TensorBoard scalars go (default the
    trainer's ``args.output_dir``). ``write_every``: steps per rollout part; the scalars reach the trainer's logs
    and the detectors run after each part, the detectors within ``check_budget`` (a share of the training time,
    default 1%: on fast steps they skip parts) and once more when training ends.
    ``channels``: the channel names (default TRL's ``reward_func_names``). ``config``: a collapse-doctor config
    file or :class:`~collapse_doctor.core.config.Config` for the detectors' thresholds (default: discovered from the
    output directory, as ``scan`` does). ``print_finding``: called with each line the callback prints (default:
    stderr): each new finding, the reason when it stops training, and one summary line when training ends
    (``summary=False``: not that one; ``retrain`` prints its own scan).

    Pass it in ``callbacks=[...]``: it finds its trainer when training begins. Or call :func:`attach`.
    ``advantage_transform``, ``algo`` and ``tensorboard`` are for ``collapse-doctor retrain``.
    """

    def __init__(
        self,
        fail_on: str | None = None,
        *,
        output_dir: str | Path | None = None,
        write_every: int = DEFAULT_WRITE_EVERY,
        channels: Sequence[str] | None = None,
        config: Config | str | Path | None = None,
        print_finding: Callable[[str], None] | None = _print_line,
        summary: bool = True,
        check_budget: float = CHECK_BUDGET,
        tensorboard: bool = True,
        algo: str | None = None,
        advantage_transform: AdvantageTransform | None = None,
    ) -> None:
        if write_every < 1:
            hint = f"write_every={DEFAULT_WRITE_EVERY} is the default"
            raise UsageError(f"write_every={write_every}: must be at least 1", hint=hint)
        if not 0 < check_budget <= 1:
            hint = f"check_budget={CHECK_BUDGET} (a share of the training time) is the default"
            raise UsageError(f"check_budget={check_budget}: must be in (0, 1]", hint=hint)
        self.fail_on = check_fail_on(fail_on, option="fail_on") if fail_on is not None else None
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.write_every = write_every
        self.check_budget = check_budget
        self.check_seconds = 0.0
        """Time spent in the detectors so far."""
        self._started = 0.0
        self.channels = tuple(channels) if channels is not None else None
        self.config = config
        self.print_finding = print_finding
        self.summary = summary
        self.tensorboard = tensorboard
        self.algo = algo
        self.advantage_transform = advantage_transform
        self.trainer: Any = None
        self.monitor: RolloutMonitor | None = None
        self.live: LiveDiagnosis | None = None
        self.diagnosis: Diagnosis | None = None
        """The last check's diagnosis of the run so far."""
        self.stopped_by: list[Finding] = []
        """The findings that stopped training (``fail_on``), if any."""
        self.error: str | None = None
        """Why the callback switched itself off, if it did."""
        self._pending: dict[str, Any] | None = None
        self._hooked: Any = None
        self._said_stop = False

    # -- wiring ---------------------------------------------------------------------------------------------

    def attach(self, trainer: Any) -> CollapseDoctorCallback:
        """Hook ``trainer`` (a ``trl.GRPOTrainer`` or ``trl.RLOOTrainer``): its rewards, advantages and logs reach
        this callback."""
        if self._hooked is trainer:
            return self
        check_trl_seam(type(trainer))
        self.trainer = trainer
        original_rewards = trainer._calculate_rewards
        original_generate = trainer._generate_and_score_completions
        original_log = trainer.log

        def _calculate_rewards(
            inputs: list[dict[str, Any]], prompts: list[Any], completions: list[Any], completion_ids_list: list[Any]
        ) -> torch.Tensor:
            rewards = original_rewards(inputs, prompts, completions, completion_ids_list)
            self._pending = {
                "rewards": rewards.detach(),
                "lengths": [len(ids) for ids in completion_ids_list],
                "truncated": cut_at_cap(trainer, completion_ids_list),
            }
            return rewards

        def _generate_and_score_completions(inputs: list[dict[str, Any]]) -> dict[str, Any]:
            output = original_generate(inputs)
            pending, self._pending = self._pending, None
            if pending is not None and trainer.model is not None and trainer.model.training:
                self._scored(output, pending)
            return output

        def log(logs: dict[str, float], start_time: float | None = None) -> None:
            if trainer.model is not None and trainer.model.training:  # not into an evaluation's logs
                self._guarded("log", lambda: self._add_scalars(logs))
            original_log(logs, start_time)

        trainer._calculate_rewards = _calculate_rewards
        trainer._generate_and_score_completions = _generate_and_score_completions
        trainer.log = log
        self._hooked = trainer
        return self

    def _find_trainer(self) -> Any:
        """The trainer whose callback handler holds this callback, from the frames that called the hook."""
        frame = inspect.currentframe()
        try:
            for _ in range(16):
                if frame is None:
                    return None
                candidate = frame.f_locals.get("self")
                handler = getattr(candidate, "callback_handler", None)
                if handler is not None and any(c is self for c in getattr(handler, "callbacks", ())):
                    return candidate
                frame = frame.f_back
            return None
        finally:
            del frame

    @property
    def active(self) -> bool:
        """Whether the callback is monitoring (attached, set up, not switched off)."""
        return self.monitor is not None and self.error is None

    def _guarded(self, hook: str, body: Callable[[], Any]) -> Any:
        """``body()``, or None after reporting its exception once and switching the monitoring off."""
        if self.error is not None:
            return None
        try:
            return body()
        except Exception as exc:  # never break the user's training loop
            self._switch_off(hook, exc)
            return None

    def _switch_off(self, hook: str, exc: BaseException) -> None:
        if self.error is not None:
            return
        detail = " ".join(str(exc).split())[:300]
        self.error = f"{hook}: {type(exc).__name__}: {detail}"
        if self.monitor is not None:
            self.monitor.enabled = False
        LOGGER.debug("collapse-doctor failed in %s", hook, exc_info=exc)
        warnings.warn(
            f"collapse-doctor switched itself off ({self.error}); training goes on without it",
            CollapseDoctorWarning,
            stacklevel=3,
        )

    # -- the trainer's batches ------------------------------------------------------------------------------

    def _scored(self, output: dict[str, Any], pending: dict[str, Any]) -> None:
        """One generation batch was scored: replace its advantages (retrain) and record it."""
        trainer = self.trainer
        rewards = pending["rewards"]
        group_size = int(trainer.num_generations or 1)
        weights = None
        advantages = None
        extras: StepExtras | None = None
        if self.advantage_transform is not None:
            # Training math, not monitoring: its errors are the run's errors.
            transformed = self.advantage_transform(rewards, group_size)
            advantages, weights = transformed[0], transformed[1]
            extras = transformed[2] if len(transformed) > 2 else None
            local = output["advantages"]
            rank, per_process = trainer.accelerator.process_index, local.shape[0]
            mine = advantages[rank * per_process : (rank + 1) * per_process]
            output["advantages"] = mine.to(local.device, local.dtype)
        lengths = pending["lengths"]
        if trainer.accelerator.num_processes > 1:
            # Every process takes part in the gather, switched off or not, so none waits for another.
            from accelerate.utils import gather_object  # type: ignore[import-untyped,unused-ignore]

            lengths = gather_object(lengths)
            cut = pending["truncated"]
            pending["truncated"] = None if cut is None else gather_object(cut)
        if self.monitor is None:
            return
        step = trl_step(trainer.state)
        if self.active and self.monitor.enabled:
            self._guarded(
                "recording a step",
                lambda: self._record(step, rewards, advantages, weights, lengths, extras, pending["truncated"]),
            )
        # Off the main process, or switched off: count the step all the same (a no-op if it was recorded).
        self.monitor.note_step(step)

    def _record(
        self,
        step: int,
        rewards: torch.Tensor,
        advantages: torch.Tensor | None,
        weights: torch.Tensor | None,
        lengths: list[int],
        extras: StepExtras | None = None,
        truncated: list[bool] | None = None,
    ) -> None:
        assert self.monitor is not None
        logs = self.trainer._logs
        n = rewards.shape[0]
        prompts, completions = list(logs["prompt"])[-n:], list(logs["completion"])[-n:]
        if advantages is None:
            advantages = torch.tensor(list(logs["advantages"])[-n:], dtype=torch.float32)
        if len(prompts) != n or len(completions) != n or advantages.shape[0] != n or len(lengths) != n:
            raise RuntimeError(
                f"trainer._logs holds {len(prompts)} prompts and {advantages.shape[0]} advantages for {n} rewards "
                f"(collapse-doctor is tested with trl{TESTED_TRL})"
            )
        record = StepRecord(
            step=step,
            rewards=rewards.float().cpu(),
            advantages=advantages.detach().float().cpu(),
            group_size=int(self.trainer.num_generations or 1),
            prompts=prompts,
            completions=completions,
            completion_lengths=[int(x) for x in lengths],
            weights=weights,
            extras=extras,
            truncated=truncated if truncated is not None and len(truncated) == n else None,
        )
        if extras is not None and extras.rewards is not None:
            record.rewards = extras.rewards.float().cpu()  # what the advantages came from (conditioned)
        self.monitor.record(record)

    def _add_scalars(self, logs: dict[str, float]) -> None:
        if self.monitor is None or not self.monitor.enabled:
            return
        for key, value in self.monitor.take_log_scalars().items():
            if not math.isnan(value):  # JSON loggers refuse NaN; TRL leaves such a metric out as well
                logs[key] = value

    # -- TrainerCallback events -----------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.monitor is None and self.error is None:
            self._guarded("on_train_begin", lambda: self._begin(args, state))
        return control

    def _begin(self, args: Any, state: Any) -> None:
        trainer = self._hooked or self._find_trainer()
        if trainer is None:
            raise RuntimeError(
                "could not find the trainer this callback belongs to; call "
                "collapse_doctor.integrations.trl.attach(trainer) after building it"
            )
        self.attach(trainer)
        channels = self.channels or tuple(trainer.reward_func_names)
        if len(channels) != len(trainer.reward_funcs):
            raise UsageError(
                f"channels={list(channels)} names {len(channels)} channels for {len(trainer.reward_funcs)} reward "
                "functions",
                hint="give one name per reward function, in their order",
            )
        weights = [float(w) for w in trainer.reward_weights.tolist()]
        main = bool(trainer.accelerator.is_main_process)
        _import_what_steps_use()
        self._started = time.perf_counter()
        beta = kl_in_advantages(trainer)
        self.monitor = monitor = RolloutMonitor(
            output_dir=self.output_dir or Path(args.output_dir),
            channels=channels,
            weights=dict(zip(channels, weights, strict=True)),
            algo=self.algo or _algo_of(trainer),
            write_every=self.write_every,
            enabled=main,
            tensorboard=self.tensorboard,
            advantage_column="advantage" if beta is None else UNCHECKED_ADVANTAGE,
        )
        if beta is not None:
            self._say(
                f"collapse-doctor: RLOOTrainer with beta={beta:g} subtracts beta * KL from each reward before its "
                f"leave-one-out baseline; the rollouts do not carry the KL, so its advantages are written as "
                f"{UNCHECKED_ADVANTAGE} and not checked (CD202 skipped); with beta=0 they are"
            )
        self.live = LiveDiagnosis(monitor, fail_on=self.fail_on, config=self.config)
        if main and state.global_step > 0:
            monitor.truncate_from(trl_step(state))  # a resumed run regenerates these steps
        elif main and monitor.holds_rollouts():
            raise UsageError(
                f"{monitor.rollouts_dir} already holds rollouts of another run",
                hint="give CollapseDoctorCallback(output_dir=...) a new directory, or resume from a checkpoint",
            )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.monitor is None:
            return control
        before = self.monitor.parts_due
        try:  # switched off or not: every process counts the parts, so all check (and agree) at the same steps
            self.monitor.flush_if_full()
        except Exception as exc:  # never break the user's training loop
            self._switch_off("writing rollouts", exc)
        if self.monitor.parts_due == before:
            return control
        elapsed = time.perf_counter() - self._started
        failing = bool(self.stopped_by)
        if not self.live or not self.live.checks or self.check_seconds <= self.check_budget * elapsed:
            failing = bool(self._guarded("checking the run", self._check))
        if self.fail_on is not None and any_process(self.trainer, failing):
            control.should_save = True
            control.should_training_stop = True
            if not self._said_stop:
                self._said_stop = True
                self._guarded("saying why it stops", lambda: self._say(self._stop_line(state)))
        return control

    def _say(self, line: str | None) -> None:
        """Print one line through ``print_finding``, on the main process only (the one that writes and checks)."""
        if line is not None and self.print_finding is not None and self.monitor is not None and self.monitor.enabled:
            self.print_finding(line)

    def _stop_line(self, state: Any) -> str:
        found = self.stopped_by
        if not found:  # another process's check found it: every process stops at the same step
            return f"collapse-doctor: stopping training after step {state.global_step} (fail_on={self.fail_on})"
        first = found[0]
        onset = f" (onset step {first.onset_step})" if first.onset_step is not None else ""
        more = f", and {len(found) - 1} more" if len(found) > 1 else ""
        return printable(
            f"collapse-doctor: stopping training after step {state.global_step} with a checkpoint "
            f"(fail_on={self.fail_on}): {first.code} {first.severity.label} {first.title}{onset}{more}"
        )

    def _summary_line(self) -> str | None:
        """The run in one line at the end of training: the verdict, the signal budget, the findings, where the
        rollouts are and the command for the full report."""
        diagnosis, monitor = self.diagnosis, self.monitor
        if diagnosis is None or monitor is None:
            return None
        counts = severity_counts(f.severity for f in diagnosis.findings) or "no findings"
        where = monitor.rollouts_dir
        return printable(
            f"collapse-doctor: {VERDICTS[diagnosis.verdict]} after {diagnosis.run.steps:,} steps: "
            f"{signal_sentence(diagnosis.run.signal)}; {counts}; rollouts in {where}; full report: "
            f"collapse-doctor report {where.parent} --html report.html"
        )

    def _check(self) -> bool:
        """Run the detectors on the run so far; print new findings; True when one reaches ``fail_on``."""
        if self.live is None or self.monitor is None or not self.monitor.enabled or not self.monitor.files_written:
            return False
        from collapse_doctor.pipeline.watch import finding_line, withdrawn_line

        started = time.perf_counter()
        result = self.live.check()
        self.check_seconds += time.perf_counter() - started
        self.diagnosis = result.diagnosis
        if self.print_finding is not None:
            for finding in result.withdrawn:
                self.print_finding(f"collapse-doctor: {withdrawn_line(result.diagnosis, finding)}")
            for finding in result.new:
                self.print_finding(f"collapse-doctor: {finding_line(result.diagnosis, finding)}")
        if result.failing:
            self.stopped_by = result.failing
        return bool(result.failing)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # The rollouts on disk reach the checkpoint: a resume from it neither loses nor repeats a step.
        if self.monitor is not None:
            self._guarded("writing rollouts", self.monitor.flush)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.monitor is not None:
            self._guarded("closing the rollouts", self.monitor.close)
            self._guarded("checking the run", self._check)  # the last steps, and what the budget skipped
            if self.summary:  # the user's print_finding too must not break the end of training
                self._guarded("summing up", lambda: self._say(self._summary_line()))
        return control


def trl_step(state: Any) -> int:
    """The step TRL gives the batch generated now: the optimizer step it trains first, counted from 1.

    A batch is generated before its optimizer step, while ``state.global_step`` still counts the steps done;
    TRL logs its metrics, its completions files (``completions_00001.parquet`` first) and every tracker's points
    after the step, at ``global_step`` + 1. The callback's rollouts, onsets and scalars use the same axis.
    """
    return int(state.global_step) + 1


def any_process(trainer: Any, flag: bool) -> bool:
    """True when any process raised the flag (every process must stop at the same step); a collective call."""
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is None or accelerator.num_processes == 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(value, reduction="sum").item() > 0)


def attach(trainer: Any, fail_on: str | None = None, **options: Any) -> CollapseDoctorCallback:
    """Add a :class:`CollapseDoctorCallback` to ``trainer`` and hook it; returns the callback.

    The same as ``callbacks=[CollapseDoctorCallback(fail_on, **options)]`` for a trainer built already.
    """
    callback = CollapseDoctorCallback(fail_on, **options)
    callback.attach(trainer)
    trainer.add_callback(callback)
    return callback
