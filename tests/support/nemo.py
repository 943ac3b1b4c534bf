"""A tiny `.nemo` archive (NeMo's tar: yaml config, torch state dict, SentencePiece model)
made from the tiny transformers-layout Nemotron: the `nemo_file` fixture of
tests/models/nemotron_streaming/test_nemotron_nemo.py and tests/convert/test_convert_model.py
(needs torch and yaml)."""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parents[1] / "golden" / "nemotron"

_TO_NEMO = [  # transformers -> NeMo, the inverse of the loader's table
    (r"^encoder\.subsampling\.conv_in\.", "encoder.pre_encode.conv.0."),
    (r"^encoder\.subsampling\.layers\.0\.depthwise_conv\.", "encoder.pre_encode.conv.2."),
    (r"^encoder\.subsampling\.layers\.0\.pointwise_conv\.", "encoder.pre_encode.conv.3."),
    (r"^encoder\.subsampling\.layers\.1\.depthwise_conv\.", "encoder.pre_encode.conv.5."),
    (r"^encoder\.subsampling\.layers\.1\.pointwise_conv\.", "encoder.pre_encode.conv.6."),
    (r"^encoder\.subsampling\.linear\.", "encoder.pre_encode.out."),
    (r"\.conv\.norm\.", ".conv.batch_norm."),
    (r"\.self_attn\.q_proj\.", ".self_attn.linear_q."),
    (r"\.self_attn\.k_proj\.", ".self_attn.linear_k."),
    (r"\.self_attn\.v_proj\.", ".self_attn.linear_v."),
    (r"\.self_attn\.o_proj\.", ".self_attn.linear_out."),
    (r"\.self_attn\.relative_k_proj\.", ".self_attn.linear_pos."),
    (r"\.self_attn\.bias_u$", ".self_attn.pos_bias_u"),
    (r"\.self_attn\.bias_v$", ".self_attn.pos_bias_v"),
    (r"^decoder\.embedding\.", "decoder.prediction.embed."),
    (r"^decoder\.lstm\.", "decoder.prediction.dec_rnn.lstm."),
    (r"^encoder_projector\.", "joint.enc."),
    (r"^decoder\.decoder_projector\.", "joint.pred."),
    (r"^joint\.head\.", "joint.joint_net.2."),
]


def _nemo_key(k: str) -> str:
    for pat, rep in _TO_NEMO:
        k = re.sub(pat, rep, k)
    return k


def nemo_config(hf: dict) -> dict:
    e = hf["encoder_config"]
    left = e["sliding_window"] - 1
    return {
        "preprocessor": {"features": 128, "n_fft": 512, "window_size": 0.025},
        "encoder": {
            "feat_in": e["num_mel_bins"], "n_layers": e["num_hidden_layers"],
            "d_model": e["hidden_size"], "n_heads": e["num_attention_heads"],
            "ff_expansion_factor": e["intermediate_size"] // e["hidden_size"],
            "subsampling": "dw_striding", "subsampling_factor": 8,
            "subsampling_conv_channels": e["subsampling_conv_channels"],
            "causal_downsampling": True, "conv_kernel_size": 9,
            "conv_norm_type": "layer_norm", "conv_context_size": "causal",
            "att_context_size": [[left, 13], [left, 6], [left, 1], [left, 0]],
            "att_context_style": "chunked_limited", "xscaling": False, "use_bias": False,
            "self_attention_model": "rel_pos", "pos_emb_max_len": 5000,
        },
        "decoder": {"vocab_size": hf["blank_token_id"],
                    "prednet": {"pred_hidden": hf["decoder_hidden_size"], "pred_rnn_layers": 2}},
        "joint": {"num_classes": hf["blank_token_id"],
                  "jointnet": {"joint_hidden": hf["decoder_hidden_size"]}},
        "decoding": {"greedy": {"max_symbols": hf["max_symbols_per_step"]}},
    }


@pytest.fixture(scope="module")
def nemo_file(tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    yaml = pytest.importorskip("yaml")
    from safetensors.torch import load_file

    sd = {_nemo_key(k): v for k, v in load_file(GOLDEN / "model.safetensors").items()}
    sd["preprocessor.featurizer.window"] = torch.hann_window(400, periodic=False)
    sd["preprocessor.featurizer.fb"] = torch.zeros(1, 128, 257)
    sd["encoder.layers.0.conv.depthwise_conv.weight"] = (  # a non-contiguous tensor
        sd["encoder.layers.0.conv.depthwise_conv.weight"].permute(2, 1, 0).contiguous()
        .permute(2, 1, 0))
    buf = io.BytesIO()
    torch.save(sd, buf)
    hf = json.loads((GOLDEN / "config.json").read_text())
    files = {"./model_config.yaml": yaml.safe_dump(nemo_config(hf)).encode(),
             "./model_weights.ckpt": buf.getvalue(),
             "./0123456789abcdef0123456789abcdef_tokenizer.model":
                 (GOLDEN / "tokenizer.model").read_bytes()}
    path = tmp_path_factory.mktemp("nemo") / "tiny.nemo"
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def transformers_features(tr, n_mels: int):
    """transformers' Nemotron feature extractor; a skip where that transformers release needs
    a package it lacks to build one (some need librosa)."""
    try:
        return tr.NemotronAsrStreamingFeatureExtractor(feature_size=n_mels)
    except ImportError as e:
        why = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        pytest.skip(f"transformers' NemotronAsrStreamingFeatureExtractor: {why.strip()}")
