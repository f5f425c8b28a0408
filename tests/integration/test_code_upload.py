"""Code shipping against a real server and store: upload, dedupe, caps, tenants kept apart, a
submit that names code, the CLI shipping a folder, and the model lineage that names the code."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from apiserver import RunningServer, serve
from liveplane import users
from typer.testing import CliRunner, Result

from aicluster.api import ServerSettings
from aicluster.artifacts import PackedTree, pack_tree
from aicluster.cli.main import app
from aicluster.control import ControlPlane
from aicluster.core import Tenant
from aicluster.store import Role, Store
from aicluster.store.base import WallClock

pytestmark = pytest.mark.integration

MiB = 1 << 20
UPLOAD_CAP = 3 * MiB  # over the 1 MiB body limit of the other routes
TENANT_CAP = 5 * MiB
GZIP = {"Content-Type": "application/gzip"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    state = tmp_path_factory.mktemp("state")
    settings = ServerSettings(
        state_dir=state, max_code_upload_bytes=UPLOAD_CAP, max_code_bytes_per_tenant=TENANT_CAP
    )
    store = Store.open(state, state_dir=state)
    plane = ControlPlane(settings=settings, store=store, clock=WallClock())
    for name in ("a", "b", "q"):
        store.create_tenant(Tenant(name, quota={"H100": 8}), "test")
    tokens = users(
        store,
        {
            "alice": ("a", Role.MEMBER),
            "bob": ("b", Role.MEMBER),
            "vera": ("a", Role.VIEWER),
            "quinn": ("q", Role.MEMBER),
        },
    )
    with serve(plane) as url:
        yield RunningServer(url, plane, tokens)
    store.close()


def _tree(root: Path, files: dict[str, bytes | str]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


@pytest.fixture
def packed(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[PackedTree]:
    """A tree of its own for each test (so a test's first upload is new)."""
    code = _tree(tmp_path / "code", {"train.py": f"# {request.node.name}\n", "pkg/u.py": ""})
    with pack_tree(code) as result:
        yield result


def _upload(client: httpx.Client, tenant: str, packed: PackedTree) -> httpx.Response:
    with packed.open() as body:
        return client.post(f"/v1/tenants/{tenant}/code", content=body.read(), headers=GZIP)


def _stored(server: RunningServer, tenant: str) -> list[str]:
    folder = server.plane.settings.state_dir / "artifacts" / "code" / tenant
    return sorted(p.name for p in folder.iterdir() if p.name != ".lock") if folder.is_dir() else []


def _spec(name: str, tenant: str, **fields: object) -> str:
    return json.dumps({"name": name, "tenant": tenant, "entrypoint": "train.py", **fields})


def test_upload_then_submit_keeps_the_hash_in_the_job(
    server: RunningServer, packed: PackedTree
) -> None:
    with server.client("alice") as alice:
        uploaded = _upload(alice, "a", packed)
        assert uploaded.status_code == 201, uploaded.text
        assert uploaded.json() == {"sha256": packed.sha256, "size": packed.size, "stored": True}
        assert alice.head(f"/v1/tenants/a/code/{packed.sha256}").status_code == 200
        info = alice.get(f"/v1/tenants/a/code/{packed.sha256}").json()
        assert info == {"sha256": packed.sha256, "size": packed.size}
        spec = _spec("shipped", "a", code=packed.sha256, workdir="src")
        submitted = alice.post("/v1/jobs", content=spec)
        assert submitted.status_code == 201, submitted.text
        assert submitted.json()["spec"]["code"] == packed.sha256
        assert "workdir" not in submitted.json()["spec"]  # a client path: not stored
    job = server.plane.store.get_job("a", submitted.json()["id"])
    assert job.spec.code == packed.sha256 and job.spec.workdir is None


def test_the_same_tree_twice_is_stored_once(server: RunningServer, tmp_path: Path) -> None:
    code = _tree(tmp_path / "twice", {"train.py": "print('twice')\n"})
    with pack_tree(code) as first, pack_tree(code) as second, server.client("alice") as alice:
        assert _upload(alice, "a", first).json()["stored"] is True
        again = _upload(alice, "a", second)
        assert again.status_code == 201 and again.json()["stored"] is False
    assert _stored(server, "a").count(f"{first.sha256}.tar.gz") == 1


def test_over_the_caps_is_413_and_stores_nothing(server: RunningServer, tmp_path: Path) -> None:
    big = os.urandom(UPLOAD_CAP + 1000)  # random: gzip cannot shrink it
    with server.client("quinn") as quinn:
        declared = quinn.post("/v1/tenants/q/code", content=big, headers=GZIP)
        assert declared.status_code == 413, declared.text
        assert str(UPLOAD_CAP) in declared.json()["error"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: the cap is met while streaming
            for start in range(0, len(big), 64 * 1024):
                yield big[start : start + 64 * 1024]

        streamed = quinn.post("/v1/tenants/q/code", content=chunks(), headers=GZIP)
        assert streamed.status_code == 413, streamed.text
        assert str(UPLOAD_CAP) in streamed.json()["error"]
        # Under the upload cap but over the 1 MiB of other routes: accepted, twice over...
        sizes = []
        for index in range(2):
            files = {"train.py": "", "weights.bin": os.urandom(2 * MiB + index)}
            with pack_tree(_tree(tmp_path / f"w{index}", files)) as packed:
                sizes.append(packed.size)
                assert _upload(quinn, "q", packed).status_code == 201
        # ...until the tenant's total would pass its cap.
        with pack_tree(_tree(tmp_path / "w3", {"w.bin": os.urandom(2 * MiB)})) as third:
            refused = _upload(quinn, "q", third)
        assert refused.status_code == 413 and str(TENANT_CAP) in refused.json()["error"]
        # Junk is not an archive: 400.
        junk = quinn.post("/v1/tenants/q/code", content=b"not a tar.gz", headers=GZIP)
        assert junk.status_code == 400 and "not a valid code archive" in junk.json()["error"]
    assert len(_stored(server, "q")) == 2  # no third archive, no temporary files


def test_other_routes_keep_the_1_mib_limit(server: RunningServer) -> None:
    with server.client("alice") as alice:
        assert alice.post("/v1/jobs", content=b"x" * (2 * MiB)).status_code == 413
        chunked = alice.post("/v1/jobs", content=iter([b"x" * MiB, b"x" * MiB]))
        assert chunked.status_code == 413
        assert alice.post("/v1/tenants/a/code/", content=b"x" * (2 * MiB)).status_code == 413


def test_tenants_see_and_use_only_their_own_code(server: RunningServer, packed: PackedTree) -> None:
    with server.client("alice") as alice:
        assert _upload(alice, "a", packed).status_code == 201
    path = f"/v1/tenants/a/code/{packed.sha256}"
    with server.client("bob") as bob:
        assert bob.head(path).status_code == 404
        assert bob.get(path).status_code == 404
        assert bob.head(f"/v1/tenants/b/code/{packed.sha256}").status_code == 404
        assert _upload(bob, "a", packed).status_code == 404
        used = bob.post("/v1/jobs", content=_spec("steal", "b", code=packed.sha256))
        assert used.status_code == 400 and "not stored for tenant 'b'" in used.json()["error"]
    with server.client("vera") as vera:  # a viewer reads, but does not upload
        assert vera.head(path).status_code == 200
        assert _upload(vera, "a", packed).status_code == 403
    with server.client("admin") as admin:  # a tenant that does not exist stores nothing
        assert _upload(admin, "nope", packed).status_code == 404
    assert not (server.plane.settings.state_dir / "artifacts" / "code" / "nope").exists()


def test_a_submit_naming_unknown_code_is_400(server: RunningServer) -> None:
    with server.client("alice") as alice:
        unknown = alice.post("/v1/jobs", content=_spec("ghost", "a", code="0" * 64))
        assert unknown.status_code == 400
        assert "is not stored for tenant 'a'" in unknown.json()["error"]
        malformed = alice.post("/v1/jobs", content=_spec("bad", "a", code="xyz"))
        assert malformed.status_code == 422
        assert alice.head("/v1/tenants/a/code/XYZ").status_code == 422


@pytest.mark.parametrize("entrypoint", ["-c", "--version", "/etc/passwd", "../train.py"])
def test_an_entrypoint_outside_the_code_is_refused_at_submit(
    server: RunningServer, packed: PackedTree, entrypoint: str
) -> None:
    spec = {"name": "escape", "tenant": "a", "entrypoint": entrypoint, "code": packed.sha256}
    with server.client("alice") as alice:
        before = alice.get("/v1/jobs").json()["jobs"]
        refused = alice.post("/v1/jobs", json=spec)
        assert refused.status_code == 400, refused.text
        assert "entrypoint" in refused.json()["error"]
        assert alice.get("/v1/jobs").json()["jobs"] == before  # nothing stored


def _refused_at_submit(client: httpx.Client, spec: dict[str, object], *words: str) -> None:
    """A 422 whose error holds ``words``, and no job stored."""
    before = client.get("/v1/jobs").json()["jobs"]
    refused = client.post("/v1/jobs", json=spec)
    assert refused.status_code == 422, refused.text
    for word in words:
        assert word in refused.json()["error"], refused.json()["error"]
    assert client.get("/v1/jobs").json()["jobs"] == before


def test_an_entrypoint_without_code_is_refused_at_submit(server: RunningServer) -> None:
    spec = {"name": "codeless", "tenant": "a", "entrypoint": "train.py"}
    with server.client("alice") as alice:
        _refused_at_submit(
            alice,
            spec,
            "entrypoint: train.py is a file of the job's code, and this spec ships no code",
            "aicluster submit FILE",
            "POST /v1/tenants/a/code",
            "module:",
        )
        as_yaml = alice.post("/v1/jobs", content="name: codeless\ntenant: a\nentrypoint: t.py\n")
        assert as_yaml.status_code == 422 and "ships no code" in as_yaml.json()["error"]
        # module: may name an installed module: accepted without code.
        module = alice.post("/v1/jobs", json={"name": "installed", "tenant": "a", "module": "json"})
        assert module.status_code == 201, module.text


@pytest.mark.parametrize(
    ("entrypoint", "words"),
    [
        ("main.py", "entrypoint: main.py is not in the shipped code (sha256 {short})"),
        ("pkg", "entrypoint: pkg is a folder of the shipped code (sha256 {short}), not a file"),
        ("pkg/", "entrypoint: pkg/ is a folder of the shipped code"),
        ("train.py/", "entrypoint: train.py/ is not in the shipped code"),  # not a folder
        ("pkg/u.py/x.py", "is not in the shipped code"),  # a file holds no name
    ],
)
def test_an_entrypoint_that_is_no_file_of_the_code_is_refused_at_submit(
    server: RunningServer, packed: PackedTree, entrypoint: str, words: str
) -> None:
    spec = {"name": "misnamed", "tenant": "a", "entrypoint": entrypoint, "code": packed.sha256}
    with server.client("alice") as alice:
        assert _upload(alice, "a", packed).status_code == 201
        listing = "it holds 2 files: pkg/u.py, train.py"
        _refused_at_submit(alice, spec, words.format(short=packed.sha256[:12]), listing)


@pytest.mark.parametrize("entrypoint", ["./train.py", "pkg//u.py", "link.py"])
def test_an_entrypoint_is_found_as_the_unpacked_tree_would_find_it(
    server: RunningServer, tmp_path: Path, entrypoint: str
) -> None:
    code = _tree(tmp_path / "code", {"train.py": "", "pkg/u.py": ""})
    (code / "link.py").symlink_to("pkg/u.py")  # kept as a link by aicluster submit
    spec = {"name": "found", "tenant": "a", "entrypoint": entrypoint}
    with pack_tree(code) as packed, server.client("alice") as alice:
        assert _upload(alice, "a", packed).status_code == 201
        submitted = alice.post("/v1/jobs", json={**spec, "code": packed.sha256})
        assert submitted.status_code == 201, submitted.text


def test_a_pipelines_job_is_refused_as_a_submit_is(server: RunningServer) -> None:
    body = {"name": "retrain", "deployment": "m", "job": {"name": "j", "entrypoint": "train.py"}}
    with server.client("alice") as alice:
        refused = alice.post("/v1/tenants/a/pipelines", json=body)
        assert refused.status_code == 422, refused.text
        assert "entrypoint: train.py is a file of the job's code" in refused.json()["error"]


def test_model_lineage_names_the_jobs_code(server: RunningServer, packed: PackedTree) -> None:
    store = server.plane.store
    with server.client("alice") as alice:
        _upload(alice, "a", packed)
        job = alice.post("/v1/jobs", content=_spec("lineage", "a", code=packed.sha256)).json()
    source = server.plane.settings.state_dir / "stub-export"
    source.mkdir()
    (source / "model.json").write_text('{"format": 1, "entrypoint": "m.py:load"}')
    store.register_model_version(
        "a", "lineage", source_dir=source, job_id=job["id"], spec_hash=None,
        code_version="c" * 64, dataset_hash=None, metrics={}, registered_by="alice",
    )  # fmt: skip
    with server.client("alice") as alice:
        version = alice.get("/v1/models/lineage/versions/1").json()
        assert version["job_code"] == packed.sha256 and version["code_version"] == "c" * 64
    shown = _cli(server, "alice", "model", "show", "lineage:1")
    assert shown.exit_code == 0, shown.output
    assert re.search(rf"job code\s+{packed.sha256}", shown.output)


# -- the CLI ------------------------------------------------------------------------------


def _cli(server: RunningServer, who: str, *args: str) -> Result:
    result = CliRunner().invoke(app, [*args, "--url", server.url, "--token", server.tokens[who]])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def _refused(result: Result, *phrases: str) -> None:
    assert result.exit_code != 0, result.output
    text = " ".join(result.output.split())  # Rich wraps long lines
    assert text.startswith("error:"), text
    for phrase in phrases:
        assert phrase in text, text


def test_cli_submit_ships_the_specs_folder(server: RunningServer, tmp_path: Path) -> None:
    folder = _tree(
        tmp_path / "project",
        {
            "job.yaml": "name: cli-shipped\nentrypoint: train.py\n",  # tenant: alice's only
            "train.py": "print('hi')\n",
            "model/net.py": "",
            ".gitignore": "*.ckpt\n",
            "old.ckpt": b"\0" * 100,
        },
    )
    first = _cli(server, "alice", "submit", str(folder / "job.yaml"))
    assert first.exit_code == 0, first.output
    with pack_tree(folder) as packed:
        assert "old.ckpt" not in packed.files
    assert f"code shipped {packed.sha256[:12]}" in first.output
    job_id = re.search(r"submitted (\S+)", first.output).group(1)  # type: ignore[union-attr]
    assert server.plane.store.get_job("a", job_id).spec.code == packed.sha256
    again = _cli(server, "alice", "submit", str(folder / "job.yaml"))
    assert f"code already on the server: {packed.sha256[:12]}" in again.output


def test_cli_submit_ships_the_workdir(server: RunningServer, tmp_path: Path) -> None:
    _tree(tmp_path / "src", {"main.py": "print('main')\n"})
    spec = tmp_path / "jobs" / "job.yaml"
    spec.parent.mkdir()
    spec.write_text("name: from-workdir\ntenant: a\nentrypoint: main.py\nworkdir: ../src\n")
    shipped = _cli(server, "alice", "submit", str(spec))
    assert shipped.exit_code == 0, shipped.output
    job_id = re.search(r"submitted (\S+)", shipped.output).group(1)  # type: ignore[union-attr]
    job = server.plane.store.get_job("a", job_id)
    with pack_tree(tmp_path / "src") as packed:
        assert job.spec.code == packed.sha256 and job.spec.workdir is None
    spec.write_text("name: from-option\ntenant: a\nentrypoint: main.py\n")
    option = _cli(server, "alice", "submit", str(spec), "--workdir", str(tmp_path / "src"))
    assert option.exit_code == 0, option.output


def test_cli_submit_errors_are_readable(server: RunningServer, tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("private")
    project = _tree(
        tmp_path / "project", {"job.yaml": "name: j\ntenant: a\nentrypoint: train.py\n"}
    )
    spec = str(project / "job.yaml")
    _refused(
        _cli(server, "alice", "submit", spec),
        "entrypoint: train.py is not in the code shipped from",
        "it holds 1 file: job.yaml",
    )
    (project / "train.py").write_text("")
    (project / "data.txt").symlink_to(tmp_path / "secret.txt")
    _refused(_cli(server, "alice", "submit", spec), "symlink", "outside")
    (project / "data.txt").unlink()
    (project / "weights.bin").write_bytes(os.urandom(UPLOAD_CAP + 1000))
    _refused(_cli(server, "alice", "submit", spec), "upload cap", str(UPLOAD_CAP), "HTTP 413")
    _refused(_cli(server, "alice", "submit", spec, "--max-code-bytes", "100000"), "cap of 100000")
    jobs = server.plane.store.list_jobs("a")[0]
    assert not [job for job in jobs if job.name == "j"]
