"""mlx_speech.convert: any checkpoint we load -> an MLX-ready folder that loads with no work.

    mlx_speech.convert mistralai/Voxtral-Mini-4B-Realtime-2602 vr-4bit --quantize 4
    mlx_speech.convert kyutai/moshiko-pytorch-bf16 moshiko-q8 --quantize 8 --group-size 64
    mlx_speech.convert model.nemo nemotron-bf16 --dtype bf16
    mlx_speech.convert voice.pt voice.safetensors          # one torch.save file
    mlx_speech.convert voice_embedding/ voices/            # every .pt in a folder

SRC is a hub id or a folder in any layout `mlx_speech.load` reads (Mistral-native, transformers,
mlx-audio / mlx-community, Kyutai, PersonaPlex, NeMo `.nemo`, an earlier converted folder), or
torch.save files (.pt .pth .ckpt .bin), read without torch and without running pickled code.
Without --dtype the weights keep their stored dtype; --quantize B [--group-size G] quantizes as
`mlx_speech.load(SRC, quantize=B, group_size=G)` does (same modules, same tensors).

The converted layout (version 1), a folder OUT holding:
  mlx_speech.json   {"format": "mlx_speech", "version": 1, "model_type": ...,
                     "dtype": float dtype of the weights, "quantization": {"bits", "group_size",
                     "mode"} or null, "overrides": {module path: quantization} for modules
                     quantized differently, "weights": {part: file}}
  model.safetensors the model's parameters under our module names, in MLX layouts and their
                    final dtypes; quantized modules as `.weight` (packed uint32) `.scales`
                    `.biases`; safetensors metadata {"format": "mlx_speech", "version": "1"}.
                    Moshi / PersonaPlex: parts "lm" (model.safetensors) and "mimi"
                    (mimi.safetensors, float32, never quantized).
  the family's config, as its loader reads it: params.json or config.json (copied), config.json
                    written for .nemo (transformers form) and Moshi (Kyutai form naming the files
                    above, dep_q as the weights have it);
  tokenizer and voices: tekken.json, tokenizer.model/.json, the SentencePiece model;
                    voice_embedding/ (Voxtral TTS) and voices/ (PersonaPlex) with torch voices
                    stored as .safetensors.
`mlx_speech.load(OUT)` builds the model from the config, swaps in quantized modules where a
`.scales` tensor is present, and loads strictly, memory-mapped: no renaming, no weight-norm
folding, no casts. Conversion writes into a hidden sibling folder renamed to OUT at the end, so an
error or Ctrl-C leaves nothing; the same input gives byte-identical files.
"""

from __future__ import annotations

from pathlib import Path

from .torchfiles import (
    TORCH_SUFFIXES,
    convert_folder,
    convert_torch,
    convert_torch_file,
    save_safetensors,
    torch_tensors,
)
from .writer import DTYPES, check_options, convert_model

__all__ = ["TORCH_SUFFIXES", "convert", "convert_folder", "convert_model", "convert_torch",
           "convert_torch_file", "main", "save_safetensors", "torch_tensors"]

MODEL_MARKERS = ("mlx_speech.json", "params.json", "config.json",
                 "tokenizer-e351c8d8-checkpoint125.safetensors")


def _is_hub_id(s: str) -> bool:
    return s.count("/") == 1 and not s.startswith((".", "/", "~")) and not s.endswith("/")


def convert(src: str | Path, out: str | Path, *, quantize: int | None = None,
            group_size: int | None = None, dtype: str | None = None,
            progress: bool = True) -> list[Path]:
    """Convert `src` into `out`; returns the paths written (a model: the output folder).

    A model folder, hub id or .nemo -> the converted layout; a torch.save file or a folder of
    them (no model config) -> .safetensors files.
    """
    from mlx_speech.errors import MlxSpeechError

    p = Path(src).expanduser()
    model = (p.is_file() and p.suffix == ".nemo") or (
        p.is_dir() and any((p / m).exists() for m in MODEL_MARKERS)) or (
        not p.exists() and _is_hub_id(str(src)))
    if model:
        return [convert_model(src, out, quantize=quantize, group_size=group_size, dtype=dtype,
                              progress=progress)]
    if not p.exists():
        raise MlxSpeechError(f"no such file or folder: {src}")
    if p.is_file() and p.suffix not in TORCH_SUFFIXES:
        raise MlxSpeechError(f"don't know how to convert {p.name} (supported: .nemo, "
                             f"{', '.join(TORCH_SUFFIXES)}, a model folder or hub id, "
                             "or a folder of torch files)")
    if quantize is not None or dtype is not None:
        raise MlxSpeechError("--quantize and --dtype apply to models, not to torch files")
    return convert_torch(p, out, progress=progress)


def _run(args) -> None:
    from mlx_speech.cliutil import log
    from mlx_speech.errors import MlxSpeechError

    def integer(flag, v):
        if v is None:
            return None
        try:
            return int(v)
        except ValueError:
            raise MlxSpeechError(f"{flag} needs a whole number, not {v!r}") from None

    q, g = integer("--quantize", args.quantize), integer("--group-size", args.group_size)
    check_options(q, g, args.dtype)
    written = convert(args.src, args.out, quantize=q, group_size=g, dtype=args.dtype,
                      progress=not args.quiet)
    log(f"wrote {written[0]}" if len(written) == 1 else
        f"wrote {len(written)} files to {args.out}")


def main(argv: list[str] | None = None) -> int:
    from mlx_speech.cliutil import ArgumentParser, run_cli

    p = ArgumentParser(prog="mlx_speech.convert", description=__doc__)
    p.add_argument("src", help="hub id, model folder, .nemo, .pt/.pth/.ckpt/.bin, or a folder "
                               "of torch files")
    p.add_argument("out", help="output folder (must not exist or be empty), or a .safetensors "
                               "file for one torch file")
    p.add_argument("--quantize", metavar="BITS",
                   help="quantize to 4, 6 or 8 bits (2, 3, 5 also work) with the family's own "
                        "rules, as load(quantize=BITS) does")
    p.add_argument("--group-size", metavar="G", help="quantization group: 32, 64 or 128")
    p.add_argument("--dtype", metavar="|".join(DTYPES), help="float dtype of the weights "
                   "(default: as stored)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true", help="full tracebacks on errors")
    return run_cli(_run, p.parse_args(argv))


if __name__ == "__main__":
    from mlx_speech.cliutil import exit_with

    exit_with(main())
