"""`LLM`: the offline front end, shaped like vLLM's, so a script moves to vLLM by changing the import.

    from speclab import LLM, SamplingParams
    llm = LLM()                                      # the embedded target
    outs = llm.generate(["def add(a, b):"], SamplingParams(temperature=0, max_tokens=32))
    print(outs[0].outputs[0].text)
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from speclab.engine.llm_engine import LLMEngine
from speclab.metrics import prometheus_text
from speclab.models.llama import LlamaForCausalLM, load_llama
from speclab.proposers.draft_model import DraftModelProposer
from speclab.proposers.ngram import NgramProposer
from speclab.sampling_params import SamplingParams
from speclab.spec_config import SpeculativeConfig


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


def model_directory(model) -> Path:
    """A local checkpoint directory for `model`: None = the embedded target, a name of the embedded
    pair, a directory, or a hub id (fetched only because the user named it)."""
    from speclab.models.hub import _resolve

    where, local = _resolve(model, "target")
    if local:
        return Path(where)
    from huggingface_hub import snapshot_download
    return Path(snapshot_download(where, allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))


class LLM:
    """Args:
        model: None (the embedded target), "target"/"draft", a checkpoint directory, or a hub id.
        tokenizer: a tokenizer directory if it is not the model's.
        block_size: tokens per KV block.
        num_kv_blocks: blocks in the pool; default: enough for max_num_seqs full-context requests,
            capped at kv_cache_gb.
        max_num_batched_tokens, max_num_seqs: the scheduler's budget per step.
        seed: the stream for requests without their own seed.
        dtype: weights and cache dtype.
        verifier: "torch", "triton" or "auto" (Triton kernels on a GPU); None reads SPECLAB_VERIFIER.
    """

    def __init__(self, model=None, *, tokenizer=None, speculative_config: dict | None = None,
                 block_size: int = 16, num_kv_blocks: int | None = None, kv_cache_gb: float = 1.0,
                 max_num_batched_tokens: int = 2048, max_num_seqs: int = 64, seed: int = 0,
                 dtype: torch.dtype = torch.float32, device: str = "cpu", verifier: str | None = None):
        spec = SpeculativeConfig.from_dict(speculative_config) if speculative_config is not None else None
        path = model_directory(model)
        self.model = load_llama(path, dtype=dtype, device=device)
        from transformers import AutoTokenizer
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_directory(tokenizer) if tokenizer else path))
        cfg = self.model.config
        if num_kv_blocks is None:
            full = -(-cfg.max_position_embeddings // block_size) * max_num_seqs
            cap = int(kv_cache_gb * 2**30 // (self.model.kv_bytes_per_token() * block_size))
            num_kv_blocks = max(1, min(full, cap))
        proposer = None
        if spec is not None and spec.method == "ngram":
            proposer = NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max, spec.num_speculative_tokens)
        elif spec is not None:
            draft = self._load_draft(spec.model, dtype, device)
            proposer = DraftModelProposer(
                draft, spec.num_speculative_tokens, block_size=block_size, sample_method=spec.draft_sample_method,
                num_kv_blocks=DraftModelProposer.pool_blocks(num_kv_blocks, max_num_seqs, spec.num_speculative_tokens,
                                                             block_size),
                generator=torch.Generator().manual_seed(seed + 1))
        self.speculative_config = spec
        self.engine = LLMEngine(self.model, num_kv_blocks=num_kv_blocks, block_size=block_size,
                                max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, seed=seed,
                                verifier=verifier, proposer=proposer)

    def _load_draft(self, name, dtype, device) -> LlamaForCausalLM:
        """The draft model, refused unless it shares the target's vocabulary and tokenizer."""
        from transformers import AutoTokenizer

        from speclab.models.hub import check_pair
        path = model_directory(name)
        draft = load_llama(path, dtype=dtype, device=device)
        draft_tok = AutoTokenizer.from_pretrained(str(path)) if (path / "tokenizer.json").exists() else None
        check_pair(self.model, draft, self.tokenizer, draft_tok)
        if draft.config.max_position_embeddings < self.model.config.max_position_embeddings:
            raise ValueError(f"draft max_position_embeddings={draft.config.max_position_embeddings} < target's "
                             f"{self.model.config.max_position_embeddings}: the draft must cover the target's context")
        return draft

    def get_metrics(self) -> dict:
        """vLLM's spec-decode counters (names without the `speclab:` prefix) and the derived rates."""
        return self.engine.stats.as_dict()

    def metrics_text(self) -> str:
        """The same counters in Prometheus' text format, under the `speclab:` prefix."""
        return prometheus_text(self.engine.stats)

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for a batch of prompts, in order.

        Args:
            prompts: a string, a list of strings, or vLLM-style {"prompt_token_ids": [...]} dicts.
            sampling_params: one for all prompts, or one per prompt (default: SamplingParams()).
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(params)} sampling_params for {len(prompts)} prompts: give one, or one per prompt")
        requests = []
        for prompt, p in zip(prompts, params):
            ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else self.tokenizer.encode(prompt)
            requests.append((prompt if isinstance(prompt, str) else None, self.engine.add_request(ids, p)))
        bar = tqdm(total=len(requests), desc="generate", disable=not use_tqdm or len(requests) < 2)
        while self.engine.has_unfinished():
            bar.update(len(self.engine.step()))
        bar.close()
        return [RequestOutput(req.request_id, text, req.prompt_token_ids, [CompletionOutput(
            0, self.tokenizer.decode(req.output_token_ids), list(req.output_token_ids), req.finish_reason)])
            for text, req in requests]
