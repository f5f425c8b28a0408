"""Continuous-learning pipelines, the pure parts: the spec (:mod:`.spec`) and the trigger
evaluator (:mod:`.triggers`). The driver that acts on them is
:mod:`aicluster.control.learning.pipelines`."""

from aicluster.core.pipelines.spec import CanarySpec, DriftTrigger, PipelineSpec, Triggers
from aicluster.core.pipelines.triggers import Decision, Memory, Observation, evaluate

__all__ = [
    "CanarySpec",
    "Decision",
    "DriftTrigger",
    "Memory",
    "Observation",
    "PipelineSpec",
    "Triggers",
    "evaluate",
]
