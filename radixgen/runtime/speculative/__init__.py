"""Speculative decoding: n-gram (prompt-lookup) drafts proposed by the scheduler, verified by the
worker in the same forward as the step's other rows (see docs/speculative.md)."""
