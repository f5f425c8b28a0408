"""Helpers for the checkpoint kill tests: a child that saves until killed, a checkpoint reader,
and a launcher for the ddp_mlp example as a world of one or more ranks on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import torch
from ranks import free_port
from torch import nn
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from aicluster.train import Checkpointer
from aicluster.train._dcp import SafeLoadPlanner, SafeReader

ROOT = Path(__file__).resolve().parents[2]
DDP_MLP = ROOT / "examples" / "jobs" / "ddp_mlp.py"


def numbered_model() -> nn.Module:
    """About 16 MiB of parameters: big enough that a save takes a while to write."""
    return nn.Sequential(*(nn.Linear(512, 512) for _ in range(16)))


def save_until_killed(directory: str, keep_last: int, ready: Event, writer: str = "thread") -> None:
    """Continue from the latest checkpoint; save steps whose parameters all equal the step.

    Runs in a session of its own, so that killing its process group also kills DCP's checkpoint
    process (``writer="process"``), as a lost node or the runtime's kill of a rank would."""
    os.setsid()
    torch.set_num_threads(1)
    if writer == "process":  # the checkpoint process needs a process group: a world of one
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
    model = numbered_model()
    ckpt = Checkpointer(directory, keep_last=keep_last, async_save=writer)
    resumed = ckpt.load(model=model)
    step = resumed.step if resumed else 0
    ready.set()
    while True:
        step += 1
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(float(step))
        ckpt.save(step, model=model, extra={"step": step})


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Every tensor and every per-rank JSON blob of a checkpoint, by flattened key."""
    metadata = SafeReader(path).read_metadata()
    state: dict[str, Any] = {}
    for key, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            state[key] = torch.empty(item.size, dtype=item.properties.dtype)
        elif isinstance(item, BytesStorageMetadata) and key.startswith("ranks."):
            state[key] = io.BytesIO()
    dcp_load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner(), no_dist=True)
    return {k: v.getvalue() if isinstance(v, io.BytesIO) else v for k, v in state.items()}


#: The rendezvous port of the world started last.
_LAST_PORT = [0]


def launch_ddp_mlp(
    world: int, args: list[str], logs: Path, env: dict[str, str] | None = None
) -> list[subprocess.Popen[bytes]]:
    """Start ``world`` ranks of the example, each in its own session (as the runtime does)."""
    port = free_port()
    while port == _LAST_PORT[0]:  # two worlds may start side by side: never the same port
        port = free_port()
    _LAST_PORT[0] = port
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(world):
        rank_env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        rank_env = {k: v.replace("{rank}", str(rank)) for k, v in rank_env.items()}
        with open(logs / f"rank-{rank}.log", "ab") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-u", str(DDP_MLP), *args],
                    env=rank_env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return procs


def kill_all(procs: list[subprocess.Popen[bytes]], sig: int = signal.SIGKILL) -> None:
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    for proc in procs:
        proc.wait(timeout=60)
