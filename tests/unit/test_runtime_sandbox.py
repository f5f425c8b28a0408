"""The sandbox's pure parts: bubblewrap's command line, the job's environment, limits' figures.
(The sandbox itself is attacked end to end in tests/integration/test_sandbox.py.)"""

from __future__ import annotations

import os
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from aicluster.runtime.environment import job_environment
from aicluster.runtime.gang.command import signal_code
from aicluster.runtime.gang.worker import _memory_reason
from aicluster.runtime.sandbox import bwrap as sandbox
from aicluster.runtime.sandbox.bwrap import SandboxConfig, SandboxSpec, bwrap_argv
from aicluster.runtime.sandbox.cgroups import Limits
from aicluster.runtime.sandbox.seccomp import filter_program

STATE = "/srv/state"


def spec(**changes: object) -> SandboxSpec:
    fields: dict[str, object] = {
        "uid": 300_000,
        "gid": 300_000,
        "workdir": f"{STATE}/tenants/a/jobs/j/work/1-node-0",
        "writable": (f"{STATE}/tenants/a/jobs/j",),
        "hidden": (STATE,),
        "readonly": ("/usr", "/srv"),  # /srv holds the state directory: it must be hidden
    }
    fields.update(changes)
    return SandboxSpec(**fields)  # type: ignore[arg-type]


def test_a_sandbox_never_runs_as_root() -> None:
    with pytest.raises(ValueError, match="root"):
        spec(uid=0)
    with pytest.raises(ValueError, match="root"):
        spec(gid=0)


def test_the_state_directory_is_hidden_and_only_the_jobs_data_is_writable() -> None:
    argv = bwrap_argv(spec(), ["python", "-u", "train.py"], python="/py")
    pairs = list(pairwise(argv))
    assert ("--ro-bind", "/srv") in pairs and ("--tmpfs", STATE) in pairs
    assert argv.index("--tmpfs", argv.index("--ro-bind")) < argv.index("--bind")  # hide, then bind
    binds = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--bind"]
    assert binds == [f"{STATE}/tenants/a/jobs/j"]
    assert "--unshare-pid" in argv and "--die-with-parent" in argv
    # the job runs last, through the entry that drops to the tenant's uid and gid and installs
    # the seccomp filter
    assert argv[argv.index("--") + 1 :] == [
        "/py", "-I", "-S", argv[argv.index("--") + 4], "300000", "300000",
        filter_program().hex(), "python", "-u", "train.py",
    ]  # fmt: skip
    assert argv[argv.index("--") + 4].endswith("_sandbox_entry.py")


def test_a_hidden_directory_outside_what_is_shown_needs_no_mask() -> None:
    argv = bwrap_argv(spec(readonly=("/usr",)), ["python"], python="/py")
    assert ("--tmpfs", STATE) not in list(pairwise(argv))


def test_parents_of_mounts_are_traversable_by_the_tenant() -> None:
    argv = bwrap_argv(spec(), ["python"], python="/py")
    made = {
        argv[i + 3] for i, arg in enumerate(argv) if arg == "--perms" and argv[i + 2] == "--dir"
    }
    assert {"/srv", f"{STATE}/tenants/a/jobs"} <= made
    assert all(
        argv[i + 1] == "0755"
        for i, arg in enumerate(argv)
        if argv[i + 2 : i + 3] == ["--dir"] and arg == "--perms"
    )


def test_the_job_environment_is_an_allow_list() -> None:
    node = {
        "AICLUSTER_TOKEN": "aic_secret",
        "DATABASE_URL": "postgresql://x",
        "RAY_ADDRESS": "127.0.0.1:6379",
        "RAY_AUTH_TOKEN_PATH": "/srv/state/ray.token",
        "AWS_SECRET_ACCESS_KEY": "k",
        "CUDA_VISIBLE_DEVICES": "3",
        "PATH": "/evil",
    }
    env = job_environment({"RANK": "0", "AICLUSTER_TENANT": "a"}, "/work", node_env=node)
    assert env["RANK"] == "0" and env["HOME"] == "/work" and env["USER"] == "a"
    assert env["CUDA_VISIBLE_DEVICES"] == "3"  # Ray's choice of GPUs for the rank
    assert not {"AICLUSTER_TOKEN", "DATABASE_URL", "RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"} & set(env)
    assert "AWS_SECRET_ACCESS_KEY" not in env and env["PATH"] != "/evil"


def test_bwrap_reports_a_signal_as_128_plus_n() -> None:
    assert signal_code(137) == -9 and signal_code(143) == -15
    assert signal_code(0) == 0 and signal_code(3) == 3 and signal_code(255) == 255


def test_limits_of_a_worker() -> None:
    limits = Limits.for_worker(memory_gb=1.5, cpus=2)
    assert limits.memory_bytes == 3 << 29 and limits.cpus == 2 and limits.pids
    assert Limits.for_worker(memory_gb=0, cpus=0).memory_bytes is None


def test_a_memory_kill_names_the_worker_its_limit_and_its_peak() -> None:
    said = _memory_reason(4, 1, 2, "node-0", 4 << 30)
    assert said == "exceeded memory_gb=4 (worker 1 of 2 on node-0: peak 4.0 GB)"
    assert _memory_reason(0.5, 0, 1, "node-3", 1 << 29).endswith("node-3: peak 0.50 GB)")
    assert (
        _memory_reason(4, 0, 1, "node-0", None) == "exceeded memory_gb=4 (worker 0 of 1 on node-0)"
    )


def test_the_uid_range_is_checked() -> None:
    with pytest.raises(ValueError):
        SandboxConfig(uid_first=0, uid_last=10)
    with pytest.raises(ValueError):
        SandboxConfig(uid_first=400_000, uid_last=300_000)


def test_up_refuses_to_start_unsandboxed_unless_told(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from aicluster.cli.main import app
    from aicluster.runtime.sandbox import bwrap as sandbox

    monkeypatch.setattr(sandbox, "BWRAP", str(tmp_path / "no-bwrap-here"))
    assert "not installed" in (sandbox.probe() or "")
    result = CliRunner().invoke(app, ["up", "--home", str(tmp_path / "home")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "--insecure-no-sandbox" in result.output and "cannot sandbox" in result.output
    assert not (tmp_path / "home" / "ray.json").exists()  # nothing was started


def test_a_python_under_tmp_is_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every sandbox gets a private /tmp, so an interpreter installed there cannot run inside.
    monkeypatch.setattr(sandbox.sys, "prefix", "/tmp/clone/.venv")
    why = sandbox.probe()
    assert why is not None and "/tmp/clone/.venv" in why and "outside /tmp" in why


def test_nothing_of_the_import_path_but_the_interpreter_and_its_site_packages_is_mounted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray puts the driver's working directory on a worker's import path: a checkout, with what
    a demo left there. The sandbox shows the interpreter's prefixes, its site-packages and
    aicluster's own package, and nothing of the launcher's working directory or import path,
    not even a foreign directory named site-packages."""
    import sysconfig
    import tempfile

    import aicluster

    checkout = Path(__file__).resolve().parents[2]  # the launcher's working directory in tests
    with tempfile.TemporaryDirectory(dir="/var/tmp") as foreign:  # /tmp is never shown anyway
        planted = Path(foreign, "lib", "site-packages")
        planted.mkdir(parents=True)
        monkeypatch.chdir(checkout)
        monkeypatch.setattr(sys, "path", ["", str(checkout), str(checkout / "tests"), *sys.path])
        monkeypatch.syspath_prepend(str(planted))
        shown = sandbox.readonly_paths()
    package = os.path.dirname(os.path.realpath(aicluster.__file__))
    assert package in shown and os.path.realpath(sys.prefix) in shown
    purelib = os.path.realpath(sysconfig.get_paths()["purelib"])
    assert any(purelib == p or purelib.startswith(p + "/") for p in shown)
    inside = [p for p in shown if p == str(checkout) or p.startswith(f"{checkout}/")]
    venv = os.path.realpath(sys.prefix)
    # Of the checkout: its venv (the interpreter's prefix) and aicluster's package, if either
    # lies in it (an editable install), and nothing else.
    assert set(inside) <= {venv, package}, inside
    assert not any(p.startswith(foreign) for p in shown), shown
