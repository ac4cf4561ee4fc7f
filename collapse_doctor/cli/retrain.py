"""``collapse-doctor retrain``: a corrective fine-tune on TRL's GRPOTrainer, monitored by the doctor."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from collapse_doctor.cli.common import err, note, render_text, user_errors
from collapse_doctor.cli.options import (
    FAIL_ON_CHOICES,
    SCALE_CHOICES,
    DebugOption,
    WeightsOption,
    choice_option,
    terminal_options,
)


@terminal_options("quiet", "verbose", "color")
def retrain(
    algo: Annotated[
        str | None,
        choice_option(
            "--algo",
            choices=("grpo", "gdpo", "gdpo-dynamic"),
            help="grpo, gdpo or gdpo-dynamic (default: config reward_mode, else gdpo).",
        ),
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="Local model directory or hub id.")] = None,
    dataset: Annotated[
        Path | None, typer.Option("--dataset", help="JSONL or Parquet prompts (a 'prompt' column).")
    ] = None,
    reward: Annotated[
        list[str] | None,
        typer.Option("--reward", help="Reward channel name=module:function (repeat per channel)."),
    ] = None,
    weights: WeightsOption = None,
    config: Annotated[Path | None, typer.Option("--config", help="Training settings (JSON or TOML).")] = None,
    from_scan: Annotated[
        Path | None, typer.Option("--from-scan", help="Apply the remedies of a `scan --json` result.")
    ] = None,
    from_scan_run: Annotated[
        str | None,
        typer.Option("--from-scan-run", help="With a scan of several runs: the run (source or directory name) to use."),
    ] = None,
    output_dir: Annotated[
        Path | None, typer.Option("--output-dir", help="Where checkpoints, rollouts and TensorBoard go.")
    ] = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps", min=1, help="Training steps.")] = None,
    scale: Annotated[
        str, choice_option("--scale", choices=SCALE_CHOICES, help="grpo scale_rewards: group, batch or none.")
    ] = "group",
    max_completion_length: Annotated[
        int | None, typer.Option("--max-completion-length", min=1, help="Tokens per completion.")
    ] = None,
    save_steps: Annotated[int, typer.Option("--save-steps", min=1, help="Checkpoint every N steps.")] = 50,
    write_every: Annotated[
        int, typer.Option("--write-every", min=1, help="Write a rollout Parquet file every N steps.")
    ] = 10,
    fail_on: Annotated[
        str | None,
        choice_option(
            "--fail-on",
            choices=FAIL_ON_CHOICES,
            help="Stop (checkpoint, exit 1) at a finding at or above: never (default), info, warning, critical.",
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the last checkpoint in --output-dir.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and the resolved TRL GRPOConfig; train nothing.")
    ] = False,
    demo: Annotated[bool, typer.Option("--demo", help="Built-in tiny model and task (CPU, no download).")] = False,
    demo_task: Annotated[
        str,
        choice_option(
            "--demo-task", choices=("copy", "sums"), help="With --demo: copy (digit copying, default) or sums."
        ),
    ] = "copy",
    debug: DebugOption = False,
) -> None:
    """Corrective fine-tune on TRL's GRPOTrainer (grpo, gdpo, gdpo-dynamic), monitored by the doctor.

    Writes OUTPUT/rollouts/*.parquet (scan them any time) and OUTPUT/tensorboard; scans the run at the end.
    Exit codes: 0 done, 1 --fail-on findings, 2 usage or input error, 130 interrupted (resume with --resume).

    Example: collapse-doctor retrain --demo --algo gdpo --output-dir out/gdpo
    """
    with user_errors(debug):
        from collapse_doctor.core.schema import parse_weights
        from collapse_doctor.retrain.plan import RetrainOptions

        if fail_on is not None:
            from collapse_doctor.core.config import check_fail_on

            fail_on = check_fail_on(fail_on)
            fail_on = None if fail_on == "never" else fail_on
        options = RetrainOptions(
            output_dir=output_dir or Path("runs") / (algo or "retrain"),
            algo=algo,
            model=model,
            dataset=dataset,
            rewards=tuple(reward or ()),
            weights=parse_weights(weights),
            config=config,
            from_scan=from_scan,
            from_scan_run=from_scan_run,
            max_steps=max_steps,
            resume=resume,
            demo=demo,
            demo_task=demo_task,
            fail_on=fail_on,
            scale=scale,
            max_completion_length=max_completion_length,
            save_steps=save_steps,
            write_every=write_every,
            seed=seed,
        )
        from collapse_doctor.retrain.run import check_before_training, plan_retrain, run_retrain

        plan, differences = plan_retrain(options)
        if dry_run:  # the plan is the result (stdout); nothing is loaded, so the Hub is not asked
            import json

            for line in plan.describe():
                typer.echo(line)
            typer.echo("GRPOConfig (values that differ from TRL's defaults):")
            typer.echo(json.dumps(differences, indent=2, default=str))
            return
        # A run that cannot start (an unreachable Hub, --resume without a checkpoint, ...) says only why, in one
        # line; one that can prints its plan as a note (stderr) before loading the model and training.
        checked = check_before_training(options)
        for line in plan.describe():
            note(line)
        result = run_retrain(options, checked=checked)
        seconds = f"{result.seconds:.0f} s"
        note(f"trained {result.steps} steps in {seconds}; rollouts in {result.rollouts_dir}")
        if result.stop_reason:  # why it stopped early: said on stderr, even with -q
            err(f"stopped: {result.stop_reason}")
            for finding in result.fail_on_findings:
                err(f"  {finding}")
        if result.interrupted:
            err(
                f"a checkpoint was saved; continue with: collapse-doctor retrain ... --resume "
                f"--output-dir {result.output_dir}"
            )
        if result.diagnosis is not None:
            render_text(result.diagnosis)
        code = result.exit_code()
    raise typer.Exit(code)
