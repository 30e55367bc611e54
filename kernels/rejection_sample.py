"""Rejection sampling for speculative decoding, in Triton (lesson 07).

What you learn here:
- how the flattened, ragged batch of lesson 06 maps onto a grid of one program per request;
- the accept rule u <= p(x) / q(x) as a short sequential walk over a request's drafts;
- sampling from an unnormalised distribution r with the exponential race argmax_v r(v) / E(v),
  E ~ Exp(1), as a running maximum over the vocabulary, BLOCK_V tokens at a time;
- masking the vocabulary tail, first-index tie breaking across blocks, and why we divide with
  IEEE rounding: the kernels reproduce `speclab.verify.rejection_sample` bit for bit, on a GPU
  and on the CPU under Triton's interpreter (TRITON_INTERPRET=1).

The layout follows vLLM's `rejection_sampler.py` (Leviathan et al., 2023, Algorithm 1): request r
drafted k_r tokens at rows [cu_r, cu_r + k_r) of `draft_token_ids`/`draft_probs` (cu = exclusive
cumsum of k) and owns target rows [cu_r + r, cu_r + r + k_r] (k_r verification rows, one bonus
row). The output is (B, max_k + 1) int64: accepted drafts, the recovered or bonus token, then -1.

Three kernels, each with one program per request:
  _greedy_kernel      greedy requests: accept while draft == argmax p, then emit argmax p
  _accept_kernel      random requests: accept while q(x) > 0 and p(x) / q(x) >= u, count n
  _end_token_kernel   random requests: the token at column n, by the exponential race over
                      max(p - q, 0) (recovered, n < k) or p (bonus, n == k)
A fourth, marked kernel implements lesson 10's block verification (`_block_kernel`, RULES["block"]).
Run `python scripts/bench_kernel.py` for the benchmark.
"""

import argparse
import dataclasses
import json
import os
import platform
import re
import sys

import torch

if __name__ == "__main__" and not torch.cuda.is_available() and "--ptx" not in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit below is defined (--ptx compiles)

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from speclab.verify.layout import PLACEHOLDER_TOKEN_ID, check_batch, check_or_draw_noise, check_or_draw_uniforms
from speclab.timing import timed
from speclab.verify import block as block_rule
from speclab.verify.rejection import rejection_sample as rejection_sample_torch

DEFAULT_BLOCK_V = 2048  # vocabulary tile: 2048 float32 = 8 KiB per row per load

# ----------------------------------------------------------------------------------------------
# The torch reference, and what it costs in memory traffic
#
# `rejection_sample_torch` (speclab/verify/rejection.py) is the specification. It is vectorised but pays
# for it in memory: it gathers whole (B, V) rows for argmax (greedy), builds the residual
# max(p - q, 0) as a (B, V) temporary, divides by the (B, V) noise into another temporary and
# reduces it, so each row of p, q and noise is read two to four times and (B, V) intermediates are
# written and read back. The minimum a verifier must read is one row of p, one of q (only for a
# rejected request) and one of noise per request, plus k scalars of p, q and u: about
# B * V * 12 bytes in float32. For random requests the kernels below read exactly that, once (a
# greedy request reads the n + 1 rows of p whose argmax it needs), and write B * (max_k + 1) int64
# tokens. Verification is memory-bound: the benchmark reports GB/s against the GPU's limit.


# ----------------------------------------------------------------------------------------------
# Building blocks


@triton.jit
def _div_rn(x, y):
    """x / y rounded to nearest (IEEE), as torch divides. A GPU's float32 `/` compiles to a faster
    division that can be off in the last bit; tl.math.div_rn asks for the exact one. (tl.fdiv(x, y,
    ieee_rounding=True) does too with Triton 3.9, but with 3.6 on an H200 it accepted a draft that
    torch rejects: the flag had no effect there.) Float64 division is IEEE either way."""
    if x.dtype == tl.float32:
        if y.dtype == tl.float32:
            return tl.math.div_rn(x, y)
    return x / y


@triton.jit
def _argmax_update(best_val, best_idx, x, start):
    """Fold one block `x` (BLOCK_V values for tokens start..start+BLOCK_V-1) into a running argmax.

    Inside a block tl.max returns the first index on ties; across blocks the strict `>` keeps the
    earlier block's winner on ties, so the result is torch.argmax's first index overall.
    """
    blk_val, blk_idx = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    better = blk_val > best_val
    return tl.where(better, blk_val, best_val), tl.where(better, start + blk_idx, best_idx)


@triton.jit
def _row_argmax(row_ptr, stride_v, V, BLOCK_V: tl.constexpr):
    """argmax of one row of V values (first index on ties), reading BLOCK_V values at a time."""
    best_val = tl.full([], float("-inf"), row_ptr.dtype.element_ty)
    best_idx = tl.zeros([], tl.int32)
    for start in range(0, V, BLOCK_V):
        offs_v = start + tl.arange(0, BLOCK_V)
        mask = offs_v < V
        x = tl.load(row_ptr + offs_v * stride_v, mask=mask, other=float("-inf"))  # tail never wins
        best_val, best_idx = _argmax_update(best_val, best_idx, x, start)
    return tl.minimum(best_idx, V - 1)


# ----------------------------------------------------------------------------------------------
# Kernel 1: greedy requests. Accept x_i while x_i == argmax p_i; then emit argmax p_n.


@triton.jit
def _greedy_kernel(out_ptr, stride_out, num_accepted_ptr, draft_ptr, cu_ptr, k_ptr, is_greedy_ptr,
                   target_ptr, stride_target, stride_target_v, V, BLOCK_V: tl.constexpr):
    r = tl.program_id(0)  # one program per request
    if not tl.load(is_greedy_ptr + r):
        return
    k = tl.load(k_ptr + r)
    cu = tl.load(cu_ptr + r)  # first draft row; the target rows start at cu + r
    out_row = out_ptr + r.to(tl.int64) * stride_out
    n = 0
    rejected = False
    for i in range(0, k):
        if not rejected:
            x = tl.load(draft_ptr + cu + i)
            top = _row_argmax(target_ptr + (cu + r + i) * stride_target, stride_target_v, V, BLOCK_V)
            if x == top:  # a placeholder draft (-1) never equals an argmax
                tl.store(out_row + i, x)
                n += 1
            else:
                tl.store(out_row + i, top)  # the greedy "recovered" token is the target's argmax
                rejected = True
    if not rejected:  # bonus: argmax of the row after the last draft
        top = _row_argmax(target_ptr + (cu + r + k) * stride_target, stride_target_v, V, BLOCK_V)
        tl.store(out_row + k, top)
    tl.store(num_accepted_ptr + r, n)


# ----------------------------------------------------------------------------------------------
# Kernel 2: random requests. Accept x_i iff q_i(x_i) > 0 and p_i(x_i) / q_i(x_i) >= u_i.
# Only k scalars of p, q and u are read; the vocabulary is touched by kernel 3 alone.


@triton.jit
def _accept_kernel(out_ptr, stride_out, num_accepted_ptr, draft_ptr, cu_ptr, k_ptr, is_greedy_ptr,
                   target_ptr, stride_target, stride_target_v,
                   draft_probs_ptr, stride_draft, stride_draft_v, uniforms_ptr,
                   NO_DRAFT_PROBS: tl.constexpr):
    r = tl.program_id(0)
    if tl.load(is_greedy_ptr + r):
        return
    k = tl.load(k_ptr + r)
    cu = tl.load(cu_ptr + r)
    out_row = out_ptr + r.to(tl.int64) * stride_out
    n = 0
    rejected = False
    for i in range(0, k):
        if not rejected:
            x = tl.load(draft_ptr + cu + i)
            real = x >= 0  # a placeholder draft (-1) is always rejected; never read at index -1
            p = tl.load(target_ptr + (cu + r + i) * stride_target + x * stride_target_v, mask=real, other=0.0)
            if NO_DRAFT_PROBS:  # one-hot drafts: q(x) = 1
                q = tl.full([], 1.0, tl.float32)
            else:
                q = tl.load(draft_probs_ptr + (cu + i) * stride_draft + x * stride_draft_v, mask=real, other=0.0)
            u = tl.load(uniforms_ptr + cu + i)  # float64
            # torch divides with IEEE round-to-nearest; Triton's `/` may use a faster, less exact
            # division on GPUs, so ask for IEEE rounding (_div_rn). q = 0 never accepts (and is not
            # divided by).
            ratio = _div_rn(p, tl.where(q > 0, q, 1.0))
            if real & (q > 0) & (ratio.to(tl.float64) >= u):
                tl.store(out_row + i, x)
                n += 1
            else:
                rejected = True
    tl.store(num_accepted_ptr + r, n)


# ----------------------------------------------------------------------------------------------
# Kernel 3: the token that ends a random request's output, at column n.
#   rejected (n < k): r = max(p_n - q_n, 0)   (q_n = one-hot(x_n) for one-hot drafts, 0 if x_n = -1;
#                     r = p_n if the residual is all zero)
#   bonus    (n = k): r = p_k
#   token = argmax_v r(v) / E(v), E = the request's Exp(1) noise row: a sample from r / sum(r),
#   with no normalisation and one pass over the vocabulary.


@triton.jit
def _end_token_kernel(out_ptr, stride_out, num_accepted_ptr, draft_ptr, cu_ptr, k_ptr, is_greedy_ptr,
                      target_ptr, stride_target, stride_target_v,
                      draft_probs_ptr, stride_draft, stride_draft_v,
                      noise_ptr, stride_noise, stride_noise_v, V,
                      NO_DRAFT_PROBS: tl.constexpr, RACE_DTYPE: tl.constexpr, BLOCK_V: tl.constexpr):
    r = tl.program_id(0)
    if tl.load(is_greedy_ptr + r):
        return
    k = tl.load(k_ptr + r)
    cu = tl.load(cu_ptr + r)
    n = tl.load(num_accepted_ptr + r)
    rejected = n < k
    x = tl.load(draft_ptr + cu + n, mask=rejected, other=-1)  # the rejected draft; -1 for bonus rows
    use_q = rejected & (x >= 0)  # subtract q only after a real rejected draft
    V_q = tl.where(use_q, V, 0)  # read q only then: `offs < V_q` masks every lane otherwise
    p_row = target_ptr + (cu + r + n) * stride_target
    q_row = draft_probs_ptr + (cu + n) * stride_draft
    e_row = noise_ptr + r.to(tl.int64) * stride_noise

    best_res = tl.full([], float("-inf"), RACE_DTYPE)  # race over the residual max(p - q, 0)
    idx_res = tl.zeros([], tl.int32)
    best_p = tl.full([], float("-inf"), RACE_DTYPE)  # race over p: the fallback, needed only
    idx_p = tl.zeros([], tl.int32)  #                  when the residual turns out to be all zero
    res_positive = tl.zeros([], tl.int32)
    for start in range(0, V, BLOCK_V):
        offs_v = start + tl.arange(0, BLOCK_V)
        mask = offs_v < V
        p = tl.load(p_row + offs_v * stride_target_v, mask=mask, other=0.0)
        e = tl.load(e_row + offs_v * stride_noise_v, mask=mask, other=1.0)
        if NO_DRAFT_PROBS:
            q = tl.where(offs_v == x, 1.0, 0.0)  # one-hot q; x = -1 matches no token
        else:
            q = tl.load(q_row + offs_v * stride_draft_v, mask=offs_v < V_q, other=0.0)
        residual = tl.maximum(p - q, 0.0)  # equals p exactly where q = 0 (bonus rows, placeholders)
        res_positive = tl.maximum(res_positive, tl.max((residual > 0).to(tl.int32), axis=0))
        race_res = tl.where(mask, _div_rn(residual, e), float("-inf"))
        race_p = tl.where(mask, _div_rn(p.to(residual.dtype), e), float("-inf"))
        best_res, idx_res = _argmax_update(best_res, idx_res, race_res, start)
        best_p, idx_p = _argmax_update(best_p, idx_p, race_p, start)
    token = tl.where(res_positive > 0, idx_res, idx_p)
    tl.store(out_ptr + r.to(tl.int64) * stride_out + n, tl.minimum(token, V - 1))  # stays in vocab


# ----------------------------------------------------------------------------------------------
# The wrapper: check, allocate, launch


@dataclasses.dataclass
class Batch:
    """A checked batch on one device, with its output buffers (what the kernels are launched on)."""
    draft_token_ids: torch.Tensor  # (T,) int64
    k: torch.Tensor  # (B,) int64 drafts per request
    cu: torch.Tensor  # (B,) int64 first draft row of each request
    is_greedy: torch.Tensor  # (B,) bool
    target_probs: torch.Tensor  # (T + B, V)
    draft_probs: torch.Tensor | None  # (T, V) or None
    uniforms: torch.Tensor  # (T,) float64
    noise: torch.Tensor  # (B, V)
    out: torch.Tensor  # (B, max_k + 1) int64, filled with -1
    num_accepted: torch.Tensor  # (B,) int64


def prepare_batch(draft_token_ids, num_draft_tokens, target_probs, draft_probs=None, *,
                  greedy=False, uniforms=None, noise=None, generator=None) -> Batch:
    """speclab.verify's checks and random draws (same order, so the same generator gives the
    same numbers), then the buffers the kernels write."""
    draft_token_ids, k, target_probs, draft_probs, is_greedy = check_batch(
        draft_token_ids, num_draft_tokens, target_probs, draft_probs, greedy)
    B, V, T = k.numel(), target_probs.shape[1], draft_token_ids.numel()
    device = target_probs.device
    uniforms = check_or_draw_uniforms(uniforms, T, generator, device)
    noise = check_or_draw_noise(noise, B, V, generator, device)
    _race_dtype(target_probs, draft_probs, noise)  # fail early on dtypes the kernels do not take
    _check_device(target_probs)
    max_k = int(k.max()) if B else 0
    out = torch.full((B, max_k + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int64, device=device)
    return Batch(draft_token_ids.contiguous(), k.contiguous(), (torch.cumsum(k, 0) - k).contiguous(),
                 is_greedy.contiguous(), target_probs, draft_probs, uniforms.contiguous(), noise, out,
                 torch.zeros(B, dtype=torch.int64, device=device))


def launch_greedy(b: Batch, block_v: int) -> None:
    """Kernel 1 over all requests (random requests return at once)."""
    _greedy_kernel[(b.k.numel(),)](
        b.out, b.out.stride(0), b.num_accepted, b.draft_token_ids, b.cu, b.k, b.is_greedy,
        b.target_probs, b.target_probs.stride(0), b.target_probs.stride(1), b.target_probs.shape[1],
        BLOCK_V=block_v)


def launch_accept(b: Batch, kernel=None) -> None:
    """Kernel 2 over all requests (greedy requests return at once).

    `kernel` replaces `_accept_kernel` with one of the same parameters (exercise 07 grades yours).
    """
    q = b.draft_probs if b.draft_probs is not None else b.target_probs  # a dummy when one-hot
    (kernel or _accept_kernel)[(b.k.numel(),)](
        b.out, b.out.stride(0), b.num_accepted, b.draft_token_ids, b.cu, b.k, b.is_greedy,
        b.target_probs, b.target_probs.stride(0), b.target_probs.stride(1),
        q, q.stride(0), q.stride(1), b.uniforms, NO_DRAFT_PROBS=b.draft_probs is None, num_warps=1)


def launch_end_tokens(b: Batch, block_v: int) -> None:
    """Kernel 3 over all requests; needs `b.num_accepted` from kernel 2."""
    q = b.draft_probs if b.draft_probs is not None else b.target_probs
    _end_token_kernel[(b.k.numel(),)](
        b.out, b.out.stride(0), b.num_accepted, b.draft_token_ids, b.cu, b.k, b.is_greedy,
        b.target_probs, b.target_probs.stride(0), b.target_probs.stride(1),
        q, q.stride(0), q.stride(1), b.noise, b.noise.stride(0), b.noise.stride(1),
        b.target_probs.shape[1], NO_DRAFT_PROBS=b.draft_probs is None,
        RACE_DTYPE=_race_dtype(b.target_probs, b.draft_probs, b.noise), BLOCK_V=block_v)


def rejection_sample_blocked(draft_token_ids, num_draft_tokens, target_probs, draft_probs=None, *,
                             greedy=False, uniforms=None, noise=None, generator=None,
                             block_v: int = DEFAULT_BLOCK_V) -> torch.Tensor:
    """`rejection_sample` with an explicit vocabulary tile `block_v` (a power of two)."""
    b = prepare_batch(draft_token_ids, num_draft_tokens, target_probs, draft_probs, greedy=greedy,
                      uniforms=uniforms, noise=noise, generator=generator)
    if b.k.numel() == 0:
        return b.out
    block_v = min(block_v, triton.next_power_of_2(b.target_probs.shape[1]))
    launch_greedy(b, block_v)
    launch_accept(b)
    launch_end_tokens(b, block_v)
    return b.out


def rejection_sample(draft_token_ids, num_draft_tokens, target_probs, draft_probs=None, *,
                     greedy=False, uniforms=None, noise=None, generator=None) -> torch.Tensor:
    """Verify a ragged batch of drafts with the Triton kernels.

    Same arguments, checks, random draws and output as `speclab.verify.rejection_sample`; given
    the same `uniforms` and `noise` (or the same generator state) the output is identical.
    Probabilities and noise must be float32 or float64.

    Returns:
        (B, max_k + 1) int64: accepted drafts, then the recovered or bonus token, then -1.
    """
    return rejection_sample_blocked(draft_token_ids, num_draft_tokens, target_probs, draft_probs,
                                    greedy=greedy, uniforms=uniforms, noise=noise, generator=generator)


# ----------------------------------------------------------------------------------------------
# A second, marked kernel (lesson 10): block verification, rejection_sample_method "block"
#
# Sun et al., "Block Verification Accelerates Speculative Decoding" (ICLR 2025), Algorithm 2; the
# torch reference is speclab/verify/block.py. One program per random request walks its drafts once:
#   rho_i = min(rho_{i-1} p_i(x_i) / q_i(x_i), 1)                       (0 if q_i(x_i) = 0)
#   h_i   = Z / (Z + 1 - rho_i), Z = sum_v max(rho_i p_{i+1}(v) - q_{i+1}(v), 0)  if x_{i+1} is a draft
#   h_i   = rho_i                                                        for the last draft
#   tau   = the LAST i with u_i <= h_i: a failed test does not stop the walk (the rule's crux)
# then races for the token at column tau over p (bonus, tau = k) or max(rho_tau p - q, 0).
# Unlike the standard rule, each draft position reads a whole vocabulary row of p and q (for Z):
# about k * V * 8 bytes more per request, which buys nothing for one-hot drafts (vLLM runs block
# verification only with draft probabilities). Everything after the loads is float64, in the
# reference's order; a GPU must not fuse rho * p - q into one FMA (launched with
# enable_fp_fusion=False), and the sum Z is reduced in another order than torch's, so a decision
# can differ only when a uniform falls within a few float64 ulps of its threshold.
# Greedy requests are `_greedy_kernel`'s, as for the standard rule.


@triton.jit
def _residual_mass(rho, p_row, stride_v, q_row, stride_q_v, x, V,
                   NO_DRAFT_PROBS: tl.constexpr, BLOCK_V: tl.constexpr):
    """Z = sum_v max(rho p(v) - q(v), 0) over one row, float64; q = one-hot(x) for one-hot drafts."""
    z = tl.zeros([], tl.float64)
    for start in range(0, V, BLOCK_V):
        offs_v = start + tl.arange(0, BLOCK_V)
        mask = offs_v < V
        p = tl.load(p_row + offs_v * stride_v, mask=mask, other=0.0).to(tl.float64)
        if NO_DRAFT_PROBS:
            q = tl.where(offs_v == x, 1.0, 0.0).to(tl.float64)
        else:
            q = tl.load(q_row + offs_v * stride_q_v, mask=mask, other=0.0).to(tl.float64)
        z += tl.sum(tl.maximum(rho * p - q, 0.0), axis=0)  # masked lanes add max(0 - 0, 0) = 0
    return z


@triton.jit
def _block_kernel(out_ptr, stride_out, num_accepted_ptr, draft_ptr, cu_ptr, k_ptr, is_greedy_ptr,
                  target_ptr, stride_target, stride_target_v,
                  draft_probs_ptr, stride_draft, stride_draft_v, uniforms_ptr,
                  noise_ptr, stride_noise, stride_noise_v, V,
                  NO_DRAFT_PROBS: tl.constexpr, BLOCK_V: tl.constexpr):
    r = tl.program_id(0)
    if tl.load(is_greedy_ptr + r):
        return
    k = tl.load(k_ptr + r)
    cu = tl.load(cu_ptr + r)
    out_row = out_ptr + r.to(tl.int64) * stride_out
    rho = tl.full([], 1.0, tl.float64)  # rho_0 = 1
    rho_tau = tl.full([], 1.0, tl.float64)
    tau = tl.zeros([], tl.int64)  # set to i + 1 below: the loop index has k's type (int64)
    k_eff = 0  # drafts before the first placeholder: the rest are ignored
    alive = 1
    for i in range(0, k):
        x = tl.load(draft_ptr + cu + i)
        alive = tl.where(x >= 0, alive, 0)
        if alive > 0:
            k_eff += 1
            p_x = tl.load(target_ptr + (cu + r + i) * stride_target + x * stride_target_v).to(tl.float64)
            if NO_DRAFT_PROBS:
                q_x = tl.full([], 1.0, tl.float64)
            else:
                q_x = tl.load(draft_probs_ptr + (cu + i) * stride_draft + x * stride_draft_v).to(tl.float64)
            ratio = _div_rn(p_x, tl.where(q_x > 0, q_x, 1.0))
            rho = tl.where(q_x > 0, tl.minimum(rho * ratio, 1.0), 0.0)
            x_next = tl.load(draft_ptr + cu + i + 1, mask=i + 1 < k, other=-1)
            h = rho  # the last draft: h = rho
            if x_next >= 0:  # h from the block residual mass of the next position
                z = _residual_mass(rho, target_ptr + (cu + r + i + 1) * stride_target, stride_target_v,
                                   draft_probs_ptr + (cu + i + 1) * stride_draft, stride_draft_v, x_next, V,
                                   NO_DRAFT_PROBS, BLOCK_V)
                denom = z + (1.0 - rho)
                h = tl.where(denom > 0, _div_rn(z, tl.where(denom > 0, denom, 1.0)), 1.0)
            if tl.load(uniforms_ptr + cu + i) <= h:
                tau = i + 1  # keep the LAST position that passes
                rho_tau = rho
    for i in range(0, tau):
        tl.store(out_row + i, tl.load(draft_ptr + cu + i))
    tl.store(num_accepted_ptr + r, tau)

    # the token at column tau: bonus from p (tau = k_eff), or from max(rho_tau p - q, 0)
    rejected = tau < k_eff
    x = tl.load(draft_ptr + cu + tau, mask=rejected, other=-1)
    V_q = tl.where(rejected, V, 0)  # read q only after a kept prefix shorter than the drafts
    p_row = target_ptr + (cu + r + tau) * stride_target
    q_row = draft_probs_ptr + (cu + tau) * stride_draft
    e_row = noise_ptr + r.to(tl.int64) * stride_noise
    best_res = tl.full([], float("-inf"), tl.float64)
    idx_res = tl.zeros([], tl.int32)
    best_p = tl.full([], float("-inf"), tl.float64)
    idx_p = tl.zeros([], tl.int32)
    res_positive = tl.zeros([], tl.int32)
    for start in range(0, V, BLOCK_V):
        offs_v = start + tl.arange(0, BLOCK_V)
        mask = offs_v < V
        p = tl.load(p_row + offs_v * stride_target_v, mask=mask, other=0.0).to(tl.float64)
        e = tl.load(e_row + offs_v * stride_noise_v, mask=mask, other=1.0).to(tl.float64)
        if NO_DRAFT_PROBS:
            q = tl.where(offs_v == x, 1.0, 0.0).to(tl.float64)
        else:
            q = tl.load(q_row + offs_v * stride_draft_v, mask=offs_v < V_q, other=0.0).to(tl.float64)
        residual = tl.maximum(rho_tau * p - q, 0.0)
        res_positive = tl.maximum(res_positive, tl.max((residual > 0).to(tl.int32), axis=0))
        race_res = tl.where(mask, _div_rn(residual, e), float("-inf"))
        race_p = tl.where(mask, _div_rn(p, e), float("-inf"))
        best_res, idx_res = _argmax_update(best_res, idx_res, race_res, start)
        best_p, idx_p = _argmax_update(best_p, idx_p, race_p, start)
    token = tl.where(rejected & (res_positive > 0), idx_res, idx_p)
    tl.store(out_row + tau, tl.minimum(token, V - 1))


def launch_block(b: Batch, block_v: int) -> None:
    """The block kernel over all requests (greedy requests return at once)."""
    q = b.draft_probs if b.draft_probs is not None else b.target_probs  # a dummy when one-hot
    options = {} if interpreted() else {"enable_fp_fusion": False}  # rho * p - q rounded as torch does
    _block_kernel[(b.k.numel(),)](
        b.out, b.out.stride(0), b.num_accepted, b.draft_token_ids, b.cu, b.k, b.is_greedy,
        b.target_probs, b.target_probs.stride(0), b.target_probs.stride(1),
        q, q.stride(0), q.stride(1), b.uniforms, b.noise, b.noise.stride(0), b.noise.stride(1),
        b.target_probs.shape[1], NO_DRAFT_PROBS=b.draft_probs is None, BLOCK_V=block_v, **options)


def rejection_sample_block(draft_token_ids, num_draft_tokens, target_probs, draft_probs=None, *,
                           greedy=False, uniforms=None, noise=None, generator=None,
                           block_v: int = DEFAULT_BLOCK_V) -> torch.Tensor:
    """Block verification with the Triton kernels: the output of `speclab.verify.block.rejection_sample`.

    Same arguments, checks, random draws and output as the torch rule; greedy requests run
    `_greedy_kernel`, random ones `_block_kernel`.
    """
    b = prepare_batch(draft_token_ids, num_draft_tokens, target_probs, draft_probs, greedy=greedy,
                      uniforms=uniforms, noise=noise, generator=generator)
    if b.k.numel() == 0:
        return b.out
    block_v = min(block_v, triton.next_power_of_2(b.target_probs.shape[1]))
    launch_greedy(b, block_v)
    launch_block(b, block_v)
    return b.out


# rejection_sample_method -> the kernel implementing it (speclab.verify.backend picks from here)
RULES = {"standard": rejection_sample, "block": rejection_sample_block}

_TL_FLOAT = {torch.float32: tl.float32, torch.float64: tl.float64}


def _race_dtype(target_probs, draft_probs, noise):
    """The dtype torch computes max(p - q, 0) / E in (same promotion rules as Triton's)."""
    dtypes = [target_probs.dtype, noise.dtype] + ([draft_probs.dtype] if draft_probs is not None else [])
    if any(d not in _TL_FLOAT for d in dtypes):
        raise ValueError(f"the Triton verifier takes float32 or float64 probabilities and noise, got "
                         f"{', '.join(map(str, dtypes))}: convert with .float(), or use the torch "
                         f"reference speclab.verify.rejection_sample")
    race = target_probs.dtype if draft_probs is None else torch.promote_types(target_probs.dtype, draft_probs.dtype)
    return _TL_FLOAT[torch.promote_types(race, noise.dtype)]


def interpreted() -> bool:
    """True when this module's kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1 was set
    before this module was imported)."""
    return not isinstance(_greedy_kernel, triton.runtime.JITFunction)


def _check_device(target_probs):
    if target_probs.device.type != "cuda" and not interpreted():
        raise RuntimeError(f"the Triton verifier got tensors on {target_probs.device} but compiles for a GPU: "
                           f"move them to CUDA, or set TRITON_INTERPRET=1 before importing triton to run "
                           f"the kernels in Triton's CPU interpreter (slow)")


# ----------------------------------------------------------------------------------------------
# Compiling for a GPU without one: what the interpreter cannot check
#
# The interpreter runs each program in Python, so it never type-checks a branch or a loop-carried
# value: a block kernel whose `tau` was int32 before a loop and int64 inside it passed every test here
# and did not compile on the first real GPU. Triton can compile for a named GPU on any machine (its
# front end, LLVM and the ptxas it ships), which tests/test_07_kernel_compiles.py does on the CPU.

# (kernel, its constexpr variants): every branch a launch can take
_VARIANTS = (
    ("_greedy_kernel", [{"BLOCK_V": 2048}]),
    ("_accept_kernel", [{"NO_DRAFT_PROBS": False}, {"NO_DRAFT_PROBS": True}]),
    ("_end_token_kernel", [{"NO_DRAFT_PROBS": False, "BLOCK_V": 2048}, {"NO_DRAFT_PROBS": True, "BLOCK_V": 2048}]),
    ("_block_kernel", [{"NO_DRAFT_PROBS": False, "BLOCK_V": 2048}, {"NO_DRAFT_PROBS": True, "BLOCK_V": 2048}]),
)
_POINTERS = {"out_ptr": "*i64", "num_accepted_ptr": "*i64", "draft_ptr": "*i64", "cu_ptr": "*i64", "k_ptr": "*i64",
             "is_greedy_ptr": "*i1", "uniforms_ptr": "*fp64"}  # the other pointers: probabilities and noise


@triton.jit
def _plain_division(x_ptr, y_ptr, out_ptr):
    """For comparison only (`--ptx`, lesson 07): what a float32 `/` compiles to on a GPU."""
    tl.store(out_ptr, tl.load(x_ptr) / tl.load(y_ptr))


def ptx_instructions(ptx: str) -> dict[str, int]:
    """The division and fused multiply-add instructions a PTX listing uses, with their counts."""
    found = re.findall(r"^\s*(?:@%p\d+\s+)?((?:div|fma)\.[\w.]+)", ptx, flags=re.M)
    return {name: found.count(name) for name in sorted(set(found))}


def plain_division_ptx(capability: int = 90) -> str:
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32"}
    return triton.compile(ASTSource(_plain_division, signature), target=GPUTarget("cuda", capability, 32)).asm["ptx"]


def print_ptx_report(capability: int = 90) -> None:
    """`--ptx`: compile every kernel for a GPU of compute capability `capability` (none needed) and
    print the divisions and FMAs each uses, beside what a plain `/` gives."""
    print(f"Compiled for CUDA compute capability {capability // 10}.{capability % 10} (no GPU needed): "
          f"divisions and fused multiply-adds in the PTX")
    for dtype in ("fp32", "fp64"):
        for name, ptx in compile_for_gpu(dtype, capability).items():
            used = ptx_instructions(ptx)
            print(f"  {dtype}  {name:<62} {', '.join(f'{op} x{n}' for op, n in used.items()) or '-'}")
    used = ptx_instructions(plain_division_ptx(capability))
    print(f"  a float32 `/` for comparison: {', '.join(used)} (the fast division, off by up to 2 ulp)")


def compile_for_gpu(dtype: str = "fp32", capability: int = 90) -> dict[str, str]:
    """Compile every kernel variant, for probabilities and noise of `dtype` ("fp32" or "fp64"), for
    CUDA compute capability `capability` (90: Hopper) with no GPU present; returns
    {"<kernel>(<constexprs>)": PTX}. Needs the kernels compiled, not interpreted: run it in a process without
    TRITON_INTERPRET=1. Raises triton's CompilationError on a type error."""
    if interpreted():
        raise RuntimeError("compile_for_gpu needs a process without TRITON_INTERPRET=1 (the kernels are interpreted)")
    out = {}
    for name, variants in _VARIANTS:
        fn = globals()[name]
        for constexprs in variants:
            if "RACE_DTYPE" in fn.arg_names:
                constexprs = dict(constexprs, RACE_DTYPE=tl.float32 if dtype == "fp32" else tl.float64)
            signature = {arg: "constexpr" if arg in constexprs else
                         _POINTERS.get(arg, "*" + dtype) if arg.endswith("_ptr") else "i32"
                         for arg in fn.arg_names}
            options = {"enable_fp_fusion": False} if name == "_block_kernel" else {}  # as launch_block
            compiled = triton.compile(ASTSource(fn, signature, constexprs=constexprs),
                                      target=GPUTarget("cuda", capability, 32), options=options)
            shown = ", ".join(f"{k}={v.name if isinstance(v, tl.dtype) else v}" for k, v in constexprs.items())
            out[f"{name}({shown})"] = compiled.asm["ptx"]
    return out


# ----------------------------------------------------------------------------------------------
# Benchmark: python scripts/bench_kernel.py (or python -m speclab.kernels.rejection_sample)


def _bench_inputs(B, k, V, device, seed=0):
    """A random (non-greedy) batch with real draft probabilities: the path that reads the most."""
    g = torch.Generator(device=device).manual_seed(seed)
    T = B * k
    p = torch.randn(T + B, V, device=device, generator=g).softmax(-1)  # (T + B, V)
    q = (torch.randn(T, V, device=device, generator=g) * 2).softmax(-1)  # (T, V)
    drafts = torch.multinomial(q, 1, generator=g).flatten()  # (T,) x_i ~ q_i
    u = torch.rand(T, dtype=torch.float64, device=device, generator=g).clamp(min=1e-300)
    e = torch.empty(B, V, device=device).exponential_(generator=g).clamp(min=torch.finfo(torch.float32).tiny)
    return drafts, [k] * B, p, q, u, e


def _bytes_moved(b: Batch, rule: str = "standard") -> int:
    """Minimum traffic of a rule's kernels: per request k scalars of p, q, u and drafts, one row of p
    and noise, one row of q if a draft was rejected, and the output row; the block rule also reads
    whole rows of p and q at every draft position but the first (its residual mass Z)."""
    V, e = b.target_probs.shape[1], b.target_probs.element_size()
    rejected = int((b.num_accepted < b.k).sum())
    B, T = b.k.numel(), b.draft_token_ids.numel()
    extra = 2 * V * e * int((b.k - 1).clamp(min=0).sum()) if rule == "block" else 0
    return B * V * (e + b.noise.element_size()) + rejected * V * e + T * (2 * e + 16) + b.out.numel() * 8 + extra


def _launch_all(b, block_v, rule="standard"):
    launch_greedy(b, block_v)
    if rule == "block":
        launch_block(b, block_v)
    else:
        launch_accept(b)
        launch_end_tokens(b, block_v)


def _bench_gpu(json_path=None, dev="cuda", vocabs=(32000, 128256), batches=(1, 64, 256), copy_bytes=1 << 30):
    from triton.testing import do_bench  # only on a GPU: the interpreter has no do_bench timing
    src = torch.empty(copy_bytes, dtype=torch.uint8, device=dev).random_(0, 255)  # 1 GiB: far past the L2
    dst = torch.empty_like(src)
    copy_gbs = 2 * src.numel() / do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-6
    del src, dst
    name = torch.cuda.get_device_name()
    print(f"{name}: device-to-device copy {copy_gbs:.0f} GB/s, bytes read + written (the memory limit below)")
    print(f"{'rule':>8} {'B':>4} {'k':>2} {'V':>7} | {'kernels ms':>10} {'GB/s':>7} {'% copy':>6} | "
          f"{'wrapper ms':>10} {'torch ref ms':>12} {'ref/kernels':>11}")
    references = {"standard": rejection_sample_torch, "block": block_rule.rejection_sample}
    wrappers = {"standard": rejection_sample, "block": rejection_sample_block}
    rows = []
    for rule in ("standard", "block"):
        for V in vocabs:
            for B in batches:
                k = 5
                drafts, ks, p, q, u, e = _bench_inputs(B, k, V, dev)
                b = prepare_batch(drafts, ks, p, q, uniforms=u, noise=e)
                block_v = min(DEFAULT_BLOCK_V, triton.next_power_of_2(V))

                def kernels_only():
                    b.out.fill_(PLACEHOLDER_TOKEN_ID)
                    _launch_all(b, block_v, rule)

                t_kernel = do_bench(kernels_only, return_mode="median")
                gbs = _bytes_moved(b, rule) / t_kernel * 1e-6
                wrap, ref = wrappers[rule], references[rule]
                t_wrap = do_bench(lambda: wrap(drafts, ks, p, q, uniforms=u, noise=e), return_mode="median")
                t_ref = do_bench(lambda: ref(drafts, ks, p, q, uniforms=u, noise=e), return_mode="median")
                identical = torch.equal(wrap(drafts, ks, p, q, uniforms=u, noise=e),
                                        ref(drafts, ks, p, q, uniforms=u, noise=e))
                print(f"{rule:>8} {B:>4} {k:>2} {V:>7} | {t_kernel:>10.3f} {gbs:>7.0f} {100 * gbs / copy_gbs:>5.0f}% | "
                      f"{t_wrap:>10.3f} {t_ref:>12.3f} {t_ref / t_kernel:>10.1f}x" + ("" if identical else "  DIFFERENT"))
                rows.append(dict(rule=rule, B=B, k=k, V=V, kernels_ms=t_kernel, gb_per_s=gbs,
                                 fraction_of_copy=gbs / copy_gbs, wrapper_ms=t_wrap, torch_reference_ms=t_ref,
                                 reference_over_kernels=t_ref / t_kernel, identical=identical))
                assert identical, f"{rule} B={B} V={V}: the kernels and the torch reference differ"
    print("kernels = the launches on a prepared batch (greedy + accept + end token, or greedy + block); wrapper "
          "adds speclab's input checks (which read every row); GB/s counts the minimum bytes the kernels must "
          "move; medians of triton.testing.do_bench.")
    if json_path:
        machine = dict(gpu=name, copy_gb_per_s=copy_gbs, torch=torch.__version__, triton=triton.__version__,
                       cuda=torch.version.cuda, python=platform.python_version())
        with open(json_path, "w") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=1)
        print(f"wrote {json_path}")


def _bench_interpreter():
    print("No CUDA GPU: timing the kernels in Triton's CPU interpreter (TRITON_INTERPRET=1).")
    print("THIS IS NOT A PERFORMANCE FIGURE: the interpreter runs each program in Python/numpy.")
    print(f"{'B':>4} {'k':>2} {'V':>6} | {'interpreter ms':>14} {'torch ref ms':>12}")
    for B, V in ((1, 1000), (8, 1000), (8, 4000)):
        drafts, ks, p, q, u, e = _bench_inputs(B, 5, V, "cpu")
        times = {}
        for name, fn in (("kernel", rejection_sample), ("ref", rejection_sample_torch)):
            times[name + "_out"] = fn(drafts, ks, p, q, uniforms=u, noise=e)  # warm up
            times[name] = min(timed(lambda: fn(drafts, ks, p, q, uniforms=u, noise=e))[1] for _ in range(3)) * 1e3  # best of 3, ms
        assert torch.equal(times["kernel_out"], times["ref_out"])
        print(f"{B:>4} {5:>2} {V:>6} | {times['kernel']:>14.1f} {times['ref']:>12.2f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description="lesson 07's Triton verification kernels against the torch rules")
    parser.add_argument("--json", metavar="PATH", help="also write the GPU table as JSON")
    parser.add_argument("--ptx", action="store_true", help="compile the kernels for a GPU (none needed: run "
                        "without TRITON_INTERPRET=1) and print the instructions they divide with, instead")
    args = parser.parse_args(argv)
    if args.ptx:
        if interpreted():
            raise SystemExit("--ptx compiles the kernels: run it without TRITON_INTERPRET=1")
        print_ptx_report()
        return
    if torch.cuda.is_available() and not interpreted():
        _bench_gpu(args.json)
    elif interpreted():
        _bench_interpreter()
    else:
        raise SystemExit("no CUDA GPU: run with TRITON_INTERPRET=1 (python scripts/bench_kernel.py sets it)")


if __name__ == "__main__":
    main()
