"""Silero VAD checkpoints -> our module names (mlx-audio's), strict.

Two upstream layouts, told apart by their key names:
- Silero's own `silero_vad_16k.safetensors` (the `silero-vad` wheel, PyTorch layouts):
  convs (out, in, k), `lstm_cell.{weight,bias}_{ih,hh}`;
- mlx-audio / mlx-community (`mlx-community/silero-vad`, `-v6`): our names under `vad_16k.`,
  MLX layouts; the v5 repo also holds the 8 kHz branch (`vad_8k.*`), which we do not run, and
  mlx-audio's loader drops `val_*` tensors, so we skip both.
Our converted layout (safetensors metadata `format: mlx_speech`) is loaded as it is.
"""

from __future__ import annotations

import mlx.core as mx

from ...errors import CheckpointError

_SILERO_LSTM = {"lstm_cell.weight_ih": "lstm.Wx", "lstm_cell.weight_hh": "lstm.Wh"}


def layout(weights: dict[str, mx.array]) -> str:
    if any(k.startswith("vad_16k.") for k in weights):
        return "mlx-audio"
    if "lstm_cell.weight_ih" in weights:
        return "silero"
    if any(k.startswith("vad_8k.") for k in weights):
        raise CheckpointError("these Silero VAD weights hold only the 8 kHz network; "
                              "mlx_speech runs the 16 kHz one")
    raise CheckpointError("not Silero VAD weights (no `lstm_cell.*` or `vad_16k.*` keys)")


def remap(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Either upstream layout -> our names and MLX layouts (unknown keys pass through and
    fail the strict load by name)."""
    if layout(weights) == "mlx-audio":
        return {k.removeprefix("vad_16k."): v for k, v in weights.items()
                if not k.startswith(("vad_8k.", "val_"))}
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
