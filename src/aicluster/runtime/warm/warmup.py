"""Which nodes were asked for their warm processes (:mod:`.starter`), so that even a node's first
gang starts warm: the node's own starter (it also reports the node's measured power,
:mod:`..cluster.powermeter`) and each sandboxed tenant's. The runtime asks at every control-loop
tick; this remembers what was asked, so that a tick costs nothing once every node has its
starters."""

from __future__ import annotations

import os
import time
from pathlib import Path

from aicluster.runtime.cluster.discovery import ClusterView, discover
from aicluster.runtime.cluster.powermeter import power_report_path
from aicluster.runtime.labels import GPU_RESOURCE
from aicluster.runtime.warm.starter import ensure_warm_starter, tenant_warm_sandbox

__all__ = ["REASK_S", "WarmUps"]

#: How often a node whose power report is missing or stale is asked again (seconds).
REASK_S = 60.0


class WarmUps:
    """The warm starters asked for on the nodes of one runtime's ``state_dir``."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.state_dir = str(state_dir)
        self._warmed: set[str] = set()  # Ray node ids whose warm process was asked for
        self._asked_at: dict[str, float] = {}  # when each node's own starter was last asked
        self._warmed_tenants: set[tuple[str, str]] = set()  # (Ray node id, tenant) likewise
        self.tenants: dict[str, tuple[int, int]] = {}  # sandboxed tenants launched: their user

    def nodes(self, view: ClusterView) -> int:
        """Ask every alive node of ``view`` for its warm process, and for every known tenant's.
        Returns at once; idempotent per Ray node (a node that comes back has a new id and is
        asked again). Returns how many nodes were asked now."""
        asked = 0
        for name, info in view.nodes.items():
            if not info.alive or not info.ray_node_id:
                continue
            report = power_report_path(self.state_dir, name)  # measured power
            if info.ray_node_id in self._warmed:
                self._ask_again_if_silent(info.ray_node_id, report)
                continue
            self._warmed.add(info.ray_node_id)
            self._asked_at[info.ray_node_id] = time.monotonic()
            ensure_warm_starter(info.ray_node_id, self.state_dir, None, None, str(report))
            asked += 1
            for tenant, user in self.tenants.items():  # and the tenants' (sandboxed)
                self.tenant(tenant, user, view)
        return asked

    def _ask_again_if_silent(self, ray_node_id: str, report: Path) -> None:
        """A node whose power report is missing or stale (its starter was made before the
        warm-up gave it the report, or its reporter died) is asked again, at most once a
        minute: :meth:`WarmStarter.ensure` is idempotent and restarts the reporter."""
        now = time.monotonic()
        if now - self._asked_at.get(ray_node_id, 0.0) < REASK_S:
            return
        try:
            fresh = time.time() - report.stat().st_mtime < REASK_S
        except OSError:
            fresh = False
        if not fresh:
            self._asked_at[ray_node_id] = now
            ensure_warm_starter(ray_node_id, self.state_dir, None, None, str(report))

    def tenant(self, tenant: str, user: tuple[int, int], view: ClusterView | None = None) -> int:
        """Ask every alive node for ``tenant``'s warm process (in its sandbox), and from then on
        every node that joins. Not on real-GPU nodes: a sandboxed rank given GPU device nodes
        starts cold. Returns how many nodes were asked now."""
        self.tenants[tenant] = user
        asked = 0
        sandbox = tenant_warm_sandbox(self.state_dir, tenant, user)
        for info in (view or discover()).nodes.values():
            key = (info.ray_node_id or "", tenant)
            if not info.alive or not info.ray_node_id or key in self._warmed_tenants:
                continue
            if info.gpu_resource == GPU_RESOURCE:
                continue
            self._warmed_tenants.add(key)
            ensure_warm_starter(info.ray_node_id, self.state_dir, tenant, sandbox)
            asked += 1
        return asked
