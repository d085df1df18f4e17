"""World-model families: network code, weights, the embedded default model."""
