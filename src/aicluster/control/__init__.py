"""The control plane: the loop joining store, scheduler and runtime; leader election."""

from aicluster.control.plane import ControlPlane

__all__ = ["ControlPlane"]
