"""Proposers: what drafts the tokens the target verifies (n-gram lookup, a draft model)."""
