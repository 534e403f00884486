"""A contract request -> a PreparedRequest: prompt, tokens, images (worker threads, no MLX)."""
