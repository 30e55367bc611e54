"""speclab.kernels: the handwritten Triton kernels (installed from the top-level kernels/ folder).

Importing this package does no GPU work and does not import triton.
"""
