"""Write the quantized Nemotron goldens with mlx-audio 0.6.2 (run once, commit).

mlx-audio's `nemotron_asr` Model loads the tiny transformers-layout checkpoint
(golden/nemotron, fp32) through its own `sanitize` (NeMo names, MLX conv layouts, one nn.LSTM
per layer with Wx / Wh and the two biases summed), and its converter functions
(`quantize_model` with the Nemotron converter's predicate: every Linear / Embedding whose width
divides by the group; `save_model`, `save_config`) write the NeMo-named MLX folders:
`fp32/` (not quantized) and `q8/`, `q4/` (group 32: the tiny widths are 32). The config.json is
the transformers one plus `quantization`, as `mlx_audio.convert` writes it.

mlx-audio then transcribes the golden audio with each model (`generate`, default 13-token
lookahead); its tokens go to golden.npz (mlx-audio's results leave token 0, <unk>, out).
The fp32 tokens are checked against the transformers
goldens first, so the peer is known to run this checkpoint right.

    python tests/golden/make_quantized_nemotron.py [OUT]      # needs mlx-audio==0.6.2
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np

SRC = Path(__file__).parent / "nemotron"
VARIANTS = {"fp32": None, "q8": (8, 32), "q4": (4, 32)}


def peer_folder(tmp: Path) -> Path:
    """The golden folder plus the tokenizer.json / processor_config.json mlx-audio reads."""
    import sentencepiece as spm

    d = tmp / "hf"
    shutil.copytree(SRC, d)
    sp = spm.SentencePieceProcessor(model_file=str(SRC / "tokenizer.model"))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    (d / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}))
    (d / "processor_config.json").write_text(
        json.dumps({"supported_num_lookahead_tokens": [13, 6, 1, 0]}))
    return d


def peer_model(folder: Path, config: dict):
    from mlx_audio.stt.models.nemotron_asr import Model, ModelConfig

    return Model(ModelConfig.from_dict(dict(config, model_path=str(folder))))


def transcribe(model, audio: np.ndarray) -> list[int]:
    r = model.generate(mx.array(audio))
    return [int(t.id) for s in r.sentences for t in s.tokens]


def main() -> None:
    from mlx.utils import tree_flatten
    from mlx_audio.lm.convert import quantize_model, save_config, save_model
    from mlx_audio.utils import apply_quantization, load_weights

    out = (Path(sys.argv[1]) if len(sys.argv) > 1
           else Path(__file__).parent / "quantized" / "nemotron")
    gold = dict(np.load(SRC / "golden.npz"))
    audio = gold["audio"]
    result = {}
    with tempfile.TemporaryDirectory() as t:
        hf = peer_folder(Path(t))
        config = json.loads((hf / "config.json").read_text())
        for name, bg in VARIANTS.items():
            model = peer_model(hf, config)
            w = model.sanitize(mx.load(str(hf / "model.safetensors")))
            model.load_weights(list(w.items()), strict=True)
            cfg = dict(config)
            if bg is not None:
                bits, group = bg

                def predicate(_p, m, group=group):
                    return (hasattr(m, "to_quantized") and hasattr(m, "weight")
                            and m.weight.shape[-1] % group == 0)

                model.load_weights(list(dict(tree_flatten(model.parameters())).items()))
                _, cfg = quantize_model(model, cfg, group, bits, quant_predicate=predicate)
            save_model(out / name, model)
            save_config(cfg, out / name / "config.json")
            shutil.copy(SRC / "tokenizer.model", out / name / "tokenizer.model")
            # the peer reloads the saved folder as its loader does
            peer = peer_model(hf, cfg)
            saved = load_weights(out / name)
            apply_quantization(peer, cfg, saved)
            peer.load_weights(list(saved.items()), strict=True)
            peer.eval()
            tokens = transcribe(peer, audio)
            if name == "fp32":  # mlx-audio leaves token 0 (<unk>) out of its result
                want = [t for t in gold["tokens_r13"].tolist() if t != 0]
                assert tokens == want, (tokens, want)
            result[f"{name}/tokens"] = np.array(tokens)
            print(name, tokens)
    np.savez_compressed(out / "golden.npz", **result)


if __name__ == "__main__":
    main()
