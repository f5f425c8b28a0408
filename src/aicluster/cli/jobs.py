"""Job commands: submit, jobs, logs, cancel, queue, why."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.filesize import decimal

from aicluster.artifacts.codeindex import find_path
from aicluster.artifacts.codetree import MAX_ARCHIVE_BYTES, CodeTreeError, PackedTree, pack_tree
from aicluster.cli.client import ApiError
from aicluster.cli.common import (
    Client,
    api_command,
    console,
    estimated,
    fail,
    readable,
    when,
)
from aicluster.cli.explain import failure_note, print_why
from aicluster.cli.joblogs import print_logs
from aicluster.cli.output import Column, Output, OutputOption, print_data, print_records
from aicluster.core import TERMINAL_STATES, JobSpec, JobState, jobspec_from_mapping, parse_jobspec
from aicluster.core.choices import split_choices

__all__ = ["member_tenant", "register", "ship_code"]


@api_command
def submit(
    client: Client,
    spec: Annotated[
        Path, typer.Argument(help="job spec (YAML or JSON)", exists=True, dir_okay=False)
    ],
    tenant: Annotated[str | None, typer.Option(help="override the spec's tenant")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="makes a retried submit safe")] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(help="folder to ship (default: the spec's workdir, else the spec's folder)"),
    ] = None,
    max_code_bytes: Annotated[
        int, typer.Option(min=1, help="refuse to ship a larger code archive (bytes)")
    ] = MAX_ARCHIVE_BYTES,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="print only the job's id (for scripts)")
    ] = False,
) -> None:
    """Ship the job's code and submit the job; prints the code's hash and the job's id."""
    with readable():
        parsed = parse_jobspec(spec.read_text(), str(spec))  # readable errors before any call
        if tenant is not None:
            parsed = _changed(parsed, str(spec), tenant=tenant)
        owner = parsed.tenant or member_tenant(client)
        # A spec with secrets is never shipped as code: the code store keeps files as they are.
        leave_out = bool(parsed.secrets)
        shipped, packed, uploaded = ship_code(
            client, spec, parsed, owner, workdir, max_code_bytes, leave_out_spec=leave_out
        )
        # The only place the CLI writes secrets' values: the request body, to the server.
        job = client.submit(shipped.canonical_json(reveal_secrets=True), idempotency_key)
    if quiet:
        typer.echo(job["id"])
        return
    if leave_out and _spec_in(_code_folder(spec, parsed, workdir), spec):
        console.print(f"{spec} holds secrets: not shipped with the code", highlight=False)
    how = "shipped" if uploaded else "already on the server:"
    size = f"{decimal(packed.size)}, {sum(not f.endswith('/') for f in packed.files)} files"
    console.print(f"code {how} [bold]{packed.sha256[:12]}[/] ({size})", highlight=False)
    console.print(f"submitted [bold]{job['id']}[/] ({job['name']}, tenant {job['tenant']})")


def ship_code(
    client: Client,
    source: Path,
    parsed: JobSpec,
    owner: str,
    workdir: Path | None = None,
    max_code_bytes: int = MAX_ARCHIVE_BYTES,
    *,
    leave_out_spec: bool = False,
) -> tuple[JobSpec, PackedTree, bool]:
    """Pack the job's code folder (``workdir``, the spec's ``workdir`` or ``source``'s folder),
    upload it unless the tenant has it, and return the spec naming it, the archive, and whether
    it was uploaded. ``leave_out_spec`` leaves the file ``source`` out of the archive."""
    folder = _code_folder(source, parsed, workdir)
    leave_out = _spec_in(folder, source) if leave_out_spec else ()
    with pack_tree(folder, max_bytes=max_code_bytes, leave_out=leave_out) as packed:
        _check_entrypoint(parsed, packed, folder)
        uploaded = not client.has_code(owner, packed.sha256)
        if uploaded:
            client.upload_code(owner, packed.path)
    shipped = _changed(parsed, str(source), tenant=owner, code=packed.sha256, workdir=None)
    return shipped, packed, uploaded


def _changed(spec: JobSpec, source: str, **changes: str | None) -> JobSpec:
    """``spec`` with ``changes`` (None: removed), validated again (a bad --tenant is caught)."""
    data = {**spec.canonical_dict(reveal_secrets=True), **changes}
    return jobspec_from_mapping({k: v for k, v in data.items() if v is not None}, source)


def _spec_in(folder: Path, spec: Path) -> tuple[str, ...]:
    """The spec file's path inside ``folder`` (to leave out of the shipped tree), if it is."""
    path, root = spec.resolve(), folder.resolve()
    return (path.relative_to(root).as_posix(),) if path.is_relative_to(root) else ()


def member_tenant(client: Client, viewer: bool = False) -> str:
    """The one tenant where the caller may submit (or, with ``viewer``, read), for a command
    that names none."""
    roles: dict[str, str] = client.get("/v1/whoami")["roles"]
    allowed = ("member", "admin", "viewer") if viewer else ("member", "admin")
    tenants = sorted(name for name, role in roles.items() if role in allowed)
    if len(tenants) != 1:
        raise ApiError("say which tenant: --tenant (or tenant: in a job spec)")
    return tenants[0]


def _code_folder(spec: Path, parsed: JobSpec, workdir: Path | None) -> Path:
    """``--workdir``, else the spec's ``workdir`` (relative to the spec's folder), else the
    spec's folder."""
    folder = workdir or spec.parent / (parsed.workdir or ".")
    if not folder.is_dir():
        raise CodeTreeError(f"{folder} is not a folder: give the job's code folder (--workdir)")
    return folder


def _check_entrypoint(spec: JobSpec, packed: PackedTree, folder: Path) -> None:
    """The server's check (:mod:`aicluster.api.runnable`) before anything is sent: the
    entrypoint must be a file of the packed tree, read as the server reads it."""
    if spec.entrypoint is None:  # module: may come from an installed package: not checked
        return
    with packed.open() as archive:
        found = find_path(archive, spec.entrypoint)
    refusal = found.refusal(spec.entrypoint, f"the code shipped from {folder}")
    if refusal is not None:
        raise CodeTreeError(
            f"{refusal} (is it missing, or excluded by .gitignore / .aiclusterignore?)"
        )


def _gpus(job: dict[str, Any]) -> str:
    spec = job["spec"]
    return str(spec.get("workers", 1) * spec.get("resources", {}).get("gpus", 0))


def _note(job: dict[str, Any]) -> str:
    """Why it waits, or how it ended (a failure in a few words: ``why`` says all of it), or
    which rank straggles while it runs."""
    if job.get("failure"):
        return failure_note(job["failure"])
    return str(
        (job["pending"] or {}).get("reason") or job["exit_message"] or job.get("straggler") or ""
    )


def _nodes(job: dict[str, Any]) -> str:
    return ", ".join(sorted({slot[0] for slot in (job["placement"] or {}).get("slots", [])}))


JOB_COLUMNS = (
    Column("id", lambda job: job["id"], whole=True),
    Column("name", lambda job: job["name"], whole=True),
    Column("tenant", lambda job: job["tenant"], whole=True),
    Column("state", lambda job: job["state"], whole=True),
    Column("kind", lambda job: job.get("kind", "batch"), whole=True, wide=True),
    Column("GPUs", _gpus, whole=True, priority=2, justify="right"),
    Column("submitted", lambda job: when(job["submitted_at"]), whole=True, priority=3),
    Column("reason / exit", _note, priority=1, floor=16),
    Column("priority", lambda job: str(job["priority"]), whole=True, wide=True, justify="right"),
    Column("by", lambda job: job["submitted_by"], whole=True, wide=True),
    Column("restarts", lambda job: str(job["restarts"]), whole=True, wide=True, justify="right"),
    Column("finished", lambda job: when(job["finished_at"]), whole=True, wide=True),
    Column("nodes", _nodes, wide=True),
)


@api_command
def jobs(
    client: Client,
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    state: Annotated[
        list[str] | None,
        typer.Option(help="only these states: FAILED,RUNNING or the flag repeated"),
    ] = None,
    limit: int = 50,
    output: OutputOption = Output.table,
) -> None:
    """List jobs, newest first."""
    try:
        states = split_choices(state or [], [s.value for s in JobState], "state") or None
    except ValueError as error:
        raise fail(f"--state: {error}", 2) from None
    with readable():
        page = client.get("/v1/jobs", tenant=tenant, state=states, limit=limit)
    print_records(output, JOB_COLUMNS, page["jobs"], data=page, empty="no jobs")


class LogStream(StrEnum):
    stdout = "stdout"
    stderr = "stderr"


@api_command
def logs(
    client: Client,
    job_id: str,
    rank: Annotated[int, typer.Option(help="which worker")] = 0,
    stream: Annotated[
        LogStream | None,
        typer.Option(help="only this stream (default: both, stdout's new lines first each read)"),
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing")] = False,
) -> None:
    """Print a worker's stdout and stderr, whole lines, each read's stdout first (no times are
    kept to order them by); ``-f`` waits for a job that has not started and follows it until it
    ends."""
    streams = [stream.value] if stream is not None else ["stdout", "stderr"]
    with readable():
        print_logs(client, job_id, rank, streams, follow)


@api_command
def cancel(
    client: Client,
    job_id: str,
) -> None:
    """Cancel a job (a running one stops its workers first). A job that has already ended
    says so, and the command exits 1."""
    with readable():
        before = client.get(f"/v1/jobs/{job_id}")
        if before["state"] in TERMINAL_STATES:
            raise fail(f"job {before['id']} already {before['state']}; nothing to cancel")
        job = client.post(f"/v1/jobs/{job_id}/cancel")
    stopping = job["cancel_requested"] and job["state"] not in TERMINAL_STATES
    console.print(f"{job['id']}: {job['state']}" + (" (stopping)" if stopping else ""))


QUEUE_COLUMNS = (
    Column("#", lambda entry: str(entry["position"]), whole=True, justify="right"),
    Column("job", lambda entry: entry["job_id"], whole=True),
    Column("tenant", lambda entry: entry["tenant"], whole=True),
    Column("GPUs", lambda entry: str(entry["gpus"]), whole=True, priority=2, justify="right"),
    Column(
        "waiting",
        lambda entry: f"{entry['waiting_seconds']:.0f}s",
        whole=True,
        priority=3,
        justify="right",
    ),
    Column(
        "est. start",
        lambda entry: estimated(entry.get("estimated_start")),
        whole=True,
        priority=2,
        justify="right",
    ),
    Column("why", lambda entry: entry["reason"], priority=1, floor=16),
    Column("name", lambda entry: entry["name"], whole=True, wide=True),
    Column("priority", lambda e: str(e["priority"]), whole=True, wide=True, justify="right"),
    Column("code", lambda entry: entry["code"] or "-", whole=True, wide=True),
)


@api_command
def queue(
    client: Client,
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    output: OutputOption = Output.table,
) -> None:
    """Pending jobs in scheduling order, with why each waits and when each is estimated to
    start (like squeue --start; "-": no estimate yet, or none within the forecast's horizon)."""
    with readable():
        entries = client.get("/v1/queue", tenant=tenant)
    print_records(output, QUEUE_COLUMNS, entries, empty="the queue is empty")


@api_command
def why(
    client: Client,
    job_id: str,
    output: OutputOption = Output.table,
) -> None:
    """Why a job waits (the scheduler's reason), where and why it was placed, or how it failed
    (its first failed rank and node, exit code or signal, and its stderr's last lines)."""
    with readable():
        answer = client.get(f"/v1/jobs/{job_id}/why")
    if print_data(output, answer):
        return
    print_why(answer)


def register(app: typer.Typer) -> None:
    for command in (submit, jobs, logs, cancel, queue, why):
        app.command()(command)
