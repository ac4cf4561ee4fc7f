"""Scale out on Ray (``--ray [ADDRESS]``, the ``ray`` extra): ordered maps whose calls run as Ray tasks.

Two kinds of work fan out, and neither needs a shuffle, because a step's groups never leave the step:

- the shards of one run (:meth:`~collapse_doctor.io.rollouts.parquet.ParquetRun.shards`: row ranges that end where a
  step ends), each reduced to its steps' statistics in a task (:func:`collapse_doctor.engine.reduce.reduce_rollouts`);
  the driver adds them to the run's series in shard order, so the series is the one a local scan builds;
- the runs of a sweep, one run per task (:func:`collapse_doctor.pipeline.scan.run_scan`).

A task reads its files itself (shared local storage or object storage), so only the task's description goes
out and only per-step statistics come back. :func:`ray_session` connects to the cluster at ``ADDRESS`` (or
starts a local instance with the cores of this machine) for the length of a command and yields a
:class:`RayExecutor`; an instance already started in the process (a test, a notebook) is used as it is and
left running.
"""

from __future__ import annotations

import logging
import os
import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from collapse_doctor.core.errors import CollapseDoctorError, InputError, UsageError
from collapse_doctor.engine.parallel import available_cores, limit_cores

T = TypeVar("T")
R = TypeVar("R")

LOCAL = "local"
"""``--ray`` with no address: start a Ray instance on this machine (or use the one this process started)."""
_ADDRESS = re.compile(r"^(auto|local|ray://\S+|[\w.\-]+:\d+|\[[0-9A-Fa-f:.]+\]:\d+)$")

IN_FLIGHT_PER_WORKER = 2
"""Tasks submitted ahead per worker: enough to keep every worker busy, few enough to bound the results held."""


def is_address(text: str) -> bool:
    """Whether a command-line word after ``--ray`` is a Ray address (else it is the next argument, a path).

    >>> [is_address(w) for w in ("auto", "ray://head:10001", "10.0.0.5:6379", "runs/", "run.parquet")]
    [True, True, True, False, False]
    """
    return bool(_ADDRESS.match(text)) and not Path(text).exists()


def normalise_ray_flag(args: Sequence[str]) -> list[str]:
    """``--ray`` takes an optional address: a bare ``--ray`` (followed by an option, a path or nothing) becomes
    ``--ray=local``, so the next word stays what it is.

    >>> normalise_ray_flag(["scan", "--ray", "runs/"]), normalise_ray_flag(["scan", "--ray", "auto", "r"])
    (['scan', '--ray=local', 'runs/'], ['scan', '--ray=auto', 'r'])
    """
    out: list[str] = []
    args = list(args)
    i = 0
    while i < len(args):
        word = args[i]
        if word == "--":
            out += args[i:]
            break
        if word == "--ray":
            following = args[i + 1] if i + 1 < len(args) else None
            if following is not None and is_address(following):
                out.append(f"--ray={following}")
                i += 2
                continue
            out.append(f"--ray={LOCAL}")
        else:
            out.append(word)
        i += 1
    return out


class Executor(Protocol):
    """An ordered map over workers elsewhere (:class:`RayExecutor`)."""

    workers: int

    def map(
        self, work: Callable[[T], R], items: Sequence[T], describe: Callable[[T], str], *, keep_going: bool = False
    ) -> Iterator[R | CollapseDoctorError]: ...


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray, which is not installed", hint="pip install 'collapse-doctor[ray]'") from None
    return ray


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0].strip() if text else type(exc).__name__


@contextmanager
def ray_session(address: str) -> Iterator[RayExecutor]:
    """Connect to Ray at ``address`` (``local``: a local instance with this machine's cores; ``auto``: the
    cluster ``RAY_ADDRESS`` or ``ray start`` names) for the ``with`` block; one already connected is reused."""
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        settings: dict[str, Any] = {
            "include_dashboard": False,
            "log_to_driver": False,
            "logging_level": logging.ERROR,
        }
        _check_reachable(address)
        try:
            if address == LOCAL:  # a new instance, even where RAY_ADDRESS or `ray start` names a cluster
                ray.init(address="local", num_cpus=available_cores(), **settings)
            else:
                with _native_stderr_muted():  # Ray's C++ client logs each failed attempt to reach the cluster
                    ray.init(address=address, **settings)
        except (ConnectionError, RuntimeError, ValueError, OSError) as exc:
            hint = "start one with `ray start --head`, or pass --ray with no address for a local instance"
            if address not in (LOCAL, "auto") and "RAY_AUTH_MODE" not in os.environ:
                hint = (
                    "a cluster with token authentication (the default of `ray start`) also needs RAY_AUTH_MODE=token "
                    "and its token; on the head node, --ray auto finds both"
                )
            raise InputError(
                f"--ray {address}: cannot connect to a Ray cluster ({_first_line(exc)})", hint=hint
            ) from None
        started = True
    try:
        yield RayExecutor(ray)
    finally:
        if started:
            ray.shutdown()


@contextmanager
def _native_stderr_muted() -> Iterator[None]:
    """File descriptor 2 goes to /dev/null for the block: what Ray's native client writes there while it
    retries, and any Python warning Ray prints meanwhile (``sys.stderr`` is flushed first; an error is raised and
    reported after the block)."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


CONNECT_TIMEOUT = 5.0
"""Seconds to wait for a cluster's port to answer (Ray itself retries an unreachable address for minutes)."""


def _check_reachable(address: str) -> None:
    """Fail fast, in one line, when ``HOST:PORT`` (or ``ray://HOST:PORT``, or the ``RAY_ADDRESS`` that ``auto``
    stands for) does not accept a connection."""
    import socket

    target = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    found = re.match(r"^(?:ray://)?\[?([\w.\-:]+?)\]?:(\d+)$", target)
    if found is None:
        return  # "local", or "auto" without RAY_ADDRESS: Ray looks for a cluster started on this machine
    host, port = found.group(1), int(found.group(2))
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        shown = address if address == target else f"{address} ({target})"
        raise InputError(
            f"--ray {shown}: cannot connect to a Ray cluster ({exc.strerror or type(exc).__name__})",
            hint="check the address (the head node's GCS port, 6379 by default; ray:// uses 10001), or pass "
            "--ray with no address for a local instance",
        ) from None


def _run_task(work: Callable[[Any], Any], item: Any, cores: int) -> Any:
    """A task's body: the call, on the cores Ray gave the task (threads inside it size themselves by them)."""
    limit_cores(cores)
    os.environ.setdefault("OMP_NUM_THREADS", str(cores))
    return work(item)


class RayExecutor:
    """``map`` over Ray tasks of one CPU each, results in input order (:func:`ray_session` makes one)."""

    def __init__(self, ray: Any) -> None:
        self._ray = ray
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._task = ray.remote(num_cpus=1, max_retries=0)(_run_task)

    def map(
        self, work: Callable[[T], R], items: Sequence[T], describe: Callable[[T], str], *, keep_going: bool = False
    ) -> Iterator[R | CollapseDoctorError]:
        """``work(item)`` for every item as a Ray task, yielded in input order as they finish in order.

        A task's :class:`CollapseDoctorError` (a bad file: its message names it) is raised as it was, after the
        tasks not yet finished are cancelled; with ``keep_going`` it is yielded in the item's place instead and
        the other items go on. A task that dies (its worker crashed, ran out of memory) is an error naming
        ``describe(item)``. Any other exception is a bug and is raised as it is.
        """
        ray = self._ray
        shared = ray.put(work)
        pending: deque[tuple[T, Any]] = deque()
        bound = self.workers * IN_FLIGHT_PER_WORKER
        try:
            for item in items:
                pending.append((item, self._task.remote(shared, item, 1)))
                if len(pending) > bound:
                    yield self._result(*pending.popleft(), describe, keep_going)
            while pending:
                yield self._result(*pending.popleft(), describe, keep_going)
        finally:
            for _, ref in pending:  # an error (or the caller stopped): nothing more is wanted
                ray.cancel(ref, force=True)

    def _result(self, item: T, ref: Any, describe: Callable[[T], str], keep_going: bool) -> Any:
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, CollapseDoctorError):
                if keep_going:
                    return cause
                raise cause from None
            if isinstance(cause, BaseException):
                raise cause from None
            raise
        except ray.exceptions.RayError as exc:
            error = InputError(
                f"{describe(item)}: the Ray task reading it failed ({_first_line(exc)})",
                hint="check the workers' memory and logs (`ray logs`), or run without --ray",
            )
            if keep_going:
                return error
            raise error from None
