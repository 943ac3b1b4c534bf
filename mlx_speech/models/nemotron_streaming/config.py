"""Nemotron streaming ASR configuration (transformers config.json layout)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import MlxSpeechError

SAMPLE_RATE = 16_000
HOP = 160
N_FFT = 512
WIN = 400
PREEMPHASIS = 0.97
FRAME_MS = 80  # one encoder frame = 8 mel frames
LATENCY_MS = {1120: 13, 560: 6, 160: 1, 80: 0}  # streaming latency -> right context (frames)


@dataclass
class EncoderConfig:
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 8
    intermediate_size: int = 4096
    attention_bias: bool = False
    convolution_bias: bool = False
    conv_kernel_size: int = 9
    subsampling_factor: int = 8
    subsampling_conv_channels: int = 256
    subsampling_conv_kernel_size: int = 3
    subsampling_conv_stride: int = 2
    num_mel_bins: int = 128
    scale_input: bool = True  # the transformers default when config.json omits it
    left_context: int = 70  # sliding_window - 1
    default_right_context: int = 13
    max_position_embeddings: int = 5000
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def n_subsampling_layers(self) -> int:
        return self.subsampling_factor.bit_length() - 1

    @property
    def subsampled_freqs(self) -> int:
        k, s = self.subsampling_conv_kernel_size, self.subsampling_conv_stride
        f = self.num_mel_bins
        for _ in range(self.n_subsampling_layers):
            f = (f + (k - 1) + (s - 1) - k) // s + 1
        return f


@dataclass
class NemotronStreamingConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    vocab_size: int = 1025  # SentencePiece pieces + blank
    blank_id: int = 1024
    decoder_hidden_size: int = 640
    num_decoder_layers: int = 2
    max_symbols: int = 10
    supported_right_contexts: tuple[int, ...] = (13, 6, 1, 0)
    # the language-ID prompt (Nemotron 3.5): a one-hot of num_prompts slots joins the encoder
    # output before the joint (0: no prompt, the English seed model); prompts: name -> slot
    num_prompts: int = 0
    prompt_intermediate_size: int = 0
    prompts: dict[str, int] = field(default_factory=dict)
    default_prompt: int | None = None  # the slot of sessions that name no language

    @classmethod
    def from_hf(cls, c: dict) -> NemotronStreamingConfig:
        e = c.get("encoder_config") or {}
        names = EncoderConfig.__dataclass_fields__
        kw = {k: v for k, v in e.items() if k in names}
        if "sliding_window" in e:
            kw["left_context"] = e["sliding_window"] - 1
        if "default_num_lookahead_tokens" in e:
            kw["default_right_context"] = e["default_num_lookahead_tokens"]
        enc = EncoderConfig(**kw)
        if c.get("hidden_act", "relu") != "relu" or e.get("hidden_act", "silu") != "silu":
            raise MlxSpeechError("only relu joint / silu encoder activations are supported")
        rights = c.get("supported_num_lookahead_tokens",
                       e.get("supported_num_lookahead_tokens", (13, 6, 1, 0)))
        n_prompts = c.get("num_prompts", 0)
        return cls(
            encoder=enc, vocab_size=c.get("vocab_size", 1025),
            blank_id=c.get("blank_token_id", 1024),
            decoder_hidden_size=c.get("decoder_hidden_size", 640),
            num_decoder_layers=c.get("num_decoder_layers", 2),
            max_symbols=c.get("max_symbols_per_step", 10),
            supported_right_contexts=tuple(rights),
            num_prompts=n_prompts,
            prompt_intermediate_size=c.get("prompt_intermediate_size", 2 * enc.hidden_size)
            if n_prompts else 0,
            prompts=dict(c.get("prompt_dictionary") or {}),
            default_prompt=c.get("default_prompt_id"),
        )

    def latencies(self) -> dict[int, int]:
        """This checkpoint's latency modes: ms -> right context (one 80 ms frame per block)."""
        return {(r + 1) * FRAME_MS: r for r in self.supported_right_contexts}

    def right_context(self, latency_ms: int | None) -> int:
        """Latency mode in ms -> right context in encoder frames (None: the default)."""
        modes = {**LATENCY_MS, **self.latencies()}
        if latency_ms is None:
            r = self.encoder.default_right_context
        elif latency_ms in modes:
            r = modes[latency_ms]
        else:
            known = ", ".join(str(k) for k in sorted(modes))
            raise MlxSpeechError(f"latency must be one of {known} ms, got {latency_ms}")
        if latency_ms is not None and r not in self.supported_right_contexts:
            raise MlxSpeechError(f"this model was not trained for the {latency_ms} ms latency")
        if self.encoder.left_context % (r + 1):
            raise MlxSpeechError(
                f"left context {self.encoder.left_context} is not a multiple of the "
                f"{r + 1}-frame chunk of the {(r + 1) * FRAME_MS} ms mode"
            )
        return r
