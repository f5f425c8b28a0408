"""The API a job script calls: distributed setup from the runtime's environment, and telemetry.

Works the same under the aicluster runtime, under ``torchrun`` and as a plain ``python script.py``
(a world of one). ``torch`` is imported when :func:`init` runs, so reading this package's
telemetry format (the runtime does) does not load torch.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aicluster.train import _dist, env, preemption
from aicluster.train.telemetry import StepRecord, TelemetryWriter

if TYPE_CHECKING:
    import torch

__all__ = [
    "Context",
    "barrier",
    "choose_backend",
    "context",
    "init",
    "is_main",
    "record",
    "report",
    "shutdown",
]


@dataclass(frozen=True)
class Context:
    """Who this process is in its gang, and where its outputs go."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    backend: str
    device: torch.device
    node: str | None
    job_id: str | None
    attempt: int | None
    run_dir: Path | None
    checkpoint_dir: Path | None


_context: Context | None = None
_writer: TelemetryWriter | None = None
#: The runtime's step-timing shim (``runtime/gang/_steptime.py``) publishes itself under this name;
#: it counts the bytes this rank hands to collectives.
_STEPTIME = "_aicluster_steptime"
_bytes_reported = 0


def _comm_bytes_since_last_report() -> float | None:
    """Bytes handed to collectives since the previous report, when the runtime counts them."""
    global _bytes_reported
    bytes_sent = getattr(sys.modules.get(_STEPTIME), "bytes_sent", None)
    if bytes_sent is None:
        return None
    total = int(bytes_sent())
    sent, _bytes_reported = total - _bytes_reported, total
    return float(sent)


def choose_backend(cuda_available: bool, gpus: int, override: str | None = None) -> str:
    """``nccl`` when this rank holds real GPUs, ``gloo`` otherwise (CPU or simulated GPUs)."""
    if override:
        return override
    return "nccl" if cuda_available and gpus > 0 else "gloo"


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def _free_port() -> int:
    # A world of one still needs a store; the OS picks an unused port for it.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init(
    backend: str | None = None, *, timeout_s: float = 600.0, handle_sigterm: bool = True
) -> Context:
    """Join the gang: ``torch.distributed.init_process_group`` from the environment.

    Idempotent (a second call returns the same context). The device is ``cuda:<i>`` under NCCL
    (the runtime makes only the rank's own GPU visible, so it is ``cuda:0``; with several
    visible, the one ``AICLUSTER_DEVICE_INDEX`` names, else the local rank's) and ``cpu``
    otherwise (simulated GPUs too: their index is in ``AICLUSTER_DEVICE_INDEX``). Writes a
    ``start`` telemetry record. With ``handle_sigterm`` installs the stop handler (see
    :mod:`aicluster.train.preemption`): SIGTERM then sets the flag that
    :func:`~aicluster.train.should_stop` reports. The start record's metrics carry ``init_at``
    (when this call began: the script's imports are done) and, under the runtime,
    ``spawned_at`` (when the process was started), so a restart's time can be broken down, and
    ``device_index`` and ``nvlink_domain``, the rank's GPU and its NVLink domain on the node.
    Raises what ``init_process_group`` raises, e.g. when peers do not join within ``timeout_s``.
    """
    global _context, _writer
    if _context is not None:
        return _context
    began = time.time()
    import torch.distributed as dist

    rank, world = _int_env(env.RANK, 0), _int_env(env.WORLD_SIZE, 1)
    chosen, device = _backend_and_device(backend)
    if not dist.is_initialized():
        # Without MASTER_ADDR (a plain ``python script.py``) a world of one gets a local store.
        init_method = "env://" if env.MASTER_ADDR in os.environ else None
        dist.init_process_group(
            chosen,
            init_method=init_method or f"tcp://127.0.0.1:{_free_port()}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
    _context = _context_from_env(rank, world, chosen, device)
    _writer = TelemetryWriter(
        os.environ.get(env.TELEMETRY_FILE), rank, _context.node, _context.attempt
    )
    metrics = {"pid": float(os.getpid()), "world_size": float(world), "init_at": began}
    spawned = os.environ.get(env.SPAWNED_AT, "")
    if spawned:
        metrics["spawned_at"] = float(spawned)
    if os.environ.get(env.WARM_STARTED) == "1":
        metrics["warm"] = 1.0
    placed = (("device_index", env.DEVICE_INDEX), ("nvlink_domain", env.NVLINK_DOMAIN))
    for name, variable in placed:  # the rank's GPU on its node, set by the runtime
        if os.environ.get(variable, "").strip():
            metrics[name] = float(_int_env(variable, 0))
    _writer.write("start", metrics=metrics)
    if handle_sigterm:
        preemption.install_handler()
    return _context


def _backend_and_device(backend: str | None) -> tuple[str, torch.device]:
    import torch

    gpus = _int_env(env.GPUS, 1 if torch.cuda.is_available() else 0)
    accelerator = os.environ.get(env.ACCELERATOR, "cuda" if gpus else "cpu")
    chosen = choose_backend(
        torch.cuda.is_available() and accelerator == "cuda",
        gpus,
        backend or os.environ.get(env.BACKEND),
    )
    if chosen != "nccl":
        return chosen, torch.device("cpu")
    count = torch.cuda.device_count()
    index = 0  # the runtime makes only the rank's own GPU visible
    if count > max(gpus, 1):
        # Several GPUs visible: the index the runtime chose, else (torchrun) the local rank's.
        index = _int_env(env.DEVICE_INDEX, _int_env(env.LOCAL_RANK, 0) * max(gpus, 1)) % count
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return chosen, device


def _context_from_env(rank: int, world: int, backend: str, device: torch.device) -> Context:
    run_dir = os.environ.get(env.RUN_DIR)
    checkpoint_dir = os.environ.get(env.CHECKPOINT_DIR)
    attempt = _int_env(env.ATTEMPT, -1)
    return Context(
        rank=rank,
        world_size=world,
        local_rank=_int_env(env.LOCAL_RANK, 0),
        local_world_size=_int_env(env.LOCAL_WORLD_SIZE, 1),
        node_rank=_int_env(env.NODE_RANK, 0),
        backend=backend,
        device=device,
        node=os.environ.get(env.NODE),
        job_id=os.environ.get(env.JOB_ID),
        attempt=attempt if attempt >= 0 else None,
        run_dir=Path(run_dir) if run_dir else None,
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None,
    )


def context() -> Context:
    """The context :func:`init` made; raises ``RuntimeError`` before it."""
    if _context is None:
        raise RuntimeError("call aicluster.train.init() first")
    return _context


def is_main() -> bool:
    """True on rank 0 (the rank that prints, saves and evaluates)."""
    return context().rank == 0


def report(
    step: int,
    loss: Any = None,
    samples: int | None = None,
    *,
    step_time: float | None = None,
    **metrics: Any,
) -> StepRecord:
    """Record one training step of this rank: loss, samples processed and any other numbers
    (under the runtime, ``comm_bytes`` too: what the rank handed to collectives since the last
    report).

    ``loss`` and metrics may be tensors (their ``.item()`` is taken). ``step_time`` defaults to
    the time since this rank's previous report (or since :func:`init`); throughput is
    ``samples / step_time``. Cheap: one short line appended to this rank's telemetry file.
    """
    if _writer is None:
        raise RuntimeError("call aicluster.train.init() before report()")
    if "comm_bytes" not in metrics:
        sent = _comm_bytes_since_last_report()
        if sent is not None:
            metrics["comm_bytes"] = sent
    return _writer.write(
        "step",
        step=int(step),
        loss=None if loss is None else float(loss),
        samples=samples,
        step_time=step_time,
        metrics={key: float(value) for key, value in metrics.items()},
    )


def record(kind: str, **fields: Any) -> StepRecord | None:
    """Write a telemetry record of another kind (e.g. ``checkpoint``); ``None`` before init.

    Thread-safe; used by the library itself (a checkpoint's background writer).
    """
    writer = _writer
    return writer.write(kind, **fields) if writer is not None else None


def barrier() -> None:
    """Wait for every rank (no-op outside a process group)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    """Write an ``end`` record and leave the process group. Idempotent.

    Restores the SIGTERM disposition :func:`init` found.
    """
    global _context, _writer
    preemption.uninstall_handler()
    if _writer is not None:
        _writer.write("end")
        _writer.close()
    _writer = None
    if _context is not None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    _dist.forget_groups()
    _context = None
