"""PersonaPlex prompting (spec §9.2): voice prompt, silence, role text, silence; and voice files.

Reference order (NVIDIA `LMGen.step_system_prompts`), every token forced, the user stream hearing
a 440 Hz sine (SINE_TOKENS) throughout:
1. voice: one step per 80 ms voice frame (agent = its Mimi codes, text = PAD), or the replay of a
   stored voice file (`embeddings` fed straight to the transformer, then its token `cache`);
2. `silence_frames` steps with agent = SILENCE_TOKENS, text = PAD (0.5 s: 6 frames);
3. one step per SentencePiece id of "<system> {role} <system>" (agent = SILENCE_TOKENS);
4. silence again.

Voice files: PersonaPlex's `voices/*.pt` (torch pickles, read with
`mlx_speech.models.torchfile`), the same content as `.safetensors` (`embeddings` [N, 1, 1, dim],
`cache` [1, 17, 4]), or any audio file, loudness-normalised to -24 LUFS (ITU-R BS.1770, as
pyloudnorm) and encoded with Mimi.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from ...errors import AudioError, CheckpointError
from ..loading import read_tensors
from .gen import TEXT_PAD, PersonaPlexGen

SILENCE_TOKENS = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)  # Mimi codes of a silent frame
SINE_TOKENS = (430, 1268, 381, 1611, 1095, 1495, 56, 472)  # 440 Hz, amplitude 0.5
SILENCE_SECONDS = 0.5
VOICE_LUFS = -24.0
VOICE_SUFFIXES = (".pt", ".safetensors", ".wav", ".flac", ".ogg", ".mp3")


def wrap_system(text: str) -> str:
    """NVIDIA's `wrap_with_system_tags`: add the tags unless both are already there."""
    t = text.strip()
    if t.startswith("<system>") and t.endswith("<system>"):
        return t
    return f"<system> {t} <system>"


# ---------------------------------------------------------------- loudness (ITU-R BS.1770-4)


def _biquad_response(b, a, n: int) -> np.ndarray:
    z = np.exp(-1j * np.pi * np.arange(n // 2 + 1) / (n // 2))
    num = b[0] + b[1] * z + b[2] * z * z
    den = a[0] + a[1] * z + a[2] * z * z
    return num / den


def _k_weighting(sample_rate: int) -> tuple[tuple, tuple]:
    """The two K-weighting biquads (high shelf +4 dB @1500 Hz, high pass @38 Hz), pyloudnorm's
    cookbook design at any sample rate."""
    out = []
    for kind, gain, q, fc in (("shelf", 4.0, 1 / np.sqrt(2), 1500.0), ("hp", 0.0, 0.5, 38.0)):
        A = 10 ** (gain / 40)
        w0 = 2 * np.pi * fc / sample_rate
        alpha, c = np.sin(w0) / (2 * q), np.cos(w0)
        if kind == "shelf":
            r = 2 * np.sqrt(A) * alpha
            b = (A * ((A + 1) + (A - 1) * c + r), -2 * A * ((A - 1) + (A + 1) * c),
                 A * ((A + 1) + (A - 1) * c - r))
            a = ((A + 1) - (A - 1) * c + r, 2 * ((A - 1) - (A + 1) * c), (A + 1) - (A - 1) * c - r)
        else:
            b = ((1 + c) / 2, -(1 + c), (1 + c) / 2)
            a = (1 + alpha, -2 * c, 1 - alpha)
        out.append((b, a))
    return out[0], out[1]


def integrated_loudness(x: np.ndarray, sample_rate: int) -> float:
    """Integrated loudness in LUFS of mono samples (400 ms blocks, 75 % overlap, -70 LUFS absolute
    and -10 LU relative gates). -inf for silence or clips shorter than one block."""
    x = np.asarray(x, dtype=np.float64)
    block = int(0.4 * sample_rate)
    if x.size < block:
        return float("-inf")
    # IIR filtering in the frequency domain; 1 s of zero padding holds the filters' decay.
    n = 1 << int(np.ceil(np.log2(x.size + sample_rate)))
    H = np.ones(n // 2 + 1, dtype=np.complex128)
    for b, a in _k_weighting(sample_rate):
        H *= _biquad_response(b, a, n)
    y = np.fft.irfft(np.fft.rfft(x, n) * H, n)[: x.size]
    count = int(round((x.size / sample_rate - 0.4) / 0.1)) + 1
    z = np.array([np.sum(y[int(0.1 * j * sample_rate): int(0.1 * j * sample_rate) + block] ** 2)
                  for j in range(count)]) / block
    with np.errstate(divide="ignore"):
        lk = -0.691 + 10 * np.log10(z)
    gated = z[lk >= -70.0]
    if gated.size == 0:
        return float("-inf")
    rel = -0.691 + 10 * np.log10(gated.mean()) - 10.0
    keep = z[(lk > rel) & (lk > -70.0)]
    if keep.size == 0:
        return float("-inf")
    return float(-0.691 + 10 * np.log10(keep.mean()))


def normalize_loudness(x: np.ndarray, sample_rate: int, target: float = VOICE_LUFS) -> np.ndarray:
    """Scale to `target` LUFS (no limiter, as pyloudnorm); silence is returned unchanged."""
    lufs = integrated_loudness(x, sample_rate)
    if not np.isfinite(lufs):
        return np.asarray(x, dtype=np.float32)
    return (np.asarray(x, dtype=np.float64) * 10 ** ((target - lufs) / 20)).astype(np.float32)


# ---------------------------------------------------------------- voices


@dataclass
class VoicePrompt:
    """Either Mimi codes of the voice audio ([frames, n_agent]) or a stored replay."""

    name: str
    codes: np.ndarray | None = None
    embeddings: mx.array | None = None  # [N, 1, 1, dim]
    cache: np.ndarray | None = None  # [1, K, columns]


def _stored_voice(name: str, d: dict) -> VoicePrompt:
    if not isinstance(d, dict) or "embeddings" not in d or "cache" not in d:
        raise CheckpointError(f"voice {name}: expected a dict with 'embeddings' and 'cache'")
    e, c = mx.array(d["embeddings"]), np.asarray(d["cache"]).astype(np.int64)
    if e.ndim != 4 or c.ndim != 3:
        raise CheckpointError(f"voice {name}: embeddings {e.shape} / cache {c.shape} "
                              "are not [N, 1, 1, dim] / [1, K, columns]")
    return VoicePrompt(name, embeddings=e, cache=c)


def encode_voice_audio(mimi, pcm: np.ndarray, n_agent: int) -> np.ndarray:
    """-24 LUFS, whole frames (last one zero-padded), streaming Mimi -> codes [frames, n_agent]."""
    x = normalize_loudness(pcm, mimi.sample_rate)
    F = mimi.frame_size
    n = -(-x.size // F)
    x = np.pad(x, (0, n * F - x.size))
    state = mimi.make_state()
    codes = []
    for i in range(n):
        c = mimi.encode_step(mx.array(x[None, None, i * F:(i + 1) * F]), state)
        mx.eval(c, *state.arrays())
        codes.append(np.array(c[0, :n_agent, 0]))
    return np.stack(codes) if codes else np.zeros((0, n_agent), np.int64)


def load_voice(path: Path, mimi, n_agent: int) -> VoicePrompt:
    """A voice file: .pt / .safetensors replay, or audio encoded with `mimi`."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".safetensors", ".pt"):
        return _stored_voice(path.stem, read_tensors(path, "voice"))
    from ...audio import load_audio

    try:
        pcm, _ = load_audio(path, mimi.sample_rate, log=lambda m: None)
    except AudioError as e:
        raise CheckpointError(f"cannot read voice {path}: {e}") from None
    return VoicePrompt(path.stem, codes=encode_voice_audio(mimi, pcm, n_agent))


def voice_dir(folder: Path) -> Path | None:
    """`folder/voices`, extracting PersonaPlex's `voices.tgz` there (or next to it) once."""
    folder = Path(folder)
    d = folder / "voices"
    if d.is_dir():
        return d
    tgz = folder / "voices.tgz"
    if not tgz.exists():
        return None
    try:
        with tarfile.open(tgz, "r:gz") as tar:
            members = [m for m in tar.getmembers()
                       if m.isfile() and m.name.startswith("voices/") and ".." not in m.name]
            tar.extractall(folder, members=members)
    except (OSError, tarfile.TarError) as e:
        raise CheckpointError(f"cannot extract {tgz}: {e}") from None
    return d if d.is_dir() else None


def list_voices(folder: Path | None) -> dict[str, Path]:
    """Voice name -> file; a stored replay wins over audio of the same name."""
    if folder is None:
        return {}
    rank = {s: i for i, s in enumerate(VOICE_SUFFIXES)}
    out: dict[str, Path] = {}
    for p in sorted(Path(folder).iterdir()):
        s = p.suffix.lower()
        if p.is_file() and s in rank:
            if p.stem not in out or rank[s] < rank[out[p.stem].suffix.lower()]:
                out[p.stem] = p
    return out


# ---------------------------------------------------------------- the prompt phase


def run_prompt(gen: PersonaPlexGen, voice: VoicePrompt | None, text_ids: list[int] | None,
               silence_frames: int) -> int:
    """Step `gen` through the system prompt in the reference order; returns the forwards run.
    Evaluates once per step so the lazy graph stays one frame long."""
    cfg = gen.config
    n = cfg.n_agent
    if n != len(SILENCE_TOKENS):
        raise ValueError(f"PersonaPlex prompts need 8 agent codebooks, the model has {n}")
    B = gen.batch
    sine = mx.broadcast_to(mx.array(SINE_TOKENS, dtype=mx.int32)[None, :, None], (B, n, 1))
    silence = mx.broadcast_to(mx.array(SILENCE_TOKENS, dtype=mx.int32)[None, :, None], (B, n, 1))
    forwards = 0

    def done(out) -> None:
        nonlocal forwards
        forwards += out is not None
        mx.eval(gen.arrays())

    if voice is not None and voice.embeddings is not None:
        for e in voice.embeddings:
            done(gen.step_embeddings(e.reshape(1, 1, -1)))
        gen.set_cache(voice.cache)
    elif voice is not None and voice.codes is not None:
        for frame in voice.codes:
            f = mx.array(np.asarray(frame, dtype=np.int32)).reshape(1, n, 1)
            done(gen.step(user=sine, agent=mx.broadcast_to(f, (B, n, 1)), text=TEXT_PAD))
    for _ in range(silence_frames):
        done(gen.step(user=sine, agent=silence, text=TEXT_PAD))
    for t in text_ids or []:
        done(gen.step(user=sine, agent=silence, text=int(t)))
    for _ in range(silence_frames):
        done(gen.step(user=sine, agent=silence, text=TEXT_PAD))
    return forwards
