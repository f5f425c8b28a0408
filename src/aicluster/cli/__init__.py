"""The ``aicluster`` command line (Typer + Rich), thin over the library and the API client."""

__all__: list[str] = []
