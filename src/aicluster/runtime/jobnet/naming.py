"""Names of a job's network on a node: its namespace, the host's end of its veth pair.

Linux limits interface names to 15 characters, so names cannot carry a job id; they carry a
hash of the job id, the attempt and the member (which of the job's namespaces on the bridge: 0
on a node; the tests put two "nodes" of one job on one bridge). The same key gives the same
names on every call, which is how a restarted launcher finds what it made. A collision of two
keys' hashes (40 bits) is caught by the registry (:mod:`.registry`), which then takes the next
``salt``: names stay unique on the node.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = ["JOB_IFNAME", "TOKEN_PATTERN", "JobNetKey", "JobNetNames", "names_for", "valid_prefix"]

# The interface inside every job's namespace: its own namespace, so one name serves all, and a
# rank's GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME can be this constant.
JOB_IFNAME = "job0"
_IFNAME_MAX = 15  # IFNAMSIZ - 1
_TOKEN_CHARS = 10  # 40 bits of the hash
TOKEN_PATTERN = f"[0-9a-f]{{{_TOKEN_CHARS}}}"  # what follows the prefix in every name
_PREFIX = re.compile(r"^[a-z][a-z0-9]{0,4}$")  # prefix + token fits an interface name


@dataclass(frozen=True)
class JobNetKey:
    """Which network: a job's attempt, and which of its namespaces on this bridge."""

    job_id: str
    attempt: int
    member: int = 0

    def __post_init__(self) -> None:
        if not self.job_id:
            raise ValueError("a job network needs a job id")
        if self.attempt < 0 or self.member < 0:
            raise ValueError(f"attempt and member must be >= 0: {self}")

    def label(self) -> str:
        return f"{self.job_id}/{self.attempt}/{self.member}"


@dataclass(frozen=True)
class JobNetNames:
    """The kernel objects' names: ``netns`` (under /run/netns) and the host's veth end."""

    netns: str
    host_link: str


def valid_prefix(prefix: str) -> bool:
    """Whether ``prefix`` can start this module's names (a lower-case letter, then at most four
    lower-case letters or digits)."""
    return _PREFIX.match(prefix) is not None


def names_for(key: JobNetKey, prefix: str, salt: int = 0) -> JobNetNames:
    """The names of ``key``'s network under ``prefix`` (``salt`` > 0 only after a collision)."""
    if not valid_prefix(prefix):
        raise ValueError(f"prefix {prefix!r}: a lower-case letter, then up to 4 letters/digits")
    digest = hashlib.blake2b(
        f"{key.job_id}\0{key.attempt}\0{key.member}\0{salt}".encode(),
        digest_size=8,
        person=b"aicluster-jobnet",
    ).hexdigest()[:_TOKEN_CHARS]
    host_link = f"{prefix}{digest}"
    assert len(host_link) <= _IFNAME_MAX
    return JobNetNames(netns=f"{prefix}-{digest}", host_link=host_link)
