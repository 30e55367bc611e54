"""`python -m speclab.bench heads` runs every proposer side by side and writes figures that add up.

A smoke run on the embedded target (one prompt per set, 8 tokens, greedy, two interleaved rounds):
one row per method (and EAGLE's static and dynamic trees, and each again with an n-gram chain grafted
in) and set in the JSON, speedups relative to
the plain row (which reads exactly 1.00x), tau >= 1 and equal to 1 + the per-position acceptances,
acceptance per position that never rises with the position (a later drafted token, or a deeper
node, is accepted only after every earlier one was), and greedy output identical to plain decoding
on every row. Speeds are printed, never asserted.
"""

import json

import pytest

from speclab.bench.cli import main
from speclab.bench.heads import EMBEDDED_METHODS


@pytest.mark.slow  # eleven engines on the embedded target, about 45 s
def test_bench_heads_writes_one_consistent_row_per_method_and_set(tmp_path, capsys):
    path = tmp_path / "heads.json"
    main(["heads", "--max-tokens", "8", "--num-prompts", "1", "--temperatures", "0", "--k", "4", "--repeats", "2",
          "--seed", "3", "--json", str(path)])
    report = json.loads(path.read_text())
    assert report["seed"] == 3  # the engines' stream, written beside the rows
    assert {"cpu", "cores", "threads", "load_average"} <= set(report["machine"])
    assert report["dtype"] == "float32"  # the first of --dtypes, float32 unless told
    rows = report["rows"]
    keys = {"set", "temperature", "method", "k", "tree", "tok_per_s", "speedup", "acceptance_rate",
            "mean_acceptance_length", "identical"}
    assert all(keys <= set(r) for r in rows)
    assert {(r["set"], r["method"]) for r in rows} == {(s, m) for s in ("code", "prose")
                                                       for m in ("none",) + EMBEDDED_METHODS}
    assert {r["tree"] for r in rows if r["method"] == "eagle"} >= {None, "[(0,), (1,), (2,), (0, 0)]",
                                                                   "dynamic: steps 3, topk 2"}
    grafted = [r for r in rows if r["graft_method"] is not None]  # each tree + an n-gram chain (lesson 10)
    assert {(r["set"], r["method"], r["k"], r["tree"], r["graft_method"], r["graft_tokens"]) for r in grafted} == {
        (s, "eagle", 7, tree, "ngram", 3) for s in ("code", "prose")
        for tree in ("[(0,), (1,), (2,), (0, 0)]", "dynamic: steps 3, topk 2")}
    for r in rows:
        assert r["identical"] is True, f"greedy output differs from plain decoding: {r}"
        assert 0 < r["prefill_share"] < 1, r  # every row prefilled its prompt, and decoded after it
        assert r["decode_speedup_range"][0] <= r["decode_speedup"] <= r["decode_speedup_range"][1], r
        if r["method"] == "none":
            assert r["speedup"] == 1.0 and r["decode_speedup"] == 1.0 and r["mean_acceptance_length"] == 1.0
            continue
        per_pos = r["acceptance_per_position"][:r["k"]]
        assert all(a >= b - 1e-9 for a, b in zip(per_pos, per_pos[1:])), f"acceptance rose with position: {r}"
        assert 0 <= r["acceptance_rate"] <= 1 and 1 <= r["mean_acceptance_length"] <= 5, r
        assert abs(r["mean_acceptance_length"] - (1 + sum(r["acceptance_per_position"]))) < 1e-9, r
    assert "speedup" in capsys.readouterr().out  # the table is printed too


def test_sampled_chats_run_to_max_tokens_so_rows_carry_the_same_prefill():
    """At T > 0 each row samples its own answer; one that ended at EOS after a few tokens would put
    its prompt's prefill on those few and read as a slow row. So sampled chats ignore EOS, greedy
    ones (identical in every row) stop at it."""
    from types import SimpleNamespace

    from speclab.bench.heads import run_set

    seen = []

    class FakeLLM:
        def chat(self, prompt, params, use_tqdm):
            seen.append(params)
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[1, 2])])]

    for temperature in (0.0, 1.0):
        seconds, outs = run_set(FakeLLM(), [[{"role": "user", "content": "hi"}]], temperature, 8, chat=True)
        assert outs == [[1, 2]] and seconds >= 0
    assert [p.ignore_eos for p in seen] == [False, True]


def test_prefill_time_counts_the_target_s_forwards_over_more_than_a_step_s_tokens():
    """The decode column's prefill: forwards over more than k + 1 tokens (a prompt), not the decode
    or verify steps (1 .. k + 1 tokens), on the one model the rows share."""
    import time

    import torch

    from speclab.bench.heads import time_prefill

    class FakeModel:
        def forward(self, input_ids, *rest):
            time.sleep(0.02 if len(input_ids) > 5 else 0.2)  # a step counted by mistake would add 0.2 s
            return input_ids

    model = FakeModel()
    acc = time_prefill(model, max_step_tokens=5)
    for n in (120, 1, 5, 3, 40):
        model.forward(torch.zeros(n))
    assert 0.04 <= acc["seconds"] < 0.2, acc  # the two prompts' 20 ms each, none of the steps' 200 ms


def test_several_ks_share_one_plain_row_and_the_best_row_is_the_fastest_of_its_method():
    """`--k 2 4` measures one plain row and each k's speculative rows in the same rounds; the best
    configuration of a method is its fastest row over k, trees and draft vocabularies, per set and T."""
    from speclab.bench.heads import best_rows, rows_for, rows_for_ks

    rows = rows_for_ks(False, [2, 4], 0.0, "draft")
    assert [r.method for r in rows].count("none") == 1 and rows[0].method == "none"
    assert len(rows) == len(rows_for(False, 2, 0.0, "draft")) + len(rows_for(False, 4, 0.0, "draft")) - 1
    assert {r.k for r in rows if r.spec and not r.graft_tokens} == {2, 4}
    assert {r.k for r in rows if r.graft_tokens} == {2 + 3, 4 + 3}, "a grafted row's k is its verified budget"

    def row(method, k, speedup, tree=None, s="code"):
        return {"set": s, "temperature": 0.0, "method": method, "k": k, "tree": tree, "draft_vocab_size": None,
                "speedup": speedup, "speedup_range": [speedup, speedup], "decode_speedup": speedup,
                "mean_acceptance_length": 1.5, "identical": True}
    table = [row("none", 0, 1.0), row("eagle", 2, 1.1), row("eagle", 4, 1.3, "[(0,), (1,)]"), row("eagle", 4, 0.9),
             row("draft_model", 2, 0.8), row("draft_model", 4, 0.7), row("eagle", 2, 0.95, s="prose")]
    best = {(b["set"], b["method"]): (b["k"], b["speedup"]) for b in best_rows(table)}
    assert best == {("code", "eagle"): (4, 1.3), ("code", "draft_model"): (2, 0.8), ("prose", "eagle"): (2, 0.95)}
    table.append({**row("eagle", 7, 1.6, "[(0,), (1,)]"), "graft_method": "ngram", "graft_tokens": 3})
    best = {(b["method"], b["graft_method"]): b["speedup"] for b in best_rows(table) if b["set"] == "code"}
    assert best == {("eagle", None): 1.3, ("eagle", "ngram"): 1.6, ("draft_model", None): 0.8}, \
        "a drafter with a grafted lookup is its own best row, beside the drafter alone"


def test_eagle_heads_repeats_every_eagle_row_per_head_and_keeps_a_best_row_for_each():
    """`--eagle-heads A B`: each EAGLE row (chain and trees) once per head, the head in its speculative
    config (`model`) and in its JSON row, and a best row per head, so a new head is compared in one run."""
    from speclab.bench.heads import best_rows, rows_for

    one = rows_for(True, 4, 0.0, "smollm2-draft")
    two = rows_for(True, 4, 0.0, "smollm2-draft", eagle_heads=["eagle-smollm2", "/tmp/new-head"])
    eagle = [r for r in one if r.method == "eagle"]  # chain, static and dynamic trees, each tree + n-gram
    assert len(eagle) == 5 and all(r.head is None and "model" not in r.spec for r in eagle)
    assert len(two) == len(one) + len(eagle)
    assert [r.spec["model"] for r in two if r.method == "eagle"] == ["eagle-smollm2"] * 5 + ["/tmp/new-head"] * 5
    assert all(r.head == r.spec["model"] for r in two if r.method == "eagle")
    assert [r for r in two if r.method != "eagle"] == [r for r in one if r.method != "eagle"]

    def row(head, speedup):
        return {"set": "qa", "temperature": 0.0, "method": "eagle", "head": head, "k": 4, "tree": None,
                "draft_vocab_size": None, "speedup": speedup, "speedup_range": [speedup] * 2,
                "decode_speedup": speedup, "mean_acceptance_length": 1.5, "identical": True}
    best = best_rows([row("eagle-smollm2", 1.2), row("/tmp/new-head", 1.4), row("/tmp/new-head", 1.1)])
    assert sorted((b["head"], b["speedup"]) for b in best) == [("/tmp/new-head", 1.4), ("eagle-smollm2", 1.2)]
    only = rows_for(True, 4, 0.0, "smollm2-draft", methods=["eagle"])   # --head-methods eagle: plain stays
    assert [r.method for r in only] == ["none"] + ["eagle"] * 5


def test_at_t_above_0_eagle_trees_run_with_children_drawn_from_q():
    """At T > 0 `bench heads` runs EAGLE's static tree once more with its children drawn from q, and the drawn tree
    (DRAWN_ROOT_CHILDREN at the root, a chain under the first down to depth k); at T = 0 neither (greedy drafts)."""
    from speclab.bench.heads import DRAWN_ROOT_CHILDREN, drawn_tree, rows_for
    from speclab.spec_config import SpeculativeConfig
    from speclab.verify.tree import parse_tree

    assert drawn_tree(3) == "[(0,), (1,), (2,), (0, 0), (0, 0, 0)]"
    for k in range(1, 6):
        tree = parse_tree(drawn_tree(k))
        assert tree.num_nodes == DRAWN_ROOT_CHILDREN + k - 1 and tree.max_depth == k

    def drawn(rows):
        return [r for r in rows if r.tree and (r.spec or {}).get("draft_sample_method") == "probabilistic"]
    hot = rows_for(True, 3, 1.0, "smollm2-draft", methods=["eagle"])
    assert [(r.tree, r.k) for r in drawn(hot)] == [("[(0,), (1,), (2,)]", 3), (drawn_tree(3), 5)]
    for r in drawn(hot):
        SpeculativeConfig.from_dict(r.spec)  # a valid config: a static tree may draw its children
    assert drawn(rows_for(True, 3, 0.0, "smollm2-draft", methods=["eagle"])) == []
