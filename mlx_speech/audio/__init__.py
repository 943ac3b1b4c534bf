from mlx_speech.audio.clip import Audio
from mlx_speech.audio.io import (
    WRITE_FORMATS,
    atomic_output,
    audio_at,
    check_audio,
    check_writable,
    load_audio,
    output_format,
    write_audio,
)
from mlx_speech.audio.mel import LogMel, StreamingLogMel
from mlx_speech.audio.resample import resample

__all__ = ["WRITE_FORMATS", "Audio", "LogMel", "StreamingLogMel", "atomic_output", "audio_at",
           "check_audio", "check_writable", "load_audio", "output_format", "resample",
           "write_audio"]
