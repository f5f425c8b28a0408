"""This process's random number generator states as JSON, so a resumed run draws the same numbers.

Covers torch's CPU generator, the current CUDA device's generator, Python's ``random`` and (when
the job imported it) NumPy's legacy global generator. Generators a script makes itself
(``torch.Generator()``) are the script's business: derive them from (seed, step) or pass their
state in ``extra``. JSON rather than pickle so that loading a checkpoint never runs code.
"""

from __future__ import annotations

import base64
import random
import sys
from typing import Any

import torch

__all__ = ["capture_rng", "restore_rng"]


def capture_rng(device: torch.device | None = None) -> dict[str, Any]:
    """The current states, JSON-serializable."""
    version, mt_state, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(mt_state), "gauss_next": gauss_next},
        "torch": _b64(torch.get_rng_state()),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = _b64(torch.cuda.get_rng_state(device))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = {
            "name": str(name),
            "keys": [int(key) for key in keys],
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    return state


def restore_rng(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Set the generators from :func:`capture_rng`'s output; raises ``ValueError`` if malformed."""
    try:
        python = state["python"]
        random.setstate((python["version"], tuple(python["state"]), python["gauss_next"]))
        torch.set_rng_state(_unb64(state["torch"]))
        if "cuda" in state and device is not None and device.type == "cuda":
            torch.cuda.set_rng_state(_unb64(state["cuda"]), device)
        if "numpy" in state:
            import numpy

            saved = state["numpy"]
            keys = numpy.asarray(saved["keys"], dtype=numpy.uint32)
            numpy.random.set_state(
                (saved["name"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"])
            )
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"malformed RNG state in checkpoint: {error}") from error


def _b64(tensor: torch.Tensor) -> str:
    return base64.b64encode(bytes(tensor.cpu().tolist())).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
