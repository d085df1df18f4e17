"""Causal Wan 2.1 (Self-Forcing / CausVid / LongLive lineage): DiT, VAE decoder, text encoder, loading.

Pure modules with the per-session state passed in and out; see README.md in this folder
for the API the engine adapter calls.
"""

from worldcast.models.causal_wan.config import CausalWanConfig, WanVAEConfig, longlive_1_3b, tiny, wan_1_3b
from worldcast.models.causal_wan.dense_attention import DenseSelfAttention, visible_key_frames
from worldcast.models.causal_wan.dit import CausalWanDiT, DiTOutput
from worldcast.models.causal_wan.presets import PRESETS, WanPreset, resolve_preset
from worldcast.models.causal_wan.schedule import FlowSchedule
from worldcast.models.causal_wan.vae import WanVAEDecoder

__all__ = [
    "CausalWanConfig", "WanVAEConfig", "tiny", "wan_1_3b", "longlive_1_3b",
    "CausalWanDiT", "DiTOutput", "DenseSelfAttention", "visible_key_frames", "WanVAEDecoder",
    "PRESETS", "WanPreset", "resolve_preset", "FlowSchedule",
]  # fmt: skip
