"""Print the ``uv pip install`` flags that make uv install what pip would on this machine.

uv does not read pip's configuration, so ``make venv`` passes pip's own settings on (``pip config
list``: files and ``PIP_*`` variables): its index, extra indexes, find-links and constraints. uv
looks for a package on one index only unless told otherwise; pip takes the best match over all of
them, hence ``--index-strategy unsafe-best-match``. Run with the venv's Python (its pip).
"""

from __future__ import annotations

import shlex
import subprocess
import sys

#: pip's setting -> uv's flag (each value of a setting may list several, space-separated).
FLAGS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def pip_settings() -> dict[str, list[str]]:
    """Each setting's values as pip resolves them: an ``:env:`` value overrides the files'."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    found: dict[str, tuple[int, list[str]]] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        scope, _, name = key.rpartition(".")
        if name not in FLAGS or scope not in (":env:", "global", "install"):
            continue
        rank = 2 if scope == ":env:" else 1 if scope == "install" else 0
        if rank >= found.get(name, (-1, []))[0]:
            found[name] = (rank, shlex.split(value)[0].split() if value else [])
    return {name: values for name, (_, values) in found.items()}


def main() -> None:
    flags = ["--index-strategy", "unsafe-best-match"]
    for name, values in pip_settings().items():
        for value in values:
            flags += [FLAGS[name], value]
    print(shlex.join(flags))


if __name__ == "__main__":
    main()
