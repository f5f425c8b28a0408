"""Datasets read by jobs through the nodes' caches, end to end: a real server process on the
embedded Ray cluster (conftest's ``ray_cluster``), tenants' ranks in their sandboxes, datasets
pushed with the CLI into the data store: the local filesystem, and S3 (a SeaweedFS server, started
here: see s3server.py; the isolation case runs on the local store only).

- A 2-node job (two ranks per node, CPU only) reads a dataset through ``train.dataset``: each
  node fetches each shard once (the job's data figures, from the nodes' records), however many
  of its ranks read it; a second job on the same nodes fetches nothing.
- The jobs' shipped code is kept in the same data store (on S3: nothing on the server's disk).
- A shard corrupted in the store is caught by its SHA-256: the job fails, at once, with a
  reason naming the shard and the dataset.
- Another tenant's job neither names the dataset (400 at submit) nor reads its directory.
- Locality, live (the server runs ``examples/config/data-locality.yaml``): after a 1-node job
  read a dataset on one node, a second 1-node job reading it is placed on that node rather than
  on the otherwise equal node the plain search finds first; its score shows data_cached_bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from s3server import backend_settings
from serverproc import (
    REPO,
    SANDBOX_REQUIRED,
    ServerProcess,
    jobs_code,
    servers_cleanup,
    write_tenants,
)

from aicluster.artifacts.shards import plan_folder
from aicluster.artifacts.storage import CONFIG_FILE, StorageSettings
from aicluster.core import names
from aicluster.runtime import RunDir

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600), SANDBOX_REQUIRED]

KiB = 1 << 10
#: Two small files grouped in a shard, one file a shard of its own, one split over two shards.
FILES = {
    "a.txt": b"alpha\n" * 10,
    "b/c.txt": b"gamma\n" * 20,
    "big.bin": bytes(range(256)) * (600 * KiB // 256),
    "huge.bin": bytes(reversed(range(256))) * (1536 * KiB // 256),
}


@pytest.fixture(scope="module", params=["local", "s3"])
def backend(request: pytest.FixtureRequest) -> Iterator[StorageSettings | None]:
    """The data store's settings: None for the local filesystem, else a started S3 server's."""
    with backend_settings(request.param) as settings:
        yield settings


@pytest.fixture(scope="module")
def server(
    ray_cluster: Any, backend: StorageSettings | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    work = tmp_path_factory.mktemp("data-cache")
    tenants = {"a": {"quota": {"sim-gpu": 16}}, "b": {"quota": {"sim-gpu": 8}}}
    state = work / "state"
    state.mkdir()
    if backend is not None:  # the server and the nodes read it from the state directory
        (state / CONFIG_FILE).write_text(json.dumps(vars(backend)))
    server = ServerProcess(
        "data",
        state,
        work,
        ray_address=ray_cluster.address,
        tenants=write_tenants(work / "tenants.json", tenants),
        sandbox=True,
        extra_args=("--config", str(REPO / "examples" / "config" / "data-locality.yaml")),
    )
    with servers_cleanup(server):
        server.start()
        server.wait_for(server.is_leader, 120, "the server to lead")
        yield server


@pytest.fixture(scope="module")
def alice(server: ServerProcess) -> str:
    return server.create_member("alice", "a")


def _folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    return root


def _digest(files: dict[str, bytes]) -> str:
    lines = sorted(f"{path}\0{hashlib.sha256(data).hexdigest()}\n" for path, data in files.items())
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _spec(name: str, tenant: str, dataset: str, digest: str, *extra: str) -> str:
    return json.dumps(
        {
            "name": name,
            "tenant": tenant,
            "entrypoint": "read_dataset.py",
            "code": jobs_code(),
            "args": ["--name", dataset.split(":")[0], "--digest", digest, *extra],
            "workers": 4,
            "resources": {"gpus": 0, "cpus": 3.5, "memory_gb": 0.25},
            "max_restarts": 2,
            "data": [dataset],
        }
    )


def _submit(server: ServerProcess, token: str, spec: str) -> str:
    with server.client(token) as client:
        response = client.post("/v1/jobs", content=spec)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _finished(server: ServerProcess, job_id: str) -> dict[str, Any]:
    server.wait_for(
        lambda: server.job(job_id)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"),
        240,
        f"job {job_id} to finish",
    )
    return server.job(job_id)


def _data(server: ServerProcess, token: str, job_id: str) -> dict[str, Any]:
    with server.client(token) as client:
        return dict(client.get(f"/v1/jobs/{job_id}/data").json())


def _push(server: ServerProcess, token: str, folder: Path, name: str) -> None:
    out = server.cli(token, "data", "push", str(folder), "--name", name, "--shard-mb", "1")
    assert f"pushed {name}:1" in out, out


def test_each_node_fetches_each_shard_once_and_then_nothing(
    server: ServerProcess, backend: StorageSettings | None, alice: str, tmp_path: Path
) -> None:
    folder = _folder(tmp_path / "corpus", FILES)
    _push(server, alice, folder, "corpus")
    plan = plan_folder(folder, 1 << 20)
    shards, shard_bytes = len(plan.shards), sum(s["size"] for s in plan.shards)
    assert shards == 4
    first = _submit(server, alice, _spec("first", "a", "corpus:latest", _digest(FILES)))
    done = _finished(server, first)
    assert done["state"] == "SUCCEEDED", done
    assert done["spec"]["data"] == ["corpus:1"]
    seen = _data(server, alice, first)
    assert len(seen["ranks"]) == 4 and len(seen["nodes"]) == 2, seen
    for node, figures in seen["nodes"].items():  # two ranks there, one fetch per shard
        assert figures["shards_fetched"] == shards, (node, seen)
        assert figures["bytes_fetched"] == shard_bytes, (node, seen)
    second = _submit(server, alice, _spec("second", "a", "corpus:1", _digest(FILES)))
    assert _finished(server, second)["state"] == "SUCCEEDED"
    again = _data(server, alice, second)
    assert sorted(again["nodes"]) == sorted(seen["nodes"]), "not the same nodes"
    assert again["total"]["shards_fetched"] == 0 and again["total"]["bytes_fetched"] == 0
    assert again["total"]["cache_hits"] >= shards * 2, again
    why = server.cli(alice, "why", first)
    assert f"{2 * shards} fetched" in why and "from the nodes' caches" in why, why
    shown = server.cli(alice, "data", "show", "corpus:1")
    assert first in shown and second in shown
    with server.client(alice) as client:  # both attempts' figures, summed for the tenant
        families = text_string_to_metric_families(client.get("/metrics").text)
    sums = {s.name: s.value for f in families for s in f.samples if s.labels == {"tenant": "a"}}
    assert sums["aicluster_data_shards_fetched_total"] == 2 * shards
    assert sums["aicluster_data_bytes_fetched_total"] == 2 * shard_bytes
    # The jobs' shipped code came from the same store: on S3, none of it on the server's disk.
    assert (server.state_dir / "artifacts" / "code").is_dir() == (backend is None)


def _corrupt(server: ServerProcess, backend: StorageSettings | None, key: str) -> None:
    """Change the stored bytes of ``key`` behind the data store's back."""
    storage = (backend or StorageSettings()).open(server.state_dir)
    data = b"".join(storage.open(key))
    storage.put(key, io.BytesIO(b"tampered" + data[8:]))


def test_a_corrupt_shard_fails_the_job_naming_shard_and_dataset(
    server: ServerProcess, backend: StorageSettings | None, alice: str, tmp_path: Path
) -> None:
    files = {"x.bin": b"fragile\n" * 100}
    folder = _folder(tmp_path / "fragile", files)
    _push(server, alice, folder, "fragile")
    sha = plan_folder(folder, 1 << 20).shards[0]["sha256"]
    _corrupt(server, backend, f"{names.part('a')}/shards/{sha}")
    job_id = _submit(server, alice, _spec("fragile", "a", "fragile:1", _digest(files)))
    done = _finished(server, job_id)
    assert done["state"] == "FAILED", done
    message = done["exit_message"] or ""
    assert f"shard {sha} of dataset fragile:1 does not match its SHA-256" in message, done
    assert done["restarts"] == 0, "corrupt data is not retried"


@pytest.mark.parametrize("backend", ["local"], indirect=True)  # the same on every data store
def test_another_tenant_neither_names_nor_reads_the_dataset(
    server: ServerProcess, backend: StorageSettings | None, alice: str
) -> None:
    bob = server.create_member("bob", "b")
    with server.client(bob) as client:
        refused = client.post("/v1/jobs", content=_spec("steal", "b", "corpus:1", "0" * 64))
    assert refused.status_code == 400 and "corpus:1" in refused.json()["error"]
    first = next(r for r in _runs(server, alice) if r["name"] == "first")
    view = next(iter(_data(server, alice, first["id"])["ranks"].values()))["datasets"]["corpus"]
    own = {"mine.txt": b"bob's own\n"}
    bob_folder = _folder(server.state_dir.parent / "bob-data", own)
    _push(server, bob, bob_folder, "mine")
    probe = json.loads(_spec("probe", "b", "mine:1", _digest(own), "--probe", f"{view}/a.txt"))
    # The variables that name a job's datasets are the runtime's: a spec's own are dropped (had
    # they reached the ranks, "mine" would be missing or a's manifest looked up among b's).
    a_corpus = json.loads(_data_inputs(server, first["id"]))
    probe["env"] = {"AICLUSTER_DATA_INPUTS": json.dumps(a_corpus)}
    probe["env"]["AICLUSTER_DATASETS"] = json.dumps({"mine": view, "corpus": view})
    done = _finished(server, _submit(server, bob, json.dumps(probe)))
    assert done["state"] == "SUCCEEDED", done  # exit 3 had it read tenant a's file


def _data_inputs(server: ServerProcess, job_id: str) -> str:
    """What the runtime handed a job's ranks to prepare (their gang's recorded environment)."""
    run = RunDir(server.state_dir, job_id, 1)
    return str(json.loads(run.spec_file.read_text())["env"]["AICLUSTER_DATA_INPUTS"])


def _runs(server: ServerProcess, token: str) -> list[dict[str, Any]]:
    with server.client(token) as client:
        return list(client.get("/v1/jobs").json()["jobs"])


def _on_gpus(spec: str, gpus: int, *args: str) -> str:
    """``spec`` as one rank with ``gpus`` simulated GPUs (the search's best fit is by GPUs)."""
    data = json.loads(spec)
    data["workers"] = 1
    data["resources"] = {"gpus": gpus, "cpus": 1, "memory_gb": 0.25, "gpu_type": "sim-gpu"}
    if args:
        data.update(entrypoint="sleeps.py", args=list(args), data=[])
    return json.dumps(data)


def _node(server: ServerProcess, job_id: str) -> str:
    server.wait_for(lambda: server.job(job_id)["placement"] is not None, 120, "a placement")
    slots = server.job(job_id)["placement"]["slots"]
    assert len({slot[0] for slot in slots}) == 1, slots
    return str(slots[0][0])


@pytest.mark.parametrize("backend", ["local"], indirect=True)  # placement: the same on any store
def test_a_job_is_placed_where_its_data_is_cached(
    server: ServerProcess, backend: StorageSettings | None, alice: str, tmp_path: Path
) -> None:
    files = {"near.bin": bytes(range(256)) * 1024}
    folder = _folder(tmp_path / "near", files)
    _push(server, alice, folder, "near")
    size = sum(shard["size"] for shard in plan_folder(folder, 1 << 20).shards)
    reader = _spec("near", "a", "near:1", _digest(files))
    # A whole node held first: the reader goes to another node, so its cache is not on the node
    # the plain search finds first once every node is free again (that one is the holder's, or
    # one moved to the end of the free-node order by neither job).
    holder = _submit(server, alice, _on_gpus(reader, 8, "600"))
    held = _node(server, holder)
    first = _submit(server, alice, _on_gpus(reader, 1))
    assert _finished(server, first)["state"] == "SUCCEEDED"
    cached = _node(server, first)
    assert cached != held
    with server.client(alice) as client:
        assert client.post(f"/v1/jobs/{holder}/cancel").status_code == 200
    assert _finished(server, holder)["state"] == "CANCELLED"
    second = _submit(server, alice, _on_gpus(reader, 1))
    assert _node(server, second) == cached, "not placed where its data is cached"
    with server.client(alice) as client:
        why = client.get(f"/v1/jobs/{second}/why").json()
    score = {term["term"]: term["value"] for term in why["score"]}
    assert score["data_cached_bytes"] == size, why
    assert score["free_left_on_nodes"] == 7, why  # the same best fit as every other free node
    assert _finished(server, second)["state"] == "SUCCEEDED"
