"""Write the phrase-boosting golden with NeMo 3.0's GPU-PB boosting tree (run once, commit).

Loads the tiny Nemotron weights of `golden/nemotron/` (made by make_nemotron.py) into NeMo's
RNNTDecoder and RNNTJoint, builds NeMo's boosting tree for a few phrases with its own
SentencePiece tokenizer (`GPUBoostingTreeModel.from_config`, NeMo's defaults: context score 1,
depth scaling 2), and runs NeMo's greedy label-looping RNN-T decoding with the tree fused at
weight `alpha` (`fusion_models_alpha`) over the golden encoder output (right context 13).
Records in `boosting/golden.npz`, per case: the phrases' token ids, alpha and the tokens;
for one tree, its score rows (`advance`) along the unboosted tokens; and sentencepiece's own
ids for a few texts with the BPE model and a tiny unigram model (`unigram.model`), which
check our torch-free SentencePiece encoder.

    pip install torch==2.13.0 "nemo-toolkit[asr]==3.0.0"
    python tests/golden/make_boosting.py [OUT]   # default: golden/boosting beside this file
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import torch
from nemo.collections.asr.modules.rnnt import RNNTDecoder, RNNTJoint
from nemo.collections.asr.parts.context_biasing.boosting_graph_batched import (
    BoostingTreeModelConfig,
    GPUBoostingTreeModel,
)
from nemo.collections.asr.parts.submodules.transducer_decoding.rnnt_label_looping import (
    GreedyBatchedRNNTLabelLoopingComputer,
)
from nemo.collections.common.tokenizers import SentencePieceTokenizer
from safetensors.torch import load_file

HERE = Path(__file__).parent
NEMOTRON = HERE / "nemotron"
# (name, phrases, alpha): cases that change the greedy output, and one that leaves it alone
CASES = [
    ("quick", ["quick brown", "time"], 2.0),
    ("small", ["quick brown", "time"], 0.5),
    ("many", ["the lazy dog", "hello world", "speech", "stream audio", "nine", "a stitch"], 1.5),
    ("strong", ["jumps over", "real time", "today"], 4.0),
]
_TO_NEMO = [(r"^decoder\.embedding\.", "prediction.embed."),
            (r"^decoder\.lstm\.", "prediction.dec_rnn.lstm."),
            (r"^decoder\.decoder_projector\.", "pred."),
            (r"^encoder_projector\.", "enc."),
            (r"^joint\.head\.", "joint_net.1.")]


def nemo_modules():
    hf = json.loads((NEMOTRON / "config.json").read_text())
    vocab, hidden = hf["blank_token_id"], hf["decoder_hidden_size"]
    enc_hidden = hf["encoder_config"]["hidden_size"]
    decoder = RNNTDecoder(prednet={"pred_hidden": hidden, "pred_rnn_layers": 2},
                          vocab_size=vocab, blank_as_pad=True)
    joint = RNNTJoint(jointnet={"encoder_hidden": enc_hidden, "pred_hidden": hidden,
                                "joint_hidden": hidden, "activation": "relu"},
                      num_classes=vocab)
    sd = load_file(NEMOTRON / "model.safetensors")
    dec_sd, joint_sd = {}, {}
    for k, v in sd.items():
        for pat, rep in _TO_NEMO:
            if re.match(pat, k):
                name = re.sub(pat, rep, k)
                (dec_sd if name.startswith("prediction.") else joint_sd)[name] = v
    decoder.load_state_dict(dec_sd, strict=True)
    joint.load_state_dict(joint_sd, strict=True)
    return decoder.eval(), joint.eval(), vocab, hf["max_symbols_per_step"]


@torch.no_grad()
def decode(decoder, joint, vocab, max_symbols, enc, tree=None, alpha=0.0) -> list[int]:
    computer = GreedyBatchedRNNTLabelLoopingComputer(
        decoder, joint, blank_index=vocab, max_symbols_per_step=max_symbols,
        allow_cuda_graphs=False, fusion_models=[tree] if tree is not None else None,
        fusion_models_alpha=[alpha] if tree is not None else None)
    x = torch.from_numpy(enc)[None]
    hyps, _ = computer(x, torch.tensor([x.shape[1]]))
    n = int(hyps.current_lengths[0])
    return hyps.transcript[0, :n].tolist()


SPM_TEXTS = ["quick brown", "time", "Kubernetes  LinTO", " hello   world ", "zzzz q",
             "speech to text in real time, today?"]
TRAIN = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
         "speech to text in real time", "hello world, how are you today?",
         "we stream audio and read tokens"]


def spm_cases(out: Path, res: dict) -> None:
    import io

    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAIN * 20), model_writer=buf, vocab_size=40,
        model_type="unigram", character_coverage=1.0, byte_fallback=False, bos_id=-1,
        eos_id=-1, unk_id=0, pad_id=-1, hard_vocab_limit=False,
        normalization_rule_name="identity")
    (out / "unigram.model").write_bytes(buf.getvalue())
    for name, proc in [("bpe", spm.SentencePieceProcessor(
            model_file=str(NEMOTRON / "tokenizer.model"))),
            ("unigram", spm.SentencePieceProcessor(model_proto=buf.getvalue()))]:
        res[f"spm_{name}"] = np.array(json.dumps([proc.encode(t) for t in SPM_TEXTS]))
    res["spm_texts"] = np.array(SPM_TEXTS)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "boosting"
    out.mkdir(parents=True, exist_ok=True)
    decoder, joint, vocab, max_symbols = nemo_modules()
    tokenizer = SentencePieceTokenizer(str(NEMOTRON / "tokenizer.model"))
    g = np.load(NEMOTRON / "golden.npz")
    enc = g["encoder_r13"].astype(np.float32)
    plain = decode(decoder, joint, vocab, max_symbols, enc)
    assert plain == g["tokens_r13"].tolist(), "NeMo greedy differs from the transformers golden"
    res = {"plain": np.array(plain, np.int32)}
    for name, phrases, alpha in CASES:
        cfg = BoostingTreeModelConfig(key_phrases_list=phrases, use_triton=False)
        tree = GPUBoostingTreeModel.from_config(cfg, tokenizer=tokenizer)
        toks = decode(decoder, joint, vocab, max_symbols, enc, tree, alpha)
        ids = [tokenizer.text_to_ids(p) for p in phrases]
        res[f"{name}_tokens"] = np.array(toks, np.int32)
        res[f"{name}_alpha"] = np.array(alpha, np.float32)
        res[f"{name}_phrases"] = np.array(phrases)
        res[f"{name}_ids"] = np.array(json.dumps(ids))
        diff = sum(a != b for a, b in zip(toks, plain, strict=False)) + abs(len(toks) - len(plain))
        print(f"{name}: {phrases} alpha={alpha} ids={ids}: {len(toks)} tokens, {diff} changed")
        if name == "many":  # the tree's scores along the plain tokens, back-offs included
            states, rows = tree.get_init_states(batch_size=1, bos=True), []
            for tok in plain:
                sc, nxt = tree.advance(states)
                rows.append(sc[0].detach().numpy())
                states = nxt[:, tok]
            res["many_scores"] = np.stack(rows).astype(np.float32)
    spm_cases(out, res)
    np.savez_compressed(out / "golden.npz", **res)
    print("wrote", out)


if __name__ == "__main__":
    main()
