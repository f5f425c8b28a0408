"""Parse cluster and tenant YAML text into domain objects, with errors that name file and line.

Only text is parsed here (core does no I/O); callers read the file and pass its name as ``source``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from aicluster.core.bounded import BoundedLoader
from aicluster.core.tenants import Tenant
from aicluster.core.topology import (
    Cluster,
    DomainLevel,
    GpuPower,
    LinkBandwidth,
    Node,
    PowerBudget,
)

__all__ = ["ConfigError", "load_mapping", "parse_cluster", "parse_tenants", "tenants_from"]


class ConfigError(ValueError):
    """A configuration file is malformed: says which file, which line and what is wrong."""

    def __init__(self, source: str, line: int | None, message: str) -> None:
        self.source, self.line, self.message = source, line, message
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {message}")


class _Mapping(dict[str, Any]):
    """A YAML mapping that remembers the line of each key."""

    line: int = 0
    key_lines: dict[str, int]


class _LineLoader(BoundedLoader):
    """Operators' files may use aliases; each counts as the values it stands for, so an alias
    bomb stops at the bound like any other oversized file."""

    max_depth, max_nodes, allow_aliases, what = 64, 1_000_000, True, "a configuration file"


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> _Mapping:
    mapping = _Mapping({str(k): v for k, v in loader.construct_mapping(node, deep=True).items()})
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {str(key.value): key.start_mark.line + 1 for key, _ in node.value}
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_mapping(text: str, source: str) -> _Mapping:
    """A YAML file's top-level mapping; each mapping in it knows its keys' lines
    (``key_lines``) and its own (``line``)."""
    try:
        data = yaml.load(text, Loader=_LineLoader)
    except yaml.MarkedYAMLError as error:
        line = error.problem_mark.line + 1 if error.problem_mark else None
        raise ConfigError(source, line, f"not valid YAML: {error.problem}") from None
    except yaml.YAMLError as error:
        raise ConfigError(source, None, f"not valid YAML: {error}") from None
    if not isinstance(data, _Mapping):
        raise ConfigError(source, 1, "expected a mapping at the top level")
    return data


class _Reader:
    """Typed field access with errors that point at the offending line."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: Mapping[str, Any], key: str | None, message: str) -> ConfigError:
        line = getattr(where, "line", None)
        if key is not None:
            line = getattr(where, "key_lines", {}).get(key, line)
        return ConfigError(self.source, line, message)

    def number(self, where: Mapping[str, Any], key: str, default: float, minimum: float) -> float:
        value = where.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(where, key, f"{key} must be a number, got {value!r}")
        if value < minimum:
            raise self.fail(where, key, f"{key} must be at least {minimum:g}, got {value!r}")
        return float(value)

    def integer(self, where: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
        value = where.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, key, f"{key} must be an integer, got {value!r}")
        if value < minimum:
            raise self.fail(where, key, f"{key} must be at least {minimum}, got {value!r}")
        return value

    def text(self, where: Mapping[str, Any], key: str, default: str | None = None) -> str:
        value = where.get(key, default)
        if value is None:
            raise self.fail(where, None, f"missing required field {key!r}")
        if not isinstance(value, str | int) or isinstance(value, bool) or str(value) == "":
            raise self.fail(where, key, f"{key} must be a non-empty string, got {value!r}")
        return str(value)

    def mapping(self, where: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        value = where.get(key, {})
        if not isinstance(value, Mapping):
            raise self.fail(where, key, f"{key} must be a mapping")
        return value

    def items(self, where: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
        value = where.get(key, [])
        if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
            raise self.fail(where, key, f"{key} must be a list of mappings")
        return value

    def unknown_keys(self, where: Mapping[str, Any], allowed: set[str]) -> None:
        for key in where:
            if key not in allowed:
                expected = ", ".join(sorted(allowed))
                raise self.fail(where, key, f"unknown field {key!r} (expected one of {expected})")


_NODE_FIELDS = {"gpus", "gpu_type", "cpus", "memory_gb", "nvlink_domain_size", "labels"}
_GROUP_FIELDS = _NODE_FIELDS | {"pods", "racks_per_pod", "nodes_per_rack", "prefix"}
_TOP_FIELDS = {
    "name",
    "power",
    "bandwidth",
    "defaults",
    "layout",
    "groups",
    "nodes",
    "power_budget_w",
    "racks",
    "circuits",
}


def parse_cluster(text: str, source: str = "<cluster>") -> Cluster:
    """Parse a cluster file: generated ``layout``/``groups`` of racks and explicit ``nodes``.

    Raises :class:`ConfigError` naming the file, line and problem.
    """
    reader = _Reader(source)
    data = load_mapping(text, source)
    reader.unknown_keys(data, _TOP_FIELDS)
    defaults = reader.mapping(data, "defaults")
    reader.unknown_keys(defaults, _NODE_FIELDS)
    groups = list(reader.items(data, "groups"))
    if "layout" in data:
        groups.insert(0, reader.mapping(data, "layout"))
    nodes: list[Node] = []
    for index, group in enumerate(groups):
        nodes.extend(_group_nodes(reader, group, defaults, index, len(nodes)))
    for entry in reader.items(data, "nodes"):
        reader.unknown_keys(entry, _NODE_FIELDS | {"name", "rack", "pod"})
        nodes.append(_node(reader, entry, defaults, reader.text(entry, "name"), entry))
    if not nodes:
        raise reader.fail(data, None, "the cluster has no nodes (give layout, groups or nodes)")
    power = {
        str(gpu_type): _power(reader, spec)
        for gpu_type, spec in reader.mapping(data, "power").items()
    }
    bandwidth = _bandwidth(reader, reader.mapping(data, "bandwidth"))
    budgets = _budgets(reader, data)
    try:
        name = reader.text(data, "name", "cluster")
        return Cluster(name, tuple(nodes), power, bandwidth, budgets)
    except ValueError as error:
        raise reader.fail(data, None, str(error)) from None


def _bandwidth(reader: _Reader, spec: Mapping[str, Any]) -> LinkBandwidth:
    """GB/s per GPU of each level's links (``bandwidth: {nvlink, node, rack, pod, cluster}``),
    the documented defaults for those not given."""
    reader.unknown_keys(spec, {level.label for level in DomainLevel})
    given: dict[str, float] = {}
    for key, value in spec.items():
        number = not isinstance(value, bool) and isinstance(value, int | float)
        if not number or not 0 < value < float("inf"):
            raise reader.fail(
                spec, key, f"bandwidth.{key} must be a positive number of GB/s, got {value!r}"
            )
        given[key] = float(value)
    return LinkBandwidth(**given)


def _budgets(reader: _Reader, data: Mapping[str, Any]) -> tuple[PowerBudget, ...]:
    """``power_budget_w`` of the cluster, of ``racks: {name: {power_budget_w}}`` and of
    ``circuits: {name: {racks: [...], power_budget_w}}``."""
    budgets = []
    if "power_budget_w" in data:
        budgets.append(PowerBudget("cluster", None, _watts(reader, data)))
    for rack, spec in reader.mapping(data, "racks").items():
        if not isinstance(spec, Mapping):
            raise reader.fail(data, "racks", f"racks.{rack} must be a mapping")
        reader.unknown_keys(spec, {"power_budget_w"})
        budgets.append(PowerBudget(f"rack {rack}", frozenset({str(rack)}), _watts(reader, spec)))
    for circuit, spec in reader.mapping(data, "circuits").items():
        if not isinstance(spec, Mapping):
            raise reader.fail(data, "circuits", f"circuits.{circuit} must be a mapping")
        reader.unknown_keys(spec, {"racks", "power_budget_w"})
        racks = spec.get("racks")
        if not isinstance(racks, list) or not racks:
            raise reader.fail(spec, "racks", f"circuits.{circuit}.racks must list rack names")
        watts = _watts(reader, spec)
        budgets.append(PowerBudget(f"circuit {circuit}", frozenset(map(str, racks)), watts))
    return tuple(budgets)


def _watts(reader: _Reader, spec: Mapping[str, Any]) -> float:
    watts = reader.number(spec, "power_budget_w", 0.0, 0)
    if watts <= 0:
        raise reader.fail(spec, "power_budget_w", "power_budget_w must be positive")
    return watts


def _power(reader: _Reader, spec: Any) -> GpuPower:
    if not isinstance(spec, Mapping):
        raise ConfigError(reader.source, None, "each power entry must be a mapping")
    reader.unknown_keys(spec, {"idle_watts", "busy_watts", "node_watts", "cpu_watts"})
    return GpuPower(
        idle_watts=reader.number(spec, "idle_watts", 60.0, 0),
        busy_watts=reader.number(spec, "busy_watts", 300.0, 0),
        node_watts=reader.number(spec, "node_watts", 0.0, 0),
        cpu_watts=reader.number(spec, "cpu_watts", 0.0, 0),
    )


def _group_nodes(
    reader: _Reader,
    group: Mapping[str, Any],
    defaults: Mapping[str, Any],
    group_index: int,
    first_index: int,
) -> list[Node]:
    reader.unknown_keys(group, _GROUP_FIELDS)
    pods = reader.integer(group, "pods", 1, 1)
    racks_per_pod = reader.integer(group, "racks_per_pod", 1, 1)
    nodes_per_rack = reader.integer(group, "nodes_per_rack", 1, 1)
    prefix = (
        reader.text(group, "prefix") if "prefix" in group else f"g{group_index}" * bool(group_index)
    )
    sep = "-" if prefix else ""
    nodes: list[Node] = []
    for pod in range(pods):
        for rack in range(racks_per_pod):
            rack_name = f"{prefix}{sep}rack-{pod * racks_per_pod + rack}"
            for _ in range(nodes_per_rack):
                number = first_index + len(nodes)
                name = f"{prefix}{sep}node-{number:04d}" if prefix else f"node-{number:04d}"
                fields = {"rack": rack_name, "pod": f"{prefix}{sep}pod-{pod}"}
                nodes.append(_node(reader, group, defaults, name, fields))
    return nodes


def _node(
    reader: _Reader,
    spec: Mapping[str, Any],
    defaults: Mapping[str, Any],
    name: str,
    where: Mapping[str, Any],
) -> Node:
    merged = _Mapping({**defaults, **spec})
    merged.line = getattr(spec, "line", 0)
    merged.key_lines = {**getattr(defaults, "key_lines", {}), **getattr(spec, "key_lines", {})}
    labels = reader.mapping(merged, "labels")
    try:
        return Node(
            name=name,
            gpus=reader.integer(merged, "gpus", 8, 0),
            gpu_type=reader.text(merged, "gpu_type", "H100"),
            rack=reader.text(where, "rack", "rack-0"),
            pod=reader.text(where, "pod", "pod-0"),
            cpus=reader.number(merged, "cpus", 64.0, 0),
            memory_gb=reader.number(merged, "memory_gb", 512.0, 0),
            nvlink_domain_size=reader.integer(merged, "nvlink_domain_size", 0, 0),
            labels={str(key): str(value) for key, value in labels.items()},
        )
    except ValueError as error:
        if isinstance(error, ConfigError):
            raise
        raise reader.fail(merged, None, str(error)) from None


def parse_tenants(text: str, source: str = "<tenants>") -> dict[str, Tenant]:
    """Parse a tenants file (``tenants: [{name, quota, borrow_limit, weight, cpu_quota,
    memory_quota_gb}]``)."""
    data = load_mapping(text, source)
    _Reader(source).unknown_keys(data, {"tenants"})
    return tenants_from(data, source)


def tenants_from(data: Mapping[str, Any], source: str) -> dict[str, Tenant]:
    """The ``tenants`` list of a loaded file (a tenants file, or a configuration's section)."""
    reader = _Reader(source)
    tenants: dict[str, Tenant] = {}
    for entry in reader.items(data, "tenants"):
        reader.unknown_keys(
            entry, {"name", "quota", "borrow_limit", "weight", "cpu_quota", "memory_quota_gb"}
        )
        name = reader.text(entry, "name")
        if name in tenants:
            raise reader.fail(entry, "name", f"tenant {name!r} is listed twice")
        quota = reader.mapping(entry, "quota")
        borrow = reader.mapping(entry, "borrow_limit")
        tenants[name] = Tenant(
            name=name,
            quota={str(k): reader.integer(quota, k, 0, 0) for k in quota},
            borrow_limit={str(k): reader.integer(borrow, k, 0, 0) for k in borrow},
            weight=reader.number(entry, "weight", 1.0, 1e-9),
            cpu_quota=_optional(reader, entry, "cpu_quota"),
            memory_quota_gb=_optional(reader, entry, "memory_quota_gb"),
        )
    return tenants


def _optional(reader: _Reader, entry: Mapping[str, Any], key: str) -> float | None:
    """A non-negative number, or None when the key is absent (no cap)."""
    return reader.number(entry, key, 0.0, 0.0) if key in entry else None
