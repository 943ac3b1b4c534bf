"""Our tokenizers against the reference libraries on the real files they ship.

`mistral-common` carries real SentencePiece `.model` files and real `tekken*.json` files
in its package data; `sentencepiece` decodes the former. Both are in the `dev` extra;
these tests skip when they are missing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlx_speech.text.spm import SentencePieceDecoder, StreamingDecoder
from mlx_speech.text.tekken import Tekken

NEMOTRON_MODEL = Path(__file__).parents[1] / "golden" / "nemotron" / "tokenizer.model"

CORPUS = [
    "Hello, world!",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    " both ",
    " ",
    "",
    "a  b   c    d",
    "Ça va ? Très bien, merci. Ñandú über Straße, naïve façade, œuvre, Øresund",
    "日本語のテキストと漢字、中文文本。한국어 문장도 있습니다.",
    "مرحبا بالعالم، كيف حالك؟ שלום עולם",
    "Ελληνικά, Русский текст, हिन्दी पाठ, ภาษาไทย",
    "emoji 😀🎉 family 👩‍👩‍👧 flags 🇫🇷🇯🇵 skin 👍🏽 ok",
    "1234567890 3.14159 1,000,000 -42 +7 1e-9 ½ ² ٣",
    "\t\ttabs\n\n\nnewlines \r\n crlf\r\n",
    "def f(x):\n    return x ** 2  # comment\n\nif __name__ == '__main__':\n\tf(3)\n",
    "<html><body class=\"x\">{\"json\": [1, 2, null]}</body></html>",
    "!!! ??? ... --- *** ``` ~~~ ||| @#$%^&()[]{}<>/\\",
    "IBM's USA'S I'M it's we'll they're DON'T",
    "ＦＵＬＬ width ｶﾀｶﾅ and ligatures ﬁ ﬂ",
    "zero\u200bwidth\u00a0nbsp\u2003em space\u3000ideographic",
    "combining e\u0301 a\u0308 and precomposed é ä",
    "🙂" * 5 + " " * 7 + "end",
]

SPM_DIR = "mistral_common/data"


def _mistral_data() -> Path:
    mc = pytest.importorskip("mistral_common")
    return Path(mc.__file__).parent / "data"


def _spm_models() -> list[Path]:
    try:
        import mistral_common
    except ImportError:
        return []
    return sorted((Path(mistral_common.__file__).parent / "data").glob("*.model*"))


class _TrickyIds:
    """Random ids biased towards what decoding gets wrong: space-only pieces, byte
    pieces (valid and broken UTF-8), unknown and control pieces."""

    def __init__(self, sp):
        size = self.size = sp.get_piece_size()
        pieces = [sp.id_to_piece(i) for i in range(size)]
        self.spaces = [i for i, p in enumerate(pieces) if set(p) == {"\u2581"}]
        self.lead_space = [i for i, p in enumerate(pieces) if p.startswith("\u2581")][:200]
        self.byte = {int(p[3:5], 16): i for i, p in enumerate(pieces) if sp.is_byte(i)}
        self.special = [i for i in range(size) if sp.is_control(i) or sp.is_unknown(i)][:20]
        self.utf8 = [list(c.encode()) for c in "é€😀中"]

    def __call__(self, rng, n: int) -> list[int]:
        out = []
        while len(out) < n:
            r = rng.random()
            if r < 0.2 and self.spaces:
                out.append(int(rng.choice(self.spaces)))
            elif r < 0.35:
                out.append(int(rng.choice(self.lead_space)))
            elif r < 0.5 and self.byte:
                if rng.random() < 0.5:  # a whole character, sometimes cut short
                    bs = self.utf8[rng.integers(len(self.utf8))]
                    bs = bs[: rng.integers(1, len(bs) + 1)]
                else:
                    bs = [int(rng.integers(256))]
                out += [self.byte[b] for b in bs]
            elif r < 0.6 and self.special:
                out.append(int(rng.choice(self.special)))
            else:
                out.append(int(rng.integers(self.size)))
        return out


@pytest.mark.parametrize("path", _spm_models() + [NEMOTRON_MODEL], ids=lambda p: p.name)
def test_sentencepiece_decode_equals_the_library(path):
    spm = pytest.importorskip("sentencepiece")
    sp = spm.SentencePieceProcessor(model_file=str(path))
    ours = SentencePieceDecoder.from_file(path)
    assert len(ours) == sp.get_piece_size()
    for text in CORPUS:
        ids = sp.encode(text)
        assert ours.decode(ids) == sp.decode(ids), text
    edge = [sp.piece_to_id("\u2581"), sp.unk_id()]
    for ids in ([edge[0]], [edge[0]] * 3, [edge[0], edge[1]], [edge[1], edge[0]],
                [sp.bos_id(), edge[0], edge[0]], []):
        ids = [i for i in ids if i >= 0]
        assert ours.decode(ids) == sp.decode(ids), ids
    rng, tricky = np.random.default_rng(len(path.name)), _TrickyIds(sp)
    for _ in range(150):
        ids = tricky(rng, int(rng.integers(1, 12)))
        want = sp.decode(ids)
        assert ours.decode(ids) == want, ids
        s = StreamingDecoder(ours)  # streamed one id at a time: the same text
        assert "".join(s.add(i) for i in ids) + s.flush() == want, ids


def test_tekken_encode_decode_equal_mistral_common():
    pytest.importorskip("regex")
    tekken = pytest.importorskip("mistral_common.tokens.tokenizers.tekken")
    files = sorted(_mistral_data().glob("tekken*.json"))
    assert files, "mistral-common ships tekken*.json files"
    rng = np.random.default_rng(0)
    long_text = "\n".join(CORPUS) * 3
    for path in files:
        ref = tekken.Tekkenizer.from_file(str(path))
        ours = Tekken.from_file(path)
        assert ours.vocab_size == ref.n_words and ours.num_special == ref.num_special_tokens
        for text in [*CORPUS, long_text]:
            ids = ours.encode(text)
            assert ids == ref.encode(text, bos=False, eos=False), text
            assert ours.decode(ids) == ref.decode(ids) == text
        for _ in range(100):  # arbitrary ids, split UTF-8 and specials included
            ids = [int(i) for i in rng.integers(0, ours.vocab_size, 8)]
            assert ours.decode(ids) == ref.decode(ids), ids
