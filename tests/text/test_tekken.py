import base64
import json
import sys

import pytest

from mlx_speech.errors import CheckpointError
from mlx_speech.text.tekken import StreamingDetokenizer, Tekken
from tests.support.tekken import VOXTRAL_AUDIO, write_tekken

PIECES = [b"he", b"ll", b"llo", b"hello", b" w", b" wor", b"ld", b" world", b"\xc3\xa9"]
S = 1000


@pytest.fixture
def tok(tmp_path):
    write_tekken(tmp_path / "tekken.json", PIECES, audio=VOXTRAL_AUDIO)
    return Tekken.from_file(tmp_path / "tekken.json")


def test_layout(tok):
    assert tok.num_special == S
    assert tok.vocab_size == S + 256 + len(PIECES)
    assert tok.special_id("<s>") == 1 and tok.special_id("</s>") == 2
    assert tok.special_id("[AUDIO]") == 24 and tok.special_id("[BEGIN_AUDIO]") == 25
    assert tok.special_id("[STREAMING_PAD]") == 32
    assert tok.special_id("[STREAMING_WORD]") == 33
    assert tok.special_id("<SPECIAL_999>") == 999
    assert tok.is_special(0) and tok.is_special(999) and not tok.is_special(1000)
    assert tok.token_bytes(1) == b""
    assert tok.token_bytes(S + ord("a")) == b"a"
    assert tok.token_bytes(S + 256 + 3) == b"hello"
    assert tok.audio["streaming_n_left_pad_tokens"] == 32
    assert tok.audio["audio_encoding_config"]["hop_length"] == 160
    with pytest.raises(IndexError):
        tok.token_bytes(tok.vocab_size)


def test_missing_special_is_checkpoint_error(tok):
    with pytest.raises(CheckpointError, match=r"\[NOPE\]"):
        tok.special_id("[NOPE]")


def test_decode_drops_specials(tok):
    ids = [1, S + 256 + 3, 32, S + 256 + 7, 33, 2]
    assert tok.decode(ids) == "hello world"
    assert tok.decode([S + 0xC3]) == "\ufffd"


def test_encode_uses_merges(tok):
    assert tok.encode("hello world") == [S + 256 + 3, S + 256 + 7]
    assert tok.encode("hellow") == [S + 256 + 3, S + ord("w")]
    assert tok.encode("helo") == [S + 256 + 0, S + ord("l"), S + ord("o")]
    assert tok.encode("é") == [S + 256 + 8]
    assert tok.encode("") == []


@pytest.mark.parametrize(
    "text",
    [
        "hello world, Hello World! 12345 foo_bar\n\n  tabs\tand  spaces ",
        "café naïve — 日本語のテキスト, emoji 🎙️🙂 and Ünïcödé",
        "line1\r\nline2\n",
    ],
)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(S <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_without_regex_module_is_an_error_not_other_ids(tok, monkeypatch):
    # `re` has no \\p{L}: a look-alike pattern would silently change the ids (and the
    # TTS prompts); `regex` is a dependency, and its absence is a clear error
    monkeypatch.setitem(sys.modules, "regex", None)
    tok.__dict__.pop("_regex", None)
    with pytest.raises(CheckpointError, match="needs the regex module"):
        tok.encode("Grüße 42 x_y!  ")


def test_pieces_follow_the_pattern(tok):
    # "Hello" starts a new piece at the capital; digits are single pieces.
    assert tok._regex.findall("HelloWorld 123") == [
        "Hello",
        "World",
        " ",
        "1",
        "2",
        "3",
    ]


@pytest.mark.parametrize(
    "pieces, expected",
    [
        ([b"bc", b"ab"], [10 + ord("a"), 10 + 256]),
        ([b"ab", b"bc"], [10 + 256, 10 + ord("c")]),
    ],
)
def test_merges_lowest_rank_first(tmp_path, pieces, expected):
    # whichever pair has the lower rank wins, wherever it sits in the piece
    write_tekken(tmp_path / "t.json", pieces, num_special=10)
    assert Tekken.from_file(tmp_path / "t.json").encode("abc") == expected


def test_truncated_vocab(tmp_path):
    write_tekken(tmp_path / "t.json", PIECES, num_special=40, vocab_size=40 + 256 + 2)
    tok = Tekken.from_file(tmp_path / "t.json")
    assert tok.vocab_size == 40 + 258
    assert tok.encode("hello") == [40 + 256 + 0, 40 + 256 + 1, 40 + ord("o")]
    assert tok.audio == {}


def test_sparse_special_list_is_filled(tmp_path):
    write_tekken(tmp_path / "t.json", [], num_special=40)
    data = json.loads((tmp_path / "t.json").read_text())
    data["special_tokens"] = [s for s in data["special_tokens"] if s["rank"] in (1, 32)]
    (tmp_path / "t.json").write_text(json.dumps(data))
    tok = Tekken.from_file(tmp_path / "t.json")
    assert tok.num_special == 40
    assert (
        tok.special_id("[STREAMING_PAD]") == 32 and tok.special_id("<SPECIAL_5>") == 5
    )


@pytest.mark.parametrize(
    "content, match",
    [
        (None, "not found"),
        ("{not json", "cannot read"),
        ("[]", "not a Tekken"),
        ('{"config": {}}', "not a Tekken"),
        (
            json.dumps(
                {
                    "config": {
                        "default_vocab_size": 1010,
                        "default_num_special_tokens": 1000,
                    },
                    "vocab": [
                        {"rank": 0, "token_bytes": base64.b64encode(b"a").decode()}
                    ],
                }
            ),
            "not a Tekken",
        ),
    ],
)
def test_bad_files(tmp_path, content, match):
    path = tmp_path / "tekken.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(CheckpointError, match=match) as e:
        Tekken.from_file(path)
    assert "tekken.json" in str(e.value)


def test_streaming_detokenizer_holds_split_characters(tok):
    det = StreamingDetokenizer(tok)
    text = "hé🙂 日本"
    ids = [S + b for b in text.encode()]  # one byte per token
    out = []
    for i in ids:
        piece = det.add(i)
        assert "\ufffd" not in piece
        assert len(det._tail) <= 3
        out.append(piece)
    assert out[:2] == ["h", ""] and out[2] == "é"
    assert out[3:6] == ["", "", ""] and out[6] == "🙂"
    assert "".join(out) + det.flush() == text
    assert det.add(1) == ""  # specials add nothing


def test_streaming_detokenizer_flush_and_invalid(tok):
    det = StreamingDetokenizer(tok)
    assert det.add(S + 0xE6) == "" and det.add(S + 0x97) == ""
    assert det.flush() == "\ufffd"
    assert det.flush() == ""
    # an unfinished sequence interrupted by ASCII is replaced, not held forever
    det.add(S + 0xE6)
    assert det.add(S + ord("a")) == "\ufffda"
    # stray continuation bytes come out replaced at once
    assert det.add(S + 0x80) == "\ufffd"


def test_streaming_detokenizer_matches_decode(tok):
    det = StreamingDetokenizer(tok)
    text = "héllo wörld — 日本語 🎙️ end"
    ids = tok.encode(text)
    assert "".join(det.add(i) for i in ids) + det.flush() == tok.decode(ids) == text
