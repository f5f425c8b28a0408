"""The free-capacity index: free GPUs, CPUs and memory per node, kept so that a cycle never
rescans the cluster. What the scheduler asks and changes is :mod:`.free`; the tables beneath and
their bookkeeping, :mod:`.tables`, with each node's part of it (:mod:`.books`), the domains nodes
are grouped into (:mod:`.domains`), racks and pods by capacity (:mod:`.fit`) and the content
hash's keys (:mod:`.keys`).
"""

from aicluster.scheduler.index.domains import Domain, spread
from aicluster.scheduler.index.free import FreeIndex

__all__ = ["Domain", "FreeIndex", "spread"]
