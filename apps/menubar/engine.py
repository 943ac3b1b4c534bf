"""The one thread that owns MLX work: model loads, ASR sessions, TTS streams.

Every method except `stop_speaking` only puts a command on the queue, so hotkey handlers, the
UI and the capture thread never wait on MLX. Results go back through `emit(event)` (the
core's `post`). Commands run in order, so a dictation started while its model loads simply
waits behind the load with its audio: nothing is lost.
"""

from __future__ import annotations

import gc
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .events import (
    Final,
    ModelStatus,
    Partial,
    SessionFailed,
    SpeakDone,
    SpeakFailed,
    SpeakStarted,
    SpeechEnded,
)

PROGRESS_EVERY = 0.25  # seconds between download progress events


class Stopping(Exception):
    """Raised inside a download or a TTS stream when the engine is shutting down."""


class SilenceStop:
    """A dictation's end of speech, for hands-free: the Silero VAD over its 16 kHz audio, in
    whole 32 ms frames; `push` is True once speech was heard and then `silence_ms` of silence
    (OpenAI's server_vad rule, `mlx_speech.audio.turns`). Runs on the engine thread."""

    def __init__(self, vad, silence_ms: int):
        from mlx_speech.audio.turns import TurnAudio, TurnConfig, TurnDetector

        self.vad, self.state = vad, vad.make_state(1)
        self.turns = TurnAudio(TurnDetector(TurnConfig(silence_duration_ms=silence_ms,
                                                       prefix_padding_ms=0)))

    def push(self, samples: np.ndarray) -> bool:
        self.turns.push(samples)
        actions, self.state = self.turns.run_vad(self.vad, self.state)
        return any(a[0] == "stop" for a in actions)


@dataclass
class _Session:
    session: object
    keep_audio: bool
    audio: list = field(default_factory=list)
    silence: SilenceStop | None = None  # hands-free's end of speech; None: off, or said


def default_load(folder: str):
    import mlx_speech

    return mlx_speech.load(folder)


def default_vad():
    """The Silero VAD (Silero's release model, shipped with mlx_speech)."""
    from mlx_speech.models.silero_vad import load_vad

    return load_vad()


class Engine:
    def __init__(self, emit: Callable[[object], None], *, store=None,
                 load: Callable[[str], object] = default_load,
                 speaker_factory: Callable[[], object] | None = None,
                 keep_audio: bool = False, vad: Callable[[], object] | None = default_vad):
        self.emit = emit
        self._vad_loader, self._vad = vad, None  # loaded at the first dictation that needs it
        self.store = store if store is not None else HubStore()
        self._loader = load
        self.speaker_factory = speaker_factory
        self.keep_audio = keep_audio
        self._q: queue.Queue = queue.Queue()
        self.models: dict[str, tuple[str, object]] = {}
        self.sessions: dict[int, _Session] = {}
        self._lock = threading.Lock()
        self._stopped: set[int] = set()
        self._speaker = None
        self._speaking: int | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mlx-engine", daemon=True)

    # ------------------------------------------------------------------ any thread
    def start(self) -> Engine:
        self._thread.start()
        return self

    def load(self, kind: str, model_id: str) -> None:
        self._q.put(("load", kind, model_id))

    def unload(self, kind: str) -> None:
        self._q.put(("unload", kind))

    def begin(self, sid: int, model_id: str, options: dict) -> None:
        self._q.put(("begin", sid, model_id, options))

    def audio(self, sid: int, block: np.ndarray) -> None:
        self._q.put(("audio", sid, block))

    def finish(self, sid: int) -> None:
        self._q.put(("finish", sid))

    def cancel(self, sid: int) -> None:
        self._q.put(("cancel", sid))

    def speak(self, sid: int, text: str, model_id: str, options: dict) -> None:
        self._q.put(("speak", sid, text, model_id, options))

    def stop_speaking(self, sid: int) -> None:
        """Silence `sid` now: the speaker drops its queue from this thread; the engine
        stops generating at its next chunk (a queued speak never starts)."""
        with self._lock:
            self._stopped.add(sid)
            speaker = self._speaker if self._speaking == sid else None
        if speaker is not None:
            speaker.stop()

    def shutdown(self, timeout: float | None = 30.0, abandon: bool = False) -> bool:
        """Stop after the queued work (`abandon`: at once: speech is silenced, a download
        is given up, queued work is dropped); the thread frees the models and its MLX
        streams before it ends (MLX aborts the process at exit otherwise). Returns True
        once the thread has ended."""
        if abandon:
            self._stopping.set()
            with self._lock:
                speaker = self._speaker
            if speaker is not None:
                speaker.stop()
        self._q.put(("quit",))
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def idle(self) -> bool:
        return self._q.empty() and self._speaking is None

    # ------------------------------------------------------------------ the engine thread
    def _run(self) -> None:
        while True:
            batch = [self._q.get()]
            while True:  # take what is queued: consecutive audio of a session is fed at once
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            i = 0
            while i < len(batch):
                cmd = batch[i]
                if cmd[0] == "quit":
                    self._close()
                    return
                if self._stopping.is_set():  # shutting down: only "quit" is left to do
                    i += 1
                    continue
                if cmd[0] == "audio":
                    j = i + 1
                    while j < len(batch) and batch[j][0] == "audio" and batch[j][1] == cmd[1]:
                        j += 1
                    blocks = [c[2] for c in batch[i:j]]
                    self._do(self._feed, cmd[1], np.concatenate(blocks))
                    i = j
                    continue
                self._do(getattr(self, "_" + cmd[0]), *cmd[1:])
                i += 1

    def _close(self) -> None:
        """Free the models and this thread's MLX streams here: MLX aborts the process at
        exit when a thread that used it did not clear its streams (mlx#3126, mx.clear_streams)."""
        self.models.clear()
        self.sessions.clear()
        gc.collect()
        try:
            import mlx.core as mx
        except ImportError:  # pragma: no cover
            return
        mx.clear_streams()

    def _do(self, fn, *args) -> None:
        try:
            fn(*args)
        except Stopping:
            return
        except Exception as e:
            msg = str(e) or type(e).__name__
            if not _user_error(e):
                traceback.print_exc(file=sys.stderr)
                msg = f"{type(e).__name__}: {msg}"
            name = fn.__name__
            if name in ("_begin", "_feed", "_finish"):
                sid = args[0]
                self.sessions.pop(sid, None)
                self.emit(SessionFailed(sid, msg))
            elif name == "_speak":
                self.emit(SpeakFailed(args[0], msg))
            elif name != "_load":  # _ensure already reported a failed load
                self.emit(SessionFailed(-1, msg))

    def _ensure(self, kind: str, model_id: str):
        cur = self.models.get(kind)
        if cur is not None and cur[0] == model_id:
            return cur[1]
        if cur is not None:
            self._unload(kind, quiet=True)
        self.emit(ModelStatus(kind, model_id, "loading"))
        last = [0.0]

        def progress(done: int, total: int) -> None:
            if self._stopping.is_set():
                raise Stopping  # abandons the download (it resumes next time)
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY or (total and done >= total):
                last[0] = now
                self.emit(ModelStatus(kind, model_id, "downloading", done, total))

        t0 = time.monotonic()
        try:
            folder = self.store.ensure(model_id, progress, kind=kind)
            self.emit(ModelStatus(kind, model_id, "loading"))
            model = self._loader(folder)
            from mlx_speech.registry import check_loaded

            check_loaded(model_id, model, kind)
        except Stopping:
            raise
        except Exception as e:
            if self._stopping.is_set():
                raise Stopping from e
            msg = str(e) if _user_error(e) else f"{type(e).__name__}: {e}"
            self.emit(ModelStatus(kind, model_id, "failed", error=msg))
            raise
        self.models[kind] = (model_id, model)
        self.emit(ModelStatus(kind, model_id, "ready",  # the kind was checked: its contract
                              voices=tuple(model.voices) if kind == "tts" else (),
                              latencies=model.latency.values() if kind == "asr" else (),
                              languages=tuple(model.languages or ()) if kind == "asr" else (),
                              seconds=time.monotonic() - t0))
        return model

    def _load(self, kind: str, model_id: str) -> None:
        self._ensure(kind, model_id)

    def _unload(self, kind: str, quiet: bool = False) -> None:
        cur = self.models.pop(kind, None)
        if kind == "asr":
            self.sessions.clear()
        if cur is None:
            return
        model_id = cur[0]
        del cur
        gc.collect()
        try:
            import mlx.core as mx

            mx.clear_cache()
        except ImportError:  # pragma: no cover - fakes in tests without MLX
            pass
        if not quiet:
            self.emit(ModelStatus(kind, model_id, "unloaded"))

    def _begin(self, sid: int, model_id: str, options: dict) -> None:
        model = self._ensure("asr", model_id)
        s = _Session(model.session(**_session_kwargs(model, options)), self.keep_audio)
        silence_ms = options.get("stop_after_silence_ms") or 0
        if silence_ms > 0 and model.sample_rate == 16000:  # the VAD's rate
            vad = self._silence_vad()
            if vad is not None:
                s.silence = SilenceStop(vad, silence_ms)
        self.sessions[sid] = s

    def _silence_vad(self):
        """The VAD for hands-free stops, loaded once; without weights, hands-free runs until a
        tap (said once on stderr, the app's log)."""
        if self._vad is None and self._vad_loader is not None:
            loader, self._vad_loader = self._vad_loader, None
            try:
                self._vad = loader()
            except Exception as e:  # noqa: BLE001 - a missing VAD must not fail dictation
                print(f"note: hands-free dictation stops only on a tap: no voice activity "
                      f"detector ({e})", file=sys.stderr)
        return self._vad

    def _feed(self, sid: int, samples: np.ndarray) -> None:
        s = self.sessions.get(sid)
        if s is None:  # cancelled, or its model failed
            return
        if s.keep_audio:
            s.audio.append(samples)
        delta = s.session.feed(samples)
        if delta:
            self.emit(Partial(sid, delta))
        if s.silence is not None and s.silence.push(samples):
            s.silence = None  # said once: the core ends a hands-free dictation, or ignores it
            self.emit(SpeechEnded(sid))

    def _finish(self, sid: int) -> None:
        s = self.sessions.pop(sid, None)
        if s is None:
            return
        tail = s.session.finish()
        if tail:
            self.emit(Partial(sid, tail))
        result = s.session.result()
        audio = (np.concatenate(s.audio) if s.audio else np.zeros(0, np.float32)) \
            if s.keep_audio else None
        self.emit(Final(sid, result.text, s.session.seconds, audio, tuple(result.token_ids)))

    def _cancel(self, sid: int) -> None:
        self.sessions.pop(sid, None)

    def _speak(self, sid: int, text: str, model_id: str, options: dict) -> None:
        if self._take_stopped(sid):
            self.emit(SpeakDone(sid, 0.0, True))
            return
        model = self._ensure("tts", model_id)
        speaker = self.speaker_factory()
        with self._lock:
            if sid in self._stopped:  # stopped while the model loaded
                self._stopped.discard(sid)
                self.emit(SpeakDone(sid, 0.0, True))
                return
            self._speaker, self._speaking = speaker, sid
        sr, seconds, stopped = model.sample_rate, 0.0, False
        try:
            speaker.start(sr)
            kw = {k: v for k, v in options.items() if v is not None}
            for chunk in model.stream(text, **kw):
                x = np.asarray(chunk.samples, np.float32)
                if chunk.sample_rate != sr:
                    from mlx_speech.audio.resample import resample

                    x = resample(x, chunk.sample_rate, sr)
                if sid in self._stopped or self._stopping.is_set() or not speaker.write(x):
                    stopped = True
                    break
                if seconds == 0.0:
                    self.emit(SpeakStarted(sid))
                seconds += len(x) / sr
            if not stopped:
                speaker.drain()
        finally:
            with self._lock:
                self._speaker, self._speaking = None, None
                stopped = self._take_stopped(sid) or stopped
            speaker.close()
        self.emit(SpeakDone(sid, seconds, stopped))

    def _take_stopped(self, sid: int) -> bool:
        if sid in self._stopped:
            self._stopped.discard(sid)
            return True
        return False


def _user_error(e: Exception) -> bool:
    from mlx_speech.errors import MlxSpeechError

    return isinstance(e, (MlxSpeechError, ValueError, OSError))


def _session_kwargs(model, options: dict) -> dict:
    """The session's keywords: `latency_ms` and `language`, the settings' ones for this model
    (None: the model's default; one it does not take, e.g. from a file written by hand, falls
    back to the default, said on stderr), and the vocabulary (parsed once, from the
    settings)."""
    from mlx_speech.errors import MlxSpeechError
    from mlx_speech.text.vocabulary import session_keywords

    kw = session_keywords(options.get("vocabulary"))
    v = options.get("latency_ms")
    if v is not None:
        try:
            kw["latency_ms"] = model.latency.check(v)
        except MlxSpeechError as e:
            print(f"note: the model's default latency instead: {e}", file=sys.stderr)
    lang = options.get("language")
    if lang is not None:
        try:
            if model.languages is None:
                raise MlxSpeechError(f"{model.name} takes no language (set: {lang!r})")
            model.resolve_language(lang)
            kw["language"] = lang
        except MlxSpeechError as e:
            print(f"note: the model's default language instead: {e}", file=sys.stderr)
    return kw


# ---------------------------------------------------------------- model store


class HubStore:
    """Local folders as they are; hub ids through mlx_speech.hub.resolve with byte progress."""

    def ensure(self, model_id: str, progress: Callable[[int, int], None],
               kind: str | None = None) -> str:
        from pathlib import Path

        from mlx_speech.errors import CheckpointError
        from mlx_speech.hub import detect_model_type, resolve
        from mlx_speech.registry import weight_patterns, wrong_kind

        def check(model_type: str, folder=None) -> None:
            if kind is not None and (msg := wrong_kind(model_id, model_type, kind)):
                raise CheckpointError(msg)

        p = Path(model_id).expanduser()
        if p.is_dir():
            check(detect_model_type(p))
            return str(p)
        if p.exists():
            return str(p)  # a single-file checkpoint (.nemo): the loader says what it is
        return str(resolve(model_id, weight_patterns, tqdm_class=byte_progress(progress),
                           check=check))


def byte_progress(report: Callable[[int, int], None]):
    """A tqdm stand-in for huggingface_hub: forwards its byte bars as (done, total)."""

    class _Bar:
        def __init__(self, *args, **kwargs):
            self.unit = kwargs.get("unit", "it")
            self.total = kwargs.get("total") or 0
            self.n = kwargs.get("initial") or 0
            self.disable = False

        def _report(self) -> None:
            if self.unit == "B":
                report(int(self.n), int(self.total or 0))

        def update(self, n=1) -> None:
            self.n += n or 0
            self._report()

        def refresh(self, *a, **k) -> None:
            self._report()

        def set_description(self, *a, **k) -> None:
            pass

        set_postfix_str = set_description

        def close(self) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        def __iter__(self):
            return iter(())

    return _Bar
