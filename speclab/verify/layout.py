"""The ragged batch every verification rule takes, vLLM's layout: its checks and its random draws.

Request r drafted k_r = num_draft_tokens[r] tokens; its drafts sit at rows [cu_r, cu_r + k_r) of
`draft_token_ids` / `draft_probs`, and its target rows at [cu_r + r, cu_r + r + k_r] of `target_probs`
(k_r verification rows, then one bonus row), cu_r = k_0 + ... + k_{r-1}. A rule returns
(B, max_k + 1) int64: accepted drafts, then the token that ends the row, then PLACEHOLDER_TOKEN_ID.

Given `uniforms` (T,) and `noise` (B, V) a rule's output is fully determined, which is what lets the
Triton kernel (lesson 07) be compared with the torch rule bit for bit. The draws happen here, in one
order, for every rule and implementation: uniforms first, then noise.
"""

import torch

from speclab.sampling import check_probs, exponential_noise

PLACEHOLDER_TOKEN_ID = -1



def _draw_device(generator, device):
    """Where to draw: on the generator's device when there is one (a CPU generator then gives the
    same numbers for CUDA tensors as for CPU ones), else on the tensors' device."""
    return generator.device if generator is not None else device


def draw_uniforms(n: int, generator, device) -> torch.Tensor:
    """(n,) float64 uniforms in (0, 1): float32 rand can return exactly 0, which would accept p = 0."""
    u = torch.rand(n, dtype=torch.float64, generator=generator, device=_draw_device(generator, device))
    return u.clamp(min=torch.finfo(torch.float64).tiny).to(device)


def draw_noise(B: int, V: int, generator, device) -> torch.Tensor:
    """(B, V) float32 Exp(1) noise, strictly positive."""
    e = exponential_noise((B, V), generator, _draw_device(generator, device))
    return e.clamp(min=torch.finfo(torch.float32).tiny).to(device)


def check_or_draw_uniforms(uniforms, T, generator, device):
    if uniforms is None:
        return draw_uniforms(T, generator, device)
    uniforms = torch.as_tensor(uniforms, device=device)
    if uniforms.shape != (T,):
        raise ValueError(f"uniforms must have shape (T,) = ({T},), one per draft token; got {tuple(uniforms.shape)}")
    if uniforms.dtype != torch.float64:
        raise ValueError(f"uniforms must be float64 (float32 rand can hit 0 exactly), got {uniforms.dtype}")
    if T and not bool(((uniforms > 0) & (uniforms < 1)).all()):
        raise ValueError("uniforms must lie strictly inside (0, 1)")
    return uniforms


def check_or_draw_noise(noise, B, V, generator, device):
    if noise is None:
        return draw_noise(B, V, generator, device)
    noise = torch.as_tensor(noise, device=device)
    if noise.shape != (B, V):
        raise ValueError(f"noise must have shape (B, V) = ({B}, {V}), one Exp(1) row per request; "
                         f"got {tuple(noise.shape)}")
    if not bool((noise > 0).all()):
        raise ValueError("noise must be strictly positive (Exp(1) samples)")
    return noise


def check_batch(draft_token_ids, num_draft_tokens, target_probs, draft_probs, greedy):
    """Validate shapes, dtypes and distributions; return tensors ready for `rejection_sample`."""
    k = torch.as_tensor(num_draft_tokens, dtype=torch.int64).reshape(-1)
    if bool((k < 0).any()):
        raise ValueError(f"num_draft_tokens must be >= 0, got {k.tolist()}")
    device = target_probs.device if torch.is_tensor(target_probs) else None
    k = k.to(device)
    B, T = k.numel(), int(k.sum())
    draft_token_ids = torch.as_tensor(draft_token_ids, dtype=torch.int64, device=device).reshape(-1)
    if draft_token_ids.numel() != T:
        raise ValueError(f"draft_token_ids has {draft_token_ids.numel()} tokens but num_draft_tokens "
                         f"sums to {T}: pass every request's drafts concatenated")
    if not torch.is_tensor(target_probs) or target_probs.dim() != 2 or target_probs.shape[0] != T + B:
        shape = tuple(target_probs.shape) if torch.is_tensor(target_probs) else type(target_probs).__name__
        raise ValueError(f"target_probs must be (T + B, V) = ({T + B}, V): k_r verification rows "
                         f"and one bonus row per request; got {shape}")
    V = target_probs.shape[1]
    check_probs(target_probs, "target_probs")
    if draft_probs is not None:
        if not torch.is_tensor(draft_probs) or draft_probs.dim() != 2 or draft_probs.shape[0] != T:
            raise ValueError(f"draft_probs must be (T, V) = ({T}, {V}) or None for one-hot drafts; "
                             f"got {tuple(draft_probs.shape) if torch.is_tensor(draft_probs) else draft_probs}")
        if draft_probs.shape[1] != V:
            raise ValueError(f"draft vocab size {draft_probs.shape[1]} != target vocab size {V}: "
                             f"the draft must share the target's tokenizer and vocabulary")
        check_probs(draft_probs[draft_token_ids >= 0], "draft_probs")  # a placeholder's row is never read
        draft_probs = draft_probs.to(target_probs.dtype)  # one dtype: the race must not depend on the batch
    if T and bool((draft_token_ids >= V).any() | (draft_token_ids < PLACEHOLDER_TOKEN_ID).any()):
        bad = draft_token_ids[(draft_token_ids >= V) | (draft_token_ids < -1)][0].item()
        raise ValueError(f"draft token id {bad} is outside the vocabulary [0, {V}) "
                         f"(use {PLACEHOLDER_TOKEN_ID} for 'no draft')")
    is_greedy = torch.as_tensor(greedy, dtype=torch.bool, device=device)
    if is_greedy.dim() == 0:
        is_greedy = is_greedy.expand(B)
    if is_greedy.shape != (B,):
        raise ValueError(f"greedy must be a bool or a (B,) = ({B},) bool tensor, got shape {tuple(is_greedy.shape)}")
    return draft_token_ids, k, target_probs, draft_probs, is_greedy
