"""Screenshots of the server's page for the README: docs/web/{key,asr,tts,duplex}.png.

    python docs/web/screenshots.py      # from the repository root; needs the dev extra and chromium

The server runs the tests' tiny random-weight checkpoints (so the text is gibberish) and
chromium's microphone plays a synthetic speech-like sound; every panel is driven the way a
person would (the key typed into its dialog, buttons clicked) before it is captured.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

KEY = "screenshot-key"


def main() -> None:
    import soundfile as sf
    from playwright.sync_api import sync_playwright

    from mlx_speech.audio.resample import resample
    from tests.conftest import speechlike
    from tests.support.server import ServerThread
    from tests.web.helpers_page import browser_missing, launch, open_page, panel, tiny_models

    if why := browser_missing():
        sys.exit(f"screenshots.py {why}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tiny = tiny_models(tmp)
        models = {"nemotron-tiny-random": tiny["nemotron"],
                  "voxtral-tts-tiny-random": tiny["voxtral-tts"],
                  "personaplex-tiny-random": tiny["personaplex"]}
        mic = tmp / "mic.wav"
        sf.write(mic, resample(speechlike(4.0, seed=21), 16000, 48000), 48000, subtype="PCM_16")
        clip = tmp / "interview.wav"
        sf.write(clip, speechlike(3.0, seed=3), 16000)
        with ServerThread(models, api_key=KEY) as srv, sync_playwright() as p:
            browser = launch(p, mic)

            ctx, page = open_page(browser, srv.base)
            page.wait_for_selector("#key-dialog[open]")
            page.fill("#key-input", "••••••")
            page.screenshot(path=OUT / "key.png")
            ctx.close()

            ctx, page = open_page(browser, srv.base, KEY, viewport=(1100, 900))
            sel = panel(page, "nemotron-tiny-random")
            page.set_input_files(f"{sel} [data-el=file]", clip)
            page.click(f"{sel} [data-el=go]")
            page.wait_for_selector(f"{sel} [data-el=fstate]:has-text('done')", timeout=60000)
            page.click(f"{sel} [data-el=mic]")
            page.wait_for_selector(f"{sel} [data-el=state][data-state=recording]")
            page.wait_for_timeout(2500)
            page.screenshot(path=OUT / "asr.png", full_page=True)
            page.click(f"{sel} [data-el=mic]")
            ctx.close()

            ctx, page = open_page(browser, srv.base, KEY, viewport=(1100, 560))
            sel = panel(page, "voxtral-tts-tiny-random")
            page.fill(f"{sel} [data-el=seed]", "7")
            page.click(f"{sel} [data-el=speak]")
            page.wait_for_selector(f"{sel} [data-el=result]:not([hidden])", timeout=60000)
            page.wait_for_timeout(300)
            page.screenshot(path=OUT / "tts.png", full_page=True)
            ctx.close()

            ctx, page = open_page(browser, srv.base, KEY, viewport=(1100, 760))
            sel = panel(page, "personaplex-tiny-random")
            page.select_option(f"{sel} [data-el=preset]", "Help desk")
            page.click(f"{sel} [data-el=start]")
            page.wait_for_selector(f"{sel} [data-el=state][data-state=speaking]", timeout=60000)
            page.wait_for_timeout(4000)
            page.wait_for_selector(f"{sel} [data-el=state][data-state=speaking]", timeout=60000)
            page.screenshot(path=OUT / "duplex.png", full_page=True)
            page.click(f"{sel} [data-el=stop]")
            ctx.close()
            browser.close()
    for name in ("key", "asr", "tts", "duplex"):
        print(OUT / f"{name}.png")


if __name__ == "__main__":
    main()
