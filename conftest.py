"""Settings for every test suite of this repository (core and all adaptors).

lpq plans int8 formats for the CPU it runs on (``lpq.cpu_features()``), and CI may run on
an AVX2-only or an AVX-512 VNNI machine. So that a test's plan never depends on which, the
suite plans as for an AVX2-only x86 CPU unless ``LPQ_CPU_FLAGS`` is already set: those
formats (7-bit weights for u8 x s8 kernels) are correct on every x86 CPU. A test that needs
another plan says so with ``@pytest.mark.cpu_flags(...)``; one whose result depends on the
real CPU's kernels adds ``hardware=True`` and is skipped, with the reason, elsewhere.

The conformance suite runs strict (``LPQ_CONFORMANCE_STRICT=1``): checks that warn third
parties for one minor release are failures for the adaptors of this repository.
"""

from __future__ import annotations

import os

os.environ.setdefault("LPQ_CPU_FLAGS", "avx2")
# The conformance suite's newest checks warn for one minor release before they fail;
# this repository's own adaptors must already pass them.
os.environ.setdefault("LPQ_CONFORMANCE_STRICT", "1")
