"""Building blocks: the residual unit with named norm slots, attention, feed-forward, positions."""
from .attention import MultiHeadSelfAttention, attention_mask
from .feedforward import ACTIVATIONS, FeedForward
from .positional import POSITIONS, PositionalEncoding, sinusoidal_table
from .residual import ResidualUnit, Slots, add_norm, apply_norm, materialize, takes_residual

__all__ = ["MultiHeadSelfAttention", "attention_mask", "FeedForward", "ACTIVATIONS", "PositionalEncoding", "POSITIONS",
           "sinusoidal_table", "ResidualUnit", "Slots", "add_norm", "apply_norm", "materialize", "takes_residual"]
