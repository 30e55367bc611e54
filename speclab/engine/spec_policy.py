"""How many drafts per step: fixed k, vLLM's k-by-batch-size table, or an adaptive policy of ours.

Speculation trades compute for fewer sequential steps. At batch 1 a decode step is memory-bound and
verifying k extra tokens is nearly free; at a large batch the forward is compute-bound and every
rejected draft costs real time (Leviathan et al. 2023, section 3.4: speculation needs spare
compute). So the best k falls with the batch size, to 0 somewhere. Three policies, one interface
(`num_drafts(batch_size) -> k for this step`), consulted by the model runner before it drafts:

- `FixedK`: always k (vLLM's `num_speculative_tokens`).
- `BatchSizeSchedule`: vLLM's dynamic speculative decoding (PR #32374), the speculative_config key
  `num_speculative_tokens_per_batch_size`: inclusive batch-size ranges -> k, 0 = off; a batch size in
  a gap takes the k of the range below it; k never exceeds num_speculative_tokens.
- `AdaptivePolicy` (speclab's): each step picks the k in 0..k_max that maximizes predicted tokens per
  second, lesson 02's cost model fed with live numbers measured by the engine:
      tokens per step   B * (1 + f * (alpha + alpha^2 + ... + alpha^k))
      seconds per step  T_target(B * (1 + f * k)) + k * (d0 + d1 * B)
  alpha: Leviathan's per-token acceptance, measured (EMA) from the spec-decode counters; f: the share
  of requested draft slots the proposer filled (an n-gram finds no match sometimes); T_target(N) =
  a + b * N: a least-squares line through recent decode steps (N tokens, seconds); d0 + d1 * B: the
  drafter's seconds per draft position. While k = 0 wins nothing new is learned about alpha, so it
  probes k_max one step in `probe_every`. SGLang's adaptive steps (EMA of accept length with
  hysteresis) are the nearest published relative; this one also weighs the measured costs.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class SpecPolicy:
    """Base: k_max always. `observe` receives each step's measurements (ignored here)."""

    def __init__(self, k_max: int):
        self.k_max = k_max
        self.history: deque[int] = deque(maxlen=100_000)  # the k chosen at recent drafting steps (lessons plot it)
        self.batch_sizes: deque[int] = deque(maxlen=100_000)  # the batch size each was chosen for

    def num_drafts(self, batch_size: int) -> int:
        return self.k_max

    def choose(self, batch_size: int) -> int:
        k = self.num_drafts(batch_size)
        self.history.append(k)
        self.batch_sizes.append(batch_size)
        return k

    def observe(self, *, num_tokens: int, decode_only: bool, target_seconds: float, batch_size: int,
                num_drafted: int, num_requested: int, k: int, draft_seconds: float, stats) -> None:
        """One step's measurements (the engine calls this after every step that drafted or decoded)."""


class FixedK(SpecPolicy):
    pass


class BatchSizeSchedule(SpecPolicy):
    """Args:
        k_max: num_speculative_tokens.
        table: [(start, end, k), ...] sorted, inclusive, non-overlapping (spec_config checks it).
    """

    def __init__(self, k_max: int, table: list[tuple[int, int, int]]):
        super().__init__(k_max)
        self.table = sorted(table)

    def num_drafts(self, batch_size: int) -> int:
        k = self.k_max  # below the first range: the startup k
        for start, end, k_range in self.table:
            if batch_size < start:
                break
            k = k_range  # inside the range, or in the gap after it (gaps inherit the previous k)
        return min(self.k_max, k)


class AdaptivePolicy(SpecPolicy):
    """Args:
        k_max: the most drafts per step (num_speculative_tokens).
        window: recent decode steps the cost line is fitted on.
        probe_every: while k = 0 wins, one step in this many drafts k_max to keep alpha measured.
        ema: decay per step of the alpha and fill averages (about the last 1 / ema steps count).
        warmup: first decode steps alternate k_max and 0, so both costs are measured before choosing.
        hysteresis: keep the previous step's k unless another is predicted this much faster.
    """

    def __init__(self, k_max: int, window: int = 256, probe_every: int = 16, ema: float = 0.05, warmup: int = 8,
                 hysteresis: float = 0.03):
        super().__init__(k_max)
        self.probe_every, self.ema, self.warmup, self.hysteresis = probe_every, ema, warmup, hysteresis
        self.target = deque(maxlen=window)  # (N tokens, seconds) of decode-only steps
        self.draft = deque(maxlen=window)  # (B, seconds per draft position)
        self.alpha: float | None = None
        self.fill = 1.0
        self._last = (0, 0)  # (accepted, positions tested) at the previous observation
        self._acc = self._tested = 0.0
        self._since_probe = 0
        self._steps = 0
        self._decided: int | None = None

    # -- measurements ------------------------------------------------------------------------

    def observe(self, *, num_tokens, decode_only, target_seconds, batch_size, num_drafted, num_requested, k,
                draft_seconds, stats) -> None:
        if decode_only and num_tokens:
            self.target.append((num_tokens, target_seconds))
            self._steps += 1
        if k > 0 and num_requested:
            self.draft.append((batch_size, draft_seconds / k))
            self.fill += self.ema * (num_drafted / num_requested - self.fill)
        if stats is not None:
            acc, tested = stats.num_accepted_tokens, stats.num_positions_tested
            d_acc, d_tested = acc - self._last[0], tested - self._last[1]
            self._last = (acc, tested)
            if d_tested > 0:  # decayed sums of accepted and tested positions: a step weighs by its drafts
                self._acc = (1 - self.ema) * self._acc + d_acc
                self._tested = (1 - self.ema) * self._tested + d_tested
                self.alpha = self._acc / self._tested

    # -- the model -----------------------------------------------------------------------------

    @staticmethod
    def _line(points) -> tuple[float, float]:
        """(intercept, slope >= 0) of a line through the medians of (x, y) points grouped by x.

        Medians, not means: on a shared machine a few steps are slowed by other work (or, in the
        server, by the other threads), and one 10x outlier must not tilt the line.
        """
        groups: dict = {}
        for x, y in points:
            groups.setdefault(x if x <= 16 else 1 << (int(x) - 1).bit_length(), []).append(y)  # x > 16: by power of 2
        xs = np.array(sorted(groups), dtype=np.float64)
        ys = np.array([np.median(groups[x]) for x in sorted(groups)])
        w = np.sqrt([len(groups[x]) for x in sorted(groups)])
        if len(xs) == 1:
            return float(ys[0]), 0.0  # one x seen: no slope to fit yet
        slope, intercept = np.polyfit(xs, ys, 1, w=w)
        slope = max(float(slope), 0.0)
        return max(float(np.median(ys - slope * xs)) if intercept < 0 else float(intercept), 0.0), slope

    def fit(self) -> dict:
        """The live cost model: T_target(N) = a + b N and the drafter's d0 + d1 B seconds per position."""
        a, b = self._line(self.target)
        d0, d1 = self._line(self.draft) if self.draft else (0.0, 0.0)
        return {"a": a, "b": b, "d0": d0, "d1": d1, "alpha": self.alpha or 0.0, "fill": self.fill}

    @staticmethod
    def predicted_throughput(model: dict, batch_size: int, k: int) -> float:
        """Tokens per second at this batch size with k drafts per request, under a fitted `model`."""
        accepted = sum(model["alpha"] ** i for i in range(1, k + 1))
        tokens = batch_size * (1 + model["fill"] * accepted)
        seconds = (model["a"] + model["b"] * batch_size * (1 + model["fill"] * k)
                   + k * (model["d0"] + model["d1"] * batch_size))
        return tokens / seconds if seconds > 0 else 0.0

    def num_drafts(self, batch_size: int) -> int:
        """The k for this step (call once per step: it advances the probe counter and the hysteresis)."""
        if self._steps < self.warmup or self.alpha is None or len(self.target) < 4:
            return self.k_max if len(self.history) % 2 == 0 else 0  # warm-up: measure both regimes
        model = self.fit()
        tput = [self.predicted_throughput(model, batch_size, k) for k in range(self.k_max + 1)]
        best = max(range(self.k_max + 1), key=lambda k: tput[k])
        prev = self._decided if self._decided is not None else best
        if tput[best] < (1 + self.hysteresis) * tput[prev]:
            best = prev  # hysteresis: switch only for a clear predicted gain (the fit is noisy)
        self._decided = best  # (a probe below is not a decision)
        if best == 0:
            self._since_probe += 1
            if self._since_probe >= self.probe_every:
                self._since_probe = 0
                return self.k_max
        else:
            self._since_probe = 0
        return best
