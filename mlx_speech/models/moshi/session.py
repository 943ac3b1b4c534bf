"""Full-duplex session: 80 ms of user audio in, 80 ms of model audio and its text out, per step.

One step = Mimi encode (user frame) -> one LM step (temporal transformer + depformer) -> Mimi
decode (model frame), built as one lazy graph and evaluated once. The state (Mimi's encoder and
decoder streams, the LM's KV rings, the token cache, the RNG key, the detokenizer) lives here, so
any number of sessions can share one loaded model.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ...errors import AudioError, MlxSpeechError
from .gen import KyutaiGen, PersonaPlexGen
from .personaplex import SILENCE_SECONDS, VoicePrompt, run_prompt, wrap_system

# Per family, the reference's user alignment (spec §6.2): Kyutai's PyTorch server consumes a user
# frame in the step that receives it; PersonaPlex's LMGen always consumes it one step later.
DEFAULT_USER_LAG = {"kyutai": 0, "personaplex": 1}


class DuplexSession:
    """Create with `Moshi.session(...)`; then `step(user_pcm) -> (model_pcm, text)`."""

    def __init__(self, duplex, voice: VoicePrompt | None = None, role: str | None = None,
                 seed: int = 0, temp: float | None = None, temp_text: float | None = None,
                 user_lag: int | None = None):
        self.duplex = d = duplex
        cfg = d.config
        family = "personaplex" if cfg.personaplex else "kyutai"
        lag = DEFAULT_USER_LAG[family] if user_lag is None else user_lag
        if lag not in (0, 1):
            raise MlxSpeechError(f"user_lag must be 0 or 1, got {user_lag}")
        for name, t in (("temp", temp), ("temp_text", temp_text)):
            if t is not None and not (np.isfinite(t) and t >= 0):
                raise MlxSpeechError(f"{name} must be a number >= 0, got {t}")
        self.user_lag = lag
        sampling = d.gen_config.override(temp, temp_text)
        self.mimi_state = d.mimi.make_state()
        self.frames = 0
        self.prompt_forwards = 0
        if cfg.personaplex:
            if lag != 1:
                raise MlxSpeechError("PersonaPlex consumes user audio one frame late (its "
                                     "LMGen); user_lag=0 is only available for Kyutai models")
            self.gen = PersonaPlexGen(d.lm, cfg, sampling, seed=seed, steps=d.steps)
            ids = d.tokenizer.encode(wrap_system(role)) if role else None
            silence = int(SILENCE_SECONDS * d.mimi.frame_rate)
            self.prompt_forwards = run_prompt(self.gen, voice, ids, silence)
        else:
            if voice is not None or role:
                raise MlxSpeechError("voice and role prompts need a PersonaPlex checkpoint")
            self.gen = KyutaiGen(d.lm, cfg, sampling, user_lag=lag, seed=seed, steps=d.steps)
        self._text = d.tokenizer.stream()
        self._pending = ""

    @property
    def frame_size(self) -> int:
        return self.duplex.frame_size

    def _check(self, user_pcm) -> np.ndarray:
        x = user_pcm
        if not isinstance(x, np.ndarray):
            raise AudioError(f"user_pcm must be a numpy array, got {type(x).__name__}")
        if not np.issubdtype(x.dtype, np.floating):
            raise AudioError(f"user_pcm must be float samples in [-1, 1], got {x.dtype}")
        if x.shape != (self.frame_size,):
            raise AudioError(f"user_pcm must have shape ({self.frame_size},) "
                             f"({1000 * self.frame_size / self.duplex.sample_rate:g} ms at "
                             f"{self.duplex.sample_rate} Hz), got {x.shape}")
        if not np.isfinite(x).all():
            raise AudioError("user_pcm contains NaN or infinite samples")
        return x.astype(np.float32, copy=False)

    def step(self, user_pcm: np.ndarray) -> tuple[np.ndarray, str]:
        """One frame: float32 mono [frame_size] at `sample_rate` -> (model pcm [frame_size],
        new text). Until the model's first complete frame the pcm is zeros and the text ""."""
        x = self._check(user_pcm)
        d, cfg = self.duplex, self.duplex.config
        codes = d.mimi.encode_step(mx.array(x)[None, None], self.mimi_state)
        user = codes[:, : cfg.n_user]
        out = self.gen.step(user=user) if cfg.personaplex else self.gen.step(user)
        pcm = None
        if out.tokens is not None:
            pcm = d.mimi.decode_step(out.tokens[:, 1 : 1 + cfg.n_agent], self.mimi_state)
        todo = [a for a in (pcm, out.text) if a is not None]
        mx.eval(todo, self.gen.arrays(), self.mimi_state.arrays())
        self.frames += 1
        if out.text is not None:
            self._pending += self._text.add(int(out.text[0].item()))
        if pcm is None:
            return np.zeros(self.frame_size, np.float32), ""
        text, self._pending = self._pending, ""
        return np.array(pcm[0, 0], dtype=np.float32), text
