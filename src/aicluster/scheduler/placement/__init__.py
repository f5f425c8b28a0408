"""Gang placement: the search by GPUs and topology (:mod:`.search`), by CPUs and memory
(:mod:`.host`), pipelines kept inside racks (:mod:`.pipeline`), the topology-oblivious baseline
(:mod:`.random`), and the placement built from what was found or the reason none was
(:mod:`.result`).
"""

from aicluster.scheduler.placement.pipeline import describe_mesh
from aicluster.scheduler.placement.result import PlacementFailure, pipelines_in_rack
from aicluster.scheduler.placement.search import find_placement, gpu_types_for

__all__ = [
    "PlacementFailure",
    "describe_mesh",
    "find_placement",
    "gpu_types_for",
    "pipelines_in_rack",
]
