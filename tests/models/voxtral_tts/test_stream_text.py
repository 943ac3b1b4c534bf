"""Text in as it comes: where text is cut (the same places whatever the pieces), audio from
pieces equals audio from the whole text and from its sentences one by one, the first audio
comes while the text is still arriving, cancel stops at once."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

import mlx_speech.models.voxtral_tts as vt
from mlx_speech.errors import MlxSpeechError
from mlx_speech.models.voxtral_tts.text import Segmenter, segments
from tests.support.voxtral import joined
from tests.support.voxtral import load_ending_tts as load_ending

TEXT = ('Hello there! This is a test, with a clause. "Quoted." And then, after a long run of '
        "words that goes on, and on, we cut here; at 3.5 million. Mr. Smith\n\nA new paragraph "
        "without an end\n\nOK \u4f60\u597d\u3002\u4e16\u754c\uff01 the end")


@pytest.fixture(scope="module")
def tts():
    return load_ending()


def _pieces(text: str, seed: int, largest: int = 30):
    rng = random.Random(seed)
    i = 0
    while i < len(text):
        n = rng.randint(1, largest)
        yield text[i: i + n]
        i += n


def test_segments():
    assert segments(TEXT, clause_words=6) == [
        "Hello there!", "This is a test, with a clause.", '"Quoted."',
        "And then, after a long run of words that goes on,",  # 6 words at a clause mark
        "and on, we cut here; at 3.5 million.", "Mr.", "Smith.", "A new paragraph without an end.",
        "OK \u4f60\u597d\u3002", "\u4e16\u754c\uff01", "the end."]
    assert segments(TEXT, clause_words=None)[3] == (
        "And then, after a long run of words that goes on, and on, we cut here; at 3.5 million.")
    long = segments("word " * 50, max_chars=40)
    assert all(len(s) <= 41 for s in long) and " ".join(long).count("word") == 50
    assert segments("\u200b ... \n\n!!", clause_words=None) == []
    assert segments("no end") == ["no end."] and segments("") == []


@pytest.mark.parametrize("clause_words,max_chars", [(None, 400), (3, 40), (6, 16), (12, 400)])
def test_segments_do_not_depend_on_the_pieces(clause_words, max_chars):
    whole = segments(TEXT, clause_words, max_chars)
    for seed in range(40):
        seg = Segmenter(clause_words, max_chars)
        got = [s for p in _pieces(TEXT, seed, largest=[1, 3, 30][seed % 3]) for s in seg.feed(p)]
        assert got + seg.finish() == whole, seed


def test_pieces_equal_whole_text_and_its_sentences(tts):
    """Sent in 1-30 character pieces (read on the helper thread while frames run), as one
    string, or each sentence spoken on its own by `stream` with seed + j: the same samples."""
    text = "Hi there! One more voice here, with a clause. Third one. And the last"
    kw = dict(voice="neutral_female", seed=4, max_frames=9)
    whole = joined(tts.stream_text(text, **kw))
    for seed in range(3):
        got = joined(tts.stream_text(_pieces(text, seed), **kw))
        assert np.array_equal(got, whole), seed
    pause = np.zeros(round(vt.PAUSE_S * tts.sample_rate), np.float32)
    ref = []
    for j, sentence in enumerate(segments(text)):
        ref += [pause] * bool(j) + [joined(tts.stream(sentence, "neutral_female", 4 + j, 9))]
    assert len(ref) == 7 and np.array_equal(np.concatenate(ref), whole)


def test_first_audio_comes_while_text_is_arriving(tts):
    """The source sends one sentence and waits until that sentence is heard."""
    heard, waited = threading.Event(), []

    def source():
        yield "Hi there. And then"
        waited.append(heard.wait(60))
        yield " the rest."

    chunks = []
    for a in tts.stream_text(source(), seed=1, max_frames=6):
        chunks.append(a)
        heard.set()
    assert waited == [True]
    first = tts.stream("Hi there.", seed=1, max_frames=6)
    assert np.array_equal(chunks[0].samples, next(first).samples)


def test_should_stop_and_close_stop_at_once(tts, monkeypatch):
    calls = []
    plain = tts.decode_frame
    monkeypatch.setattr(tts, "decode_frame",
                        lambda *a: (calls.append(1), plain(*a))[1])
    stop = []
    it = tts.stream_text(iter(["One more voice here. ", "Hi there."]), seed=2, max_frames=30,
                         should_stop=lambda: bool(stop))
    next(it)
    n = len(calls)
    stop.append(True)
    assert list(it) == [] and len(calls) == n  # no frame after the stop
    it = tts.stream_text(_pieces("One more voice here. " * 3, 0), seed=2, max_frames=30)
    next(it)
    n = len(calls)
    it.close()
    assert len(calls) == n


def test_source_errors_reach_the_caller(tts):
    def broken():
        yield "Hi there. "
        raise ValueError("the LLM went away")

    with pytest.raises(ValueError, match="went away"):
        list(tts.stream_text(broken(), max_frames=4))
    with pytest.raises(MlxSpeechError, match="pieces must be strings"):
        list(tts.stream_text(iter(["Hi.", 3]), max_frames=4))
    with pytest.raises(MlxSpeechError, match="nothing to say"):
        list(tts.stream_text(iter(["  ", "...", "\n"]), max_frames=4))
    with pytest.raises(MlxSpeechError, match="unknown voice"):
        next(tts.stream_text("Hi.", voice="nobody"))


def test_session_speaks_text_fed_from_another_thread(tts):
    """The lower-level form a server drives: feed from one thread, step from another."""
    s = tts.session(seed=4, max_frames=9, clause_words=None)
    text = "Hi there! One more voice here, with a clause. Third one."

    def feed():
        for p in _pieces(text, 1):
            s.feed(p)
        s.finish()

    t = threading.Thread(target=feed)
    t.start()
    out = []
    while not s.done:
        if s.ready:
            out.append(s.step())
        else:
            s.wait(1.0)
    t.join(60)
    assert s.segments == s.segments_done == 3
    assert s.chars_done == sum(map(len, segments(text, None))) == len(text) - 2
    assert np.array_equal(joined(out), joined(tts.stream_text(text, seed=4, max_frames=9,
                                                               clause_words=None)))
