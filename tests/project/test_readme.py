"""The README as a newcomer meets it: at most 250 lines, every docs/ page linked, and every
command in its bash blocks either run here, as written, or listed below with the reason it
cannot be (a command this file does not know fails the test, so a new README command gets
run or explained).

Commands run offline (`HF_HUB_OFFLINE=1`) against a private Hugging Face cache that holds tiny
random-weight checkpoints in real formats under the real repo ids the README names, so the
command line, the hub resolution, loading and the output files are the real ones; only the
weights are small. Console scripts run as their entry points (pyproject's [project.scripts])."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import soundfile as sf

from tests.conftest import make_voxtral_checkpoint, speechlike
from tests.support.moshi import tiny_kyutai_moshi

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GOLDEN = ROOT / "tests" / "golden"
MAX_LINES = 250
TIMEOUT_S = 300

# command (comments dropped, in shlex.join's quoting) -> why this test does not run it
NOT_RUN = {
    "pip install -e '.[live]'": "network: installs packages",
    "pip install -e '.[cpu,live]'": "network: installs packages",
    "pip install -e '.[cpu,server]'": "network: installs packages",
    "pip install -e '.[app]'": "network: installs packages",
    "pip install -e '.[cpu,dev]'": "network: installs packages (the CI block; .ci/run runs it)",
    "python -m pytest -q": "the test suite itself (the CI block)",
    "mlx_speech.transcribe --live": "needs a microphone (tests/cli/test_live_devices.py runs it on "
                                    "a virtual one)",
    "mlx_speech.chat": "needs a microphone and speaker (tests/cli/test_live_devices.py)",
    "mlx_speech.app --install-app": "macOS: writes ~/Applications (tests/app/test_app_bundle.py "
                                    "builds the bundle into a temporary folder)",
    "open '~/Applications/MLX Speech.app'": "macOS",
    "mlx_speech.app --doctor": "macOS: checks its permissions",
    "mlx_speech.transcribe meeting.wav --diarize --format vtt": "downloads the default "
        "diarizer (tests/models/sortformer/test_diarize.py runs --diarize on a tiny Sortformer)",
}
tomllib = pytest.importorskip("tomllib")
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
REPOS = {  # the hub ids the README's commands name -> the tiny checkpoint put in their place
    "nvidia/nemotron-speech-streaming-en-0.6b": "nemotron",
    "nvidia/nemotron-3.5-asr-streaming-0.6b": "nemotron35",  # its transformers layout
    "mistralai/Voxtral-Mini-4B-Realtime-2602": "voxtral_realtime",
    "mistralai/Voxtral-4B-TTS-2603": "voxtral_tts",
    "kyutai/moshiko-pytorch-bf16": "moshi",
}


def bash_blocks(text: str) -> list[list[str]]:
    blocks, cur = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if cur is None and line.strip() == "```bash":
                cur = []
            elif cur is not None:
                blocks.append(cur)
                cur = None
        elif cur is not None:
            cur.append(line)
    return blocks


def readme_commands(text: str | None = None) -> list[str]:
    """Every command of the README's bash blocks: continuation lines joined, comments
    dropped, in shlex's canonical quoting."""
    out = []
    for block in bash_blocks(README.read_text(encoding="utf-8") if text is None else text):
        joined = "\n".join(block).replace("\\\n", " ")
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(shlex.join(words))
    return out


def test_readme_is_short_and_links_every_doc():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)", text))
    for link in linked:
        assert (ROOT / link).is_file(), f"README links {link}, which does not exist"
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert not pages - linked, f"docs pages the README does not link: {sorted(pages - linked)}"


def test_docs_link_only_what_exists():
    for page in (ROOT / "docs").glob("*.md"):
        for link in re.findall(r"\]\(([^)#\s:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            assert (page.parent / link).exists(), f"{page.name} links {link}, which is missing"


def test_every_readme_command_is_run_or_explained():
    cmds = readme_commands()
    unknown = [c for c in cmds if c not in NOT_RUN and c not in RUNS]
    assert not unknown, ("README commands neither run by tests/project/test_readme.py nor in "
                         f"NOT_RUN: {unknown}")
    assert set(NOT_RUN) | set(RUNS) == set(cmds), "stale entries: " + repr(
        sorted((set(NOT_RUN) | set(RUNS)) - set(cmds)))


def test_the_parser_joins_continuations_and_drops_comments():
    text = "x\n```bash\na 'b c' \\\n   --d e   # note\n# only a comment\n```\n```python\nz\n```\n"
    assert readme_commands(text) == ["a 'b c' --d e"]


# --- running them -------------------------------------------------------------------------

def _put_in_cache(hub: Path, repo: str, src: Path) -> None:
    snap = hub / ("models--" + repo.replace("/", "--")) / "snapshots" / ("0" * 40)
    shutil.copytree(src, snap)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text("0" * 40)


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """(working folder, environment): the README's input files, and the private hub cache."""
    root = tmp_path_factory.mktemp("readme")
    hub, work = root / "hub", root / "work"
    work.mkdir()
    tiny = {"nemotron": GOLDEN / "nemotron", "nemotron35": GOLDEN / "nemotron35" / "hf",
            "voxtral_tts": GOLDEN / "voxtral_tts" / "ckpt",
            "voxtral_realtime": make_voxtral_checkpoint(root / "vr"),
            "moshi": tiny_kyutai_moshi(root / "ky")}
    for repo, name in REPOS.items():
        _put_in_cache(hub, repo, tiny[name])
    x = speechlike(2.0)
    for name in ("meeting.wav", "talk.wav", "talk.mp3"):
        sf.write(work / name, x, 16000)
    sf.write(work / "question.wav", speechlike(0.5)[::2].repeat(3), 24000)
    import numpy as np  # the clip the tiny Nemotron 3.5 reads (German with `de`)

    sf.write(work / "rede.wav", np.load(GOLDEN / "nemotron35" / "golden.npz")["audio"], 16000,
             subtype="PCM_16")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub), HF_HOME=str(root / "hf_home"),
               PYTHONPATH=str(ROOT))
    return work, env


def argv(command: str) -> list[str]:
    """A console-script command as its entry point would run it."""
    name, *args = shlex.split(command)
    module, func = SCRIPTS[name].split(":")
    code = (f"import sys; sys.argv[0] = {name!r}; from {module} import {func}; "
            f"sys.exit({func}())")
    return [sys.executable, "-c", code, *args]


def run(command: str, place, extra: list[str] = ()) -> subprocess.CompletedProcess:
    work, env = place
    r = subprocess.run(argv(command) + list(extra), cwd=work, env=env, capture_output=True,
                       text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"{command}\n{r.stderr[-3000:]}"
    return r


def _transcript(r, place):
    assert r.stdout.strip()


def _german(r, place):
    assert r.stdout.startswith("Guten Morgen")


def _srt(r, place):  # the tiny Voxtral's text is often empty: an empty subtitle file then
    assert (place[0] / "talk.srt").is_file() and "wrote talk.srt" in r.stderr


def _wav(name):
    def check(r, place):
        info = sf.info(place[0] / name)
        assert info.frames > 0 and info.format == "WAV"
    return check


def _voices(r, place):
    from mlx_speech.models.voxtral_tts import DEFAULT_VOICE

    assert DEFAULT_VOICE in r.stdout.split() or r.stdout.strip()


def _converted(r, place):
    from mlx_speech.hub import read_manifest

    m = read_manifest(place[0] / "vr-4bit")
    assert m["quantization"]["bits"] == 4


def _after_convert(place):
    if not (place[0] / "vr-4bit").exists():
        run("mlx_speech.convert mistralai/Voxtral-Mini-4B-Realtime-2602 vr-4bit --quantize 4",
            place)


def _doctor(place):
    from mlx_speech.cli import COMMANDS

    if "doctor" not in COMMANDS:
        pytest.skip("`mlx_speech doctor` is not in this checkout's dispatcher yet")


def _server(command: str, place) -> None:
    """The server command as written, on a free port: it serves both models, then stops."""
    pytest.importorskip("fastapi")
    import httpx

    from tests.support.server import server_process

    work, env = place
    p, port = server_process(argv(command), cwd=work, env=env, stdout=subprocess.DEVNULL)
    try:
        t0, ids = time.time(), None
        while ids is None:
            assert p.poll() is None, "".join(p.err_lines)[-3000:]
            assert time.time() - t0 < TIMEOUT_S, "the server did not come up"
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                ids = [m["id"] for m in r.json()["data"]]
            except httpx.HTTPError:
                time.sleep(0.3)
        assert ids == ["nvidia/nemotron-speech-streaming-en-0.6b",
                       "mistralai/Voxtral-4B-TTS-2603"]
    finally:
        p.terminate()
        p.wait(timeout=30)


# command -> (check of the result, preparation or None)
RUNS = {
    "mlx_speech.transcribe meeting.wav --model nvidia/nemotron-speech-streaming-en-0.6b":
        (_transcript, None),
    "mlx_speech.transcribe talk.mp3 --format srt -o talk.srt": (_srt, None),
    "mlx_speech.say 'Hello there.' -o hello.wav": (_wav("hello.wav"), None),
    "mlx_speech.say --list-voices": (_voices, None),
    "mlx_speech.chat --input question.wav -o answer.wav": (_wav("answer.wav"), None),
    "mlx_speech.convert mistralai/Voxtral-Mini-4B-Realtime-2602 vr-4bit --quantize 4":
        (_converted, None),
    "mlx_speech.transcribe talk.wav --model vr-4bit": (None, _after_convert),
    "mlx_speech.transcribe talk.wav --hotwords Kubernetes,LinTO --model "
    "nvidia/nemotron-speech-streaming-en-0.6b": (_transcript, None),
    "mlx_speech.transcribe rede.wav --language de --model "
    "nvidia/nemotron-3.5-asr-streaming-0.6b": (_german, None),
    "mlx_speech.server --model nvidia/nemotron-speech-streaming-en-0.6b --model "
    "mistralai/Voxtral-4B-TTS-2603": (None, None),
    "mlx_speech doctor": (None, _doctor),
}


@pytest.mark.parametrize("command", [c for c in readme_commands() if c in RUNS])
def test_readme_command_runs(command, place):
    check, prepare = RUNS[command]
    if prepare is not None:
        prepare(place)
    if command.startswith("mlx_speech.server "):
        return _server(command, place)
    r = run(command, place)
    if check is not None:
        check(r, place)


def test_commands_are_offline_for_real(place):
    """The private cache is what the commands read: a repo id it lacks is an error."""
    work, env = place
    r = subprocess.run(argv("mlx_speech.transcribe meeting.wav --model nvidia/absent"),
                       cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode != 0 and "nvidia/absent" in r.stderr
