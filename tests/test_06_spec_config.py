"""speculative_config: vLLM's keys, vLLM's validation rules, and messages that name the fix."""

import pytest

from speclab.spec_config import SpeculativeConfig


def test_ngram_defaults_follow_vllm():
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3})
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (5, 5)  # both unset: both 5
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (4, 4)  # one set: the other copies it
    cfg = SpeculativeConfig.from_dict({"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_min": 2})
    assert cfg.method == "ngram" and cfg.model is None


def test_method_inferred_from_a_draft_model():
    cfg = SpeculativeConfig.from_dict({"model": "draft", "num_speculative_tokens": 4})
    assert cfg.method == "draft_model" and cfg.draft_sample_method == "greedy"


@pytest.mark.parametrize("d,error,match", [
    ({"method": "ngram", "num_speculative_tokens": 0}, ValueError, "greater than zero"),
    ({"method": "ngram"}, ValueError, "num_speculative_tokens must be provided"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     ValueError, "prompt_lookup_min=4 must be <= prompt_lookup_max=2"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0}, ValueError, ">= 1"),
    ({"method": "draft_model", "num_speculative_tokens": 3}, ValueError, "needs a draft 'model'"),
    ({"method": "ngram", "num_speculative_tokens": 3, "model": "draft"}, ValueError, "takes no 'model'"),
    ({"num_speculative_tokens": 3}, ValueError, "needs 'method'"),
    ({"method": "dflash", "num_speculative_tokens": 3}, NotImplementedError, "not implemented"),
    ({"method": "beam", "num_speculative_tokens": 3}, NotImplementedError, "Unsupported speculative method"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup": 2}, ValueError,
     r"unknown speculative_config key\(s\) \['prompt_lookup'\]: valid keys are \['method'"),
    ({"method": "ngram", "num_speculative_tokens": 3, "tensor_parallel_size": 2}, ValueError,
     "draft_tensor_parallel_size"),
    ({"method": "draft_model", "model": "draft", "num_speculative_tokens": 3, "draft_sample_method": "beam"},
     ValueError, "draft_sample_method"),
])
def test_invalid_configs_are_refused_with_the_fix(d, error, match):
    with pytest.raises(error, match=match):
        SpeculativeConfig.from_dict(d)


def test_not_a_dict():
    with pytest.raises(TypeError, match="dict of vLLM's keys"):
        SpeculativeConfig.from_dict('{"method": "ngram"}')
