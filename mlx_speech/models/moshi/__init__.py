"""Kyutai Moshi and NVIDIA PersonaPlex: full-duplex speech-to-speech (Mimi + LM + depformer).

    d = mlx_speech.load("kyutai/moshiko-pytorch-bf16")   # or a folder
    s = d.session()                                   # PersonaPlex: voice="NATF2", role="..."
    pcm, text = s.step(user_pcm)                      # 1920 samples at 24 kHz in and out

Folders: Kyutai's hub layout (`config.json` = LM kwargs + `moshi_name`, `mimi_name`,
`tokenizer_name`, optional `mimi_config_name` and `lm_gen_config`; without config.json the Moshi
7B files `model.safetensors`, `tokenizer-e351c8d8-checkpoint125.safetensors`,
`tokenizer_spm_32k_3.model`) and PersonaPlex's (`nvidia/personaplex-7b-v1`: the same files, a
16-step depformer, `voices.tgz`). PersonaPlex is recognised from its weights (depformer heads ==
audio streams), whatever its config.json says, as NVIDIA's loader does.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import mlx.core as mx
import numpy as np

from ...errors import CheckpointError, MlxSpeechError
from ...nn import quantization_declared
from ...text import TextTokenizer
from ..base import parameter_bytes
from ..loading import fill, load_safetensors, read_json, read_weights
from .config import (
    PERSONAPLEX_MLX_FILES,
    CheckpointFiles,
    GenConfig,
    LmConfig,
    personaplex_mlx_kwargs,
)
from .gen import CompiledLm, KyutaiGen, PersonaPlexGen, Sampling, StepOut
from .lm import (
    LM,
    LmState,
    depformer_steps,
    from_moshi_mlx,
    gated_hidden,
    is_moshi_mlx,
    personaplex_mlx_weights,
    remap,
)
from .personaplex import VoicePrompt, list_voices, load_voice, voice_dir
from .session import DEFAULT_USER_LAG, DuplexSession

__all__ = ["DEFAULT_USER_LAG", "LM", "CheckpointFiles", "DuplexSession", "GenConfig",
           "KyutaiGen", "LmConfig", "LmState", "Moshi", "PersonaPlexGen", "Sampling", "StepOut",
           "TextTokenizer", "build_lm", "load", "weight_patterns"]

DEFAULT_VOICE = "NATF0"  # PersonaPlex's web UI default


def weight_patterns(folder: Path) -> list[str]:
    """The files a (Kyutai or PersonaPlex) repo's config names, plus PersonaPlex's voices."""
    raw = read_json(Path(folder) / "config.json", required=False)
    if raw is not None and raw.get("model_type") == "personaplex":
        return [*PERSONAPLEX_MLX_FILES.values(), "voices/*", "voices.tgz"]
    files = CheckpointFiles.from_config(raw)
    out = [files.moshi_name, files.mimi_name, files.tokenizer_name, "voices.tgz"]
    if not files.has_config:
        out += KYUTAI_MLX_NAMES  # moshiko-mlx-q4 / -q8 (whichever the repo has)
    if files.mimi_config_name:
        out.append(files.mimi_config_name)
    return out


def build_lm(config: LmConfig, weights: dict[str, mx.array], where="LM",
             dtype: mx.Dtype | None = None, quantize: int | None = None,
             group_size: int = 64, expect: dict | None = None,
             converted: bool = False) -> LM:
    """An LM from Kyutai/PersonaPlex- or moshi_mlx-named tensors (quantized or not): strict,
    lazy (memory-mapped) loading; `quantize` bits (group `group_size`) quantizes on the fly,
    consuming (emptying) `weights` so each full-precision tensor is freed once quantized.
    `converted`: tensors already in our names (mlx_speech.convert's layout)."""
    if not converted and is_moshi_mlx(weights):
        src, weights = weights, from_moshi_mlx(weights, rms=config.norm.startswith("rms"))
        if quantize is not None:
            src.clear()  # no second reference to the file's arrays
    n = depformer_steps(weights)
    if n != config.dep_q:
        if n == config.n_q and config.n_q % 2 == 0:
            config.dep_q = n  # PersonaPlex: NVIDIA's loader forces dep_q 16 over any config
        else:
            raise CheckpointError(f"{where}: config says dep_q={config.dep_q} but the weights "
                                  f"have {n} depformer heads")
    lm = LM(config, *gated_hidden(weights))
    fill(lm, weights, where, converted=converted, remap=lambda w, _: remap(w, lm), dtype=dtype,
         quantize=quantize, group_size=group_size, keep=keep_high_precision, declared=expect)
    return lm


def keep_high_precision(path: str, module) -> bool:
    """Nothing beyond what cannot be quantized: Kyutai's own q4/q8 releases quantize every
    Linear and Embedding of the LM (heads and embeddings too), and `load(bf16, quantize=B,
    group_size=G)` gives exactly their tensors. Mimi (a separate module) always stays in float32;
    norms are not Linear layers; the -1 -> zero rule lives outside the embedding modules."""
    return False


class Moshi:
    """A loaded duplex model (LM + Mimi + text tokenizer); sessions share it."""

    kind = "duplex"  # the model contract (mlx_speech/models/base.py)
    family = "moshi"
    name = "Moshi / PersonaPlex full-duplex"

    @staticmethod
    def check_session_options(folder: str | os.PathLike, what: str, voice=None, role=None,
                              **_) -> None:
        """Session options checked from the checkpoint's files before its weights are read
        (`mlx_speech.load(..., options=...)`): voice and role prompts need a PersonaPlex
        checkpoint (from its config), and a voice name must be one of its voices (once they are
        there: a hub repo's come with its weights)."""
        folder = Path(folder)
        raw = read_json(folder / "config.json", required=False)
        if raw is not None and raw.get("model_type") == "personaplex":
            lm = personaplex_mlx_kwargs(raw)
        else:
            lm = CheckpointFiles.from_config(raw).lm
        prompts = LmConfig.from_dict(lm).personaplex
        if (voice is not None or role) and not prompts:
            raise MlxSpeechError(f"{what} is a Kyutai Moshi model: voice and role prompts need a "
                                 "PersonaPlex checkpoint (e.g. nvidia/personaplex-7b-v1)")
        if voice is not None and not Path(voice).expanduser().is_file() and (
                (folder / "voices").is_dir() or (folder / "voices.tgz").is_file()):
            known = list_voices(voice_dir(folder))
            if str(voice) not in known:
                raise MlxSpeechError(f"unknown voice {str(voice)!r} (known: "
                                     f"{', '.join(sorted(known)) or 'none in this checkpoint'}; "
                                     "or pass a .pt, .safetensors or audio file)")

    def __init__(self, lm: LM, mimi, tokenizer: TextTokenizer, gen_config: GenConfig | None = None,
                 voices: dict[str, Path] | None = None):
        self.lm, self.mimi, self.tokenizer = lm, mimi, tokenizer
        self.config: LmConfig = lm.config
        self.gen_config = gen_config or GenConfig()
        self.steps = CompiledLm(lm)  # the LM's compiled streaming steps, shared by sessions
        self._voices = dict(voices or {})
        c = self.config
        if mimi.num_codebooks < max(c.n_agent, c.n_user):
            raise CheckpointError(f"Mimi gives {mimi.num_codebooks} codebooks, the LM needs "
                                  f"{max(c.n_agent, c.n_user)}")
        if mimi.cardinality != c.card:
            raise CheckpointError(f"Mimi has {mimi.cardinality} codes per codebook but the LM "
                                  f"has {c.card}")

    @property
    def sample_rate(self) -> int:
        return self.mimi.sample_rate

    @property
    def frame_size(self) -> int:
        return self.mimi.frame_size

    @property
    def roles(self) -> bool:
        """Whether sessions take a text role prompt and voice prompts (PersonaPlex)."""
        return bool(self.config.personaplex)

    def weight_bytes(self) -> int:
        return parameter_bytes([self.lm, self.mimi])

    @property
    def voices(self) -> list[str]:
        return sorted(self._voices)

    def voice(self, voice: str | os.PathLike) -> VoicePrompt:
        """A voice by name (see `voices`) or a .pt / .safetensors / audio file."""
        p = self._voices.get(str(voice))
        if p is None:
            p = Path(voice).expanduser()
            if not p.is_file():
                known = ", ".join(self.voices) or "none in this checkpoint"
                raise MlxSpeechError(f"unknown voice {str(voice)!r} (known: {known}; or pass "
                                     "a .pt, .safetensors or audio file)")
        return load_voice(p, self.mimi, self.config.n_agent)

    def session(self, voice: str | os.PathLike | None = None, role: str | None = None,
                seed: int = 0, temp: float | None = None, temp_text: float | None = None,
                user_lag: int | None = None) -> DuplexSession:
        """A conversation. `voice`/`role` prompt PersonaPlex (default voice NATF0 when the
        checkpoint has it); `temp`/`temp_text` 0 = greedy (defaults from the checkpoint's
        lm_gen_config, else 0.8 / 0.7 with top-k 250 / 25); `user_lag` 0 or 1 frames between
        the user's audio and the step that consumes it (default: `DEFAULT_USER_LAG` per family).
        """
        if voice is None and self.config.personaplex and DEFAULT_VOICE in self._voices:
            voice = DEFAULT_VOICE
        prompt = self.voice(voice) if voice is not None else None
        return DuplexSession(self, prompt, role, seed, temp, temp_text, user_lag)

    def respond(self, user_audio: np.ndarray, **session_kwargs) -> tuple[np.ndarray, str]:
        """Offline: run a whole clip (float32 mono at `sample_rate`) through one session's step
        loop, the last frame zero-padded; returns the model's audio (same length) and text."""
        from ...audio import check_audio

        x = check_audio(user_audio, "user_audio")
        F = self.frame_size
        n = -(-x.size // F)
        x = np.pad(x, (0, n * F - x.size))
        s = self.session(**session_kwargs)
        pcm, text = [], []
        for i in range(n):
            p, t = s.step(x[i * F:(i + 1) * F])
            pcm.append(p)
            text.append(t)
        out = np.concatenate(pcm) if pcm else np.zeros(0, np.float32)
        return out[: user_audio.shape[0]], "".join(text)


# Kyutai's moshi_mlx releases name the bits in the file; moshi_mlx uses group 32 for 4 bits.
_KYUTAI_QUANT = re.compile(r"\.q([48])\.safetensors$")
KYUTAI_MLX_NAMES = ["model.q4.safetensors", "model.q8.safetensors"]


def kyutai_declared(name: str) -> dict | None:
    """{bits, group_size} a Kyutai MLX file name declares (model.q4 / model.q8), else None."""
    m = _KYUTAI_QUANT.search(name)
    if m is None:
        return None
    bits = int(m.group(1))
    return {"bits": bits, "group_size": 32 if bits == 4 else 64, "mode": "affine"}


def load(folder: str | os.PathLike, dtype: mx.Dtype | None = None,
         quantize: int | None = None, group_size: int = 64) -> Moshi:
    """Load a Kyutai / PersonaPlex folder (`mlx_speech.load` also takes a hub repo id).
    `dtype`: LM dtype (default: as stored, bf16 for released files); Mimi always runs in
    float32. Quantized LM files (Kyutai's moshi_mlx `model.q4` / `model.q8`) load as they are;
    `quantize` (4, 6 or 8 bits, group `group_size`; Kyutai's q4 is group 32) quantizes a
    full-precision LM on the fly."""
    from .. import mimi as mimi_pkg

    folder = Path(folder).expanduser()
    raw = read_json(folder / "config.json", required=False)
    if raw is not None and raw.get("model_type") == "personaplex":
        return _load_personaplex_mlx(folder, raw, dtype, quantize, group_size)
    files = CheckpointFiles.from_config(raw)
    if files.model_type != "moshi":
        raise CheckpointError(f"{folder}: Kyutai model type {files.model_type!r} is not "
                              "supported (only moshi)")
    if not files.has_config and not (folder / files.moshi_name).is_file():
        found = [n for n in KYUTAI_MLX_NAMES if (folder / n).is_file()]
        if found:  # kyutai/moshiko-mlx-q4, -q8: no config, the bits are in the file name
            files.moshi_name = found[0]
    paths = {}
    for what, name in (("LM weights", files.moshi_name), ("Mimi weights", files.mimi_name),
                       ("text tokenizer", files.tokenizer_name)):
        p = folder / name
        if not p.is_file():
            raise CheckpointError(f"{folder} has no {what} ({name})")
        paths[what] = p
    config = LmConfig.from_dict(files.lm)
    weights, converted = read_weights([paths["LM weights"]])
    lm = build_lm(config, weights, paths["LM weights"], dtype, quantize, group_size,
                  kyutai_declared(files.moshi_name), converted=converted)
    mimi_cfg = None
    if files.mimi_config_name:
        mimi_cfg = read_json(folder / files.mimi_config_name)
    try:
        mimi = mimi_pkg.load(paths["Mimi weights"], config=mimi_cfg,
                             num_codebooks=max(config.n_agent, config.n_user))
    except ValueError as e:
        raise CheckpointError(f"{paths['Mimi weights']}: {e}") from None
    tok = TextTokenizer.from_file(paths["text tokenizer"])
    voices = list_voices(voice_dir(folder)) if config.personaplex else {}
    return Moshi(lm, mimi, tok, GenConfig.from_dict(files.lm_gen), voices)


def _load_personaplex_mlx(folder: Path, raw: dict, dtype, quantize, group_size) -> Moshi:
    """The community PersonaPlex MLX layout (aufklarer/PersonaPlex-7B-MLX-4bit, -8bit): split
    temporal / depformer / embeddings files (quantized parts as `quantization` says), the
    PyTorch-layout Mimi, the SentencePiece model and `voices/`."""
    from .. import mimi as mimi_pkg

    paths = {}
    for what, name in PERSONAPLEX_MLX_FILES.items():
        p = folder / name
        if not p.is_file():
            raise CheckpointError(f"{folder} has no {what} file ({name})")
        paths[what] = p
    parts = {k: load_safetensors([paths[k]]) for k in ("temporal", "depformer", "embeddings")}
    config = LmConfig.from_dict(personaplex_mlx_kwargs(raw))
    merged = personaplex_mlx_weights(parts)
    for part in parts.values():
        part.clear()
    lm = build_lm(config, merged, folder, dtype, quantize, group_size, quantization_declared(raw))
    try:
        mimi = mimi_pkg.load(paths["mimi"], num_codebooks=max(config.n_agent, config.n_user))
    except ValueError as e:
        raise CheckpointError(f"{paths['mimi']}: {e}") from None
    tok = TextTokenizer.from_file(paths["tokenizer"])
    return Moshi(lm, mimi, tok, GenConfig(), list_voices(voice_dir(folder)))

