"""Moved to speclab.verify.backend (the one place that picks a rule's implementation)."""
from speclab.verify.backend import BACKENDS, get_rejection_sampler  # noqa: F401
