"""Pickling for the dataclasses the compiled build (setup.py) compiles.

Compiled by mypyc, a class with its own ``__init__`` runs it when created, even through
``cls.__new__(cls)``, which is how pickle and copy rebuild an object (with no arguments it
fails); and a frozen one refuses the ``object.__setattr__`` of the ``__setstate__`` dataclasses
gives it. Such a class's ``__reduce__`` is :func:`rebuilt_by_init`: the object comes back from
its class called with its init fields, in order (the pure build does the same)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

__all__ = ["rebuilt_by_init"]


def rebuilt_by_init(obj: Any) -> tuple[type, tuple[object, ...]]:
    """``(type(obj), its init fields' values)``: what ``__reduce__`` returns to rebuild it."""
    return type(obj), tuple(getattr(obj, field.name) for field in fields(obj) if field.init)
