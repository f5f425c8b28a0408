"""The deployer asks the leader lease just before it changes Serve: a deposed leader that wakes
up deploys and deletes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest.mock import create_autospec

import pytest

from aicluster.core import JobState, ManualClock
from aicluster.serve.deployer import Deployer, RayServe
from aicluster.store import JobRecord, LeaseLost
from aicluster.store.serving import DeploymentRecord
from builders import service_job


def backend(apps: dict[str, str | None]) -> Any:
    """Ray Serve with ``apps`` in it, as the deployer sees it: :class:`RayServe`'s own methods and
    signatures (autospec: a call the real backend would refuse fails here too), without Ray."""
    serve = create_autospec(RayServe, instance=True)
    serve.applications.return_value = dict(apps)
    serve.gpu_resources.return_value = {}
    return serve


def changes(serve: Any) -> list[tuple[str, str]]:
    """What the deployer changed in Serve, in order: ``(deploy|delete, app)``."""
    return [(name, args[0]) for name, args, _ in serve.mock_calls if name in ("deploy", "delete")]


class Store:
    def __init__(self, records: list[DeploymentRecord]) -> None:
        self.records = records

    def list_deployments(self, tenant: str | None = None) -> list[DeploymentRecord]:
        return self.records

    def service_jobs(self) -> list[JobRecord]:
        """gpt v1's one replica, admitted on node-0 (a version runs once one is)."""
        return [service_job("j1", JobState.RUNNING, "node-0")]


def record() -> DeploymentRecord:
    return DeploymentRecord(
        id=1,
        tenant="team",
        name="gpt",
        scaling={"replicas": 1},
        traffic={1: 100.0},
        state="active",
        created_by="u",
        created_at=0.0,
        updated_at=0.0,
        version=1,
    )


def deployer(backend: Any, records: list[DeploymentRecord], leading: list[bool]) -> Deployer:
    made = Deployer(
        Store(records),
        backend,
        ManualClock(100.0),
        healthy=lambda record, version: False,
        artifact_dir=lambda tenant, name, version: Path(f"/models/{name}/{version}"),
        drain_s=0.0,
    )
    made.confirm = lambda: leading[0]
    return made


def test_a_deployer_that_no_longer_leads_deploys_nothing() -> None:
    serve, leading = backend({}), [False]
    with pytest.raises(LeaseLost):
        deployer(serve, [record()], leading).reconcile()
    assert changes(serve) == []
    leading[0] = True
    deployer(serve, [record()], leading).reconcile()
    assert [kind for kind, _ in changes(serve)] == ["deploy"]


def test_a_deployer_that_no_longer_leads_removes_nothing() -> None:
    serve, leading = backend({"aic-team.old.v1": None}), [False]
    with pytest.raises(LeaseLost):
        deployer(serve, [], leading).reconcile(200.0)
    assert changes(serve) == []
    leading[0] = True
    deployer(serve, [], leading).reconcile(200.0)
    assert changes(serve) == [("delete", "aic-team.old.v1")]
