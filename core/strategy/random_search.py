"""``random``: random per-op choices (seeded), within the budget."""

from __future__ import annotations

from .base import Candidate, Proposals, Strategy, TuningContext, one


class RandomStrategy(Strategy):
    name = "random"
    option_names = frozenset({"fallback_rate"})
    #: Samples proposed at once (independent, so they may run in parallel).
    batch = 4

    def propose(self, ctx: TuningContext) -> Proposals:
        space = ctx.space
        fallback_rate = float(self.options.get("fallback_rate", 0.2))
        yield from one(space.default(), "default")
        seen: set[str] = set()
        misses = 0
        while misses < 100:
            chunk: list[Candidate] = []
            while len(chunk) < self.batch and misses < 100:
                cfg = space.make(
                    {
                        key: space.fallback(key)
                        if ctx.rng.random() < fallback_rate
                        else ctx.rng.choice(space.choices[key])
                        for key in space.tunable_ops
                    }
                )
                if cfg.fingerprint() in seen:
                    misses += 1
                    continue
                seen.add(cfg.fingerprint())
                chunk.append(Candidate(cfg, "random"))
            if chunk:
                yield chunk
