"""Write the Nemotron 3.5 (multilingual, language-prompted) streaming ASR goldens with NeMo 3.0
(run once, commit).

Builds a tiny random NeMo `EncDecRNNTBPEModelWithPrompt` (fp32, CPU) with the real model's
structure: the cache-aware FastConformer of the seed family (causal dw_striding x8, rel-pos,
chunked_limited context with five latency modes, xscaling), RNN-T, and the language-ID prompt:
a one-hot of `num_prompts` (128) slots concatenated to the encoder output and projected back by
`prompt_kernel` (Linear, ReLU, Linear) before the joint. Its SentencePiece model holds the
language tags (`<en-US>` ...) as pieces, as the release does; `model_defaults.prompt_dictionary`
maps locales, bare codes and `auto` to prompt slots. Random weights decode degenerate runs, so
the prompt kernel, predictor and joint are first taught (a few hundred Adam steps on a fixed
alignment, the encoder left random) to read a short script per prompt: `auto` reads German and
ends with `<de-DE>`; one frame holds max_symbols tokens.

Writes, beside this file in `nemotron35/`:
- `tiny.nemo`: NeMo's own `save_to` archive (gzip-repacked: NeMo restores it as it is).
- `hf/`: the transformers layout (`Nemotron3_5AsrForRNNT.save_pretrained` + the processor:
  config.json, model.safetensors, tokenizer.json, processor_config.json); transformers' tokens
  are checked against NeMo's before anything is written.
- `golden.npz`: the audio (int16), and for every prompt tried (three locales, a bare code and
  `auto`) and every latency mode (right context 13/6/3/1/0): NeMo's greedy tokens offline and
  through NeMo's own cache-aware streaming (`conformer_stream_step` with the inference prompt).
- `mel.npz`: NeMo's mel of the audio; `logits.npz`: the joint's logits along NeMo's greedy path
  from that mel (one row per joint call), for every prompt at the modes with right context 13
  and 0.

    python3 -m venv /work/nemo-venv && /work/nemo-venv/bin/pip install torch==2.13.0 && \
        /work/nemo-venv/bin/pip install "nemo-toolkit[asr]==3.0.0"   # brings transformers 5.24
    /work/nemo-venv/bin/python tests/golden/make_nemotron35.py [OUT]
"""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import torch

LEFT, RIGHTS, SEED = 28, (13, 6, 3, 1, 0), 0
# 441 mel frames: the chunks of NeMo's streaming buffer tile them exactly in every mode (1 + 8r,
# then 8(r + 1) frames), so NeMo's streamed tokens are its offline tokens
N_SAMPLES = 441 * 160 + 37
N_MELS, D_MODEL, PRED = 64, 32, 24
VOCAB, MAX_SYMBOLS, NUM_PROMPTS = 64, 4, 128
TAGS = ["<en-US>", "<de-DE>", "<fr-FR>", "<es-ES>"]
PROMPTS = {"en-US": 0, "en": 0, "es-ES": 2, "es": 2, "fr-FR": 8, "fr": 8, "de-DE": 9, "de": 9,
           "auto": 101}  # slots as the release numbers them
TRIED = ("en-US", "de-DE", "fr-FR", "es", "auto")
LOGIT_MODES = (13, 0)
TEXT = ["The quick brown fox jumps over the lazy dog.", "Guten Morgen, wie geht es dir?",
        "Bonjour, comment ça va?", "Hola, ¿qué tal?", "We stream audio and read tokens."]


def write_tokenizer(d: Path) -> None:
    """A 64-piece SentencePiece BPE model with the language tags as pieces, and the vocab.txt
    NeMo's BPE tokenizer setup registers."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXT * 20), model_writer=buf, vocab_size=VOCAB,
        model_type="bpe", character_coverage=1.0, byte_fallback=False, bos_id=-1, eos_id=-1,
        unk_id=0, pad_id=-1, hard_vocab_limit=False, user_defined_symbols=TAGS,
        normalization_rule_name="identity",
    )
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.model").write_bytes(buf.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
    assert sp.get_piece_size() == VOCAB, sp.get_piece_size()
    (d / "vocab.txt").write_text("".join(sp.id_to_piece(i) + "\n" for i in range(VOCAB)))


def nemo_config(tokdir: Path) -> dict:
    drop = 0.1  # as trained: dropout modules exist (the joint's Linear is joint_net.2), eval()
    return {
        "sample_rate": 16000,
        "tokenizer": {"dir": str(tokdir), "type": "bpe"},
        "preprocessor": {
            "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
            "sample_rate": 16000, "normalize": "NA", "window_size": 0.025,
            "window_stride": 0.01, "window": "hann", "features": N_MELS, "n_fft": 512,
            "log": True, "frame_splicing": 1, "dither": 0.0, "pad_to": 0, "pad_value": 0.0},
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder", "feat_in": N_MELS,
            "feat_out": -1, "n_layers": 2, "d_model": D_MODEL, "subsampling": "dw_striding",
            "subsampling_factor": 8, "subsampling_conv_channels": 8,
            "causal_downsampling": True, "ff_expansion_factor": 2,
            "self_attention_model": "rel_pos", "n_heads": 4,
            "att_context_size": [[LEFT, r] for r in RIGHTS], "att_context_probs": None,
            "att_context_style": "chunked_limited", "xscaling": True, "untie_biases": True,
            "pos_emb_max_len": 5000, "conv_kernel_size": 9, "conv_norm_type": "layer_norm",
            "conv_context_size": "causal", "use_bias": False, "dropout": drop,
            "dropout_pre_encoder": drop, "dropout_emb": 0.0, "dropout_att": drop},
        "decoder": {
            "_target_": "nemo.collections.asr.modules.RNNTDecoder", "normalization_mode": None,
            "random_state_sampling": False, "blank_as_pad": True,
            "prednet": {"pred_hidden": PRED, "pred_rnn_layers": 2, "t_max": None,
                        "dropout": drop}},
        "joint": {
            "_target_": "nemo.collections.asr.modules.RNNTJoint", "log_softmax": None,
            "preserve_memory": False, "fuse_loss_wer": False, "fused_batch_size": -1,
            "jointnet": {"joint_hidden": PRED, "activation": "relu", "dropout": drop}},
        "decoding": {"strategy": "greedy", "greedy": {"max_symbols": MAX_SYMBOLS}},
        "loss": {"loss_name": "default"},
        "model_defaults": {
            "enc_hidden": D_MODEL, "pred_hidden": PRED, "joint_hidden": PRED,
            "num_prompts": NUM_PROMPTS, "initialize_prompt_feature": True,
            "prompt_dictionary": dict(PROMPTS)},
    }


def tiny_model(tokdir: Path):
    from nemo.collections.asr.models import EncDecRNNTBPEModelWithPrompt
    from omegaconf import OmegaConf

    torch.manual_seed(SEED)
    m = EncDecRNNTBPEModelWithPrompt(OmegaConf.create(nemo_config(tokdir))).eval()
    with torch.no_grad():  # default init hides norm and bias bugs (ones and zeros)
        for name, p in m.named_parameters():
            if "norm" in name and p.dim() == 1:
                p.normal_(1.0, 0.1)
            elif name.endswith(("bias", "pos_bias_u", "pos_bias_v")) or "bias_" in name:
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.3 if p.dim() == 2 else 0.25)
        m.decoder.prediction.embed.weight[VOCAB] = 0.0  # blank_as_pad: the blank row is zero
    return m


def test_audio() -> np.ndarray:
    """A gliding tone with noise, int16-exact (the golden stores it as int16)."""
    rng = np.random.default_rng(SEED)
    n = N_SAMPLES  # not a multiple of the hop or of 80 ms
    t = np.arange(n) / 16000
    f = 220 + 160 * np.sin(2 * np.pi * 0.7 * t) + 300 * (t > t[-1] / 2)
    x = 0.3 * np.sin(2 * np.pi * np.cumsum(f) / 16000) * (0.6 + 0.4 * np.sin(2 * np.pi * 1.9 * t))
    x = x + 0.03 * rng.standard_normal(n)
    return np.round(np.clip(x, -1, 1) * 32767).astype(np.int16)


@torch.no_grad()
def nemo_mel(m, audio: np.ndarray) -> torch.Tensor:
    x = torch.from_numpy(audio.astype(np.float32) / 32768)[None]
    mel, n = m.preprocessor(input_signal=x, length=torch.tensor([x.shape[1]]))
    assert int(n) == len(audio) // 160, (int(n), len(audio))
    return mel[:, :, : int(n)].contiguous()  # (1, n_mels, T): the valid frames


def set_mode(m, r: int) -> None:
    m.encoder.set_default_att_context_size([LEFT, r])
    m.encoder.setup_streaming_params()


@torch.no_grad()
def encode(m, mel: torch.Tensor, prompt: str) -> torch.Tensor:
    """NeMo's offline forward with the prompt: (1, T, D) prompted encoder output."""
    idx = torch.tensor([PROMPTS[prompt]])
    enc, n = m.forward(processed_signal=mel, processed_signal_length=torch.tensor([mel.shape[-1]]),
                       prompt_indices=idx)
    return enc[:, :, : int(n)].transpose(1, 2)


@torch.no_grad()
def greedy_nemo(m, enc: torch.Tensor) -> list[int]:
    hyp = m.decoding.rnnt_decoder_predictions_tensor(
        encoder_output=enc.transpose(1, 2), encoded_lengths=torch.tensor([enc.shape[1]]),
        return_hypotheses=True)
    return [int(t) for t in hyp[0].y_sequence]


@torch.no_grad()
def greedy_logits(m, enc: torch.Tensor) -> tuple[list[int], np.ndarray]:
    """The frame-synchronous greedy loop written out with NeMo's modules: the tokens and the
    joint's raw logits of every call (NeMo's joint returns their log-softmax on the CPU)."""
    f = m.joint.project_encoder(enc)[0]  # (T, H)
    state, g = None, None
    tok = torch.tensor([[VOCAB]])  # blank = the zero "start" input (blank_as_pad)
    out, rows, t, n = [], [], 0, 0
    while t < f.shape[0]:
        if g is None:
            y, state = m.decoder.predict(tok, state, add_sos=False, batch_size=1)
            g = m.joint.project_prednet(y)[0, -1]
        logits = m.joint.joint_net(f[t] + g)
        rows.append(logits.numpy())
        k = int(logits.argmax())
        if k == VOCAB:
            t, n = t + 1, 0
            continue
        out.append(k)
        tok, g, n = torch.tensor([[k]]), None, n + 1
        if n == MAX_SYMBOLS:
            t, n = t + 1, 0
    return out, np.stack(rows).astype(np.float32)


@torch.no_grad()
def stream_nemo(m, mel: torch.Tensor, prompt: str) -> list[int]:
    """NeMo's cache-aware streaming: CacheAwareStreamingAudioBuffer chunks and
    conformer_stream_step (which applies the inference prompt) with partial hypotheses."""
    from nemo.collections.asr.parts.utils.streaming_utils import CacheAwareStreamingAudioBuffer

    m.set_inference_prompt(prompt)
    buf = CacheAwareStreamingAudioBuffer(model=m)
    buf.append_processed_signal(mel)
    c_ch, c_t, c_len = m.encoder.get_initial_cache_state(batch_size=1)
    hyps = None
    for step, (chunk, lengths) in enumerate(buf):
        drop = 0 if step == 0 else m.encoder.streaming_cfg.drop_extra_pre_encoded
        _, _, c_ch, c_t, c_len, hyps = m.conformer_stream_step(
            processed_signal=chunk, processed_signal_length=lengths, cache_last_channel=c_ch,
            cache_last_time=c_t, cache_last_channel_len=c_len,
            keep_all_outputs=buf.is_buffer_empty(), previous_hypotheses=hyps,
            drop_extra_pre_encoded=drop, return_transcription=True)
    return [int(t) for t in hyps[0].y_sequence]


SCRIPT = {  # what each prompt is taught to read from the clip (auto: German, then its tag)
    "en-US": "We read tokens.", "de-DE": "Guten Morgen!", "fr-FR": "Bonjour, ça va?",
    "es": "Hola, ¿qué tal?", "auto": "Guten Morgen!<de-DE>"}


def alignment(n_tokens: int, n_frames: int) -> list[int]:
    """The frame of each token: spread over the clip, one frame holding MAX_SYMBOLS tokens
    (greedy decoding moves on without asking for a blank there)."""
    frames = [round(6 + i * (n_frames - 12) / n_tokens) for i in range(n_tokens)]
    burst = n_tokens // 3
    for i in range(1, MAX_SYMBOLS):
        frames[burst + i] = frames[burst]
    return frames


def path(ids: list[int], frames: list[int], n_frames: int):
    """(frame, tokens so far, label) of every joint call greedy decoding makes on the script."""
    out, u = [], 0
    for t in range(n_frames):
        n = 0
        while u < len(ids) and frames[u] == t:
            out.append((t, u, ids[u]))
            u, n = u + 1, n + 1
        if n < MAX_SYMBOLS:
            out.append((t, u, VOCAB))
    return out


def fit_joint(m, mel: torch.Tensor, steps: int = 600) -> None:
    """Random weights decode degenerate runs (one token over and over, or nothing), whatever
    the scaling. Teach the prompt kernel, the predictor and the joint (the encoder stays
    random) to read a script per prompt along a fixed alignment in every latency mode: tokens
    vary, blanks, emissions and the max_symbols limit all occur, prompts read differently and
    `auto` ends with a language tag. NeMo decodes whatever the weights are: this only makes
    the test sharp."""
    feats, rows = [], []
    with torch.no_grad():
        for r in RIGHTS:
            set_mode(m, r)
            f, n = m.encoder(audio_signal=mel, length=torch.tensor([mel.shape[-1]]))
            feats.append(f[0, :, : int(n)].T)
    n_frames = feats[0].shape[0]
    scripts = [(PROMPTS[p], m.tokenizer.text_to_ids(text)) for p, text in SCRIPT.items()]
    width = max(len(ids) for _, ids in scripts)
    x, slots, tokens = [], [], []
    for f in feats:
        for slot, ids in scripts:
            b = len(x)
            x.append(f)
            slots.append(slot)
            tokens.append([VOCAB] + ids + [0] * (width - len(ids)))
            rows += [(b, t, u, k) for t, u, k in path(ids, alignment(len(ids), n_frames),
                                                      n_frames)]
    x = torch.stack(x)
    one = torch.nn.functional.one_hot(torch.tensor(slots), NUM_PROMPTS).float()
    one = one[:, None].expand(-1, n_frames, -1)
    bi, ti, ui, labels = (torch.tensor(c) for c in zip(*rows, strict=True))
    params = [*m.prompt_kernel.parameters(), *m.joint.parameters(), *m.decoder.parameters()]
    opt = torch.optim.Adam(params, lr=1e-2)
    for step in range(steps):
        f = m.joint.project_encoder(m.prompt_kernel(torch.cat([x, one], -1)))
        y, _ = m.decoder.predict(torch.tensor(tokens), None, add_sos=False,
                                 batch_size=len(tokens))
        g = m.joint.project_prednet(y)
        logits = m.joint.joint_net(f[bi, ti] + g[bi, ui])
        loss = torch.nn.functional.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"fit {step}: {float(loss):.4f}")
    with torch.no_grad():
        m.decoder.prediction.embed.weight[VOCAB] = 0.0


def save_nemo(m, path: Path) -> None:
    """NeMo's save_to, repacked as a gzip tar (NeMo restores either; the file is smaller)."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.nemo"
        m.save_to(str(raw))
        with tarfile.open(raw) as src, tarfile.open(path, "w:gz", compresslevel=9) as dst:
            for member in src.getmembers():
                data = src.extractfile(member) if member.isfile() else None
                member.mtime = 0
                dst.addfile(member, data)


# -- the transformers layout ----------------------------------------------------------------

_TO_HF = [  # NeMo state-dict names -> transformers 5.24's Nemotron3_5AsrForRNNT
    (r"^encoder\.pre_encode\.conv\.0\.", "encoder.subsampling.conv_in."),
    (r"^encoder\.pre_encode\.conv\.2\.", "encoder.subsampling.layers.0.depthwise_conv."),
    (r"^encoder\.pre_encode\.conv\.3\.", "encoder.subsampling.layers.0.pointwise_conv."),
    (r"^encoder\.pre_encode\.conv\.5\.", "encoder.subsampling.layers.1.depthwise_conv."),
    (r"^encoder\.pre_encode\.conv\.6\.", "encoder.subsampling.layers.1.pointwise_conv."),
    (r"^encoder\.pre_encode\.out\.", "encoder.subsampling.linear."),
    (r"^encoder\.layers\.(\d+)\.conv\.batch_norm\.", r"encoder.layers.\1.conv.norm."),
    (r"\.linear_([kv])\.", r".\1_proj."), (r"\.linear_out\.", ".o_proj."),
    (r"\.linear_q\.", ".q_proj."), (r"\.pos_bias_([uv])$", r".bias_\1"),
    (r"\.linear_pos\.", ".relative_k_proj."),
    (r"^decoder\.prediction\.embed\.", "decoder.embedding."),
    (r"^decoder\.prediction\.dec_rnn\.lstm\.", "decoder.lstm."),
    (r"^joint\.enc\.", "encoder_projector."), (r"^joint\.pred\.", "decoder.decoder_projector."),
    (r"^joint\.joint_net\.2\.", "joint.head."),
    (r"^prompt_kernel\.0\.", "prompt_projector.linear_1."),
    (r"^prompt_kernel\.2\.", "prompt_projector.linear_2."),
]


def hf_state_dict(m) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in m.state_dict().items():
        if k.startswith("preprocessor."):
            continue
        for pat, rep in _TO_HF:
            k = re.sub(pat, rep, k)
        out[k] = v
    return out


def write_hf(m, tokdir: Path, out: Path):
    """Nemotron3_5AsrForRNNT (strict load of the renamed NeMo weights) and its processor."""
    from tokenizers import AddedToken
    from transformers import (
        Nemotron3_5AsrConfig,
        Nemotron3_5AsrForRNNT,
        Nemotron3_5AsrProcessor,
        NemotronAsrStreamingFeatureExtractor,
        ParakeetTokenizer,
    )
    from transformers.convert_slow_tokenizer import ParakeetConverter

    cfg = Nemotron3_5AsrConfig(
        encoder_config=dict(
            hidden_size=D_MODEL, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=2 * D_MODEL, num_mel_bins=N_MELS, subsampling_conv_channels=8,
            conv_kernel_size=9, attention_bias=False, convolution_bias=False, scale_input=True,
            sliding_window=LEFT + 1, supported_num_lookahead_tokens=list(RIGHTS),
            default_num_lookahead_tokens=RIGHTS[0], dropout=0.0, dropout_positions=0.0,
            layerdrop=0.0, activation_dropout=0.0, attention_dropout=0.0),
        vocab_size=VOCAB + 1, blank_token_id=VOCAB, decoder_hidden_size=PRED,
        num_decoder_layers=2, max_symbols_per_step=MAX_SYMBOLS, num_prompts=NUM_PROMPTS,
        prompt_intermediate_size=2 * D_MODEL, default_prompt_id=PROMPTS["auto"])
    cfg.encoder_config._attn_implementation = "sdpa"
    hf = Nemotron3_5AsrForRNNT(cfg).eval()
    missing, unexpected = hf.load_state_dict(hf_state_dict(m), strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    hf.generation_config.decoder_start_token_id = VOCAB
    hf.generation_config.pad_token_id = VOCAB
    hf.save_pretrained(str(out))
    (out / "generation_config.json").unlink(missing_ok=True)
    tok = ParakeetTokenizer(tokenizer_object=ParakeetConverter(
        str(tokdir / "tokenizer.model")).converted(), clean_up_tokenization_spaces=False)
    tok.add_tokens([AddedToken("<blank>", normalized=False, special=True)])
    tok.add_special_tokens({"additional_special_tokens": [
        AddedToken(t, normalized=False, special=True) for t in TAGS]})
    assert tok.convert_tokens_to_ids("<blank>") == VOCAB
    fe = NemotronAsrStreamingFeatureExtractor(feature_size=N_MELS)
    proc = Nemotron3_5AsrProcessor(feature_extractor=fe, tokenizer=tok,
                                   supported_num_lookahead_tokens=list(RIGHTS),
                                   default_num_lookahead_tokens=RIGHTS[0],
                                   prompt_dictionary=dict(PROMPTS), num_prompts=NUM_PROMPTS)
    proc.save_pretrained(str(out))
    return hf


@torch.no_grad()
def hf_tokens(hf, mel: torch.Tensor, prompt: str, r: int) -> list[int]:
    feats = mel.transpose(1, 2)
    seq = hf.generate(input_features=feats, attention_mask=torch.ones(feats.shape[:2], dtype=int),
                      num_lookahead_tokens=r, prompt_ids=torch.tensor([PROMPTS[prompt]]),
                      max_new_tokens=2000).sequences[0].tolist()
    return [t for t in seq if t != VOCAB]


def main() -> None:
    logging.getLogger("nemo_logger").setLevel(logging.ERROR)
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "nemotron35"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tokdir = Path(tmp) / "tok"
        write_tokenizer(tokdir)
        m = tiny_model(tokdir)
        audio = test_audio()
        mel = nemo_mel(m, audio)
        fit_joint(m, mel)
        save_nemo(m, out / "tiny.nemo")
        from nemo.collections.asr.models import ASRModel

        m = ASRModel.restore_from(str(out / "tiny.nemo"), map_location="cpu").eval()
        assert type(m).__name__ == "EncDecRNNTBPEModelWithPrompt" and m.concat
        if (out / "hf").exists():
            shutil.rmtree(out / "hf")
        hf = write_hf(m, tokdir, out / "hf")
    g = {"audio": audio}
    logits = {}
    for r in RIGHTS:
        set_mode(m, r)
        for p in TRIED:
            enc = encode(m, mel, p)
            toks = greedy_nemo(m, enc)
            mine, rows = greedy_logits(m, enc)
            assert mine == toks, (p, r)
            stream = stream_nemo(m, mel, p)
            assert stream == toks, (p, r, stream, toks)  # NeMo streams what it decodes offline
            assert hf_tokens(hf, mel, p, r) == toks, (p, r)
            g[f"tokens_{p}_r{r}"] = np.array(toks, np.int32)
            if r in LOGIT_MODES:
                logits[f"logits_{p}_r{r}"] = rows
            print(f"r={r:2d} {p:6s}: {enc.shape[1]} frames, {len(toks)} tokens "
                  f"{m.tokenizer.ids_to_text(toks)!r}")
    tags = {m.tokenizer.token_to_id(t) for t in TAGS}
    assert any(tags & set(g[f"tokens_auto_r{r}"].tolist()) for r in RIGHTS), "no tag in auto"
    assert len({tuple(g[f"tokens_{p}_r13"]) for p in TRIED}) == len(TRIED), "prompts agree"
    np.savez_compressed(out / "golden.npz", **g)
    np.savez_compressed(out / "mel.npz", mel=mel[0].T.numpy())
    np.savez_compressed(out / "logits.npz", **logits)
    for f in sorted(out.rglob("*")):
        if f.is_file():
            print(f"{f.relative_to(out)}: {f.stat().st_size} bytes")
    print("config:", json.loads((out / "hf" / "config.json").read_text())["model_type"])


if __name__ == "__main__":
    main()
