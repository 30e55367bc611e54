"""Moved to speclab.models.heads.medusa (the head files live together, beside their config)."""
from speclab.models.heads.medusa import *  # noqa: F401,F403
