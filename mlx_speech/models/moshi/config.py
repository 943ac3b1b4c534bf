"""Moshi / PersonaPlex LM configuration: Kyutai `LMModel` kwargs and hub `config.json`.

A Kyutai hub `config.json` (the `moshi` package's CheckpointInfo layout) is the LM kwargs plus
file names (`moshi_name`, `mimi_name`, `tokenizer_name`, `mimi_config_name`, `lora_name`),
`model_type`, `lm_gen_config`, `tts_config`, `stt_config` and `model_id`. Without a config.json
the folder is a Moshi 7B (moshiko/moshika) with the default file names below.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ...errors import CheckpointError
from ..mimi.config import MIMI_FILE

MOSHI_NAME = "model.safetensors"
MIMI_NAME = MIMI_FILE  # Mimi's weights beside the LM in Kyutai's repos
TOKENIZER_NAME = "tokenizer_spm_32k_3.model"

# Moshi 7B (moshiko / moshika); PersonaPlex is the same with dep_q 16 (taken from its weights).
MOSHI_7B = dict(
    dim=4096, text_card=32000, existing_text_padding_id=3, n_q=16, dep_q=8, card=2048,
    num_heads=32, num_layers=32, hidden_scale=4.125, causal=True, layer_scale=None,
    context=3000, max_period=10000, gating="silu", norm="rms_norm_f32",
    positional_embedding="rope", depformer_dim=1024, depformer_dim_feedforward=int(4.125 * 1024),
    depformer_num_heads=16, depformer_num_layers=6, depformer_layer_scale=None,
    depformer_multi_linear=True, depformer_context=8, depformer_max_period=10000,
    depformer_gating="silu", depformer_pos_emb="none", depformer_weights_per_step=True,
    delays=[0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
)

# CheckpointInfo keys that are not LM kwargs.
_META_KEYS = {"moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name", "lora_name",
              "model_type", "lm_gen_config", "tts_config", "stt_config", "model_id"}
# LM kwargs that change the architecture in ways this port does not implement.
_UNSUPPORTED = {
    "norm_emb": False, "depformer_low_rank_embeddings": None,
    "depformer_weights_per_step_schedule": None, "demux_second_stream": False,
    "demux_second_text_stream": False, "conditioners": None, "fuser": None,
    "extra_heads_num_heads": 0, "depformer_norm": None, "text_card_out": None,
    "cross_attention": False, "lora": False, "bias_proj": False, "bias_ff": False,
    "bias_attn": False, "kv_repeat": 1,
}
# Accepted and ignored: the depformer's attention is never windowed (PyTorch forces
# context=None), and the rest only matter for training.
_IGNORED = {"depformer_context", "depformer_causal", "gradient_checkpointing", "quantize",
            "existing_text_end_padding_id", "lora_rank", "lora_scaling"}


@dataclass
class LmConfig:
    dim: int
    text_card: int
    n_q: int
    dep_q: int
    card: int
    num_heads: int
    num_layers: int
    delays: list[int]
    hidden_scale: float = 4.125
    causal: bool = True
    layer_scale: float | None = None
    context: int | None = None
    max_period: float = 10000.0
    gating: str = "silu"
    norm: str = "rms_norm_f32"
    positional_embedding: str = "rope"
    existing_text_padding_id: int = 3
    depformer_dim: int = 1024
    depformer_dim_feedforward: int | None = None
    depformer_num_heads: int = 16
    depformer_num_layers: int = 6
    depformer_layer_scale: float | None = None
    depformer_multi_linear: bool = True
    depformer_max_period: float = 10000.0
    depformer_gating: str = "silu"
    depformer_pos_emb: str = "none"
    depformer_weights_per_step: bool = True
    extra: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: dict) -> LmConfig:
        """LM kwargs (with or without hub metadata); unsupported features raise."""
        d = {k: v for k, v in d.items() if k not in _META_KEYS and k not in _IGNORED}
        for k, ok in _UNSUPPORTED.items():
            v = d.pop(k, None)
            if v is not None and v != ok:
                raise CheckpointError(f"LM option {k}={v!r} is not supported by this port")
        known = {f.name for f in fields(cls)} - {"extra"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise CheckpointError(f"unknown LM config keys: {', '.join(unknown)}")
        try:
            cfg = cls(**d)
        except TypeError as e:
            raise CheckpointError(f"bad LM config: {e}") from None
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if len(self.delays) != self.n_q + 1:
            raise CheckpointError(f"expected {self.n_q + 1} delays, got {len(self.delays)}")
        if not 0 < self.dep_q <= self.n_q:
            raise CheckpointError(f"dep_q {self.dep_q} must be in 1..n_q ({self.n_q})")
        if self.dep_q == self.n_q and self.n_q % 2:
            raise CheckpointError("dep_q == n_q needs an even n_q (agent + user streams)")
        if min(self.delays) < 0:
            raise CheckpointError("delays must be >= 0")

    @property
    def num_codebooks(self) -> int:
        """Streams in the token tensor: text + n_q audio."""
        return self.n_q + 1

    @property
    def n_agent(self) -> int:
        """Audio codebooks of the model's own voice (streams 1..n_agent).

        Kyutai: the depformer generates exactly these. PersonaPlex (dep_q == n_q): the
        depformer also predicts the user's codebooks, so each side has n_q / 2.
        """
        return self.n_q // 2 if self.dep_q == self.n_q else self.dep_q

    @property
    def n_user(self) -> int:
        return self.n_q - self.n_agent

    @property
    def max_delay(self) -> int:
        return max(self.delays)

    @property
    def dim_feedforward(self) -> int:
        return int(self.hidden_scale * self.dim)

    @property
    def depformer_feedforward(self) -> int:
        if self.depformer_dim_feedforward is None:
            return int(self.hidden_scale * self.depformer_dim)
        return int(self.depformer_dim_feedforward)

    @property
    def personaplex(self) -> bool:
        """PersonaPlex layout: the depformer runs over every audio stream."""
        return self.dep_q == self.n_q


@dataclass
class GenConfig:
    """Sampling defaults (Kyutai LMGen / PersonaPlex); a hub `lm_gen_config` overrides them."""

    temp: float = 0.8
    temp_text: float = 0.7
    top_k: int = 250
    top_k_text: int = 25

    @classmethod
    def from_dict(cls, d: dict | None) -> GenConfig:
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def override(self, temp: float | None, temp_text: float | None) -> GenConfig:
        """These defaults with the temperatures a session asked for (None keeps a default)."""
        return replace(self, temp=self.temp if temp is None else temp,
                       temp_text=self.temp_text if temp_text is None else temp_text)


# The community PersonaPlex MLX folders (aufklarer/PersonaPlex-7B-MLX-4bit, -8bit): split weights,
# their own config.json (`model_type: personaplex`, `temporal`, `depformer`, `delays`,
# `quantization`), Mimi and voices beside them.
PERSONAPLEX_MLX_FILES = {"temporal": "temporal.safetensors", "depformer": "depformer.safetensors",
                         "embeddings": "embeddings.safetensors", "mimi": "mimi.safetensors",
                         "tokenizer": TOKENIZER_NAME}


def personaplex_mlx_kwargs(c: dict) -> dict:
    """Kyutai LM kwargs from a community PersonaPlex MLX config.json (Moshi 7B otherwise)."""
    t, d = c.get("temporal", {}), c.get("depformer", {})
    kw = dict(MOSHI_7B)
    for ours, theirs in (("dim", "dim"), ("num_layers", "num_layers"), ("num_heads", "num_heads"),
                         ("hidden_scale", "hidden_scale"), ("card", "card"),
                         ("text_card", "text_card"), ("context", "context"),
                         ("max_period", "max_period")):
        if theirs in t:
            kw[ours] = t[theirs]
    for ours, theirs in (("depformer_dim", "dim"), ("depformer_num_layers", "num_layers"),
                         ("depformer_num_heads", "num_heads"),
                         ("depformer_dim_feedforward", "dim_feedforward"),
                         ("dep_q", "num_steps"), ("depformer_weights_per_step", "weights_per_step"),
                         ("depformer_multi_linear", "multi_linear")):
        if theirs in d:
            kw[ours] = d[theirs]
    if "delays" in c:
        kw["delays"] = list(c["delays"])
        kw["n_q"] = len(kw["delays"]) - 1
    return kw


@dataclass
class CheckpointFiles:
    """What a Kyutai-layout folder names: LM weights, Mimi weights, tokenizer, configs."""

    moshi_name: str = MOSHI_NAME
    mimi_name: str = MIMI_NAME
    tokenizer_name: str = TOKENIZER_NAME
    mimi_config_name: str | None = None
    model_type: str = "moshi"
    lm: dict = field(default_factory=lambda: dict(MOSHI_7B))
    lm_gen: dict = field(default_factory=dict)
    has_config: bool = False

    @classmethod
    def from_config(cls, raw: dict | None) -> CheckpointFiles:
        if raw is None:
            return cls()
        if raw.get("lora_name"):
            raise CheckpointError("LoRA checkpoints (lora_name) are not supported")
        lm = {k: v for k, v in raw.items() if k not in _META_KEYS}
        return cls(
            moshi_name=raw.get("moshi_name", MOSHI_NAME),
            mimi_name=raw.get("mimi_name", MIMI_NAME),
            tokenizer_name=raw.get("tokenizer_name", TOKENIZER_NAME),
            mimi_config_name=raw.get("mimi_config_name"),
            model_type=raw.get("model_type", "moshi"),
            lm=lm or dict(MOSHI_7B),
            lm_gen=raw.get("lm_gen_config") or {},
            has_config=True,
        )
