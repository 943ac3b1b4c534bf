"""The page mlx_speech.server serves at `/`, in a real browser: Debian's chromium driven by
Playwright, its microphone a wav file. Each mode is checked against the library call it stands
for, on tiny random-weight checkpoints: live transcription against `transcribe()` of the samples
the server received, the speech the page plays against `generate()`, a 30 s conversation against
`session.step()` on what the server received; Kyutai's own web client (built elsewhere, named by
MLX_SPEECH_KYUTAI_CLIENT) converses with /api/chat. What the page needs from the server (its
files, the subprotocol answer, /api/chat's PCM format, the own-page origin) is also tested
without a browser."""

# The tests take the fixtures imported from tests/web/helpers_fixtures.py as arguments:
# ruff: noqa: F811
from __future__ import annotations

import asyncio
import fnmatch
import functools
import http.server
import json
import os
import re
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
websockets = pytest.importorskip("websockets")

import httpx  # noqa: E402
import soundfile as sf  # noqa: E402

from tests.conftest import speechlike  # noqa: E402
from tests.support.server import ServerThread, pcm16, run, wav_bytes  # noqa: E402
from tests.web.helpers_fixtures import KEY, browser, models, site  # noqa: E402, F401
from tests.web.helpers_page import WAIT_MS, Taps, open_page, panel, played  # noqa: E402
from tests.web.helpers_page import wait_state as _state  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "mlx_speech" / "server" / "web"
AUTH = {"Authorization": f"Bearer {KEY}"}
KYUTAI_CLIENT = "MLX_SPEECH_KYUTAI_CLIENT"


# ------------------------------------------------------------------ server side, no browser


def test_page_files_are_served_from_the_package_without_the_key(site):
    tomllib = pytest.importorskip("tomllib")
    names = sorted(p.name for p in WEB.iterdir())
    r = httpx.get(site.base + "/")
    assert r.status_code == 200 and r.text == (WEB / "index.html").read_text()
    assert r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    for n in names:
        r = httpx.get(f"{site.base}/web/{n}")
        assert r.status_code == 200 and r.content == (WEB / n).read_bytes(), n
    assert httpx.get(site.base + "/web/server.py").status_code == 404
    assert httpx.get(site.base + "/v1/models").status_code == 401  # the API still needs it
    # every file the page loads is one of these (same origin: nothing from a CDN, works
    # offline); the only URL in the files is the SVG namespace
    text = "\n".join((WEB / n).read_text() for n in names)
    refs = set()
    for pattern in (r'(?:src|href)="/web/([^"]+)"', r'from "\./([^"]+)"',
                    r'addModule\("/web/([^"]+)"\)'):
        refs |= set(re.findall(pattern, text))
    assert refs and refs <= set(names), refs - set(names)
    assert set(re.findall(r"https?://[\w-]+\.[\w./-]+", text)) == {"http://www.w3.org/2000/svg"}
    # shipped as package data
    st = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = st["package-data"]["mlx_speech.server"]
    assert all(any(fnmatch.fnmatch(f"web/{n}", g) for g in globs) for n in names)


def test_websockets_name_a_subprotocol_back(site):
    """Chromium fails a handshake whose answer names none of the offered subprotocols, and a
    page can only send the key as one: the server must answer with one (it did not)."""
    key = f"openai-insecure-api-key.{KEY}"

    async def answer(path, offered):
        async with websockets.connect(site.ws + path, subprotocols=offered) as ws:
            return ws.subprotocol

    assert run(answer("/v1/realtime", ["realtime", key])) == "realtime"
    # the key alone: never echoed back (it would sit in proxies' logs); the page always
    # offers its own protocol with it
    assert run(answer("/v1/realtime?intent=transcription", [key])) is None
    assert run(answer("/api/chat?model=moshi&format=pcm", ["mlx-speech", key])) == "mlx-speech"


def test_chat_pcm_format_equals_session_step(site, models):
    """/api/chat?format=pcm: raw 16-bit frames both ways; the bytes back are exactly the
    session's output for the frames sent, the text its text."""
    moshi = models["moshi"]
    F, n = moshi.frame_size, 10
    rng = np.random.default_rng(1)
    t = np.arange(n * F) / 24000
    user = pcm16(0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.standard_normal(n * F))
    session = moshi.session(seed=5)
    want_audio, want_text = b"", ""
    for i in range(n):
        out, text = session.step(user[i * F:(i + 1) * F].astype(np.float32) / 32768)
        want_audio += pcm16(out).tobytes()
        want_text += text

    async def talk():
        async with websockets.connect(site.ws + "/api/chat?model=moshi&format=pcm&seed=5",
                                      additional_headers=AUTH) as ws:
            assert await ws.recv() == b"\x00"
            for i in range(n):
                await ws.send(b"\x01" + user[i * F:(i + 1) * F].tobytes())
            await ws.send(b"\x01abc")  # odd length: an error, and the conversation goes on
            audio, text, errors = b"", "", []
            while len(audio) < len(want_audio) or len(text) < len(want_text) or not errors:
                m = await asyncio.wait_for(ws.recv(), 10)
                kind, body = m[:1], m[1:]
                if kind == b"\x01":
                    audio += body
                elif kind == b"\x02":
                    text += body.decode()
                else:
                    assert kind == b"\x05", m
                    errors.append(body.decode())
            return audio, text, errors

    audio, text, errors = run(talk())
    assert audio == want_audio and text == want_text and len(want_text) > 0
    assert errors == ["pcm audio must have an even number of bytes"]

    async def refused(query):
        async with websockets.connect(site.ws + "/api/chat" + query, additional_headers=AUTH) as ws:
            return await ws.recv()

    assert run(refused("?model=moshi&format=wav")) == b"\x05format must be opus or pcm"


def test_own_page_passes_the_origin_check(models):
    """With --allowed-origin set, the server's own page (reached by IP or localhost) still
    opens sockets; other pages, loopback or not, do not; host names never count as own (a
    DNS-rebound name would)."""
    from mlx_speech.server.app import _own_page

    with ServerThread({"nemotron": models["nemotron"]}, allowed_origins=["https://app.example"]
                      ) as s:
        async def hello(origin):
            async with websockets.connect(s.ws + "/v1/realtime", origin=origin) as ws:
                return json.loads(await ws.recv())["type"]

        assert run(hello(f"http://127.0.0.1:{s.port}")) == "session.created"
        assert run(hello("https://app.example")) == "session.created"
        for bad in ("http://127.0.0.1:1", "http://evil.example"):
            with pytest.raises(websockets.exceptions.InvalidStatus):
                run(hello(bad))
    assert _own_page("http://localhost:8000", "localhost:8000")
    assert _own_page("http://[::1]:8000", "[::1]:8000")
    assert not _own_page("http://evil.example:8000", "evil.example:8000")
    assert not _own_page("http://127.0.0.1:8000", "127.0.0.1:8001")


def test_models_list_what_the_page_needs(site):
    data = {m["id"]: m for m in httpx.get(site.base + "/v1/models", headers=AUTH).json()["data"]}
    assert {k: (m["kind"], m["sample_rate"], m.get("voices"), m.get("roles"))
            for k, m in data.items()} == {
        "nemotron": ("asr", 16000, None, None),
        "voxtral-tts": ("tts", 24000, ["casual_male", "neutral_female"], None),
        "moshi": ("duplex", 24000, [], False),
        "personaplex": ("duplex", 24000, ["NATF0", "NATM1"], True)}


def test_streamed_transcription_carries_words_when_asked(site):
    """An extension the page uses: stream=true with word timestamps asked for ends with the
    words in the done event, the same as verbose_json's."""
    files = {"file": ("a.wav", wav_bytes(speechlike(2.0, seed=3)))}
    form = {"model": "nemotron", "timestamp_granularities[]": "word"}
    url = site.base + "/v1/audio/transcriptions"
    verbose = httpx.post(url, files=files, headers=AUTH,
                         data={**form, "response_format": "verbose_json"}).json()
    r = httpx.post(url, files=files, headers=AUTH, data={**form, "stream": "true"})
    events = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
    assert events[-1]["type"] == "transcript.text.done" and len(verbose["words"]) > 2
    assert events[-1]["words"] == verbose["words"]
    plain = httpx.post(url, files=files, headers=AUTH, data={"model": "nemotron", "stream": "true"})
    assert '"words"' not in plain.text


# ------------------------------------------------------------------ the page in chromium


def test_page_without_the_key_gets_nothing_then_everything_with_it(browser, site):
    ctx, page = open_page(browser, site.base)
    page.wait_for_selector("#key-dialog[open]")
    assert page.locator("button.tab").count() == 0
    got = page.evaluate("""async (key) => {
      const socket = (protocols) => new Promise((res) => {
        const w = new WebSocket(`ws://${location.host}/v1/realtime`, protocols);
        w.onopen = () => { res("open " + w.protocol); w.close(); };
        w.onclose = (e) => res("closed " + e.code);
      });
      const models = await fetch("/v1/models");
      const speech = await fetch("/v1/audio/speech", { method: "POST",
        headers: { "Content-Type": "application/json" }, body: '{"input": "hi"}' });
      return [models.status, speech.status, await socket(["realtime"]),
              await socket(["realtime", "openai-insecure-api-key." + key])];
    }""", KEY)
    # without the key: 401s and a refused socket; with it the socket opens in a real browser
    assert got == [401, 401, "closed 1006", "open realtime"]
    page.fill("#key-input", "wrong")
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#key-error:has-text('did not accept')")
    page.fill("#key-input", KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("body[data-ready=true]")
    assert page.locator("button.tab").evaluate_all("ts => ts.map(t => t.dataset.model)") == [
        "nemotron", "voxtral-tts", "moshi", "personaplex"]
    # asked once: a reload finds the key
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    assert not page.is_visible("#key-dialog") and page.errors == []
    ctx.close()


def test_live_transcription_equals_transcribe_of_what_the_server_received(browser, site, models):
    ctx, page = open_page(browser, site.base, KEY)
    sel = panel(page, "nemotron")
    n0 = len(site.taps.asr)
    page.click(f"{sel} [data-el=mic]")
    _state(page, sel, "recording")
    # partial text while the microphone is still on
    page.wait_for_function("s => (document.querySelector(s)?.textContent || '').length > 3",
                           arg=f"{sel} p.turn.partial", timeout=WAIT_MS)
    partial = page.text_content(f"{sel} p.turn.partial")
    page.wait_for_timeout(1500)
    page.click(f"{sel} [data-el=mic]")
    _state(page, sel, "idle")
    text = page.text_content(f"{sel} p.turn")
    assert page.locator(f"{sel} p.partial").count() == 0
    rec = site.taps.asr[n0]
    heard = np.concatenate(rec["pushed"])
    assert len(heard) > 2 * 16000 and np.sqrt(np.mean(heard ** 2)) > 0.01  # the wav, not silence
    ref = models["nemotron"].transcribe(heard).text
    assert text == ref and len(ref) > 10 and ref.startswith(partial)
    assert page.errors == []
    ctx.close()


def test_file_transcription_words_and_subtitle_downloads(browser, site, models, tmp_path):
    from mlx_speech.transcribe import segments_from_words
    from mlx_speech.transcript import format_srt, format_vtt

    x = speechlike(2.0, seed=3)
    clip = tmp_path / "clip.wav"
    sf.write(clip, x, 16000, subtype="FLOAT")
    ref = models["nemotron"].transcribe(x)
    ctx, page = open_page(browser, site.base, KEY)
    sel = panel(page, "nemotron")
    page.set_input_files(f"{sel} [data-el=file]", clip)
    page.click(f"{sel} [data-el=go]")
    page.wait_for_selector(f"{sel} [data-el=fstate][data-state=idle]:has-text('done')",
                           timeout=WAIT_MS)
    words = page.locator(f"{sel} .word")
    assert words.all_text_contents() == [w.text for w in ref.words] and len(ref.words) > 2
    assert words.evaluate_all("ws => ws.map(w => [+w.dataset.start, +w.dataset.end])") == [
        [round(w.start, 3), round(w.end, 3)] for w in ref.words]
    segs = segments_from_words(ref.words)
    for fmt, want in (("srt", format_srt(segs)), ("vtt", format_vtt(segs)),
                      ("txt", ref.text + "\n")):
        with page.expect_download() as d:
            page.click(f"{sel} [data-el=dl-{fmt}]")
        assert d.value.suggested_filename == f"clip.{fmt}"
        assert Path(d.value.path()).read_text() == want, fmt
    assert page.errors == []
    ctx.close()


def test_speech_played_equals_generate_and_starts_before_it_ends(browser, site, models):
    tts = models["voxtral-tts"]
    text, seed, frames = "Hello there.", 7, 200
    ref = tts.generate(text, voice="neutral_female", seed=seed, max_frames=frames).samples
    ctx, page = open_page(browser, site.base, KEY)
    sel = panel(page, "voxtral-tts")
    page.fill(f"{sel} [data-el=text]", text)
    page.select_option(f"{sel} [data-el=voice]", "neutral_female")
    page.fill(f"{sel} [data-el=seed]", str(seed))
    page.fill(f"{sel} [data-el=maxlen]", str(frames * 0.08))
    n0 = len(site.taps.speech)
    page.click(f"{sel} [data-el=speak]")
    page.wait_for_selector(f"{sel} [data-el=result]:not([hidden])", timeout=WAIT_MS)
    p = played(page)
    want = pcm16(ref).astype(np.int32)
    got = np.round(p["samples"].astype(np.float64) * 32768).astype(np.int32)
    assert len(got) == len(want) and np.abs(got - want).max() <= 1
    # handed over in pieces as they came, each scheduled at the sample where the previous one
    # ends, unless that had already played when it came (the source was late: an underrun)
    rate = p["rate"]
    assert rate == 24000 and len(p["len"]) > 10
    starts, now = np.array(p["when"]), np.array(p["now"])
    ends = starts + np.array(p["len"]) / rate
    joined = np.abs(starts[1:] - ends[:-1]) < 0.5 / rate
    assert np.all(joined | (now[1:] > ends[:-1])), (starts, ends, now)
    assert joined.mean() > 0.5
    # the first piece was playing (handed over + the 0.1 s lead) before generation ended
    assert p["t"][0] + 0.1 < site.taps.speech[n0]["done_at"]
    # the download is what was played
    with page.expect_download() as d:
        page.click(f"{sel} [data-el=download]")
    wav, sr = sf.read(d.value.path(), dtype="int16")
    assert sr == 24000 and np.array_equal(wav.astype(np.int32), got)
    assert page.errors == []
    ctx.close()


def _duplex_reference(model, pushed, **session_kw):
    """session.step over the frames the server received: (pcm16 out, text)."""
    x = np.concatenate(pushed)
    F = model.frame_size
    assert len(x) % F == 0
    s = model.session(**session_kw)
    outs, text = [], ""
    for i in range(len(x) // F):
        out, t = s.step(x[i * F:(i + 1) * F])
        outs.append(out)
        text += t
    return pcm16(np.concatenate(outs)).astype(np.int32), text


WS_TAP = """(() => {
window.__ws = [];
const NativeSocket = window.WebSocket;
window.WebSocket = class extends NativeSocket {
  constructor(...args) {
    super(...args);
    const log = { url: this.url, sent: [], recv: [] };
    window.__ws.push(log);
    this.__log = log;
    this.addEventListener("message", (e) => {
      if (e.data instanceof ArrayBuffer) log.recv.push([Date.now(), new Uint8Array(e.data)[0]]);
    });
  }
  send(data) {
    if (data instanceof Uint8Array) this.__log.sent.push([Date.now(), data[0]]);
    return super.send(data);
  }
};
})();
"""


def test_conversation_30_s_both_ways_at_frame_rate(browser, site, models):
    """30 s hands-free with Moshi: frames go up and come back at 12.5 Hz, the lag between a
    frame sent and its answer does not grow, the server's queue stays empty, and the page's
    text and audio are exactly session.step() on the frames the server received."""
    ctx, page = open_page(browser, site.base, KEY, init=WS_TAP)
    sel = panel(page, "moshi")
    page.fill(f"{sel} [data-el=seed]", "11")
    n0 = len(site.taps.duplex)
    page.click(f"{sel} [data-el=start]")
    _state(page, sel, "listening", "speaking")
    page.wait_for_timeout(30_000)
    stats = page.text_content(f"{sel} [data-el=stats]")  # for the failure message
    page.click(f"{sel} [data-el=stop]")
    page.wait_for_selector(f"{sel} [data-el=state]:has-text('ended')", timeout=WAIT_MS)
    text = page.text_content(f"{sel} [data-el=text]")
    log = page.evaluate("window.__ws.find(w => w.url.includes('/api/chat'))")
    sent = np.array([t for t, k in log["sent"] if k == 1]) / 1000
    recv = np.array([t for t, k in log["recv"] if k == 1]) / 1000
    # both ways at 12.5 Hz over the 30 s
    for times in (sent, recv):
        assert len(times) > 0.9 * 30 * 12.5
        rate = (len(times) - 1) / (times[-1] - times[0])
        assert abs(rate - 12.5) < 0.6, rate
    # every frame sent was answered, in order; the lag stays bounded and its floor (what a
    # backlog would raise for good; a busy machine only adds passing spikes) does not grow
    assert len(recv) == len(sent)
    lag = recv - sent
    floor = [lag[i:i + 62].min() for i in range(0, len(lag) - 61, 62)]  # per 5 s
    assert floor[-1] - floor[0] < 0.08 and lag.max() < 3.0, (floor, lag.max())
    # the server's queue (what it received and had not stepped yet): its floor per 5 s does
    # not grow by more than a frame (a machine busy for long may keep it a frame behind for a
    # while; a backlog raises it for good) and it is never 2 s deep: it keeps up
    depth = np.array(site.taps.duplex[n0]["depth"])
    F = models["moshi"].frame_size
    floors = [int(depth[i:i + 62].min()) for i in range(0, len(depth) - 61, 62)]
    assert floors[-1] - floors[0] <= F and min(floors) == 0, (floors, depth)
    assert depth.max() < 25 * F, depth
    rec = site.taps.duplex[n0]
    want_audio, want_text = _duplex_reference(models["moshi"], rec["pushed"], seed=11)
    assert text == want_text and len(want_text) > 20
    # what the page played: the session's frames in order, within 1 LSB; a frame is skipped
    # only to stay live after a stall (the page counts those), never more than 10 %
    p = played(page)
    got = np.round(p["samples"].astype(np.float64) * 32768).astype(np.int32)
    frames = want_audio.reshape(-1, F)
    j = 0
    for chunk in np.split(got, np.cumsum(p["len"])[:-1]):
        assert len(chunk) == F
        while j < len(frames) and np.abs(chunk - frames[j]).max() > 1:
            j += 1
        assert j < len(frames), "the page played audio that is not the session's, in order"
        j += 1
    assert len(p["len"]) > 0.9 * len(frames), (len(p["len"]), len(frames), stats)
    assert page.errors == []
    ctx.close()


def test_personaplex_voice_and_role_pickers(browser, site, models):
    ctx, page = open_page(browser, site.base, KEY, init=WS_TAP)
    sel = panel(page, "personaplex")
    assert page.input_value(f"{sel} [data-el=voice]") == "NATF0"  # PersonaPlex's default
    page.select_option(f"{sel} [data-el=voice]", "NATM1")
    page.select_option(f"{sel} [data-el=preset]", "Help desk")
    role = page.input_value(f"{sel} [data-el=role]")
    assert role.startswith("You work at the help desk")
    page.fill(f"{sel} [data-el=seed]", "4")
    n0 = len(site.taps.duplex)
    page.click(f"{sel} [data-el=start]")
    _state(page, sel, "listening", "speaking")
    page.wait_for_timeout(2500)
    page.click(f"{sel} [data-el=stop]")
    page.wait_for_selector(f"{sel} [data-el=state]:has-text('ended')", timeout=WAIT_MS)
    url = page.evaluate("window.__ws.find(w => w.url.includes('/api/chat')).url")
    q = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert q == {"model": "personaplex", "format": "pcm", "seed": "4", "voice": "NATM1",
                 "role": role}
    _, want = _duplex_reference(models["personaplex"], site.taps.duplex[n0]["pushed"],
                                voice="NATM1", role=role, seed=4)
    assert page.text_content(f"{sel} [data-el=text]") == want and len(want) > 5
    ctx.close()


def test_errors_are_shown_in_the_page(browser, site, models):
    # a model the server does not serve, named in the address
    ctx, page = open_page(browser, site.base, KEY, hash_="#model=whisper-1")
    page.wait_for_selector("#banner:not([hidden])")
    assert "“whisper-1” is not served here" in page.text_content("#banner")
    assert "nemotron, voxtral-tts, moshi, personaplex" in page.text_content("#banner")
    # nothing to say
    sel = panel(page, "voxtral-tts")
    page.fill(f"{sel} [data-el=text]", "  ")
    page.click(f"{sel} [data-el=speak]")
    page.wait_for_selector(f"{sel} [data-el=error]:has-text('Type some text')")
    ctx.close()
    # the browser refuses the microphone
    ctx, page = open_page(browser, site.base, KEY, mic=False)
    for model, button in (("nemotron", "mic"), ("moshi", "start")):
        sel = panel(page, model)
        page.click(f"{sel} [data-el={button}]")
        _state(page, sel, "error")
        assert "permission was denied" in page.text_content(f"{sel} [data-el=error]")
    ctx.close()
    # the server goes away in the middle of a conversation
    with ServerThread({"moshi": models["moshi"]}) as s:
        ctx, page = open_page(browser, s.base)
        page.wait_for_selector("body[data-ready=true]")
        sel = panel(page, "moshi")
        page.click(f"{sel} [data-el=start]")
        _state(page, sel, "listening", "speaking")
        s.server.should_exit = True
        _state(page, sel, "error")
        err = page.text_content(f"{sel} [data-el=error]")
        assert "shutting down" in err or "lost" in err, err
        ctx.close()


# ------------------------------------------------------------------ Kyutai's own web client


class _Static(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.mark.skipif(not os.environ.get(KYUTAI_CLIENT),
                    reason=f"set {KYUTAI_CLIENT} to the dist/ folder of Kyutai's web client "
                           "(client/ of kyutai-labs/moshi, built with npm ci && npm run build); "
                           "it is not fetched or built by the tests")
def test_kyutai_web_client_converses_with_api_chat(browser, models):
    """Kyutai's built client, served from its own loopback origin and pointed at our server with
    its `worker_addr` parameter: it connects, sends Ogg/Opus from the microphone, plays our
    Opus and shows our text, which is session.step() on what the server decoded."""
    dist = Path(os.environ[KYUTAI_CLIENT])
    assert (dist / "index.html").is_file(), f"{dist} is not a built client (no index.html)"
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                            functools.partial(_Static, directory=str(dist)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with ServerThread({"moshi": models["moshi"]}) as s:
            taps = Taps(s.engine)
            ctx = browser.new_context(permissions=["microphone"])
            page = ctx.new_page()
            page.goto(f"http://127.0.0.1:{httpd.server_address[1]}/"
                      f"?worker_addr=127.0.0.1:{s.port}")
            page.get_by_role("button", name="Connect").click()
            page.get_by_role("button", name="Disconnect").wait_for(timeout=WAIT_MS)
            page.wait_for_timeout(8000)
            shown = page.locator("span.font-bold").locator("xpath=..").text_content()
            page.get_by_role("button", name="Disconnect").click()
            audio = page.locator("td:has-text('Audio played') + td").inner_text()
            ctx.close()
            pushed = taps.duplex[0]["pushed"]
            F = models["moshi"].frame_size
            x = np.concatenate(pushed)
            heard = x[: len(x) // F * F]
            assert len(heard) > 50 * F and np.sqrt(np.mean(heard ** 2)) > 0.005
            _, want = _duplex_reference(models["moshi"], [heard], seed=0)
    finally:
        httpd.shutdown()
    minutes, secs = audio.split(":")
    assert 60 * int(minutes) + float(secs) > 3.0, audio  # it played our audio
    assert len(shown) > 20 and want.startswith(shown), (shown, want)


# ------------------------------------------------------------------ small screens, names, counts

LONG_IDS = {  # served model id -> the tiny model behind it
    "/Users/someone/Library/Caches/models/nemotron-speech-streaming-en-0.6b-4bit": "nemotron",
    "mistralai/Voxtral-4B-TTS-2603": "voxtral-tts",
    "kyutai/moshiko-pytorch-bf16": "moshi",
    "nvidia/personaplex-7b-v1": "personaplex",
}


@pytest.mark.parametrize("width", [390, 320])
def test_short_model_names_and_no_sideways_scroll_on_a_phone(browser, models, width):
    """Tabs name each model by its repo or folder name (the full id in the tooltip), and at
    phone widths no panel scrolls sideways."""
    with ServerThread({i: models[k] for i, k in LONG_IDS.items()}) as s:
        ctx, page = open_page(browser, s.base, viewport=(width, 740))
        page.wait_for_selector("body[data-ready=true]")
        tabs = page.locator("button.tab").evaluate_all(
            "ts => ts.map(t => [t.dataset.model, t.querySelector('.name').textContent, t.title])")
        assert [t[1] for t in tabs] == ["nemotron-speech-streaming-en-0.6b-4bit",
                                        "Voxtral-4B-TTS-2603", "moshiko-pytorch-bf16",
                                        "personaplex-7b-v1"]
        assert all(mid in title for mid, _, title in tabs) and [t[0] for t in tabs] == list(
            LONG_IDS)
        for mid in LONG_IDS:
            page.click(f"button.tab[data-model='{mid}']")
            page.wait_for_selector(f"section.panel[data-model='{mid}']:not([hidden])")
            sw, cw = page.evaluate("[document.scrollingElement.scrollWidth, "
                                   "document.scrollingElement.clientWidth]")
            assert sw <= cw, (width, mid, sw, cw)
        assert page.errors == []
        ctx.close()


def test_counts_read_as_english(browser, site):
    """"1 word", "2 words", "1 underrun": the page's counts go through one helper, and no
    count is pluralised by hand."""
    ctx, page = open_page(browser, site.base, KEY)
    page.wait_for_selector("body[data-ready=true]")
    got = page.evaluate("""async () => {
      const { count } = await import("/web/ui.js");
      return [count(1, "word"), count(2, "word"), count(0, "word"), count(1, "underrun"),
              count(3, "underrun")];
    }""")
    assert got == ["1 word", "2 words", "0 words", "1 underrun", "3 underruns"]
    ctx.close()
    for f in WEB.glob("*.js"):
        hand = re.findall(r"\}\s+(words|underruns|frames|turns)\b", f.read_text())
        assert not hand, (f.name, hand)


def test_a_model_not_loaded_yet_loads_when_its_tab_is_opened(browser):
    """A server that loads models when first used: the first tab's model loads as the page
    opens on it, another tab's only when it is opened, and its panel then offers the voices
    the loaded model has."""
    from mlx_speech.server.models import Models

    golden = ROOT / "tests" / "golden"
    store = Models.locate([str(golden / "nemotron"), str(golden / "voxtral_tts" / "ckpt")])
    nm, tts = list(store)
    with ServerThread(store) as s:
        ctx, page = open_page(browser, s.base)
        page.wait_for_selector(f"section.panel[data-model='{nm}'] [data-el=mic]",
                               timeout=WAIT_MS)
        assert store.state(nm) == "loaded" and store.state(tts) == "not_loaded"
        sel = panel(page, tts)
        page.wait_for_selector(f"{sel} [data-el=voice] option[value=casual_male]",
                               state="attached", timeout=WAIT_MS)
        assert store.state(tts) == "loaded" and page.errors == []
        ctx.close()
