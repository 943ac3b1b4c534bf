"""The speech tab's "Speak as I type", in a real browser: the text goes to the server as it is
typed, the first sentence is heard before the rest is typed, Enter says the rest, and what the
page plays is exactly `stream_text`'s audio for the typed text; Stop (barge-in) plays nothing
after it."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("websockets")

from tests.support.server import pcm16  # noqa: E402
from tests.support.voxtral import joined  # noqa: E402
from tests.web.helpers_fixtures import KEY, browser, models, site  # noqa: E402, F401
from tests.web.helpers_page import WAIT_MS, open_page, panel, played  # noqa: E402
from tests.web.helpers_page import wait_state as _state  # noqa: E402

FIRST = "Hello there. "
REST = "How are you doing on this fine day? I am well"
PLAYED = "window.__played.reduce((a, p) => a + p.x.length, 0)"


def _tap_frames(page) -> list[dict]:
    """The JSON messages the page sends on its WebSockets."""
    sent = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda f: sent.append(json.loads(
        f if isinstance(f, str) else f["payload"]))))
    return sent


def test_speak_as_you_type(browser, site, models):  # noqa: F811
    tts = models["voxtral-tts"]
    kw = dict(voice="neutral_female", seed=5, max_frames=12)
    ref = pcm16(joined(tts.stream_text(FIRST + REST, first_frames=4, chunk_frames=4, **kw)))
    ctx, page = open_page(browser, site.base, KEY)
    sent = _tap_frames(page)
    sel = panel(page, "voxtral-tts")
    page.select_option(f"{sel} [data-el=voice]", kw["voice"])
    page.fill(f"{sel} [data-el=seed]", str(kw["seed"]))
    page.fill(f"{sel} [data-el=maxlen]", str(kw["max_frames"] * 0.08))
    page.check(f"{sel} [data-el=live]")
    _state(page, sel, "listening")
    box = f"{sel} [data-el=text]"
    page.type(box, FIRST, delay=40)
    # heard while the rest is not typed yet: synthesis started at the sentence end
    page.wait_for_function(f"() => {PLAYED} > 0", timeout=WAIT_MS)
    page.type(box, REST, delay=40)
    page.press(box, "Enter")  # says the rest
    page.wait_for_function(f"() => {PLAYED} >= {len(ref)}", timeout=WAIT_MS)
    page.wait_for_selector(f"{sel} [data-el=result]:not([hidden])", timeout=WAIT_MS)
    got = np.round(played(page)["samples"].astype(np.float64) * 32768).astype(np.int32)
    assert np.array_equal(got, ref.astype(np.int32))
    appends = [e["text"] for e in sent if e["type"] == "input_text.append"]
    assert "".join(appends) == FIRST + REST and len(appends) > 10  # as typed, not at the end
    assert [e["type"] for e in sent].count("input_text.flush") == 1
    assert "first audio" in page.text_content(f"{sel} [data-el=status]")
    # barge-in: Stop after the first audio of a long sentence; nothing is played after it
    n0 = page.evaluate(PLAYED)
    page.type(box, "This one goes on and on, and it will be stopped. ", delay=5)
    page.wait_for_function(f"() => {PLAYED} > {n0}", timeout=WAIT_MS)
    page.click(f"{sel} [data-el=stop]")
    n1 = page.evaluate(PLAYED)
    page.wait_for_function("s => document.querySelector(s).textContent === 'Stopped.'",
                           arg=f"{sel} [data-el=status]", timeout=WAIT_MS)
    assert page.evaluate(PLAYED) == n1 and sent[-1]["type"] == "speech.cancel"
    _state(page, sel, "listening")
    page.uncheck(f"{sel} [data-el=live]")
    _state(page, sel, "idle")
    assert page.errors == []
    ctx.close()
