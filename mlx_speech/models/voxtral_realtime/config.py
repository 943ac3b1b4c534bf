"""Voxtral Realtime configuration, read from either checkpoint layout."""

from __future__ import annotations

from dataclasses import dataclass, field

SAMPLE_RATE = 16_000
HOP = 160
N_FFT = 400
TOKEN_SAMPLES = 1280  # one decoder position = 80 ms = 8 mel frames = 4 encoder frames
FRAME_MS = 80
MEL_PER_TOKEN = TOKEN_SAMPLES // HOP
RIGHT_PAD_EXTRA_TOKENS = 10  # mistral_common's OFFLINE_STREAMING_BUFFER_TOKENS


@dataclass
class EncoderConfig:
    dim: int = 1280
    n_layers: int = 32
    n_heads: int = 32
    head_dim: int = 64
    hidden_dim: int = 5120
    rope_theta: float = 1e6
    norm_eps: float = 1e-5
    sliding_window: int = 750
    n_mels: int = 128
    max_position: int = 0  # RoPE clock limit; 0 means 2 x window

    def __post_init__(self):
        if self.max_position <= 0:
            self.max_position = 2 * self.sliding_window


@dataclass
class DecoderConfig:
    dim: int = 3072
    n_layers: int = 26
    n_heads: int = 32
    n_kv_heads: int = 8
    head_dim: int = 128
    hidden_dim: int = 9216
    rope_theta: float = 1e6
    norm_eps: float = 1e-5
    vocab_size: int = 131072
    sliding_window: int = 8192
    max_position: int = 131072
    ada_dim: int = 32


@dataclass
class AudioConfig:
    sample_rate: int = SAMPLE_RATE
    hop: int = HOP
    n_fft: int = N_FFT
    n_mels: int = 128
    log_mel_max: float | None = 1.5
    downsample: int = 4
    n_left_pad_tokens: int = 32
    delay_ms: int = 480


@dataclass
class VoxtralRealtimeConfig:
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    layout: str = "mistral"  # "mistral" (params.json) or "hf" (config.json)

    @classmethod
    def from_params(cls, p: dict) -> VoxtralRealtimeConfig:
        """Mistral-native params.json."""
        wm = p["multimodal"]["whisper_model_args"]
        e, ae = wm["encoder_args"], wm["encoder_args"].get("audio_encoding_args", {})
        enc = EncoderConfig(
            dim=e["dim"], n_layers=e["n_layers"], n_heads=e["n_heads"],
            head_dim=e["head_dim"], hidden_dim=e["hidden_dim"],
            rope_theta=e.get("rope_theta", 1e6), norm_eps=e.get("norm_eps", 1e-5),
            sliding_window=e["sliding_window"], n_mels=ae.get("num_mel_bins", 128),
            max_position=e.get("max_source_positions") or 0,
        )
        dec = DecoderConfig(
            dim=p["dim"], n_layers=p["n_layers"], n_heads=p["n_heads"],
            n_kv_heads=p["n_kv_heads"], head_dim=p["head_dim"],
            hidden_dim=p["hidden_dim"], rope_theta=p.get("rope_theta", 1e6),
            norm_eps=p.get("norm_eps", 1e-5), vocab_size=p["vocab_size"],
            sliding_window=p["sliding_window"],
            max_position=p.get("model_max_length", 131072),
            ada_dim=p.get("ada_rms_norm_t_cond_dim", 32),
        )
        audio = AudioConfig(
            sample_rate=ae.get("sampling_rate", SAMPLE_RATE),
            hop=ae.get("hop_length", HOP), n_fft=ae.get("window_size", N_FFT),
            n_mels=enc.n_mels, log_mel_max=ae.get("global_log_mel_max", 1.5),
            downsample=wm.get("downsample_args", {}).get("downsample_factor", 4),
        )
        return cls(enc, dec, audio, "mistral")

    @classmethod
    def from_hf(cls, c: dict) -> VoxtralRealtimeConfig:
        """transformers config.json (model_type voxtral_realtime)."""
        a, t = c["audio_config"], c["text_config"]

        def theta(d):
            return (d.get("rope_parameters") or {}).get("rope_theta", d.get("rope_theta", 1e6))

        enc = EncoderConfig(
            dim=a["hidden_size"], n_layers=a["num_hidden_layers"],
            n_heads=a["num_attention_heads"], head_dim=a["head_dim"],
            hidden_dim=a["intermediate_size"], rope_theta=theta(a),
            norm_eps=a.get("rms_norm_eps", 1e-5), sliding_window=a["sliding_window"],
            n_mels=a.get("num_mel_bins", 128),
            max_position=a.get("max_position_embeddings") or 0,
        )
        dec = DecoderConfig(
            dim=t["hidden_size"], n_layers=t["num_hidden_layers"],
            n_heads=t["num_attention_heads"], n_kv_heads=t["num_key_value_heads"],
            head_dim=t["head_dim"], hidden_dim=t["intermediate_size"],
            rope_theta=theta(t), norm_eps=t.get("rms_norm_eps", 1e-5),
            vocab_size=t["vocab_size"], sliding_window=t["sliding_window"],
            max_position=t.get("max_position_embeddings", 131072),
        )
        audio = AudioConfig(
            n_mels=enc.n_mels, downsample=c.get("downsample_factor", 4),
            delay_ms=c.get("default_num_delay_tokens", 6) * FRAME_MS,
        )
        return cls(enc, dec, audio, "hf")

    @classmethod
    def from_mlx_audio(cls, c: dict) -> VoxtralRealtimeConfig:
        """mlx-audio's config.json (`encoder_args`, `decoder`, `audio_encoding_args`); missing
        sections take mlx-audio's defaults (the 4B model), as its ModelConfig does."""
        e = dict(c.get("encoder_args") or {})
        ae = dict(c.get("audio_encoding_args") or e.pop("audio_encoding_args", None) or {})
        d = c.get("decoder") or {}
        E, D = EncoderConfig(), DecoderConfig()
        enc = EncoderConfig(
            dim=e.get("dim", E.dim), n_layers=e.get("n_layers", E.n_layers),
            n_heads=e.get("n_heads", E.n_heads), head_dim=e.get("head_dim", E.head_dim),
            hidden_dim=e.get("hidden_dim", E.hidden_dim),
            rope_theta=e.get("rope_theta", E.rope_theta), norm_eps=e.get("norm_eps", 1e-5),
            sliding_window=e.get("sliding_window", E.sliding_window),
            n_mels=ae.get("num_mel_bins", 128))
        dec = DecoderConfig(**{k: d[k] for k in (
            "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "rope_theta",
            "norm_eps", "vocab_size", "sliding_window") if k in d},
            ada_dim=d.get("ada_rms_norm_t_cond_dim", D.ada_dim))
        audio = AudioConfig(
            sample_rate=ae.get("sampling_rate", SAMPLE_RATE), hop=ae.get("hop_length", HOP),
            n_fft=ae.get("window_size", N_FFT), n_mels=enc.n_mels,
            log_mel_max=ae.get("global_log_mel_max", 1.5),
            downsample=e.get("downsample_factor", 4),
            delay_ms=c.get("transcription_delay_ms", 480))
        return cls(enc, dec, audio, "mlx_audio")

    def apply_tekken_audio(self, audio: dict) -> None:
        """tekken.json's `audio` section carries the streaming settings."""
        if not audio:
            return
        self.audio.delay_ms = audio.get("transcription_delay_ms", self.audio.delay_ms)
        self.audio.n_left_pad_tokens = audio.get(
            "streaming_n_left_pad_tokens", self.audio.n_left_pad_tokens
        )
