"""Draft-model proposer: a smaller LM with the target's tokenizer drafts k tokens per step.

Leviathan et al. (2023) and Chen et al. (2023). The draft runs in the same engine, on speclab's
paged-KV Llama forward, with a KV cache of its own. For a request with committed tokens T
(length L) the draft:
  1. reconciles: its cache may hold drafts the target rejected, or never verified (the token
     budget truncated them); only positions below L - 1 are certain to hold committed tokens
     (accepted drafts equal them), so it keeps min(computed, L - 1) and rolls the rest back;
  2. catches up: one forward over T[computed:L] (never empty: it holds at least the newest token),
     whose last row gives q_1 and draft d_1;
  3. runs k - 1 single-token forwards on d_1 .. d_{k-1}, giving q_2 .. q_k and d_2 .. d_k.
It drafts only for the requests the runner hands it (those that sampled this step), so a request
left out of a step keeps both its drafts and the draft cache that made them.

Drafts are the argmax of q ("greedy", q treated as one-hot by the verifier, as vLLM does) or
sampled from q ("probabilistic", q kept for verification: more accepted tokens at temperature > 0).
A seeded request's drafts are sampled with the same position-keyed noise the runner samples the
target with (Gumbel coupling; see model_runner.py). All are exact. Requests are drafted together,
one batched forward per draft position.

With `draft_vocab_size` (speclab's key; FR-Spec, speclab/models/draft_vocab.py) the draft scores only
the target's most frequent tokens: q is the softmax over them (0 elsewhere), the same q drafts and
verifies, so the output stays exact and only the LM head's share of the draft's cost shrinks.
"""

import math

import torch

from speclab.engine.batch import TreeChunk, flatten
from speclab.engine.proposer import (SAMPLE_METHODS, Proposal, Proposer, ProposerContext, check_k,
                                     check_sample_method, draft_tokens)
from speclab.engine.request import Request
from speclab.kv_cache import KVCacheManager, NoFreeBlocksError
from speclab.models.draft_vocab import ReducedLMHead, kept_tokens, load_ranking
from speclab.models.hub import check_pair, model_directory
from speclab.models.llama import LlamaForCausalLM, load_llama
from speclab.proposers.tree_drafting import TreeShape, check_tree, draft_trees, draw_siblings, tree_mask

__all__ = ["SAMPLE_METHODS", "DraftModelProposer", "from_config", "load_draft"]


class DraftModelProposer(Proposer):
    """Args:
        model: the draft, speclab's Llama forward, sharing the target's vocabulary.
        num_speculative_tokens: k.
        num_kv_blocks, block_size: the draft's own paged cache.
        sample_method: "greedy" or "probabilistic".
        generator: the stream for requests without a seed; None (the default): the engine's own
            stream, shared with verification. (Two generators seeded alike would correlate the draft's
            samples with the verifier's uniforms and bias the output.)
        tree: a draft tree's shape (lesson 10), or None for a chain.
        d2t: (V_draft,) sorted token ids the draft scores (a reduced draft vocabulary,
            speclab.models.draft_vocab), or None for the whole vocabulary.
    """

    def __init__(self, model: LlamaForCausalLM, num_speculative_tokens: int, *, num_kv_blocks: int,
                 block_size: int, sample_method: str = "greedy", generator: torch.Generator | None = None,
                 tree: TreeShape | None = None, d2t: torch.Tensor | None = None):
        check_sample_method(sample_method)
        check_k(num_speculative_tokens)
        check_tree(tree, num_speculative_tokens, sample_method, None if d2t is None else len(d2t))
        self.tree = tree
        self.model = model
        self.logits = model.compute_logits if d2t is None else ReducedLMHead(model.lm_head.weight, d2t)
        self.d2t = d2t
        self.num_speculative_tokens = num_speculative_tokens
        self.kv = KVCacheManager(num_kv_blocks, block_size)
        self.caches = model.allocate_kv_cache(num_kv_blocks, block_size)
        self.sample_method = sample_method
        self.generator = generator  # None until the engine hands over its stream
        self.device = model.lm_head.weight.device
        self.computed: dict[str, int] = {}  # request id -> tokens whose KV the draft holds

    def propose(self, requests: list[Request], max_drafts: list[int], forward=None) -> list[Proposal]:
        if self.tree is not None:
            return self._propose_trees(requests, max_drafts)
        active = [(r, k) for r, k in zip(requests, max_drafts) if k > 0]
        drafts = {r.request_id: [] for r, _ in active}
        probs = {r.request_id: [] for r, _ in active}
        chunks = [(r, r.all_token_ids[start:], start) for r, start in ((r, self._reconcile(r)) for r, _ in active)]
        want = dict((r.request_id, k) for r, k in active)
        for i in range(max((k for _, k in active), default=0)):
            logits = self._forward(chunks)  # (len(chunks), V): the last row of each chunk
            nxt = []
            for (r, _, _), row in zip(chunks, logits):
                token, q = self._draft_one(r, row, len(r.output_token_ids) + i)
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

    def _propose_trees(self, requests: list[Request], max_drafts: list[int]) -> list[Proposal]:
        """A tree per request (lesson 10): catch up, then one forward per depth over the nodes to expand,
        written after the committed tokens as scratch (the next step's catch-up recomputes what it keeps)."""
        active = [r for r, k in zip(requests, max_drafts) if k > 0]
        if not active:
            return [Proposal([]) for _ in requests]
        root = self._forward([(r, r.all_token_ids[s:], s) for r, s in ((r, self._reconcile(r)) for r in active)])

        def run(batch):
            chunks = []
            for r, nodes in zip(active, batch):
                if nodes:
                    L = r.num_tokens  # the tree's slots start after the committed tokens
                    chunks.append((r, [n.token for n in nodes], L + nodes[0].slot,
                                   TreeChunk([L - 1 + n.depth for n in nodes], L, tree_mask(nodes))))
            rows = iter(self._forward(chunks, every_row=True).split([len(c[1]) for c in chunks]))
            return [next(rows) if nodes else None for nodes in batch]

        draws = ([draw_siblings(r.params, self.generator, self.d2t) for r in active] if self.sample_method != "greedy"
                 else None)
        grown = iter(draft_trees(root, self.tree, run, draws))
        for r in active:
            self.computed[r.request_id] = r.num_tokens  # the tree's slots are scratch
        return [Proposal(*_tokens_q_and_tree(next(grown))) if k > 0 else Proposal([]) for k in max_drafts]

    def _reconcile(self, r: Request) -> int:
        """Drop cached positions that may not hold committed tokens; return where the catch-up starts."""
        start = min(self.computed.get(r.request_id, 0), r.num_tokens - 1)
        if r.request_id in self.kv.block_tables:
            self.kv.rollback(r.request_id, start)
        self.computed[r.request_id] = start
        return start

    def _forward(self, chunks, every_row: bool = False) -> torch.Tensor:
        """One batched draft forward over (request, tokens, start[, TreeChunk]) chunks; returns each
        chunk's last logits (every row's with every_row)."""
        for r, tokens, start, *_ in chunks:
            if not tokens:
                raise RuntimeError(f"request {r.request_id}: empty draft chunk at position {start} (stale draft state)")
            try:
                self.kv.allocate(r.request_id, start, len(tokens))
            except NoFreeBlocksError as err:
                raise RuntimeError(f"the draft's KV pool is full ({err}): raise num_kv_blocks") from err
            self.computed[r.request_id] = start + len(tokens)
        input_ids, meta = flatten(self.kv, [(r.request_id, *rest) for r, *rest in chunks], self.device)
        hidden, _ = self.model(input_ids, meta, self.caches)
        if every_row:
            return self.logits(hidden)
        last = torch.tensor(meta.query_start_loc[1:], device=self.device) - 1
        return self.logits(hidden.index_select(0, last))

    def _draft_one(self, r: Request, logits: torch.Tensor, position: int) -> tuple[int, torch.Tensor | None]:
        """The draft token for output position `position` from one row of logits, and its q row when
        sampling probabilistically (the protocol's `draft_tokens`: the engine's stream, keyed noise)."""
        tokens, qs = draft_tokens([r], logits[None], [position], self.sample_method, self.generator)
        return tokens[0], qs[0]

    def remove(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.computed.pop(rid, None)
            self.kv.free(rid)

    @staticmethod
    def pool_blocks(target_blocks: int, max_num_seqs: int, k: int, block_size: int) -> int:
        """A draft pool as large as the target's plus k lookahead slots per running request."""
        return target_blocks + max_num_seqs * math.ceil((k + 1) / block_size)


def _tokens_q_and_tree(grown) -> tuple:
    tokens, tree, q = grown
    return tokens, q, tree  # q None: top-k children, point masses


def load_draft(name, context: ProposerContext, draft_vocab_size: int | None = None, dtype: torch.dtype | None = None):
    """The draft model, refused unless it shares the target's vocabulary and tokenizer and covers its
    context, and its kept tokens (d2t) when draft_vocab_size is set (else None). It runs in `dtype`
    (default: the target's)."""
    from transformers import AutoTokenizer

    path = model_directory(name)
    draft = load_llama(path, dtype=dtype or context.dtype, device=context.device)
    d2t = None
    if draft_vocab_size is not None:  # the first draft_vocab_size tokens of the ranking shipped beside the draft
        d2t = kept_tokens(load_ranking(path, draft.config.vocab_size), draft_vocab_size)
    draft_tok = AutoTokenizer.from_pretrained(str(path)) if (path / "tokenizer.json").exists() else None
    check_pair(context.target, draft, context.tokenizer, draft_tok)
    if draft.config.max_position_embeddings < context.target.config.max_position_embeddings:
        raise ValueError(f"draft max_position_embeddings={draft.config.max_position_embeddings} < target's "
                         f"{context.target.config.max_position_embeddings}: the draft must cover the target's context")
    return draft, d2t


def from_config(spec, context: ProposerContext) -> DraftModelProposer:
    """`method: "draft_model"` (the registry's constructor): the draft, with a pool as large as the target's."""
    k, tree = spec.num_speculative_tokens, TreeShape.from_config(spec)
    slots = max(k, tree.max_run) if tree else k
    draft, d2t = load_draft(spec.model, context, spec.draft_vocab_size, context.draft_dtype(spec))
    return DraftModelProposer(
        draft, k, block_size=context.block_size, sample_method=spec.draft_sample_method,
        num_kv_blocks=DraftModelProposer.pool_blocks(context.num_kv_blocks, context.max_num_seqs, slots,
                                                     context.block_size), tree=tree, d2t=d2t)
