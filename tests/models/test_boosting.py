"""Phrase boosting: the context graph equals NeMo's boosting tree, Nemotron's greedy boosting
equals NeMo 3.0's GPU-PB decoding (golden by tests/golden/make_boosting.py), nothing changes
without phrases, batched == alone with different lists per stream, and the SentencePiece
encoder equals sentencepiece."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_speech.errors import MlxSpeechError
from mlx_speech.models.voxtral_realtime import step as vr_step
from mlx_speech.nn import boost, sampling
from mlx_speech.text.context_graph import Booster, ContextGraph, parse_hotwords
from mlx_speech.text.spm import SentencePieceDecoder
from mlx_speech.text.vocabulary import Vocabulary
from tests.conftest import speechlike

GOLDEN = Path(__file__).parents[1] / "golden"
B = np.load(GOLDEN / "boosting" / "golden.npz")
CASES = ["quick", "small", "many", "strong"]


@pytest.fixture(scope="module")
def nemotron():
    from mlx_speech.models.nemotron_streaming import load

    return load(GOLDEN / "nemotron")


@pytest.fixture(scope="module")
def audio():
    return np.load(GOLDEN / "nemotron" / "golden.npz")["audio"]


def _case(name):
    return list(B[f"{name}_phrases"]), float(B[f"{name}_alpha"]), json.loads(str(B[f"{name}_ids"]))


def test_spm_encoder_equals_sentencepiece():
    texts = list(B["spm_texts"])
    for name, path in [("bpe", GOLDEN / "nemotron" / "tokenizer.model"),
                       ("unigram", GOLDEN / "boosting" / "unigram.model")]:
        tk = SentencePieceDecoder.from_file(path)
        assert tk.encoding["type"] == name
        assert [tk.encode(t) for t in texts] == json.loads(str(B[f"spm_{name}"]))


def test_graph_scores_equal_nemo_boosting_tree():
    _, _, ids = _case("many")
    g = ContextGraph(ids, 32)
    state, ref = 0, B["many_scores"]
    for row, tok in zip(ref, B["plain"].tolist(), strict=True):
        np.testing.assert_allclose(g.scores(state), row, atol=1e-5)
        state = g.step(state, tok)
    assert len(ref) > 50


def test_dense_plus_sparse_is_the_score_up_to_a_constant():
    _, _, ids = _case("many")
    g = ContextGraph(ids, 32)
    walk = Booster(g, 1.0)
    for tok in B["plain"].tolist()[:60]:
        full = g.scores(walk.state)
        idx, val = walk.sparse(g.width)
        mine = g.root_scores.copy()
        np.add.at(mine, idx, val)
        d = full - mine
        np.testing.assert_allclose(d, d[0], atol=1e-5)  # a constant: no argmax sees it
        walk.advance(tok)


@pytest.mark.parametrize("name", CASES)
def test_nemotron_boosting_equals_nemo_gpu_pb(nemotron, audio, name):
    phrases, alpha, ids = _case(name)
    assert [nemotron.tokenizer.encode(p) for p in phrases] == ids
    got = nemotron.transcribe(audio, latency_ms=1120, hotwords=phrases, boost=alpha).token_ids
    assert got == B[f"{name}_tokens"].tolist()


def test_boosting_changes_nemotron_output_and_empty_list_changes_nothing(nemotron, audio):
    plain = B["plain"].tolist()
    assert nemotron.transcribe(audio, latency_ms=1120).token_ids == plain
    for hw, b in [([], 2.0), (None, 2.0), (["quick brown"], 0.0), ("  , ,", 3.0)]:
        assert nemotron.transcribe(audio, latency_ms=1120, hotwords=hw, boost=b
                                   ).token_ids == plain
    assert B["quick_tokens"].tolist() != plain  # the golden cases do change something


def test_a_vocabulary_value_boosts_as_its_hotwords_do(nemotron, audio):
    """Sessions take a Vocabulary (parsed once at an edge); hotwords= / boost= are the Python
    API's edge, built into one by Vocabulary.parse: the same tokens; the graph is built once
    in the model's own cache and shared."""
    phrases, alpha, _ = _case("quick")
    vocab = Vocabulary.parse(phrases, alpha)
    got = nemotron.transcribe(audio, latency_ms=1120, vocabulary=vocab).token_ids
    assert got == B["quick_tokens"].tolist()
    a, b = nemotron.session(vocabulary=vocab), nemotron.session(hotwords=phrases, boost=alpha)
    assert a.booster.graph is b.booster.graph is nemotron.graphs.get(vocab.phrases, None)
    assert nemotron.session(vocabulary=Vocabulary(("quick",), 0.0)).booster is None
    with pytest.raises(MlxSpeechError, match="not both"):
        nemotron.session(vocabulary=vocab, hotwords=["other"])
    with pytest.raises(MlxSpeechError, match="Vocabulary"):
        nemotron.session(vocabulary="quick brown")


def test_nemotron_batched_equals_alone_with_different_lists(nemotron, audio):
    specs = ["quick", None, "strong", "many"]

    def kw(name):
        return {} if name is None else {"hotwords": _case(name)[0], "boost": _case(name)[1]}

    alone = [nemotron.transcribe(audio, latency_ms=1120, **kw(n)).token_ids for n in specs]
    sessions = [nemotron.session(1120, **kw(n)) for n in specs]
    step = 16000 // 3
    for i in range(0, len(audio), step):
        nemotron.feed_many([(s, audio[i: i + step]) for s in sessions])
    nemotron.finish_many(sessions)
    assert [s.result().token_ids for s in sessions] == alone
    assert alone[0] == B["quick_tokens"].tolist() and alone[1] == B["plain"].tolist()


def test_boost_fires_only_on_tokens_that_start_or_extend_a_phrase():
    g = ContextGraph([[5, 6, 7], [9]], 16)
    w = Booster(g, 2.0)

    def row():
        b = boost.bias([w], 16)
        return np.array(b[0])

    r = row()
    assert set(np.flatnonzero(r)) == {5, 9}  # phrase starts only
    w.advance(5)
    r = row()
    # 6 extends the match; the other tokens share one constant offset (no argmax sees it)
    assert r[6] > r[5] and r[6] > r[9] and np.ptp(np.delete(r, [5, 6, 9])) == 0
    w.advance(3)  # a failed partial match: back at the root
    assert w.state == 0 and set(np.flatnonzero(row())) == {5, 9}


def test_boost_wins_a_near_tie_and_leaves_clear_choices_alone():
    g = ContextGraph([[3, 4]], 8)
    w = Booster(g, 1.0)
    logits = mx.array([[0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 1.0]])
    assert int(sampling.greedy(logits, None)[0]) == 7
    assert int(sampling.greedy(logits, boost.bias([w], 8))[0]) == 3  # near tie: the phrase wins
    clear = mx.array([[0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 5.0]])
    assert int(sampling.greedy(clear, boost.bias([w], 8))[0]) == 7
    # transducer: blank or not is the plain model's call
    blank = mx.array([[0.0, 0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 1.0, 1.2]])
    assert int(sampling.greedy_transducer(blank, boost.bias([w], 8), 8)[0]) == 8


def test_bias_shape_does_not_grow_with_phrases():
    rng = np.random.default_rng(0)
    few = ContextGraph([[1, 2]], 64)
    many = ContextGraph([list(rng.integers(0, 64, 3)) for _ in range(1000)], 64)
    for g in (few, many):
        w = Booster(g, 1.0)
        assert boost.bias([w, None], 64).shape == (2, 64)
        assert g.width <= 64


def test_hotword_lists_are_checked():
    assert parse_hotwords("Kubernetes, LinTO\n mlx  speech,,LinTO") == [
        "Kubernetes", "LinTO", "mlx speech"]
    with pytest.raises(MlxSpeechError):
        parse_hotwords(["x" * 500])
    from mlx_speech.text.context_graph import check_boost

    with pytest.raises(MlxSpeechError):
        check_boost("nan")
    with pytest.raises(MlxSpeechError):
        check_boost(-1)


# -- Voxtral -----------------------------------------------------------------------------


def _record(monkeypatch):
    """Every boosted greedy choice Voxtral makes: (logits, chosen) per row."""
    seen = []
    real = sampling.greedy

    def spy(logits, b):
        out = real(logits, b)
        if b is not None:
            seen.append((np.array(logits.astype(mx.float32)), np.array(out)))
        return out

    monkeypatch.setattr(vr_step, "greedy", spy)  # the name Voxtral's step chooses with
    return seen


def test_voxtral_empty_list_changes_nothing(vr_model):

    a = speechlike(2.0)
    plain = vr_model.transcribe(a).token_ids
    for hw, b in [([], 3.0), (None, 3.0), ([">"], 0.0)]:
        assert vr_model.transcribe(a, hotwords=hw, boost=b).token_ids == plain


def test_voxtral_boosted_choice_is_the_full_boosting_tree_score(vr_model, monkeypatch):

    a = speechlike(2.0)
    plain = vr_model.transcribe(a).token_ids
    seen = _record(monkeypatch)
    s = vr_model.session(hotwords=[">", "0K"], boost=3.0)
    s.feed(a)
    s.finish()
    got = s.result().token_ids
    assert got != plain and got.count(1062) > plain.count(1062)  # the phrase wins near-ties
    # replay: each choice is argmax(model logits + alpha * NeMo-style score of the state)
    g, walk = s.booster.graph, 0
    chosen = [int(c[0]) for _, c in seen]
    assert chosen == got[: len(chosen)] and len(chosen) >= len(got) - 1
    for (logits, _), tok in zip(seen, chosen, strict=True):
        assert int(np.argmax(logits[0] + 3.0 * g.scores(walk))) == tok
        if not vr_model.tokenizer.is_special(tok):
            walk = g.step(walk, tok)


def test_voxtral_batched_equals_alone_with_different_lists(vr_model):

    a = speechlike(2.0)
    lists = [([">"], 3.0), (None, 1.0), (["0K", "!"], 2.0)]
    alone = [vr_model.transcribe(a, hotwords=h, boost=b).token_ids for h, b in lists]
    sessions = [vr_model.session(hotwords=h, boost=b) for h, b in lists]
    step = 16000 // 4
    for i in range(0, len(a), step):
        vr_model.feed_many([(s, a[i: i + step]) for s in sessions])
    vr_model.finish_many(sessions)
    assert [s.result().token_ids for s in sessions] == alone
    assert alone[0] != alone[1]


# -- CLI ---------------------------------------------------------------------------------


def test_cli_hotwords_boost_and_file(vr_dir, vr_model, tmp_path):
    import soundfile as sf

    from tests.support.cli import run

    a = speechlike(2.0)
    wav = tmp_path / "a.wav"
    sf.write(wav, a, 16000)
    boosted = vr_model.transcribe(str(wav), hotwords=[">", "0K"], boost=3.0)
    plain = vr_model.transcribe(str(wav))
    assert boosted.text != plain.text
    (tmp_path / "words.txt").write_text("# my words\n>\n0K  # a code\n\n")
    for extra in (["--hotwords", ">,0K", "--boost", "3"],
                  ["--hotwords-file", str(tmp_path / "words.txt"), "--boost", "3"]):
        r = run("mlx_speech.transcribe", str(wav), "--model", str(vr_dir), *extra)
        assert r.returncode == 0, r.stderr
        assert r.stdout == boosted.text + "\n"
    r = run("mlx_speech.transcribe", str(wav), "--model", str(vr_dir), "--hotwords", ">,0K",
            "--boost", "0")
    assert r.returncode == 0 and r.stdout == plain.text + "\n"
    for extra, needle in ((["--boost", "2"], "--boost needs"),
                          (["--hotwords", "x", "--boost", "nan"], "boost must be"),
                          (["--hotwords-file", str(tmp_path / "none.txt")], "cannot read")):
        r = run("mlx_speech.transcribe", str(wav), "--model", str(vr_dir), *extra)
        assert r.returncode == 1 and needle in r.stderr and "Traceback" not in r.stderr


def test_live_words_prints_the_models_word_times(vr_model, nemotron, audio):
    from mlx_speech.transcribe import LiveLines, _clock

    for model, x in ((nemotron, audio), (vr_model, speechlike(3.0))):
        ref = model.transcribe(x)
        out = []
        lines = LiveLines(model, {}, out.append, words=True)
        for i in range(0, len(x), 1280):
            lines.feed(x[i: i + 1280])
        lines.finish()
        text = "".join(out)
        want = " ".join(f"[{_clock(w.start)}-{_clock(w.end)}] {w.text}" for w in ref.words)
        if ref.words:
            assert text.endswith("\n  " + want + "\n")
        plain = []
        lines = LiveLines(model, {}, plain.append)
        lines.feed(x)
        lines.finish()
        assert "".join(plain) == text[: len("".join(plain))] and "[" not in "".join(plain)
    assert nemotron.transcribe(audio).words  # the check above ran on real words


def test_spm_encoder_from_a_unigram_tokenizer_json(tmp_path):
    """A transformers tokenizer.json (Unigram: [piece, score] in id order) encodes as the
    .model it came from (texts without runs of spaces: its normalizer is not read)."""
    src = SentencePieceDecoder.from_file(GOLDEN / "boosting" / "unigram.model")
    vocab = [[p, sc] for (p, _), sc in zip(src.pieces, src.encoding["scores"], strict=True)]
    tj = {"model": {"type": "Unigram", "vocab": vocab, "unk_id": 0},
          "added_tokens": [{"id": 0, "content": src.pieces[0][0], "special": True}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    tk = SentencePieceDecoder.from_file(tmp_path / "tokenizer.json")
    texts = list(B["spm_texts"])
    want = json.loads(str(B["spm_unigram"]))
    for t, ids in zip(texts, want, strict=True):
        if "  " not in t and t == t.strip() and "K" not in t:
            assert tk.encode(t) == ids
