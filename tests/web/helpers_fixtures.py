"""The browser tests' module-scoped fixtures, shared by tests/web/test_web.py and
tests/web/test_web_vocabulary.py (each imports them, so each module gets its own): the tiny served
models, the server serving them with taps, and headless chromium whose microphone plays
speech-like sound."""

from __future__ import annotations

import pytest
import soundfile as sf

from mlx_speech.audio.resample import resample
from tests.conftest import speechlike
from tests.support.server import ServerThread
from tests.web.helpers_page import Taps, browser_missing, launch, tiny_models

KEY = "web-test-key"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_models(tmp_path_factory.mktemp("web"))


@pytest.fixture(scope="module")
def site(models):
    with ServerThread(models, api_key=KEY) as s:
        s.taps = Taps(s.engine)
        yield s


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    why = browser_missing()
    if why:
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    mic = tmp_path_factory.mktemp("mic") / "mic.wav"  # speech-like sound, looped by chromium
    sf.write(mic, resample(speechlike(4.0, seed=21), 16000, 48000), 48000, subtype="PCM_16")
    with sync_playwright() as p:
        b = launch(p, mic)
        yield b
        b.close()
