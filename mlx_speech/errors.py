"""User-facing errors: the CLIs print these as one line, never a traceback."""


class MlxSpeechError(Exception):
    """Base class for errors caused by bad input, files or environment."""


class AudioError(MlxSpeechError):
    """Audio that cannot be read or used (missing, corrupt, empty, NaN...)."""


class CheckpointError(MlxSpeechError):
    """A model folder or file that is not a checkpoint we can load."""


class DeviceError(MlxSpeechError):
    """No microphone/speaker, or permission denied."""
