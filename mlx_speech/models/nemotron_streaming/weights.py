"""Every Nemotron checkpoint layout as ours (strict, torch-free).

Keys: NeMo names -> transformers names -> our parameters, which use the transformers names with
MLX conv layouts (1x1 convs as Linears); mlx-audio's NeMo-named MLX exports map directly
(`remap_nemo_mlx`: each LSTM layer an `nn.LSTM`, one bias, the sum of torch's two).
A `.nemo` archive (read by `models/nemo`'s `read_archive`) reads as the transformers layout: its
model_config.yaml as a `nemotron_asr_streaming` config.json, its keys renamed, so the rest of the
loader is the HF path (`mlx_speech.convert.nemo` exports that folder).
Other layouts' configs -> our config.json (the transformers keys: `nemotron_asr_streaming`, or
`nemotron3_5_asr` with the language prompt's, plus its `prompt_dictionary`): NeMo's
model_config.yaml, a transformers folder's processor_config.json (Nemotron 3.5's languages), and
mlx-audio's `nemotron_asr` config.json (NeMo sections flattened).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import mlx.core as mx

from ...errors import CheckpointError, MlxSpeechError
from ...nn import param_name
from ..loading import raise_missing
from ..nemo import CONFORMER_RENAMES, read_archive, renamed
from .config import AUTO, prompt_dictionary, release_prompts

_CONV2D = re.compile(r"^encoder\.subsampling\.(conv_in|layers\.\d+\.depthwise_conv)\.weight$")
_POINTWISE2D = re.compile(r"^encoder\.subsampling\.layers\.\d+\.pointwise_conv\.weight$")
_POINTWISE1D = re.compile(r"^encoder\.layers\.\d+\.conv\.pointwise_conv[12]\.weight$")
_DEPTHWISE1D = re.compile(r"^encoder\.layers\.\d+\.conv\.depthwise_conv\.weight$")
# transformers' first Nemotron 3.5 port kept NeMo's prompt_kernel.0/2 names
_PROMPT_KERNEL = re.compile(r"^prompt_kernel\.([02])\.")


def remap(weights: dict[str, mx.array], expected: set[str]) -> dict[str, mx.array]:
    """transformers tensors -> our parameters (same names, MLX conv layouts).

    Raises CheckpointError naming the first unknown or missing key.
    """
    out: dict[str, mx.array] = {}
    for key, w in weights.items():
        name = key[len("model."):] if key.startswith("model.") else key
        name = _PROMPT_KERNEL.sub(lambda m: f"prompt_projector.linear_{int(m[1]) // 2 + 1}.", name)
        if param_name(name) not in expected:
            raise CheckpointError(f"unexpected checkpoint key {key!r}")
        if _CONV2D.match(name):
            w = w.transpose(0, 2, 3, 1)  # torch (O, I, H, W) -> mlx (O, H, W, I)
        elif _POINTWISE2D.match(name) or _POINTWISE1D.match(name):
            w = w.reshape(w.shape[0], w.shape[1])  # 1x1 convs are Linears here
        elif _DEPTHWISE1D.match(name):
            w = w.swapaxes(1, 2)  # torch (O, I, K) -> mlx (O, K, I)
        out[name] = w
    raise_missing(expected, out)
    return out


_MLX_LSTM = re.compile(r"^decoder\.prediction\.dec_rnn\.lstm\.(\d+)\.(Wx|Wh|bias)$")


def is_nemo_mlx(keys) -> bool:
    """NeMo-named MLX weights (mlx-audio's nemotron_asr and parakeet-style exports)."""
    return any(k.startswith(("encoder.pre_encode.", "decoder.prediction.")) for k in keys)


def remap_nemo_mlx(weights: dict[str, mx.array], expected: set[str]) -> dict[str, mx.array]:
    """NeMo-named MLX tensors -> our parameters. Convs are already in MLX layouts (1x1 convs
    are squeezed to Linears), and each LSTM layer is one `nn.LSTM` (Wx, Wh and the sum of the
    two biases: it goes to bias_ih, bias_hh is zero). Quantized modules keep `.scales` /
    `.biases`. Raises CheckpointError naming the first unknown or missing key."""
    out: dict[str, mx.array] = {}
    for key, w in weights.items():
        if key.startswith("preprocessor."):  # mlx-audio's mel filterbank buffers
            continue
        if m := _MLX_LSTM.match(key):
            layer, part = m.group(1), m.group(2)
            if part == "bias":
                out[f"decoder.lstm.bias_ih_l{layer}"] = w
                out[f"decoder.lstm.bias_hh_l{layer}"] = mx.zeros_like(w)
                continue
            name = f"decoder.lstm.weight_{'ih' if part == 'Wx' else 'hh'}_l{layer}"
        else:
            name = hf_name(key)
        if name is None or param_name(name) not in expected:
            raise CheckpointError(f"unexpected checkpoint key {key!r}")
        if (_POINTWISE2D.match(name) or _POINTWISE1D.match(name)) and w.ndim > 2:
            w = w.reshape(w.shape[0], w.shape[-1])  # (O, 1[, 1], I) -> (O, I)
        out[name] = w
    raise_missing(expected, out)
    return out


# NeMo (.nemo state dict) -> transformers, after the HF converter's table
_RENAMES = [
    (r"^encoder\.pre_encode\.out\.", "encoder.subsampling.linear."),
    *CONFORMER_RENAMES,
    (r"^decoder\.prediction\.embed\.", "decoder.embedding."),
    (r"^decoder\.prediction\.dec_rnn\.lstm\.", "decoder.lstm."),
    (r"^joint\.enc\.", "encoder_projector."),
    (r"^joint\.pred\.", "decoder.decoder_projector."),
    (r"^joint\.joint_net\.[12]\.", "joint.head."),  # .1 when trained without dropout
    (r"^prompt_kernel\.0\.", "prompt_projector.linear_1."),  # Nemotron 3.5's language prompt
    (r"^prompt_kernel\.2\.", "prompt_projector.linear_2."),
]
_PRE_ENCODE = re.compile(r"^encoder\.pre_encode\.conv\.(\d+)\.(weight|bias)$")


def hf_name(key: str) -> str | None:
    """NeMo state-dict key -> transformers key (None: not a model weight)."""
    if key.startswith("preprocessor."):
        return None
    m = _PRE_ENCODE.match(key)
    if m:  # Sequential: conv 0, ReLU 1, then (depthwise, pointwise, ReLU) per stage
        n, leaf = int(m.group(1)), m.group(2)
        if n == 0:
            return f"encoder.subsampling.conv_in.{leaf}"
        i, kind = divmod(n - 2, 3)
        if kind == 2 or n < 2:
            raise CheckpointError(f"unexpected checkpoint key {key!r}")
        part = "depthwise_conv" if kind == 0 else "pointwise_conv"
        return f"encoder.subsampling.layers.{i}.{part}.{leaf}"
    return renamed(key, _RENAMES)


# -- the .nemo archive -------------------------------------------------------------------------

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


# -- other layouts' configs -> our config.json -------------------------------------------------

def nemo_prompt_config(nemo: dict) -> dict:
    """What a NeMo model_config.yaml adds to the transformers config of a prompted model
    (empty for the English seed model): the transformers keys plus the dictionary."""
    md = nemo.get("model_defaults") or {}
    if not md.get("prompt_dictionary"):
        return {}
    prompts = prompt_dictionary(md["prompt_dictionary"])
    hidden = md.get("enc_hidden") or (nemo.get("encoder") or {}).get("d_model", 1024)
    return {"model_type": "nemotron3_5_asr", "num_prompts": int(md.get("num_prompts", 128)),
            "prompt_intermediate_size": 2 * int(hidden),  # NeMo's prompt_kernel width
            "prompt_dictionary": prompts, "default_prompt_id": prompts.get(AUTO)}


def nemo_config_json(nemo: dict) -> dict:
    """NeMo model_config.yaml -> our config.json: the transformers keys (`nemotron3_5_asr` with
    the prompt's, or the seed's `nemotron_asr_streaming`) and the prompt dictionary."""
    return {**hf_config(nemo), **nemo_prompt_config(nemo)}


def with_folder_prompts(folder, config: dict) -> dict:
    """A transformers-layout Nemotron 3.5 config with its prompt dictionary: transformers keeps
    it in processor_config.json (the release's when that file is missing, as transformers
    does); our converted folders keep it in config.json."""
    if config.get("model_type") != "nemotron3_5_asr" or "prompt_dictionary" in config:
        return config
    proc, prompts = Path(folder) / "processor_config.json", None
    if proc.exists():
        try:
            prompts = json.loads(proc.read_text(encoding="utf-8")).get("prompt_dictionary")
        except (OSError, ValueError, AttributeError) as e:
            raise MlxSpeechError(f"cannot read {proc}: {e}") from None
    prompts = prompt_dictionary(prompts) if prompts else release_prompts()
    return {"num_prompts": 128, "default_prompt_id": prompts.get(AUTO), **config,
            "prompt_dictionary": prompts}


def mlx_audio_config_json(c: dict) -> dict:
    """mlx-audio's `nemotron_asr` config.json (its converter's: `encoder` as NeMo's, `prompt`,
    flattened `decoder` / `joint`, `max_symbols`, `default_language`) -> ours; the
    `quantization` it declares is kept."""
    try:
        enc, dec, joint = c["encoder"], c["decoder"], c["joint"]
        prompt = c.get("prompt") or {}
        nemo = {
            "encoder": enc,
            "decoder": {"vocab_size": dec["vocab_size"],
                        "prednet": {"pred_hidden": dec["pred_hidden"],
                                    "pred_rnn_layers": dec.get("pred_rnn_layers", 2)}},
            "joint": {"jointnet": {"joint_hidden": joint.get("joint_hidden",
                                                             dec["pred_hidden"])}},
            "decoding": {"greedy": {"max_symbols": c.get("max_symbols", 10)}},
        }
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"mlx-audio nemotron_asr config without {e}") from None
    if prompt.get("num_prompts") and prompt.get("prompt_dictionary"):
        nemo["model_defaults"] = {"num_prompts": prompt["num_prompts"],
                                  "enc_hidden": enc.get("d_model"),
                                  "prompt_dictionary": prompt["prompt_dictionary"]}
    out = nemo_config_json(nemo)
    if "prompt_dictionary" in out:
        out["prompt_intermediate_size"] = prompt.get("prompt_hidden",
                                                     out["prompt_intermediate_size"])
        default = c.get("default_language", AUTO)
        out["default_prompt_id"] = out["prompt_dictionary"].get(default,
                                                                out["default_prompt_id"])
    for key in ("quantization", "quantization_config"):
        if key in c:
            out[key] = c[key]
    return out
