"""A test job: checks that its dataset ``--name`` (``aicluster.train.dataset``) holds the files
whose digest is ``--digest`` (SHA-256 over ``path NUL sha256(bytes)`` lines, sorted) and cannot
be written; with ``--probe PATH``, fails (exit 3) if it can read PATH (another tenant's data)."""

import argparse
import hashlib
import sys
from pathlib import Path

from aicluster import train

parser = argparse.ArgumentParser()
parser.add_argument("--name", required=True)
parser.add_argument("--digest", required=True)
parser.add_argument("--probe", default=None)
args = parser.parse_args()

root = train.dataset(args.name)
lines = sorted(
    f"{path.relative_to(root).as_posix()}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n"
    for path in root.rglob("*")
    if path.is_file()
)
found = hashlib.sha256("".join(lines).encode()).hexdigest()
if found != args.digest:
    sys.exit(f"dataset {args.name} at {root} holds other files: {lines}")
try:
    (root / "written-by-a-rank").write_text("x")
except OSError:
    pass
else:
    sys.exit(f"dataset {args.name} at {root} is writable")
if args.probe:
    try:
        Path(args.probe).read_bytes()
    except OSError as error:
        print(f"cannot read {args.probe}: {error}", flush=True)
    else:
        print(f"read another tenant's data at {args.probe}", flush=True)
        sys.exit(3)
print(f"read {len(lines)} files of {args.name} at {root}", flush=True)
