"""The text side of the models: tokenizers (`tekken`: Voxtral's; `spm`, `spm_encode`:
SentencePiece, decoding and encoding; `moshi_tokenizer`: Moshi's text stream), the
`vocabulary` a transcription favours and its `context_graph` (phrase boosting's walk, host
side). Families take the names below."""

from .context_graph import GraphCache
from .moshi_tokenizer import TextTokenizer
from .spm import SentencePieceDecoder, StreamingDecoder
from .tekken import StreamingDetokenizer, Tekken
from .vocabulary import Vocabulary

__all__ = ["GraphCache", "SentencePieceDecoder", "StreamingDecoder", "StreamingDetokenizer",
           "Tekken", "TextTokenizer", "Vocabulary"]
