"""The numbers the latency search decides by, in one place (:class:`Rules`).

Kept apart from the search so that a backend can carry its own rules (lpq-onnxrt's
``RULES``: the constants its decisions on real models were measured with) by importing
this small module, and so that every threshold the steps use is named once, with the
reason for its value beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A change towards float must make the model this much faster (plus the noise) to be kept.
DEFAULT_MARGIN = 0.03
#: A plan taking less than this share of the fp32 time is kept without further search.
CLEAR_WIN = 0.8
#: Rounds of blamed ops (or of segments: halves, quarters, ...) after the op-type step.
BLAME_ROUNDS = 2


@dataclass(frozen=True)
class Rules:
    """The numbers the search decides by (core's defaults; a backend may carry its own as
    a ``rules`` attribute, and :func:`decide`'s keyword arguments override both)."""

    #: a change towards float must win by this much (plus the noise)
    margin: float = DEFAULT_MARGIN
    #: step 1 (plan against fp32) and its shortcut; None: no such step
    clear_win: float | None = CLEAR_WIN
    #: at most this many blame rounds (or segment rounds)
    blame_rounds: int = BLAME_ROUNDS
    #: a blame round measured this share slower than the plan it must beat ends the
    #: rounds; a wash (within it) is built on
    blame_slower: float = 0.01
    #: without a profiler: contiguous segments of the ops still quantized (step 5)
    segments: bool = True
    #: fp32 must beat the result by this in step 8 (None: by the margin)
    final_margin: float | None = 0.0
    #: step 8: the result must be measured faster than fp32 to be kept
    float_unless_faster: bool = False
    #: (with error()) an alternative mode is kept when at most this much slower and more
    #: faithful; a faster but less faithful change must win by this much
    tie: float = 0.10
    #: (with error()) a change that buys no speed must cut the output error by this share
    fidelity_noise: float = 0.1
    #: (with error()) a change a little slower (``tie``) is kept below this error share
    fidelity_halves: float = 0.5
    #: (with error()) a faster change this much less faithful needs a clear win (``tie``)
    fidelity_slack: float = 0.05
    #: (with error()) step 7 for models with at most this many quantized ops left ...
    fidelity_max_ops: int = 16
    #: ... for the ops that alone in float cut the output error by this share
    fidelity_gain: float = 0.2
    #: (with slowdown()) an op type predicted this much slower in float stays quantized
    predicted_slower: float = 0.2
    #: (with gain_bound()) an op type whose move to float can make the model faster by at
    #: most this share of the margin stays quantized untimed, unless (with error()) it
    #: cuts the output error enough to be kept for fidelity alone; None: always timed
    least_gain: float | None = None
    #: keep every candidate built for the whole search (False: only each variant's plan
    #: as asked; large models then do not pile up in memory)
    keep_builds: bool = True
