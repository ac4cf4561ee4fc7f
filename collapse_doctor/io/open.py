"""Opening a discovered run: its rollouts as a reader, its scalar log in canonical names.

Both go through the format registry (:mod:`collapse_doctor.io.formats`): the run's rollout kind says which
reader opens the rollout files, its scalar kind which reader parses the scalar log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from collapse_doctor.core.options import ReadOptions
from collapse_doctor.io.formats import FORMATS
from collapse_doctor.io.logs.scalar_cache import ScalarCache
from collapse_doctor.io.logs.tags import scalar_series

if TYPE_CHECKING:
    from collapse_doctor.core.scalars import ScalarSeries
    from collapse_doctor.io.discovery import RunInputs
    from collapse_doctor.io.rollouts.parquet import ParquetRun


def open_rollouts(
    run: RunInputs, read: ReadOptions | None = None, *, check_rewards_first: bool = True
) -> ParquetRun | None:
    """The run's rollouts as a reader with :class:`~collapse_doctor.io.rollouts.parquet.ParquetRun`'s interface
    (``iter_steps()``, ``iter_chunks()``, ``channels``, ``weights``, ``dynamic_weight_channels``, ...), or
    ``None`` when the run has no rollouts.

    ``read`` maps the user's table onto the canonical one (default: nothing to map) and may give the generation
    length cap (``max_completion_length``: rows whose token length reaches it were cut).
    ``check_rewards_first=False`` lets a canonical Parquet run check its rewards while it streams them (see
    :class:`~collapse_doctor.io.rollouts.parquet.ParquetRun`); the other layouts are read whole and checked when opened.
    """
    if run.rollout_kind is None:
        return None
    fmt = FORMATS[run.rollout_kind]
    read = read or ReadOptions()
    if fmt.open_member is not None and run.member is not None:
        reader = fmt.open_member(run.rollout_files[0], run.member, read)  # what the run logged into its database
    else:
        assert fmt.open is not None  # every other rollout format opens its files
        reader = fmt.open(run.rollout_files, read, check_rewards_first)
    if read.max_completion_length is not None:
        reader.set_length_cap(read.max_completion_length)
    return reader


def read_scalar_log(run: RunInputs, cache: ScalarCache | None = None) -> ScalarSeries | None:
    """The run's scalar log in canonical names (event files, else trainer_state.json, else verl file logs, else a
    tracker's files), or ``None`` when it has none; of a tracker database, the run's ``member``. ``cache``
    (``watch``) keeps what earlier reads of growing files parsed."""
    kind = run.scalar_kind
    if kind is None:
        return None
    log = (cache or ScalarCache()).read(run.scalar_files(), kind, member=run.member)
    return scalar_series(log.tags, points=log.points, sources=log.files, notes=log.notes())
