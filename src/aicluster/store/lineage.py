"""Lineage: the dataset versions each model version was trained on, and back.

At registration the store copies the training job's *recorded* inputs (``job_datasets``, written
at submit from the spec's resolved ``data:``) with their manifests' hashes into
``model_datasets``, in the registration's transaction: what a job claims about its data
(``model.json``'s ``dataset_hash``) is kept beside it but never decides lineage. The copy outlives
the dataset version: a version deleted later (as the law may ask) shows as deleted, with the
hash it had.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, insert, select

from aicluster.store import schema
from aicluster.store.base import StoreBase

__all__ = ["DatasetUse", "LineageOps", "ModelLineage"]

trained_on = schema.model_datasets
_versions = schema.dataset_versions


@dataclass(frozen=True)
class DatasetUse:
    """A dataset version a model was trained on; ``deleted`` once that version is gone."""

    name: str
    version: int
    manifest_sha256: str | None
    deleted: bool

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


@dataclass(frozen=True)
class ModelLineage:
    """Where a model version came from and where it serves: its datasets, and the share of its
    deployment's traffic it has (None when its model is not deployed or it is not in the map)."""

    datasets: tuple[DatasetUse, ...]
    traffic: float | None


def _version_of(tenant: Any, name: Any, version: Any) -> Any:
    """The join condition to a row of ``dataset_versions``."""
    return and_(
        _versions.c.tenant == tenant, _versions.c.name == name, _versions.c.version == version
    )


def copy_job_datasets(
    connection: Connection, tenant: str, model: str, version: int, job_id: str
) -> None:
    """Record the datasets ``job_id`` read as ``model:version``'s (inside the registration)."""
    uses = schema.job_datasets
    query = (
        select(uses.c.name, uses.c.version, _versions.c.manifest_sha256)
        .select_from(uses)
        .outerjoin(_versions, _version_of(uses.c.tenant, uses.c.name, uses.c.version))
        .where(uses.c.job_id == job_id, uses.c.tenant == tenant)
    )
    rows = [
        {
            "tenant": tenant,
            "model": model,
            "model_version": version,
            "dataset": name,
            "dataset_version": int(number),
            "manifest_sha256": sha,
        }
        for name, number, sha in connection.execute(query)
    ]
    if rows:
        connection.execute(insert(trained_on), rows)


class LineageOps(StoreBase):
    """Reading lineage (mixed into ``Store``). Every query names its tenant."""

    def model_lineage(self, tenant: str, name: str, version: int) -> ModelLineage:
        """The datasets of one model version (deleted ones marked) and its serving share."""
        query = (
            select(
                trained_on.c.dataset,
                trained_on.c.dataset_version,
                trained_on.c.manifest_sha256,
                _versions.c.manifest_sha256.label("now"),
            )
            .select_from(trained_on)
            .outerjoin(
                _versions,
                _version_of(
                    trained_on.c.tenant, trained_on.c.dataset, trained_on.c.dataset_version
                ),
            )
            .where(
                trained_on.c.tenant == tenant,
                trained_on.c.model == name,
                trained_on.c.model_version == version,
            )
            .order_by(trained_on.c.dataset)
        )
        deployments = schema.deployments
        with self._read() as connection:
            rows = connection.execute(query).all()
            traffic = connection.execute(
                select(deployments.c.traffic).where(
                    deployments.c.tenant == tenant,
                    deployments.c.name == name,
                    deployments.c.state == "active",
                )
            ).scalar()
        uses = tuple(
            # A version number pushed again after a delete is another version: compare hashes.
            DatasetUse(dataset, int(number), sha, now is None or now != sha)
            for dataset, number, sha, now in rows
        )
        share = None if traffic is None else traffic.get(str(version))
        return ModelLineage(uses, None if share is None else float(share))

    def models_from_dataset(self, tenant: str, name: str, version: int) -> list[str]:
        """``MODEL:VERSION`` of every model version trained on ``name:version`` of ``tenant``
        as stored now (a number pushed again after a delete is another version: hashes must
        match)."""
        same = _version_of(trained_on.c.tenant, trained_on.c.dataset, trained_on.c.dataset_version)
        query = (
            select(trained_on.c.model, trained_on.c.model_version)
            .join(_versions, same & (_versions.c.manifest_sha256 == trained_on.c.manifest_sha256))
            .where(
                trained_on.c.tenant == tenant,
                trained_on.c.dataset == name,
                trained_on.c.dataset_version == version,
            )
            .order_by(trained_on.c.model, trained_on.c.model_version)
        )
        with self._read() as connection:
            return [f"{model}:{number}" for model, number in connection.execute(query)]
