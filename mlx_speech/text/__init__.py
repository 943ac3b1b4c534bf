"""The text side of the models: tokenizers (`tekken`: Voxtral's; `spm`, `spm_encode`:
SentencePiece, decoding and encoding), the `vocabulary` a transcription favours and its
`context_graph` (phrase boosting's walk, host side)."""
