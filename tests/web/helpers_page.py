"""Shared by the browser tests (tests/test_web*.py, tests/web/helpers_fixtures.py) and
docs/web/screenshots.py: tiny served models, Debian's chromium driven by Playwright (no browser
download), taps on what the server received and on what the page handed to its audio graph, and
waits on the page's state badges."""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).parents[1] / "golden"
CHROMIUM = os.environ.get("MLX_SPEECH_CHROMIUM", "/usr/bin/chromium")
HEADLESS_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run"]
WAIT_MS = 60_000  # bound on every wait in the browser (never hit when things work)


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "needs the playwright package (the dev extra)"
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        return (f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium; or set "
                "MLX_SPEECH_CHROMIUM)")
    return None


def launch(playwright, fake_mic: Path):
    """Headless chromium whose microphone plays `fake_mic` (a wav, looped). Microphone
    permission is given per context (`permissions=["microphone"]`), so a context without it
    sees the browser's real denial."""
    return playwright.chromium.launch(
        executable_path=CHROMIUM, headless=True,
        args=[*HEADLESS_FLAGS, "--use-fake-device-for-media-stream",
              f"--use-file-for-fake-audio-capture={fake_mic}"])


def tiny_models(tmp: Path) -> dict[str, object]:
    """One tiny random-weight model of each kind: Nemotron (ASR), Voxtral TTS, a Kyutai-layout
    Moshi and a PersonaPlex with two voices."""
    from safetensors.numpy import save_file

    import mlx_speech
    from tests.support.moshi import VOICE_CACHE, tiny_kyutai_moshi, write_folder

    ky = tiny_kyutai_moshi(tmp / "moshi")
    pkw = json.loads((GOLDEN / "moshi" / "tiny_pp_config.json").read_text())
    pp = write_folder(tmp / "personaplex", pkw, GOLDEN / "moshi" / "tiny_pp.safetensors")
    (pp / "voices").mkdir()
    rng = np.random.default_rng(0)
    for name in ("NATF0", "NATM1"):
        save_file({"embeddings": (0.1 * rng.standard_normal((3, 1, 1, 16))).astype(np.float32),
                   "cache": VOICE_CACHE},
                  str(pp / "voices" / f"{name}.safetensors"))
    return {"nemotron": mlx_speech.load(GOLDEN / "nemotron"),
            "voxtral-tts": mlx_speech.load(GOLDEN / "voxtral_tts" / "ckpt"),
            "moshi": mlx_speech.load(ky), "personaplex": mlx_speech.load(pp)}


class Taps:
    """What the server received and when it finished, recorded on the engine's own calls:
    every accepted push of each live transcription and conversation (with the queue depth
    before it), and the time each speech job sent its last audio."""

    def __init__(self, engine):
        self.asr: list[dict] = []
        self.duplex: list[dict] = []
        self.speech: list[dict] = []
        from mlx_speech.server.jobs import AsrStream, Conversation
        from mlx_speech.server.speech import SpeechJob

        submit = engine.submit

        def tapped(stream, rec):
            push = stream.push

            def tapped_push(x):
                depth = stream.input.pending
                push(x)
                rec["pushed"].append(np.array(x, np.float32, copy=True))
                rec["depth"].append(depth)

            stream.push = tapped_push
            return stream

        def speech(job):
            rec = {"done_at": None}
            sink = job.sink

            def tsink(ev):
                if ev[0] == "done":
                    rec["done_at"] = time.time()
                sink(ev)

            self.speech.append(rec)
            job.sink = tsink
            return job

        def tapped_submit(job):
            if isinstance(job, (AsrStream, Conversation)):
                rec = {"pushed": [], "depth": []}
                (self.asr if isinstance(job, AsrStream) else self.duplex).append(rec)
                job = tapped(job, rec)
            elif isinstance(job, SpeechJob):
                job = speech(job)
            return submit(job)

        engine.submit = tapped_submit


# Records every buffer the page hands to the audio graph (AudioBufferSourceNode.start): the
# samples, the context time it is scheduled at and the wall-clock time it was handed over.
PAGE_TAPS = """(() => {
window.__played = [];
const start = AudioBufferSourceNode.prototype.start;
AudioBufferSourceNode.prototype.start = function (when, ...rest) {
  if (this.buffer) {
    window.__played.push({ t: Date.now(), when: when || 0, now: this.context.currentTime,
                           rate: this.buffer.sampleRate,
                           x: this.buffer.getChannelData(0).slice() });
  }
  return start.call(this, when, ...rest);
};
window.__playedExport = () => {
  const n = window.__played.reduce((a, p) => a + p.x.length, 0);
  const all = new Float32Array(n);
  let o = 0;
  for (const p of window.__played) { all.set(p.x, o); o += p.x.length; }
  const bytes = new Uint8Array(all.buffer);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return { b64: btoa(s), t: window.__played.map((p) => p.t),
           when: window.__played.map((p) => p.when), now: window.__played.map((p) => p.now),
           len: window.__played.map((p) => p.x.length),
           rate: window.__played.length ? window.__played[0].rate : 0 };
};
})();
"""


def played(page) -> dict:
    """What the page handed to its audio graph: samples (float32, joined), per buffer the
    wall-clock time it was handed over (t, s), the context time then (now) and the one it is
    scheduled at (when), its length; and the rate."""
    d = page.evaluate("window.__playedExport()")
    d["samples"] = np.frombuffer(base64.b64decode(d.pop("b64")), np.float32)
    d["t"] = [t / 1000 for t in d["t"]]
    return d


def open_page(browser, base: str, key: str | None = None, *, mic: bool = True,
              viewport=(1100, 820), hash_: str = "", init: str = ""):
    """A fresh context (no stored key) on the page, taps (and `init`, more script) installed;
    the key typed into the page's dialog when given. Returns (context, page)."""
    ctx = browser.new_context(permissions=["microphone"] if mic else [],
                              viewport={"width": viewport[0], "height": viewport[1]})
    ctx.add_init_script(PAGE_TAPS + init)
    page = ctx.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(base + "/" + hash_)
    if key is not None:
        page.wait_for_selector("#key-dialog[open]")
        page.fill("#key-input", key)
        page.click("#key-form button[type=submit]")
    return ctx, page


def panel(page, model: str) -> str:
    """The CSS selector of a model's panel (after clicking its tab)."""
    page.click(f"button.tab[data-model='{model}']")
    return f"section.panel[data-model='{model}']"


def live_turn(page, sel: str, taps: Taps, ms: int = 2500) -> tuple[str, np.ndarray]:
    """One live turn in the panel `sel`: Start, `ms` of the fake microphone, Stop. Returns the
    turn's text in the page and the samples the server received for it."""
    n0 = len(taps.asr)
    page.click(f"{sel} [data-el=mic]")
    wait_state(page, sel, "recording")
    page.wait_for_timeout(ms)
    page.click(f"{sel} [data-el=mic]")
    wait_state(page, sel, "idle")
    return page.text_content(f"{sel} p.turn"), np.concatenate(taps.asr[n0]["pushed"])


def wait_state(page, sel: str, *states: str, timeout: float = WAIT_MS):
    """Wait until the state badge in `sel` shows one of `states`."""
    css = ", ".join(f"{sel} [data-el=state][data-state={s}]" for s in states)
    page.wait_for_selector(css, timeout=timeout)
