"""Mimi configuration: Kyutai's json form (`seanet`, `transformer`, `quantizer` blocks)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ...nn import TransformerConfig

MIMI_FILE = "tokenizer-e351c8d8-checkpoint125.safetensors"  # in Kyutai repos (as hub.MIMI_FILE)


def _known(cls, d: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}


@dataclass
class SeanetConfig:
    channels: int = 1
    dimension: int = 512
    n_filters: int = 64
    n_residual_layers: int = 1
    ratios: list[int] = field(default_factory=lambda: [8, 6, 5, 4])  # decoder order
    kernel_size: int = 7
    residual_kernel_size: int = 3
    last_kernel_size: int = 3
    dilation_base: int = 2
    compress: int = 2
    true_skip: bool = True

    @property
    def hop_length(self) -> int:
        h = 1
        for r in self.ratios:
            h *= r
        return h


@dataclass
class QuantizerConfig:
    dimension: int = 256
    n_q: int = 32
    bins: int = 2048
    input_dimension: int = 512
    output_dimension: int = 512
    n_q_semantic: int = 1


@dataclass
class MimiTransformerConfig:
    """A `ProjectedTransformer`: the transformer plus optional in/out projections."""

    transformer: TransformerConfig
    input_dimension: int
    output_dimension: int


@dataclass
class MimiConfig:
    sample_rate: int = 24000
    frame_rate: float = 12.5
    seanet: SeanetConfig = field(default_factory=SeanetConfig)
    transformer: MimiTransformerConfig = field(default_factory=lambda: _transformer({}))
    quantizer: QuantizerConfig = field(default_factory=QuantizerConfig)

    @classmethod
    def from_dict(cls, d: dict) -> MimiConfig:
        """Kyutai's Mimi json (moshi `_mimi_config`); missing keys take mimi_202407 values."""
        base = cls()
        seanet = SeanetConfig(**_known(SeanetConfig, d.get("seanet", {})))
        for key, want in (("causal", True), ("norm", "none"), ("pad_mode", "constant"),
                          ("activation", "ELU")):
            got = d.get("seanet", {}).get(key, want)
            if got != want:
                raise ValueError(f"Mimi seanet.{key}={got!r} is not supported (need {want!r})")
        return cls(
            sample_rate=int(d.get("sample_rate", base.sample_rate)),
            frame_rate=float(d.get("frame_rate", base.frame_rate)),
            seanet=seanet,
            transformer=_transformer(d.get("transformer", {})),
            quantizer=QuantizerConfig(**_known(QuantizerConfig, d.get("quantizer", {}))),
        )

    @property
    def frame_size(self) -> int:
        return int(self.sample_rate / self.frame_rate)

    @property
    def encoder_frame_rate(self) -> float:
        return self.sample_rate / self.seanet.hop_length

    @property
    def resample_stride(self) -> int:
        s = self.encoder_frame_rate / self.frame_rate
        if s != int(s) or s < 1:
            raise ValueError(f"encoder rate {self.encoder_frame_rate} / frame rate "
                             f"{self.frame_rate} is not an integer stride")
        return int(s)


def _transformer(d: dict) -> MimiTransformerConfig:
    kw = dict(d_model=512, num_heads=8, num_layers=8, dim_feedforward=2048, causal=True,
              context=250, norm="layer_norm", gating="none", layer_scale=0.01,
              positional_embedding="rope", max_period=10000.0)
    kw.update(_known(TransformerConfig, d))
    kw["max_period"] = float(kw["max_period"])
    if not d.get("conv_layout", True):
        raise ValueError("Mimi transformers use conv_layout=True")
    outs = d.get("output_dimensions", [kw["d_model"]])
    if len(outs) != 1:
        raise ValueError(f"Mimi transformers have one output, got {outs}")
    return MimiTransformerConfig(TransformerConfig(**kw), int(d.get("input_dimension",
                                                                    kw["d_model"])), int(outs[0]))
