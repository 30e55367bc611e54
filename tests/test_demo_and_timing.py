"""The demo's choices that need no model run, `time_breakdown`'s bookkeeping and the CPU name benchmarks record
(no speed asserted)."""

import pytest
import torch

from speclab import LLM, SamplingParams, demo
from speclab.data.prompts import load_prompts
from speclab.timing import time_breakdown


def test_an_unbuilt_draft_is_reported_with_how_to_build_it_and_never_fetched(monkeypatch):
    import huggingface_hub

    def no_network(*a, **kw):
        raise AssertionError("the demo must not download a model")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    monkeypatch.setattr(demo, "DRAFT_NAME", "no-such-draft-built-here")
    rows, missing = demo.real_methods()
    assert [name for name, _ in rows] == ["n-gram, k=5", "EAGLE head, 3-star", "EAGLE, 3-star + n-gram 3"]  # the head ships
    assert missing[0].startswith("draft not available: ") and "python -m speclab.train.smollm2_draft" in missing[0]


def test_a_draft_that_resolves_to_a_directory_gets_a_row(monkeypatch):
    from speclab.models.hub import checkpoint_dir
    monkeypatch.setattr(demo, "DRAFT_NAME", str(checkpoint_dir("draft")))
    rows, _ = demo.real_methods()
    assert rows[1][1] == {"method": "draft_model", "model": str(checkpoint_dir("draft")),
                          "num_speculative_tokens": 3, "speculative_token_tree": "[(0,), (1,), (2,)]",
                          "draft_dtype": demo.DRAFT_DTYPE}  # no token ranking: the whole vocabulary
    assert {k: rows[2][1][k] for k in ("num_speculative_tokens", "speculative_token_tree")} == {
        "num_speculative_tokens": 3, "speculative_token_tree": "[(0,), (1,), (2,)]"}  # EAGLE's row: the same star
    assert rows[3][1] == {**rows[2][1], "num_speculative_tokens": 6, "graft_method": "ngram", "prompt_lookup_min": 2,
                          "prompt_lookup_max": 3}  # and again with prompt lookup's chain grafted in (lesson 10)


def test_the_smollm2_draft_row_scores_the_reduced_vocabulary_where_its_ranking_ships(monkeypatch, tmp_path):
    import shutil

    from speclab.models.draft_vocab import RANKING_FILE
    from speclab.models.hub import checkpoint_dir
    shutil.copytree(checkpoint_dir("draft"), tmp_path / "d")
    (tmp_path / "d" / RANKING_FILE).write_text("{}")
    monkeypatch.setattr(demo, "DRAFT_NAME", str(tmp_path / "d"))
    rows, _ = demo.real_methods()
    assert rows[1][1]["draft_vocab_size"] == demo.smollm2_draft.DRAFT_VOCAB


@pytest.mark.parametrize("config", [None, {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                           "prompt_lookup_min": 1}])
def test_time_breakdown_parts_add_up_and_the_wrappers_are_removed(config):
    llm = LLM(speculative_config=config, max_num_seqs=2)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = load_prompts("copy")[:2]
    before = llm.generate(prompts, params, use_tqdm=False)
    with time_breakdown(llm.engine) as t:
        during = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in during] == [o.outputs[0].token_ids for o in before]
    assert t.steps >= 12 / (1 + (config or {}).get("num_speculative_tokens", 0))
    assert t["target forward"] > 0 and t["verify"] > 0 and (t["propose"] > 0) == (config is not None)
    assert abs(sum(t[p] for p in ("target forward", "propose", "verify", "other")) - t["total"]) < 1e-9
    assert "forward" not in vars(llm.model) and "verify" not in vars(llm.engine.runner)
    assert abs(sum(t.shares().values()) - 1) < 1e-9


def test_without_prefill_takes_out_the_prompt_forwards():
    llm = LLM(max_num_seqs=1)
    prompts = load_prompts("code")[:2]
    with time_breakdown(llm.engine) as t:
        for p in prompts:
            llm.generate([p], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    assert t.steps == 2 * 6 and [n > 1 for n, _ in t.forwards].count(True) == 2   # a prefill, then 5 decodes
    d = t.without_prefill(1)
    assert d.steps == 10 and d["total"] < t["total"] and d["verify"] == t["verify"]
    assert abs(t["target forward"] - d["target forward"] - sum(s for n, s in t.forwards if n > 1)) < 1e-12


def test_a_draft_that_does_not_fit_the_target_loses_its_row_with_the_reason():
    from speclab.models.hub import checkpoint_dir
    rows = [("draft model, k=4", {"method": "draft_model", "model": str(checkpoint_dir("draft")) + "-missing",
                                  "num_speculative_tokens": 4})]
    missing = []
    llms = demo.load_llms("target", rows, missing)
    assert rows == [] and list(llms) == [None]
    assert missing[0].startswith("draft model, k=4 not available: ") and "-missing" in missing[0]


def test_the_demo_s_rows_load_in_the_dtype_asked_for(monkeypatch):
    """`--dtype bfloat16` reaches every row's LLM (the embedded target stands in for SmolLM2 here)."""
    rows = [("n-gram, k=5", {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3,
                             "prompt_lookup_min": 1})]
    llms = demo.load_llms("target", rows, [], dtype="bfloat16")
    assert {llm.model.lm_head.weight.dtype for llm in llms.values()} == {torch.bfloat16}
    seen = []
    monkeypatch.setattr(demo, "real_demo", lambda *a, **kw: seen.append(kw["dtype"]))
    monkeypatch.setattr("speclab.models.smollm2.is_available", lambda: True)
    demo.main(["--dtype", "bfloat16"])
    assert seen == ["bfloat16"]
    with pytest.raises(SystemExit):
        demo.main(["--dtype", "float16"])  # refused by argparse, with the choices named


def test_cpu_name_tells_the_vector_instructions_a_model_name_hides(tmp_path):
    from speclab.cpu_info import cpu_name
    block = "processor\t: {i}\ncpu family\t: {fam}\nmodel\t\t: {model}\nmodel name\t: {name}\nflags\t\t: {flags}\n\n"
    cases = [("AMD EPYC", 25, 17, "fpu avx2 avx512f avx512_bf16", "AMD EPYC (family 25 model 17; AVX-512, AVX512-BF16)"),
             ("AMD EPYC", 25, 1, "fpu avx2", "AMD EPYC (family 25 model 1; AVX2)"),
             ("Intel(R) Xeon(R)", 6, 143, "avx2 avx512f avx512_bf16 amx_tile", "Intel(R) Xeon(R) (family 6 model 143; AVX-512, AVX512-BF16, AMX)")]
    for name, fam, model, flags, want in cases:
        f = tmp_path / "cpuinfo"
        # two processors: only the first block is read
        f.write_text(block.format(i=0, fam=fam, model=model, name=name, flags=flags)
                     + block.format(i=1, fam=0, model=0, name="other", flags=""))
        assert cpu_name(str(f)) == want
    assert cpu_name(str(tmp_path / "absent"))  # no /proc/cpuinfo: platform's name, never an error
