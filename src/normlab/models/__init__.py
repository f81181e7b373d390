"""Models: one stack that owns placement, DeepNorm/Admin scaling, init and the final norm."""
from .bert import BertEncoder, load_bert
from .conformer import ConformerBlock, ConformerEncoder
from .old_keys import OldKeysError, upgrade_file, upgrade_state_dict
from .placement import INITS, SLOTS, LayerSpec, plan
from .stack import Block, SequenceEncoder, Stack, compile_blocks
from .transformer import TransformerBlock, TransformerEncoder
from .video import VideoEncoder

__all__ = ["TransformerBlock", "TransformerEncoder", "ConformerBlock", "ConformerEncoder", "VideoEncoder",
           "BertEncoder", "load_bert", "INITS", "SLOTS", "LayerSpec", "plan", "Block", "Stack", "SequenceEncoder",
           "compile_blocks", "OldKeysError", "upgrade_file", "upgrade_state_dict"]
