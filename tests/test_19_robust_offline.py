"""Issue 19, offline: parameters are checked in the float32/int64 form the engine computes in, a
failure inside one request's rows fails that request alone, a failed step fails only its requests,
and the valid requests of a mixed batch keep their outputs.

The values are the probe's (D10, D17, D18): each used to pass validation and then fail the whole
step deep in torch ("Overflow when unpacking long long", a float32 inf temperature, a top_p that
rounds to 0), or to alias silently (seeds >= 2**64, an iterator of stop ids read twice).
"""

import pytest

from speclab import LLM, SamplingParams
from speclab.engine.request import RequestFailedError
from speclab.sampling_params import FLOAT32_MAX, FLOAT32_TINY


@pytest.fixture(scope="module")
def llm():
    return LLM(max_num_seqs=8, max_num_batched_tokens=256)


PROMPTS = ["def add(a, b):", "import os\n", "class Stack:"]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def assert_idle(engine):
    assert not engine.has_unfinished()
    assert engine.kv.num_free_blocks == engine.kv.pool.num_blocks


@pytest.mark.parametrize("kwargs, needle", [
    (dict(temperature=1e300), "overflows float32"),
    (dict(temperature=FLOAT32_MAX * 1.0000001), "overflows float32"),
    (dict(top_p=1e-50), "rounds to 0 in float32"),
    (dict(top_p=FLOAT32_TINY / 2), "rounds to 0 in float32"),
    (dict(seed=2**64), "int64 range"),
    (dict(seed=2**63), "int64 range"),
    (dict(seed=-(2**63) - 1), "int64 range"),
])
def test_values_the_engine_cannot_represent_are_refused_when_made(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        SamplingParams(**kwargs)


def test_boundary_values_are_accepted_and_run(llm):
    """The edges of the float32/int64 ranges are valid and generate (negative controls for the refusals)."""
    edge = [SamplingParams(temperature=FLOAT32_MAX, max_tokens=3, seed=0, ignore_eos=True),
            SamplingParams(temperature=1.0, top_p=FLOAT32_TINY, max_tokens=3, ignore_eos=True),
            SamplingParams(temperature=1.0, max_tokens=3, seed=2**63 - 1, ignore_eos=True),
            SamplingParams(temperature=1.0, max_tokens=3, seed=-(2**63), ignore_eos=True)]
    outs = llm.generate([PROMPTS[0]] * len(edge), edge, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 3 for o in outs)
    # top_p this small keeps only the most likely token: the greedy output
    greedy = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert outs[1].outputs[0].token_ids == greedy[0].outputs[0].token_ids
    assert_idle(llm.engine)


def test_top_k_at_or_above_the_vocabulary_means_disabled(llm):
    """vLLM's rule: top_k >= V keeps everything. 10**30 (past int64) used to crash the step."""
    V = llm.model.config.vocab_size
    kw = dict(temperature=0.8, max_tokens=10, seed=3, ignore_eos=True)
    want = llm.generate(PROMPTS[1], SamplingParams(top_k=0, **kw), use_tqdm=False)[0].outputs[0].token_ids
    for k in (V, V + 1, 2**63, 10**30):
        got = llm.generate(PROMPTS[1], SamplingParams(top_k=k, **kw), use_tqdm=False)[0].outputs[0].token_ids
        assert got == want, f"top_k={k} must mean 'disabled'"
    small = llm.generate(PROMPTS[1], SamplingParams(top_k=1, **kw), use_tqdm=False)[0].outputs[0].token_ids
    assert small != want, "negative control: top_k=1 is greedy, not the seeded sample"
    req = llm.engine.add_request([1, 2, 3], SamplingParams(top_k=10**30, max_tokens=1))
    assert req.params.top_k == 0, "the queued copy stores 'disabled' as 0"
    llm.engine.abort([req.request_id])


def test_negative_seeds_are_seeds_of_their_own(llm):
    """vLLM accepts any int64 seed; -1 is not 'no seed' and not an alias of another seed."""
    kw = dict(temperature=1.0, max_tokens=12, ignore_eos=True)
    run = lambda s: llm.generate(PROMPTS[2], SamplingParams(seed=s, **kw), use_tqdm=False)[0].outputs[0].token_ids  # noqa: E731
    assert run(-1) == run(-1)
    assert len({tuple(run(s)) for s in (-1, 1, 2**64 - 1 - 2**63, -7)}) >= 3


def test_stop_token_ids_iterators_are_read_once():
    """An iterator used to be consumed by validate() (the stop never matched); a generator broke clone()."""
    it = SamplingParams(stop_token_ids=iter([5, 6]))
    assert it.stop_token_ids == [5, 6] and it.clone().stop_token_ids == [5, 6]
    gen = SamplingParams(stop_token_ids=(t for t in [7]))
    assert gen.clone().stop_token_ids == [7]
    p = SamplingParams()
    p.stop_token_ids = iter([1])  # changed after it was made: refused, not consumed
    with pytest.raises(ValueError, match="stop_token_ids must be a list"):
        p.validate()


def test_stop_token_ids_outside_the_vocabulary_are_refused(llm):
    V = llm.model.config.vocab_size
    with pytest.raises(ValueError, match=rf"stop_token_ids must be in \[0, {V}\)"):
        llm.generate("x", SamplingParams(stop_token_ids=[V]), use_tqdm=False)
    assert_idle(llm.engine)


class _Unusable(SamplingParams):
    """A request whose params become unusable behind the engine's back (a stand-in for any value that
    could slip past validation): the runner must fail this request and sample the others."""

    def engine_problem(self):
        return "injected: this request's params cannot become float32 rows"


def test_one_requests_bad_rows_fail_only_it_and_the_others_keep_their_outputs(llm):
    want = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    bad = _Unusable(temperature=0, max_tokens=8, ignore_eos=True)
    with pytest.raises(RequestFailedError, match="1 of 3 requests failed; prompt 1: injected") as e:
        llm.generate(PROMPTS, [GREEDY, bad, GREEDY], use_tqdm=False)
    outs = e.value.outputs
    assert [outs[0].outputs[0].token_ids, outs[2].outputs[0].token_ids] == [want[0], want[2]]
    assert outs[1].outputs[0].finish_reason == "error" and outs[1].outputs[0].token_ids == []
    assert_idle(llm.engine)


def test_a_mutated_queued_request_fails_alone_in_a_mixed_batch(llm):
    """The engine's own copy of a request changed to the probe's D10 values after queueing (what
    validation can no longer see): that request ends with an error, the sampled ones are unaffected."""
    eng = llm.engine
    params = SamplingParams(temperature=0.9, max_tokens=6, seed=11, ignore_eos=True)
    want = llm.generate(PROMPTS, params, use_tqdm=False)
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    for field, value in [("temperature", 1e300), ("top_p", 1e-50), ("top_k", 10**30)]:
        reqs = [eng.add_request(i, params) for i in ids]
        setattr(reqs[1].params, field, value)
        while eng.has_unfinished():
            eng.step()
        assert reqs[1].finish_reason == "error" and field in reqs[1].error
        assert [reqs[0].output_token_ids, reqs[2].output_token_ids] == \
            [want[0].outputs[0].token_ids, want[2].outputs[0].token_ids], field
        assert_idle(eng)


def test_a_failed_step_fails_its_requests_and_the_engine_goes_on(llm, monkeypatch):
    eng = llm.engine
    execute, calls = eng.runner.execute, []

    def fails_third_step(output):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected kernel failure")
        return execute(output)

    monkeypatch.setattr(eng.runner, "execute", fails_third_step)
    with pytest.raises(RequestFailedError, match="the engine step failed .RuntimeError: injected kernel failure"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert_idle(eng)
    want = LLM(max_num_seqs=8).generate(PROMPTS, GREEDY, use_tqdm=False)
    got = llm.generate(PROMPTS, GREEDY, use_tqdm=False)  # the next call, on the same engine
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]


def test_llm_constructor_refuses_bad_types_and_seeds_clearly():
    with pytest.raises(TypeError, match="model must be None .*got int 123"):
        LLM(model=123)
    for seed in (2**64, 2**63, -1, 1.5):
        with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*63 - 1\]"):
            LLM(seed=seed)


def test_a_head_named_as_a_draft_model_names_the_method():
    from speclab.spec_config import SpeculativeConfig
    with pytest.raises(ValueError, match="'eagle' is a head, not a draft model: use method 'eagle'"):
        SpeculativeConfig.from_dict({"method": "draft_model", "model": "eagle", "num_speculative_tokens": 2})
    assert SpeculativeConfig.from_dict({"method": "draft_model", "model": "draft", "num_speculative_tokens": 2})
