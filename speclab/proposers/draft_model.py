"""Draft-model proposer: a smaller LM with the target's tokenizer drafts k tokens per step.

Leviathan et al. (2023) and Chen et al. (2023). The draft runs in the same engine, on speclab's
paged-KV Llama forward, with a KV cache of its own that is rolled back in step with the target's.
For a request with committed tokens T (length L) the draft:
  1. catches up: one forward over T[computed:L] (the prompt at first, then the 1-2 tokens the
     last verification committed), whose last row gives q_1 and draft d_1;
  2. runs k - 1 single-token forwards on d_1 .. d_{k-1}, giving q_2 .. q_k and d_2 .. d_k.
Its cache then holds T and d_1..d_{k-1}. After the target accepts a drafts, the draft's KV of
the accepted ones is still valid: its computed count becomes L + min(a, k - 1), the rest rolls back.

Drafts are the argmax of q ("greedy", q treated as one-hot by the verifier, as vLLM does) or
sampled from q ("probabilistic", q kept for verification: more accepted tokens at temperature > 0).
Both are exact. Requests are drafted together, one batched forward per draft position.
"""

import math

import torch

from speclab.engine.batch import flatten
from speclab.engine.request import Request
from speclab.kv_cache import KVCacheManager, NoFreeBlocksError
from speclab.models.llama import LlamaForCausalLM
from speclab.proposers.base import Proposal, Proposer
from speclab.sampling import logits_to_probs


class DraftModelProposer(Proposer):
    """Args:
        model: the draft, speclab's Llama forward, sharing the target's vocabulary.
        num_speculative_tokens: k.
        num_kv_blocks, block_size: the draft's own paged cache.
        sample_method: "greedy" or "probabilistic".
        generator: the stream for requests without a seed.
    """

    def __init__(self, model: LlamaForCausalLM, num_speculative_tokens: int, *, num_kv_blocks: int,
                 block_size: int, sample_method: str = "greedy", generator: torch.Generator | None = None):
        self.model = model
        self.num_speculative_tokens = num_speculative_tokens
        self.kv = KVCacheManager(num_kv_blocks, block_size)
        self.caches = model.allocate_kv_cache(num_kv_blocks, block_size)
        self.sample_method = sample_method
        self.generator = generator or torch.Generator().manual_seed(0)
        self.device = model.lm_head.weight.device
        self.computed: dict[str, int] = {}  # request id -> tokens whose KV the draft holds

    def propose(self, requests: list[Request], max_drafts: list[int]) -> list[Proposal]:
        active = [(r, k) for r, k in zip(requests, max_drafts) if k > 0]
        want = {r.request_id: k for r, k in active}
        drafts: dict[str, list[int]] = {r.request_id: [] for r, _ in active}
        probs: dict[str, list[torch.Tensor]] = {r.request_id: [] for r, _ in active}
        chunks = []  # step 1: catch up on the committed tokens
        for r, _ in active:
            start = self.computed.get(r.request_id, 0)
            chunks.append((r, r.all_token_ids[start:], start))
        for i in range(max((k for _, k in active), default=0)):
            logits = self._forward(chunks)  # (len(chunks), V): the last row of each chunk
            nxt = []
            for (r, _, start), row in zip(chunks, logits):
                token, q = self._draft_one(r, row)
                drafts[r.request_id].append(token)
                probs[r.request_id].append(q)
                if i + 1 < want[r.request_id]:  # feed the draft back for the next position
                    nxt.append((r, [token], r.num_tokens + i))
            chunks = nxt
        out = []
        for r, k in zip(requests, max_drafts):
            if k <= 0:
                out.append(Proposal([]))
                continue
            q = torch.stack(probs[r.request_id]) if self.sample_method == "probabilistic" else None
            out.append(Proposal(drafts[r.request_id], q))
        return out

    def _forward(self, chunks) -> torch.Tensor:
        """One batched draft forward over (request, tokens, start) chunks; returns each chunk's last logits."""
        for r, tokens, start in chunks:
            try:
                self.kv.allocate(r.request_id, start, len(tokens))
            except NoFreeBlocksError as err:
                raise RuntimeError(f"the draft's KV pool is full ({err}): raise num_kv_blocks") from err
            self.computed[r.request_id] = start + len(tokens)
        input_ids, meta = flatten(self.kv, [(r.request_id, t, s) for r, t, s in chunks], self.device)
        hidden, _ = self.model(input_ids, meta, self.caches)
        last = [end - 1 for end in meta.query_start_loc[1:]]
        return self.model.compute_logits(hidden[last])

    def _draft_one(self, r: Request, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """The draft token from one row of logits, processed as the target's are (same temperature,
        top-k, top-p), and its q row when sampling probabilistically."""
        p = r.params
        if self.sample_method == "greedy" or p.greedy:
            q = logits_to_probs(logits, p.temperature, p.top_k, p.top_p) if self.sample_method == "probabilistic" \
                else None
            return int(logits.argmax()), q
        q = logits_to_probs(logits, p.temperature, p.top_k, p.top_p)  # (V,)
        return int(torch.multinomial(q, 1, generator=r.generator or self.generator)), q

    def on_verified(self, request: Request, num_draft_tokens: int, num_accepted: int) -> None:
        L = request.num_tokens  # committed tokens before this step's are appended
        keep = L + min(num_accepted, num_draft_tokens - 1)
        self.computed[request.request_id] = min(self.computed.get(request.request_id, 0), keep)
        self.kv.rollback(request.request_id, self.computed[request.request_id])

    def on_reset(self, request: Request) -> None:
        self.computed.pop(request.request_id, None)
        self.kv.free(request.request_id)

    @staticmethod
    def pool_blocks(target_blocks: int, max_num_seqs: int, k: int, block_size: int) -> int:
        """A draft pool as large as the target's plus k lookahead slots per running request."""
        return target_blocks + max_num_seqs * math.ceil((k + 1) / block_size)
