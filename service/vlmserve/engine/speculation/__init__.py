"""Speculative decoding: several tokens per forward (draft sources, acceptance, policy)."""
