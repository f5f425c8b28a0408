"""Reading a job spec from YAML or JSON text, every problem named with its field and line.
See :mod:`aicluster.core.jobspec`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from aicluster.core.bounded import BoundedLoader, json_shape_problem
from aicluster.core.jobspec.parts import (
    MAX_DEPTH,
    MAX_NODES,
    MAX_SPEC_BYTES,
    CommSpec,
    ParallelismSpec,
    ResourcesSpec,
)
from aicluster.core.jobspec.problems import FieldError, JobSpecError, SpecProblem, UnsafeEntrypoint
from aicluster.core.jobspec.spec import JobSpec

__all__ = ["jobspec_from_mapping", "parse_jobspec"]


class _Mapping(dict[str, Any]):
    """A YAML mapping that remembers its own line and the line of each key."""

    line: int = 0
    key_lines: dict[str, int]


class _LineLoader(BoundedLoader):
    """Records lines (see ``_construct_mapping``); refuses aliases (a spec never needs one, and
    they are how a few hundred bytes expand to millions of values), explicit tags (``!!int ''``
    broke PyYAML's constructors), and nesting deeper and more values than any spec needs
    (PyYAML composes recursively: a few hundred ``[`` would otherwise exhaust the stack)."""

    max_depth, max_nodes, what = MAX_DEPTH, MAX_NODES, "a job spec"
    allow_aliases = allow_tags = False


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> _Mapping:
    mapping = _Mapping()
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if str(key) in mapping:
            line = key_node.start_mark.line + 1
            problem = SpecProblem(str(key), line, "is given twice")
            raise _DuplicateKey(problem)
        mapping[str(key)] = loader.construct_object(value_node, deep=True)
        mapping.key_lines[str(key)] = key_node.start_mark.line + 1
    return mapping


class _DuplicateKey(Exception):
    def __init__(self, problem: SpecProblem) -> None:
        self.problem = problem


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_jobspec(text: str, source: str = "<jobspec>") -> JobSpec:
    """Parse a job spec from YAML or JSON text (an invalid JSON spec is read again as YAML, so
    its problems have lines too).

    Raises :class:`JobSpecError` (a :class:`ConfigError`) naming the source, line, field and
    problem for malformed text and for every invalid field.
    """
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:  # (lone surrogates too)
        raise JobSpecError(source, (SpecProblem("", None, "the spec is larger than 256 KiB"),))
    if not text.lstrip().startswith("{"):
        return jobspec_from_mapping(_load_yaml(text, source), source)
    data = _load_json(text, source)
    try:
        return jobspec_from_mapping(data, source)
    except JobSpecError:
        # Only now learn each key's line: the pure-Python YAML pass cost more than the rest of
        # an API submission together.
        return jobspec_from_mapping(_json_lines(text, data), source)


def _load_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_LineLoader)  # a SafeLoader subclass
    except _DuplicateKey as duplicate:
        raise JobSpecError(source, (duplicate.problem,)) from None
    except yaml.MarkedYAMLError as error:
        line = error.problem_mark.line + 1 if error.problem_mark else None
        problem = SpecProblem("", line, f"not valid YAML: {error.problem}")
        raise JobSpecError(source, (problem,)) from None
    except (yaml.YAMLError, ValueError) as error:  # ValueError: an integer of 5,000 digits
        raise JobSpecError(source, (SpecProblem("", None, f"not valid YAML: {error}"),)) from None


def _load_json(text: str, source: str) -> Any:
    """Strict JSON (duplicate keys refused)."""

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        data = dict(pairs)
        if len(data) < len(pairs):  # a set, not list.count: 40,000 keys fit in 256 KiB
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise JobSpecError(source, (SpecProblem(key, None, "is given twice"),))
                seen.add(key)
        return data

    try:
        data = json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as error:
        problem = SpecProblem("", error.lineno, f"not valid JSON: {error.msg}")
        raise JobSpecError(source, (problem,)) from None
    except JobSpecError:
        raise
    except RecursionError:
        problem = SpecProblem("", None, "not valid JSON: nested too deeply")
        raise JobSpecError(source, (problem,)) from None
    except ValueError as error:  # an integer of 5,000 digits
        problem = SpecProblem("", None, f"not valid JSON: {error}")
        raise JobSpecError(source, (problem,)) from None
    shape = json_shape_problem(data, MAX_DEPTH, MAX_NODES)
    if shape is not None:
        raise JobSpecError(source, (SpecProblem("", None, f"not a job spec: {shape}"),))
    return data


def _json_lines(text: str, data: Any) -> Any:
    """``data`` as read by the line-recording YAML loader (JSON is nearly a subset of YAML)."""
    try:
        with_lines = yaml.load(text, Loader=_LineLoader)
    except (yaml.YAMLError, _DuplicateKey, ValueError):
        return data
    return with_lines if with_lines == data else data


def jobspec_from_mapping(data: Any, source: str = "<jobspec>") -> JobSpec:
    """Validate already-decoded data (a JSON request body, a parsed file) into a spec.

    Raises :class:`JobSpecError` listing every problem; lines are known for YAML from
    :func:`parse_jobspec`.
    """
    if not isinstance(data, Mapping):
        problem = SpecProblem("", 1, "expected a mapping of fields at the top level")
        raise JobSpecError(source, (problem,))
    try:
        return JobSpec.model_validate(dict(data))
    except ValidationError as error:
        problems = tuple(_problem(data, detail) for detail in error.errors(include_url=False))
        raise JobSpecError(source, problems) from None


def _problem(data: Mapping[str, Any], detail: ErrorDetails) -> SpecProblem:
    loc = tuple(detail["loc"])
    cause = (detail.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        return SpecProblem(cause.field, _line_of(data, (cause.field,)), str(cause))
    field = ".".join(str(part) for part in loc)
    if isinstance(cause, UnsafeEntrypoint):
        return SpecProblem(field, _line_of(data, loc), str(cause), unsafe=True)
    kind, got = detail["type"], detail.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_fields(loc[:-1])
        message = f"unknown field (expected one of {', '.join(allowed)})"
    elif kind == "missing":
        return SpecProblem(field, _line_of(data, loc[:-1]), "is required")
    else:
        message = detail["msg"].removeprefix("Value error, ")
        message = message.replace("Input should", "should").replace("String should", "should")
        secret = bool(loc) and loc[0] == "secrets"  # a value the error must not echo
        if kind != "value_error" and not secret and not isinstance(got, Mapping | list):
            shown = repr(got)  # the answer to a 256 KiB value stays small
            message += f" (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
    parent = _at(data, loc)
    return SpecProblem(field, _line_of(data, loc) or getattr(parent, "line", None), message)


def _allowed_fields(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = JobSpec
    nested: dict[str, type[BaseModel]] = {
        "resources": ResourcesSpec,
        "parallelism": ParallelismSpec,
        "comm": CommSpec,
    }
    if loc and str(loc[0]) in nested:
        model = nested[str(loc[0])]
    return sorted(model.model_fields)


def _at(data: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        in_list = isinstance(data, list) and isinstance(part, int) and part < len(data)
        if not (in_list or (isinstance(data, Mapping) and part in data)):
            break
        data = data[part]
    return data


def _line_of(data: Any, loc: tuple[Any, ...]) -> int | None:
    """The line of the deepest key of ``loc`` found in YAML-loaded ``data`` (None for dicts)."""
    line: int | None = getattr(data, "line", None) or None
    for part in loc:
        if isinstance(data, Mapping):
            key_line = getattr(data, "key_lines", {}).get(str(part))
            if key_line is None:
                break
            line, data = key_line, data[str(part)]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            break
    return line
