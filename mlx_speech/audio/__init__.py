from mlx_speech.audio.clip import Audio
from mlx_speech.audio.io import check_audio, load_audio, write_audio
from mlx_speech.audio.resample import resample

__all__ = ["Audio", "check_audio", "load_audio", "resample", "write_audio"]
