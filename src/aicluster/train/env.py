"""Names of the environment variables the runtime sets for each rank and the train API reads.

The first six are the ``torch.distributed`` ``env://`` convention (what ``torchrun`` sets), so a
job script that calls ``torch.distributed.init_process_group()`` itself works unchanged.
"""

from __future__ import annotations

__all__ = [
    "ACCELERATOR",
    "ATTEMPT",
    "BACKEND",
    "CHECKPOINT_DIR",
    "COMM_HOOK",
    "COMM_RANK",
    "COMM_START_ITER",
    "DEVICE_INDEX",
    "GPUS",
    "JOB_ID",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE",
    "NODE_RANK",
    "NVLINK_DOMAIN",
    "PARALLELISM",
    "RANK",
    "RUN_DIR",
    "SPAWNED_AT",
    "TELEMETRY_FILE",
    "WARM_STARTED",
    "WORLD_SIZE",
]

RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
#: Index of this rank's node among the gang's nodes (rank order), as torchrun's GROUP_RANK.
NODE_RANK = "NODE_RANK"

JOB_ID = "AICLUSTER_JOB_ID"
ATTEMPT = "AICLUSTER_ATTEMPT"
#: The attempt's run directory (logs, exit records, telemetry).
RUN_DIR = "AICLUSTER_RUN_DIR"
#: This rank's telemetry file (JSON lines) inside the run directory.
TELEMETRY_FILE = "AICLUSTER_TELEMETRY_FILE"
#: Directory kept across attempts of one job, for checkpoints.
CHECKPOINT_DIR = "AICLUSTER_CHECKPOINT_DIR"
#: The aicluster node name (``aicluster.io/node`` label) this rank actually runs on.
NODE = "AICLUSTER_NODE"
#: GPUs held by this rank (simulated ones included): 1 under the runtime (a rank per GPU), or 0.
GPUS = "AICLUSTER_GPUS"
#: Index on its node of this rank's GPU (real or simulated), chosen in the NVLink domain the
#: scheduler chose. On real GPUs it is also the rank's only ``CUDA_VISIBLE_DEVICES``.
DEVICE_INDEX = "AICLUSTER_DEVICE_INDEX"
#: The NVLink domain of the node that holds this rank's GPU (``DEVICE_INDEX // domain size``).
NVLINK_DOMAIN = "AICLUSTER_NVLINK_DOMAIN"
#: ``cuda`` (real GPUs), ``sim`` (a simulated accelerator resource) or ``cpu``.
ACCELERATOR = "AICLUSTER_ACCELERATOR"
#: The spec's parallelism degrees, ``data=N,tensor=N,pipeline=N`` (:func:`aicluster.train.mesh`).
PARALLELISM = "AICLUSTER_PARALLELISM"
#: The spec's gradient compression for DDP (``comm:``; read by the runtime's step shim):
#: ``powersgd``, ``fp16`` or ``bf16``, PowerSGD's matrix rank, and the iteration it starts at.
COMM_HOOK = "AICLUSTER_COMM_HOOK"
COMM_RANK = "AICLUSTER_COMM_RANK"
COMM_START_ITER = "AICLUSTER_COMM_START_ITER"
#: Optional override of the torch.distributed backend (``gloo`` or ``nccl``).
BACKEND = "AICLUSTER_BACKEND"
#: Wall-clock time the runtime started this rank's process (before the interpreter and its
#: imports), for the start record's breakdown of a restart.
SPAWNED_AT = "AICLUSTER_SPAWNED_AT"
#: ``1`` in a rank forked from its node's warm process (torch imported before the fork).
WARM_STARTED = "AICLUSTER_WARM_STARTED"
