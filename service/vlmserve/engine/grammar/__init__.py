"""Constrained output: request -> llguidance grammar, and the grammar as a logits processor."""
