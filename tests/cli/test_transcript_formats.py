import json

import pytest

from mlx_speech.errors import MlxSpeechError
from mlx_speech.transcript import (
    Segment,
    format_json,
    format_srt,
    format_txt,
    format_vtt,
    write_transcript,
)

SEGS = [
    Segment(0.0, 2.5004, " Hello there. "),
    Segment(3599.9996, 3723.4567, "Second\n\nline"),
]
TEXT = " Hello there. Second line "


def test_srt_exact():
    assert format_srt(SEGS) == (
        "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n"
        "\n"
        "2\n01:00:00,000 --> 01:02:03,457\nSecond\nline\n"
    )


def test_vtt_exact():
    assert format_vtt(SEGS) == (
        "WEBVTT\n"
        "\n"
        "00:00:00.000 --> 00:00:02.500\nHello there.\n"
        "\n"
        "01:00:00.000 --> 01:02:03.457\nSecond\nline\n"
    )
    assert format_vtt([]) == "WEBVTT\n"


def test_rounding_half_up_and_long_hours():
    (cue,) = format_srt([Segment(59.9995, 360000.0015, "x")]).splitlines()[1:2]
    assert cue == "00:01:00,000 --> 100:00:00,002"
    # 62.5 ms is exact in binary: half up gives 063 (round() would give 062)
    assert format_vtt([Segment(0.0625, 1.0, "x")]).splitlines()[2].startswith(
        "00:00:00.063 -->"
    )
    assert format_srt([Segment(-0.2, 0.0004, "x")]).splitlines()[1] == (
        "00:00:00,000 --> 00:00:00,000"
    )


def test_txt():
    assert format_txt(TEXT) == "Hello there. Second line\n"


def test_json():
    data = json.loads(format_json(TEXT, SEGS, {"language": "en", "model": "m"}))
    assert data == {
        "text": "Hello there. Second line",
        "segments": [
            {"start": 0.0, "end": 2.5, "text": "Hello there."},
            {"start": 3600.0, "end": 3723.457, "text": "Second\n\nline"},
        ],
        "language": "en",
        "model": "m",
    }
    assert "ü" in format_json("grüß", [])  # utf-8, not \u escapes


@pytest.mark.parametrize("fmt", ["txt", "json", "srt", "vtt"])
def test_write_transcript_to_file_and_string(tmp_path, fmt):
    s = write_transcript(fmt, TEXT, SEGS, None)
    out = tmp_path / f"t.{fmt}"
    assert write_transcript(fmt, TEXT, SEGS, str(out)) == s
    assert out.read_text(encoding="utf-8") == s


def test_write_transcript_errors(tmp_path):
    with pytest.raises(MlxSpeechError, match="unknown output format 'docx'"):
        write_transcript("docx", TEXT, SEGS, None)
    with pytest.raises(MlxSpeechError, match="cannot write"):
        write_transcript("txt", TEXT, SEGS, str(tmp_path / "no" / "t.txt"))
