"""``nft`` run inside a job's namespace.

nftables' rules are sent with the ``nft`` program: pyroute2's nftables support builds rules
expression by expression, and Debian's Python binding of libnftables is not on the package index.
``nft`` has no option for another namespace and Python 3.11 has no ``os.setns``, so the command
runs under ``nsenter --net=/run/netns/<name>`` (util-linux), which enters the namespace and
execs ``nft``: one short process per change.
"""

from __future__ import annotations

import shutil
import subprocess

__all__ = ["NftError", "netns_path", "nft", "nft_available"]

NSENTER = shutil.which("nsenter") or "/usr/bin/nsenter"
NFT = shutil.which("nft") or "/usr/sbin/nft"
NETNS_DIR = "/run/netns"
_TIMEOUT_S = 10.0


class NftError(RuntimeError):
    """``nft`` refused the rules or the command (its message)."""


def nft_available() -> bool:
    return (
        shutil.which("nft") is not None or shutil.which("nft", path="/usr/sbin:/sbin") is not None
    )


def netns_path(netns: str) -> str:
    return f"{NETNS_DIR}/{netns}"


def nft(netns: str, *args: str, text: str | None = None) -> str:
    """Run ``nft args`` (``-f -`` with ``text`` on its input) in ``netns``; its output."""
    argv = [NSENTER, f"--net={netns_path(netns)}", NFT, *args]
    if text is not None:
        argv += ["-f", "-"]
    done = subprocess.run(
        argv, input=text, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        raise NftError(f"nft {' '.join(args)} in {netns}: {done.stderr.strip()}")
    return done.stdout
