"""JobSpec: parsing YAML and JSON, readable errors with lines, canonical form and hash."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aicluster.core import (
    DomainLevel,
    JobSpec,
    JobSpecError,
    Parallelism,
    jobspec_from_mapping,
    parse_jobspec,
    priority_of,
)

FULL = """\
name: tiny-gpt
tenant: team-a
entrypoint: examples/jobs/tiny_gpt.py
args: ["--steps", "200"]
workers: 4
resources: {gpus: 1, cpus: 1, memory_gb: 2, gpu_type: any}
parallelism: {data: 4, tensor: 1, pipeline: 1}
priority: normal          # low|normal|high|critical or an integer
checkpoint_interval: 60   # seconds, optional
max_restarts: 3
max_domain: rack
duration_estimate: 600    # optional seconds
min_workers: 2            # optional (elastic, later issue)
env: {KEY: value, THREADS: 4}
"""


def test_full_yaml_spec_parses_and_becomes_a_job() -> None:
    spec = parse_jobspec(FULL, "job.yaml")
    assert spec.env == {"KEY": "value", "THREADS": "4"}
    job = spec.to_job("j-1", 12.5)
    assert (job.id, job.tenant, job.workers, job.gpus_per_worker) == ("j-1", "team-a", 4, 1)
    assert job.submit_time == 12.5
    assert job.priority == priority_of("normal")
    assert job.parallelism == Parallelism(data=4)
    assert job.max_domain is DomainLevel.RACK
    assert (job.checkpoint_interval, job.duration_estimate) == (60.0, 600.0)


def test_minimal_spec_takes_defaults() -> None:
    spec = parse_jobspec("name: a\nentrypoint: train.py\n")
    assert (spec.workers, spec.resources.gpus, spec.max_restarts, spec.tenant) == (1, 0, 3, None)
    assert spec.canonical_dict() == {"name": "a", "entrypoint": "train.py"}
    job = spec.to_job("j", 0.0, tenant="t")
    assert job.parallelism.world == 1 and job.max_domain is DomainLevel.CLUSTER
    assert (job.gpus_per_worker, job.total_gpus) == (0, 0)  # no GPU unless asked


def test_a_gpu_is_held_only_when_asked() -> None:
    spec = parse_jobspec("name: a\nentrypoint: t.py\nworkers: 2\nresources: {gpus: 1}\n")
    assert spec.to_job("j", 0.0, tenant="t").total_gpus == 2
    assert spec.canonical_dict()["resources"] == {"gpus": 1}  # stored: no longer a default
    with pytest.raises(ValueError, match="no tenant"):
        spec.to_job("j", 0.0)


def test_json_text_parses_with_lines() -> None:
    text = '{\n  "name": "a",\n  "entrypoint": "t.py",\n  "workers": "4"\n}\n'
    with pytest.raises(JobSpecError) as caught:
        parse_jobspec(text, "job.json")
    assert caught.value.line == 4
    assert str(caught.value) == "job.json:4: workers: should be a valid integer (got '4')"
    assert parse_jobspec(text.replace('"4"', "4")).workers == 4


def test_tensor_parallel_gpus_and_priority_integer() -> None:
    spec = parse_jobspec(
        "name: big\nentrypoint: t.py\nworkers: 4\nresources: {gpus: 2}\n"
        "parallelism: {data: 2, tensor: 4}\npriority: '250'\n"
    )
    job = spec.to_job("j", 0.0, tenant="t")
    assert (job.unit_gpus, job.units, job.priority) == (4, 2, 250)
    assert spec.priority == 250


def _error(text: str) -> JobSpecError:
    with pytest.raises(JobSpecError) as caught:
        parse_jobspec(text, "job.yaml")
    return caught.value


@pytest.mark.parametrize(
    ("old", "new", "line", "message"),
    [
        ("workers: 4", "workers: 5000", 5, "workers: should be less than or equal to 4096"),
        ("workers: 4", "workers: 0", 5, "workers: should be greater than or equal to 1"),
        ("workers: 4", "workers: 4.5", 5, "workers: should be a valid integer (got 4.5)"),
        ("max_restarts: 3", "max_restarts: 3\nretries: 2", 11, "retries: unknown field"),
        ("gpus: 1,", "gpus: x,", 6, "resources.gpus: should be a valid integer (got 'x')"),
        ("gpus: 1,", "gpus: 1, tpus: 2,", 6, "resources.tpus: unknown field (expected one of"),
        ("name: tiny-gpt\n", "", 1, "name: is required"),
        ("name: tiny-gpt", "name: 'has space'", 1, "name: should match pattern"),
        ("name: tiny-gpt", "name: " + "x" * 64, 1, "name: should have at most 63 characters"),
        ("data: 4", "data: 3", 7, "parallelism: data × tensor × pipeline = 3, but the job"),
        ("tensor: 1", "tensor: 2", 7, "parallelism: data × tensor × pipeline = 8"),
        ("priority: normal", "priority: urgent", 8, "priority: unknown priority 'urgent'"),
        ("priority: normal", "priority: 99999", 8, "priority: an integer priority must be"),
        ("min_workers: 2", "min_workers: 8", 13, "min_workers: is 8, more than workers (4)"),
        ("max_domain: rack", "max_domain: galaxy", 11, "max_domain: should be 'node', 'rack'"),
        (
            "checkpoint_interval: 60",
            "checkpoint_interval: -1",
            9,
            "checkpoint_interval: should be greater",
        ),
        ("THREADS: 4", "THREADS: true", 14, "env: THREADS: write the value as a quoted string"),
        ("THREADS: 4", "1BAD: x", 14, "env: '1BAD' is not a valid variable name"),
        ("entrypoint: examples", "entrypoint: ''\nx: examples", 3, "entrypoint: should have at"),
        ("max_restarts: 3", "max_restarts: 3\nname: again", 11, "name: is given twice"),
        ('args: ["--steps"', 'args: [["--steps"]', 4, "args.0: should be a valid string"),
        ("max_restarts: 3", "max_restarts: 3\ncomm: {hook: zip}", 11, "comm.hook: should be"),
        ("max_restarts: 3", "max_restarts: 3\ncomm: {hook: fp16, r: 1}", 11, "comm.r: unknown"),
        (
            "max_restarts: 3",
            "max_restarts: 3\ncomm: {hook: powersgd, start_iter: 1}",
            11,
            "comm.start_iter: should be greater than or equal to 2",
        ),
    ],
)
def test_invalid_fields_name_field_line_and_problem(
    old: str, new: str, line: int, message: str
) -> None:
    assert old in FULL
    error = _error(FULL.replace(old, new, 1))
    assert error.line == line, str(error)
    assert str(error).startswith(f"job.yaml:{line}: {message}"), str(error)


def test_every_problem_is_listed() -> None:
    error = _error("name: a\nentrypoint: t.py\nworkers: 0\nresources: {gpus: -1}\n")
    assert [(p.field, p.line) for p in error.problems] == [("workers", 3), ("resources.gpus", 4)]
    assert str(error).splitlines()[1].startswith("job.yaml:4: resources.gpus:")


def test_malformed_text_and_wrong_top_level() -> None:
    assert "not valid YAML" in str(_error("name: [unclosed\n"))
    assert str(_error('{"name": "a",\n"name": "b"}')) == "job.yaml: name: is given twice"
    assert str(_error('{"name": "a",\n"x": }')) == "job.yaml:2: not valid JSON: Expecting value"
    assert "expected a mapping" in str(_error("- a\n- b\n"))
    assert "larger than 256 KiB" in str(_error("name: a\n" + "#" * 300_000))
    with pytest.raises(JobSpecError, match="expected a mapping"):
        jobspec_from_mapping(["not", "a", "mapping"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- " * 5000, "nested deeper than 32 levels"),  # PyYAML recursed until RecursionError
        ("[" * 100_000, "nested deeper than 32 levels"),
        ('{"a":' * 5000 + "1" + "}" * 5000, "not valid JSON: nested too deeply"),
        ("name: a\nentrypoint: t.py\npriority: " + "9" * 5000, "not valid YAML: Exceeds"),
        ('{"name": "a", "priority": ' + "9" * 5000 + "}", "not valid JSON: Exceeds"),
        ('name: a\nentrypoint: t.py\nargs: ["x\\0y"]\n', "3: args: arguments cannot contain NUL"),
        ('name: a\nentrypoint: t.py\nenv: {A: "x\\0y"}\n', "3: env: values cannot contain NUL"),
        ('{"name": "a", "entrypoint": "t", "env": {"A": "\\ud800"}}', "env.A: should be a valid"),
    ],
)
def test_hostile_text_is_a_spec_error(text: str, message: str) -> None:
    """Deep nesting, huge integers, NUL and lone surrogates: a readable error, never a crash
    (the API answered 500 to each, or PostgreSQL refused to store it)."""
    assert message in str(_error(text))


def test_env_and_args_size_limits() -> None:
    env = {f"K{i}": "v" * 1000 for i in range(70)}
    with pytest.raises(JobSpecError, match="env is larger than 64 KiB"):
        jobspec_from_mapping({"name": "a", "entrypoint": "t", "env": env})
    with pytest.raises(JobSpecError, match="at most 256 items"):
        jobspec_from_mapping(
            {"name": "a", "entrypoint": "t", "env": {f"K{i}": "" for i in range(257)}}
        )
    with pytest.raises(JobSpecError, match="args are longer than 64 KiB"):
        jobspec_from_mapping({"name": "a", "entrypoint": "t", "args": ["x" * 4000] * 20})


def test_tenant_is_filled_in_or_must_match() -> None:
    spec = parse_jobspec("name: a\nentrypoint: t.py\n")
    owned = spec.with_tenant("team-a")
    assert owned.tenant == "team-a" and owned.with_tenant("team-a") is owned
    with pytest.raises(JobSpecError, match="names tenant 'team-a', not 'team-b'"):
        owned.with_tenant("team-b")


def test_hash_ignores_layout_defaults_and_key_order() -> None:
    a = parse_jobspec("name: a\nentrypoint: t.py\nworkers: 1\npriority: NORMAL\n")
    b = jobspec_from_mapping({"priority": "normal", "entrypoint": "t.py", "name": "a"})
    assert a == b and a.spec_hash == b.spec_hash
    c = jobspec_from_mapping({"entrypoint": "t.py", "name": "a", "workers": 2})
    assert c.spec_hash != a.spec_hash
    assert json.loads(a.canonical_json()) == {"name": "a", "entrypoint": "t.py"}


_names = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}", fullmatch=True)
_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8
)


@st.composite
def _specs(draw: st.DrawFn) -> JobSpec:
    workers = draw(st.integers(1, 64))
    gpus = draw(st.integers(0, 8))
    data: dict[str, object] = {
        "name": draw(_names),
        "entrypoint": draw(st.from_regex(r"[a-z_][a-z/_]{0,20}\.py", fullmatch=True)),
        "workers": workers,
        "resources": {
            "gpus": gpus,
            "cpus": draw(st.floats(0, 64, allow_nan=False)),
            "memory_gb": draw(st.floats(0, 512, allow_nan=False)),
            "gpu_type": draw(st.sampled_from(["any", "H100", "A100"])),
        },
        "args": draw(st.lists(_text, max_size=4)),
        "env": draw(st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), _text)),
        "priority": draw(st.one_of(st.sampled_from(["low", "high"]), st.integers(0, 10_000))),
        "preemptible": draw(st.booleans()),
        "max_domain": draw(st.sampled_from(["node", "rack", "pod", "cluster"])),
    }
    if draw(st.booleans()):
        data["tenant"] = draw(_names)
    if draw(st.booleans()):
        data["checkpoint_interval"] = draw(st.floats(0.5, 86_400, allow_nan=False))
    if draw(st.booleans()):
        data["min_workers"] = draw(st.integers(1, workers))
    if draw(st.booleans()):
        world = workers * gpus if gpus else workers
        data["parallelism"] = {"data": world}
    return jobspec_from_mapping(data)


@settings(max_examples=150, deadline=None)
@given(_specs())
def test_canonical_json_round_trips(spec: JobSpec) -> None:
    text = spec.canonical_json()
    again = parse_jobspec(text)
    assert again == spec
    assert again.canonical_json() == text
    assert again.spec_hash == spec.spec_hash
    assert jobspec_from_mapping(json.loads(text)) == spec


def test_model_section_names_the_registered_model() -> None:
    assert parse_jobspec(FULL, "job.yaml").model_name == "tiny-gpt"  # default: the job's name
    spec = parse_jobspec(FULL + "model: {name: shakespeare}\n", "job.yaml")
    assert spec.model_name == "shakespeare"
    assert spec.canonical_dict()["model"] == {"name": "shakespeare"}
    assert parse_jobspec(FULL, "job.yaml").spec_hash != spec.spec_hash


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("model:\n  name: 'a b'\n", "job.yaml:16: model.name: should match pattern"),
        ("model:\n  version: 2\n", "job.yaml:15: model.name: is required"),
        ("model:\n  name: m\n  tag: x\n", "job.yaml:17: model.tag: unknown field"),
        ("model: gpt\n", "job.yaml:15: model: should be"),
    ],
)
def test_bad_model_section_is_a_readable_error(section: str, message: str) -> None:
    assert str(_error(FULL + section)).startswith(message), str(_error(FULL + section))


@pytest.mark.parametrize(
    ("entrypoint", "why"),
    [
        ("-c", "interpreter flag"),
        ("-m", "interpreter flag"),
        ("--version", "interpreter flag"),
        ("/usr/bin/python3", "absolute"),
        ("/work/main/examples/jobs/tiny_gpt.py", "absolute"),
        ("~/train.py", "absolute"),
        ("../train.py", "leaves the job's code"),
        ("jobs/../../train.py", "leaves the job's code"),
        (".", "names no file"),
        ("a\\b.py", "plain path"),
    ],
)
def test_an_entrypoint_outside_the_shipped_code_is_refused(entrypoint: str, why: str) -> None:
    with pytest.raises(JobSpecError, match=why) as refused:
        jobspec_from_mapping({"name": "a", "entrypoint": entrypoint})
    assert refused.value.problems[0].field == "entrypoint"


def test_a_module_or_an_entrypoint_but_not_both() -> None:
    assert jobspec_from_mapping({"name": "a", "module": "pkg.train"}).module == "pkg.train"
    assert jobspec_from_mapping({"name": "a", "entrypoint": "jobs/train.py"}).entrypoint
    for fields in ({}, {"entrypoint": "t.py", "module": "m"}):
        with pytest.raises(JobSpecError, match="either entrypoint"):
            jobspec_from_mapping({"name": "a", **fields})
    with pytest.raises(JobSpecError, match="module"):
        jobspec_from_mapping({"name": "a", "module": "-c"})


SPEC_ENV = {
    "nothing asked": ({}, {}),
    "tensor and pipeline: data takes the ranks left": (
        {
            "workers": 8,
            "resources": {"gpus": 1},
            "parallelism": {"data": 2, "tensor": 2, "pipeline": 2},
        },
        {"AICLUSTER_PARALLELISM": "tensor=2,pipeline=2"},
    ),
    "PowerSGD with its defaults": (
        {"comm": {"hook": "powersgd"}},
        {
            "AICLUSTER_COMM_HOOK": "powersgd",
            "AICLUSTER_COMM_RANK": "2",
            "AICLUSTER_COMM_START_ITER": "2",
        },
    ),
    "bf16": (
        {"comm": {"hook": "bf16", "rank": 4}},
        {
            "AICLUSTER_COMM_HOOK": "bf16",
            "AICLUSTER_COMM_RANK": "4",
            "AICLUSTER_COMM_START_ITER": "2",
        },
    ),
}


@pytest.mark.parametrize(("fields", "env"), SPEC_ENV.values(), ids=SPEC_ENV.keys())
def test_what_the_spec_tells_the_ranks(fields: dict, env: dict) -> None:
    from aicluster.control.loop.attempts import spec_env

    spec = jobspec_from_mapping({"name": "j", "tenant": "t", "entrypoint": "x.py", **fields})
    assert spec_env(spec) == env


def test_restart_on_and_hang_check_take_their_defaults_and_name_their_values() -> None:
    spec = parse_jobspec("name: a\nentrypoint: t.py\n")
    assert (spec.restart_on, spec.hang_check) == ("infrastructure", "auto")
    given = parse_jobspec("name: a\nentrypoint: t.py\nrestart_on: any\nhang_check: off\n")
    assert (given.restart_on, given.hang_check) == ("any", "off")  # YAML's off, quoted or not
    assert given.canonical_dict()["restart_on"] == "any"
    error = str(_error("name: a\nentrypoint: t.py\nrestart_on: always\n"))
    assert "restart_on" in error and "'infrastructure' or 'any'" in error, error
    error = str(_error("name: a\nentrypoint: t.py\nhang_check: never\n"))
    assert "'auto', 'from_start' or 'off'" in error, error
