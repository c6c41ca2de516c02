"""Recurrent models run as streams: find their state links in calibration data.

A streaming model (Silero VAD, a streaming ASR encoder, any RNN exported with its state as
an input and an output) is run chunk after chunk, each call fed the state the previous call
returned. Quantized, it carries its *own* state forward, so its error compounds from chunk
to chunk. Measured per calibration batch, each batch starting from the recorded fp32 state,
that compounding is invisible, and a choice made on it can be the wrong one: on Silero VAD
the kl ranges ranked last per chunk and first on held-out streams.

Calibration data for such a model is recorded from a stream: feed k+1's state input holds
what fp32 returned for feed k. That is how the links are found here, from the data and not
from names: an input is a state input when, in consecutive feeds, it equals (bit for bit,
up to float rounding) one float output of the previous feed. A feed whose state is not
what the previous feed returned (all zeros: a new stream) starts a new chain.

:func:`find` returns the links and the chains; :func:`iter_chains` runs a model over them
feeding its own state back, which is what :func:`lpq_onnxrt.latency.output_error` measures
for such models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Feed = Mapping[str, np.ndarray]
Runner = Callable[[Feed], Sequence[np.ndarray]]

#: Consecutive feeds looked at to find the links (the first ones of the calibration data).
PROBE_FEEDS = 16
#: An input is linked to an output when it continues it in at least this many feed pairs
#: (and in at least half of the pairs where the input holds anything but zeros).
MIN_MATCHES = 2


@dataclass(frozen=True)
class Streams:
    """Where the calibration feeds form streams.

    ``links`` maps each state input to the index of the output that feeds it on the next
    call; ``chains`` are runs of consecutive feed indices, each feed after a chain's first
    continuing the state of the one before it."""

    links: dict[str, int]
    chains: list[list[int]]

    def select(self, max_feeds: int) -> list[list[int]]:
        """Whole chains, evenly spaced over all of them, at most ``max_feeds`` feeds in all
        (when even one chain is longer, its first ``max_feeds`` feeds): errors compound
        along a chain, so a chain is never thinned out, only taken or left."""
        count = len(self.chains)
        for wanted in range(count, 0, -1):
            picked = [self.chains[int(i * count / wanted)] for i in range(wanted)]
            if sum(len(chain) for chain in picked) <= max_feeds:
                return picked
        return [self.chains[0][:max_feeds]]


def find(run: Runner, feeds: Sequence[Feed], probe: int = PROBE_FEEDS) -> Streams | None:
    """The state links and chains of ``feeds`` (in the order given), or None when the feeds
    are independent batches. ``run`` runs the fp32 model on one feed and returns all its
    outputs. The first ``probe`` feeds are run to find the links; only when there are
    some are the others run, to tell exactly where each stream continues."""
    head = list(feeds[:probe])
    if len(head) < MIN_MATCHES + 1:
        return None
    candidates = [
        name
        for name, value in head[0].items()
        if np.issubdtype(np.asarray(value).dtype, np.floating)
    ]
    if not candidates:
        return None
    outputs: list[list[np.ndarray]] = []
    # matches / misses per (state input, output index), pair by pair: feed k's outputs
    # against feed k+1's inputs. Feeds are run one at a time, and no more once no pair
    # can become a link whatever the remaining feeds hold (independent batches: ddddocr
    # det ran 8 of its 16 probe feeds, not all).
    counts: dict[tuple[str, int], list[int]] = {}
    pairs = len(head) - 1
    for k in range(pairs):
        outputs.append([np.asarray(value) for value in run(head[k])])
        for name in candidates:
            given = np.asarray(head[k + 1][name])
            if not np.any(given):
                continue  # a stream starts here; nothing to continue
            for index, returned in enumerate(outputs[k]):
                tally = counts.setdefault((name, index), [0, 0])
                tally[0 if _same(given, returned) else 1] += 1
        remaining = pairs - k - 1
        if all(
            matches + remaining < max(MIN_MATCHES, misses) for matches, misses in counts.values()
        ) and len(counts) == len(candidates) * len(outputs[0]):
            return None
    links: dict[str, int] = {}
    for name in candidates:
        for index in range(len(outputs[0])):
            matches, misses = counts.get((name, index), (0, 0))
            if matches >= MIN_MATCHES and matches >= misses:
                links[name] = index
                break
    if not links:
        return None
    outputs.append([np.asarray(value) for value in run(head[-1])])
    outputs += [[np.asarray(value) for value in run(feed)] for feed in feeds[len(head) :]]
    chains: list[list[int]] = []
    for k, feed in enumerate(feeds):
        continues = k > 0 and all(
            _same(np.asarray(feed[name]), outputs[k - 1][index]) for name, index in links.items()
        )
        if continues:
            chains[-1].append(k)
        else:
            chains.append([k])
    return Streams(links, chains)


def _same(given: np.ndarray, returned: np.ndarray) -> bool:
    return given.shape == returned.shape and bool(
        np.allclose(given, returned, rtol=1e-5, atol=1e-6)
    )


def iter_chains(
    run: Runner,
    feeds: Sequence[Feed],
    links: Mapping[str, int],
    chains: Sequence[Sequence[int]],
) -> Iterator[list[np.ndarray]]:
    """Outputs of a model over ``chains`` of ``feeds``, one call at a time, each call after
    a chain's first fed the state outputs (``links``: state input -> output index) of the
    model's own previous call, not the recorded fp32 state. Only the call a chain feeds its
    state from is held (an output error compares each call's outputs and drops them)."""
    for chain in chains:
        previous: list[np.ndarray] | None = None
        for k in chain:
            feed = dict(feeds[k])
            if previous is not None:
                for name, index in links.items():
                    feed[name] = previous[index]
            previous = [np.asarray(value) for value in run(feed)]
            yield previous
