"""Jobs: submit, list, get, cancel, events, logs, telemetry and why-pending."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool

from aicluster.api.auditlog import audit_target
from aicluster.api.auth import CurrentPrincipal, require_role
from aicluster.api.explain import explain_score, straggler_note
from aicluster.api.feasible import Feasibility
from aicluster.api.params import Cursor, JobId, TenantFilter
from aicluster.api.ratelimit import Limits
from aicluster.api.runnable import check_runnable
from aicluster.api.schemas import EventOut, FailureOut, JobOut, Page, ScoreTerm, WhyOut
from aicluster.artifacts import CodeStore
from aicluster.core import JobSpec, JobState, parse_jobspec
from aicluster.core.choices import split_choices
from aicluster.runtime.joboutput import Refused
from aicluster.store import JobRecord, NotFound, Principal, Role

__all__ = ["router"]

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

_SPEC_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/JobSpec"}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}


def visible_job(request: Request, principal: Principal, job_id: str) -> JobRecord:
    """The job if the caller may see it; 404 otherwise (another tenant's job does not exist)."""
    job: JobRecord = request.app.state.plane.store.get_job(None, job_id)
    if principal.role_in(job.tenant) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job {job_id!r}")
    return job


def _tenant_for(principal: Principal, spec: JobSpec) -> str:
    if spec.tenant:
        return spec.tenant
    tenants = [t for t, role in principal.roles.items() if role.allows(Role.MEMBER)]
    if len(tenants) == 1:
        return tenants[0]
    raise HTTPException(422, detail="tenant: say which tenant the job is for")


@router.post("", status_code=201, openapi_extra=_SPEC_BODY)
async def submit_job(
    request: Request,
    principal: CurrentPrincipal,
    idempotency_key: Annotated[str | None, Header(max_length=128)] = None,
) -> JobOut:
    """Queue a job (JSON or YAML spec). Acknowledged only once stored; a retry with the same
    ``Idempotency-Key`` returns the original job. 429 (with ``Retry-After``) over the
    submissions allowed per token or per tenant, or when the tenant has as many jobs PENDING
    as the server allows."""
    limits: Limits = request.app.state.limits
    limits.submission_by_token(principal.token_id or principal.user)  # before reading the body
    body = await request.body()
    # Parsing and the store's blocking commit run in the thread pool: on the event loop they
    # serialized every request, and concurrent submits could not share a group commit.
    plane, code = request.app.state.plane, request.app.state.code
    feasibility = request.app.state.feasibility
    job, created = await run_in_threadpool(
        _submit, plane, code, feasibility, limits, principal, body, idempotency_key
    )
    outcome = None if created else "unchanged"  # a retry with the same Idempotency-Key
    audit_target(request, tenant=job.tenant, object=job.id, outcome=outcome)
    return job


def _submit(
    plane: Any,
    code: CodeStore,
    feasibility: Feasibility,
    limits: Limits,
    principal: Principal,
    body: bytes,
    idempotency_key: str | None,
) -> tuple[JobOut, bool]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(422, detail="the job spec must be UTF-8 text") from None
    spec = parse_jobspec(text, "request body")
    tenant = _tenant_for(principal, spec)
    require_role(principal, tenant, Role.MEMBER)
    spec = _shipped(code, tenant, spec)
    spec = _resolved_data(plane.store, tenant, spec)
    _check_parent(plane.store, tenant, spec)
    try:
        as_scheduled = spec.to_job("submitted", 0.0, tenant)
    except ValueError as error:  # e.g. GPUs that do not split into tensor-parallel groups
        raise HTTPException(422, detail=str(error)) from None
    never = feasibility.refusal(as_scheduled)
    if never is not None:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, detail=f"this cluster can never hold the job: {never}"
        )
    limits.submission_for_tenant(tenant)  # only once the caller may submit there
    limits.admit_pending(plane.store, tenant)
    job, created = plane.store.submit_job(tenant, spec, principal.user, idempotency_key)
    plane.wake()
    return JobOut.of(job), created


def _resolved_data(store: Any, tenant: str, spec: JobSpec) -> JobSpec:
    """The spec with each ``data:`` entry at a version of the tenant's (``latest`` resolved now,
    once); 400 naming the dataset when the tenant has no such version."""
    resolved: dict[str, int] = {}
    for name, version in spec.data_refs():
        try:
            resolved[name] = store.get_dataset_version(tenant, name, version).version
        except NotFound:
            which = f"{name}:{version or 'latest'}"
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                detail=f"data: tenant {tenant!r} has no dataset {which}; push it first "
                "(aicluster data push)",
            ) from None
    return spec.with_data(resolved) if resolved else spec


def _check_parent(store: Any, tenant: str, spec: JobSpec) -> None:
    """A ``model.parent`` must be a registered version of the tenant's (400 otherwise)."""
    parent = spec.model.parent if spec.model is not None else None
    if parent is None:
        return
    name, _, version = parent.partition(":")
    try:
        store.get_model_version(tenant, name, int(version))
    except NotFound:
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            detail=f"model.parent: tenant {tenant!r} has no model version {parent}",
        ) from None


def _shipped(code: CodeStore, tenant: str, spec: JobSpec) -> JobSpec:
    """The spec to store: its ``code`` must be the tenant's and hold its ``entrypoint`` (a 422
    otherwise: :mod:`aicluster.api.runnable`), and ``workdir`` (a path on the submitting machine)
    is dropped."""
    if spec.code is not None and not code.has(tenant, spec.code):
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST,
            detail=f"code: {spec.code} is not stored for tenant {tenant!r}; upload it first "
            f"(POST /v1/tenants/{tenant}/code, as aicluster submit does)",
        )
    check_runnable(code, tenant, spec)
    return spec if spec.workdir is None else spec.model_copy(update={"workdir": None})


def _states(given: list[str] | None) -> list[JobState] | None:
    """``?state=`` as states: repeated, comma lists, any case; a 422 names the allowed ones."""
    if not given:
        return None
    try:
        chosen = split_choices(given, [state.value for state in JobState], "state")
    except ValueError as error:
        raise HTTPException(422, detail=str(error)) from None
    return [JobState(value) for value in chosen] or None


@router.get("")
def list_jobs(
    request: Request,
    principal: CurrentPrincipal,
    tenant: TenantFilter = None,
    state: Annotated[
        list[Annotated[str, Query(max_length=200)]] | None,
        Query(
            max_length=20,
            description="only jobs in these states: repeated, or a comma list (FAILED,RUNNING)",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Cursor = None,
) -> Page:
    """Jobs newest first. Without ``tenant``: every tenant the caller can see."""
    states = _states(state)
    store = request.app.state.plane.store
    if tenant is not None:
        require_role(principal, tenant, Role.VIEWER)
        jobs, next_cursor = store.list_jobs(tenant, state=states, limit=limit, cursor=cursor)
    elif principal.cluster_admin:
        jobs, next_cursor = store.list_jobs(None, state=states, limit=limit, cursor=cursor)
    else:
        jobs, next_cursor = [], None
        for name in sorted(principal.roles):
            page, _ = store.list_jobs(name, state=states, limit=limit, cursor=cursor)
            jobs.extend(page)
        jobs = sorted(jobs, key=lambda job: job.id, reverse=True)[:limit]
        next_cursor = jobs[-1].id if len(jobs) == limit else None
    listed = [JobOut.of(job) for job in jobs]
    # A running job's stragglers: a note for `aicluster jobs` (one query for the whole page).
    running = [out.id for out in listed if out.state == JobState.RUNNING.value]
    flagged = store.straggler_events(running)
    for out in listed:
        if out.id in flagged:
            out.straggler = straggler_note(flagged[out.id])
    return Page(jobs=listed, next_cursor=next_cursor)


@router.get("/{job_id}")
def get_job(request: Request, principal: CurrentPrincipal, job_id: JobId) -> JobOut:
    out = JobOut.of(visible_job(request, principal, job_id))
    loop = request.app.state.plane.loop  # predictions live in the leader's loop
    predictions = None if loop is None else loop.intake.predictions
    if predictions is not None and job_id in predictions.predicted:
        out.predicted_duration = predictions.described(job_id)
    out.estimated_start = _estimated_start(request, out.state, job_id)
    return out


def _estimated_start(request: Request, state: str, job_id: str) -> float | None:
    """The latest forecast's start for a pending job (None for any other)."""
    if state != JobState.PENDING.value:
        return None
    estimated: float | None = request.app.state.plane.estimated_start(job_id)
    return estimated


@router.post("/{job_id}/cancel")
def cancel_job(request: Request, principal: CurrentPrincipal, job_id: JobId) -> JobOut:
    """Cancel: a pending job at once, a running one once its gang has stopped. Idempotent for
    a cancelled job; a 409 for one that succeeded or failed (nothing to cancel)."""
    job = visible_job(request, principal, job_id)
    require_role(principal, job.tenant, Role.MEMBER)
    if job.state in (JobState.SUCCEEDED, JobState.FAILED):
        raise HTTPException(409, detail=f"job {job_id} already {job.state}; nothing to cancel")
    audit_target(request, tenant=job.tenant)
    plane = request.app.state.plane
    cancelled = plane.store.cancel_job(job.tenant, job_id, principal.user)
    plane.wake()
    return JobOut.of(cancelled)


@router.get("/{job_id}/events")
def job_events(request: Request, principal: CurrentPrincipal, job_id: JobId) -> list[EventOut]:
    job = visible_job(request, principal, job_id)
    store = request.app.state.plane.store
    return [EventOut.of(event) for event in store.events(job_id, job.tenant)]


@router.get("/{job_id}/why")
def why(request: Request, principal: CurrentPrincipal, job_id: JobId) -> WhyOut:
    """Why the job waits (the scheduler's reason and its queue position) or where it runs."""
    job = visible_job(request, principal, job_id)
    position = request.app.state.plane.queue_position(job_id)
    if job.state is JobState.PENDING:
        reason = job.pending_reason or "waiting for the next scheduling cycle"
    elif job.state is JobState.FAILED:  # how it failed, not where it was placed
        reason = job.exit_message or job.state.value
    elif job.placement:
        reason = _admission_reason(request, job) or job.state.value
    else:
        reason = job.exit_message or job.state.value
    return WhyOut(
        job_id=job.id,
        state=job.state.value,
        position=position,
        code=job.pending_code if job.state is JobState.PENDING else None,
        reason=reason,
        estimated_start=_estimated_start(request, job.state.value, job.id),
        placement=dict(job.placement) if job.placement else None,
        score=[
            ScoreTerm(term=term, value=value, meaning=meaning)
            for term, value, meaning in explain_score((job.placement or {}).get("score", {}))
        ],
        straggler=straggler_note(request.app.state.plane.store.events(job.id, job.tenant)),
        data=_data_figures(request, job),
        failure=FailureOut.of(job.failure) if job.state is JobState.FAILED else None,
    )


def _data_figures(request: Request, job: JobRecord) -> dict[str, Any] | None:
    """What reading its datasets took the job's latest attempt, in all (None: it reads none)."""
    if not job.spec.data:
        return None
    total: dict[str, Any] = request.app.state.plane.data_stats(job)["total"]
    return total or None


def _admission_reason(request: Request, job: JobRecord) -> str | None:
    """The scheduler's reason for the latest placement (recorded with the STARTING transition)."""
    for event in reversed(request.app.state.plane.store.events(job.id, job.tenant)):
        if event.to_state == JobState.STARTING.value:
            return str(event.details.get("reason", "")) or None
    return None


@router.get("/{job_id}/logs")
def logs(
    request: Request,
    principal: CurrentPrincipal,
    job_id: JobId,
    rank: Annotated[int, Query(ge=0, le=100_000)] = 0,
    stream: Annotated[str, Query(pattern="^(stdout|stderr)$")] = "stdout",
    # Bounded: a file offset past 2**63 raised OverflowError in seek() (a 500).
    offset: Annotated[int, Query(ge=0, le=1 << 53)] = 0,
    attempt: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
) -> dict[str, Any]:
    """A chunk of one rank's output from ``offset``; poll with the returned ``next_offset``."""
    job = visible_job(request, principal, job_id)
    try:
        text, next_offset, used_attempt = request.app.state.plane.logs(
            job, rank, stream, offset, attempt
        )
    except Refused as error:  # a link or a FIFO where the log goes: never read through it
        raise HTTPException(409, f"the log cannot be read: {error.strerror}") from None
    return {"text": text, "next_offset": next_offset, "attempt": used_attempt, "state": job.state}


@router.get("/{job_id}/telemetry")
def telemetry(request: Request, principal: CurrentPrincipal, job_id: JobId) -> dict[str, Any]:
    """Per-rank step records (step, loss, step time, throughput) of the latest attempt."""
    job = visible_job(request, principal, job_id)
    return {"job_id": job_id, "ranks": request.app.state.plane.telemetry(job)}


@router.get("/{job_id}/data")
def job_data(request: Request, principal: CurrentPrincipal, job_id: JobId) -> dict[str, Any]:
    """What reading its datasets took the latest attempt: per rank, per node and in all, the
    shards the node cache served (``cache_hits``), the shards and bytes fetched from the data
    store, and the seconds the ranks waited for their data."""
    job = visible_job(request, principal, job_id)
    return {"job_id": job_id, **request.app.state.plane.data_stats(job)}


@router.get("/{job_id}/goodput")
def job_goodput(request: Request, principal: CurrentPrincipal, job_id: str) -> dict[str, float]:
    """Productive time, lost work, restart time and ETTR over the job's attempts so far."""
    job = visible_job(request, principal, job_id)
    result: dict[str, float] = request.app.state.plane.goodput(job)
    return result
