"""`LLM`: the offline front end, shaped like vLLM's, so a script moves to vLLM by changing the import.

    from speclab import LLM, SamplingParams
    llm = LLM()                                      # the embedded target
    outs = llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].outputs[0].text)
"""

import contextlib
import dataclasses
import numbers
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from speclab.engine.config import EngineConfig
from speclab.engine.llm_engine import LLMEngine, default_num_kv_blocks
from speclab.engine.proposer import ProposerContext
from speclab.engine.request import RequestFailedError
from speclab.metrics import metrics_list, prometheus_text
from speclab.models.hub import model_directory
from speclab.models.llama import load_llama
from speclab.proposers import make_proposer
from speclab.sampling_params import SamplingParams
from speclab.spec_config import SpeculativeConfig

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "model_directory", "resolve_dtype",
           "shared_weights"]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True


DTYPE_NAMES = {"float32": torch.float32, "float": torch.float32, "bfloat16": torch.bfloat16,
               "float16": torch.float16, "half": torch.float16}  # vLLM's --dtype choices, and "auto"


_SHARED: dict | None = None  # (checkpoint, dtype, device) -> model, inside `shared_weights()`


@contextlib.contextmanager
def shared_weights():
    """Within this block, every `LLM` built from the same checkpoint, dtype and device shares one copy
    of the target's weights (each keeps its own KV pool, scheduler and proposer). For benchmarks and
    the demo, whose rows build one LLM each: SmolLM2's 540 MB of float32 weights once, not per row.
    Outside it each LLM loads its own (a test that changes one model's weights changes no other)."""
    global _SHARED
    outer, _SHARED = _SHARED, {} if _SHARED is None else _SHARED
    try:
        yield
    finally:
        _SHARED = outer


def _load_target(path: Path, dtype: torch.dtype, device: str):
    if _SHARED is None:
        return load_llama(path, dtype=dtype, device=device)
    key = (str(Path(path).resolve()), dtype, str(device))
    if key not in _SHARED:
        _SHARED[key] = load_llama(path, dtype=dtype, device=device)
    return _SHARED[key]


def check_dtype(dtype) -> None:
    """Raise a ValueError naming the choices unless `dtype` is a floating torch dtype or one of vLLM's names."""
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return
    if isinstance(dtype, str) and (dtype == "auto" or dtype in DTYPE_NAMES):
        return
    raise ValueError(f"dtype must be a floating torch.dtype (torch.float32, torch.bfloat16) or one of vLLM's names "
                     f"{['auto', *DTYPE_NAMES]}, got {dtype!r}")


def resolve_dtype(dtype, path: Path, device: str = "cpu") -> torch.dtype:
    """The torch dtype to run the checkpoint at `path` in.

    "auto" is the checkpoint's own dtype (config.json's `dtype` or `torch_dtype`; float32 when it
    names none), except that a float16 checkpoint runs in float32 on a CPU: torch has no fast
    float16 matmul on most CPUs, and float32 is the course's reference (bfloat16 is a choice to make
    on purpose: its rounding can change a greedy token, see tests/test_10_smollm2_spec.py).
    """
    check_dtype(dtype)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        return DTYPE_NAMES[dtype]
    import json
    config = json.loads((Path(path) / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    resolved = DTYPE_NAMES.get(str(name).removeprefix("torch."), torch.float32)
    return torch.float32 if resolved == torch.float16 and str(device).startswith("cpu") else resolved


class LLM:
    """Args:
        model: None (the embedded target), "target"/"draft", a checkpoint directory, or a hub id.
        tokenizer: a tokenizer directory if it is not the model's.
        speculative_config: vLLM's keys (see speclab.spec_config), or None for plain decoding.
        block_size: tokens per KV block.
        num_kv_blocks: blocks in the pool; default: enough for max_num_seqs full-context requests,
            capped at kv_cache_gb.
        max_num_batched_tokens, max_num_seqs: the scheduler's budget per step.
        seed: the stream for requests without their own seed.
        dtype: weights and cache dtype: a torch dtype or vLLM's names, "float32" (the default),
            "bfloat16", "float16", "auto" (see `resolve_dtype`). Logits, probabilities and
            verification are float32 whatever it is.
        verifier: "torch", "triton" or "auto" (Triton kernels on a GPU); None reads SPECLAB_VERIFIER.
        disable_log_stats: vLLM's switch: True makes `get_metrics()` refuse (the counters still count,
            for `metrics_text()` and the lessons); vLLM's default is True, speclab's False.
        enable_prefix_caching: share the KV blocks of prompt prefixes computed before (vLLM's
            automatic prefix caching, speclab.kv_cache); vLLM's default is True, speclab's False.

    One `generate` call at a time: the engine is not re-entrant (a second thread gets a clear error).
    """

    def __init__(self, model=None, *, tokenizer=None, speculative_config: dict | None = None,
                 block_size: int = 16, num_kv_blocks: int | None = None, kv_cache_gb: float = 1.0,
                 max_num_batched_tokens: int = 2048, max_num_seqs: int = 64, seed: int = 0,
                 dtype: torch.dtype | str = torch.float32, device: str = "cpu", verifier: str | None = None,
                 disable_log_stats: bool = False, enable_prefix_caching: bool = False):
        if model is not None and not isinstance(model, (str, Path)):
            raise TypeError(f"model must be None (the embedded target), a name such as 'smollm2', a checkpoint "
                            f"directory or a hub id, got {type(model).__name__} {model!r}")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63 - 1] (the engine's int64 stream), got {seed!r}")
        spec = SpeculativeConfig.from_dict(speculative_config) if speculative_config is not None else None
        k = spec.num_speculative_tokens if spec else 0
        check_dtype(dtype)
        if not isinstance(kv_cache_gb, (int, float)) or isinstance(kv_cache_gb, bool) or not kv_cache_gb > 0:
            raise ValueError(f"kv_cache_gb must be a positive number, got {kv_cache_gb!r}")
        config = EngineConfig(num_kv_blocks=1 if num_kv_blocks is None else num_kv_blocks, block_size=block_size,
                              max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, seed=seed,
                              verifier=verifier, num_speculative_tokens=k,  # checked before any model is loaded
                              rejection_sample_method=spec.rejection_sample_method if spec else "standard",
                              enable_prefix_caching=enable_prefix_caching)
        path = model_directory(model)
        dtype = resolve_dtype(dtype, path, device)
        self.model = _load_target(path, dtype, device)
        from transformers import AutoTokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_directory(tokenizer) if tokenizer else path))
        if num_kv_blocks is None:
            num_kv_blocks = default_num_kv_blocks(self.model, block_size, max_num_seqs, kv_cache_gb)
            config = dataclasses.replace(config, num_kv_blocks=num_kv_blocks)
        proposer = None
        if spec is not None:  # the registry builds it: one line per method in speclab.proposers.METHODS
            context = ProposerContext(self.model, model, self.tokenizer, dtype, device, block_size, num_kv_blocks,
                                      max_num_seqs)
            proposer = make_proposer(spec, context)
            config = dataclasses.replace(config, num_lookahead_tokens=proposer.num_lookahead_tokens)
        self.speculative_config = spec
        self.engine = LLMEngine(self.model, config, proposer=proposer,
                                spec_policy=spec.make_policy() if spec is not None else None)
        self._lock = threading.Lock()
        self.log_stats = not disable_log_stats

    def get_metrics(self) -> list:
        """vLLM's shape: a list of metric objects (`speclab.metrics.Counter`, `Vector`) named
        `speclab:spec_decode_*`, empty without speculation; `speclab.metrics.spec_decode_counters`
        turns it (or vLLM's list) into the dict of counters and rates. speclab counts whatever
        `disable_log_stats` says (vLLM counts only with disable_log_stats=False, its default True)."""
        if not self.log_stats:
            raise ValueError("Stat logging disabled. Call LLM(disable_log_stats=False) to use metrics.")
        return metrics_list(self.engine.stats) if self.speculative_config is not None else []

    def get_tokenizer(self):
        """vLLM's name for the tokenizer (speclab's `llm.tokenizer` is the same object)."""
        return self.tokenizer

    def metrics_text(self) -> str:
        """The same counters in Prometheus' text format, under the `speclab:` prefix."""
        return prometheus_text(self.engine.stats)

    def chat(self, messages, sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True) -> list[RequestOutput]:
        """vLLM's offline chat: one conversation (a list of {"role", "content"} dicts) or a list of
        them, rendered by the tokenizer's chat template; generation stops at the template's end token."""
        from speclab.chat import chat_prompt_ids, chat_stop_token_ids, conversations

        convs = conversations(messages)
        params = SamplingParams() if sampling_params is None else sampling_params
        params = list(params) if isinstance(params, (list, tuple)) else [params] * len(convs)
        if len(params) != len(convs):
            raise ValueError(f"{len(params)} sampling_params for {len(convs)} conversations: give one, or one each")
        stop = chat_stop_token_ids(self.tokenizer)
        params = [dataclasses.replace(p, stop_token_ids=list(dict.fromkeys([*p.stop_token_ids, *stop])))
                  for p in params]
        return self.generate([{"prompt_token_ids": chat_prompt_ids(self.tokenizer, c)} for c in convs], params,
                             use_tqdm=use_tqdm)

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            if set(prompt) != {"prompt_token_ids"}:
                raise ValueError(f"a dict prompt takes exactly one key, 'prompt_token_ids'; got {sorted(prompt)}")
            return prompt["prompt_token_ids"]
        raise TypeError(f"a prompt is a string or {{'prompt_token_ids': [...]}}, got {type(prompt).__name__}: "
                        f"wrap token ids as {{'prompt_token_ids': ids}}")

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for a batch of prompts, in order.

        Every prompt and parameter is checked before anything runs; if the call fails or is
        interrupted, its requests are aborted (nothing of it runs inside a later call). A request
        whose step failed (e.g. NaN logits) makes the call raise after the others have finished.

        Args:
            prompts: a string, a list of strings, or vLLM-style {"prompt_token_ids": [...]} dicts.
            sampling_params: one for all prompts, or one per prompt (default: SamplingParams()).
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(f"prompts must be a string, a dict or a list of them, got {type(prompts).__name__}")
        params = SamplingParams() if sampling_params is None else sampling_params
        if isinstance(params, (list, tuple)) and len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling_params for {len(prompts)} prompts: give one, or one per prompt")
        ids = [self._prompt_ids(p) for p in prompts]
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("LLM.generate is not re-entrant: another thread is generating with this LLM; "
                               "wait for it, or give each thread its own LLM")
        try:
            bar = tqdm(total=len(ids), desc="generate", disable=not use_tqdm or len(ids) < 2)
            requests = self.engine.generate(ids, list(params) if isinstance(params, (list, tuple)) else params,
                                            on_finish=lambda done: bar.update(len(done)))
            bar.close()
        finally:
            self._lock.release()
        outputs = [RequestOutput(req.request_id, text if isinstance(text, str) else None, req.prompt_token_ids,
                                 [CompletionOutput(0, self.tokenizer.decode(req.output_token_ids, skip_special_tokens=True),
                                                   list(req.output_token_ids), req.finish_reason)])
                   for text, req in zip(prompts, requests)]
        failed = [(i, r) for i, r in enumerate(requests) if r.finish_reason == "error"]
        if failed:
            i, r = failed[0]
            raise RequestFailedError(f"{len(failed)} of {len(requests)} requests failed; prompt {i}: {r.error} (the "
                                     f"others finished: their outputs are in this error's .outputs; this LLM "
                                     f"remains usable)", outputs)
        return outputs
