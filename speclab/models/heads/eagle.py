"""EAGLE: one decoder layer on the target's features, drafting through the target's own LM head.

Li, Wei, Zhang, Zhang, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty"
(ICML 2024), the design vLLM's `eagle` method runs. At position t the head reads the target's
feature f_t (its last layer's output, before the final norm) *and* the embedding of the token
x_{t+1} that was sampled there, so that it knows which branch of the sampling it is on:

    g_{t+1} = Layer( fc([emb(x_{t+1}); f_t]) )          fc: 2d -> d, Layer: one Llama decoder layer
    q(x_{t+2}) = softmax( lm_head( norm(g_{t+1}) ) )    norm, lm_head, emb: the target's, frozen

g_{t+1} predicts the target's next feature f_{t+1}; drafting a chain feeds (draft token, g) back in
place of (x, f). The layer attends over the head's own paged KV, which lives in the target's block
tables (lookahead slots; see speclab/proposers/eagle.py).

EAGLE-3-style fusion (Li et al. 2025, "EAGLE-3"): f_t = fuse([h^low_t; h^mid_t; h^top_t]) (3d -> d)
from three target layers instead of the top one; the head's own outputs g stay d-wide.
An optional reduced draft vocabulary (EAGLE-3's d2t, FR-Spec) drafts over the most frequent tokens
only: the LM head matmul shrinks by V / draft_vocab_size; tokens outside it get q = 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from speclab.models.draft_vocab import ReducedLMHead, scatter_to_vocab
from speclab.models.heads.config import HeadConfig
from speclab.models.llama import DecoderLayer, LlamaConfig, kv_zeros, plan_decoder_layers, rope_tables, rotate
from speclab.models.packed_linear import PackedLinear


def layer_config(cfg: HeadConfig) -> LlamaConfig:
    t, lay = cfg.target, cfg.layer
    return LlamaConfig(vocab_size=t["vocab_size"], num_hidden_layers=1, **lay)


class EagleHead(nn.Module):
    """The EAGLE head of one target (its embedding, final norm and LM head are shared, not owned).

    Args:
        cfg: the head's config (method "eagle" or "eagle3").
        target: speclab's LlamaForCausalLM the head drafts for.
    """

    def __init__(self, cfg: HeadConfig, target):
        super().__init__()
        self.cfg = cfg
        D = cfg.target["hidden_size"]
        n = len(cfg.hidden_layers)
        self.fuse = nn.Linear(n * D, D, bias=False) if n > 1 else None
        self.fc = nn.Linear(2 * D, D, bias=False)
        self.layer = DecoderLayer(layer_config(cfg))
        if cfg.draft_vocab_size:
            self.register_buffer("d2t", torch.arange(cfg.draft_vocab_size))
        self._target = [target]  # a list: shared with the engine, frozen, never saved with the head

    @property
    def target(self):
        return self._target[0]

    # ------------------------------------------------------------------------------------------
    # the pieces

    @property
    def dtype(self) -> torch.dtype:
        """The head's own dtype, which may differ from the target's (speculative_config's `draft_dtype`):
        the target's hidden states and embeddings are cast to it on the way in, and its outputs to the
        target's on the way to the shared final norm."""
        return self.fc.weight.dtype

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., n*d) target hidden states of the n layers read -> (..., d) feature f."""
        hidden = hidden.to(self.dtype)
        return hidden if self.fuse is None else self.fuse(hidden)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The target's embedding of token_ids, in the head's dtype."""
        return self.target.model.embed_tokens(token_ids).to(self.dtype)

    def inputs(self, token_ids: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
        """fc([emb(x_{t+1}); f_t]): (..., d)."""
        x = torch.cat([self.embed(token_ids), feature], -1)
        fast = self.__dict__.get("_fc") if torch.is_inference_mode_enabled() else None  # drafting: see prepare
        return fast(x) if fast is not None and x.dim() == 2 else self.fc(x)

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """(N, d) head outputs -> (N, V) float logits through the target's final norm and LM head
        (-inf outside the draft vocabulary, when the head has one). Drafting (inference mode) takes
        the target's products (`PackedLinear`: speclab's few-row kernel for a step's few rows): F.linear
        took 2.7 ms a call for SmolLM2's 8192-token head there, and with the kernel a 4-node tree's
        drafting fell from 11.9 to 7.8 ms a step (2026-12-02, one thread)."""
        h = self.target.model.norm(g.to(self.target.lm_head.weight.dtype))
        drafting = torch.is_inference_mode_enabled() and h.dim() == 2
        if not self.cfg.draft_vocab_size:
            return self.target.compute_logits(h) if drafting else self.target.lm_head(h).float()
        if drafting:
            return self.draft_head()(h.to(self.dtype))
        sub = F.linear(h, self.target.lm_head.weight.index_select(0, self.d2t)).float()  # (N, V_draft)
        return scatter_to_vocab(sub, self.d2t, self.cfg.target["vocab_size"])  # (N, V)

    def draft_head(self) -> ReducedLMHead:
        """The LM head over the draft vocabulary, for drafting (the draft model's `draft_vocab_size`
        uses the same class). Made once and reused (the gather moves V_draft x d weights, 19 MB for
        SmolLM2's 8192 tokens, on every chained step otherwise), and made again when the LM head, d2t or
        the head's dtype changes (its rows are kept in the head's dtype: half the bytes for a bfloat16
        head beside a float32 target); training gathers afresh, since a tensor made in inference mode
        cannot enter autograd."""
        w = self.target.lm_head.weight
        key = (w, w._version, self.d2t._version, self.dtype)
        cached = self.__dict__.get("_draft_head")
        if cached is None or cached[0][0] is not w or cached[0][1:] != key[1:]:
            cached = self._draft_head = (key, ReducedLMHead(w, self.d2t, self.dtype))
        return cached[1]

    # ------------------------------------------------------------------------------------------
    # inference: a flattened ragged batch over the paged cache (the target's block tables)

    @torch.inference_mode()  # the paged path drafts; training goes through `dense`
    def forward(self, token_ids, feature, meta, kv_cache) -> torch.Tensor:
        """token_ids (N,) the tokens x_{t+1}; feature (N, d) f_t (or the head's own g_t); meta at
        positions t; kv_cache: the head's (k_cache, v_cache). Returns g_{t+1}: (N, d)."""
        if not self.__dict__.get("_prepared"):
            self.prepare()
        x = self.inputs(token_ids, feature)
        plan = self.__dict__.get("_plan")
        if plan is not None and plan.usable(x, [kv_cache]):  # the layer in one native call, as the target's
            plan.run(x, meta, [kv_cache], 0, 1)
            return x
        return self.layer(x, meta, *kv_cache)

    @torch.inference_mode(False)  # weights stay ordinary tensors (a head may be trained further)
    def prepare(self) -> None:
        """Fuse and pack the decoder layer's projections as the target's are (models/llama.py), and
        fc's too (`inputs` takes it while drafting; F.linear cost 0.45 ms for its 1152 x 576 weight), and
        plan the layer as one native call where it can be (cpu_decoder, as the target's layers).
        Inference only: training uses `dense`, whose projections stay plain for autograd."""
        self.layer.self_attn.prepare()
        self.layer.mlp.prepare()
        self._fc = PackedLinear(self.fc.weight)
        self._plan = plan_decoder_layers([self.layer], self.layer.self_attn.cfg)[0]  # (speclab.models.cpu_decoder)
        self._prepared = True

    def _apply(self, fn, recurse=True):  # .to() gives new tensors: fuse and pack again before the next forward
        for name in ("_prepared", "_draft_head", "_fc", "_plan"):
            self.__dict__.pop(name, None)
        return super()._apply(fn, recurse)

    def allocate_kv_cache(self, num_blocks: int, block_size: int):
        c = self.layer.self_attn.cfg
        w = self.fc.weight
        shape = (num_blocks, block_size, c.num_key_value_heads, c.head_dim)
        return kv_zeros(shape, w.dtype, w.device), kv_zeros(shape, w.dtype, w.device)

    # ------------------------------------------------------------------------------------------
    # training: dense causal attention over whole windows (same math, no cache)

    def dense(self, token_ids, feature, positions, mask, past=()) -> tuple[torch.Tensor, tuple]:
        """The head over (B, T) windows without a paged cache.

        Args:
            token_ids: (B, T) tokens x_{t+1}; feature: (B, T, d); positions: (T,).
            mask: (T, S) bool, True where query t may attend key s; the keys are `past` steps' keys
                then this step's (S = T * (len(past) + 1)): training-time test unrolls steps this way.
            past: earlier unrolled steps' (k, v), each (B, T, Hkv, Dh).
        Returns:
            g (B, T, d), and this step's (k, v).
        """
        layer = self.layer
        x = self.inputs(token_ids, feature)
        attn, c = layer.self_attn, layer.self_attn.cfg
        B, T, _ = x.shape
        h = layer.input_layernorm(x)
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta, x.dtype)  # (T, 1, Dh)
        q = rotate(attn.q_proj(h).view(B, T, -1, c.head_dim), cos, sin)
        k = rotate(attn.k_proj(h).view(B, T, -1, c.head_dim), cos, sin)
        v = attn.v_proj(h).view(B, T, -1, c.head_dim)
        keys = torch.cat([pk for pk, _ in past] + [k], 1)
        values = torch.cat([pv for _, pv in past] + [v], 1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=mask, enable_gqa=c.num_attention_heads != c.num_key_value_heads)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(B, T, -1))
        return x + layer.mlp(layer.post_attention_layernorm(x)), (k, v)


def ttt_mask(T: int, step: int, device=None) -> torch.Tensor:
    """Attention mask of unrolled step `step` (1 = teacher-forced features) over steps 1..step's keys.

    Step j's query at position t stands for the (j-1)-th chained draft at t: it sees the first
    step's keys (true features) up to t - j + 1 and, of each later step i <= j, the one key at
    t - (j - i), exactly what the chained query sees at inference. Returns (T, step * T) bool.
    """
    t = torch.arange(T, device=device)
    blocks = [t[None, :] <= t[:, None] - (step - 1)]
    blocks += [t[None, :] == t[:, None] - (step - i) for i in range(2, step + 1)]
    return torch.cat(blocks, 1)  # every row sees at least its own key
