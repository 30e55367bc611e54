"""Moved to speclab.models.heads.eagle (the head files live together, beside their config)."""
from speclab.models.heads.eagle import *  # noqa: F401,F403
