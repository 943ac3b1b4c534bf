"""mlx_speech.convert: checkpoints into memory-mapped safetensors, no pickled code run.

    mlx_speech.convert model.nemo out/     # NeMo archive -> config.json + model.safetensors
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import MlxSpeechError


def convert(src: Path, out: Path) -> Path:
    if not src.exists():
        raise MlxSpeechError(f"no such file: {src}")
    if src.suffix == ".nemo":
        from .models.nemotron_streaming.nemo import convert_nemo

        return convert_nemo(src, out)
    raise MlxSpeechError(f"don't know how to convert {src.name} (supported: .nemo)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mlx_speech.convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", help="checkpoint to convert (.nemo)")
    p.add_argument("out", help="output folder")
    args = p.parse_args(argv)
    try:
        out = convert(Path(args.src), Path(args.out))
    except MlxSpeechError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
