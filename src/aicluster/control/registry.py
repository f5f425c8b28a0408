"""Registering a job's exported model: by the control loop when the job succeeds, or by hand.

A job's rank 0 exports to ``<state_dir>/runs/<job_id>/export`` (:mod:`aicluster.train.export`);
this module checks the artifact without running its code, derives the lineage (the job, its spec
hash, the SHA-256 of the code snapshot, the dataset hash and metrics from ``model.json``) and
hands it to the store, which copies it into the registry.
"""

from __future__ import annotations

import logging
from pathlib import Path

from aicluster.runtime import RunDir
from aicluster.store import JobRecord, ModelVersionRecord, Store, StoreError
from aicluster.train.export import CODE_DIR, META_FILE, check_artifact, tree_sha256

__all__ = ["EXPORT_DIR", "export_dir", "register_job_model", "register_on_success"]

#: The export's directory inside a job's directory (next to ``checkpoints``).
EXPORT_DIR = "export"
log = logging.getLogger(__name__)


def export_dir(state_dir: str | Path, job_id: str) -> Path:
    """Where the job ``job_id`` exports its model under the runtime's state directory."""
    return RunDir(state_dir, job_id, 0).export_dir


def register_job_model(
    store: Store,
    job: JobRecord,
    source: Path,
    *,
    name: str | None = None,
    registered_by: str | None = None,
) -> ModelVersionRecord:
    """Register the artifact at ``source`` as the next version of ``name`` (default: the spec's
    model name), with ``job``'s lineage. Idempotent per (job, name).

    Raises ``ValueError`` for a bad artifact or name, and what
    :meth:`~aicluster.store.Store.register_model_version` raises.
    """
    meta = check_artifact(source)
    return store.register_model_version(
        job.tenant,
        name or job.spec.model_name,
        source_dir=source,
        job_id=job.id,
        spec_hash=job.spec_hash,
        code_version=tree_sha256(source / CODE_DIR),
        dataset_hash=meta.get("dataset_hash"),
        metrics=meta["metrics"],
        registered_by=registered_by or job.submitted_by,
    )


def register_on_success(store: Store, state_dir: str | Path, job: JobRecord, actor: str) -> None:
    """The control loop's step for a job whose ranks all exited 0: register its export if it
    wrote one. Never raises: a bad export is logged as ``model.register_failed`` with the reason
    and the job still succeeds. Idempotent (a loop that restarts may call it again)."""
    source = export_dir(state_dir, job.id)
    if not (source / META_FILE).exists():
        return
    try:
        register_job_model(store, job, source)
    except (ValueError, OSError, StoreError) as error:
        reason = str(error) or type(error).__name__
        _note_failure(store, job, actor, reason)
    except Exception as error:  # never let a registry fault stop the loop
        log.exception("registering the model of %s failed", job.id)
        _note_failure(store, job, actor, f"{type(error).__name__}: {error}")


def _note_failure(store: Store, job: JobRecord, actor: str, reason: str) -> None:
    details = {"model": job.spec.model_name, "reason": reason[:1000]}
    try:
        store.record_event(job.id, "model.register_failed", actor, details)
    except Exception:  # the store is down: the log line is all that is left
        log.exception("could not record that the model of %s was not registered", job.id)
