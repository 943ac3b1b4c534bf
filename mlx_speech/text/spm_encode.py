"""SentencePiece encoding (text -> ids) without sentencepiece, for hotword phrases.

The rules of sentencepiece's `encode`: the text is normalised (NFKC unless the model's
normaliser is `identity`; runs of spaces collapsed and the ends stripped with
remove_extra_whitespaces), spaces become U+2581 and one is prefixed (add_dummy_prefix).
BPE models then merge the adjacent pair whose joined piece scores highest (the leftmost on
a tie; a transformers tokenizer.json: the pair earliest in `merges`); unigram models take
the Viterbi segmentation by piece score. Characters no piece covers become their UTF-8 byte
pieces when the model has them, else the unknown id (one per run).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from ..errors import MlxSpeechError

UNK_PENALTY = 10.0  # sentencepiece's kUnkPenalty (unigram)


class SentencePieceEncoder:
    """text -> ids for one model, built once from its pieces (the decoder classifies them:
    `text/spm.py`). `ids`: text piece -> its first id; `byte_ids`: byte -> its byte piece's id;
    `unk`: the unknown piece's id or None; `encoding`: the scores or merges and the model
    type; `normalize`: sentencepiece's input normalization (spaces as U+2581)."""

    def __init__(self, ids: dict[str, int], byte_ids: dict[int, int], unk: int | None,
                 encoding: dict, normalize: Callable[[str], str]):
        self.encoding, self.normalize = encoding, normalize
        self.tables = {"ids": ids, "bytes": byte_ids, "unk": unk,
                       "maxlen": max((len(p) for p in ids), default=1)}
        if "merges" in encoding:
            self.tables["ranks"] = {tuple(m.split(" ", 1)): r
                                    for r, m in enumerate(encoding["merges"])}

    def encode(self, text: str) -> list[int]:
        """text -> ids as sentencepiece's `encode` of the same model."""
        t = self.tables
        text = self.normalize(text)
        if not text:
            return []
        if self.encoding["type"] == "bpe":
            ids = _bpe(self.encoding, t, text)
        else:
            ids = _unigram(self.encoding, t, text)
        # as sentencepiece, a run of unknown pieces is one unknown id
        return [i for k, i in enumerate(ids) if not (i == t["unk"] and k and ids[k - 1] == i)]


def _fallback(t: dict, piece: str) -> list[int]:
    """Ids of a piece no vocabulary entry covers: its bytes, else unknown."""
    if t["bytes"] and all(b in t["bytes"] for b in piece.encode("utf-8")):
        return [t["bytes"][b] for b in piece.encode("utf-8")]
    if t["unk"] is None:
        raise MlxSpeechError(f"the tokenizer cannot encode {piece!r} (no unknown piece)")
    return [t["unk"]]


def _bpe(encoding: dict, t: dict, text: str) -> list[int]:
    sym = list(text)
    ranks, scores = t.get("ranks"), encoding.get("scores")

    def key(a: str, b: str):
        if ranks is not None:
            r = ranks.get((a, b))
            return None if r is None else r
        i = t["ids"].get(a + b)
        return None if i is None else -scores[i]

    # a heap of (priority, left index, left, right); stale entries are skipped
    prev, nxt = list(range(-1, len(sym) - 1)), list(range(1, len(sym) + 1))
    heap = []
    for i in range(len(sym) - 1):
        k = key(sym[i], sym[i + 1])
        if k is not None:
            heap.append((k, i, sym[i], sym[i + 1]))
    heapq.heapify(heap)
    while heap:
        _, i, a, b = heapq.heappop(heap)
        j = nxt[i] if i < len(sym) else len(sym)
        if sym[i] != a or j >= len(sym) or sym[j] != b:
            continue
        sym[i], sym[j] = a + b, ""
        nxt[i] = nxt[j]
        if nxt[i] < len(sym):
            prev[nxt[i]] = i
        if prev[i] >= 0:
            k = key(sym[prev[i]], sym[i])
            if k is not None:
                heapq.heappush(heap, (k, prev[i], sym[prev[i]], sym[i]))
        if nxt[i] < len(sym):
            k = key(sym[i], sym[nxt[i]])
            if k is not None:
                heapq.heappush(heap, (k, i, sym[i], sym[nxt[i]]))
    out = []
    i = 0 if sym else len(sym)
    while i < len(sym):
        p = sym[i]
        out += [t["ids"][p]] if p in t["ids"] else _fallback(t, p)
        i = nxt[i]
    return out


def _unigram(encoding: dict, t: dict, text: str) -> list[int]:
    scores = encoding["scores"]
    known = [scores[i] for i in t["ids"].values()]
    unk_score = (min(known) if known else 0.0) - UNK_PENALTY
    n = len(text)
    best = [(-float("inf"), -1, None)] * (n + 1)  # (score, start, id or None: unknown)
    best[0] = (0.0, -1, None)
    for i in range(n):
        if best[i][0] == -float("inf"):
            continue
        base, hit = best[i][0], False
        for j in range(i + 1, min(n, i + t["maxlen"]) + 1):
            pid = t["ids"].get(text[i:j])
            if pid is not None:
                hit = True
                s = base + scores[pid]
                if s > best[j][0]:
                    best[j] = (s, i, pid)
        if not hit and base + unk_score > best[i + 1][0]:
            best[i + 1] = (base + unk_score, i, None)
    pieces, j = [], n
    while j > 0:
        _, i, pid = best[j]
        pieces.append((text[i:j], pid))
        j = i
    out, run = [], ""
    for p, pid in reversed(pieces):
        if pid is None:
            run += p
            continue
        if run:
            out += _fallback(t, run) if not t["bytes"] else sum((_fallback(t, c) for c in run), [])
            run = ""
        out.append(pid)
    if run:
        out += _fallback(t, run) if not t["bytes"] else sum((_fallback(t, c) for c in run), [])
    return out
