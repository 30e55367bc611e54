"""Grades exercise 11 (interview code drills: verify_step from memory, ragged indices, a PromQL
dashboard, a k table from a cost curve). `pytest --impl=exercises tests/test_ex11_interview_drills.py`.

verify_step is compared token for token with `speclab.verify.rejection_sample` given the same
uniforms and noise (that reference is itself tested statistically, with negative controls, in
tests/test_01_verify_statistical.py), so a wrong rule fails here deterministically. The PromQL panels
are evaluated by a small evaluator of the PromQL subset a dashboard needs (below), on two scrapes of a
two-engine server one of whose engines restarted in between. Negative controls at the bottom grade the
grader (skipped under --impl=exercises)."""

import itertools
import math
import re

import pytest
import torch

from speclab.engine.spec_policy import BatchSizeSchedule
from speclab.spec_config import parse_batch_size_table
from speclab.verify import rejection_sample
from tests.helpers import fail_on

EXERCISE = "ex11_interview_drills"
pytestmark = pytest.mark.exercise


# ---------------------------------------------------------------------------------------------
# 1. verify_step, against the batched reference


def reference_verify(drafts, p, q, uniforms, noise):
    out = rejection_sample(torch.tensor(drafts, dtype=torch.long), [len(drafts)], p, q,
                           uniforms=uniforms, noise=noise[None])[0]
    return [int(t) for t in out if t >= 0]


def verify_cases():
    """(name, drafts, p, q, uniforms, noise): random cases plus the edge cases by name."""
    g = torch.Generator().manual_seed(11)
    cases = []
    for i in range(300):
        k, V = int(torch.randint(0, 6, (1,), generator=g)), int(torch.randint(2, 40, (1,), generator=g))
        p = (2 * torch.randn(k + 1, V, generator=g, dtype=torch.float64)).softmax(-1)
        q = (2 * torch.randn(k, V, generator=g, dtype=torch.float64)).softmax(-1) if i % 3 else None
        drafts = (torch.multinomial(q, 1, generator=g).flatten().tolist() if q is not None else
                  torch.randint(0, V, (k,), generator=g).tolist()) if k else []
        u = torch.rand(k, generator=g, dtype=torch.float64).clamp(1e-9, 1 - 1e-9)
        noise = torch.empty(V, dtype=torch.float64).exponential_(1.0, generator=g)
        cases.append((f"random case {i} (k={k}, V={V}, {'q given' if q is not None else 'one-hot drafts'})",
                      drafts, p, q, u, noise))
    V = 5
    flat = torch.full((3, V), 1 / V, dtype=torch.float64)
    one = torch.ones(V, dtype=torch.float64)
    cases.append(("k = 0: no drafts, only the bonus token from p_0", [], flat[:1], None,
                  torch.empty(0, dtype=torch.float64), torch.tensor([3.0, 1.0, 2.0, 0.5, 4.0], dtype=torch.float64)))
    tie = torch.tensor([[0.5, 0.5, 0, 0, 0], [0.1, 0.2, 0.3, 0.2, 0.2]], dtype=torch.float64)
    cases.append(("p/q equals u exactly (one-hot draft with p = 0.5, u = 0.5): accept (the test is p/q >= u)",
                  [1], tie, None, torch.tensor([0.5], dtype=torch.float64), one))
    qz = torch.tensor([[0.0, 1.0, 0, 0, 0]], dtype=torch.float64)
    cases.append(("q is zero on the drafted token: reject it (never divide by q = 0)", [0], flat[:2], qz,
                  torch.tensor([0.01], dtype=torch.float64), one))
    same = torch.tensor([[0.5, 0.5, 0, 0, 0]] * 2, dtype=torch.float64)
    cases.append(("p == q, drafted token impossible under both: rejected with an all-zero residual, so the "
                  "token comes from p", [3], same, same[:1], torch.tensor([0.3], dtype=torch.float64), one))
    return cases


def check_verify(m) -> str | None:
    for name, drafts, p, q, u, noise in verify_cases():
        want = reference_verify(drafts, p, q, u, noise)
        got = m.verify_step(list(drafts), p.clone(), None if q is None else q.clone(), u.clone(), noise.clone())
        got = [int(t) for t in got]
        if got != want:
            n, n_got = len(want) - 1, len(got) - 1
            if n_got != n:
                i = min(n, n_got)
                what = (f"draft {i} must be {'accepted' if n > i else 'rejected'}: accept iff q(x) > 0 and "
                        f"p(x)/q(x) >= u_i (>=, not >; with its own u_i, one per position; never p >= q alone)")
            elif n == len(drafts):
                what = ("all drafts accepted: the last token is the bonus, argmax p_k / noise (a sample from p_k "
                        "by the exponential race, not argmax p_k)")
            else:
                what = (f"draft {n} is rejected: the recovered token is argmax max(p_n - q_n, 0) / noise (the "
                        f"residual, not p; for one-hot drafts q_n is 1 at the draft)")
            return f"verify_step, {name}: drafts {list(drafts)}, want {want}, got {got}; {what}"
    return None


# ---------------------------------------------------------------------------------------------
# 2. ragged indices


VLLM_EXAMPLE = ([4, 104, 107, 207, 209], [3, 0, 2, 0, 1],
                {"cu_num_draft_tokens": [3, 3, 5, 5, 6], "logits_indices": [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208],
                 "target_logits_indices": [0, 1, 2, 5, 6, 9], "bonus_logits_indices": [3, 4, 7, 8, 10]})


def brute_indices(cu, k):
    """The same indices by enumerating every row of the forward (shares no arithmetic with a solution)."""
    rows, owner = [], []
    for r, end in enumerate(cu):
        start = cu[r - 1] if r else 0
        rows += list(range(start, end))
        owner += [r] * (end - start)
    needed = [t for t in rows if t >= cu[owner[t]] - 1 - k[owner[t]]]
    target = [i for i, t in enumerate(needed) if t != cu[owner[t]] - 1]
    bonus = [i for i, t in enumerate(needed) if t == cu[owner[t]] - 1]
    return {"cu_num_draft_tokens": list(itertools.accumulate(k)), "logits_indices": needed,
            "target_logits_indices": target, "bonus_logits_indices": bonus}


def check_indices(m) -> str | None:
    import random
    rng = random.Random(0)
    cases = [VLLM_EXAMPLE[:2] + ("vLLM's own example (gpu_model_runner)",), ([1], [0], "one request, no drafts"),
             ([5], [4], "one request, all its tokens but one are drafts")]
    for i in range(60):
        k = [rng.choice([0, 0, 1, 2, 3, 5]) for _ in range(rng.randint(1, 6))]
        n = [ki + 1 + rng.choice([0, 0, 0, 7, 30]) for ki in k]  # decodes (1 + k) and prefill chunks
        cases.append((list(itertools.accumulate(n)), k, f"random batch {i}"))
    for cu, k, what in cases:
        want = brute_indices(cu, k)
        got = m.spec_decode_indices(list(cu), list(k))
        for key in ("cu_num_draft_tokens", "logits_indices", "target_logits_indices", "bonus_logits_indices"):
            if [int(x) for x in got.get(key, [])] != want[key]:
                hint = {"cu_num_draft_tokens": "vLLM's cumsum is inclusive: no leading 0, one entry per request",
                        "logits_indices": "each request needs its last 1 + k_r rows, which end at cu[r] - 1",
                        "target_logits_indices": "these index into logits_indices (the gathered rows), not the "
                                                 "forward's rows: request r's block starts after the earlier "
                                                 "requests' 1 + k rows",
                        "bonus_logits_indices": "the bonus row is the last of each request's 1 + k_r rows: "
                                                "cu_num_draft_tokens[r] + r, not cu_num_draft_tokens[r]"}[key]
                return (f"spec_decode_indices({cu}, {k}) [{what}]: {key} should be {want[key]}, got "
                        f"{got.get(key)}; {hint}")
    return None


# ---------------------------------------------------------------------------------------------
# 3. PromQL: a small evaluator of the subset a dashboard needs, over two scrapes


class PromQLError(ValueError):
    pass


WINDOW_S = {"5m": 300, "10m": 600}


def scrapes(prefix):
    """(before, after) samples: {(metric, labels): value}. Engine 0 ran throughout; engine 1 restarted
    in between (its counters went down). In the window: 900 drafts, 2700 draft tokens, 1050 accepted,
    per position 600 / 300 / 150. Since start: 2850 accepted of 5700 draft tokens (a lifetime ratio of 0.5)."""
    def series(engine, drafts, draft_tokens, accepted, per_pos):
        base = (("engine", engine), ("model_name", "m"))
        out = {(f"{prefix}spec_decode_num_drafts_total", base): drafts,
               (f"{prefix}spec_decode_num_draft_tokens_total", base): draft_tokens,
               (f"{prefix}spec_decode_num_accepted_tokens_total", base): accepted,
               (f"{prefix}generation_tokens_total", base): 10 * accepted}
        for pos, v in enumerate(per_pos):
            out[(f"{prefix}spec_decode_num_accepted_tokens_per_pos_total", base + (("position", str(pos)),))] = v
        return out
    before = series("0", 1000, 3000, 1800, [800, 600, 400]) | series("1", 5000, 15000, 12000, [4500, 4000, 3500])
    after = series("0", 1600, 4800, 2400, [1200, 750, 450]) | series("1", 300, 900, 450, [200, 150, 100])
    return before, after


WANT_PANELS = {"acceptance_rate": 1050 / 2700, "mean_acceptance_length": 1 + 1050 / 900,
               "acceptance_by_position": {"0": 600 / 900, "1": 300 / 900, "2": 150 / 900}}

TOKEN = re.compile(r'\s*(?:(\[\s*\d+[smhd]\s*\])|(\d+\.?\d*(?:e[-+]?\d+)?)|([A-Za-z_:][A-Za-z0-9_:]*)|("[^"]*")|(\S))')


class PromQL:
    """Evaluates a PromQL expression at the second scrape. Supports numbers, instant selectors
    (name{label="v"}), rate() and increase() over a range (counter resets handled as Prometheus does),
    sum/avg/min/max/count with by/without, scalar(), + - * / with on/ignoring and group_left/right."""

    def __init__(self, before, after, window):
        self.before, self.after, self.window = before, after, window

    def evaluate(self, text):
        self.toks = [next(g for g in m.groups() if g is not None) for m in TOKEN.finditer(text) if any(m.groups())]
        self.i = 0
        out = self.expr()
        if self.i != len(self.toks):
            raise PromQLError(f"unexpected {self.toks[self.i]!r}")
        return out

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, want=None):
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise PromQLError(f"expected {want!r}, found {tok!r}")
        self.i += 1
        return tok

    def labels(self):
        self.take("(")
        names = []
        while self.peek() != ")":
            names.append(self.take())
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return names

    def expr(self, ops=("+", "-"), lower=None):
        lower = lower or (lambda: self.expr(("*", "/"), self.primary))
        left = lower()
        while self.peek() in ops:
            op = self.take()
            match, group = None, None
            if self.peek() in ("on", "ignoring"):
                match = (self.take(), self.labels())
            if self.peek() in ("group_left", "group_right"):
                group = self.take()
                if self.peek() == "(":
                    self.labels()
            left = self.binary(op, left, lower(), match, group)
        return left

    def primary(self):
        tok = self.take()
        if tok == "(":
            out = self.expr()
            self.take(")")
            return out
        if tok == "-":
            return self.binary("*", -1.0, self.primary(), None, None)
        if re.fullmatch(r"\d.*", tok):
            return float(tok)
        if tok in ("sum", "avg", "min", "max", "count"):
            return self.aggregate(tok)
        if tok in ("rate", "increase"):
            self.take("(")
            name, sel, rng = self.selector(self.take())
            self.take(")")
            if rng is None:
                raise PromQLError(f"{tok}() takes a range vector, such as {name}[{self.window}]")
            return self.counter(tok, name, sel, rng)
        if tok == "scalar":
            self.take("(")
            v = self.expr()
            self.take(")")
            return v if isinstance(v, float) else (next(iter(v.values())) if len(v) == 1 else math.nan)
        name, sel, rng = self.selector(tok)
        if rng is not None:
            raise PromQLError(f"a range vector {name}{rng} must be inside rate() or increase()")
        return {lab: v for (n, lab), v in self.after.items() if n == name and sel <= set(lab)}

    def selector(self, name):
        if not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", name):
            raise PromQLError(f"unexpected {name!r}")
        sel = set()
        if self.peek() == "{":
            self.take("{")
            while self.peek() != "}":
                label = self.take()
                self.take("=")
                sel.add((label, self.take().strip('"')))
                if self.peek() == ",":
                    self.take(",")
            self.take("}")
        rng = self.take() if self.peek() and self.peek().startswith("[") else None
        return name, sel, rng

    def counter(self, fn, name, sel, rng):
        if rng.strip("[] ") != self.window:
            raise PromQLError(f"the range {rng} is not the dashboard's window [{self.window}]")
        out = {}
        for (n, lab), v1 in self.after.items():
            if n == name and sel <= set(lab):
                v0 = self.before.get((n, lab), 0.0)
                inc = v1 - v0 if v1 >= v0 else v1  # a counter that went down was reset
                out[lab] = inc / WINDOW_S[self.window] if fn == "rate" else inc
        return out

    def aggregate(self, fn):
        by = without = None
        if self.peek() in ("by", "without"):
            which = self.take()
            by, without = (self.labels(), None) if which == "by" else (None, self.labels())
        self.take("(")
        v = self.expr()
        self.take(")")
        if self.peek() in ("by", "without"):
            which = self.take()
            by, without = (self.labels(), None) if which == "by" else (None, self.labels())
        if isinstance(v, float):
            raise PromQLError(f"{fn}() needs a vector, got a scalar")
        groups = {}
        for lab, x in v.items():
            key = tuple((a, b) for a, b in lab if (a in by if by is not None else
                                                   (without is not None and a not in without)))
            groups.setdefault(key, []).append(x)
        f = {"sum": sum, "avg": lambda xs: sum(xs) / len(xs), "min": min, "max": max, "count": len}[fn]
        return {key: float(f(xs)) for key, xs in groups.items()}

    def binary(self, op, a, b, match, group):
        f = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
             "/": lambda x, y: x / y if y else (math.nan if x == 0 else math.copysign(math.inf, x))}[op]
        if isinstance(a, float) and isinstance(b, float):
            return f(a, b)
        if isinstance(a, float):
            return {lab: f(a, y) for lab, y in b.items()}
        if isinstance(b, float):
            return {lab: f(x, b) for lab, x in a.items()}

        def key(lab):
            if match and match[0] == "on":
                return tuple(sorted((x, y) for x, y in lab if x in match[1]))
            ignored = match[1] if match else []
            return tuple(sorted((x, y) for x, y in lab if x not in ignored))
        one, many = (b, a) if group != "group_right" else (a, b)
        side = {}
        for lab in one:
            if key(lab) in side:
                raise PromQLError("the 'one' side of a vector match has two series with the same labels")
            side[key(lab)] = lab
        if group is None:
            keys = [key(lab) for lab in many]
            if len(set(keys)) != len(keys):
                raise PromQLError("many-to-one matching: say group_left (and ignoring(...) the extra label)")
        out = {}
        for lab, x in many.items():
            if key(lab) in side:
                y = one[side[key(lab)]]
                res_lab = lab if group else key(lab)
                out[res_lab] = f(x, y) if group != "group_right" else f(y, x)
        return out


def evaluate(expr, prefix="vllm:", window="5m"):
    return PromQL(*scrapes(prefix), window).evaluate(expr)


def check_dashboard(m) -> str | None:
    for prefix, window in (("vllm:", "5m"), ("speclab:", "10m")):
        panels = m.dashboard(prefix=prefix, window=window)
        if not isinstance(panels, dict) or set(panels) != set(WANT_PANELS):
            return f"dashboard() returns a dict with keys {sorted(WANT_PANELS)}, got {panels!r}"
        for name, want in WANT_PANELS.items():
            expr = panels[name]
            try:
                got = evaluate(expr, prefix, window)
            except PromQLError as e:
                return f"panel {name}: {expr!r} is not PromQL this dashboard can run: {e}"
            if name == "acceptance_by_position":
                series = {dict(lab).get("position"): v for lab, v in got.items()} if isinstance(got, dict) else {}
                if isinstance(got, dict) and len(series) != len(got):
                    return (f"panel {name}: {expr!r} returns {len(got)} series, several per position (one per "
                            f"engine): sum by (position) first")
                if series.keys() != want.keys() or any(not math.isclose(series[p], want[p], rel_tol=1e-9) for p in want):
                    return (f"panel {name} ({prefix}, [{window}]): {expr!r} gives {series}, want {want}: accepted at "
                            f"position i / drafts over the window (the per-position denominator is num_drafts, "
                            f"not draft tokens), with both sides summed across engines and "
                            f"`/ ignoring(position) group_left` to divide each position by the one total")
                continue
            values = [got] if isinstance(got, float) else list(got.values())
            if len(values) != 1:
                return (f"panel {name}: {expr!r} returns {len(values)} series (one per engine): a dashboard panel "
                        f"sums the rates across engines before dividing (sum(rate(a)) / sum(rate(b)); an average "
                        f"of per-engine ratios weights an idle engine like a busy one)" if values else
                        f"panel {name}: {expr!r} selects no series: the counters are named "
                        f"{prefix}spec_decode_..._total")
            if not math.isclose(values[0], want, rel_tol=1e-9):
                why = {"acceptance_rate": "accepted / draft tokens from the rates over the window (the raw counters "
                                          "give the lifetime ratio, 0.5 here, and break when an engine restarts); "
                                          "sum each rate across engines, then divide (an average of per-engine "
                                          "ratios weights an idle engine like a busy one)",
                       "mean_acceptance_length": "1 + accepted / drafts (drafts, not draft tokens: the bonus token "
                                                 "is the 1), from the rates over the window"}[name]
                return f"panel {name} ({prefix}, [{window}]): {expr!r} gives {values[0]:.4f}, want {want:.4f}: {why}"
    return None


# ---------------------------------------------------------------------------------------------
# 4. a k table from a cost curve


def brute_best_k(alpha, B, k_max, T, D):
    tput = [B * sum(alpha ** i for i in range(k + 1)) / (T(B * (k + 1)) + k * D(B)) for k in range(k_max + 1)]
    return max(range(k_max + 1), key=lambda k: (round(tput[k], 12), -k))


COST_CASES = [
    (0.8, 4, 64, lambda n: max(0.02, 4e-4 * n), lambda b: 1e-3, "a roofline: flat until 50 tokens, then linear"),
    (0.6, 5, 128, lambda n: 0.01 + 2e-4 * n, lambda b: 5e-4 + 1e-5 * b, "a linear cost with a drafter that costs"),
    (0.9, 3, 40, lambda n: max(0.03, 1e-3 * n), lambda b: 0.0, "a free drafter, high alpha"),
    (0.0, 3, 16, lambda n: 0.02, lambda b: 0.0, "alpha 0 with free verification: every k ties, and ties go to the smallest"),
    (0.7, 4, 1, lambda n: 0.02 + 1e-4 * n, lambda b: 1e-3, "max_batch_size 1: one range"),
]


def check_k_table(m) -> str | None:
    for alpha, k_max, max_b, T, D, what in COST_CASES:
        best = {B: brute_best_k(alpha, B, k_max, T, D) for B in range(1, max_b + 1)}
        want, B = [], 1
        for k, run in itertools.groupby(range(1, max_b + 1), key=best.get):
            run = list(run)
            want.append((run[0], run[-1], k))
        got = [tuple(int(x) for x in r) for r in m.k_table(alpha, k_max, max_b, T, D)]
        if got == want:
            parse_batch_size_table(got, k_max)  # vLLM's rules: must not raise
            continue
        if not got or got[0][0] != 1:
            return f"k_table [{what}]: vLLM refuses a table whose first range does not start at 1; got {got}"
        if got[-1][1] != max_b or any(e + 1 != s for (_, e, _), (s, _, _) in zip(got, got[1:])):
            return f"k_table [{what}]: ranges must cover 1..{max_b} with no gaps or overlaps; got {got}"
        if any(a[2] == b[2] for a, b in zip(got, got[1:])):
            return f"k_table [{what}]: merge adjacent ranges with the same k (want {want}); got {got}"
        sched = BatchSizeSchedule(k_max, got)
        wrong = next(b for b in range(1, max_b + 1) if sched.choose(b) != best[b])
        return (f"k_table [{what}]: at batch size {wrong} the best k is {best[wrong]}, the table says "
                f"{sched.choose(wrong)} (want {want}, got {got}); price a step of B requests at "
                f"target_seconds(B * (k + 1)) + k * draft_seconds(B), and take the smallest k on ties")
    return None


# ---------------------------------------------------------------------------------------------
# the grades


def test_verify_step_from_memory(impl):
    fail_on(check_verify(impl))


def test_spec_decode_indices(impl):
    fail_on(check_indices(impl))


def test_promql_dashboard(impl):
    fail_on(check_dashboard(impl))


def test_k_table_from_a_cost_curve(impl):
    fail_on(check_k_table(impl))


def test_evaluator_reads_promql_as_prometheus_does(controls):
    """The evaluator itself, on hand-computed values (a grader that misreads PromQL grades nothing)."""
    assert evaluate("sum(rate(vllm:spec_decode_num_drafts_total[5m]))") == {(): 900 / 300}
    assert evaluate('increase(vllm:spec_decode_num_drafts_total{engine="1"}[5m])') == \
        {(("engine", "1"), ("model_name", "m")): 300.0}  # reset: the increase is the new value
    assert evaluate("sum(vllm:spec_decode_num_accepted_tokens_total) / sum(vllm:spec_decode_num_draft_tokens_total)") \
        == {(): 0.5}
    assert set(evaluate("sum by (engine) (rate(vllm:spec_decode_num_drafts_total[5m]))")) == \
        {(("engine", "0"),), (("engine", "1"),)}
    with pytest.raises(PromQLError, match="group_left"):
        evaluate("sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total[5m])) / "
                 "on() sum(rate(vllm:spec_decode_num_drafts_total[5m]))")
    with pytest.raises(PromQLError, match="range vector"):
        evaluate("rate(vllm:spec_decode_num_drafts_total)")


# ---------------------------------------------------------------------------------------------
# negative controls: wrong answers that the checks above must catch, each with the message naming it


class Mutant:
    def __init__(self, **overrides):
        import solutions.ex11_interview_drills as sol
        self._sol, self._over = sol, overrides

    def __getattr__(self, name):
        return self._over.get(name) or getattr(self._sol, name)


def caught(check, needle, **overrides):
    msg = check(Mutant(**overrides))
    assert msg and needle in msg, f"the grader missed a wrong {sorted(overrides)} (or named it wrongly): {msg}"


def test_controls_verify(controls):
    import solutions.ex11_interview_drills as sol

    def rule(accept=lambda p_x, q_x, u: q_x > 0 and p_x / q_x >= u, residual_from_p=False, bonus_argmax=False,
             reuse_u=False):
        def verify(drafts, p, q, uniforms, noise):
            out = []
            for i, x in enumerate(drafts):
                q_x = 1.0 if q is None else float(q[i, x])
                if accept(float(p[i, x]), q_x, float(uniforms[0 if reuse_u else i])):
                    out.append(x)
                    continue
                q_i = torch.zeros_like(p[i]) if q is None else q[i]
                if q is None:
                    q_i[x] = 1.0
                r = p[i] if residual_from_p else (p[i] - q_i).clamp(min=0)
                r = p[i] if float(r.max()) <= 0 else r
                return out + [int((r / noise).argmax())]
            k = len(drafts)
            return out + [int(p[k].argmax() if bonus_argmax else (p[k] / noise).argmax())]
        return verify

    assert check_verify(Mutant(verify_step=rule())) is None, "the control's own correct rule must pass"
    caught(check_verify, "residual", verify_step=rule(residual_from_p=True))
    caught(check_verify, "bonus", verify_step=rule(bonus_argmax=True))
    caught(check_verify, "one per position", verify_step=rule(reuse_u=True))
    caught(check_verify, "never p >= q alone", verify_step=rule(accept=lambda p_x, q_x, u: p_x >= q_x))
    caught(check_verify, "p/q equals u exactly", verify_step=rule(accept=lambda p_x, q_x, u: q_x > 0 and p_x / q_x > u))
    caught(check_verify, "q = 0", verify_step=rule(accept=lambda p_x, q_x, u: p_x / max(q_x, 1e-300) >= u))
    assert check_verify(sol) is None


def test_controls_indices(controls):
    import solutions.ex11_interview_drills as sol

    def patch(**fix):
        def f(cu, k):
            out = sol.spec_decode_indices(cu, k)
            return {**out, **{key: g(cu, k, out) for key, g in fix.items()}}
        return f

    caught(check_indices, "inclusive", spec_decode_indices=patch(
        cu_num_draft_tokens=lambda cu, k, o: [0] + o["cu_num_draft_tokens"][:-1]))
    caught(check_indices, "not cu_num_draft_tokens[r]", spec_decode_indices=patch(
        bonus_logits_indices=lambda cu, k, o: o["cu_num_draft_tokens"]))
    caught(check_indices, "index into logits_indices", spec_decode_indices=patch(
        target_logits_indices=lambda cu, k, o: [o["logits_indices"][i] for i in o["target_logits_indices"]]))
    caught(check_indices, "last 1 + k_r rows", spec_decode_indices=patch(
        logits_indices=lambda cu, k, o: [t for r, (c, kr) in enumerate(zip(cu, k))
                                         for t in range(cu[r - 1] if r else 0, (cu[r - 1] if r else 0) + kr + 1)]))


def test_controls_dashboard(controls):
    def panels(rate=None, length=None, by_pos=None):
        def d(prefix="vllm:", window="5m"):
            r = lambda n: f"rate({prefix}spec_decode_{n}_total[{window}])"  # noqa: E731
            good = {"acceptance_rate": f"sum({r('num_accepted_tokens')}) / sum({r('num_draft_tokens')})",
                    "mean_acceptance_length": f"1 + sum({r('num_accepted_tokens')}) / sum({r('num_drafts')})",
                    "acceptance_by_position": f"sum by (position) ({r('num_accepted_tokens_per_pos')}) / "
                                              f"ignoring(position) group_left sum({r('num_drafts')})"}
            bad = {"acceptance_rate": rate and rate(prefix, r), "mean_acceptance_length": length and length(prefix, r),
                   "acceptance_by_position": by_pos and by_pos(prefix, r)}
            return {key: bad[key] or good[key] for key in good}
        return d

    assert check_dashboard(Mutant(dashboard=panels())) is None
    caught(check_dashboard, "lifetime", dashboard=panels(rate=lambda p, r: f"sum({p}spec_decode_num_accepted_tokens_total)"
                                                         f" / sum({p}spec_decode_num_draft_tokens_total)"))
    caught(check_dashboard, "one per engine", dashboard=panels(
        rate=lambda p, r: f"{r('num_accepted_tokens')} / {r('num_draft_tokens')}"))
    caught(check_dashboard, "average of per-engine ratios", dashboard=panels(  # 0.4167, not 0.3889
        rate=lambda p, r: f"avg({r('num_accepted_tokens')} / {r('num_draft_tokens')})"))
    caught(check_dashboard, "drafts, not draft tokens", dashboard=panels(
        length=lambda p, r: f"1 + sum({r('num_accepted_tokens')}) / sum({r('num_draft_tokens')})"))
    caught(check_dashboard, "the bonus token is the 1", dashboard=panels(
        length=lambda p, r: f"sum({r('num_accepted_tokens')}) / sum({r('num_drafts')})"))
    caught(check_dashboard, "no series", dashboard=panels(
        length=lambda p, r: f"1 + sum(rate({p}spec_decode_num_accepted_tokens[5m])) / sum({r('num_drafts')})"))
    caught(check_dashboard, "group_left", dashboard=panels(
        by_pos=lambda p, r: f"sum by (position) ({r('num_accepted_tokens_per_pos')}) / sum({r('num_drafts')})"))
    caught(check_dashboard, "not draft tokens", dashboard=panels(
        by_pos=lambda p, r: f"sum by (position) ({r('num_accepted_tokens_per_pos')}) / ignoring(position) "
                            f"group_left sum({r('num_draft_tokens')})"))
    caught(check_dashboard, "sum by (position)", dashboard=panels(
        by_pos=lambda p, r: f"{r('num_accepted_tokens_per_pos')} / ignoring(position) group_left "
                            f"{r('num_drafts')}"))
    caught(check_dashboard, "window", dashboard=panels(  # a hard-coded [5m] in a 10m dashboard
        rate=lambda p, r: f"sum(rate({p}spec_decode_num_accepted_tokens_total[5m])) / "
                          f"sum(rate({p}spec_decode_num_draft_tokens_total[5m]))"))


def test_controls_k_table(controls):
    import solutions.ex11_interview_drills as sol

    def unmerged(alpha, k_max, max_b, T, D):
        return [(B, B, brute_best_k(alpha, B, k_max, T, D)) for B in range(1, max_b + 1)]

    def largest_on_ties(alpha, k_max, max_b, T, D):
        def best(B):
            tput = [B * sum(alpha ** i for i in range(k + 1)) / (T(B * (k + 1)) + k * D(B)) for k in range(k_max + 1)]
            return max(range(k_max + 1), key=lambda k: (tput[k], k))
        return [(s, e, best(s)) for s, e, _ in sol.k_table(alpha, k_max, max_b, T, D)]

    def batch_one_pricing(alpha, k_max, max_b, T, D):  # prices every batch as batch 1: always the batch-1 k
        return [(1, max_b, brute_best_k(alpha, 1, k_max, T, D))]

    def starts_where_speculation_changes(alpha, k_max, max_b, T, D):  # drops the first range
        t = sol.k_table(alpha, k_max, max_b, T, D)
        return t[1:] if len(t) > 1 else [(2, max_b, t[0][2])]

    caught(check_k_table, "merge adjacent", k_table=unmerged)
    caught(check_k_table, "smallest k on ties", k_table=largest_on_ties)
    caught(check_k_table, "target_seconds(B * (k + 1))", k_table=batch_one_pricing)
    caught(check_k_table, "start at 1", k_table=starts_where_speculation_changes)
