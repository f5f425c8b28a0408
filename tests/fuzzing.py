"""How many examples a fuzz test tries. The suite (``make test``, CI) runs the number each test
gives; ``make fuzz`` multiplies them by ``AICLUSTER_FUZZ_SCALE`` (4 unless set) for a deeper run
before a release or after a change to a parser. Hypothesis draws new examples on every run that
is not derandomized, so the suite's runs add up too."""

from __future__ import annotations

import os

#: The multiplier of every fuzz test's examples (1: the suite's).
SCALE = float(os.environ.get("AICLUSTER_FUZZ_SCALE", "1"))


def examples(suite: int) -> int:
    """The examples to try: ``suite`` in the suite, scaled under ``make fuzz``."""
    return max(1, round(suite * SCALE))
