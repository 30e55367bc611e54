"""Fault containment: bad input gets a clear error at the API, and nothing a request does breaks the engine.

Each test is a regression test for a defect found by trying the engine as a hostile user would
(issue 9): one bad request used to leave an `LLM` broken for good, an interrupted call leaked its
requests into the next one, the draft proposer read another request's state, and several errors
surfaced deep inside torch.
"""

import threading

import pytest
import torch

from speclab import LLM, SamplingParams
from speclab.engine.config import EngineConfig
from speclab.engine.llm_engine import LLMEngine
from speclab.models.llama import load_llama
from speclab.proposers.draft_model import DraftModelProposer
from speclab.sampling import logits_to_probs
from speclab.spec_config import SpeculativeConfig
from tests.helpers import run_engine, tiny_llama

V = 37


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    hf = tiny_llama(root / "target", vocab_size=V, head_scale=8.0)
    tiny_llama(root / "draft", vocab_size=V, seed=1, like=hf, noise=0.5)
    return root / "target", root / "draft"


@pytest.fixture(scope="module")
def llm():
    return LLM(max_num_seqs=8, max_num_batched_tokens=256)


def assert_idle(engine):
    """Nothing queued or running, every KV block back in the pool."""
    assert not engine.has_unfinished() and not engine.scheduler.running and not engine.scheduler.waiting
    assert engine.kv.num_free_blocks == engine.kv.pool.num_blocks


# ----------------------------------------------------------------------------------------------
# SamplingParams and other input: vLLM-style errors at the API, no silent coercion


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=float("nan")), "temperature must be a finite number"),
    (dict(temperature=float("inf")), "temperature must be a finite number"),
    (dict(temperature=-0.5), "non-negative"),
    (dict(temperature="1.0"), "finite number"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=float("nan")), r"top_p must be in \(0, 1\]"),
    (dict(top_k=-2), "top_k must be 0 or -1"),
    (dict(top_k=2.5), "top_k must be 0 or -1"),
    (dict(max_tokens=0), "max_tokens must be at least 1"),
    (dict(max_tokens=4.0), "max_tokens must be at least 1"),
    (dict(seed=2**63), "seed must be an integer in the int64 range"),
    (dict(seed=1.5), "seed must be an integer in the int64 range"),
    (dict(stop_token_ids=[1.0]), "stop_token_ids must be a list"),
    (dict(ignore_eos=1), "ignore_eos must be True or False"),
])
def test_bad_sampling_params_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_a_tiny_temperature_is_greedy_not_nan(llm):
    """Dividing logits by 1e-38 overflows; vLLM treats temperatures below 1e-5 as greedy."""
    greedy = llm.generate("def f(x):", SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    tiny_t = llm.generate("def f(x):", SamplingParams(temperature=1e-38, max_tokens=8), use_tqdm=False)
    assert tiny_t[0].outputs[0].token_ids == greedy[0].outputs[0].token_ids
    assert not torch.isnan(logits_to_probs(torch.randn(2, 9), torch.tensor([1e-38, 1.0]))).any()


def test_params_mutated_after_construction_are_caught_and_the_llm_survives(llm):
    params = SamplingParams(temperature=0.7, max_tokens=4)
    params.temperature = float("nan")
    with pytest.raises(ValueError, match="temperature must be a finite number"):
        llm.generate(["a", "b"], params, use_tqdm=False)
    assert_idle(llm.engine)
    assert llm.generate("a", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0].outputs[0].token_ids


def test_a_queued_request_keeps_its_own_copy_of_params(tiny):
    target, _ = tiny
    eng = LLMEngine(load_llama(target), num_kv_blocks=32, block_size=4, max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    req = eng.add_request([1, 2, 3], params)
    params.max_tokens = 50
    while eng.has_unfinished():
        eng.step()
    assert len(req.output_token_ids) == 5


@pytest.mark.parametrize("prompt, match", [
    ({"prompt_token_ids": [1.0, 2]}, "must be integers"),
    ({"prompt_token_ids": [True, 2]}, "must be integers"),
    ({"prompt_token_ids": []}, "empty prompt"),
    ({"prompt_token_ids": [1, 10**9]}, r"must be in \[0, "),
    ({"token_ids": [1, 2]}, "exactly one key, 'prompt_token_ids'"),
    ([1, 2, 3], "is a string or"),
])
def test_bad_prompts_are_refused_before_anything_runs(llm, prompt, match):
    with pytest.raises((ValueError, TypeError), match=match):
        llm.generate(["def ok():", prompt], SamplingParams(max_tokens=4), use_tqdm=False)
    assert_idle(llm.engine)  # the valid first prompt was never queued


@pytest.mark.parametrize("config, match", [
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0, "prompt_lookup_max": 3},
     "prompt_lookup_min must be an integer >= 1"),
    ({"method": "ngram", "num_speculative_tokens": True}, "greater than zero"),
    ({"method": "ngram", "num_speculative_tokens": 2.0}, "greater than zero"),
])
def test_bad_speculative_config_is_refused(config, match):
    with pytest.raises(ValueError, match=match):
        SpeculativeConfig.from_dict(config)


@pytest.mark.parametrize("knobs, match", [
    (dict(max_num_batched_tokens=1, num_speculative_tokens=3, max_num_seqs=1), r"must be >= 1 \+ num_speculative_tokens"),
    (dict(max_num_batched_tokens=8, max_num_seqs=64), "must be >= max_num_seqs"),
    (dict(block_size=16.0), "block_size must be an integer"),
    (dict(num_kv_blocks=0), "num_kv_blocks must be >= 1"),
    (dict(verifier="cuda"), "verifier must be one of"),
])
def test_engine_config_checks_knobs_together(knobs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**{"num_kv_blocks": 16, **knobs})


@pytest.mark.parametrize("knobs, match", [(dict(num_kv_blocks=0), "num_kv_blocks must be >= 1"),
                                          (dict(block_size=16.0), "block_size must be an integer"),
                                          (dict(kv_cache_gb=0), "kv_cache_gb must be a positive number")])
def test_llm_refuses_bad_knobs_instead_of_coercing_them(knobs, match):
    with pytest.raises(ValueError, match=match):
        LLM(**knobs)


def test_draft_model_with_a_budget_of_one_token_is_refused_at_construction():
    """Used to crash inside torch at the first step."""
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(1\) must be >= max_num_seqs"):
        LLM(speculative_config={"method": "draft_model", "model": "draft", "num_speculative_tokens": 3},
            max_num_batched_tokens=1)
    with pytest.raises(ValueError, match=r"must be >= 1 \+ num_speculative_tokens"):
        LLM(speculative_config={"method": "draft_model", "model": "draft", "num_speculative_tokens": 3},
            max_num_batched_tokens=1, max_num_seqs=1)


# ----------------------------------------------------------------------------------------------
# Failures inside a call: contained to the call, the engine stays usable


def test_non_finite_logits_fail_that_request_only(tiny, monkeypatch):
    target, _ = tiny
    model = load_llama(target)
    eng = LLMEngine(model, num_kv_blocks=32, block_size=4, max_num_seqs=4)
    compute_logits = model.compute_logits
    poisoned = {"on": True}

    def nan_once(hidden):  # the first step's first row (request 0's) comes out NaN
        logits = compute_logits(hidden).clone()
        if poisoned["on"]:
            logits[0] = float("nan")
            poisoned["on"] = False
        return logits

    monkeypatch.setattr(model, "compute_logits", nan_once)
    reqs = eng.generate([[1, 5], [2, 3]], SamplingParams(temperature=1.0, max_tokens=4, seed=0, ignore_eos=True))
    assert reqs[0].finish_reason == "error" and "NaN or inf logits" in reqs[0].error
    assert reqs[1].finish_reason == "length" and len(reqs[1].output_token_ids) == 4
    assert_idle(eng)
    assert run_engine(eng, [[1, 5]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]


def test_llm_generate_raises_for_a_failed_request_and_stays_usable(llm, monkeypatch):
    compute_logits = llm.model.compute_logits
    with monkeypatch.context() as m:
        m.setattr(llm.model, "compute_logits", lambda h: compute_logits(h) * float("nan"))
        with pytest.raises(RuntimeError, match="requests failed.*NaN or inf logits.*remains usable"):
            llm.generate(["x = 1", "y = 2"], SamplingParams(max_tokens=3), use_tqdm=False)
    assert_idle(llm.engine)
    assert len(llm.generate("x = 1", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
               .outputs[0].token_ids) == 3


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_call_aborts_exactly_its_requests(llm, monkeypatch, exc):
    """Used to leave the call's requests queued: they then ran inside the next call (23 s for 4 tokens)."""
    step, calls = llm.engine.step, []

    def interrupted():
        calls.append(1)
        if len(calls) == 3:
            raise exc("stop")
        return step()

    with monkeypatch.context() as m:
        m.setattr(llm.engine, "step", interrupted)
        with pytest.raises(exc):
            llm.generate(["a = 1", "b = 2", "c = 3"], SamplingParams(max_tokens=200, ignore_eos=True), use_tqdm=False)
    assert_idle(llm.engine)
    out = llm.generate("d = 4", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) <= 4


def test_abort_frees_a_request_and_the_others_finish(tiny):
    target, draft = tiny
    proposer = DraftModelProposer(load_llama(draft), 2, num_kv_blocks=64, block_size=4)
    eng = LLMEngine(load_llama(target), num_kv_blocks=64, block_size=4, max_num_seqs=4, proposer=proposer)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    a, b = eng.add_request([1, 2, 3], params), eng.add_request([4, 5], params)
    eng.step()
    eng.step()
    assert eng.abort([a.request_id])[0].finish_reason == "abort"
    while eng.has_unfinished():
        eng.step()
    assert len(b.output_token_ids) == 10 and a.finish_reason == "abort"
    assert_idle(eng)
    assert proposer.kv.num_free_blocks == proposer.kv.pool.num_blocks and not proposer.computed


def test_a_second_thread_gets_a_clear_error(llm, monkeypatch):
    started, release = threading.Event(), threading.Event()
    step = llm.engine.step

    def slow_step():
        started.set()
        release.wait(10)
        return step()

    errors = []
    with monkeypatch.context() as m:
        m.setattr(llm.engine, "step", slow_step)
        worker = threading.Thread(target=lambda: llm.generate("a", SamplingParams(max_tokens=2), use_tqdm=False))
        worker.start()
        started.wait(10)
        try:
            llm.generate("b", SamplingParams(max_tokens=2), use_tqdm=False)
        except RuntimeError as err:
            errors.append(str(err))
        release.set()
        worker.join(10)
    assert errors and "not re-entrant" in errors[0]
    assert_idle(llm.engine)


def test_top_p_one_keeps_its_tail_next_to_a_top_p_batch_mate():
    """A float cumsum can pass 1 before the last token: a top_p=1 row must still keep every token."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 5000, generator=g) * 4)
    probs = logits_to_probs(logits, 1.0, 0, torch.tensor([1.0, 0.5]))
    assert (probs[0] > 0).all(), f"{int((probs[0] == 0).sum())} tokens lost from a top_p=1 row"
    torch.testing.assert_close(probs[0], logits[0].softmax(-1))


# ----------------------------------------------------------------------------------------------
# The draft proposer: drafts only for scheduled requests, never reads another request's state


def test_draft_proposer_under_a_budget_that_truncates_to_one_token(tiny):
    """Budget 5 with k = 3: when one request takes 1 + 3 tokens its batch-mate gets 1 (drafts
    dropped) or none. A spy checks that the draft proposes only for requests that sampled this
    step, that no catch-up chunk is empty, and that every chunk's tokens are the request's own."""
    target, draft = tiny
    proposer = DraftModelProposer(load_llama(draft), 3, num_kv_blocks=256, block_size=4)
    eng = LLMEngine(load_llama(target), num_kv_blocks=64, block_size=4, max_num_batched_tokens=5, max_num_seqs=3,
                    proposer=proposer)
    forward, propose, seen = proposer._forward, proposer.propose, {"truncated": 0, "skipped": 0}
    sampled_ids: set[str] = set()

    def spy_forward(chunks):
        for r, tokens, start in chunks:
            assert tokens, f"empty draft chunk for request {r.request_id}"
            known = r.all_token_ids[start:start + len(tokens)]
            assert tokens[:len(known)] == known, f"request {r.request_id}: chunk {tokens} != its tokens {known}"
        return forward(chunks)

    def spy_propose(requests, max_drafts):
        assert {r.request_id for r in requests} <= sampled_ids, "drafted for a request that did not sample"
        return propose(requests, max_drafts)

    step = eng.runner.execute

    def spy_execute(output):
        sampled_ids.clear()
        sampled_ids.update(s.request.request_id for s in output.scheduled if s.samples)
        ids = {s.request.request_id for s in output.scheduled}
        seen["skipped"] += sum(r.request_id not in ids for r in eng.scheduler.running)
        seen["truncated"] += sum(s.samples and s.num_draft_tokens == 0 < len(s.request.spec_token_ids)
                                 for s in output.scheduled)  # cut to its one new token, drafts dropped
        return step(output)

    proposer._forward, proposer.propose, eng.runner.execute = spy_forward, spy_propose, spy_execute
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = [[1, 2], [4], [6, 7]]  # all three admitted by the first step's budget of 5
    outs = run_engine(eng, prompts, params)
    assert seen["truncated"] > 0 and seen["skipped"] > 0, seen
    plain = LLMEngine(load_llama(target), num_kv_blocks=64, block_size=4, max_num_seqs=3)
    assert outs == run_engine(plain, prompts, params)
    assert_idle(eng)
    assert proposer.kv.num_free_blocks == proposer.kv.pool.num_blocks


@pytest.mark.parametrize("config_k, proposer_k", [(0, 2), (3, 2), (2, None)])
def test_a_config_and_proposer_that_disagree_on_k_are_refused_naming_both(tiny, config_k, proposer_k):
    """k has one owner (the speculative config): an explicit EngineConfig whose k differs from the
    proposer's used to crash at the first verified draft; now construction refuses it."""
    target, draft = tiny
    proposer = DraftModelProposer(load_llama(draft), proposer_k, num_kv_blocks=64, block_size=4) if proposer_k else None
    config = EngineConfig(num_kv_blocks=64, block_size=4, num_speculative_tokens=config_k)
    with pytest.raises(ValueError, match=rf"EngineConfig.num_speculative_tokens={config_k} but "
                                         rf"(the proposer drafts num_speculative_tokens={proposer_k}|there is no proposer)"):
        LLMEngine(load_llama(target), config, proposer=proposer)
    agree = EngineConfig(num_kv_blocks=64, block_size=4, num_speculative_tokens=proposer_k or 0)
    eng = LLMEngine(load_llama(target), agree, proposer=proposer)  # the same k on both sides is accepted
    out = eng.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert len(out[0].output_token_ids) == 6
