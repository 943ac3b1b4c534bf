"""Write the Voxtral Realtime reference goldens with transformers (run once, commit).

Builds a tiny random VoxtralRealtimeForConditionalGeneration (fp32, CPU), saves it
in both layouts (transformers `hf/`, Mistral-native `mistral/` with interleaved
q/k rows) and records the reference's mel, conv stem, encoder, adapter, greedy
tokens and per-step logits in `golden.npz`.

    pip install torch==2.13.0 transformers==5.23.0
    python tests/golden/make_voxtral_realtime.py [OUT]   # default: beside this file
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import (
    VoxtralRealtimeConfig,
    VoxtralRealtimeFeatureExtractor,
    VoxtralRealtimeForConditionalGeneration,
)

LEFT, DELAY, TOK = 32, 6, 1280
ENC_WINDOW, DEC_WINDOW, SECONDS, SEED = 20, 30, 2.3, 0


def tiny_model() -> VoxtralRealtimeForConditionalGeneration:
    torch.manual_seed(SEED)
    rope = {"rope_type": "default", "rope_theta": 1e6}  # the encoder default is 1e4
    cfg = VoxtralRealtimeConfig(
        audio_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, head_dim=8, num_mel_bins=128,
                          sliding_window=ENC_WINDOW, rms_norm_eps=1e-5,
                          rope_parameters=rope),
        text_config=dict(vocab_size=1100, hidden_size=48, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=12,
                         sliding_window=DEC_WINDOW, rms_norm_eps=1e-5,
                         rope_parameters=rope, tie_word_embeddings=True),
        default_num_delay_tokens=DELAY,
    )
    cfg._attn_implementation = "eager"
    model = VoxtralRealtimeForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # default init hides norm and bias bugs (ones and zeros)
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.normal_(1.0, 0.1)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.3 if p.dim() == 2 else 0.2)
    return model


def interleave(w: torch.Tensor, heads: int) -> torch.Tensor:
    d = w.shape[0]
    return w.reshape(heads, 2, d // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def save_mistral(model, out: Path) -> None:
    a, t = model.config.audio_config, model.config.text_config
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    mm = "mm_streams_embeddings.embedding_module."
    enc = mm + "whisper_encoder."
    M = {}
    for i, n in ((0, "conv1"), (1, "conv2")):
        for s in ("weight", "bias"):
            M[f"{enc}conv_layers.{i}.conv.{s}"] = sd[f"model.audio_tower.embedder.{n}.{s}"]
    names = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    for i in range(a.num_hidden_layers):
        s, d = f"model.audio_tower.layers.{i}.", f"{enc}transformer.layers.{i}."
        h = a.num_attention_heads
        M[d + "attention.wq.weight"] = interleave(sd[s + "self_attn.q_proj.weight"], h)
        M[d + "attention.wq.bias"] = interleave(sd[s + "self_attn.q_proj.bias"], h)
        M[d + "attention.wk.weight"] = interleave(sd[s + "self_attn.k_proj.weight"], h)
        for x in ("v", "o"):
            for p in ("weight", "bias"):
                M[d + f"attention.w{x}.{p}"] = sd[s + f"self_attn.{x}_proj.{p}"]
        M[d + "attention_norm.weight"] = sd[s + "self_attn_layer_norm.weight"]
        M[d + "ffn_norm.weight"] = sd[s + "final_layer_norm.weight"]
        for hf, ms in names.items():
            M[d + f"feed_forward.{ms}.weight"] = sd[s + f"mlp.{hf}.weight"]
        M[d + "feed_forward.w2.bias"] = sd[s + "mlp.down_proj.bias"]
    M[enc + "transformer.norm.weight"] = sd["model.audio_tower.norm.weight"]
    M[mm + "audio_language_projection.0.weight"] = sd["model.multi_modal_projector.linear_1.weight"]
    M[mm + "audio_language_projection.2.weight"] = sd["model.multi_modal_projector.linear_2.weight"]
    M[mm + "tok_embeddings.weight"] = sd["model.language_model.embed_tokens.weight"]
    M["norm.weight"] = sd["model.language_model.norm.weight"]
    for i in range(t.num_hidden_layers):
        s, d = f"model.language_model.layers.{i}.", f"layers.{i}."
        M[d + "attention.wq.weight"] = interleave(sd[s + "self_attn.q_proj.weight"],
                                                  t.num_attention_heads)
        M[d + "attention.wk.weight"] = interleave(sd[s + "self_attn.k_proj.weight"],
                                                  t.num_key_value_heads)
        M[d + "attention.wv.weight"] = sd[s + "self_attn.v_proj.weight"]
        M[d + "attention.wo.weight"] = sd[s + "self_attn.o_proj.weight"]
        M[d + "attention_norm.weight"] = sd[s + "input_layernorm.weight"]
        M[d + "ffn_norm.weight"] = sd[s + "post_attention_layernorm.weight"]
        for hf, ms in names.items():
            M[d + f"feed_forward.{ms}.weight"] = sd[s + f"mlp.{hf}.weight"]
        M[d + "ada_rms_norm_t_cond.0.weight"] = sd[s + "ada_rms_norm.linear1.weight"]
        M[d + "ada_rms_norm_t_cond.2.weight"] = sd[s + "ada_rms_norm.linear2.weight"]
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in M.items()}, str(out / "consolidated.safetensors"))
    audio_args = dict(sampling_rate=16000, frame_rate=12.5, num_mel_bins=128, hop_length=160,
                      window_size=400, global_log_mel_max=1.5,
                      transcription_format="streaming")
    params = dict(
        dim=t.hidden_size, n_layers=t.num_hidden_layers, head_dim=t.head_dim,
        hidden_dim=t.intermediate_size, n_heads=t.num_attention_heads,
        n_kv_heads=t.num_key_value_heads, use_biases=False, causal=True, rope_theta=1e6,
        norm_eps=1e-5, vocab_size=t.vocab_size, tied_embeddings=True,
        sliding_window=t.sliding_window, model_max_length=131072,
        ada_rms_norm_t_cond=True, ada_rms_norm_t_cond_dim=32,
        multimodal=dict(whisper_model_args=dict(
            encoder_args=dict(
                audio_encoding_args=audio_args, dim=a.hidden_size,
                n_layers=a.num_hidden_layers, head_dim=a.head_dim,
                hidden_dim=a.intermediate_size, n_heads=a.num_attention_heads,
                n_kv_heads=a.num_attention_heads, use_biases=True, rope_theta=1e6,
                causal=True, norm_eps=1e-5, sliding_window=a.sliding_window),
            downsample_args=dict(downsample_factor=4))),
    )
    (out / "params.json").write_text(json.dumps(params, indent=2))


def test_audio() -> np.ndarray:
    rng = np.random.default_rng(SEED)
    t = np.arange(int(16000 * SECONDS)) / 16000
    x = 0.3 * np.sin(2 * np.pi * 300 * t) * np.sin(2 * np.pi * 1.3 * t)
    return (x + 0.05 * rng.standard_normal(len(t))).astype(np.float32)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "voxtral_realtime"
    model = tiny_model()
    model.save_pretrained(str(out / "hf"))
    for extra in ("generation_config.json",):
        (out / "hf" / extra).unlink(missing_ok=True)
    save_mistral(model, out / "mistral")
    audio = test_audio()
    align = (TOK - len(audio) % TOK) % TOK
    padded = np.concatenate([np.zeros(LEFT * TOK, np.float32), audio,
                             np.zeros(align + (DELAY + 11) * TOK, np.float32)])
    mel = VoxtralRealtimeFeatureExtractor()(padded, sampling_rate=16000,
                                            return_tensors="pt").input_features
    prompt = torch.tensor([[1] + [32] * (LEFT + DELAY)])
    with torch.no_grad():
        tower = model.model.audio_tower
        conv = tower.embedder(mel)
        enc = tower(input_features=mel).last_hidden_state
        adapter = model.model.get_audio_features(input_features=mel).pooler_output
        gen = model.generate(input_ids=prompt, input_features=mel, num_delay_tokens=DELAY,
                             do_sample=False, output_scores=True,
                             return_dict_in_generate=True, max_length=mel.shape[-1] // 8)
    np.savez_compressed(
        out / "golden.npz", audio=audio, mel=mel[0].numpy().T, conv=conv[0].numpy(),
        encoder=enc[0].numpy(), adapter=adapter[0].numpy(), prompt=prompt[0].numpy(),
        tokens=gen.sequences[0, prompt.shape[1]:].numpy(),
        logits=torch.stack(gen.scores)[:, 0].numpy(),
    )
    print("wrote", out, "tokens", gen.sequences[0, prompt.shape[1]:].tolist())


if __name__ == "__main__":
    main()
