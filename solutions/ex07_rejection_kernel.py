"""Exercise 07 (solution): the accept walk of the Triton verifier, on vLLM's inclusive offsets.

`accept_kernel` does the job of kernel 2 of speclab/kernels/rejection_sample.py, but takes the
batch as vLLM's rejection sampler does: `cu_num_draft_tokens` is the *inclusive* cumulative sum of
the drafts per request (no leading 0, no separate k). Request r's drafts are rows
[cu[r - 1], cu[r]) (cu[-1] taken as 0) and its target rows start at cu[r - 1] + r. One program per
request accepts x_i iff
  x_i >= 0 (a -1 placeholder is always rejected), q_i(x_i) > 0, and
  p_i(x_i) / q_i(x_i) >= u_i  (divided in p's precision with IEEE rounding, compared in float64),
with q_i(x_i) = 1 when NO_DRAFT_PROBS (one-hot drafts). It writes each accepted draft at
out[r, i], stops at the first rejection and stores the number accepted n at num_accepted[r].
Greedy requests (is_greedy[r]) are not its business: it returns at once for them.

Graded by: .venv/bin/python -m pytest --impl=exercises tests/test_ex07_rejection_kernel.py
"""

import triton
import triton.language as tl


@triton.jit
def accept_kernel(out_ptr, stride_out, num_accepted_ptr, draft_ptr, cu_num_draft_ptr, is_greedy_ptr,
                  target_ptr, stride_target, stride_target_v,
                  draft_probs_ptr, stride_draft, stride_draft_v, uniforms_ptr,
                  NO_DRAFT_PROBS: tl.constexpr):
    """Walk request r = program_id(0)'s drafts; store accepted drafts and their count n."""
    r = tl.program_id(0)
    if tl.load(is_greedy_ptr + r):
        return
    start = tl.load(cu_num_draft_ptr + r - 1, mask=r > 0, other=0)  # inclusive cumsum: r's drafts end at cu[r]
    k = tl.load(cu_num_draft_ptr + r) - start
    n = 0
    rejected = False
    for i in range(0, k):
        if not rejected:
            x = tl.load(draft_ptr + start + i)
            real = x >= 0
            p = tl.load(target_ptr + (start + r + i) * stride_target + x * stride_target_v, mask=real, other=0.0)
            if NO_DRAFT_PROBS:
                q = tl.full([], 1.0, tl.float32)
            else:
                q = tl.load(draft_probs_ptr + (start + i) * stride_draft + x * stride_draft_v, mask=real, other=0.0)
            u = tl.load(uniforms_ptr + start + i)
            ratio = tl.math.div_rn(p, tl.where(q > 0, q, 1.0))
            if real & (q > 0) & (ratio.to(tl.float64) >= u):
                tl.store(out_ptr + r.to(tl.int64) * stride_out + i, x)
                n += 1
            else:
                rejected = True
    tl.store(num_accepted_ptr + r, n)
