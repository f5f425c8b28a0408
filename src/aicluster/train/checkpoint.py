"""Checkpoints a training script saves and resumes from: model, optimizer, RNG and data position.

::

    ckpt = train.Checkpointer(keep_last=3)          # <checkpoint_dir> of the job by default
    resumed = ckpt.load(model=model, optimizer=opt)  # None on a first start
    start = resumed.step + 1 if resumed else 1
    for step in range(start, steps + 1):
        ...
        if step % every == 0:
            ckpt.save(step, model=model, optimizer=opt, extra={"epoch": epoch})
    ckpt.close()

Built on ``torch.distributed.checkpoint`` (DCP): every rank writes its part of the state in
parallel, DDP-wrapped models and resharding come with it (``get_state_dict``/``set_state_dict``).

*Asynchronous*: ``save`` copies the state into a reused CPU staging buffer (the only time the
loop waits), then a writer in the background writes it: DCP's checkpoint process on a GPU host, a
thread elsewhere (see :class:`Checkpointer`); the next ``save``, ``load``, ``wait`` or ``close``
first waits for that write and raises its error if it failed.

*Atomic*: each save goes to ``step-<n>.tmp-<token>``; when every rank has written and fsynced its
files, rank 0 writes ``manifest.json``, fsyncs it and the directory and renames the directory to
``step-<n>`` (see :mod:`aicluster.train.ckptdir`). Readers consider only complete ones, so a kill
at any moment leaves the previous complete checkpoint as the latest. Then the oldest beyond
``keep_last`` are pruned and a ``checkpoint`` telemetry record is written.

Nothing loaded can run code: tensors via DCP, other values with ``weights_only=True``, DCP's
metadata through an allow-list, and ``extra`` plus the RNG states as JSON.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.distributed.checkpoint.state_dict_saver import async_save as dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from aicluster.train import _dist, ckptdir, env, session
from aicluster.train._dcp import RawBytesSavePlanner, SafeLoadPlanner, SafeReader
from aicluster.train.rng import capture_rng, restore_rng

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Checkpointer", "ResumeState"]

# DCP warns on every single-process save/load; a world of one is a normal case here.
warnings.filterwarnings(
    "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
)

_RANKS = "ranks"  # per-rank JSON (RNG states, extra) under ranks.<rank>, stored as raw bytes


@dataclass(frozen=True)
class ResumeState:
    """What :meth:`Checkpointer.load` restored: the step saved and this rank's ``extra``.

    ``rng_restored`` is false when RNG restoring was off or the checkpoint was written by a
    world of another size (rank 0's ``extra`` is returned then).
    """

    step: int
    extra: dict[str, Any]
    path: Path
    rng_restored: bool


@dataclass
class _Save:
    step: int
    tmp: Path
    started: float
    extra: dict[str, Any]
    stall: float | None = None
    done: Future[None] = field(default_factory=Future)


class Checkpointer:
    """Saves and loads a job's checkpoints; construct it on every rank (it is collective).

    ``directory`` defaults to the job's checkpoint directory (``train.context().checkpoint_dir``,
    ``AICLUSTER_CHECKPOINT_DIR``), shared by all attempts of the job. ``keep_last`` (≥ 1)
    complete checkpoints are kept. One writer per directory at a time: construction removes
    what dead attempts left half-written.

    ``async_save``: ``"process"``: DCP's checkpoint process (``AsyncCheckpointerType.PROCESS``,
    started at the first save, its own gloo group) writes from shared-memory staging buffers, so
    the write's Python work does not compete with the training loop for the GIL (needs
    torch.distributed initialized; costs one more interpreter importing torch per rank, at the
    first save); ``"thread"``: a thread of this process writes; ``True`` (default): the process
    where CUDA is available and torch.distributed initialized, else the thread; ``False``:
    synchronous. Raises ``ValueError`` for anything else. Commit, pruning and the ``checkpoint``
    record are the same in every mode (rank 0, after every rank has written).

    Why the process on a GPU host: there the loop's own Python (launching kernels) is what the
    GIL serializes, and a writer thread's Python slows it. ``bench/checkpoint_stall.py`` on an
    H100 (1.5 GiB of state, a 35 ms step): the thread writer stalled the loop for 54–76% of a
    synchronous save, the process for 1.5%. On a CPU-only host the loop's compute competes with
    either writer for the same cores, and the thread spares each rank a second interpreter.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        keep_last: int = 3,
        async_save: bool | str = True,
    ) -> None:
        if keep_last < 1:
            raise ValueError("keep_last must be at least 1")
        mode = _default_writer() if async_save is True else async_save or "sync"
        if mode not in ("sync", "thread", "process"):
            raise ValueError(
                f"async_save must be a bool, 'thread' or 'process', not {async_save!r}"
            )
        if mode == "process" and not dist.is_initialized():
            raise ValueError("async_save='process' needs torch.distributed initialized")
        self.directory = Path(directory) if directory is not None else _default_directory()
        self.keep_last = keep_last
        self.async_save = mode != "sync"
        self.mode = mode
        self._writer_kind = (
            AsyncCheckpointerType.PROCESS if mode == "process" else AsyncCheckpointerType.THREAD
        )
        self._rank, self._world = _dist.rank_and_world()
        # DCP's own collectives (plans, completion) run on a gloo group of their own: from the
        # background thread they must never interleave with the job's collectives.
        self._group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self._token = f"{_dist.broadcast_int(secrets.randbits(48)):012x}"
        self._stager = (
            DefaultStager(_staging_options(mode == "process")) if self.async_save else None
        )
        self._pending: _Save | None = None
        self._closed = False
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._rank == 0:
            ckptdir.remove_stale(self.directory, self._token)

    # -- saving ---------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        *,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Checkpoint ``step``: the model, its optimizer, this rank's RNG states and ``extra``.

        Collective (every rank, same step). Asynchronous by default: returns once the state is
        copied; :meth:`wait` for the commit. ``extra`` (the data position, epoch, ...) must be
        JSON-serializable and comes back from :meth:`load` after a JSON round trip; each rank
        keeps its own. A step that already has a complete checkpoint keeps the first one.
        Raises ``TypeError`` for bad arguments, and the previous save's error if it failed.
        """
        self._check_open()
        started = time.monotonic()
        self.wait()
        if optimizer is not None and model is None:
            raise TypeError("saving an optimizer needs its model")
        job = _Save(
            int(step),
            ckptdir.tmp_path(self.directory, step, self._token),
            started,
            dict(extra or {}),
        )
        state = self._state_dict(job, model, optimizer)
        job.tmp.mkdir(parents=True, exist_ok=True)
        writer = FileSystemWriter(job.tmp, sync_files=True)
        common: dict[str, Any] = {
            "storage_writer": writer,
            "planner": RawBytesSavePlanner(),
            "process_group": self._group,
            "no_dist": self._group is None,
        }
        if self._stager is None:
            dcp_save(state, **common)
            job.stall = time.monotonic() - started
            self._written(job)
            job.done.result()
            return
        upload = dcp_async_save(
            state, async_stager=self._stager, async_checkpointer_type=self._writer_kind, **common
        )
        job.stall = time.monotonic() - started
        self._pending = job
        assert isinstance(upload, Future)
        upload.add_done_callback(lambda future: self._written(job, future))

    def _state_dict(
        self, job: _Save, model: nn.Module | None, optimizer: torch.optim.Optimizer | None
    ) -> dict[str, Any]:
        try:
            own = json.dumps(
                {
                    "step": job.step,
                    "rank": self._rank,
                    "world_size": self._world,
                    "extra": job.extra,
                    "rng": capture_rng(_cuda_device()),
                }
            )
        except (TypeError, ValueError) as error:
            raise TypeError(f"checkpoint extra must be JSON-serializable: {error}") from error
        state: dict[str, Any] = {_RANKS: {str(self._rank): io.BytesIO(own.encode())}}
        if model is not None:
            model_state, optim_state = get_state_dict(model, optimizer or [])
            state["model"] = model_state
            if optimizer is not None:
                state["optim"] = optim_state
        return state

    def _written(self, job: _Save, upload: Future[Any] | None = None) -> None:
        # Runs on the writer thread once this rank's files are durable. Rank 0's DCP save returns
        # only after every rank's write finished, so rank 0 can publish the checkpoint.
        try:
            if upload is not None:
                upload.result()
            if self._rank == 0:
                self._commit(job)
        except BaseException as error:  # handed to the caller by wait()
            job.done.set_exception(error)
        else:
            job.done.set_result(None)

    def _commit(self, job: _Save) -> None:
        final = ckptdir.final_path(self.directory, job.step)
        manifest = {
            "step": job.step,
            "world_size": self._world,
            "created": time.time(),
            "attempt": os.environ.get(env.ATTEMPT),
            "extra": job.extra,
        }
        size = ckptdir.commit(job.tmp, final, manifest)
        # By step: a save below keep_last newer ones (a job that went back) is pruned at once.
        ckptdir.prune(self.directory, self.keep_last, self._token)
        seconds = time.monotonic() - job.started
        session.record(
            "checkpoint",
            step=job.step,
            metrics={
                "seconds": seconds,
                "stall_seconds": job.stall if job.stall is not None else seconds,
                "bytes": float(size or 0),
            },
        )

    def wait(self) -> None:
        """Block until the pending save (if any) is written and, on rank 0, committed.

        Raises the save's exception if it failed. Idempotent.
        """
        job, self._pending = self._pending, None
        if job is not None:
            job.done.result()

    @property
    def pending(self) -> bool:
        """Whether a save is still being written."""
        return self._pending is not None and not self._pending.done.done()

    # -- loading --------------------------------------------------------------------------------

    def latest(self) -> int | None:
        """The newest complete checkpoint's step in the directory, or ``None`` (local, cheap)."""
        return ckptdir.latest_step(self.directory)

    def steps(self) -> list[int]:
        """Steps of all complete checkpoints, ascending."""
        return ckptdir.complete_steps(self.directory)

    def load(
        self,
        *,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        step: int | None = None,
        rng: bool = True,
    ) -> ResumeState | None:
        """Restore the latest complete checkpoint (or ``step``'s) into ``model`` and ``optimizer``.

        Collective. Without ``step`` rank 0 chooses the latest and tells the others. Also restores
        this rank's RNG states (unless ``rng=False``) and returns its ``extra``. Returns ``None``
        when there is no checkpoint; raises ``FileNotFoundError`` if ``step`` is not complete and
        what DCP raises if the checkpoint lacks what is asked (e.g. an optimizer). Rank 0 writes a
        ``resume`` telemetry record (the step, and ``seconds`` the load took).
        """
        self._check_open()
        self.wait()
        began = time.monotonic()
        chosen = self._agree_step(step)
        if chosen is None:
            return None
        path = ckptdir.final_path(self.directory, chosen)
        own = f"{_RANKS}.{self._rank}" in SafeReader(path).read_metadata().state_dict_metadata
        key = str(self._rank) if own else "0"
        state: dict[str, Any] = {_RANKS: {key: io.BytesIO()}}
        if optimizer is not None and model is None:
            raise TypeError("loading an optimizer needs its model")
        if model is not None:
            model_state, optim_state = get_state_dict(model, optimizer or [])
            state["model"] = model_state
            if optimizer is not None:
                state["optim"] = optim_state
        dcp_load(
            state,
            storage_reader=SafeReader(path),
            planner=SafeLoadPlanner(),
            process_group=self._group,
            no_dist=self._group is None,
        )
        if model is not None:
            set_state_dict(
                model,
                optimizer or [],
                model_state_dict=state["model"],
                optim_state_dict=state.get("optim", {}),
            )
        saved = json.loads(state[_RANKS][key].getvalue())
        restored = rng and own
        if restored:
            restore_rng(saved["rng"], _cuda_device())
        if self._rank == 0:
            seconds = time.monotonic() - began
            session.record("resume", step=chosen, metrics={"seconds": seconds})
        return ResumeState(chosen, dict(saved.get("extra", {})), path, restored)

    def _agree_step(self, step: int | None) -> int | None:
        if step is not None:
            if ckptdir.read_manifest(ckptdir.final_path(self.directory, step)) is None:
                raise FileNotFoundError(f"no complete checkpoint of {step=} in {self.directory}")
            return step
        latest = self.latest() if self._rank == 0 else None
        agreed = _dist.broadcast_int(-1 if latest is None else latest)
        return None if agreed < 0 else agreed

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Wait for the pending save and release the staging buffer. Idempotent."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            if self._stager is not None:
                self._stager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Checkpointer is closed")


def _default_writer() -> str:
    gpu_host = torch.cuda.is_available() and dist.is_initialized()
    return "process" if gpu_host else "thread"


def _default_directory() -> Path:
    try:
        directory = session.context().checkpoint_dir
    except RuntimeError:
        directory = None
    if directory is None and os.environ.get(env.CHECKPOINT_DIR):
        directory = Path(os.environ[env.CHECKPOINT_DIR])
    if directory is None:
        raise ValueError(
            "no checkpoint directory: pass directory= or run under the aicluster runtime "
            f"(which sets {env.CHECKPOINT_DIR})"
        )
    return directory


def _staging_options(shared: bool) -> StagingOptions:
    # Staging copies into CPU buffers kept between saves (page faults of a fresh copy cost
    # several times the copy itself); pinned only where there is a GPU to copy from; in shared
    # memory for a checkpoint process (then only their handles cross to it).
    cuda = torch.cuda.is_available()
    return StagingOptions(
        use_pinned_memory=cuda,
        use_shared_memory=shared,
        use_async_staging=False,
        use_non_blocking_copy=False,
    )


def _cuda_device() -> torch.device | None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return torch.device("cuda", torch.cuda.current_device())
    return None
