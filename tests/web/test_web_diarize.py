"""The page with a server started with --diarizer: file transcription shows one line per
speaker turn, coloured by speaker (OpenAI's diarized_json), and a live turn is labelled with
its speaker; with no diarizer nothing changes (the other browser tests). Debian's chromium
driven by Playwright; tiny Nemotron and tiny Sortformer; the three-voice espeak-ng clip."""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile as sf

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import mlx_speech  # noqa: E402
from mlx_speech.audio.resample import resample  # noqa: E402
from tests.support.server import ServerThread  # noqa: E402
from tests.web.helpers_page import browser_missing, launch, open_page, panel  # noqa: E402

KEY = "web-diar-key"
GOLDEN = Path(__file__).parents[1] / "golden"
AUDIO = Path(__file__).parents[1] / "data" / "voices_3spk.wav"
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    why = browser_missing()
    if why:
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    asr = mlx_speech.load(GOLDEN / "nemotron")
    diar = mlx_speech.load(GOLDEN / "sortformer" / "tiny.nemo")
    x, _ = sf.read(AUDIO, dtype="float32")
    mic = tmp_path_factory.mktemp("mic") / "mic.wav"
    sf.write(mic, resample(x, 16000, 48000), 48000, subtype="PCM_16")
    with ServerThread({"nemotron": asr}, api_key=KEY, diarizer=diar) as srv, \
            sync_playwright() as p:
        b = launch(p, mic)
        yield srv, asr, diar, x, b
        b.close()


def test_file_transcription_shows_speaker_coloured_lines(setup, tmp_path):
    from mlx_speech.diarize import diarize_result

    srv, asr, diar, x, browser = setup
    d = diarize_result(asr.transcribe(x), x, diar)
    clip = tmp_path / "voices.wav"
    sf.write(clip, x, 16000, subtype="FLOAT")
    ctx, page = open_page(browser, srv.base, KEY)
    sel = panel(page, "nemotron")
    page.set_input_files(f"{sel} [data-el=file]", clip)
    page.click(f"{sel} [data-el=go]")
    page.wait_for_selector(f"{sel} [data-el=fstate][data-state=idle]:has-text('done')",
                           timeout=WAIT_MS)
    lines = page.locator(f"{sel} [data-el=speakers] p.speaker")
    letters = {}
    for s in d.segments:
        letters.setdefault(s.speaker, chr(ord("A") + len(letters)))
    assert lines.evaluate_all("ps => ps.map(p => p.dataset.speaker)") == [
        letters[s.speaker] for s in d.segments]
    assert [t.split(": ", 1)[1] for t in lines.all_text_contents()] == [
        s.text for s in d.segments]
    colours = lines.evaluate_all(
        "ps => ps.map(p => getComputedStyle(p).borderLeftColor)")
    by_speaker = {}
    for s, c in zip(d.segments, colours, strict=True):
        by_speaker.setdefault(s.speaker, set()).add(c)
    assert all(len(v) == 1 for v in by_speaker.values())  # one colour per speaker
    assert len({next(iter(v)) for v in by_speaker.values()}) == len(by_speaker) >= 2
    assert page.errors == []
    ctx.close()


def test_live_turn_is_labelled_with_its_speaker(setup):
    srv, asr, diar, x, browser = setup
    ctx, page = open_page(browser, srv.base, KEY)
    sel = panel(page, "nemotron")
    page.click(f"{sel} [data-el=mic]")
    page.wait_for_selector(f"{sel} [data-el=state][data-state=recording]", timeout=WAIT_MS)
    page.wait_for_timeout(4000)
    page.click(f"{sel} [data-el=mic]")
    page.wait_for_selector(f"{sel} [data-el=state][data-state=idle]", timeout=WAIT_MS)
    turn = page.locator(f"{sel} p.turn")
    assert len(turn.text_content()) > 12  # the tiny model says something on the voices
    assert turn.get_attribute("data-speaker").startswith("Speaker ")
    assert "speaker" in turn.get_attribute("class")
    assert turn.locator("b.who").text_content().startswith("Speaker ")
    assert page.errors == []
    ctx.close()
