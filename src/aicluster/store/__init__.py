"""store layer (see docs/architecture.md)."""

__all__: list[str] = []
