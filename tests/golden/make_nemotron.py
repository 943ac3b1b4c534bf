"""Write the Nemotron streaming ASR reference goldens with transformers (run once, commit).

Builds a tiny random NemotronAsrStreamingForRNNT (fp32, CPU) with the real model's
structure (causal dw_striding subsampling, rel-pos attention, chunked_limited
context, no encoder biases, blank = vocab size), saves it with `save_pretrained`
plus a tiny SentencePiece tokenizer, and records in `golden.npz`: the audio, the
feature extractor's mel, the encoder output and greedy tokens for every latency
mode (right context 13/6/1/0), offline and cache-aware streaming.

    pip install torch==2.13.0 transformers==5.23.0 sentencepiece
    python tests/golden/make_nemotron.py [OUT]   # default: beside this file
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import (
    NemotronAsrStreamingConfig,
    NemotronAsrStreamingFeatureExtractor,
    NemotronAsrStreamingForRNNT,
)

LEFT, RIGHTS, SECONDS, SEED = 14, (13, 6, 1, 0), 4.1, 0
VOCAB, MAX_SYMBOLS = 32, 4  # pieces; blank = VOCAB as in the real model (1024)
TEXT = ["the quick brown fox jumps over the lazy dog",
        "a stitch in time saves nine", "speech to text in real time",
        "hello world, how are you today?", "we stream audio and read tokens"]


def tiny_model() -> NemotronAsrStreamingForRNNT:
    torch.manual_seed(SEED)
    cfg = NemotronAsrStreamingConfig(
        encoder_config=dict(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            num_mel_bins=128, subsampling_conv_channels=8, conv_kernel_size=9,
            attention_bias=False, convolution_bias=False, scale_input=False,
            sliding_window=LEFT + 1, default_num_lookahead_tokens=RIGHTS[0], dropout=0.0,
            dropout_positions=0.0, layerdrop=0.0, activation_dropout=0.0,
            attention_dropout=0.0,
        ),
        vocab_size=VOCAB + 1, blank_token_id=VOCAB, decoder_hidden_size=24,
        num_decoder_layers=2, max_symbols_per_step=MAX_SYMBOLS,
    )
    cfg._attn_implementation = "sdpa"  # eager gives NaN with its -inf rel-pos mask
    model = NemotronAsrStreamingForRNNT(cfg).eval()
    with torch.no_grad():  # default init hides norm and bias bugs (ones and zeros)
        for name, p in model.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.normal_(1.0, 0.1)
            elif name.endswith("bias") or name.endswith(("bias_u", "bias_v")):
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.3 if p.dim() == 2 else 0.25)
        model.decoder.embedding.weight[VOCAB] = 0.0  # NeMo blank_as_pad: the blank row is zero
    model.generation_config.decoder_start_token_id = VOCAB
    model.generation_config.pad_token_id = VOCAB
    return model


@torch.no_grad()
def calibrate_joint(model, mel: torch.Tensor, mask: torch.Tensor) -> None:
    """Random encoders output nearly the same vector every frame: centre and scale the
    joint's encoder projection on this clip and lift the blank logit so that tokens
    vary and blanks, emissions and the max_symbols limit all occur."""
    enc = model.encoder(mel, attention_mask=mask, num_lookahead_tokens=RIGHTS[0])
    e = enc.last_hidden_state[0]
    w = model.encoder_projector.weight
    w /= ((e - e.mean(0)) @ w.T).std() / 3
    model.encoder_projector.bias.copy_(-(e @ w.T).mean(0))
    logits = model(input_features=mel, attention_mask=mask, num_lookahead_tokens=RIGHTS[0],
                   decoder_input_ids=torch.tensor([[VOCAB]])).logits[0]
    margin = logits[:, :VOCAB].max(-1).values - logits[:, VOCAB]
    model.joint.head.bias[VOCAB] += margin.quantile(0.4)


def write_tokenizer(out: Path) -> None:
    """A 32-piece SentencePiece BPE model (tokenizer.model, a few KB)."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT * 20), model_writer=buf, vocab_size=VOCAB,
        model_type="bpe", character_coverage=1.0, byte_fallback=False,
        bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1, hard_vocab_limit=False,
        normalization_rule_name="identity",
    )
    (out / "tokenizer.model").write_bytes(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    assert sp.get_piece_size() == VOCAB, sp.get_piece_size()


def test_audio() -> np.ndarray:
    rng = np.random.default_rng(SEED)
    n = int(16000 * SECONDS) + 37  # not a multiple of the hop or of 80 ms
    t = np.arange(n) / 16000
    f = 220 + 120 * np.sin(2 * np.pi * 0.9 * t)
    x = 0.3 * np.sin(2 * np.pi * np.cumsum(f) / 16000) * (0.6 + 0.4 * np.sin(2 * np.pi * 1.7 * t))
    return (x + 0.03 * rng.standard_normal(n)).astype(np.float32)


def stream_encoder(model, mel: torch.Tensor, r: int) -> torch.Tensor:
    """transformers' cache-aware encoder over chunks of 1 + 8r, then 8(r + 1) mel frames."""
    pkv = pc = None
    outs, i, size = [], 0, 1 + 8 * r
    while i + size <= mel.shape[1]:
        o = model.encoder(mel[:, i: i + size], past_key_values=pkv, padding_cache=pc,
                          use_cache=True, num_lookahead_tokens=r)
        pkv, pc = o.past_key_values, o.padding_cache
        outs.append(o.last_hidden_state)
        i, size = i + size, 8 * (r + 1)
    return torch.cat(outs, dim=1)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "nemotron"
    out.mkdir(parents=True, exist_ok=True)
    model = tiny_model()
    audio = test_audio()
    fe = NemotronAsrStreamingFeatureExtractor(feature_size=128)
    feats = fe(audio, sampling_rate=16000, return_tensors="pt")
    mel, mask = feats.input_features, feats.attention_mask
    calibrate_joint(model, mel, mask)
    model.save_pretrained(str(out))
    (out / "generation_config.json").unlink(missing_ok=True)
    write_tokenizer(out)
    n_valid = int(mask.sum())
    assert n_valid == len(audio) // 160 and mel.shape[1] == n_valid + 1
    g = dict(audio=audio, mel=mel[0, :n_valid].numpy())
    with torch.no_grad():
        for r in RIGHTS:
            enc = model.encoder(mel, attention_mask=mask, num_lookahead_tokens=r)
            n = int(enc.attention_mask.sum())
            g[f"encoder_r{r}"] = enc.last_hidden_state[0, :n].numpy()
            # the valid frames do not depend on the padded mel frame
            alone = model.encoder(mel[:, :n_valid], num_lookahead_tokens=r).last_hidden_state
            assert torch.allclose(alone[0], enc.last_hidden_state[0, :n], atol=1e-5)
            st = stream_encoder(model, mel[:, :n_valid], r)[0]
            assert torch.allclose(st, enc.last_hidden_state[0, : len(st)], atol=1e-4)
            g[f"stream_encoder_r{r}"] = st.numpy()
            seq = model.generate(input_features=mel, attention_mask=mask,
                                 num_lookahead_tokens=r, max_new_tokens=2000).sequences[0].tolist()
            g[f"tokens_r{r}"] = np.array([t for t in seq if t != VOCAB], np.int32)
            print(f"r={r}: {n} frames, {len(g[f'tokens_r{r}'])} tokens")
    np.savez_compressed(out / "golden.npz", **g)
    cfg = json.loads((out / "config.json").read_text())
    print("wrote", out, "model_type", cfg["model_type"])


if __name__ == "__main__":
    main()
