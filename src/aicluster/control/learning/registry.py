"""Registering a job's exported model: by the control loop when the job succeeds, or by hand.

A job's rank 0 exports to ``<state_dir>/runs/<job_id>/data/export`` (:mod:`aicluster.train.export`),
a directory the job owns. :func:`snapshot_export` first copies it, through the job-output reader (no
link followed, regular files only, within caps), into a directory of root's beside the run
directories; only that copy is read. This module then checks the artifact without running its code,
derives the lineage (the job, its spec hash, the SHA-256 of the code snapshot, the dataset hash and
metrics from ``model.json``) and hands it to the store, which copies it into the registry."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aicluster.runtime import RunDir
from aicluster.runtime.joboutput import copy_tree, open_regular
from aicluster.store import JobRecord, ModelVersionRecord, Store, StoreError
from aicluster.train.export import CODE_DIR, META_FILE, check_artifact, tree_sha256

__all__ = [
    "EXPORT_DIR",
    "NoExport",
    "register_job_model",
    "register_on_success",
    "snapshot_export",
]

#: The export's directory inside a job's directory (next to ``checkpoints``).
EXPORT_DIR = "export"
log = logging.getLogger(__name__)


class NoExport(LookupError):
    """The job wrote no export."""


@contextmanager
def snapshot_export(state_dir: str | Path, job_id: str) -> Iterator[Path]:
    """A private copy of the job's export, removed on exit. Raises :class:`NoExport` when there
    is none, ``ValueError`` when it cannot be copied (a link, a FIFO, over a cap)."""
    run = RunDir(state_dir, job_id, 0)
    target = run.job_dir / f".export-{secrets.token_hex(6)}"
    try:
        os.close(open_regular(run.data_link, f"{EXPORT_DIR}/{META_FILE}"))
        copy_tree(run.data_link, EXPORT_DIR, target)
    except FileNotFoundError:  # no model.json: the job exported nothing
        raise NoExport(job_id) from None
    except OSError as error:
        raise ValueError(f"export: {error.strerror or error}") from None
    try:
        yield target
    finally:
        shutil.rmtree(target, ignore_errors=True)


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
        parent=job.spec.model.parent if job.spec.model is not None else None,
    )


def register_on_success(store: Store, state_dir: str | Path, job: JobRecord, actor: str) -> None:
    """The control loop's step for a job whose ranks all exited 0: register its export if it
    wrote one. Never raises: a bad export is logged as ``model.register_failed`` with the reason
    and the job still succeeds. Idempotent (a loop that restarts may call it again)."""
    try:
        with snapshot_export(state_dir, job.id) as source:
            try:
                register_job_model(store, job, source)
            except ValueError as error:  # no server paths in what the tenant reads
                raise ValueError(str(error).replace(str(source), "export")) from None
    except NoExport:
        return
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
