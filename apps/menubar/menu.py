"""`present(view) -> Menu`: what the menu bar shows, as plain data (the UI only draws it)."""

from __future__ import annotations

from dataclasses import dataclass

from .settings import (
    ASR_MODELS,
    HANDSFREE_STOP_CHOICES,
    TOGGLES,
    TTS_MODELS,
    UNLOAD_CHOICES,
)

STATES = ("idle", "loading", "downloading", "listening", "silent_mic", "finalizing", "speaking",
          "needs_permission", "error")

# the menu-bar title glyph per state (the icon is drawn from the state name)
GLYPHS = {"idle": "\u25cb", "loading": "\u25cc", "downloading": "\u2193", "listening": "\u25cf",
          "silent_mic": "\u25cf", "finalizing": "\u2026", "speaking": "\u25b6",
          "needs_permission": "!", "error": "\u26a0"}

PANES = {"input_monitoring": "Input Monitoring", "accessibility": "Accessibility",
         "microphone": "Microphone"}
ITEM_CHARS = 64  # menu item titles are cut to this (a menu as wide as the screen helps nobody)
TITLE_CHARS = 16  # partial text beside the icon: an over-wide status item is hidden by the notch


@dataclass(frozen=True)
class MenuItem:
    title: str
    id: str | None = None  # the MenuAction id a click sends; None = a label
    checked: bool = False
    children: tuple[MenuItem, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.id is not None or bool(self.children)


SEPARATOR = MenuItem("-")


@dataclass(frozen=True)
class Menu:
    state: str
    title: str  # next to the icon in the menu bar
    items: tuple[MenuItem, ...]


def key_label(spec: str) -> str:
    """'ctrl+alt+s' -> '⌃⌥S', 'alt_r' -> 'Right ⌥'."""
    names = {"ctrl": "\u2303", "alt": "\u2325", "shift": "\u21e7", "cmd": "\u2318",
             "space": "Space", "fn": "fn"}
    out = []
    for part in spec.lower().split("+"):
        side = ""
        if part.endswith(("_r", "_l")):
            side = "Right " if part.endswith("_r") else "Left "
            part = part[:-2]
        out.append(side + names.get(part, part.upper()))
    return "".join(out) if all(len(o) == 1 for o in out[:-1]) else " ".join(out)


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _model_line(label: str, m) -> str | None:
    if m.status == "downloading":
        pct = f" ({100 * m.done // m.total}%)" if m.total else ""
        total = f" / {_size(m.total)}" if m.total else ""
        return f"Downloading {label}: {_size(m.done)}{total}{pct}"
    if m.status == "loading":
        return f"Loading {label}\u2026"
    if m.status == "unloading":
        return f"Unloading {label}\u2026"
    return None


def state_name(v) -> str:
    if v.needs:
        return "needs_permission"
    if v.error:
        return "error"
    if v.listening:
        if v.asr.status in ("loading", "downloading"):  # the dictation waits for its model
            return v.asr.status
        return "silent_mic" if v.silent else "listening"
    if v.finalizing:
        return "finalizing"
    if v.speaking:
        return "speaking"
    if "downloading" in (v.asr.status, v.tts.status):
        return "downloading"
    if "loading" in (v.asr.status, v.tts.status):
        return "loading"
    return "idle"


def _short(text: str, n: int = 40) -> str:
    t = " ".join(text.split())
    return t if len(t) <= n else t[: n - 1] + "\u2026"


def _tail(text: str, n: int) -> str:
    """The end of `text` in at most n characters, starting at a word when cut."""
    t = " ".join(text.split())
    if len(t) <= n:
        return t
    cut = t[len(t) - n + 1:]
    sp = cut.find(" ")
    if 0 <= sp < len(cut) - 1:
        cut = cut[sp + 1:]
    return "\u2026" + cut


def _fit(item: MenuItem) -> MenuItem:
    if len(item.title) <= ITEM_CHARS and not item.children:
        return item
    return MenuItem(_short(item.title, ITEM_CHARS), item.id, item.checked,
                    tuple(_fit(c) for c in item.children))


def present(v) -> Menu:
    """The whole menu for a `core.View`."""
    s = v.settings
    state = state_name(v)
    dk, sk = key_label(s.dictate_hotkey), key_label(s.speak_hotkey)
    how = "tap" if s.toggle == "tap" else "double-tap"
    status = {
        "idle": f"Ready: hold {dk} to talk, {how} for hands-free",
        "loading": "Loading the model\u2026",
        "downloading": "Downloading the model\u2026",
        "listening": ("Listening (hands-free): tap " + dk + " to stop" if v.mode == "toggle"
                      else "Listening: release " + dk + " to insert"),
        "silent_mic": "No sound from the microphone: check its input level",
        "finalizing": "Finishing the transcript\u2026",
        "speaking": f"Speaking: press {sk} to stop",
        "needs_permission": "Permission needed: " + ", ".join(PANES.get(k, k) for k in v.needs),
        "error": f"Error: {v.error}",
    }[state]
    lines = [_model_line(label, m) for label, m in (("speech model", v.asr),
                                                    ("voice model", v.tts))]
    if state in ("loading", "downloading"):  # say which model, with its progress
        want = "Downloading" if state == "downloading" else "Loading"
        status = next(x for x in lines if x and x.startswith(want))
    items = [MenuItem(status)]
    if v.listening and state in ("loading", "downloading"):
        items.append(MenuItem("Listening: what you say is kept until the model is ready"))
    for label, m, line in zip(("speech model", "voice model"), (v.asr, v.tts), lines, strict=True):
        if line and line != status:
            items.append(MenuItem(line))
        if m.status == "failed" and m.error and state != "error":
            items.append(MenuItem(f"Could not load {label}: {_short(m.error)}"))
    if v.partial and state in ("listening", "silent_mic", "finalizing"):
        items.append(MenuItem(f"\u201c{_tail(v.partial, ITEM_CHARS - 2)}\u201d"))
    if v.notice:
        items.append(MenuItem(v.notice))
    for k in v.needs:
        items.append(MenuItem(f"Open {PANES.get(k, k)} settings\u2026", f"open_settings:{k}"))
    if v.error or v.needs or v.notice:
        items.append(MenuItem("Dismiss", "dismiss"))
    items.append(SEPARATOR)
    items.append(MenuItem("Stop dictation" if v.listening else f"Start dictation ({dk})",
                          "dictate"))
    items.append(MenuItem("Stop speaking" if v.speaking else f"Speak selection ({sk})",
                          "speak"))
    items.append(SEPARATOR)
    last = v.recent[0] if v.recent else None
    items.append(MenuItem("Paste last" + (f": {_short(last.text, 28)}" if last else ""),
                          "paste_last" if last else None))
    items.append(MenuItem("Copy last", "copy:0" if last else None))
    recent = tuple(
        MenuItem(("" if r.inserted else "\u2022 ") + _short(r.text), children=(
            MenuItem("Paste", f"paste:{i}"), MenuItem("Copy", f"copy:{i}")))
        for i, r in enumerate(v.recent))
    items.append(MenuItem("Recent", children=recent or (MenuItem("(nothing yet)"),)))
    items.append(SEPARATOR)
    items.append(MenuItem("Speech model", children=_picker("asr_model", ASR_MODELS, s.asr_model)))
    items.append(MenuItem("Voice model", children=_picker("tts_model", TTS_MODELS, s.tts_model)))
    voices = v.tts.voices or ((s.voice,) if s.voice else ())
    items.append(MenuItem("Voice", children=(
        MenuItem("Default", "voice:", checked=s.voice is None),
        *(MenuItem(name, f"voice:{name}", checked=name == s.voice) for name in voices))))
    items.append(MenuItem("Settings", children=(
        MenuItem("Hands-free by", children=tuple(
            MenuItem(t.replace("_", "-"), f"toggle:{t}", checked=s.toggle == t)
            for t in TOGGLES)),
        MenuItem("Hands-free stops after silence", children=tuple(
            MenuItem(f"{ms / 1000:g} s" if ms else "never (tap to stop)", f"handsfree_stop:{ms}",
                     checked=s.handsfree_stop_ms == ms) for ms in HANDSFREE_STOP_CHOICES)),
        MenuItem("Latency", children=_latencies(s.latency_ms.get(s.asr_model),
                                                v.asr.latencies)),
        *_language_menu(s.language.get(s.asr_model), v.asr.languages),
        MenuItem("Unload models when idle", children=tuple(
            MenuItem(f"after {m} min" if m else "never", f"unload_after:{m}",
                     checked=s.unload_after_min == m) for m in UNLOAD_CHOICES)),
        MenuItem("Launch at login", "login_item", checked=s.login_item),
    )))
    items.append(SEPARATOR)
    items.append(MenuItem("Quit", "quit"))
    title = GLYPHS[state] + (f" {_tail(v.partial, TITLE_CHARS)}" if v.partial
                             and state == "listening" else "")
    return Menu(state, title, tuple(_fit(it) for it in items))


def _latencies(current: int | None, values: tuple[int, ...]) -> tuple[MenuItem, ...]:
    """The speech model's latency choices (its `latency.values()`, known once it has loaded;
    until then the one set for it)."""
    values = values or (() if current is None else (current,))
    return (MenuItem("Model default", "latency_ms:", checked=current is None),
            *(MenuItem(f"{d} ms", f"latency_ms:{d}", checked=current == d) for d in values))


def _language_menu(current: str | None, names: tuple[str, ...]) -> tuple[MenuItem, ...]:
    """Settings › Language, for a speech model that takes languages (its `languages`, known
    once it has loaded; until then the one set for it): none for a model that takes none."""
    from mlx_speech.text.language_names import label, offered

    names = offered(names) if names else (() if current is None else (current,))
    if not names:
        return ()
    return (MenuItem("Language", children=(
        MenuItem("Model default", "language:", checked=current is None),
        *(MenuItem("Detect automatically" if n == "auto" else label(n), f"language:{n}",
                   checked=current == n) for n in names))),)


def _picker(action: str, models, current: str) -> tuple[MenuItem, ...]:
    known = [MenuItem(label, f"{action}:{mid}", checked=mid == current)
             for mid, label, *_ in models]
    if current not in {mid for mid, *_ in models}:
        known.append(MenuItem(_short(current), f"{action}:{current}", checked=True))
    return tuple(known)


def render_text(menu: Menu) -> str:
    """The menu as indented text (for --preview and logs)."""
    lines = [f"[{menu.state}] {menu.title}"]

    def walk(items, depth):
        for it in items:
            if it is SEPARATOR or it.title == "-":
                lines.append("    " * (depth - 1) + "  --------")
                continue
            mark = "\u2713 " if it.checked else "  "
            off = "" if it.enabled else " (disabled)" if depth == 0 and it.id is None else ""
            arrow = " \u25b8" if it.children else ""
            lines.append("    " * (depth - 1) + "  " + mark + it.title + arrow + off)
            if it.children:
                walk(it.children, depth + 1)

    walk(menu.items, 1)
    return "\n".join(lines)
