"""Moved to speclab.models.heads.mtp (the head files live together, beside their config)."""
from speclab.models.heads.mtp import *  # noqa: F401,F403
