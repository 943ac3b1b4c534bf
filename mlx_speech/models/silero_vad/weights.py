"""Silero VAD checkpoints -> our module names and layouts, strict.

Upstream layouts, told apart by their key names:
- Silero's own `silero_vad_16k.safetensors` (the `silero-vad` wheel) and the weights of its
  `.onnx` models (read by onnxfile.py): PyTorch layouts, convs (out, in, k),
  `lstm_cell.{weight,bias}_{ih,hh}`;
- mlx-audio / mlx-community (`mlx-community/silero-vad`, `-v6`): names under `vad_16k.`, MLX
  layouts (convs (out, k, in), `lstm.Wx` / `Wh` / `bias` as mlx.nn.LSTM has them); the v5 repo
  also holds the 8 kHz branch (`vad_8k.*`), which we do not run, and mlx-audio's loader drops
  `val_*` tensors, so we skip both.
Ours (and our converted layout, loaded as it is): the STFT basis as its window (the basis must be
that window times the DFT, checked here), convs as im2col matrices (k * in, out) with rows
tap-major, LSTM weights (in, 4 * hidden) with one summed bias, all contiguous.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ...errors import CheckpointError

_SILERO_LSTM = {"lstm_cell.weight_ih": "lstm.Wx", "lstm_cell.weight_hh": "lstm.Wh"}
_N_FFT = 256


def layout(weights: dict[str, mx.array]) -> str:
    if any(k.startswith("vad_16k.") for k in weights):
        return "mlx-audio"
    if "lstm_cell.weight_ih" in weights:
        return "silero"
    if any(k.startswith("vad_8k.") for k in weights):
        raise CheckpointError("these Silero VAD weights hold only the 8 kHz network; "
                              "mlx_speech runs the 16 kHz one")
    raise CheckpointError("not Silero VAD weights (no `lstm_cell.*` or `vad_16k.*` keys)")


def _silero_to_mlx_audio(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for k, w in weights.items():
        if k in _SILERO_LSTM:
            out[_SILERO_LSTM[k]] = w
        elif k in ("lstm_cell.bias_ih", "lstm_cell.bias_hh"):
            continue  # summed below
        elif k.endswith(".weight") and w.ndim == 3:  # conv (out, in, k) -> (out, k, in)
            out[k] = w.transpose(0, 2, 1)
        else:
            out[k] = w
    if "lstm_cell.bias_ih" not in weights or "lstm_cell.bias_hh" not in weights:
        raise CheckpointError("Silero VAD weights lack lstm_cell.bias_ih or bias_hh")
    out["lstm.bias"] = weights["lstm_cell.bias_ih"] + weights["lstm_cell.bias_hh"]
    return out


def stft_window(basis: mx.array) -> mx.array:
    """Silero's (258, 256, 1) STFT conv basis -> its window, after checking that the basis is
    exactly that window times the DFT (rows: 129 cosines, then 129 negated sines)."""
    b = np.array(basis, dtype=np.float64).reshape(basis.shape[0], -1)
    if b.shape != (_N_FFT + 2, _N_FFT):
        raise CheckpointError(f"stft_conv.weight has shape {tuple(basis.shape)}, expected "
                              "(258, 256, 1) (the 16 kHz network)")
    w = b[0]  # frequency 0: the window itself
    angle = 2 * np.pi * np.outer(np.arange(_N_FFT // 2 + 1), np.arange(_N_FFT)) / _N_FFT
    want = np.concatenate([w * np.cos(angle), -w * np.sin(angle)])
    err = np.abs(b - want).max()
    if not err < 1e-5:
        raise CheckpointError(f"stft_conv.weight is not a windowed DFT basis (off by {err:.3g}); "
                              "not a Silero VAD v5/v6 checkpoint")
    return mx.array(w.astype(np.float32))


def _mlx_audio_to_ours(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for k, w in weights.items():
        if k == "stft_conv.weight":
            out["stft_window"] = stft_window(w)
        elif k.endswith(".weight") and k.startswith(("conv", "final_conv")) and w.ndim == 3:
            name = "final" if k.startswith("final_conv") else k.split(".")[0]
            o, taps, i = w.shape  # -> (taps * in, out), rows tap-major
            out[f"{name}.weight"] = mx.contiguous(w.transpose(1, 2, 0).reshape(taps * i, o))
        elif k == "final_conv.bias":
            out["final.bias"] = w
        elif k in ("lstm.Wx", "lstm.Wh"):
            out["lstm.w" + k[-1].lower()] = mx.contiguous(w.T)
        else:
            out[k] = w  # conv biases, lstm.bias; anything else fails the strict load by name
    return out


def remap(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Either upstream layout -> ours (unknown keys pass through and fail the strict load)."""
    if layout(weights) == "mlx-audio":
        weights = {k.removeprefix("vad_16k."): v for k, v in weights.items()
                   if not k.startswith(("vad_8k.", "val_"))}
    else:
        weights = _silero_to_mlx_audio(weights)
    return _mlx_audio_to_ours(weights)
