"""Matrix-Game 2.0 (Skywork, 2025): an image- and action-conditioned causal world model on causal Wan 2.1 blocks.

Imports nothing heavy: the registry reads `family.py`; the network loads through `factory.py`.
"""
