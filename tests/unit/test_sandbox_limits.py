"""The sandbox's kernel limits, attacked from inside a real sandbox (bubblewrap, the tenant's
uid), without Ray: the seccomp filter refuses what a job never needs (and a job still forks,
threads and runs a child), and ``/tmp`` and ``/dev/shm`` end at their size."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pyseccomp
import pytest
from serverproc import SANDBOX_REQUIRED

from aicluster.runtime.sandbox import bwrap as sandbox
from aicluster.runtime.sandbox.bwrap import SandboxSpec, bwrap_argv
from aicluster.runtime.sandbox.seccomp import ENOSYS_SYSCALLS, NAMESPACE_FLAGS, REFUSED_SYSCALLS

pytestmark = SANDBOX_REQUIRED

TENANT = 300_911

# Each attempt as a raw system call with harmless arguments (zeros, or the named ones): what
# matters is whether the kernel's handler is reached, which the errno tells.
ATTEMPTS = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
numbers, flags = json.loads(sys.argv[1]), json.loads(sys.argv[2])
args = {"ptrace": (0, 0, 0, 0), "unshare": (flags["CLONE_NEWUSER"],), "keyctl": (0, -3, 0)}
found = {}
for name, number in numbers.items():
    if name == "clone":  # below, with a namespace flag (without one it forks)
        continue
    ctypes.set_errno(0)
    result = libc.syscall(number, *args.get(name, (0, 0, 0, 0, 0, 0)))
    found[name] = ctypes.get_errno() if result == -1 else 0
# clone with CLONE_NEWUSER (a user namespace, then anything inside it), as fork's clone does
ctypes.set_errno(0)
result = libc.syscall(numbers["clone"], flags["CLONE_NEWUSER"] | 17, 0, 0, 0, 0)
if result == 0:
    os._exit(0)
found["clone(CLONE_NEWUSER)"] = ctypes.get_errno() if result == -1 else 0
print(json.dumps(found))
"""

# What a job does every day still works under the filter: fork, threads, a child process.
EVERYDAY = """
import os, subprocess, sys, threading
pid = os.fork()
if pid == 0:
    os._exit(7)
_, status = os.waitpid(pid, 0)
done = []
thread = threading.Thread(target=lambda: done.append(1))
thread.start(); thread.join()
child = subprocess.run([sys.executable, "-c", "print('child')"], capture_output=True, text=True)
print(os.waitstatus_to_exitcode(status), len(done), child.stdout.strip(), os.getuid())
"""

# Fills a tmpfs: how many MiB went in before the kernel said no, and what it said.
FILL = """
import errno, sys
written = 0
try:
    with open(sys.argv[1] + "/fill", "wb") as out:
        for _ in range(64):
            out.write(b"x" * (1 << 20)); out.flush(); written += 1
    print(written, "ok")
except OSError as error:
    print(written, errno.errorcode[error.errno])
"""


def run_inside(tmp_path: Path, code: str, *args: str, **sizes: int) -> str:
    spec = SandboxSpec(TENANT, TENANT, workdir="/tmp", writable=(), **sizes)
    command = [sys.executable, "-I", "-S", "-c", code, *args]
    done = subprocess.run(bwrap_argv(spec, command), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_seccomp_filter_refuses_what_a_job_never_needs(tmp_path: Path) -> None:
    arch = pyseccomp.system_arch()
    names = [*REFUSED_SYSCALLS, *ENOSYS_SYSCALLS, "clone"]
    numbers = {name: pyseccomp.resolve_syscall(arch, name) for name in names}
    numbers = {name: number for name, number in numbers.items() if number >= 0}  # this arch's
    out = run_inside(tmp_path, ATTEMPTS, json.dumps(numbers), json.dumps(NAMESPACE_FLAGS))
    found = json.loads(out)
    numbers.pop("clone")
    for name in numbers:
        expected = errno.ENOSYS if name in ENOSYS_SYSCALLS else errno.EPERM
        assert found[name] == expected, (name, errno.errorcode.get(found[name], found[name]))
    assert found["clone(CLONE_NEWUSER)"] == errno.EPERM


def test_a_job_still_forks_threads_and_runs_children_under_the_filter(tmp_path: Path) -> None:
    assert run_inside(tmp_path, EVERYDAY) == f"7 1 child {TENANT}"


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm"])
def test_tmp_and_shm_end_at_their_size(tmp_path: Path, where: str) -> None:
    four_mib = 4 << 20
    out = run_inside(tmp_path, FILL, where, tmp_bytes=four_mib, shm_bytes=four_mib)
    assert out in ("3 ENOSPC", "4 ENOSPC"), out  # 4 MiB in all, less what the file system keeps


def test_a_node_without_libseccomp_cannot_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> bytes:
        raise OSError("libseccomp.so.2: cannot open shared object file")

    monkeypatch.setattr(sandbox, "filter_program", missing)
    why = sandbox.probe()
    assert why is not None and "seccomp filter" in why and "libseccomp.so.2" in why
