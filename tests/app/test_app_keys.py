"""Hotkeys from raw tap events (keys.py): key codes, sided modifiers, chords, event times."""

from __future__ import annotations

import pytest

from mlx_speech.app.events import Key
from mlx_speech.app.keys import (
    FLAGS_CHANGED,
    KEY_DOWN,
    KEY_UP,
    OPTION,
    KeyTracker,
    event_time,
    parse_hotkey,
)

ALT_L, ALT_R, CTRL_L, CTRL_R = 58, 61, 59, 62
L_BIT, R_BIT = 0x20, 0x40  # NX_DEVICELALTKEYMASK, NX_DEVICERALTKEYMASK


def test_right_option_is_not_left_option():
    k = KeyTracker({"dictate": "alt_r"})
    assert k.event(FLAGS_CHANGED, ALT_L, OPTION | L_BIT, 1.0) == []
    assert k.event(FLAGS_CHANGED, ALT_R, OPTION | L_BIT | R_BIT, 2.0) == [
        Key("dictate", True, 2.0)]
    # right released while left is still held: the side-free Option flag stays set
    assert k.event(FLAGS_CHANGED, ALT_R, OPTION | L_BIT, 3.0) == [Key("dictate", False, 3.0)]
    assert k.event(FLAGS_CHANGED, ALT_L, 0, 4.0) == [] and k.down == set()


def test_a_missed_release_is_reconciled_from_the_flags():
    k = KeyTracker({"dictate": "alt_r"})
    k.event(FLAGS_CHANGED, ALT_R, OPTION | R_BIT, 1.0)
    # its up was never seen; the next event's flags say no Option is down
    assert k.event(KEY_DOWN, 0, 0, 2.0) == [Key("dictate", False, 2.0)]


def test_keyboards_without_sided_flag_bits():
    k = KeyTracker({"dictate": "alt_r"})
    assert k.event(FLAGS_CHANGED, ALT_R, OPTION, 1.0) == [Key("dictate", True, 1.0)]
    assert k.event(FLAGS_CHANGED, ALT_R, 0, 2.0) == [Key("dictate", False, 2.0)]


def test_chords_match_either_side_and_go_up_when_all_keys_are_up():
    k = KeyTracker({"speak": "ctrl+alt+s"}, keycode_for={"s": 31}.get)  # a layout's "s"
    k.event(FLAGS_CHANGED, CTRL_R, 0x40000 | 0x2000, 1.0)
    k.event(FLAGS_CHANGED, ALT_L, 0x40000 | 0x2000 | OPTION | L_BIT, 1.1)
    assert k.event(KEY_DOWN, 1, 0x42020 | 0x80000, 1.2) == []  # ANSI "s": not this layout's
    assert k.event(KEY_DOWN, 31, 0x40000 | 0x2000 | OPTION | L_BIT, 1.3) == [
        Key("speak", True, 1.3)]
    assert k.event(KEY_DOWN, 31, 0x40000 | 0x2000 | OPTION | L_BIT, 1.4, True) == []
    assert k.event(KEY_UP, 31, 0x40000 | 0x2000 | OPTION | L_BIT, 1.5) == []
    assert k.event(FLAGS_CHANGED, CTRL_R, OPTION | L_BIT, 1.6) == []
    assert k.event(FLAGS_CHANGED, ALT_L, 0, 1.7) == [Key("speak", False, 1.7)]


def test_esc_fn_and_bad_specs():
    k = KeyTracker({"dictate": "fn"})
    assert k.event(KEY_DOWN, 53, 0, 1.0) == [Key("esc", True, 1.0)]
    assert k.event(KEY_DOWN, 125, 0x800000, 1.1) == []  # an arrow key carries the fn flag
    assert k.event(FLAGS_CHANGED, 63, 0x800000, 1.2) == [Key("dictate", True, 1.2)]
    assert k.event(FLAGS_CHANGED, 63, 0, 1.3) == [Key("dictate", False, 1.3)]
    assert parse_hotkey("Option+Command+F5") == (frozenset({58, 61}), frozenset({55, 54}),
                                                 frozenset({96}))
    for bad in ("hyper", "ctrl+", "alt+ß"):
        with pytest.raises(ValueError):
            parse_hotkey(bad)
    assert k.reset(2.0) == []


@pytest.mark.parametrize("scale", [1.0, 125 / 3])
def test_event_time_from_nanoseconds_or_mach_ticks(scale):
    now_ns = 123_456_789_000_000
    ts = int((now_ns - 300_000_000) / scale)  # 300 ms ago
    assert event_time(ts, now_ns) == pytest.approx(now_ns / 1e9 - 0.3, abs=1e-6)
    assert event_time(now_ns + 5, now_ns) == now_ns / 1e9  # not in the past: now


def test_portaudio_is_rescanned_only_with_no_stream_open():
    from mlx_speech.app import devices

    try:
        import sounddevice as sd
    except (ImportError, OSError) as e:
        pytest.skip(f"no PortAudio here ({e})")
    devices._opened(+1)  # a stream of ours is open: never restart PortAudio under it
    try:
        assert devices.rescan_devices() is False
    finally:
        devices._opened(-1)
    assert devices.rescan_devices() is True
    assert sd.query_devices() is not None  # PortAudio works again after the restart
