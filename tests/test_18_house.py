"""The house (issue 18): registries keyed by vLLM's names, one owner for k, a light package root.

The import graph itself (no circle, in-function imports included; how much `import speclab.verify`
loads; no function over 80 lines) is checked in tests/test_architecture.py.
"""

import pytest
import torch

import speclab
from speclab.engine.proposer import Proposer
from speclab.proposers import METHODS
from speclab.spec_config import SpeculativeConfig
from speclab.verify import RULES, rejection_sample
from speclab.verify.backend import get_rejection_sampler
from speclab.verify.rejection import rejection_sample as standard

VLLM_METHODS = ("ngram", "draft_model", "eagle", "eagle3", "mtp", "medusa", "suffix")


def test_the_proposer_registry_has_vllms_method_names():
    assert set(VLLM_METHODS) <= set(METHODS), sorted(set(VLLM_METHODS) - set(METHODS))
    assert all(callable(build) for build in METHODS.values())


@pytest.mark.parametrize("method", ["mlp_speculator", "dflash"])
def test_a_vllm_method_speclab_does_not_build_is_refused_by_name(method):
    with pytest.raises(NotImplementedError, match=f"{method!r} is not implemented in speclab yet"):
        SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": 3})


def test_llm_builds_its_proposer_through_the_registry(monkeypatch):
    """LLM has no if-chain of methods: replacing a registry entry replaces the proposer it builds."""
    built = []

    class Marker(Proposer):
        num_speculative_tokens = 2

        def propose(self, requests, max_drafts, forward=None):
            from speclab.engine.proposer import Proposal
            return [Proposal([]) for _ in requests]

    def build(spec, context):
        built.append((spec.num_speculative_tokens, context.block_size, context.target is not None))
        return Marker()

    monkeypatch.setitem(METHODS, "ngram", build)
    llm = speclab.LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 2}, block_size=8)
    assert isinstance(llm.engine.proposer, Marker) and built == [(2, 8, True)]
    out = llm.generate("def f():", speclab.SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4


def test_the_rule_registry_has_the_standard_rule_and_the_entry_point_dispatches():
    assert RULES["standard"] is standard
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(5, 11, generator=g), -1)
    args = (torch.tensor([3, 7, 1]), [2, 1], p)
    u = torch.rand(3, dtype=torch.float64, generator=g).clamp(min=1e-12)
    e = torch.empty(2, 11).exponential_(generator=g)
    assert torch.equal(rejection_sample(*args, uniforms=u, noise=e, method="standard"),
                       standard(*args, uniforms=u, noise=e))
    assert get_rejection_sampler("torch", "standard") is standard


@pytest.mark.parametrize("method, error", [("nonsense", ValueError), ("", ValueError)])
def test_an_unknown_rule_is_refused_with_the_choices(method, error):
    with pytest.raises(error, match="rejection_sample_method"):
        rejection_sample(torch.tensor([1]), [1], torch.full((2, 4), 0.25), method=method)
    with pytest.raises(error, match="rejection_sample_method"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, "rejection_sample_method": method})


def test_the_rule_reaches_the_engine_from_the_speculative_config():
    for method in ("standard", "block"):  # the torch implementation, so that a GPU machine checks the same
        llm = speclab.LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                              "rejection_sample_method": method}, verifier="torch")
        assert llm.engine.config.rejection_sample_method == method
        assert llm.engine.runner.verifier is RULES[method]


def test_the_speculative_config_is_the_one_owner_of_k():
    llm = speclab.LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert llm.speculative_config.num_speculative_tokens == llm.engine.config.num_speculative_tokens \
        == llm.engine.proposer.num_speculative_tokens == llm.engine.stats.num_speculative_tokens == 3


def test_the_package_root_exports_lazily():
    import subprocess
    import sys
    code = ("import sys, speclab; assert 'speclab.llm' not in sys.modules; "
            "from speclab import LLM, SamplingParams, rejection_sample, PLACEHOLDER_TOKEN_ID; "
            "assert 'speclab.llm' in sys.modules and PLACEHOLDER_TOKEN_ID == -1")
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        speclab.nonsense  # noqa: B018
