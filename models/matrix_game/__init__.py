"""Matrix-Game 2.0 (Skywork): an action-conditioned causal Wan world model. Imports nothing heavy."""
