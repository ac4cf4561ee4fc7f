"""Typed options of a scan: how to read the run, how to judge it. Values only (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collapse_doctor.core.errors import UsageError
from collapse_doctor.core.estimators import ALGORITHMS as ESTIMATOR_ALGORITHMS

if TYPE_CHECKING:
    from collapse_doctor.core.config import Config

ALGORITHMS = ("auto", *ESTIMATOR_ALGORITHMS)


@dataclass(frozen=True)
class ReadOptions:
    """How a rollout reader maps the user's table onto the canonical one (all optional)."""

    step_col: str | None = None
    group_col: str | None = None
    reward_cols: tuple[str, ...] | None = None
    group_size: int | None = None
    weights: Mapping[str, float] | None = None
    max_completion_length: int | None = None
    """The generation length cap in tokens: without a ``truncated`` column, rows whose ``completion_length``
    reaches it were cut (set on the opened reader, not a reader keyword)."""

    def __post_init__(self) -> None:
        cap = self.max_completion_length
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise UsageError(f"--max-completion-length {cap!r} must be a whole number of tokens >= 1")

    @classmethod
    def of(
        cls,
        *,
        step_col: str | None = None,
        group_col: str | None = None,
        reward_cols: Sequence[str] | None = None,
        group_size: int | None = None,
        weights: Mapping[str, float] | None = None,
        max_completion_length: int | None = None,
    ) -> ReadOptions:
        """Read options from keywords (``reward_cols`` any sequence).

        >>> ReadOptions.of(reward_cols=["a", "b"]).reward_cols
        ('a', 'b')
        """
        columns = tuple(reward_cols) if reward_cols is not None else None
        return cls(
            step_col=step_col,
            group_col=group_col,
            reward_cols=columns,
            group_size=group_size,
            weights=weights,
            max_completion_length=max_completion_length,
        )

    def reader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments every rollout reader takes (``step_col``, ..., ``weights``)."""
        return {
            "step_col": self.step_col,
            "group_col": self.group_col,
            "reward_cols": list(self.reward_cols) if self.reward_cols is not None else None,
            "group_size": self.group_size,
            "weights": dict(self.weights) if self.weights is not None else None,
        }


@dataclass(frozen=True)
class ScanOptions:
    """Everything ``scan`` takes besides its paths and its outputs.

    ``config`` is a :class:`~collapse_doctor.core.config.Config`, a config file path, or ``None`` (discovered
    walking up from the first input); ``fail_on`` and ``only`` replace the configured values, ``ignore`` adds to
    them. ``run_name`` picks one run when the inputs hold several (``None``: all of them).
    """

    read: ReadOptions = field(default_factory=ReadOptions)
    algo: str = "auto"
    device: str = "auto"
    config: Config | str | Path | None = None
    fail_on: str | None = None
    only: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    run_name: str | None = None
    ray: str | None = None
    """Scale out on Ray: ``"local"`` (a local instance), ``"auto"`` or a cluster address; ``None``: this process."""

    def __post_init__(self) -> None:
        if self.algo not in ALGORITHMS:
            raise UsageError(f"--algo {self.algo!r} is not one of {', '.join(ALGORITHMS)}")
        if self.ray is not None and self.device not in ("auto", "cpu"):
            raise UsageError(
                f"--ray computes on the workers' CPUs: --device {self.device} cannot be used with it",
                hint="drop --device, or drop --ray to compute on this machine's GPU",
            )

    @classmethod
    def of(
        cls,
        *,
        weights: Mapping[str, float] | None = None,
        step_col: str | None = None,
        group_col: str | None = None,
        reward_cols: Sequence[str] | None = None,
        group_size: int | None = None,
        max_completion_length: int | None = None,
        **scan: Any,
    ) -> ScanOptions:
        """Options from flat keywords, as a Python caller writes them: ``ScanOptions.of(device="cpu", weights=...)``.

        >>> ScanOptions.of(device="cpu", group_size=8).read.group_size
        8
        """
        read = ReadOptions.of(
            step_col=step_col,
            group_col=group_col,
            reward_cols=reward_cols,
            group_size=group_size,
            weights=weights,
            max_completion_length=max_completion_length,
        )
        for key in ("only", "ignore"):
            if scan.get(key) is not None:
                scan[key] = tuple(scan[key])
        return cls(read=read, **scan)

    def with_(self, **changes: Any) -> ScanOptions:
        return replace(self, **changes)


def split_list(text: str | None) -> tuple[str, ...] | None:
    """A comma-separated option value (``--only CD101,CD3``, ``--reward-cols a,b``); ``None`` when not given.

    >>> split_list(" CD101, CD3 ,"), split_list(None)
    (('CD101', 'CD3'), None)
    """
    if not text:
        return None
    return tuple(part.strip() for part in text.split(",") if part.strip())
