"""Grades exercise 09 (acceptance from two /metrics scrapes; k from a table or a cost model).
`pytest --impl=exercises tests/test_ex09_serving_metrics.py`. Negative controls at the bottom
grade the grader (skipped under --impl=exercises)."""

import random

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily

from speclab.engine.spec_policy import BatchSizeSchedule
from speclab.metrics import SpecDecodingStats
from speclab.serve.metrics import SpecDecodeCollector
from tests.helpers import fail_on

EXERCISE = "ex09_serving_metrics"
pytestmark = pytest.mark.exercise


def scrape(stats: SpecDecodingStats) -> str:
    """What speclab serve's /metrics shows for these counters, with another metric around them."""
    reg = CollectorRegistry()
    Counter("speclab:generation_tokens", "Generated tokens.", ["model_name"], registry=reg).labels("m").inc(99)
    reg.register(SpecDecodeCollector(stats, {"model_name": "m", "engine": "0"}))
    return generate_latest(reg).decode()


class TwoEngines:
    """A data-parallel server's scrape as vLLM exports it: one series per engine, and prometheus_client's
    `_created` sample (a Unix timestamp) beside every `_total`."""

    def __init__(self, *stats):
        self.stats = stats

    def collect(self):
        def fam(name, doc, value_of, labels=("model_name", "engine")):
            f = CounterMetricFamily(f"speclab:spec_decode_{name}", doc, labels=list(labels))
            for e, s in enumerate(self.stats):
                for extra, v in value_of(s):
                    f.add_metric(["m", str(e)] + extra, v, created=1.7e9 + e)
            return f
        yield fam("num_drafts", "Drafts.", lambda s: [([], s.num_drafts)])
        yield fam("num_draft_tokens", "Draft tokens.", lambda s: [([], s.num_draft_tokens)])
        yield fam("num_accepted_tokens", "Accepted tokens.", lambda s: [([], s.num_accepted_tokens)])
        yield fam("num_accepted_tokens_per_pos", "Accepted per position.",
                  lambda s: [([str(i)], n) for i, n in enumerate(s.num_accepted_tokens_per_pos)],
                  ("model_name", "engine", "position"))


def scrape_two_engines(a: SpecDecodingStats, b: SpecDecodingStats) -> str:
    reg = CollectorRegistry()
    reg.register(TwoEngines(a, b))
    return generate_latest(reg).decode()


def stats_after(steps, k=4) -> SpecDecodingStats:
    s = SpecDecodingStats(k)
    for drafted, accepted in steps:
        s.observe(drafted, accepted)
    return s


STEPS_1 = [(4, 2), (4, 0), (3, 3), (4, 4), (2, 1)]
STEPS_2 = STEPS_1 + [(4, 1), (1, 1), (4, 3)]

# ---------------------------------------------------------------------------------------------
# checks (each returns a message explaining the first failure, or None)


def check_parse(m) -> str | None:
    s = stats_after(STEPS_1)
    got = m.parse_spec_counters(scrape(s))
    want = {"num_drafts": 5.0, "num_draft_tokens": 17.0, "num_accepted_tokens": 10.0,
            "num_accepted_tokens_per_pos": {0: 4.0, 1: 3.0, 2: 2.0, 3: 1.0}}
    if got != want:
        return (f"parse_spec_counters on a scrape of 5 drafts (17 draft tokens, 10 accepted): want {want}, got {got}. "
                f"Counters appear as `speclab:spec_decode_num_drafts_total{{engine=\"0\",model_name=\"m\"}} 5.0`; "
                f"the key drops the prefix and the `_total` suffix, per-position lines carry position=\"i\"")
    a, b = stats_after(STEPS_1), stats_after([(4, 4), (4, 1)])
    two = m.parse_spec_counters(scrape_two_engines(a, b))
    want2 = {"num_drafts": 7.0, "num_draft_tokens": 25.0, "num_accepted_tokens": 15.0,
             "num_accepted_tokens_per_pos": {0: 6.0, 1: 4.0, 2: 3.0, 3: 2.0}}
    if two != want2:
        created = any(v > 1e8 for v in [two.get(k, 0) for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")]
                      + list(two.get("num_accepted_tokens_per_pos", {}).values()))
        only_last = two.get("num_drafts") == 2.0 or two.get("num_accepted_tokens") == 5.0
        why = ("it counted the `_created` samples (Unix timestamps of when each counter was created, exported "
               "beside `_total`): keep only the `_total` series" if created else
               "it overwrote a counter with the last series it saw: a counter exported by two engines is the "
               "sum of its series (engine=\"0\" and engine=\"1\")" if only_last else
               "sum each counter over its series and skip the `_created` samples")
        return f"parse_spec_counters on a two-engine scrape: want {want2}, got {two}; {why}"
    empty = m.parse_spec_counters("# HELP x y\nspeclab:generation_tokens_total 3.0\n")
    if empty != {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0,
                 "num_accepted_tokens_per_pos": {}}:
        return f"a scrape without spec-decode counters (a server that does not speculate) parses to zeros, got {empty}"
    return None


def check_increase(m) -> str | None:
    for before, after, want in [(3.0, 10.0, 7.0), (5.0, 5.0, 0.0), (10.0, 4.0, 4.0), (0.0, 0.0, 0.0)]:
        got = m.increase(before, after)
        if got != want:
            why = " (the counter went down: the server restarted and counts from 0 again)" if after < before else ""
            return f"increase({before}, {after}) should be {want}, got {got}{why}"
    return None


def check_acceptance(m) -> str | None:
    a = m.parse_spec_counters(scrape(stats_after(STEPS_1)))
    b = m.parse_spec_counters(scrape(stats_after(STEPS_2)))
    got = m.acceptance_between(a, b)  # between: 3 drafts, 9 draft tokens, 5 accepted; positions 3, 1, 1, 0
    want = {"acceptance_rate": 5 / 9, "mean_acceptance_length": 1 + 5 / 3, "per_position": [1.0, 1 / 3, 1 / 3, 0.0]}
    if got["acceptance_rate"] != pytest.approx(want["acceptance_rate"]):
        return f"acceptance_rate between the scrapes = 5 accepted / 9 draft tokens = {5 / 9:.4f}, got {got['acceptance_rate']}"
    if got["mean_acceptance_length"] != pytest.approx(want["mean_acceptance_length"]):
        return (f"mean_acceptance_length = 1 + accepted / drafts = 1 + 5 / 3 = {1 + 5 / 3:.4f} (tokens per verification, "
                f"bonus included), got {got['mean_acceptance_length']}")
    if got["per_position"] != pytest.approx(want["per_position"]):
        return f"per_position[i] = accepted at i / drafts = {want['per_position']}, got {got['per_position']}"
    zero = m.acceptance_between(a, a)
    if zero["acceptance_rate"] != 0.0 or zero["mean_acceptance_length"] != 1.0:
        return f"no drafts in between: acceptance_rate 0.0 and mean_acceptance_length 1.0 (not a ZeroDivisionError), got {zero}"
    restarted = m.acceptance_between(b, m.parse_spec_counters(scrape(stats_after([(4, 2), (2, 2)]))))
    if restarted["acceptance_rate"] != pytest.approx(4 / 6) or restarted["mean_acceptance_length"] != pytest.approx(3.0):
        return (f"after a restart the counters start again from 0: the increase is the new value (4 of 6 accepted "
                f"in 2 drafts: rate 0.667, length 3.0), got {restarted}")
    return None


TABLES = [[(1, 16, 3), (17, 64, 2), (65, 4096, 0)], [(1, 4, 3), (8, 16, 1), (32, 64, 0)], [(1, 1, 5), (3, 3, 0)],
          [(1, 8, 0), (9, 9, 2)], [(1, 2, 7), (3, 10, 1)]]


def check_table(m) -> str | None:
    for table in ([(2, 4, 3), (8, 16, 1)], [(4, 8, 0), (9, 9, 2)]):
        try:
            got = m.k_for_batch_size(table, 5, 4)
        except ValueError:
            continue
        return (f"table {table} does not start at batch size 1: vLLM refuses it (ValueError), but "
                f"k_for_batch_size returned {got} (the old rule gave batch sizes below the first range k_max)")
    for table in TABLES:
        for k_max in (2, 4):
            ref = BatchSizeSchedule(k_max, table)
            for b in list(range(1, 70)) + [100, 4096, 5000]:
                got, want = m.k_for_batch_size(table, b, k_max), ref.k_for_batch_size(b)
                if got != want:
                    where = next((f"inside {s}-{e}" for s, e, _ in table if s <= b <= e), None)
                    where = where or ("below the first range" if b < table[0][0] else "in a gap or past the last range")
                    why = ("a k above k_max is clamped to k_max, as vLLM does" if got > k_max else
                           "gaps and batch sizes past the last range inherit the k of the range below"
                           if where.startswith("in a gap") else "inside a range, its k (clamped to k_max)")
                    return f"table {table}, k_max {k_max}, batch size {b} ({where}): want k = {want}, got {got}: {why}"
    return None


def check_best_k(m) -> str | None:
    def brute(alpha, B, k_max, T, D):
        tput = [B * sum(alpha ** i for i in range(k + 1)) / (T(B * (k + 1)) + k * D(B)) for k in range(k_max + 1)]
        return max(range(k_max + 1), key=lambda k: (round(tput[k], 12), -k))

    cases = [(0.8, 1, 4, lambda n: 0.02 + 1e-4 * n, lambda b: 0.0, "memory-bound batch 1, good drafts: draft all 4"),
             (0.8, 64, 4, lambda n: 0.02 + 1e-3 * n, lambda b: 0.0, "compute-bound batch 64: every verified token costs"),
             (0.6, 8, 5, lambda n: 0.05 + 1e-3 * n, lambda b: 0.004 * b ** 0.5, "a drafter that costs something"),
             (0.0, 1, 3, lambda n: 0.02, lambda b: 0.0, "alpha = 0: drafts never pay, and ties go to the smallest k"),
             (1.0, 1, 3, lambda n: 0.02, lambda b: 0.0, "alpha = 1: every draft pays")]
    rng = random.Random(0)
    for _ in range(40):
        a, b, d = rng.uniform(0.001, 0.05), rng.uniform(1e-5, 3e-3), rng.uniform(0, 0.01)
        cases.append((rng.random(), rng.choice([1, 2, 4, 8, 16, 32, 64]), rng.randint(1, 6),
                      lambda n, a=a, b=b: a + b * n, lambda B, d=d: d, "a random linear cost model"))
    for alpha, B, k_max, T, D, what in cases:
        want, got = brute(alpha, B, k_max, T, D), m.best_k(alpha, B, k_max, T, D)
        if got != want:
            return (f"best_k(alpha={alpha:.3f}, batch_size={B}, k_max={k_max}) [{what}]: want {want}, got {got}. "
                    f"A step verifies batch_size * (k + 1) tokens: target_seconds(batch_size * (k + 1)) + "
                    f"k * draft_seconds(batch_size); it yields batch_size * (1 + alpha + ... + alpha^k) tokens")
    return None


# ---------------------------------------------------------------------------------------------
# the grades


def test_parse_spec_counters(impl):
    fail_on(check_parse(impl))


def test_increase_handles_counter_resets(impl):
    fail_on(check_increase(impl))


def test_acceptance_between_two_scrapes(impl):
    fail_on(check_acceptance(impl))


def test_k_for_batch_size_reads_vllms_table(impl):
    fail_on(check_table(impl))


def test_best_k_maximizes_tokens_per_second(impl):
    fail_on(check_best_k(impl))


# ---------------------------------------------------------------------------------------------
# negative controls: wrong answers that the checks above must catch


class Mutant:
    def __init__(self, **overrides):
        import solutions.ex09_serving_metrics as sol
        self._sol, self._over = sol, overrides

    def __getattr__(self, name):
        return self._over.get(name) or getattr(self._sol, name)


def test_controls_parse(controls):
    import re

    import solutions.ex09_serving_metrics as sol

    def forgets_positions(text):
        out = sol.parse_spec_counters(text)
        out["num_accepted_tokens_per_pos"] = {}
        return out

    def parser(overwrite=False, created=False):
        def parse(text):
            out = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0,
                   "num_accepted_tokens_per_pos": {}}
            for line in text.splitlines():
                if not line.startswith(sol.SPEC):
                    continue
                name_labels, value = line.rsplit(" ", 1)
                name, _, labels = name_labels.partition("{")
                key = re.sub(r"_(total|created)$" if created else r"_total$", "", name[len(sol.SPEC):])
                if key == "num_accepted_tokens_per_pos":
                    pos = int(re.search(r'position="(\d+)"', labels).group(1))
                    out[key][pos] = float(value) + (0.0 if overwrite else out[key].get(pos, 0.0))
                elif key in out:
                    out[key] = float(value) + (0.0 if overwrite else out[key])
            return out
        return parse

    assert check_parse(Mutant(parse_spec_counters=parser())) is None
    assert check_parse(Mutant(parse_spec_counters=forgets_positions))
    for mutant, needle in ((parser(overwrite=True), "overwrote"), (parser(created=True), "`_created` samples")):
        msg = check_parse(Mutant(parse_spec_counters=mutant))
        assert msg and needle in msg, msg


def test_controls_acceptance(controls):
    import solutions.ex09_serving_metrics as sol

    def length_over_tokens(before, after):  # 1 + accepted / draft TOKENS: the classic mix-up
        r = sol.acceptance_between(before, after)
        return {**r, "mean_acceptance_length": 1 + r["acceptance_rate"]}

    def no_reset(before, after):
        return sol.acceptance_between(before, after) if after["num_drafts"] >= before["num_drafts"] else \
            {"acceptance_rate": 0.0, "mean_acceptance_length": 1.0, "per_position": []}

    def divides_by_zero(before, after):
        if after["num_drafts"] == before["num_drafts"]:
            raise ZeroDivisionError
        return sol.acceptance_between(before, after)

    assert check_acceptance(Mutant(acceptance_between=length_over_tokens))
    assert check_acceptance(Mutant(acceptance_between=no_reset))
    with pytest.raises(ZeroDivisionError):
        check_acceptance(Mutant(acceptance_between=divides_by_zero))
    assert check_increase(Mutant(increase=lambda before, after: after - before))


def test_controls_table(controls):
    import solutions.ex09_serving_metrics as sol

    def gap_is_k_max(table, b, k_max):
        sol.k_for_batch_size(table, b, k_max)  # refuses what the solution refuses
        return next((min(k, k_max) for s, e, k in table if s <= b <= e), k_max)

    def old_rule(table, b, k_max):  # speclab's old reading: a table may start anywhere, below it k_max
        k = k_max
        for s, _e, k_range in table:
            if b < s:
                break
            k = k_range
        return min(k, k_max)

    def not_clamped(t, b, k_max):
        return next((k for s, e, k in t if s <= b <= e), sol.k_for_batch_size(t, b, k_max))

    def caught(mutant, needle):
        msg = check_table(Mutant(k_for_batch_size=mutant))
        assert msg and needle in msg, msg

    caught(gap_is_k_max, "inherit the k of the range below")
    caught(old_rule, "does not start at batch size 1")
    caught(not_clamped, "clamped to k_max")


def test_controls_best_k(controls):
    import solutions.ex09_serving_metrics as sol

    def batch_one_cost(alpha, B, k_max, T, D):  # prices a step as if the batch were 1: always drafts
        return sol.best_k(alpha, 1, k_max, T, D)

    def largest_on_ties(alpha, B, k_max, T, D):
        tput = [sum(alpha ** i for i in range(k + 1)) * B / (T(B * (k + 1)) + k * D(B)) for k in range(k_max + 1)]
        return max(range(k_max + 1), key=lambda k: (tput[k], k))

    assert check_best_k(Mutant(best_k=batch_one_cost))
    assert check_best_k(Mutant(best_k=largest_on_ties))
    assert check_best_k(Mutant(best_k=lambda alpha, B, k_max, T, D: k_max))
