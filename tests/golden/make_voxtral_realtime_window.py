"""Write the reduced-window Voxtral Realtime golden with transformers (run once, commit).

The reference model of `make_voxtral_realtime.py` (the committed `hf/` checkpoint), run with
smaller sliding windows (encoder 12, decoder 16 instead of 20 and 30): the greedy tokens and
per-step logits `load(..., encoder_window=12, decoder_window=16)` must reproduce.

    pip install torch==2.13.0 transformers==5.23.0
    python tests/golden/make_voxtral_realtime_window.py   # after make_voxtral_realtime.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import VoxtralRealtimeConfig, VoxtralRealtimeForConditionalGeneration

ENC_WINDOW, DEC_WINDOW, DELAY = 12, 16, 6
HERE = Path(__file__).parent / "voxtral_realtime"


def main() -> None:
    cfg = VoxtralRealtimeConfig.from_pretrained(HERE / "hf")
    cfg.audio_config.sliding_window = ENC_WINDOW
    cfg.text_config.sliding_window = DEC_WINDOW
    cfg._attn_implementation = "eager"
    model = VoxtralRealtimeForConditionalGeneration.from_pretrained(
        HERE / "hf", config=cfg, torch_dtype=torch.float32).eval()
    g = np.load(HERE / "golden.npz")
    mel = torch.tensor(g["mel"].T[None])
    prompt = torch.tensor(g["prompt"][None])
    with torch.no_grad():
        gen = model.generate(input_ids=prompt, input_features=mel, num_delay_tokens=DELAY,
                             do_sample=False, output_scores=True,
                             return_dict_in_generate=True, max_length=mel.shape[-1] // 8)
    tokens = gen.sequences[0, prompt.shape[1]:].numpy()
    np.savez_compressed(HERE / "window.npz", encoder_window=ENC_WINDOW,
                        decoder_window=DEC_WINDOW, tokens=tokens,
                        logits=torch.stack(gen.scores)[-12:, 0].numpy())  # the last 12 steps
    print("wrote", HERE / "window.npz", "tokens", tokens.tolist())
    print("same as the full window:", np.array_equal(tokens, g["tokens"]))


if __name__ == "__main__":
    main()
