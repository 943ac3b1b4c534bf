"""The page's language picker, in a real browser, on the tiny Nemotron 3.5 model: offered from
`/v1/models`' `languages` (and not for a model that takes none), the chosen language reaching
the live session and the file transcription (each transcript the library's in that language),
and the language the model heard shown; no sideways scroll on a phone with the picker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("websockets")

from tests.support.server import ServerThread, tiny_language_models  # noqa: E402
from tests.web.helpers_fixtures import KEY, browser  # noqa: E402, F401
from tests.web.helpers_page import WAIT_MS, Taps, live_turn, open_page, panel  # noqa: E402

GOLDEN = Path(__file__).parents[1] / "golden"


@pytest.fixture(scope="module")
def models():
    return tiny_language_models("nemotron")


@pytest.fixture(scope="module")
def site(models):
    with ServerThread(models, api_key=KEY) as s:
        s.taps = Taps(s.engine)
        yield s


def test_picker_offers_the_models_languages(browser, site):  # noqa: F811
    ctx, page = open_page(browser, site.base, KEY)
    sel = panel(page, "n35")
    page.wait_for_selector(f"{sel} [data-el=langbox]:not([hidden])")
    options = page.eval_on_selector_all(f"{sel} [data-el=language] option",
                                        "os => os.map(o => [o.value, o.textContent])")
    assert options == [["", "Model default"], ["auto", "Detect the language (auto)"],
                       ["en-US", "English (United States) · en-US"],
                       ["fr-FR", "French (France) · fr-FR"],
                       ["de-DE", "German (Germany) · de-DE"],
                       ["es-ES", "Spanish (Spain) · es-ES"]]
    sel_en = panel(page, "nemotron")  # the English Nemotron takes none: no picker
    assert page.locator(f"{sel_en} [data-el=langbox]").is_hidden()
    assert page.errors == []
    ctx.close()


def test_live_turn_in_the_chosen_language(browser, site, models):  # noqa: F811
    ctx, page = open_page(browser, site.base, KEY)
    sel = panel(page, "n35")
    page.select_option(f"{sel} [data-el=language]", "fr-FR")
    text, heard = live_turn(page, sel, site.taps)
    m = models["n35"]
    ref = m.transcribe(heard, language="fr-FR")
    assert text == ref.text and ref.text
    assert ref.text != m.transcribe(heard, language="de").text  # the language reached it
    assert page.get_attribute(f"{sel} p.turn", "data-language") == "fr-FR"
    assert page.text_content(f"{sel} [data-el=heard]") == "Heard: French (France)"
    assert page.errors == []
    ctx.close()


def test_file_in_the_chosen_language_and_auto(browser, site, models, tmp_path):  # noqa: F811
    audio = np.load(GOLDEN / "nemotron35" / "golden.npz")["audio"]
    clip = tmp_path / "guten.wav"
    sf.write(clip, audio, 16000, subtype="PCM_16")  # the golden's samples, exactly
    x = audio.astype(np.float32) / 32768
    m = models["n35"]
    ctx, page = open_page(browser, site.base, KEY)
    sel = panel(page, "n35")
    page.set_input_files(f"{sel} [data-el=file]", str(clip))
    for lang, name in (("es-ES", "Spanish (Spain)"), ("auto", "German (Germany)")):
        page.select_option(f"{sel} [data-el=language]", lang)
        page.click(f"{sel} [data-el=go]")
        page.wait_for_selector(f"{sel} [data-el=fstate][data-state=idle]:has-text('done')",
                               timeout=WAIT_MS)
        ref = m.transcribe(x, language=lang)
        words = page.locator(f"{sel} .words .word").all_text_contents()
        assert words == [w.text for w in ref.words] and words, lang
        assert page.text_content(f"{sel} [data-el=elapsed]").endswith(f", {name}")
        page.set_input_files(f"{sel} [data-el=file]", str(clip))  # ready for the next run
    assert m.transcribe(x, language="es-ES").text != m.transcribe(x, language="auto").text
    assert page.errors == []
    ctx.close()


def test_no_sideways_scroll_on_a_phone_with_the_picker(browser, site):  # noqa: F811
    ctx, page = open_page(browser, site.base, KEY, viewport=(320, 740))
    panel(page, "n35")
    page.wait_for_selector("section.panel[data-model='n35'] [data-el=langbox]:not([hidden])")
    sw, cw = page.evaluate("[document.scrollingElement.scrollWidth, "
                           "document.scrollingElement.clientWidth]")
    assert sw <= cw
    ctx.close()
