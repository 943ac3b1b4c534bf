"""Voxtral-4B-TTS configuration from Mistral's params.json (or mlx-audio's config.json), and
the preset voices: `voice_embedding/<name>.safetensors` or `.pt`, rows [N, dim] each, loaded
lazily (memory-mapped safetensors) and checked against tekken.json's
`audio.voice_num_audio_tokens` (the number of [AUDIO] placeholders)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import mlx.core as mx

from ...errors import CheckpointError, MlxSpeechError
from ..loading import read_tensors

SAMPLE_RATE = 24_000
N_SPECIAL = 2  # audio codes 0 = EMPTY_AUDIO, 1 = END_AUDIO; real codes are raw + 2
END_AUDIO = 1

# ALiBi slope sets of the codec: vllm-omni 1, 1/2, ..., 1/128 ("vo") and
# mlx-audio / voxtral-tts.c 1/2, ..., 1/256 ("mlxa"); real weights must settle it.
ALIBI_SLOPES = ("vo", "mlxa")


def _ints(s) -> list[int]:
    if isinstance(s, str):
        return [int(x) for x in s.split(",") if x.strip()]
    return [int(x) for x in s]


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _pick(cls, d: dict, **renames):
    """Dataclass from the keys it declares (after renames); unknown keys dropped."""
    names = {f.name for f in fields(cls)}
    kw = {renames.get(k, k): v for k, v in d.items()}
    return cls(**{k: v for k, v in kw.items() if k in names})


@dataclass
class BackboneConfig:
    dim: int = 3072
    n_layers: int = 26
    head_dim: int = 128
    hidden_dim: int = 9216
    n_heads: int = 32
    n_kv_heads: int = 8
    rope_theta: float = 1e6
    norm_eps: float = 1e-5
    vocab_size: int = 131072


@dataclass
class AcousticConfig:
    dim: int = 3072
    n_layers: int = 3
    head_dim: int = 128
    hidden_dim: int = 9216
    n_heads: int = 32
    n_kv_heads: int = 8
    norm_eps: float = 1e-5
    sigma_max: float = 1.0
    n_steps: int = 7  # Euler steps on t = 0, 1/7, ..., 6/7 (params.json has no key for it)
    cfg_alpha: float = 1.2


@dataclass
class CodecConfig:
    dim: int = 1024
    hidden_dim: int = 4096
    head_dim: int = 128
    n_heads: int = 8
    n_kv_heads: int = 8
    norm_eps: float = 0.01
    qk_norm_eps: float = 1e-6
    semantic_codebook_size: int = 8192
    semantic_dim: int = 256
    acoustic_codebook_size: int = 21
    acoustic_dim: int = 36
    pretransform_patch_size: int = 240
    patch_proj_kernel_size: int = 7
    attn_sliding_window_size: int = 16
    lengths: list[int] = field(default_factory=lambda: [2, 2, 2, 2])
    kernels: list[int] = field(default_factory=lambda: [3, 4, 4, 4])
    strides: list[int] = field(default_factory=lambda: [1, 2, 2, 2])
    alibi: str = "vo"
    codebook_eps: float = 1e-5  # clamp of cluster_usage (vllm-omni)

    def __post_init__(self):
        if not (len(self.lengths) == len(self.kernels) == len(self.strides) > 0):
            raise ValueError(f"codec stages disagree: lengths {self.lengths}, kernels "
                             f"{self.kernels}, strides {self.strides}")
        if self.alibi not in ALIBI_SLOPES:
            raise ValueError(f"alibi must be one of {ALIBI_SLOPES}, not {self.alibi!r}")

    @property
    def latent_dim(self) -> int:
        return self.semantic_dim + self.acoustic_dim

    @property
    def upsample(self) -> int:
        n = 1
        for s in self.strides:
            n *= s
        return n

    @property
    def frame_samples(self) -> int:
        return self.upsample * self.pretransform_patch_size

    @property
    def windows(self) -> list[int]:
        """Per-stage windows: the last stage has the full window, halved per later ConvT."""
        out, w = [], self.attn_sliding_window_size
        for s in reversed(self.strides):
            out.append(w)
            w = max(1, w // s)
        return out[::-1]

    @property
    def alibi_slopes(self) -> list[float]:
        first = 0 if self.alibi == "vo" else 1  # slope_h = 2^(-8 (h + first) / n)
        return [2.0 ** (-8.0 * (h + first) / self.n_heads) for h in range(self.n_heads)]


@dataclass
class VoxtralTTSConfig:
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    acoustic: AcousticConfig = field(default_factory=AcousticConfig)
    codec: CodecConfig = field(default_factory=CodecConfig)
    semantic_codebook_size: int = 8192
    acoustic_codebook_size: int = 21
    n_acoustic_codebook: int = 36
    sample_rate: int = SAMPLE_RATE
    frame_rate: float = 12.5
    voices: list[str] = field(default_factory=list)
    # Table sizes: set from the weight shapes at load; the defaults are vllm-omni's.
    semantic_head_rows: int = 0
    audio_table_rows: int = 0

    def __post_init__(self):
        if not self.semantic_head_rows:
            self.semantic_head_rows = _round_up(self.semantic_codebook_size + N_SPECIAL, 128)
        if not self.audio_table_rows:
            self.audio_table_rows = _round_up(
                self.semantic_codebook_size + N_SPECIAL
                + self.n_acoustic_codebook * (self.acoustic_codebook_size + N_SPECIAL), 128)

    @property
    def n_codebooks(self) -> int:
        return 1 + self.n_acoustic_codebook

    @property
    def code_offsets(self) -> list[int]:
        """Row offset of each codebook in the feedback embedding table."""
        sem = self.semantic_codebook_size + N_SPECIAL
        return [0] + [sem + k * (self.acoustic_codebook_size + N_SPECIAL)
                      for k in range(self.n_acoustic_codebook)]

    @classmethod
    def from_params(cls, p: dict) -> VoxtralTTSConfig:
        """Mistral params.json (`*_str` fields are comma-separated strings)."""
        mm = p.get("multimodal", {})
        am = mm.get("audio_model_args", {})
        enc = am.get("audio_encoding_args", {})
        at = mm.get("audio_tokenizer_args", {})
        backbone = _pick(BackboneConfig, p)
        acoustic = _pick(AcousticConfig, am.get("acoustic_transformer_args", {}),
                         n_decoding_steps="n_steps")
        codec = _pick(CodecConfig, at, decoder_transformer_lengths_str="lengths",
                      decoder_convs_kernels_str="kernels", decoder_convs_strides_str="strides")
        for name in ("lengths", "kernels", "strides"):
            setattr(codec, name, _ints(getattr(codec, name)))
        codec.__post_init__()
        voice = at.get("voice") or {}
        return cls(
            backbone=backbone, acoustic=acoustic, codec=codec,
            semantic_codebook_size=am.get("semantic_codebook_size", 8192),
            acoustic_codebook_size=am.get("acoustic_codebook_size", 21),
            n_acoustic_codebook=am.get("n_acoustic_codebook", 36),
            sample_rate=enc.get("sampling_rate", at.get("sampling_rate", SAMPLE_RATE)),
            frame_rate=enc.get("frame_rate", 12.5),
            voices=sorted(voice, key=lambda v: voice[v]) if isinstance(voice, dict) else [],
        )

    @classmethod
    def from_mlx_audio(cls, c: dict) -> VoxtralTTSConfig:
        """mlx-audio's flat config.json (mlx-community conversions)."""
        g = c.get
        backbone = _pick(BackboneConfig, c)
        acoustic = AcousticConfig(
            dim=g("acoustic_dim", 3072), n_layers=g("acoustic_n_layers", 3),
            head_dim=g("acoustic_head_dim", 128), hidden_dim=g("acoustic_hidden_dim", 9216),
            n_heads=g("acoustic_n_heads", 32), n_kv_heads=g("acoustic_n_kv_heads", 8),
            norm_eps=g("norm_eps", 1e-5), sigma_max=g("acoustic_sigma_max", 1.0))
        codec = CodecConfig(
            dim=g("tokenizer_dim", 1024), hidden_dim=g("tokenizer_hidden_dim", 4096),
            head_dim=g("tokenizer_head_dim", 128), n_heads=g("tokenizer_n_heads", 8),
            n_kv_heads=g("tokenizer_n_kv_heads", 8), norm_eps=g("tokenizer_norm_eps", 0.01),
            semantic_codebook_size=g("semantic_codebook_size", 8192),
            semantic_dim=g("tokenizer_semantic_dim", 256),
            acoustic_codebook_size=g("acoustic_codebook_size", 21),
            acoustic_dim=g("tokenizer_acoustic_dim", 36),
            pretransform_patch_size=g("tokenizer_patch_size", 240),
            patch_proj_kernel_size=g("tokenizer_patch_proj_kernel_size", 7),
            lengths=_ints(g("tokenizer_decoder_transformer_lengths_str", "2,2,2,2")),
            kernels=_ints(g("tokenizer_decoder_convs_kernels_str", "3,4,4,4")),
            strides=_ints(g("tokenizer_decoder_convs_strides_str", "1,2,2,2")))
        return cls(backbone=backbone, acoustic=acoustic, codec=codec,
                   semantic_codebook_size=g("semantic_codebook_size", 8192),
                   acoustic_codebook_size=g("acoustic_codebook_size", 21),
                   n_acoustic_codebook=g("n_acoustic_codebook", 36),
                   sample_rate=g("sample_rate", SAMPLE_RATE), frame_rate=g("frame_rate", 12.5))


# Preset voices.
DEFAULT_VOICE = "casual_male"  # mlx-audio's default and README example


class Voices:
    def __init__(self, folder: Path, num_tokens: dict[str, int] | None, dim: int):
        self.num_tokens = dict(num_tokens or {})
        self.dim = dim
        self.files: dict[str, Path] = {}
        if folder.is_dir():
            for ext in (".pt", ".safetensors"):  # safetensors wins when both exist
                for f in folder.glob(f"*{ext}"):
                    self.files[f.stem] = f
        self._loaded: dict[str, mx.array] = {}

    @property
    def names(self) -> list[str]:
        return sorted(self.files)

    def default(self) -> str:
        if not self.files:
            raise MlxSpeechError("this checkpoint has no voices (voice_embedding/ is empty)")
        return DEFAULT_VOICE if DEFAULT_VOICE in self.files else self.names[0]

    def __getitem__(self, name: str) -> mx.array:
        if name in self._loaded:
            return self._loaded[name]
        if name not in self.files:
            raise MlxSpeechError(f"unknown voice {name!r}; known voices: "
                                 f"{', '.join(self.names) or '(none)'}")
        emb = _read(self.files[name])
        if emb.ndim != 2 or emb.shape[1] != self.dim:
            raise CheckpointError(f"voice {name}: shape {tuple(emb.shape)}, expected "
                                  f"(N, {self.dim})")
        want = self.num_tokens.get(name)
        if want is not None and want != emb.shape[0]:
            raise CheckpointError(f"voice {name} has {emb.shape[0]} rows but tekken.json "
                                  f"says {want} [AUDIO] tokens")
        self._loaded[name] = emb
        return emb


def _read(path: Path) -> mx.array:
    data = read_tensors(path, "voice")
    if isinstance(data, mx.array):
        return data
    if isinstance(data, dict) and data:
        if "embedding" in data:
            return data["embedding"]
        if len(data) == 1:
            return next(iter(data.values()))
    raise CheckpointError(f"{path}: expected one tensor (key 'embedding')")
