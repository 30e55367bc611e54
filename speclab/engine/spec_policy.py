"""How many drafts per step: fixed k, vLLM's k-by-batch-size table, or an adaptive policy of ours.

Speculation trades compute for fewer sequential steps. At batch 1 a decode step is memory-bound and
verifying k extra tokens is nearly free; at a large batch the forward is compute-bound and every
rejected draft costs real time (Leviathan et al. 2023, section 3.4: speculation needs spare
compute). So the best k falls with the batch size, to 0 somewhere. Three policies, one interface
(`k_for_batch_size(batch_size) -> k for this step`), consulted by the model runner before it drafts:

- `FixedK`: always k (vLLM's `num_speculative_tokens`).
- `BatchSizeSchedule`: vLLM's dynamic speculative decoding (PR #32374), the speculative_config key
  `num_speculative_tokens_per_batch_size`: inclusive batch-size ranges -> k, 0 = off; a batch size in
  a gap takes the k of the range below it; k never exceeds num_speculative_tokens.
- `AdaptivePolicy` (speclab's): each step picks the k in 0..k_max that maximizes predicted tokens per
  second, lesson 02's cost model fed with live numbers measured by the engine:
      tokens per step   B * (1 + f * (alpha + alpha^2 + ... + alpha^k))
      seconds per step  a + b * B * (1 + f * k) + c * B * s * [k > 0] + k * (d0 + d1 * B)
  alpha: Leviathan's per-token acceptance, measured (EMA) from the spec-decode counters; f: the share
  of requested draft slots the proposer filled (an n-gram finds no match sometimes) and s the share
  of requests that got any draft; a + b N + c R: the target step's seconds, fitted (non-negative
  least squares through medians) on recent decode steps of N tokens with R requests verifying drafts
  (a request with drafts costs more than its extra tokens: its attention runs the multi-token path);
  d0 + d1 * B: the drafter's seconds per draft position. While k = 0 wins nothing new is learned about alpha, so it
  probes k_max one step in `probe_every`. SGLang's adaptive steps (EMA of accept length with
  hysteresis) are the nearest published relative; this one also weighs the measured costs.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from scipy.optimize import nnls


class SpecPolicy:
    """Base: k_max always. `observe` receives each step's measurements (ignored here)."""

    def __init__(self, k_max: int):
        self.k_max = k_max
        self.history: deque[int] = deque(maxlen=100_000)  # the k chosen at recent drafting steps (lessons plot it)
        self.batch_sizes: deque[int] = deque(maxlen=100_000)  # the batch size each was chosen for

    def k_for_batch_size(self, batch_size: int) -> int:
        return self.k_max

    def choose(self, batch_size: int) -> int:
        k = self.k_for_batch_size(batch_size)
        self.history.append(k)
        self.batch_sizes.append(batch_size)
        return k

    def observe(self, **measurements) -> None:
        """One step's measurements (the engine calls this after every step; see AdaptivePolicy.observe)."""


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

    def k_for_batch_size(self, batch_size: int) -> int:
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
        probe_every: one step in this many probes the other regime (k_max while 0 wins, else 0).
        ema: decay per step of the alpha and fill averages (about the last 1 / ema steps count).
        warmup: first decode steps alternate k_max and 0, so both costs are measured before choosing.
        hysteresis: keep the previous step's k unless another is predicted this much faster.
    """

    def __init__(self, k_max: int, window: int = 256, probe_every: int = 16, ema: float = 0.05, warmup: int = 8,
                 hysteresis: float = 0.03):
        super().__init__(k_max)
        self.probe_every, self.ema, self.warmup, self.hysteresis = probe_every, ema, warmup, hysteresis
        self.target = deque(maxlen=window)  # (N tokens, R requests verifying drafts, seconds) of decode-only steps
        self.draft = deque(maxlen=window)  # (B, seconds per draft position)
        self.alpha: float | None = None
        self.fill = 1.0  # drafted / requested draft slots
        self.share = 1.0  # share of decoding requests that got any draft
        self._last = (0, 0)  # (accepted, positions tested) at the previous observation
        self._acc = self._tested = 0.0
        self._since_probe = 0
        self._steps = 0
        self._decided: int | None = None
        self._model: dict | None = None
        self._fitted_at = 0
        self.refit_every = 8

    # -- measurements ------------------------------------------------------------------------

    def observe(self, *, num_tokens, decode_only, target_seconds, batch_size, num_drafted, num_requested, k,
                draft_seconds, stats, num_verifying=0, num_with_drafts=0) -> None:
        """Args:
            num_tokens, target_seconds: the step's scheduled tokens N and the runner's time for them.
            decode_only: every scheduled request was decoding (no prefill chunk): a point for T_target.
            num_verifying: requests that verified at least one draft this step (R).
            batch_size, k: the decoding requests and the k chosen for their next drafts.
            num_drafted, num_requested, num_with_drafts: drafts proposed, k x batch_size, requests given any.
            draft_seconds: the proposer's time.  stats: the engine's SpecDecodingStats.
        """
        if decode_only and num_tokens:
            self.target.append((num_tokens, num_verifying, target_seconds))
            self._steps += 1
        if k > 0 and num_requested:
            self.draft.append((batch_size, draft_seconds / k))
            self.fill += self.ema * (num_drafted / num_requested - self.fill)
            self.share += self.ema * (num_with_drafts / batch_size - self.share)
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
    def _bins(x: float) -> float:
        return x if x <= 16 else float(1 << (int(x) - 1).bit_length())  # exact up to 16, then powers of 2

    @classmethod
    def _robust_fit(cls, rows, columns: int) -> np.ndarray:
        """Non-negative least squares of y on [1, x1, ...] through the medians of points grouped by
        (binned) x. Medians, not means: on a shared machine a few steps are slowed by other work (or,
        in the server, by its other threads), and one 10x outlier must not tilt the fit."""
        groups: dict = {}
        for row in rows:
            groups.setdefault(tuple(cls._bins(x) for x in row[:columns]), []).append(row)
        keys = sorted(groups)
        med = [np.median(np.array(groups[key], dtype=np.float64), axis=0) for key in keys]  # per group: x's and y
        X = np.array([[1.0, *m[:columns]] for m in med])
        y = np.array([m[columns] for m in med])
        w = np.sqrt([len(groups[key]) for key in keys])
        coef, _ = nnls(X * w[:, None], y * w)
        if len(keys) == 1:  # one shape seen: all of it is the intercept
            coef = np.array([y[0]] + [0.0] * columns)
        return coef

    def fit(self) -> dict:
        """The live cost model: T_target = a + b N + c R (N tokens, R requests verifying drafts: a
        request with drafts costs more than its tokens, e.g. a multi-token attention path) and the
        drafter's d0 + d1 B seconds per draft position."""
        a, b, c = self._robust_fit(self.target, 2)
        d0, d1 = self._robust_fit(self.draft, 1) if self.draft else (0.0, 0.0)
        return {"a": float(a), "b": float(b), "c": float(c), "d0": float(d0), "d1": float(d1),
                "alpha": self.alpha or 0.0, "fill": self.fill, "share": self.share}

    @staticmethod
    def predicted_throughput(model: dict, batch_size: int, k: int) -> float:
        """Tokens per second at this batch size with k drafts per request, under a fitted `model`."""
        accepted = sum(model["alpha"] ** i for i in range(1, k + 1))
        tokens = batch_size * (1 + model["fill"] * accepted)
        verifying = batch_size * model.get("share", 1.0) if k else 0.0
        seconds = (model["a"] + model["b"] * batch_size * (1 + model["fill"] * k) + model.get("c", 0.0) * verifying
                   + k * (model["d0"] + model["d1"] * batch_size))
        return tokens / seconds if seconds > 0 else 0.0

    def k_for_batch_size(self, batch_size: int) -> int:
        """The k for this step (call once per step: it advances the probe counter and the hysteresis)."""
        if self._steps < self.warmup or self.alpha is None or len(self.target) < 4:
            return self.k_max if len(self.history) % 2 == 0 else 0  # warm-up: measure both regimes
        if self._model is None or self._steps - self._fitted_at >= self.refit_every:
            self._model, self._fitted_at = self.fit(), self._steps  # (a fit costs ~1 ms: not every step)
        model = {**self._model, "alpha": self.alpha or 0.0, "fill": self.fill, "share": self.share}
        tput = [self.predicted_throughput(model, batch_size, k) for k in range(self.k_max + 1)]
        best = max(range(self.k_max + 1), key=lambda k: tput[k])
        prev = self._decided if self._decided is not None else best
        if tput[best] < (1 + self.hysteresis) * tput[prev]:
            best = prev  # hysteresis: switch only for a clear predicted gain (the fit is noisy)
        self._decided = best  # (a probe below is not a decision)
        self._since_probe += 1
        if self._since_probe >= self.probe_every:  # probe the other regime: keeps alpha (and the cost of
            self._since_probe = 0                   # a step without drafts, at this batch size) measured
            return self.k_max if best == 0 else 0
        return best
