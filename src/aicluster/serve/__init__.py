"""Model serving on Ray Serve: one Serve application per model version, a gateway in the API
process that splits traffic by weight, live statistics per version, and the leader's deployer
(see docs/serving.md, "Serving")."""

from aicluster.serve.deployer import Deployer, RayServe, ServeBackend
from aicluster.serve.gateway import Answer, Gateway, Observer, Route
from aicluster.serve.replica import APP_PREFIX, DEPLOYMENT, ModelReplica, app_name
from aicluster.serve.service import LeaderTask, Serving
from aicluster.serve.stats import ServingStats, VersionWindow

__all__ = [
    "APP_PREFIX",
    "DEPLOYMENT",
    "Answer",
    "Deployer",
    "Gateway",
    "LeaderTask",
    "ModelReplica",
    "Observer",
    "RayServe",
    "Route",
    "ServeBackend",
    "Serving",
    "ServingStats",
    "VersionWindow",
    "app_name",
]
