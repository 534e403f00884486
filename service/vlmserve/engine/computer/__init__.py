"""Computer use in the engine: the computer tool offered in the model's own action format and
coordinate convention, its actions held to a grammar, and calls mapped back to screen pixels."""
