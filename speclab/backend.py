"""Which verifier runs: the torch reference or the Triton kernels (lesson 07).

Both have the signature of `speclab.verify.rejection_sample` and, given the same uniforms and
noise, return the same tokens. The engine asks `get_rejection_sampler()` once and calls the result.

    SPECLAB_VERIFIER=auto    Triton on a CUDA GPU when triton imports, torch otherwise (default)
    SPECLAB_VERIFIER=torch   speclab.verify.rejection_sample
    SPECLAB_VERIFIER=triton  speclab.kernels.rejection_sample.rejection_sample; without a GPU only
                             under Triton's interpreter (TRITON_INTERPRET=1, slow: for tests)
"""

import os

import torch

BACKENDS = ("auto", "torch", "triton")


def get_rejection_sampler(backend: str | None = None):
    """Return the rejection sampler to use.

    Args:
        backend: "auto", "torch" or "triton"; None reads the SPECLAB_VERIFIER environment
            variable (default "auto").
    Returns:
        A function with the signature and outputs of `speclab.verify.rejection_sample`.
    """
    name = backend if backend is not None else os.environ.get("SPECLAB_VERIFIER", "auto")
    name = name.strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown verifier backend {name!r}: choose one of {', '.join(BACKENDS)} "
                         f"(argument `backend` or the SPECLAB_VERIFIER environment variable)")
    if name == "torch" or (name == "auto" and not torch.cuda.is_available()):
        from speclab.verify import rejection_sample
        return rejection_sample
    try:
        from speclab.kernels import rejection_sample as kernel
    except ImportError as err:
        if name == "auto":
            from speclab.verify import rejection_sample
            return rejection_sample
        raise RuntimeError(f"SPECLAB_VERIFIER=triton but the Triton kernels do not import ({err}): "
                           f"install triton (pip install -e .), or use SPECLAB_VERIFIER=torch") from err
    if not torch.cuda.is_available() and not kernel.interpreted():
        raise RuntimeError("SPECLAB_VERIFIER=triton needs a CUDA GPU. Without one, set TRITON_INTERPRET=1 "
                           "before starting Python to run the kernels in Triton's CPU interpreter (slow), "
                           "or use SPECLAB_VERIFIER=torch")
    return kernel.rejection_sample
