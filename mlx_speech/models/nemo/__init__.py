"""The NeMo front end shared by the NeMo families (Nemotron ASR, Sortformer diarization):
`features` (NeMo's log-mel, offline and streaming, bit-exact under any chunking) and
`checkpoint` (the `.nemo` archive read without torch, and the FastConformer key names)."""

from .checkpoint import CONFORMER_RENAMES, read_archive, renamed
from .features import NemoLogMel, StreamingNemoLogMel

__all__ = ["CONFORMER_RENAMES", "NemoLogMel", "StreamingNemoLogMel", "read_archive", "renamed"]
