"""A Nemotron `.nemo` archive (read by `models/nemo/checkpoint.py`) as the transformers layout:
its model_config.yaml as a `nemotron_asr_streaming` config.json, its keys renamed, so the rest of
the loader is the HF path (`mlx_speech.convert.nemo` exports that folder).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from ...errors import CheckpointError
from ..nemo.checkpoint import read_archive
from .weights import hf_name


def read_nemo(path: str | Path, weights: bool = True) -> tuple[dict, dict[str, mx.array], bytes]:
    """(model_config, transformers-named weights ({} if not `weights`), tokenizer.model bytes)."""
    config, sd, tok = read_archive(path, weights)
    out = {}
    for k, v in sd.items():
        name = hf_name(k)
        if name is not None:
            out[name] = v
    return config, out, tok


def hf_config(nemo: dict) -> dict:
    """NeMo model_config.yaml -> a transformers `nemotron_asr_streaming` config.json."""
    e = nemo.get("encoder") or {}
    want = {"subsampling": "dw_striding", "causal_downsampling": True,
            "att_context_style": "chunked_limited", "conv_norm_type": "layer_norm",
            "conv_context_size": "causal", "self_attention_model": "rel_pos"}
    for k, v in want.items():
        if k in e and e[k] != v:
            raise CheckpointError(f"unsupported NeMo encoder setting {k}={e[k]!r} (need {v!r})")
    ctx = e.get("att_context_size") or [[70, 13]]
    if not isinstance(ctx[0], (list, tuple)):
        ctx = [ctx]
    d = e.get("d_model", 1024)
    ch = e.get("subsampling_conv_channels", -1)
    dec = nemo.get("decoder") or {}
    pred = dec.get("prednet") or {}
    joint = (nemo.get("joint") or {}).get("jointnet") or {}
    pred_hidden = pred.get("pred_hidden", 640)
    if joint.get("joint_hidden", pred_hidden) != pred_hidden:
        raise CheckpointError("joint_hidden != pred_hidden is not supported")
    n_vocab = dec.get("vocab_size") or len((nemo.get("joint") or {}).get("vocabulary", []))
    use_bias = e.get("use_bias", True)
    return {
        "model_type": "nemotron_asr_streaming",
        "vocab_size": n_vocab + 1, "blank_token_id": n_vocab,
        "decoder_hidden_size": pred_hidden, "num_decoder_layers": pred.get("pred_rnn_layers", 2),
        "max_symbols_per_step": ((nemo.get("decoding") or {}).get("greedy") or {}).get(
            "max_symbols", 10),
        "hidden_act": "relu",
        "encoder_config": {
            "hidden_size": d, "num_hidden_layers": e.get("n_layers", 24),
            "num_attention_heads": e.get("n_heads", 8),
            "intermediate_size": d * e.get("ff_expansion_factor", 4),
            "attention_bias": use_bias, "convolution_bias": use_bias,
            "conv_kernel_size": e.get("conv_kernel_size", 9),
            "subsampling_factor": e.get("subsampling_factor", 8),
            "subsampling_conv_channels": d if ch in (-1, None) else ch,
            "num_mel_bins": e.get("feat_in", 128),
            "scale_input": e.get("xscaling", True),
            "sliding_window": ctx[0][0] + 1, "default_num_lookahead_tokens": ctx[0][1],
            "max_position_embeddings": e.get("pos_emb_max_len", 5000),
            "hidden_act": "silu",
        },
        "supported_num_lookahead_tokens": [c[1] for c in ctx],
    }
