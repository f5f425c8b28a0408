"""Parsing untrusted YAML and JSON within bounds: nesting depth, node count, and YAML aliases.

A YAML alias (``*name``) stands for a whole earlier node, so a few hundred bytes of aliases to
aliases describe billions of values (the "billion laughs"); PyYAML composes recursively, so deep
nesting exhausts the stack. :class:`BoundedLoader` counts every node as it is composed, an alias
as the size of the node it names, and stops at the first node over a bound (with a
``ComposerError`` that has the line), before the rest of the text is even scanned.
:func:`json_shape_problem` checks already-decoded JSON the same way.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["BoundedLoader", "json_shape_problem"]


class BoundedLoader(yaml.SafeLoader):
    """A ``SafeLoader`` that refuses more than :attr:`max_nodes` nodes (aliases counted as the
    nodes they stand for), nesting deeper than :attr:`max_depth`, and, unless
    :attr:`allow_aliases` and :attr:`allow_tags`, any alias and any explicit tag. Subclass it
    to set the bounds."""

    max_depth = 32
    max_nodes = 10_000
    allow_aliases = False
    #: Explicit tags (``!!int``, ``!!timestamp``, ``!local``): PyYAML's constructors for them
    #: fail on odd values with IndexError, AttributeError...; without, they are refused.
    allow_tags = True
    #: What the text is, for messages ("a job spec").
    what = "this document"

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._anchor_sizes: dict[str, int] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        mark: Any = event.start_mark
        if isinstance(event, yaml.AliasEvent):
            if not self.allow_aliases:
                problem = f"aliases (*{event.anchor}) are not allowed in {self.what}"
                raise yaml.composer.ComposerError(None, None, problem, mark)
            self._count(self._anchor_sizes.get(str(event.anchor), 1), event)
            return super().compose_node(parent, index)
        tag = getattr(event, "tag", None)
        if not self.allow_tags and tag not in (None, "!"):
            problem = f"tags ({tag}) are not allowed in {self.what}"
            raise yaml.composer.ComposerError(None, None, problem, mark)
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                problem = f"nested deeper than {self.max_depth} levels"
                raise yaml.composer.ComposerError(None, None, problem, mark)
            before = self._nodes
            self._count(1, event)
            node = super().compose_node(parent, index)
            if getattr(event, "anchor", None) is not None:
                self._anchor_sizes[str(event.anchor)] = self._nodes - before
            return node
        finally:
            self._depth -= 1

    def _count(self, nodes: int, event: Any) -> None:
        self._nodes += nodes
        if self._nodes > self.max_nodes:
            problem = f"more than {self.max_nodes} values in {self.what}"
            raise yaml.composer.ComposerError(None, None, problem, event.start_mark)


def json_shape_problem(data: Any, max_depth: int, max_nodes: int) -> str | None:
    """What is out of bounds in decoded JSON ``data`` (values nested deeper than ``max_depth``,
    more than ``max_nodes`` values: containers, keys and scalars alike, as YAML counts them), or
    None. Iterative: no recursion however deep the data."""
    nodes = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            return f"more than {max_nodes} values"
        if depth > max_depth:
            return f"nested deeper than {max_depth} levels"
        if isinstance(value, dict | list):
            if isinstance(value, dict):
                nodes += len(value)  # the keys
            if nodes + len(value) > max_nodes:
                return f"more than {max_nodes} values"
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)
    return None
