"""`--preview DIR`: the menu of every state drawn with Pillow (look at the UI without macOS).

`sample_views()` builds one realistic `View` per state; `draw(menu)` paints the menu bar strip
(icon + title) and the open menu; `write_previews(dir)` writes `<state>.png` for each.
"""

from __future__ import annotations

from pathlib import Path

from mlx_speech.errors import optional

from .core import ModelInfo, RecentItem, View
from .menu import SEPARATOR, STATES, Menu, present, render_text
from .settings import Settings

# icon colours per state: (fill, ring)
COLORS = {
    "idle": (None, (60, 60, 60)), "loading": (None, (120, 120, 120)),
    "downloading": ((70, 130, 220), (70, 130, 220)), "listening": ((220, 40, 40), (220, 40, 40)),
    "silent_mic": ((240, 150, 20), (240, 150, 20)), "finalizing": ((70, 130, 220), None),
    "speaking": ((40, 160, 80), (40, 160, 80)), "needs_permission": ((240, 190, 20), None),
    "error": ((200, 30, 30), None),
}
FONT_PATHS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/Library/Fonts/Arial Unicode.ttf",
              "/System/Library/Fonts/Supplemental/Arial Unicode.ttf")


def sample_views(settings: Settings | None = None) -> dict[str, View]:
    """One View per state, with the data a person would see in it."""
    s = settings or Settings()
    asr, tts = ModelInfo(s.asr_model, "ready"), ModelInfo(s.tts_model, "unloaded")
    recent = (RecentItem("Thanks, I'll send the slides tomorrow morning.", True, "typed"),
              RecentItem("Let's move the review to Thursday.", False, note="focus-changed"))
    base = dict(settings=s, asr=asr, tts=tts, recent=recent)
    views = {
        "idle": View(**base),
        "loading": View(**{**base, "asr": ModelInfo(s.asr_model, "loading"), "recent": ()}),
        "downloading": View(**{**base, "asr": ModelInfo(s.asr_model, "downloading",
                                                        1_240_000_000, 3_100_000_000),
                               "recent": ()}),
        "listening": View(**base, listening=True, mode="hold",
                          partial="so the plan for next week is"),
        "silent_mic": View(**base, listening=True, mode="toggle", silent=True,
                           partial="so the plan"),
        "finalizing": View(**base, finalizing=1, partial="so the plan for next week is simple"),
        "speaking": View(**{**base, "tts": ModelInfo(s.tts_model, "ready",
                                                     voices=("casual_male", "neutral_female"))},
                         speaking=True, speak_text="The quarterly numbers are in."),
        "needs_permission": View(**base, needs=("accessibility",)),
        "error": View(**base, error="the focused app changed: kept in Recent (Paste last)"),
    }
    assert set(views) == set(STATES)
    return views


def _pillow():
    """Pillow's (Image, ImageDraw, ImageFont), or one line naming the extra."""
    with optional("app", "the preview"):
        from PIL import Image, ImageDraw, ImageFont
    return Image, ImageDraw, ImageFont


def _font(size: int):
    ImageFont = _pillow()[2]
    for p in FONT_PATHS:
        if Path(p).exists():
            return ImageFont.truetype(p, size)
    return ImageFont.load_default(size)


def draw_icon(d, state: str, x: int, y: int, r: int = 8) -> None:
    """A microphone-dot icon: ring for ready states, filled while active."""
    fill, ring = COLORS[state]
    box = (x - r, y - r, x + r, y + r)
    if state == "loading":
        for k in range(0, 360, 45):
            d.arc(box, k, k + 22, fill=ring, width=2)
    else:
        d.ellipse(box, fill=fill, outline=ring or fill, width=2)
    if state == "downloading":
        d.polygon([(x - 4, y - 1), (x + 4, y - 1), (x, y + 5)], fill="white")
        d.line([(x, y - 5), (x, y)], fill="white", width=2)
    elif state == "speaking":
        d.polygon([(x - 3, y - 5), (x - 3, y + 5), (x + 5, y)], fill="white")
    elif state == "finalizing":
        for dx in (-4, 0, 4):
            d.ellipse((x + dx - 1, y - 1, x + dx + 1, y + 1), fill="white")
    elif state in ("needs_permission", "error"):
        d.line([(x, y - 5), (x, y + 1)], fill="white", width=2)
        d.ellipse((x - 1, y + 3, x + 1, y + 5), fill="white")
    elif state in ("listening", "silent_mic"):
        d.rounded_rectangle((x - 2, y - 5, x + 2, y + 2), 2, fill="white")
        d.arc((x - 4, y - 3, x + 4, y + 4), 0, 180, fill="white", width=1)


def draw(menu: Menu, width: int = 440):
    """The menu bar strip and the open menu as an RGB image."""
    Image, ImageDraw, _ = _pillow()
    font, small = _font(13), _font(11)
    row, bar = 20, 26
    rows = [it for it in menu.items]
    height = bar + 10 + sum(7 if it is SEPARATOR else row for it in rows) + 10
    img = Image.new("RGB", (width, height), (236, 236, 236))
    d = ImageDraw.Draw(img)
    d.rectangle((0, 0, width, bar), fill=(246, 246, 246))
    d.line((0, bar, width, bar), fill=(200, 200, 200))
    title = menu.title[1:].strip()  # the glyph is drawn as the icon
    tw = d.textlength(title, font=font) if title else 0
    ix = int(width - 28 - tw)
    draw_icon(d, menu.state, ix, bar // 2)
    if title:
        d.text((ix + 14, bar // 2), title, font=font, fill=(30, 30, 30), anchor="lm")
    d.text((8, bar // 2), menu.state, font=small, fill=(150, 150, 150), anchor="lm")
    x0, y = 10, bar + 6
    d.rounded_rectangle((x0, y, width - 10, height - 6), 6, fill=(252, 252, 252),
                        outline=(190, 190, 190))
    y += 4
    for it in rows:
        if it is SEPARATOR:
            d.line((x0 + 8, y + 3, width - 18, y + 3), fill=(220, 220, 220))
            y += 7
            continue
        color = (25, 25, 25) if it.enabled else (130, 130, 130)
        if it.checked:
            d.text((x0 + 8, y + row // 2), "\u2713", font=font, fill=color, anchor="lm")
        d.text((x0 + 24, y + row // 2), it.title, font=font, fill=color, anchor="lm")
        if it.children:
            d.text((width - 26, y + row // 2), "\u25b8", font=font, fill=color, anchor="lm")
        y += row
    return img


def write_previews(folder: str | Path, settings: Settings | None = None) -> list[tuple[str, str]]:
    """Write `<state>.png` for every state; returns (state, the menu as text) pairs."""
    _pillow()  # before making the folder
    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    done = []
    for state, view in sample_views(settings).items():
        menu = present(view)
        if menu.state != state:  # the sample must really be in that state
            raise AssertionError(f"preview for {state} presents as {menu.state}")
        draw(menu).save(out / f"{state}.png")
        done.append((state, render_text(menu)))
    return done
