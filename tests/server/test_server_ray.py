"""The server as a Ray Serve deployment on a local Ray instance (CPU, loopback, tiny models),
deployed the way a cluster is: `serve run` with a copy of docs/serve_config.yaml. Two replicas
behind Ray's proxy: concurrent realtime sessions in both dialects spread over both and
transcribed exactly as `transcribe()` does; REST transcription and speech, a Kyutai chat and
the page through the proxy; a replica killed mid-session closes its sessions with 1012 within
2 s while the other replica's go on, and a new session succeeds within 10 s.

Ray is slow to start on a small shared machine: the module starts it once (about 30-90 s with
the replicas) and skips with the reason when it cannot start at all."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

# Ray's own sockets on loopback only (read when Ray is imported; Ray's default on macOS)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
ray = pytest.importorskip("ray", reason="needs the cluster extra (ray[serve])")
serve = pytest.importorskip("ray.serve", reason="needs the cluster extra (ray[serve])")
yaml = pytest.importorskip("yaml")
websockets = pytest.importorskip("websockets")

import httpx  # noqa: E402

import mlx_speech  # noqa: E402
from mlx_speech.server.ray_serve import CALLBACK, CALLBACK_ENV, NAME  # noqa: E402
from tests.conftest import speechlike  # noqa: E402
from tests.support.server import kyutai_talk, pcm16, wav_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
START_S = 300.0  # Ray, Serve and two replicas on a busy 2-core machine
DEADLINE_S = 120.0
HEADER = "x-mlx-speech-replica"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(models: dict, port: int) -> dict:
    """docs/serve_config.yaml for this machine: these models, two fixed replicas on loopback
    (no custom resource, no autoscaling, no key)."""
    cfg = yaml.safe_load((ROOT / "docs" / "serve_config.yaml").read_text())
    cfg["http_options"] = {"host": "127.0.0.1", "port": port}
    app = cfg["applications"][0]
    assert app["import_path"] == "mlx_speech.server.ray_serve:app_builder"
    app["args"] = {"model": [str(p) for p in models.values()]}
    dep = app["deployments"][0]
    assert dep["name"] == NAME and dep["ray_actor_options"]["resources"] == {"mlx_speech": 1}
    del dep["autoscaling_config"]
    dep["num_replicas"] = 2
    dep["ray_actor_options"] = {"num_cpus": 0}
    return cfg


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, vr_dir):
    from tests.support.moshi import tiny_kyutai_moshi

    tmp = tmp_path_factory.mktemp("ray")
    models = {"nm": GOLDEN / "nemotron", "vr": vr_dir, "tts": GOLDEN / "voxtral_tts" / "ckpt",
              "moshi": tiny_kyutai_moshi(tmp / "moshi")}
    env = {CALLBACK_ENV: CALLBACK,  # Ray's processes (the proxy, the replicas) inherit these
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           # Serve's controller kills a proxy not ready within 5 s (then waits on the dead
           # one): on a busy machine its worker alone takes longer to start
           "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120",
           "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    t0 = time.monotonic()
    try:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
                 _temp_dir=tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"Ray cannot start here: {type(e).__name__}: {e}")
    try:
        where = {n["NodeManagerAddress"] for n in ray.nodes()}
        if where != {"127.0.0.1"}:
            pytest.skip(f"Ray would listen on {where}, not loopback only (Ray was imported "
                        "before this module set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0)")
        port = _free_port()
        # and `serve.start` waits 60 s for it: on a busy machine (the load test: two busy
        # loops beside the suite) the bound is START_S
        import ray.serve._private.api as serve_api

        serve_api.HTTP_PROXY_TIMEOUT = max(serve_api.HTTP_PROXY_TIMEOUT, START_S)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        cfg = tmp / "serve_config.yaml"
        cfg.write_text(yaml.safe_dump(_config(models, port)))
        gcs = ray.get_runtime_context().gcs_address
        r = subprocess.run([sys.executable, "-c", "from ray.serve.scripts import cli; cli()",
                            "run", "--non-blocking", "--address", gcs, str(cfg)],
                           capture_output=True, text=True, timeout=START_S, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
        base = f"http://127.0.0.1:{port}"
        seen = set()
        while len(seen) < 2:  # both replicas answer through the proxy
            assert time.monotonic() - t0 < START_S, f"the replicas did not start ({seen})"
            try:
                h = httpx.get(base + "/health", timeout=10)
                if h.status_code == 200:
                    seen.add(h.headers[HEADER])
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        print(f"\nRay, Serve and 2 replicas up in {time.monotonic() - t0:.0f} s")
        yield {"base": base, "ws": f"ws://127.0.0.1:{port}", "models": models}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def refs(cluster):
    return {k: mlx_speech.load(p) for k, p in cluster["models"].items()}


def run(coro, timeout: float = DEADLINE_S):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def recv_json(ws) -> dict:
    """The next event that is not about a model loading (a replica loads its models when a
    session first names them: model.loading / model.loaded come before)."""
    while True:
        ev = json.loads(await ws.recv())
        if not ev["type"].startswith("model."):
            return ev


def heard(x: np.ndarray) -> np.ndarray:
    """What the server decodes from a client's pcm16 (int16 / 32768)."""
    return pcm16(x).astype(np.float32) / 32768


def b64(x: np.ndarray) -> str:
    return base64.b64encode(pcm16(x).tobytes()).decode()


class Session:
    """One realtime client through the proxy: opened, then fed and finished on demand."""

    def __init__(self, cluster, dialect: str, model: str, audio: np.ndarray):
        self.cluster, self.dialect, self.model, self.audio = cluster, dialect, model, audio
        self.ws = None
        self.replica = None

    async def open(self) -> None:
        openai = self.dialect == "openai"
        url = self.cluster["ws"] + ("/v1/realtime?intent=transcription" if openai
                                    else "/v1/realtime")
        self.ws = await websockets.connect(url, max_size=None)
        self.replica = self.ws.response.headers[HEADER]
        assert (await recv_json(self.ws))["type"] == "session.created"
        if openai:
            await self.ws.send(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "audio": {"input": {
                    "format": {"type": "audio/pcm", "rate": 16000},
                    "transcription": {"model": self.model}, "turn_detection": None}}}}))
            assert (await recv_json(self.ws))["type"] == "session.updated"
        else:
            await self.ws.send(json.dumps({"type": "session.update", "model": self.model}))
            await self.ws.send(json.dumps({"type": "input_audio_buffer.commit"}))

    async def send(self, x: np.ndarray) -> None:
        for i in range(0, len(x), 3200):
            await self.ws.send(json.dumps({"type": "input_audio_buffer.append",
                                           "audio": b64(x[i:i + 3200])}))

    async def finish(self) -> str:
        openai = self.dialect == "openai"
        await self.ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}
                                      if not openai else {"type": "input_audio_buffer.commit"}))
        done = ("conversation.item.input_audio_transcription.completed" if openai
                else "transcription.done")
        while (ev := await recv_json(self.ws))["type"] != done:
            assert ev["type"] not in ("error",), ev
        await self.ws.close()
        return ev["transcript" if openai else "text"]


def test_sessions_spread_over_both_replicas_and_match_transcribe(cluster, refs):
    """8 concurrent realtime sessions (both dialects, two models), all open before any
    audio: every transcript equals transcribe() of its audio, and both replicas serve."""
    sessions = [Session(cluster, "openai" if i % 2 else "vllm",
                        str(cluster["models"]["vr" if i % 4 == 3 else "nm"]),
                        speechlike(1.2 + 0.1 * i, seed=20 + i)) for i in range(8)]
    by_path = {str(p): k for k, p in cluster["models"].items()}

    async def main():
        for s in sessions:  # one after another: each is open when the next is routed
            await s.open()
        await asyncio.gather(*(s.send(s.audio) for s in sessions))
        return await asyncio.gather(*(s.finish() for s in sessions))

    t0 = time.monotonic()
    got = run(main())
    print(f"8 sessions through the proxy in {time.monotonic() - t0:.1f} s")
    want = [refs[by_path[s.model]].transcribe(heard(s.audio)).text for s in sessions]
    assert got == want
    assert len({s.replica for s in sessions}) == 2, [s.replica for s in sessions]


def test_rest_speech_kyutai_and_the_page_through_the_proxy(cluster, refs):
    import sphn

    from mlx_speech.server.app import encode_audio

    base, m = cluster["base"], {k: str(p) for k, p in cluster["models"].items()}
    page = httpx.get(base + "/", timeout=DEADLINE_S)
    assert page.status_code == 200 and "<html" in page.text.lower() and HEADER in page.headers
    x = speechlike(1.5, seed=11)
    r = httpx.post(base + "/v1/audio/transcriptions", timeout=DEADLINE_S,
                   data={"model": m["nm"], "response_format": "verbose_json",
                         "timestamp_granularities[]": "word"},
                   files={"file": ("a.wav", wav_bytes(x))})
    ref = refs["nm"].transcribe(x)
    assert r.status_code == 200 and r.json()["text"] == ref.text
    assert [w["word"] for w in r.json()["words"]] == [w.text for w in ref.words]
    r = httpx.post(base + "/v1/audio/speech", timeout=DEADLINE_S, json={
        "model": m["tts"], "input": "Hello there.", "voice": "casual_male",
        "response_format": "flac", "seed": 7, "max_frames": 16})
    want = refs["tts"].generate("Hello there.", voice="casual_male", seed=7, max_frames=16)
    assert r.status_code == 200 and r.content == encode_audio(want.samples, 24000, "flac")

    moshi = refs["moshi"]  # Kyutai's protocol: the answer is session.step() on the frames
    F = moshi.frame_size
    user = (0.3 * np.sin(2 * np.pi * 220 * np.arange(8 * F) / 24000)).astype(np.float32)
    w = sphn.OpusStreamWriter(24000)
    packets = [p for p in (w.append_pcm(user[i:i + 960]) for i in range(0, len(user), 960)) if p]
    rd = sphn.OpusStreamReader(24000)
    pcm = np.concatenate([rd.append_bytes(p) for p in packets])
    session, ew = moshi.session(seed=3), sphn.OpusStreamWriter(24000)
    want_audio, want_text = b"", ""
    for i in range(len(pcm) // F):
        out, text = session.step(pcm[i * F:(i + 1) * F])
        want_audio += ew.append_pcm(out)
        want_text += text

    audio, text = run(kyutai_talk(cluster["ws"] + f"/api/chat?seed=3&model={m['moshi']}",
                                  packets, len(want_audio), len(want_text), wait_s=30))
    assert len(want_audio) > 0 and audio == want_audio and text == want_text


def test_a_lost_replica_closes_its_sessions_and_new_ones_go_on(cluster, refs):
    """Kill one replica while sessions are open on both: its sessions get a close frame
    (1012) within 2 s; the other replica's finish with the right text; a new session
    succeeds within 10 s."""
    nm = str(cluster["models"]["nm"])
    sessions = [Session(cluster, "vllm", nm, speechlike(1.6, seed=40 + i)) for i in range(6)]

    async def main():
        for s in sessions:
            await s.open()
            await s.send(s.audio[:8000])  # mid-utterance
        replicas = {s.replica for s in sessions}
        assert len(replicas) == 2, replicas
        victim = sessions[0].replica
        lost = [s for s in sessions if s.replica == victim]
        kept = [s for s in sessions if s.replica != victim]
        t_kill = time.monotonic()
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)

        async def closed(s):
            try:
                while True:
                    await s.ws.recv()
            except websockets.exceptions.ConnectionClosed:
                return s.ws.close_code, s.ws.close_reason, time.monotonic() - t_kill

        ends = await asyncio.wait_for(asyncio.gather(*(closed(s) for s in lost)), 30)
        for s in kept:
            await s.send(s.audio[8000:])
        texts = await asyncio.gather(*(s.finish() for s in kept))
        t_new, new_text, x = None, None, speechlike(1.0, seed=99)
        while new_text is None:  # a new session: routed to a live replica
            assert time.monotonic() - t_kill < 10.0, "no new session within 10 s"
            s = Session(cluster, "vllm", nm, x)
            try:
                await asyncio.wait_for(s.open(), 5)
                await s.send(x)
                new_text = await asyncio.wait_for(s.finish(), 10)
                t_new = time.monotonic() - t_kill
            except (websockets.exceptions.WebSocketException, OSError, AssertionError,
                    asyncio.TimeoutError):
                await asyncio.sleep(0.2)
        return lost, ends, kept, texts, new_text, t_new

    lost, ends, kept, texts, new_text, t_new = run(main())
    print(f"closed after {[round(e[2], 3) for e in ends]} s; a new session done {t_new:.2f} s "
          "after the kill")
    assert lost and kept
    for code, reason, after in ends:
        assert code == 1012 and "replica" in reason and after <= 2.0, (code, reason, after)
    assert texts == [refs["nm"].transcribe(heard(s.audio)).text for s in kept]
    assert new_text == refs["nm"].transcribe(heard(speechlike(1.0, seed=99))).text
    assert t_new <= 10.0


def test_a_config_s_args_are_the_server_s_own_options():
    """`args` of a Serve config (and a replica's options) are mlx_speech.server's options:
    lists repeat, true is a flag; a bad one is refused when the app is built, in one line."""
    from mlx_speech.errors import MlxSpeechError
    from mlx_speech.server.ray_serve import app_builder, parse_options, server_argv

    opts = {"model": ["a", "b"], "preload": True, "no_vad": False, "unload_after_s": 600,
            "allowed-host": ["x.lan"]}
    assert server_argv(opts) == ["--model", "a", "--model", "b", "--preload",
                                 "--unload-after-s", "600", "--allowed-host", "x.lan"]
    a = parse_options(opts)
    assert (a.model, a.preload, a.unload_after_s, a.allowed_host) == (["a", "b"], True, 600.0,
                                                                      ["x.lan"])
    with pytest.raises(MlxSpeechError, match="unrecognized arguments: --unload-minutes 3"):
        app_builder({"model": ["a"], "unload_minutes": 3})
    with pytest.raises(MlxSpeechError, match="the following arguments are required: --model"):
        parse_options({})
