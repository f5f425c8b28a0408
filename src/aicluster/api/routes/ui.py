"""The web dashboard: its static page (public: code, no data) and the aggregated JSON it polls
(bearer token, like every other API route; scoped to the caller's tenants)."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi.responses import FileResponse, RedirectResponse
from pydantic import BaseModel, Field

from aicluster.api.auditlog import not_audited
from aicluster.api.auth import (
    ANONYMOUS_OPERATOR,
    CSRF_HEADER,
    SESSION_COOKIE,
    CurrentPrincipal,
    authenticate,
    csrf_sent,
    csrf_token,
)
from aicluster.api.clustermap import ClusterMapOut, cluster_map
from aicluster.api.jobview import Training, Transition, timeline, training
from aicluster.api.routes.jobs import visible_job, why
from aicluster.api.schemas import EventOut, JobOut, WhyOut
from aicluster.control.views.metrics import SERVING
from aicluster.core import JobState
from aicluster.core.numbers import ascii_int
from aicluster.store import DeploymentRecord, Principal

__all__ = ["pages", "router"]

router = APIRouter(prefix="/v1/ui", tags=["dashboard"])
pages = APIRouter(include_in_schema=False)

#: Event kinds the job page lists besides state changes.
OBSERVATIONS = ("job.straggler", "job.hung", "job.goodput")
#: Event kinds of the serving layer's rollouts (written by it; listed by the deployments view).
ROLLOUT_EVENTS = (
    "deployment.put",
    "deployment.traffic",
    "deployment.deleted",
    "rollout.started",
    "rollout.step",
    "rollout.promoted",
    "rollout.rolled_back",
    "rollout.aborted",
)
#: Files of a simulation report the dashboard may fetch (no HTML: it would run on our origin).
REPORT_FILES = {".png": "image/png", ".json": "application/json", ".csv": "text/csv"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


# -- the dashboard's session ------------------------------------------------------------------


class SessionIn(BaseModel):
    token: Annotated[str, Field(min_length=1, max_length=256)]


class SessionOut(BaseModel):
    user: str
    cluster_admin: bool
    roles: dict[str, str]
    #: Send as ``X-CSRF-Token`` with every request that changes state ("" without auth).
    csrf_token: str

    @classmethod
    def of(cls, principal: Principal, token: str | None) -> SessionOut:
        return cls(
            user=principal.user,
            cluster_admin=principal.cluster_admin,
            roles={tenant: role.value for tenant, role in principal.roles.items()},
            csrf_token=csrf_token(token) if token else "",
        )


@router.post("/session")
@not_audited("signing in stores nothing: the cookie holds the caller's own token")
def sign_in(request: Request, response: Response, body: SessionIn) -> SessionOut:
    """Sign the dashboard in with a token: it is kept in an ``HttpOnly``, ``SameSite=Strict``
    cookie (out of reach of page scripts, never sent by other sites' pages); requests that
    change state must carry the returned ``csrf_token`` in ``X-CSRF-Token``. 401 for a token
    that is not valid, 429 after too many (failed sign-ins count as failed authentications)."""
    if not request.app.state.plane.settings.auth:
        return SessionOut.of(ANONYMOUS_OPERATOR, None)
    principal = authenticate(request, body.token)
    response.set_cookie(
        SESSION_COOKIE,
        body.token,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return SessionOut.of(principal, body.token)


@router.get("/session")
def session(request: Request, principal: CurrentPrincipal) -> SessionOut:
    """Who the session (cookie or bearer token) is, and its CSRF token."""
    auth = request.app.state.plane.settings.auth
    token = request.cookies.get(SESSION_COOKIE) if auth else None
    if auth and request.headers.get("authorization") is not None:
        token = request.headers["authorization"].partition(" ")[2].strip()
    return SessionOut.of(principal, token)


@router.delete("/session", status_code=204)
@not_audited("signing out only drops the caller's own cookie")
def sign_out(request: Request) -> Response:
    """Forget the session cookie (its CSRF token is needed, as for every write)."""
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie and not csrf_sent(request, cookie):
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail=f"{CSRF_HEADER} is missing or wrong")
    response = Response(status_code=204)
    response.delete_cookie(
        SESSION_COOKIE, httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )
    return response


# -- the dashboard's views --------------------------------------------------------------------


@router.get("/cluster-map", response_model=ClusterMapOut)
def get_cluster_map(request: Request, principal: CurrentPrincipal) -> Response:
    """Pods → racks → nodes → GPUs with the job on each GPU. Jobs of tenants the caller cannot
    see are anonymous (index -1: busy, no id, name or tenant)."""
    store = request.app.state.plane.store
    counts = {"running": 0, "pending": 0}
    for count in store.job_counts():
        if count.state.holds_resources:
            counts["running"] += count.jobs
        elif count.state is JobState.PENDING:
            counts["pending"] += count.jobs
    power = request.app.state.plane.node_power()
    data = cluster_map(store.list_nodes(), store.placed_jobs(), principal, counts, power)
    # Serialized as built: re-validating thousands of nodes against the model costs more than
    # building them (the model documents the shape; a test validates answers against it).
    return Response(json.dumps(data, separators=(",", ":")), media_type="application/json")


class JobPageOut(BaseModel):
    job: JobOut
    why: WhyOut
    timeline: list[Transition]
    observations: list[EventOut]
    training: Training | None
    goodput: dict[str, float]


@router.get("/jobs/{job_id}")
def job_page(request: Request, principal: CurrentPrincipal, job_id: str) -> JobPageOut:
    """Everything the job page shows, in one call: the job, why it waits or where it runs,
    its state timeline, stragglers/hangs/goodput events, and its training telemetry."""
    job = visible_job(request, principal, job_id)
    plane = request.app.state.plane
    events = plane.store.events(job_id, job.tenant)
    ranks = plane.telemetry(job)
    return JobPageOut(
        job=JobOut.of(job),
        why=why(request, principal, job_id),
        timeline=timeline(events),
        observations=[EventOut.of(e) for e in events if e.kind in OBSERVATIONS],
        training=training(ranks, job.attempt) if ranks else None,
        goodput=plane.goodput(job),
    )


class DeploymentsOut(BaseModel):
    versions: list[dict[str, Any]]
    rollouts: list[EventOut]


@router.get("/deployments")
def deployments(request: Request, principal: CurrentPrincipal) -> DeploymentsOut:
    """Model versions being served (traffic split, requests, errors, latency) and the rollout
    history, of the caller's tenants."""
    plane = request.app.state.plane
    store = plane.store
    versions = [v for v in SERVING.versions() if principal.role_in(v["tenant"]) is not None]
    _add_replicas(versions, store.list_deployments(), getattr(plane, "serving", None))
    rollouts = [
        EventOut.of(event)
        for event in store.events_of_kind(ROLLOUT_EVENTS)
        if event.tenant is not None and principal.role_in(event.tenant) is not None
    ]
    return DeploymentsOut(versions=versions, rollouts=rollouts[-200:])


class ReportOut(BaseModel):
    name: str
    modified: float
    files: list[str]
    summary: dict[str, Any] | None


def _reports_dir(request: Request) -> Path:
    return Path(request.app.state.plane.settings.state_dir) / "reports"


@router.get("/reports")
def reports(request: Request, principal: CurrentPrincipal) -> list[ReportOut]:
    """Simulation reports under ``<state_dir>/reports/<name>/`` (``aicluster sim --out``),
    newest first. They hold simulated workloads only, so every signed-in user may read them."""
    root = _reports_dir(request)
    found = []
    for folder in root.iterdir() if root.is_dir() else []:
        if not folder.is_dir() or not _NAME.match(folder.name):
            continue
        files = sorted(f.name for f in folder.iterdir() if f.suffix in REPORT_FILES)
        summary_file = folder / "summary.json"
        try:
            summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
        except (OSError, ValueError):
            summary = None
        found.append(
            ReportOut(
                name=folder.name,
                modified=folder.stat().st_mtime,
                files=files,
                summary=summary if isinstance(summary, dict) else None,
            )
        )
    return sorted(found, key=lambda report: report.modified, reverse=True)


@router.get("/reports/{report}/{file}", response_class=Response)
def report_file(
    request: Request, principal: CurrentPrincipal, report: str, file: str
) -> FileResponse:
    """One file of a report (PNG plots, JSON and CSV results)."""
    if not (_NAME.match(report) and _NAME.match(file)) or Path(file).suffix not in REPORT_FILES:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no report file {file!r}")
    path = _reports_dir(request) / report / file
    if not path.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no report file {report}/{file}")
    return FileResponse(
        path,
        media_type=REPORT_FILES[path.suffix],
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
    )


# -- the page -------------------------------------------------------------------------------

ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "learning.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
#: The page runs only its own script and talks only to this server; nobody may frame it.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' blob: data:; connect-src 'self'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> bytes:
    return (resources.files("aicluster.api") / "dashboard" / name).read_bytes()


@pages.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui/")


@pages.get("/ui")
def ui_slash() -> RedirectResponse:
    return RedirectResponse("/ui/")


@pages.get("/ui/")
def index() -> Response:
    return Response(_asset("index.html"), media_type=ASSETS["index.html"], headers=SECURITY_HEADERS)


@pages.get("/ui/{asset}")
def asset(asset: str) -> Response:
    if asset not in ASSETS:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no file {asset!r}")
    return Response(_asset(asset), media_type=ASSETS[asset], headers=SECURITY_HEADERS)


def _add_replicas(
    versions: list[dict[str, Any]], records: list[DeploymentRecord], serving: Any
) -> None:
    """Each served version's desired replicas ("2", or "1-3" when autoscaling) and, where this
    server runs the serving layer, how many are healthy (None where it does not)."""
    desired: dict[tuple[str, str], str] = {}
    for record in records:
        low, high = record.replicas
        desired[(record.tenant, record.name)] = str(low) if low == high else f"{low}-{high}"
    for version in versions:
        key = (version["tenant"], version["model"])
        version["desired_replicas"] = desired.get(key)
        healthy = None
        number = ascii_int(str(version["version"]))
        if serving is not None and number is not None:
            healthy = serving.gateway.healthy_replicas(*key, number)
        version["healthy_replicas"] = healthy
