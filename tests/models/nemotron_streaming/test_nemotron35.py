"""Nemotron 3.5 (language-prompted Nemotron): token-for-token parity with NeMo 3.0 on a tiny
`EncDecRNNTBPEModelWithPrompt` (tests/golden/make_nemotron35.py) for every prompt tried and
`auto`, every latency mode, offline and streamed in random chunks, batched == alone, from the
`.nemo` release and the transformers layout; logits from NeMo's mel; languages: resolution,
tags kept out of text, detection, one-line errors before any weights load."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlx_speech
from mlx_speech.errors import CheckpointError, MlxSpeechError
from mlx_speech.models.nemotron_streaming import Nemotron35Streaming, load
from mlx_speech.models.nemotron_streaming import config as lang
from tests.support import nemo as nemo_helpers
from tests.support.nemo import transformers_features

GOLDEN = Path(__file__).parents[2] / "golden" / "nemotron35"
SEED = Path(__file__).parents[2] / "golden" / "nemotron"
MODES = {1120: 13, 560: 6, 320: 3, 160: 1, 80: 0}  # latency ms -> right context
PROMPTS = ("en-US", "de-DE", "fr-FR", "es", "auto")  # es: a bare code of the dictionary
DE_TAG = 2  # <de-DE> in the tiny tokenizer
nemo_file = nemo_helpers.nemo_file  # the fixture: the English seed model as a .nemo


@pytest.fixture(scope="module")
def g():
    d = dict(np.load(GOLDEN / "golden.npz"))
    d["audio"] = d["audio"].astype(np.float32) / 32768
    return d


@pytest.fixture(scope="module")
def models():
    return {"nemo": load(GOLDEN / "tiny.nemo"), "hf": load(GOLDEN / "hf")}


@pytest.fixture(scope="module")
def nm(models):
    return models["nemo"]


def want(g, prompt: str, latency_ms: int) -> list[int]:
    return [int(t) for t in g[f"tokens_{prompt}_r{MODES[latency_ms]}"]]


def _chunks(x, sizes):
    i, k = 0, 0
    while i < len(x):
        yield x[i: i + sizes[k % len(sizes)]]
        i, k = i + sizes[k % len(sizes)], k + 1


# -- parity with NeMo ---------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["nemo", "hf"])
@pytest.mark.parametrize("latency_ms", list(MODES))
def test_tokens_match_nemo_for_every_prompt(models, g, layout, latency_ms):
    m = models[layout]
    assert isinstance(m, Nemotron35Streaming) and m.kind == "asr"
    for prompt in PROMPTS:
        r = m.transcribe(g["audio"], latency_ms=latency_ms, language=prompt)
        assert r.token_ids == want(g, prompt, latency_ms), prompt
        assert m.config.blank_id not in r.token_ids


@pytest.mark.parametrize("latency_ms", list(MODES))
def test_streamed_in_random_chunks_matches_nemo(nm, g, latency_ms):
    rng = np.random.default_rng(latency_ms)
    for prompt in PROMPTS:
        sizes = [int(x) for x in rng.integers(1, 6000, size=40)]
        s = nm.session(latency_ms, language=prompt)
        text = "".join(s.feed(c) for c in _chunks(g["audio"], sizes)) + s.finish()
        assert s.token_ids == want(g, prompt, latency_ms), (prompt, sizes[:4])
        assert text == nm.transcribe(g["audio"], latency_ms=latency_ms, language=prompt).text


def test_the_clip_exercises_the_decoder(nm, g):
    """Emissions, blanks and the max_symbols limit all occur; prompts read differently."""
    r = nm.transcribe(g["audio"], latency_ms=1120, language="en-US")
    counts = np.bincount(r.frames)
    assert counts.max() == nm.config.max_symbols and (counts == 0).any()
    reads = {tuple(want(g, p, ms)) for p in PROMPTS for ms in MODES}
    assert len(reads) >= len(PROMPTS) + 1  # prompts differ, and modes change some


def _greedy_rows(m, frames: mx.array, max_symbols: int):
    """NeMo's frame-synchronous greedy loop over projected frames (1, T, dim): the tokens and
    the joint's logits of every call, as the generator records them."""
    st = m.make_decoder_state()
    out, rows, t, n = [], [], 0, 0
    blank = m.config.blank_id
    while t < frames.shape[1]:
        logits = m.joint(frames[:, t], st.g)[0]
        rows.append(np.array(logits))
        k = int(mx.argmax(logits))
        if k == blank:
            t, n = t + 1, 0
            continue
        out.append(k)
        st, n = m.decoder(mx.array([k]), st), n + 1
        if n == max_symbols:
            t, n = t + 1, 0
    return out, np.stack(rows)


@pytest.mark.parametrize("r", [13, 0])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_from_nemo_mel_match(nm, g, r, prompt):
    mel = mx.array(np.load(GOLDEN / "mel.npz")["mel"][None])
    ref = np.load(GOLDEN / "logits.npz")[f"logits_{prompt}_r{r}"]
    m = nm.model
    frames = m.project(m.encoder(mel, r), [nm.resolve_language(prompt)[1]])
    tokens, rows = _greedy_rows(m, frames, nm.config.max_symbols)
    assert tokens == [int(t) for t in g[f"tokens_{prompt}_r{r}"]]
    assert rows.shape == ref.shape
    np.testing.assert_allclose(rows, ref, atol=1e-4)


def test_batched_sessions_of_many_languages_equal_alone(nm, g):
    """One feed_many steps sessions of different languages (one prompt per row of a shared
    encoder call), joined late, chunked differently, in two latency modes."""
    specs = [(p, ms, sizes, start) for (p, ms), sizes, start in zip(
        [(p, 160) for p in PROMPTS] + [("auto", 560), ("de-DE", 560)],
        [[1280], [1280], [1280], [777, 3000], [1280], [4000, 1, 2561], [640]],
        [0, 0, 2, 0, 5, 1, 0], strict=True)]
    sessions = [nm.session(ms, language=p) for p, ms, _, _ in specs]
    feeds = [list(_chunks(g["audio"], sizes)) for _, _, sizes, _ in specs]
    texts = ["" for _ in specs]
    tick = 0
    while any(feeds):
        pairs = [(i, feeds[i].pop(0)) for i, (_, _, _, start) in enumerate(specs)
                 if feeds[i] and tick >= start]
        for (i, _), t in zip(pairs, nm.feed_many([(sessions[i], c) for i, c in pairs]),
                             strict=True):
            texts[i] += t
        tick += 1
    for i, t in enumerate(nm.finish_many(sessions)):
        texts[i] += t
    for (p, ms, _, _), s, text in zip(specs, sessions, texts, strict=True):
        assert s.token_ids == want(g, p, ms), (p, ms)
        assert text == nm.transcribe(g["audio"], latency_ms=ms, language=p).text


# -- languages ------------------------------------------------------------------------------

def test_auto_detects_and_tags_never_reach_text(nm, g):
    r = nm.transcribe(g["audio"], latency_ms=1120, language="auto")
    assert DE_TAG in r.token_ids and nm.language_tags[DE_TAG] == "de-DE"
    assert r.language == "de-DE"
    assert "<" not in r.text and r.text.startswith("Guten Morgen")
    assert all("<" not in w.text for w in r.words)
    assert len(r.token_times) == len(r.token_ids)
    # streamed: the deltas carry no tag either, and the session reports it once heard
    s = nm.session(1120, language="auto")
    assert s.detected_language is None
    text = "".join(s.feed(c) for c in _chunks(g["audio"], [1600])) + s.finish()
    assert text == r.text and s.detected_language == "de-DE"
    assert b"<" not in b"".join(nm.tokenizer.token_bytes(t) for t in r.token_ids)


def test_logprobs_and_phrase_boosting_with_languages(nm, g):
    from mlx_speech.models.asr import logprob_items

    plain = nm.transcribe(g["audio"], language="auto")
    r = nm.transcribe(g["audio"], language="auto", logprobs=True, hotwords="Morgen", boost=0.0)
    assert r.token_ids == plain.token_ids and len(r.logprobs) == len(r.token_ids)
    assert all(lp <= 0 for lp in r.logprobs)
    items = logprob_items(nm.tokenizer, zip(r.token_ids, r.logprobs, strict=True))
    assert "".join(i["token"] for i in items).strip() == r.text.strip()  # no tag
    boosted = nm.transcribe(g["audio"], language="de", hotwords="Morgen, Bonjour", boost=5.0)
    assert boosted.token_ids != want(g, "de-DE", 1120) and "<" not in boosted.text


def test_drained_transcripts_keep_the_language(nm, g):
    s = nm.session(80, language="auto")
    parts = []
    for c in _chunks(g["audio"], [3200]):
        s.feed(c)
        parts.append(s.drain())
    s.finish()
    rest = s.result()  # the last word stays for result()
    full = nm.transcribe(g["audio"], latency_ms=80, language="auto")
    assert "".join(p.text for p in parts) + rest.text == " " + full.text  # unstripped pieces
    assert sum(len(p.token_ids) for p in parts) + len(rest.token_ids) == len(full.token_ids)
    assert DE_TAG in rest.token_ids and rest.language == "de-DE"
    assert parts[0].language is None  # before the tag was heard
    parts.append(s.drain())  # everything now: the session remembers the language
    assert parts[-1].language == "de-DE" and s.result().language == "de-DE"


def test_a_given_language_is_reported_as_its_locale(nm, g):
    assert nm.transcribe(g["audio"], language="es").language == "es-ES"
    assert nm.transcribe(g["audio"], language="fr-FR").language == "fr-FR"
    assert nm.session(language="de").language == "de"


def test_language_names_resolve_like_the_dictionary(nm):
    assert nm.languages == ("auto", "de", "de-DE", "en", "en-US", "es", "es-ES", "fr", "fr-FR")
    assert nm.languages_info.default == "auto"
    assert nm.resolve_language("DE_de") == ("de-DE", 9)
    assert nm.resolve_language("En") == ("en", 0)
    assert nm.resolve_language(None) == ("auto", 101)
    prompts = lang.release_prompts()
    assert lang.resolve(prompts, "ja") == ("ja-JP", 10)  # a code the dictionary lacks
    assert lang.resolve(prompts, "zh") == ("zh-CN", 4)  # the lowest slot of the language
    assert lang.resolve(prompts, "no") == ("no", 27)


@pytest.mark.parametrize("bad", ["xx", "de-XX", "english", ""])
def test_unknown_languages_are_one_line_errors_listing_the_supported(nm, bad):
    with pytest.raises(MlxSpeechError) as e:
        nm.session(language=bad)
    msg = str(e.value)
    assert "\n" not in msg and "auto, de, de-DE, en" in msg or "language must be" in msg
    with pytest.raises(MlxSpeechError):
        nm.transcribe(np.zeros(1600, np.float32), language=bad)


def test_a_load_language_is_checked_before_the_weights(tmp_path, g):
    d = Path(shutil.copytree(GOLDEN / "hf", tmp_path / "hf"))
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])  # unreadable weights
    with pytest.raises(MlxSpeechError, match="unknown language 'xx'"):
        mlx_speech.load(d, language="xx")
    with pytest.raises(CheckpointError):
        mlx_speech.load(d, language="de")
    nemo = tmp_path / "bad.nemo"
    import tarfile

    with tarfile.open(GOLDEN / "tiny.nemo") as src, tarfile.open(nemo, "w") as dst:
        for member in src.getmembers():  # the config, and weights that cannot be read
            data = src.extractfile(member) if member.isfile() else None
            if member.name.endswith("model_weights.ckpt"):
                member.size, data = 9, io.BytesIO(b"not a zip")
            dst.addfile(member, data)
    with pytest.raises(MlxSpeechError, match="unknown language 'xx'"):
        load(nemo, language="xx")
    with pytest.raises(CheckpointError, match="not a torch zip"):
        load(nemo, language="de")
    m = load(GOLDEN / "tiny.nemo", language="es")  # the sessions' default
    assert m.session().language == "es"
    assert m.transcribe(g["audio"], latency_ms=160).token_ids == want(g, "es", 160)


def test_the_english_seed_model_takes_no_language(tmp_path):
    seed = load(SEED)
    assert seed.languages is None and seed.resolve_language(None) == (None, None)
    assert seed.transcribe(np.zeros(8000, np.float32)).language is None
    with pytest.raises(MlxSpeechError, match="English only"):
        seed.session(language="de")
    d = Path(shutil.copytree(SEED, tmp_path / "seed"))
    (d / "model.safetensors").write_bytes(b"")
    with pytest.raises(MlxSpeechError, match="English only"):
        load(d, language="en")


def test_prompt_dictionary_keys_from_yaml():
    import yaml

    raw = yaml.safe_load("prompt_dictionary: {no: 27, 'nb': 103, en: 0, auto: 101}")
    assert lang.prompt_dictionary(raw["prompt_dictionary"]) == {
        "no": 27, "nb": 103, "en": 0, "auto": 101}
    assert lang.release_prompts()["auto"] == 101 and len(lang.release_prompts()) == 121


def test_processor_config_missing_falls_back_to_the_release_dictionary(tmp_path, g):
    d = Path(shutil.copytree(GOLDEN / "hf", tmp_path / "hf"))
    (d / "processor_config.json").unlink()
    m = load(d)
    assert m.languages == Nemotron35Streaming.languages and "nb-NO" in m.languages
    assert m.transcribe(g["audio"], latency_ms=160, language="de").token_ids == \
        want(g, "de-DE", 160)


# -- loading, latency, layouts --------------------------------------------------------------

def test_registry_and_latency_modes(nm, nemo_file):
    from mlx_speech.registry import archive_type, family, kind_of

    assert archive_type(GOLDEN / "tiny.nemo") == "nemotron3_5_asr"
    assert archive_type(nemo_file) == "nemotron_asr_streaming"  # the English seed's .nemo
    assert kind_of("nemotron3_5_asr") == "asr" and nm.name.startswith("Nemotron 3.5")
    assert family("nemotron3_5_asr") is Nemotron35Streaming and nm.family == "nemotron_streaming"
    assert family("nemotron_asr") is Nemotron35Streaming  # mlx-audio's layout
    assert nm.session(320).latency_ms == 320 and nm.session().latency_ms == 1120
    assert nm.latency.check(320) == 320 and nm.latency.values() == (80, 160, 320, 560, 1120)
    with pytest.raises(MlxSpeechError, match="80, 160, 320, 560, 1120 ms, got 480"):
        family("nemotron3_5_asr").latency.check(480)
    with pytest.raises(MlxSpeechError, match="one of 80, 160, 560, 1120 ms, got 320"):
        load(SEED).session(320)


def test_both_layouts_hold_the_same_tensors(models):
    from mlx.utils import tree_flatten

    a, b = (dict(tree_flatten(models[k].model.parameters())) for k in ("nemo", "hf"))
    assert a.keys() == b.keys() and "prompt_projector.linear_1.weight" in a
    assert all(mx.array_equal(a[k], b[k]).item() for k in a)


def test_transformers_first_port_names_load(tmp_path, models):
    """transformers' first Nemotron 3.5 port named the projector as NeMo: prompt_kernel.0/2."""
    from safetensors.numpy import load_file, save_file

    d = Path(shutil.copytree(GOLDEN / "hf", tmp_path / "hf"))
    w = load_file(d / "model.safetensors")
    for i, j in ((1, 0), (2, 2)):
        for leaf in ("weight", "bias"):
            w[f"prompt_kernel.{j}.{leaf}"] = w.pop(f"prompt_projector.linear_{i}.{leaf}")
    save_file(w, d / "model.safetensors")
    got = load(d).model.prompt_projector.linear_1.weight
    assert mx.array_equal(got, models["hf"].model.prompt_projector.linear_1.weight).item()


def test_missing_prompt_weights_are_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    d = Path(shutil.copytree(GOLDEN / "hf", tmp_path / "hf"))
    w = load_file(d / "model.safetensors")
    w.pop("prompt_projector.linear_2.bias")
    save_file(w, d / "model.safetensors")
    with pytest.raises(CheckpointError, match="prompt_projector.linear_2.bias"):
        load(d)


def test_converted_folders_and_quantized_models(tmp_path, g):
    from mlx_speech.convert import convert

    for src in (GOLDEN / "tiny.nemo", GOLDEN / "hf"):
        (out,) = convert(src, tmp_path / src.stem, progress=False)
        m = mlx_speech.load(out)
        assert isinstance(m, Nemotron35Streaming) and m.languages_info.default == "auto"
        for p in ("de-DE", "auto"):
            assert m.transcribe(g["audio"], latency_ms=320, language=p).token_ids == \
                want(g, p, 320)
    for bits in (4, 6, 8):
        on_the_fly = load(GOLDEN / "tiny.nemo", quantize=bits, group_size=32)
        assert on_the_fly.model.prompt_projector.linear_1.bits == bits
        saved = mlx_speech.load(convert(GOLDEN / "tiny.nemo", tmp_path / f"q{bits}",
                                        quantize=bits, group_size=32, progress=False)[0])
        for p in ("en-US", "auto"):
            ids = on_the_fly.transcribe(g["audio"], latency_ms=560, language=p).token_ids
            assert saved.transcribe(g["audio"], latency_ms=560, language=p).token_ids == ids
            if bits == 8:  # 8 bits read the script as full precision does
                assert ids == want(g, p, 560)


def test_convert_nemo_writes_the_transformers_layout(tmp_path, g):
    import json

    from mlx_speech.convert.nemo import convert_nemo

    out = convert_nemo(GOLDEN / "tiny.nemo", tmp_path / "hf")
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors",
                                               "tokenizer.model", "processor_config.json"}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "nemotron3_5_asr" and "prompt_dictionary" not in cfg
    ref = mx.load(str(GOLDEN / "hf" / "model.safetensors"))
    got = mx.load(str(out / "model.safetensors"))
    assert ref.keys() == got.keys()
    assert load(out).transcribe(g["audio"], language="fr").token_ids == want(g, "fr-FR", 1120)


# -- mlx-audio's layout, quantized (golden/quantized/nemotron35, make_quantized_nemotron35.py) -----
QUANT = Path(__file__).parents[2] / "golden" / "quantized" / "nemotron35"


def _mel_tokens(m, prompt: str, r: int) -> list[int]:
    """Our greedy decode of NeMo's mel (mlx-audio's mel moves a near-tie last token)."""
    from mlx_speech.models.nemotron_streaming.step import greedy_decode

    mel = mx.array(np.load(GOLDEN / "mel.npz")["mel"][None])
    frames = m.model.project(m.model.encoder(mel, r), [m.resolve_language(prompt)[1]])
    return greedy_decode(m.model, frames, m.model.make_decoder_state())[0][0]


@pytest.mark.parametrize("name", ["q8", "q4"])
def test_mlx_audio_quantized_layout_matches_mlx_audio(name):
    import mlx.nn as nn

    m = mlx_speech.load(QUANT / name)
    assert isinstance(m, Nemotron35Streaming)
    assert isinstance(m.model.prompt_projector.linear_1, nn.QuantizedLinear)
    assert m.model.prompt_projector.linear_1.bits == int(name[1:])
    gold = np.load(QUANT / "golden.npz")
    special = {0, *m.language_tags}  # mlx-audio leaves <unk> and the tags out
    for prompt in ("en-US", "de-DE", "auto"):
        for r in (13, 0):
            got = [t for t in _mel_tokens(m, prompt, r) if t not in special]
            assert got == gold[f"{name}/tokens_{prompt}_r{r}"].tolist(), (prompt, r)


def test_mlx_audio_q8_is_on_the_fly_q8():
    """Quantizing the .nemo while loading gives exactly the tensors of mlx-audio's q8 file
    (its LSTM stores bias_ih + bias_hh as one vector: compared in that form)."""
    from mlx.utils import tree_flatten

    theirs = dict(tree_flatten(mlx_speech.load(QUANT / "q8").model.parameters()))
    ours = load(GOLDEN / "tiny.nemo", quantize=8, group_size=32).model
    lstm = ours.decoder.lstm
    for i in range(ours.config.num_decoder_layers):
        b = getattr(lstm, f"bias_ih_l{i}") + getattr(lstm, f"bias_hh_l{i}")
        setattr(lstm, f"bias_ih_l{i}", b)
        setattr(lstm, f"bias_hh_l{i}", mx.zeros_like(b))
    ours = dict(tree_flatten(ours.parameters()))
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert ours[k].dtype == theirs[k].dtype and mx.array_equal(ours[k], theirs[k]).item(), k


def test_mlx_audio_layout_converts_to_ours(tmp_path, g):
    import json

    from mlx_speech.convert import convert

    (out,) = convert(QUANT / "q8", tmp_path / "q8", progress=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "nemotron3_5_asr" and cfg["prompt_dictionary"]["auto"] == 101
    a, b = mlx_speech.load(out), mlx_speech.load(QUANT / "q8")
    for p in ("de-DE", "auto"):
        assert a.transcribe(g["audio"], language=p).token_ids == \
            b.transcribe(g["audio"], language=p).token_ids


# -- reference (needs torch + transformers >= 5.13, with Nemotron 3.5) ------------------------

@pytest.mark.reference
def test_fresh_audio_against_transformers(models):
    torch = pytest.importorskip("torch")
    tr = pytest.importorskip("transformers")
    ref_cls = getattr(tr, "Nemotron3_5AsrForRNNT", None)
    if ref_cls is None:
        pytest.skip("this transformers has no Nemotron 3.5")
    from tests.conftest import speechlike

    ref = ref_cls.from_pretrained(str(GOLDEN / "hf")).eval()
    nm = models["hf"]
    ref.generation_config.decoder_start_token_id = nm.config.blank_id
    ref.generation_config.pad_token_id = nm.config.blank_id
    fe = transformers_features(tr, nm.config.encoder.num_mel_bins)
    audio = speechlike(2.7, seed=11)
    f = fe(audio, sampling_rate=16000, return_tensors="pt")
    for ms, r in MODES.items():
        for prompt in ("en-US", "de", "auto"):
            slot = nm.resolve_language(prompt)[1]
            with torch.no_grad():
                seq = ref.generate(input_features=f.input_features,
                                   attention_mask=f.attention_mask, num_lookahead_tokens=r,
                                   prompt_ids=torch.tensor([slot]), max_new_tokens=2000)
            want_ids = [t for t in seq.sequences[0].tolist() if t != nm.config.blank_id]
            s = nm.session(ms, language=prompt)
            for c in _chunks(audio, [1111]):
                s.feed(c)
            s.finish()
            assert s.token_ids == want_ids, (ms, prompt)
