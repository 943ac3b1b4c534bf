"""The page's vocabulary box and confidence shading, in a real browser: the live turn is the
boosted transcript of what the server received, its low-confidence words are shaded from the
model's own logprobs, and its text stays the transcript."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("websockets")

from tests.web.helpers_fixtures import KEY, browser, models, site  # noqa: E402, F401
from tests.web.helpers_page import live_turn, open_page, panel  # noqa: E402

PHRASES = "quick brown, time"
# strong enough that the boosted transcript differs from the plain one for whatever the fake
# microphone delivered (at 3, 2 of 20 random cuts of its sound came out unchanged; at 10, 0 of 80)
BOOST = "10"


def test_live_vocabulary_and_low_confidence_shading(browser, site, models):  # noqa: F811
    ctx, page = open_page(browser, site.base, KEY)
    sel = panel(page, "nemotron")
    page.fill(f"{sel} [data-el=vocab]", PHRASES)
    page.fill(f"{sel} [data-el=boost]", BOOST)
    text, heard = live_turn(page, sel, site.taps)
    m = models["nemotron"]
    ref = m.transcribe(heard, hotwords=PHRASES, boost=float(BOOST), logprobs=True)
    assert text == ref.text and len(ref.text) > 10
    assert ref.text != m.transcribe(heard).text  # the vocabulary reached the session
    words = page.eval_on_selector_all(f"{sel} p.turn span.word",
                                      "ss => ss.map(s => [s.textContent, s.className])")
    assert [w for w, _ in words] == [w.text for w in ref.words]
    # shaded: the words whose least likely token is below 50 %, from the model's logprobs
    want, cur = [], None
    for tok, lp in zip(ref.token_ids, ref.logprobs, strict=True):
        b = m.tokenizer.token_bytes(tok).decode()
        if cur is not None and cur[0].strip() and b[:1].isspace():
            want.append(cur)
            cur = None
        cur = (b, lp) if cur is None else (cur[0] + b, min(cur[1], lp))
    want.append(cur)
    assert [c for _, c in words] == ["word low" if np.exp(lp) < 0.5 else "word"
                                     for _, lp in want]
    assert page.errors == []
    ctx.close()
