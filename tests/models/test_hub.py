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


def test_a_hub_failure_says_what_to_do_next(tmp_path, monkeypatch):
    import mlx_speech
    from mlx_speech.hub import resolve

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(CheckpointError) as e:
        resolve("acme/absent", lambda t, f: ["*.safetensors"])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("cannot fetch 'acme/absent' from the hub")
    assert "HF_HUB_OFFLINE is set and it is not in the local cache" in msg
    for step in ("hf download acme/absent", "HF_HUB_OFFLINE=1",
                 "a local checkpoint folder instead of the repo id"):
        assert step in msg, msg
    assert "--model" not in msg  # the hint fits every command (convert takes no --model)
    assert mlx_speech  # the package imports nothing heavy for this


def test_the_download_size_is_said_before_the_weights_come(tmp_path, monkeypatch):
    """From the hub's metadata: the files the model needs that the cache does not hold yet."""
    from types import SimpleNamespace

    import huggingface_hub

    import mlx_speech.hub as hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    files = [("params.json", 10), ("consolidated.safetensors", 8_900_000_000),
             ("tekken.json", 15_000_000), ("README.md", 5), ("extra.bin", 7)]

    class Api:
        def model_info(self, repo, files_metadata=False, timeout=None):
            assert files_metadata and timeout
            return SimpleNamespace(sha="b" * 40, siblings=[
                SimpleNamespace(rfilename=n, size=s) for n, s in files])

    cached = {"params.json"}
    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache",
                        lambda repo, name, revision=None: "/x" if name in cached else None)
    assert hub.download_size("acme/vr", ["*.json", "*.safetensors"]) == (8_915_000_000, 2)

    folder = tmp_path / "snap"
    folder.mkdir()
    _write(folder, "params.json", {"multimodal": {"whisper_model_args": {}},
                                   "ada_rms_norm_t_cond": True})
    events = []
    monkeypatch.setattr(hub, "_download",
                        lambda repo, patterns, tqdm_class=None: events.append(patterns) or folder)
    hub.resolve("acme/vr", lambda t, f: ["consolidated*.safetensors", "tekken.json"],
                log=events.append)
    assert events[0] == hub.CONFIG_FILES
    assert events[1] == ("downloading 8.9 GB (2 files) from acme/vr to the Hugging Face cache")
    assert events[2] == hub.CONFIG_FILES + ["consolidated*.safetensors", "tekken.json"]
