"""``python -m aicluster.runtime``: the supervisor of a detached embedded cluster."""

from aicluster.runtime.cluster.embedded import main

__all__: list[str] = []

main()
