"""Write the quantized Nemotron 3.5 goldens with mlx-audio 0.6.2 (run once, commit).

mlx-audio's `nemotron_asr` converter (`convert.convert`: NeMo names in MLX layouts, one nn.LSTM
per layer, its own NeMo-flattened config.json with the `prompt` section; `quantize` with its
predicate: every Linear / Embedding whose width divides by the group) turns the tiny Nemotron
3.5 `.nemo` (golden/nemotron35, fp32) into `q8/` and `q4/` (group 32: the tiny widths are
32, 64 and 160), the layout mlx-community publishes. Its float32 export is checked first: its
offline decode must give NeMo's tokens (golden/nemotron35/golden.npz).

mlx-audio then decodes NeMo's mel of the golden audio (golden/nemotron35/mel.npz: its own mel
differs at the clip's edges, which moves a near-tie last token) with each model, offline
(`encoder` at the mode's attention context, `apply_prompt`, `GreedyDecoderState`; its streaming
`generate` loses the thread on this tiny model, and its config hard-codes the release's (56,
13) context), for three prompts at right contexts 13 and 0; the tokens go to golden.npz
(mlx-audio leaves special pieces out: <unk> and the language tags).

    /work/nemo-venv/bin/pip install "mlx[cpu]==0.32.4" && \
        /work/nemo-venv/bin/pip install --no-deps mlx-audio==0.6.2
    /work/nemo-venv/bin/python tests/golden/make_quantized_nemotron35.py [OUT]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

SRC = Path(__file__).parent / "nemotron35"
VARIANTS = {"fp32": None, "q8": (8, 32), "q4": (4, 32)}
PROMPTS, RIGHTS, LEFT = ("en-US", "de-DE", "auto"), (13, 0), 28


def export(out: Path, bits_group) -> Path:
    from mlx_audio.stt.models.nemotron_asr.convert import convert

    kw = {} if bits_group is None else dict(quantize=True, q_bits=bits_group[0],
                                              q_group_size=bits_group[1])
    return convert(str(SRC / "tiny.nemo"), str(out), dtype="float32", **kw)


def tokens(folder: Path, mel: np.ndarray, prompt: str, r: int) -> list[int]:
    from mlx_audio.stt.models.nemotron_asr.rnnt import GreedyDecoderState
    from mlx_audio.stt.utils import load_model

    m = load_model(str(folder))
    mel = mx.array(mel[None])
    enc, n = m.encoder(mel, att_context_size=[LEFT, r])
    enc = m.apply_prompt(enc, prompt)
    return [int(t.id) for t in GreedyDecoderState(m).decode(enc[:, : int(n[0])], 0)]


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else \
        Path(__file__).parent / "quantized" / "nemotron35"
    g = np.load(SRC / "golden.npz")
    mel = np.load(SRC / "mel.npz")["mel"]
    special = {0, 1, 2, 3, 4}  # <unk> and the four tags of the tiny tokenizer
    gold = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, q in VARIANTS.items():
            folder = export(Path(tmp) / name, q)
            for p in PROMPTS:
                for r in RIGHTS:
                    gold[f"{name}/tokens_{p}_r{r}"] = np.array(tokens(folder, mel, p, r),
                                                               np.int32)
            if q is None:  # the peer runs this checkpoint as NeMo does
                for p in PROMPTS:
                    for r in RIGHTS:
                        ref = [t for t in g[f"tokens_{p}_r{r}"].tolist() if t not in special]
                        assert gold[f"fp32/tokens_{p}_r{r}"].tolist() == ref, (p, r)
                continue
            if (out / name).exists():
                shutil.rmtree(out / name)
            shutil.copytree(folder, out / name)
            print(name, {k: v.tolist() for k, v in gold.items() if k.startswith(name)})
    np.savez_compressed(out / "golden.npz", **gold)
    for f in sorted(out.rglob("*")):
        if f.is_file():
            print(f"{f.relative_to(out)}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
