"""Kyutai Moshi and NVIDIA PersonaPlex: full-duplex speech-to-speech (Mimi + LM + depformer).

    d = mlx_speech.models.moshi.load("kyutai/moshiko-pytorch-bf16")   # or a folder
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
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...converted import is_converted
from ...errors import CheckpointError, MlxSpeechError
from ...hub import load_safetensors, read_json
from ..asr import load_strict
from .config import CheckpointFiles, GenConfig, LmConfig
from .gen import KyutaiGen, PersonaPlexGen, Sampling, StepOut, sample_token
from .lm import LM, LmState
from .personaplex import VoicePrompt, list_voices, load_voice, voice_dir
from .session import DEFAULT_USER_LAG, DuplexSession
from .tokenizer import TextTokenizer
from .weights import depformer_steps, gated_hidden, remap

__all__ = ["DEFAULT_USER_LAG", "LM", "CheckpointFiles", "DuplexSession", "GenConfig",
           "KyutaiGen", "LmConfig", "LmState", "Moshi", "PersonaPlexGen", "Sampling", "StepOut",
           "TextTokenizer", "build_lm", "load", "sample_token", "weight_patterns"]

DEFAULT_VOICE = "NATF0"  # PersonaPlex's web UI default


def weight_patterns(folder: Path) -> list[str]:
    """The files a (Kyutai or PersonaPlex) repo's config names, plus PersonaPlex's voices."""
    cfg = Path(folder) / "config.json"
    files = CheckpointFiles.from_config(read_json(cfg) if cfg.exists() else None)
    out = [files.moshi_name, files.mimi_name, files.tokenizer_name, "voices.tgz"]
    if files.mimi_config_name:
        out.append(files.mimi_config_name)
    return out


def build_lm(config: LmConfig, weights: dict[str, mx.array], where="LM",
             dtype: mx.Dtype | None = None, quantize: int | None = None,
             converted: bool = False) -> LM:
    """An LM from Kyutai/PersonaPlex-named tensors (`converted`: already in our names):
    strict, lazy (memory-mapped) loading."""
    n = depformer_steps(weights)
    if n != config.dep_q:
        if n == config.n_q and config.n_q % 2 == 0:
            config.dep_q = n  # PersonaPlex: NVIDIA's loader forces dep_q 16 over any config
        else:
            raise CheckpointError(f"{where}: config says dep_q={config.dep_q} but the weights "
                                  f"have {n} depformer heads")
    lm = LM(config, *gated_hidden(weights))
    load_strict(lm, weights if converted else remap(weights, lm), where, dtype)
    if quantize is not None:
        quantize_lm(lm, quantize)
    return lm


def quantize_lm(lm: LM, bits: int) -> None:
    """moshi_mlx's on-the-fly quantisation: 4 bit / group 32 or 8 bit / group 64 for every Linear
    and Embedding whose width allows it. The -1 -> zero rule lives outside the modules."""
    if bits not in (4, 8):
        raise MlxSpeechError(f"quantize must be 4 or 8 bits, got {bits}")
    group = 32 if bits == 4 else 64

    def ok(_, m) -> bool:
        return isinstance(m, (nn.Linear, nn.Embedding)) and m.weight.shape[-1] % group == 0

    nn.quantize(lm, group_size=group, bits=bits, class_predicate=ok)
    mx.eval(lm.parameters())


class Moshi:
    """A loaded duplex model (LM + Mimi + text tokenizer); sessions share it."""

    def __init__(self, lm: LM, mimi, tokenizer: TextTokenizer, gen_config: GenConfig | None = None,
                 voices: dict[str, Path] | None = None):
        self.lm, self.mimi, self.tokenizer = lm, mimi, tokenizer
        self.config: LmConfig = lm.config
        self.gen_config = gen_config or GenConfig()
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
    def family(self) -> str:
        return "personaplex" if self.config.personaplex else "kyutai"

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
        from ...audio.io import check_audio

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


def load(folder: str | os.PathLike, dtype: mx.Dtype | None = None,
         quantize: int | None = None) -> Moshi:
    """Load a Kyutai / PersonaPlex folder (or hub repo id). `dtype`: LM dtype (default: as
    stored, bf16 for released files); Mimi always runs in float32. `quantize`: 4 or 8 bits."""
    from ...hub import resolve
    from ...registry import weight_patterns as patterns
    from .. import mimi as mimi_pkg

    folder = resolve(folder, patterns)
    cfg_path = folder / "config.json"
    files = CheckpointFiles.from_config(read_json(cfg_path) if cfg_path.exists() else None)
    if files.model_type != "moshi":
        raise CheckpointError(f"{folder}: Kyutai model type {files.model_type!r} is not "
                              "supported (only moshi)")
    paths = {}
    for what, name in (("LM weights", files.moshi_name), ("Mimi weights", files.mimi_name),
                       ("text tokenizer", files.tokenizer_name)):
        p = folder / name
        if not p.is_file():
            raise CheckpointError(f"{folder} has no {what} ({name})")
        paths[what] = p
    config = LmConfig.from_dict(files.lm)
    lm = build_lm(config, load_safetensors([paths["LM weights"]]), paths["LM weights"],
                  dtype, quantize, converted=is_converted([paths["LM weights"]]))
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
