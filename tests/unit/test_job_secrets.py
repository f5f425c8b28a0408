"""Job secrets: parsed, redacted in every view of a spec, sealed with the state directory's key,
opened only for their own tenant and name, and handed to a warm-started rank without its warm
process ever holding them."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from aicluster.core import JobSpec, JobSpecError, jobspec_from_mapping, parse_jobspec
from aicluster.core.jobspec import REDACTED, SEALED_PREFIX
from aicluster.runtime.layout import GangSpec
from aicluster.runtime.sandbox.secretbox import KEY_FILE, SecretBox, SecretError
from aicluster.runtime.warm import starter as warm
from warmprocs import OWN, start_zygote

VALUE = "s3cr3t-" + secrets.token_hex(8)
SPEC = f"""\
name: trainer
tenant: team-a
entrypoint: train.py
env: {{MODE: fast}}
secrets:
  API_TOKEN: "{VALUE}"
  DB_PASSWORD: "p@ss: with spaces"
"""


def test_a_specs_secrets_are_redacted_in_every_view_and_kept_for_who_asks() -> None:
    spec = parse_jobspec(SPEC, "job.yaml")
    assert spec.secret_values() == {"API_TOKEN": VALUE, "DB_PASSWORD": "p@ss: with spaces"}
    views = [
        repr(spec),
        str(spec),
        json.dumps(spec.canonical_dict()),
        spec.canonical_json(),
        json.dumps(spec.model_dump(mode="json")),
        repr(spec.model_dump()),
        spec.model_dump_json(),
    ]
    for view in views:
        assert VALUE not in view and "with spaces" not in view, view
    assert spec.canonical_dict()["secrets"] == {"API_TOKEN": REDACTED, "DB_PASSWORD": REDACTED}
    assert json.loads(spec.canonical_json(reveal_secrets=True))["secrets"]["API_TOKEN"] == VALUE


def test_the_hash_counts_secrets_by_name_only() -> None:
    spec = parse_jobspec(SPEC)
    other = parse_jobspec(SPEC.replace(VALUE, "something else"))
    renamed = parse_jobspec(SPEC.replace("API_TOKEN", "API_KEY"))
    assert spec.spec_hash == other.spec_hash != renamed.spec_hash
    assert spec.spec_hash != parse_jobspec(SPEC.split("secrets:")[0]).spec_hash


def test_the_cli_round_trip_keeps_the_values() -> None:
    spec = parse_jobspec(SPEC)
    again = parse_jobspec(spec.canonical_json(reveal_secrets=True))
    assert again.secret_values() == spec.secret_values()


@pytest.mark.parametrize(
    ("secrets_yaml", "message"),
    [
        ("{A: 0123}", "A: write the value as a quoted string"),
        ("{A: true}", "A: write the value as a quoted string"),
        ("{A: null}", "A: write the value as a quoted string"),
        ("{A: [1, 2]}", "A: write the value as a quoted string"),
        ("{1A: x}", "'1A' is not a valid variable name"),
        ("{MODE: x}", "MODE: given in env too"),
        ("[A, B]", "should be a valid dictionary"),
        (f'{{A: "{"x" * 4097}"}}', "A: a secret is larger than 4096 bytes"),
        ('{A: "a\\0b"}', "cannot contain NUL"),  # YAML's escape of NUL
    ],
)
def test_bad_secrets_are_refused_without_echoing_a_value(secrets_yaml: str, message: str) -> None:
    text = SPEC.split("secrets:")[0] + f"secrets: {secrets_yaml}\n"
    with pytest.raises(JobSpecError) as caught:
        parse_jobspec(text, "job.yaml")
    assert message in str(caught.value)
    assert "0123" not in str(caught.value) and "xxxx" not in str(caught.value)


def test_secrets_are_bounded_in_count_and_size() -> None:
    many = {f"S{i}": "x" for i in range(65)}
    body = {"name": "a", "entrypoint": "t.py", "secrets": many}
    with pytest.raises(JobSpecError, match="at most 64 secrets"):
        parse_jobspec(json.dumps(body))
    big = {f"S{i}": "x" * 4096 for i in range(17)}
    with pytest.raises(JobSpecError, match="larger than 64 KiB in all"):
        parse_jobspec(json.dumps({**body, "secrets": big}))
    with pytest.raises(JobSpecError, match="lone surrogate"):
        jobspec_from_mapping({**body, "secrets": {"A": "a\udc80"}})
    with pytest.raises(ValidationError) as caught:  # pydantic's own text shows no input
        JobSpec.model_validate({**body, "secrets": {"A": VALUE * 1000}})
    assert VALUE not in str(caught.value)


def test_a_type_error_in_secrets_does_not_echo_the_value() -> None:
    body = {"name": "a", "entrypoint": "t.py", "secrets": {"A": VALUE}, "workers": "x"}
    with pytest.raises(JobSpecError) as caught:
        parse_jobspec(json.dumps(body))
    assert VALUE not in str(caught.value)


# -- sealing -------------------------------------------------------------------------------


def test_sealing_makes_a_0600_key_on_first_use_and_opens_for_its_own_tenant_and_name(
    tmp_path: Path,
) -> None:
    box = SecretBox(tmp_path)
    assert not (tmp_path / KEY_FILE).exists()
    sealed = box.seal("team-a", "API_TOKEN", VALUE)
    assert sealed.startswith(SEALED_PREFIX) and VALUE not in sealed
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    assert box.seal("team-a", "API_TOKEN", VALUE) != sealed  # a fresh IV every time
    # Another process (a rank's actor) with the same state directory opens it.
    assert SecretBox(tmp_path).open("team-a", "API_TOKEN", sealed) == VALUE
    with pytest.raises(SecretError, match="another job's variable or tenant"):
        SecretBox(tmp_path).open("team-b", "API_TOKEN", sealed)
    with pytest.raises(SecretError, match="another job's variable or tenant"):
        SecretBox(tmp_path).open("team-a", "OTHER", sealed)
    with pytest.raises(SecretError, match="does not open"):
        SecretBox(tmp_path / "elsewhere-with-its-own-key").seal("x", "Y", "z")
        SecretBox(tmp_path / "elsewhere-with-its-own-key").open("team-a", "API_TOKEN", sealed)
    with pytest.raises(SecretError, match="not sealed"):
        box.open("team-a", "API_TOKEN", VALUE)


def test_opening_never_makes_a_key_and_a_readable_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SecretError, match="no secrets key"):
        SecretBox(tmp_path).open("t", "A", SEALED_PREFIX + "gAAAA")
    assert not (tmp_path / KEY_FILE).exists()
    SecretBox(tmp_path).seal("t", "A", "v")
    os.chmod(tmp_path / KEY_FILE, 0o644)
    with pytest.raises(SecretError, match="may be read by others"):
        SecretBox(tmp_path).seal("t", "A", "v")


def test_processes_making_the_key_at_once_share_one(tmp_path: Path) -> None:
    sealed: list[str] = []
    threads = [
        threading.Thread(target=lambda: sealed.append(SecretBox(tmp_path).seal("t", "A", "v")))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(sealed) == 8
    assert {SecretBox(tmp_path).open("t", "A", token) for token in sealed} == {"v"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [KEY_FILE]  # no temporary left


def test_sealing_a_spec_keeps_names_and_hash_and_refuses_oversized_values(tmp_path: Path) -> None:
    spec = parse_jobspec(SPEC)
    sealed = SecretBox(tmp_path).seal_spec("team-a", spec)
    assert sealed.spec_hash == spec.spec_hash
    assert all(v.startswith(SEALED_PREFIX) for v in sealed.secret_values().values())
    # A sealed spec validates as stored (read back from the store's JSON).
    stored = JobSpec.model_validate(sealed.canonical_dict(reveal_secrets=True))
    assert SecretBox(tmp_path).open_all("team-a", stored.secret_values()) == spec.secret_values()
    # A plain value shaped like a sealed one is sealed all the same, and stays bounded.
    tricky = parse_jobspec(
        json.dumps(
            {"name": "a", "entrypoint": "t.py", "secrets": {"A": SEALED_PREFIX + "x" * 5000}}
        )
    )
    with pytest.raises(SecretError, match="larger than 4096 bytes"):
        SecretBox(tmp_path).seal_spec("team-a", tricky)


def test_a_gang_writes_secret_names_to_its_run_directory_and_hands_actors_sealed_values() -> None:
    from aicluster.core import DomainLevel, Placement, Slot

    placement = Placement(slots=(Slot("n0", 0),), level=DomainLevel.NODE, domain="n0")
    gang = GangSpec(
        job_id="j-1",
        entrypoint="t.py",
        placement=placement,
        secrets={"API_TOKEN": SEALED_PREFIX + "token"},
    )
    assert gang.to_dict()["secrets"] == ["API_TOKEN"]
    assert "token" not in json.dumps(gang.to_dict()) and "token" not in repr(gang)
    assert gang.launch_for({})["secrets"] == {"API_TOKEN": SEALED_PREFIX + "token"}


# -- the warm path ---------------------------------------------------------------------------


def _memory_holds(pid: int, needle: bytes) -> bool:
    """Whether ``needle`` is anywhere in the readable memory of process ``pid`` (root only)."""
    found = False
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            bounds, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            start, end = (int(x, 16) for x in bounds.split("-"))
            try:
                mem.seek(start)
                found = found or needle in mem.read(end - start)
            except (OSError, OverflowError, ValueError):
                continue
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="reads another process's memory (root)")
def test_a_warm_child_gets_its_secrets_and_the_warm_process_never_holds_them(
    tmp_path: Path,
) -> None:
    channel, process = start_zygote(tmp_path, "json")
    try:
        script = tmp_path / "job.py"
        script.write_text(
            "import hashlib, os\n"
            "value = os.environ['API_TOKEN']\n"
            "print('sha', hashlib.sha256(value.encode()).hexdigest(), os.environ['PUBLIC'])\n"
        )
        hidden = "hidden-" + secrets.token_hex(16)
        public = "public-" + secrets.token_hex(16)
        child = warm.spawn_warm(
            channel,
            OWN,
            [str(script)],
            {"PATH": os.environ["PATH"], "PUBLIC": public},
            str(tmp_path),
            tmp_path / "out.log",
            tmp_path / "err.log",
            private_env={"API_TOKEN": hidden},
        )
        assert child is not None and child.wait() == 0, (tmp_path / "err.log").read_text()
        digest = re.search(r"sha (\w+)", (tmp_path / "out.log").read_text())
        assert digest is not None
        assert digest.group(1) == hashlib.sha256(hidden.encode()).hexdigest()
        assert _memory_holds(process.pid, public.encode())  # the scan sees what it was sent
        assert not _memory_holds(process.pid, hidden.encode())
    finally:
        process.kill()
        process.wait()
