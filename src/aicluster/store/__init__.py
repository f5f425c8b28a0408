"""Persistence: SQLite by default, PostgreSQL by URL; jobs, the event and audit log, tenants,
users and tokens, nodes, the model registry, and leader election. Depends on
:mod:`aicluster.core` only.

``Store.open(state_dir_or_url)`` migrates to the newest schema and returns a :class:`Store`;
every method is one transaction and returns after it commits.
"""

from aicluster.store.auth import TOKEN_PREFIX, hash_token
from aicluster.store.configs import ConfigRecord
from aicluster.store.datasets import (
    DataPolicy,
    DataQuotaExceeded,
    DatasetVersionRecord,
    Removed,
)
from aicluster.store.engine import DB_FILE, migrate, resolve_url
from aicluster.store.errors import (
    AuthenticationError,
    Conflict,
    IdempotencyConflict,
    LeaseLost,
    NotFound,
    StaleState,
    StoreError,
)
from aicluster.store.fencing import Fence
from aicluster.store.leader import LeaderLease, leader_lock
from aicluster.store.models import check_model_name
from aicluster.store.records import (
    EventRecord,
    IssuedToken,
    JobRecord,
    ModelVersionRecord,
    NodeHealth,
    NodeRecord,
    Principal,
    Role,
    TokenInfo,
    UserRecord,
    placement_from_json,
    placement_to_json,
)
from aicluster.store.rollouts import RolloutRecord
from aicluster.store.serving import DeploymentRecord
from aicluster.store.stats import JobCount, PlacedJob
from aicluster.store.store import Store

__all__ = [
    "DB_FILE",
    "TOKEN_PREFIX",
    "AuthenticationError",
    "ConfigRecord",
    "Conflict",
    "DataPolicy",
    "DataQuotaExceeded",
    "DatasetVersionRecord",
    "DeploymentRecord",
    "EventRecord",
    "Fence",
    "IdempotencyConflict",
    "IssuedToken",
    "JobCount",
    "JobRecord",
    "LeaderLease",
    "LeaseLost",
    "ModelVersionRecord",
    "NodeHealth",
    "NodeRecord",
    "NotFound",
    "PlacedJob",
    "Principal",
    "Removed",
    "Role",
    "RolloutRecord",
    "StaleState",
    "Store",
    "StoreError",
    "TokenInfo",
    "UserRecord",
    "check_model_name",
    "hash_token",
    "leader_lock",
    "migrate",
    "placement_from_json",
    "placement_to_json",
    "resolve_url",
]
