"""Write the streaming Sortformer reference goldens with NeMo 3.0 (run once, commit).

Builds a tiny random `SortformerEncLabelModel` (fp32, CPU) with the released model's structure
(dw_striding x8 non-causal subsampling, full-context rel-pos FastConformer with batch-norm conv
modules, encoder projection, post-LN transformer encoder, sigmoid speaker heads, the streaming
speaker cache / FIFO of `diar_streaming_sortformer_4spk-v2.1` scaled down so a 10 s clip
compresses the cache many times), saves it as a real `.nemo` archive with `save_to`, and records
in `golden.npz`, for tests/data/voices_3spk.wav (three espeak-ng voices, with an overlap):
the mel, NeMo's offline forward (`streaming_mode=False`: peak-normalised audio, one full-context
pass) and NeMo's own streaming loop (`streaming_mode=True`: `forward_streaming`, synchronous
`streaming_update`), plus both of them for the clip's first 6.4 s (a second, shorter stream).

    pip install torch==2.13.0 "nemo-toolkit[asr]==3.0.0"
    python tests/golden/make_sortformer.py [OUT]   # default: beside this file
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from omegaconf import OmegaConf

HERE = Path(__file__).parent
AUDIO = HERE.parent / "data" / "voices_3spk.wav"
SEED = 0
HEAD_GAIN, HEAD_BIAS = 3.0, [0.5, -0.5, 0.0, -1.5]
STREAMING = dict(spkcache_len=24, fifo_len=16, chunk_len=6, spkcache_update_period=10,
                 chunk_left_context=1, chunk_right_context=3, spkcache_sil_frames_per_spk=3)


def config() -> dict:
    d, tf = 32, 16
    return {
        "sample_rate": 16000, "max_num_of_spks": 4, "streaming_mode": True,
        "pil_weight": 0.5, "ats_weight": 0.5,
        "model_defaults": {"fc_d_model": d, "tf_d_model": tf},
        "preprocessor": {
            "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
            "normalize": "NA", "window_size": 0.025, "sample_rate": 16000,
            "window_stride": 0.01, "window": "hann", "features": 128, "n_fft": 512,
            "frame_splicing": 1, "dither": 0.00001, "pad_to": 0,
        },
        "sortformer_modules": {
            "_target_": "nemo.collections.asr.modules.sortformer_modules.SortformerModules",
            "num_spks": 4, "dropout_rate": 0.5, "fc_d_model": d, "tf_d_model": tf,
            "subsampling_factor": 8, **STREAMING,
            "scores_add_rnd": 0, "pred_score_threshold": 0.25, "max_index": 99999,
            "scores_boost_latest": 0.05, "sil_threshold": 0.2, "strong_boost_rate": 0.75,
            "weak_boost_rate": 1.5, "min_pos_scores_rate": 0.5,
        },
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder",
            "feat_in": 128, "feat_out": -1, "n_layers": 2, "d_model": d,
            "subsampling": "dw_striding", "subsampling_factor": 8,
            "subsampling_conv_channels": 8, "causal_downsampling": False,
            "ff_expansion_factor": 2, "self_attention_model": "rel_pos", "n_heads": 4,
            "att_context_size": [-1, -1], "att_context_style": "regular", "xscaling": True,
            "untie_biases": True, "pos_emb_max_len": 5000, "conv_kernel_size": 9,
            "conv_norm_type": "batch_norm", "conv_context_size": None, "dropout": 0.0,
            "dropout_pre_encoder": 0.0, "dropout_emb": 0.0, "dropout_att": 0.0,
        },
        "transformer_encoder": {
            "_target_": "nemo.collections.asr.modules.transformer.transformer_encoders."
                        "TransformerEncoder",
            "num_layers": 2, "hidden_size": tf, "inner_size": 32, "num_attention_heads": 2,
            "attn_score_dropout": 0.0, "attn_layer_dropout": 0.0, "ffn_dropout": 0.0,
            "hidden_act": "relu", "pre_ln": False, "pre_ln_final_layer_norm": True,
        },
        "loss": {"_target_": "nemo.collections.asr.losses.bce_loss.BCELoss",
                 "weight": None, "reduction": "mean"},
    }


def build():
    from nemo.collections.asr.models import SortformerEncLabelModel

    torch.manual_seed(SEED)
    model = SortformerEncLabelModel(cfg=OmegaConf.create(config())).eval()
    with torch.no_grad():  # default init hides norm, bias and batch-norm statistics bugs
        for name, p in model.named_parameters():
            if name.startswith("preprocessor."):
                continue
            if "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.1)
            elif name.endswith("bias") or name.endswith(("pos_bias_u", "pos_bias_v")):
                p.normal_(0.0, 0.1)
            else:
                fan_in = p.shape[1] * (p[0, 0].numel() if p.dim() > 2 else 1) if p.dim() > 1 \
                    else p.shape[0]
                p.normal_(0.0, 1.5 / fan_in**0.5)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.normal_(0.0, 0.2)
            elif name.endswith("running_var"):
                b.uniform_(0.5, 1.5)
        # speakers with distinct biases, so some frames are above 0.5 and some below
    return model


def calibrate(model, wav: np.ndarray) -> None:
    """Random heads see nearly the same hidden state in every frame; centre and scale each
    speaker's logit over the clip so its activity follows the audio (some frames above 0.5,
    some below), as a trained model's would."""
    heads = model.sortformer_modules.single_hidden_to_spks
    seen = []
    hook = heads.register_forward_hook(lambda m, i, o: seen.append(i[0][0]))
    run(model, wav, False)
    hook.remove()
    h = seen[0]
    with torch.no_grad():
        logits = h @ heads.weight.T
        scale = HEAD_GAIN / logits.std(0)
        heads.weight.mul_(scale[:, None])
        heads.bias.copy_(-logits.mean(0) * scale + torch.tensor(HEAD_BIAS))


def run(model, wav: np.ndarray, streaming: bool) -> np.ndarray:
    model.streaming_mode = streaming
    x = torch.from_numpy(wav)[None]
    with torch.no_grad():
        preds = model.forward(audio_signal=x, audio_signal_length=torch.tensor([x.shape[1]]))
    return preds[0].numpy().astype(np.float32)


def nemo_segments(preds: np.ndarray) -> np.ndarray:
    """(n, 3) [speaker, start, end]: NeMo's diarize() post-processing with its defaults."""
    from nemo.collections.asr.parts.utils.vad_utils import (
        PostProcessingParams,
        ts_vad_post_processing,
    )

    params = OmegaConf.structured(PostProcessingParams())
    rows = []
    for spk in range(preds.shape[1]):
        ts = ts_vad_post_processing(torch.from_numpy(preds[:, spk]), params, 8, False)
        rows += [[spk, round(a, 2), round(b, 2)] for a, b in ts.tolist()]
    return np.array(sorted(rows, key=lambda r: (r[1], r[0])), np.float64).reshape(-1, 3)


def main() -> None:
    logging.getLogger("nemo_logger").setLevel(logging.ERROR)
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "sortformer"
    out.mkdir(parents=True, exist_ok=True)
    model = build()
    wav, sr = sf.read(AUDIO, dtype="float32")
    assert sr == 16000
    calibrate(model, wav)
    with torch.no_grad():
        x = torch.from_numpy(wav)[None]
        mel, mel_len = model.preprocessor(input_signal=x, length=torch.tensor([x.shape[1]]))
    with torch.no_grad():  # the offline network on the (unnormalised) mel itself
        emb, emb_len = model.frontend_encoder(processed_signal=mel, processed_signal_length=mel_len)
        offline_mel = model.forward_infer(emb, emb_len)[0, : emb_len[0]].numpy()
    short = wav[: int(6.4 * sr)]
    res = {
        "audio": wav, "mel": mel[0, :, : mel_len[0]].T.numpy(), "offline_mel": offline_mel,
        "offline": run(model, wav, False), "streaming": run(model, wav, True),
        "short_streaming": run(model, short, True),
    }
    for k in ("offline", "streaming"):
        res[f"{k}_segments"] = nemo_segments(res[k])
    for k in ("offline", "streaming"):
        p = res[k]
        print(k, p.shape, "mean", p.mean(0).round(3), "frac>0.5", (p > 0.5).mean(0).round(2))
        print("".join(str(int(r.argmax()) if r.max() > 0.5 else ".") for r in p))
    model.streaming_mode = True
    model.save_to(str(out / "tiny.nemo"))
    np.savez_compressed(out / "golden.npz", **{k: v for k, v in res.items() if k != "audio"})
    print("wrote", sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    main()
