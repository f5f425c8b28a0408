"""The sandbox's seccomp filter: the system calls a training or serving job never needs, refused.

A job already runs as an unprivileged uid with no capabilities and no new privileges
(``_sandbox_entry.py``), so most of these would fail anyway; the filter keeps the kernel code
behind them out of a hostile job's reach (a kernel bug there is a way out of every other
boundary). The list follows Docker's default profile where it refuses without a capability:

- debugging and reading other processes: ``ptrace``, ``process_vm_readv``/``writev``, ``kcmp``;
- namespaces and mounts (the sandbox made them; a job makes none): ``unshare``, ``setns``,
  ``mount``, ``umount2``, ``pivot_root``, and ``clone`` with a namespace flag;
- the kernel's keyrings, BPF programs and performance counters: ``keyctl``, ``add_key``,
  ``request_key``, ``bpf``, ``perf_event_open``;
- modules, kexec, reboot, swap, accounting, quotas, clocks, I/O ports, ``userfaultfd``,
  file handles (``open_by_handle_at`` reads any file by inode), ``lookup_dcookie``.

Refused with EPERM, as a missing permission would be, so a library that probes falls back.
``clone3`` (whose flags sit in memory a filter cannot read) and ``io_uring`` answer ENOSYS, as
on a kernel without them: glibc then forks with ``clone``, whose flags the filter checks. NUMA
calls (``mbind``, ``set_mempolicy``) stay allowed: training pins memory to its GPU's node.

libseccomp (through ``pyseccomp``) compiles the list to a BPF program for this machine's
architecture; ``_sandbox_entry.py`` installs it just before it execs the job.
"""

from __future__ import annotations

import errno
import functools
import tempfile

__all__ = ["ENOSYS_SYSCALLS", "NAMESPACE_FLAGS", "REFUSED_SYSCALLS", "filter_program"]

#: Refused with EPERM (see the module docstring for why each group).
REFUSED_SYSCALLS = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
    "userfaultfd",
    "open_by_handle_at",
    "name_to_handle_at",
    "lookup_dcookie",
    "syslog",
)
#: Answered ENOSYS: callers fall back to what the filter can check.
ENOSYS_SYSCALLS = ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register")
#: ``clone`` with any of these (new namespaces) is refused (linux/sched.h).
NAMESPACE_FLAGS = {
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}


@functools.cache
def filter_program() -> bytes:
    """The filter as a BPF program (``struct sock_filter`` records) for this architecture."""
    import pyseccomp as seccomp  # the node side only (runtime extra); libseccomp via ctypes

    refused, absent = seccomp.ERRNO(errno.EPERM), seccomp.ERRNO(errno.ENOSYS)
    syscall_filter = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in REFUSED_SYSCALLS:
        syscall_filter.add_rule(refused, name)
    for name in ENOSYS_SYSCALLS:
        syscall_filter.add_rule(absent, name)
    for flag in NAMESPACE_FLAGS.values():  # x86-64 and arm64 both pass the flags first
        syscall_filter.add_rule(refused, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    with tempfile.TemporaryFile() as program:  # libseccomp writes to a file descriptor
        syscall_filter.export_bpf(program)
        program.seek(0)
        return program.read()
