"""Models: one stack that owns placement, DeepNorm/Admin scaling, init and the final norm."""
from .bert import BertEncoder, load_bert
from .conformer import ConformerBlock, ConformerEncoder
from .placement import INITS
from .stack import compile_blocks
from .transformer import TransformerBlock, TransformerEncoder
from .video import VideoEncoder

__all__ = ["TransformerBlock", "TransformerEncoder", "ConformerBlock", "ConformerEncoder", "VideoEncoder",
           "BertEncoder", "load_bert", "INITS", "compile_blocks"]
