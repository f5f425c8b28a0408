"""nftables inside a job's namespace, through libnftables (the library of the ``nft`` program,
Debian's ``libnftables1``, installed with ``nftables``), from a thread in that namespace.

The library parses the same text ``nft -f`` reads and sends it in one netlink transaction. It
is called through ctypes because its Python binding is Debian's, not on the package index, and
pyroute2's nftables support builds rules expression by expression; a library call in a thread
(:mod:`.nsthread`) also spares an ``nsenter nft`` process per change.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

from aicluster.runtime.jobnet.nsthread import in_netns

__all__ = ["NftError", "nft", "nft_here"]

_LIBRARY = "libnftables.so.1"
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


class NftError(RuntimeError):
    """nftables refused the rules or the command (its message)."""


def _library() -> ctypes.CDLL:
    global _lib
    with _lock:
        if _lib is None:
            lib = ctypes.CDLL(ctypes.util.find_library("nftables") or _LIBRARY)
            lib.nft_ctx_new.restype = ctypes.c_void_p
            lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
            for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error", "nft_ctx_free"):
                getattr(lib, name).argtypes = [ctypes.c_void_p]
            lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
                getattr(lib, name).restype = ctypes.c_char_p
                getattr(lib, name).argtypes = [ctypes.c_void_p]
            _lib = lib
        return _lib


def nft_here(text: str) -> str:
    """Run ``text`` (``nft -f`` input, or one command) in this thread's namespace; the output."""
    lib = _library()
    ctx = lib.nft_ctx_new(0)  # its netlink socket opens here: in this thread's namespace
    if not ctx:
        raise NftError("nft_ctx_new failed")
    try:
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        failed = lib.nft_run_cmd_from_buffer(ctx, text.encode())
        output = (lib.nft_ctx_get_output_buffer(ctx) or b"").decode()
        error = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode()
    finally:
        lib.nft_ctx_free(ctx)
    if failed:
        raise NftError(error.strip() or f"nftables refused: {text[:200]}")
    return output


def nft(netns: str, *args: str, text: str | None = None) -> str:
    """``nft args`` (or the ``text`` of ``nft -f``) in the named namespace; its output."""
    command = text if text is not None else " ".join(args)
    return in_netns(netns, lambda: nft_here(command))
