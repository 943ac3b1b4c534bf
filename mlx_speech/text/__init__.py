from mlx_speech.text.tekken import StreamingDetokenizer, Tekken

__all__ = ["StreamingDetokenizer", "Tekken"]
