"""A warm process (``_zygote.py``) started without Ray, on a launch channel of the test's own."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import IO

from aicluster.runtime.warm.launchchannel import bind_channel
from aicluster.runtime.warm.starter import zygote_command

#: What a launcher expects of a warm process this test user started: its own uid and gid.
OWN = (os.getuid(), os.getgid())


def start_zygote(
    folder: Path, preload: str, stderr: IO[bytes] | int | None = subprocess.DEVNULL
) -> tuple[Path, subprocess.Popen[bytes]]:
    """A warm process preloading ``preload``, listening on ``folder/channels/warm``; returns
    the channel and the process once it is ready (torch imported, listening)."""
    channel = folder / "channels" / "warm"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    with bind_channel(channel) as listener:
        command = zygote_command(listener.fileno(), "test", os.getuid(), preload)
        process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            pass_fds=(listener.fileno(),),
        )
    assert process.stdout is not None
    ready = process.stdout.readline()  # printed once the modules are imported and it listens
    assert b"ready" in ready, ready
    return channel, process
