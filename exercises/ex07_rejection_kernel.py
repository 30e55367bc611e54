"""Exercise 07: the random-sampling kernel of the Triton verifier.

`accept_kernel` is kernel 2 of speclab/kernels/rejection_sample.py: one program per request
walks that request's drafts x_i (rows cu_r + i; target rows cu_r + r + i) and accepts x_i iff
  x_i >= 0 (a -1 placeholder is always rejected), q_i(x_i) > 0, and
  p_i(x_i) / q_i(x_i) >= u_i  (divided in p's precision with IEEE rounding, compared in float64),
with q_i(x_i) = 1 when NO_DRAFT_PROBS (one-hot drafts). It writes each accepted draft at
out[r, i], stops at the first rejection and stores the number accepted n at num_accepted[r].
Greedy requests (is_greedy[r]) are not its business: it returns at once for them.

It is launched by `speclab.kernels.rejection_sample.launch_accept(batch, kernel=accept_kernel)`,
after which the lesson's end-token kernel writes the recovered (n < k) or bonus (n == k) token at
column n, so a wrong n shows up as a wrong output row.

Graded by: pytest --impl=exercises tests/test_ex07_rejection_kernel.py
"""

import triton
import triton.language as tl


@triton.jit
def accept_kernel(out_ptr, stride_out, num_accepted_ptr, draft_ptr, cu_ptr, k_ptr, is_greedy_ptr,
                  target_ptr, stride_target, stride_target_v,
                  draft_probs_ptr, stride_draft, stride_draft_v, uniforms_ptr,
                  NO_DRAFT_PROBS: tl.constexpr):
    """Walk request r = program_id(0)'s drafts; store accepted drafts and their count n."""
    # About 20 lines. Return at once for a greedy request; load k_r and cu_r; loop i over the
    # drafts while nothing was rejected: load x_i, then p(x_i) and q(x_i) with the loads masked
    # when x_i == -1 (q = 1 when NO_DRAFT_PROBS) and u_i; accept as the docstring at the top says
    # (tl.fdiv(..., ieee_rounding=True), compare in tl.float64); store accepted drafts at out[r, i];
    # finally store n at num_accepted[r].
    raise NotImplementedError("TODO(ex07): walk request r's drafts: accept while x >= 0, q > 0 and "
                              "p / q >= u; store the accepted drafts and their count n (about 20 lines)")
