"""Streaming Sortformer configuration, from NeMo's model_config.yaml or mlx-audio's config.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ...errors import CheckpointError

SAMPLE_RATE = 16_000
FRAME_S = 0.08  # one diarization frame = 8 mel frames of 10 ms


@dataclass
class SortformerConfig:
    # FastConformer encoder (NeMo `encoder`)
    n_mels: int = 128
    d_model: int = 512
    n_layers: int = 17
    n_heads: int = 8
    ff_hidden: int = 2048
    conv_kernel: int = 9
    subsampling_factor: int = 8
    subsampling_channels: int = 256
    xscaling: bool = True
    use_bias: bool = True
    # transformer encoder (NeMo `transformer_encoder`, post-LN)
    tf_d_model: int = 192
    tf_layers: int = 18
    tf_heads: int = 8
    tf_ff_hidden: int = 768
    # speaker heads and streaming (NeMo `sortformer_modules`)
    n_spk: int = 4
    spkcache_len: int = 188
    fifo_len: int = 0
    chunk_len: int = 188
    spkcache_update_period: int = 188
    chunk_left_context: int = 1
    chunk_right_context: int = 1
    spkcache_sil_frames_per_spk: int = 3
    pred_score_threshold: float = 0.25
    scores_boost_latest: float = 0.05
    sil_threshold: float = 0.2
    strong_boost_rate: float = 0.75
    weak_boost_rate: float = 1.5
    min_pos_scores_rate: float = 0.5
    # offline forward: audio / (max(audio) + eps), as NeMo's non-streaming forward
    eps: float = 1e-3

    def check(self) -> SortformerConfig:
        if self.subsampling_factor != 8:
            raise CheckpointError("only dw_striding x8 subsampling is supported")
        if self.spkcache_len < (1 + self.spkcache_sil_frames_per_spk) * self.n_spk:
            raise CheckpointError("spkcache_len is below (1 + sil frames per speaker) * speakers")
        if min(self.chunk_len, self.spkcache_update_period) < 1 or min(
                self.fifo_len, self.chunk_left_context, self.chunk_right_context) < 0:
            raise CheckpointError("invalid streaming parameters")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    def streaming(self, **overrides) -> SortformerConfig:
        """A copy with other streaming parameters (chunk_len, fifo_len, ...)."""
        names = {f.name for f in fields(self)}
        bad = [k for k in overrides if k not in names]
        if bad:
            raise CheckpointError(f"unknown streaming parameter {bad[0]!r}")
        return SortformerConfig(**{**asdict(self), **overrides}).check()

    @classmethod
    def from_nemo(cls, c: dict) -> SortformerConfig:
        e, t = c.get("encoder") or {}, c.get("transformer_encoder") or {}
        m, p = c.get("sortformer_modules") or {}, c.get("preprocessor") or {}
        want = {"subsampling": "dw_striding", "self_attention_model": "rel_pos",
                "conv_norm_type": "batch_norm", "causal_downsampling": False,
                "untie_biases": True}
        for k, v in want.items():
            if k in e and e[k] != v:
                raise CheckpointError(f"unsupported Sortformer encoder setting {k}={e[k]!r}")
        if list(e.get("att_context_size") or [-1, -1]) != [-1, -1]:
            raise CheckpointError("only full-context (att_context_size [-1, -1]) encoders")
        if e.get("conv_context_size") not in (None, "symmetric"):
            raise CheckpointError("only symmetric conformer convolutions are supported")
        if t.get("pre_ln", False) or t.get("hidden_act", "relu") != "relu":
            raise CheckpointError("only post-LN ReLU transformer encoders are supported")
        if str(p.get("normalize", "NA")) not in ("NA", "None"):
            raise CheckpointError(f"unsupported feature normalisation {p.get('normalize')!r}")
        for k, v in (("n_fft", 512), ("window_size", 0.025), ("window_stride", 0.01),
                     ("sample_rate", SAMPLE_RATE)):
            if p.get(k, v) != v:
                raise CheckpointError(f"unsupported preprocessor setting {k}={p[k]!r}")
        d = e.get("d_model", 512)
        ch = e.get("subsampling_conv_channels", -1)
        kw = dict(
            n_mels=e.get("feat_in", 128), d_model=d, n_layers=e.get("n_layers", 17),
            n_heads=e.get("n_heads", 8), ff_hidden=d * e.get("ff_expansion_factor", 4),
            conv_kernel=e.get("conv_kernel_size", 9),
            subsampling_factor=e.get("subsampling_factor", 8),
            subsampling_channels=d if ch in (-1, None) else ch,
            xscaling=e.get("xscaling", True), use_bias=e.get("use_bias", True),
            tf_d_model=t.get("hidden_size", 192), tf_layers=t.get("num_layers", 18),
            tf_heads=t.get("num_attention_heads", 8), tf_ff_hidden=t.get("inner_size", 768),
            n_spk=m.get("num_spks", c.get("max_num_of_spks", 4)), eps=c.get("eps", 1e-3),
        )
        if m.get("fc_d_model", d) != d:
            raise CheckpointError("sortformer_modules.fc_d_model differs from encoder.d_model")
        for f in fields(cls):
            if f.name in m and f.name not in kw:
                kw[f.name] = m[f.name]
        return cls(**kw).check()

    @classmethod
    def from_mlx_audio(cls, c: dict) -> SortformerConfig:
        """mlx-audio's / mlx-community's `config.json` (model_type "sortformer")."""
        e, t = c.get("fc_encoder_config") or {}, c.get("tf_encoder_config") or {}
        m, p = c.get("modules_config") or {}, c.get("processor_config") or {}
        if t.get("activation_function", "relu") != "relu":
            raise CheckpointError("only ReLU transformer encoders are supported")
        if not m.get("use_aosc", True):
            raise CheckpointError("only the streaming (v2+) Sortformer is supported")
        kw = dict(
            n_mels=e.get("num_mel_bins", p.get("feature_size", 128)),
            d_model=e.get("hidden_size", 512), n_layers=e.get("num_hidden_layers", 17),
            n_heads=e.get("num_attention_heads", 8), ff_hidden=e.get("intermediate_size", 2048),
            conv_kernel=e.get("conv_kernel_size", 9),
            subsampling_factor=e.get("subsampling_factor", 8),
            subsampling_channels=e.get("subsampling_conv_channels", 256),
            xscaling=e.get("scale_input", True), use_bias=e.get("attention_bias", True),
            tf_d_model=t.get("d_model", 192), tf_layers=t.get("encoder_layers", 18),
            tf_heads=t.get("encoder_attention_heads", 8),
            tf_ff_hidden=t.get("encoder_ffn_dim", 768),
            n_spk=m.get("num_speakers", c.get("num_speakers", 4)),
        )
        for f in fields(cls):
            if f.name in m and f.name not in kw:
                kw[f.name] = m[f.name]
        return cls(**kw).check()

    def to_mlx_audio(self) -> dict:
        """The config.json our converter writes (mlx-audio's form, which we also read)."""
        modules = {f.name: getattr(self, f.name) for f in fields(self)
                   if f.name.startswith(("spkcache", "fifo", "chunk", "pred_", "scores",
                                         "sil_", "strong", "weak", "min_pos"))}
        return {
            "model_type": "sortformer", "num_speakers": self.n_spk,
            "fc_encoder_config": {
                "hidden_size": self.d_model, "num_hidden_layers": self.n_layers,
                "num_attention_heads": self.n_heads, "intermediate_size": self.ff_hidden,
                "num_mel_bins": self.n_mels, "conv_kernel_size": self.conv_kernel,
                "subsampling_factor": self.subsampling_factor,
                "subsampling_conv_channels": self.subsampling_channels,
                "attention_bias": self.use_bias, "scale_input": self.xscaling,
            },
            "tf_encoder_config": {
                "d_model": self.tf_d_model, "encoder_layers": self.tf_layers,
                "encoder_attention_heads": self.tf_heads, "encoder_ffn_dim": self.tf_ff_hidden,
                "activation_function": "relu",
            },
            "modules_config": {"num_speakers": self.n_spk, "fc_d_model": self.d_model,
                               "tf_d_model": self.tf_d_model, "use_aosc": True, **modules},
            "processor_config": {"feature_size": self.n_mels, "sampling_rate": SAMPLE_RATE,
                                 "hop_length": 160, "n_fft": 512, "win_length": 400,
                                 "preemphasis": 0.97},
        }
