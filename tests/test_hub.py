"""Model type detection reads the checkpoint's own config files."""

import json

import pytest

from mlx_speech.errors import CheckpointError
from mlx_speech.hub import MIMI_FILE, detect_model_type


def _write(folder, name, obj):
    (folder / name).write_text(json.dumps(obj))


@pytest.mark.parametrize(
    "files, expected",
    [
        ({"params.json": {"multimodal": {"whisper_model_args": {}}, "ada_rms_norm_t_cond": True}},
         "voxtral_realtime"),
        ({"params.json": {"model_type": "voxtral_tts", "multimodal": {}}}, "voxtral_tts"),
        ({"params.json": {"multimodal": {"audio_tokenizer_args": {}}}}, "voxtral_tts"),
        ({"config.json": {"model_type": "voxtral_tts"}}, "voxtral_tts"),
        ({"config.json": {"model_type": "nemotron_asr_streaming"}}, "nemotron_asr_streaming"),
        ({"config.json": {"dim": 32, "text_card": 50, "moshi_name": "model.safetensors"}}, "moshi"),
        ({"config.json": {"model_type": "moshi", "dep_q": 16}}, "moshi"),
    ],
)
def test_detect(tmp_path, files, expected):
    for name, obj in files.items():
        _write(tmp_path, name, obj)
    assert detect_model_type(tmp_path) == expected


def test_legacy_kyutai_folder_without_config(tmp_path):
    (tmp_path / MIMI_FILE).write_bytes(b"")
    assert detect_model_type(tmp_path) == "moshi"


def test_other_kyutai_types_are_refused_by_name(tmp_path):
    _write(tmp_path, "config.json", {"model_type": "hibiki", "dep_q": 16})
    with pytest.raises(CheckpointError, match="hibiki"):
        detect_model_type(tmp_path)


def test_unknown_folder(tmp_path):
    with pytest.raises(CheckpointError, match="not a supported checkpoint"):
        detect_model_type(tmp_path)
