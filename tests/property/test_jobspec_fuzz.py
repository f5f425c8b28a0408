"""Hypothesis fuzzing of the job spec parser, the function every posted or submitted spec goes
through (``parse_jobspec``: YAML or JSON text to a ``JobSpec``) and of ``jobspec_from_mapping``
(already-decoded data): whatever the input, the only exception is ``JobSpecError`` (the API
answers it with a 400 or 422), and its message stays small.

Inputs: arbitrary text; YAML built from the constructs that have broken parsers (anchors and
aliases, tags, flow and block nesting, merge keys, huge numbers, odd scalars); YAML and JSON
dumps of random data under the spec's own field names; and valid specs with random edits.
500 examples each in the suite, 2,000 under ``make fuzz`` (``tests/fuzzing.py``); pure
functions (no server).
"""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aicluster.core import (
    ConfigError,
    JobSpec,
    JobSpecError,
    jobspec_from_mapping,
    parse_cluster,
    parse_jobspec,
    parse_tenants,
)
from fuzzing import examples

FUZZ = settings(
    max_examples=examples(500),  # 2,000 under make fuzz (tests/fuzzing.py)
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # CI fails reproducibly or not at all
)
#: The most a refusal's message may say (the API's 4xx body is about this).
MAX_MESSAGE = 8 * 1024

FIELDS = [*JobSpec.model_fields, "gpus", "cpus", "memory_gb", "gpu_type", "data", "tensor"]
FIELDS += ["pipeline", "<<", "x"]
VALID = [
    "name: a\nentrypoint: train.py\n",
    "name: job-1\ntenant: t\nentrypoint: t.py\nworkers: 2\nresources: {gpus: 4, cpus: 8}\n"
    "args: [--lr, '0.1']\nenv: {A: '1'}\npriority: high\nmodel: {name: m}\n",
    "name: m\nmodule: pkg.train\nparallelism: {data: 2, tensor: 1, pipeline: 1}\nworkers: 2\n",
    json.dumps({"name": "j", "entrypoint": "t.py", "workers": 4, "resources": {"gpus": 2}}),
]
#: YAML pieces that have broken parsers: aliases and anchors, tags, nesting, odd scalars.
TOKENS = [
    "&a ", "*a", "&b ", "*b", "<<: *a", "!!python/object:os.system ", "!!binary ", "!!set ",
    "!!omap ", "!!float ", "!!int ", "!!timestamp ", "!!str ", "!custom ", "? ", "- ", "[",
    "]", "{", "}", ", ", ": ", "\n", "\n  ", "'", '"', "#", "|", ">", "---\n", "...\n",
    "%YAML 1.1\n", "9" * 400, "1e999", "-.inf", ".nan", "0x1F", "0o17", "2001-13-45",
    "2001-12-14t21:59:43.10-05:00", "null", "~", "true", "no", "\x00", "\ud800", "\t",
    "\u2028", "\ufeff", "=", "\\", "%",
]  # fmt: skip


def _json_data(keys: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(min_value=-(10**30), max_value=10**30),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=40),
        st.sampled_from(["train.py", "high", "any", "H100", "rack", "../x", "-c", "/bin/sh"]),
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=6), st.dictionaries(keys, inner, max_size=6)
        ),
        max_leaves=8,
    )


FIELD_KEYS = st.one_of(st.sampled_from(FIELDS), st.text(max_size=12))
#: Values that pass each field's own check more often than random data does.
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "entrypoint": st.sampled_from(["train.py", "a/b.py", "./t.py", "../t.py", "-c", "/x", "."]),
    "module": st.sampled_from(["pkg.train", "a", "1bad", "a..b"]),
    "workers": st.integers(-2, 5000),
    "min_workers": st.integers(-1, 10),
    "priority": st.sampled_from(["high", "normal", "low", " 7 ", "-1", "urgent", 5, 10_001]),
    "resources": st.fixed_dictionaries(
        {}, optional={"gpus": st.integers(-1, 65), "cpus": st.floats(), "gpu_type": st.text()}
    ),
    "parallelism": st.fixed_dictionaries(
        {}, optional={k: st.integers(0, 8) for k in ("data", "tensor", "pipeline")}
    ),
    "args": st.lists(st.text(max_size=8), max_size=5),
    "env": st.dictionaries(st.text(max_size=6), st.one_of(st.text(max_size=6), st.integers())),
    "model": st.fixed_dictionaries({"name": st.text(max_size=8)}),
    "max_domain": st.sampled_from(["node", "rack", "pod", "cluster", "galaxy"]),
}
VALUES = _json_data(FIELD_KEYS)


def _field(name: str) -> st.SearchStrategy[tuple[str, Any]]:
    value = st.one_of(PLAUSIBLE[name], VALUES) if name in PLAUSIBLE else VALUES
    return st.tuples(st.just(name), value)


#: Mappings of a few spec fields (a name, mostly) with plausible or random values; or any data.
SPEC_DATA = st.one_of(
    VALUES,
    st.tuples(
        st.sampled_from(["a", "x" * 70, "", "ok-name"]),
        st.lists(st.sampled_from(FIELDS).flatmap(_field), max_size=6),
    ).map(lambda drawn: {"name": drawn[0], **dict(drawn[1])}),
)


def _dumped(data: Any, as_json: bool) -> str:
    if as_json:
        return json.dumps(data, allow_nan=True)
    try:
        return str(yaml.safe_dump(data, allow_unicode=True))
    except yaml.YAMLError:  # a lone surrogate, say: no text at all
        return json.dumps(data)


@st.composite
def edited(draw: st.DrawFn) -> str:
    """A valid spec with random characters inserted, deleted or replaced, and tokens spliced."""
    text = draw(st.sampled_from(VALID))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["insert", "delete", "token"]))
        if kind == "insert":
            text = text[:at] + draw(st.text(max_size=4)) + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)) :]
        else:
            text = text[:at] + draw(st.sampled_from(TOKENS)) + text[at:]
    return text


SPEC_TEXT = st.one_of(
    st.text(max_size=200),
    st.text(alphabet=string.printable, max_size=200),
    st.lists(st.sampled_from(TOKENS + FIELDS), max_size=40).map("".join),
    st.builds(_dumped, SPEC_DATA, st.booleans()),
    edited(),
)
ALIAS_BOMB = (
    "a: &a [x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\nc: [*b,*b,*b,*b,*b,*b,*b,*b]"
)


def _refused_cleanly(text: str) -> None:
    try:
        spec = parse_jobspec(text, "fuzz")
    except JobSpecError as error:
        assert len(str(error)) <= MAX_MESSAGE, str(error)[:200]
        assert error.problems
    else:
        assert isinstance(spec, JobSpec)
        spec.canonical_json()  # a spec that parses also hashes and converts
        spec.to_job("j", 0.0, tenant=spec.tenant or "t")


@FUZZ
@given(SPEC_TEXT)
@example(ALIAS_BOMB)
@example("- " * 5000)
@example("[" * 10_000)
@example('{"a":' * 5000 + "1" + "}" * 5000)
@example("x: [" + "0," * 20_000 + "0]")
@example("name: " + "x" * 200_000)
@example("{" + ",".join(f'"k{i}":0' for i in range(20_000)) + "}")
@example("name: a\nname: b\n")
@example("? [a, b]\n: c\n")
@example("!!python/object/apply:os.system ['true']")
def test_parse_jobspec_raises_only_spec_errors(text: str) -> None:
    _refused_cleanly(text)


@FUZZ
@given(SPEC_DATA)
def test_jobspec_from_mapping_raises_only_spec_errors(data: Any) -> None:
    try:
        spec = jobspec_from_mapping(data, "fuzz")
    except JobSpecError as error:
        assert len(str(error)) <= MAX_MESSAGE, str(error)[:200]
    else:
        spec.canonical_json()


def test_alias_bomb_and_oversized_specs_are_refused_early() -> None:
    """The bounds themselves: no alias, at most 32 levels and 10,000 values, in YAML and JSON."""
    cases = {
        ALIAS_BOMB: "aliases (*a) are not allowed",
        "- " * 40: "nested deeper than 32 levels",
        "x: [" + "0," * 10_000 + "0]": "more than 10000 values",
        '{"name": "a", "args": ' + "[" * 40 + "]" * 40 + "}": "nested deeper than 32 levels",
        json.dumps({"name": "a", "env": {f"K{i}": "v" for i in range(6000)}}): (
            "more than 10000 values"
        ),
    }
    for text, expected in cases.items():
        try:
            parse_jobspec(text)
        except JobSpecError as error:
            assert expected in str(error), (expected, str(error)[:200])
        else:
            raise AssertionError(f"accepted: {text[:60]!r}")


def test_config_files_may_use_aliases_but_not_alias_bombs() -> None:
    """The operator's cluster and tenants files keep YAML aliases; each counts as the values it
    stands for, so a bomb stops at the bound (1,000,000 values) before it is expanded."""
    shared = "tenants:\n  - name: a\n    quota: &q {H100: 8}\n  - name: b\n    quota: *q\n"
    assert parse_tenants(shared)["b"].quota == {"H100": 8}
    levels = [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = "\n".join(["tenants: []", "x0: &x0 [a, a, a, a, a, a, a, a, a, a]", *levels])
    with pytest.raises(ConfigError, match="more than 1000000 values"):
        parse_tenants(bomb)
    with pytest.raises(ConfigError, match="nested deeper than 64 levels"):
        parse_cluster("nodes: " + "[" * 100)
