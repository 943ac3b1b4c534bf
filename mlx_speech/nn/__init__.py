"""Model-agnostic layers and streaming state shared by every model: the names families use.

`cache` (KV caches, rings, the fixed-shape switch), `conv`, `transformer`, `moshi_transformer`,
`conformer`, `quant` (quantized layers), `compiled` (steps compiled at fixed shapes),
`sampling` (choosing tokens), `boost` (phrase-boosting biases)."""

from .boost import bias as boost_bias
from .cache import (
                    RingBatch,
                    RingRow,
                    RingStep,
                    SlidingKVCache,
                    fixed_shapes,
                    ring_mask_kind,
                    stack_rows,
                    window_mask,
                    write_start,
)
from .compiled import CompiledStep
from .compiled import enabled as compile_enabled
from .conformer import ConformerLayer, rel_positions
from .conv import CausalConv1d, CausalConvTranspose1d, ConvCache, ConvTrCache, conv_transpose
from .moshi_transformer import (
                    RMSNorm,
                    Transformer,
                    TransformerConfig,
                    TransformerState,
                    remap_checkpoint,
)
from .quant import declared as quantization_declared
from .quant import dense_weight, param_name
from .sampling import chosen_logprob, greedy, greedy_transducer, sample
from .transformer import HF_BLOCK_NAMES, Attention, Block, FeedForward, KVCache, heads

__all__ = [
    "Attention", "Block", "CausalConv1d", "CausalConvTranspose1d", "CompiledStep",
    "ConformerLayer", "ConvCache", "ConvTrCache", "FeedForward", "HF_BLOCK_NAMES", "KVCache",
    "RMSNorm", "RingBatch", "RingRow", "RingStep", "SlidingKVCache", "Transformer",
    "TransformerConfig", "TransformerState", "boost_bias", "chosen_logprob", "compile_enabled",
    "conv_transpose", "dense_weight", "fixed_shapes", "greedy", "greedy_transducer", "heads",
    "param_name", "quantization_declared", "rel_positions", "remap_checkpoint",
    "ring_mask_kind", "sample", "stack_rows", "window_mask", "write_start",
]
