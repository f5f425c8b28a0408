"""The simulator's communication model: how a gang's spread over the topology slows it.

One rule (``docs/simulator.md``, "Communication"). A job's *communication sensitivity* ``s`` is
the fraction of its iteration spent communicating when the whole gang sits in one NVLink domain.
Spread wider, its traffic crosses slower links: a gang whose GPUs span level ``L`` communicates
at ``bw(L)``, the slowest link up to ``L`` (:meth:`LinkBandwidth.spanning`), so an iteration
takes ``(1 − s) + s × bw(nvlink) / bw(L)`` of its NVLink time::

    slowdown(L) = 1 + s × (bw(nvlink) / bw(L) − 1)

and the run's speed (work per wall second) is ``1 / slowdown``. A gang of one GPU, or one inside
one NVLink domain, runs at full speed; so does every job of sensitivity 0.

A job's sensitivity is its trace's ``comm_sensitivity`` where the trace gives one, else the
configuration's default for its size class (``simulation.communication.sensitivity_by_gpus``:
the entry of the largest GPU count not above the job's), else 0.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from aicluster.core import Cluster, DomainLevel, Placement

__all__ = ["CommModel"]


class CommModel:
    """Slowdowns of placements on one cluster (its bandwidths and where its nodes sit), and
    the sensitivity of jobs whose trace gives none: ``classes`` holds (least GPUs, sensitivity)
    pairs sorted by GPUs (``SimConfig.comm_sensitivity``)."""

    def __init__(self, cluster: Cluster, classes: Sequence[tuple[int, float]] = ()) -> None:
        self.class_gpus = [least for least, _ in classes]
        self.class_sensitivity = [sensitivity for _, sensitivity in classes]
        bandwidth = cluster.bandwidth
        fastest = bandwidth.at(DomainLevel.NVLINK)
        #: bw(nvlink) / bw(L) − 1 for each level L: the extra time per unit of sensitivity.
        self.extra = [fastest / bandwidth.spanning(level) - 1.0 for level in DomainLevel]
        self.rack = {node.name: node.rack for node in cluster.nodes}
        self.pod = {node.name: node.pod for node in cluster.nodes}

    def by_size(self, gpus: int) -> float:
        """The sensitivity of a job of ``gpus`` GPUs by size class: that of the last class it
        reaches (0 below all, and with no classes)."""
        position = bisect_right(self.class_gpus, gpus)
        return self.class_sensitivity[position - 1] if position else 0.0

    def slowdown(self, placement: Placement, sensitivity: float) -> float:
        """How many times longer an iteration takes on ``placement`` than in one NVLink
        domain (1.0 for sensitivity 0)."""
        if sensitivity <= 0.0:
            return 1.0
        return 1.0 + sensitivity * self.extra[self.span(placement)]

    def span(self, placement: Placement) -> DomainLevel:
        """The narrowest topology level holding every GPU of ``placement``."""
        slots = placement.slots
        nodes = {slot.node for slot in slots}
        if len(nodes) <= 1:
            domains = {slot.nvlink_domain for slot in slots}
            # -1: a unit wider than an NVLink domain (placement/result.py), so spread over several.
            one_domain = len(domains) <= 1 and -1 not in domains
            return DomainLevel.NVLINK if one_domain else DomainLevel.NODE
        if len({self.rack[node] for node in nodes}) == 1:
            return DomainLevel.RACK
        if len({self.pod[node] for node in nodes}) == 1:
            return DomainLevel.POD
        return DomainLevel.CLUSTER
