"""The free-capacity index: free GPUs, CPUs and memory per node, kept so that a cycle never
rescans the cluster (:mod:`.free`), with the domains it groups nodes into (:mod:`.domains`), its
racks and pods by capacity (:mod:`.fit`), its content hash's keys (:mod:`.keys`) and each node's
part of its bookkeeping (:mod:`.books`).
"""

from aicluster.scheduler.index.domains import Domain, spread
from aicluster.scheduler.index.free import FreeIndex

__all__ = ["Domain", "FreeIndex", "spread"]
