// Speak as you type: the text box's new characters go to WS /v1/audio/speech/stream as they are
// typed (`input_text.append`); the server speaks each sentence as soon as it ends and its pcm16
// chunks are scheduled for playback as they come. Enter (or Speak) says the rest now
// (`input_text.flush`); Stop is a barge-in (`speech.cancel`: the server stops within a frame and
// what was not played yet is dropped). Edits before the end of what was sent are not unsaid.

import { closeReason, openSocket } from "./api.js";
import { FRAME_S, Player, base64ToBytes, meterWidth, pcm16FromBytes, pcm16ToFloat, wavBlob } from "./audio.js";
import { clearError, seconds, setState, showError } from "./ui.js";

const MAX_DELTA = 4096; // characters an input_text.append may carry

/** Starts a live session for `model` in the panel `el`; returns { input, flush, cancel, close }. */
export function startLive(model, el, ctx, onEnd) {
  clearError(el.error);
  el.result.hidden = true;
  const player = new Player(ctx, { lead: 0.1 });
  const chunks = [];
  let ws = null;
  let opened = false;
  let ready = false; // session.updated came: text may go
  let ended = false;
  let sent = "";
  let samples = 0;
  let quiet = null;
  // the server's generation numbers, mirrored: text opens one, a flush closes it; a cancel
  // drops the audio of every generation up to the last one opened (some may be on their way)
  let openedGens = 0;
  let open = false;
  let dropUpTo = 0;
  const meter = setInterval(() => {
    el.level.style.width = meterWidth(player.level());
  }, 80);

  function finish(err) {
    if (ended) return;
    ended = true;
    clearInterval(meter);
    clearTimeout(quiet);
    el.level.style.width = "0%";
    if (ws) ws.close();
    if (err) {
      player.stop();
      showError(el.error, err);
      setState(el.state, "error", "error");
    } else {
      setState(el.state, "idle", "idle");
    }
    el.stop.disabled = true;
    onEnd(err);
  }

  function send(event) {
    if (!ws || ws.readyState !== WebSocket.OPEN) return;
    if (event.type === "input_text.append" && !open) {
      openedGens += 1;
      open = true;
    } else if (event.type === "input_text.flush") {
      if (!open) openedGens += 1;
      open = false;
    } else if (event.type === "speech.cancel") {
      dropUpTo = openedGens;
      open = false;
    }
    ws.send(JSON.stringify(event));
  }

  /** What was typed at the end since the last look, as deltas. */
  function input() {
    if (!ready) return;
    const v = el.text.value;
    if (v.startsWith(sent)) {
      const d = v.slice(sent.length);
      for (let i = 0; i < d.length; i += MAX_DELTA) {
        send({ type: "input_text.append", text: d.slice(i, i + MAX_DELTA) });
      }
    }
    sent = v; // an edit inside what was sent: from here on, only what follows it goes
  }

  function onEvent(ev) {
    switch (ev.type) {
      case "session.updated":
        ready = true;
        setState(el.state, "listening", "type");
        el.status.textContent = "Type: each sentence is spoken as soon as it ends; Enter says the rest.";
        input();
        break;
      case "speech.audio.delta": {
        if (ev.generation <= dropUpTo) break; // stopped: not played
        const pcm = pcm16FromBytes(base64ToBytes(ev.audio));
        chunks.push(pcm);
        samples += pcm.length;
        player.push(pcm16ToFloat(pcm));
        clearTimeout(quiet);
        setState(el.state, "playing", "speaking");
        if (ev.ttfa_ms != null) {
          el.status.textContent = `First audio ${Math.round(ev.ttfa_ms)} ms after the sentence ended`;
        }
        break;
      }
      case "speech.audio.done": {
        if (ev.cancelled) {
          el.status.textContent = "Stopped.";
          break;
        }
        const wav = wavBlob(chunks, model.sample_rate);
        if (el.audio.src) URL.revokeObjectURL(el.audio.src);
        el.audio.src = URL.createObjectURL(wav);
        el.download.href = el.audio.src;
        el.download.download = "speech-live.wav";
        el.result.hidden = false;
        el.status.textContent = `${seconds(samples / model.sample_rate)} of audio so far` +
          (ev.ttfa_ms != null ? ` · first audio ${Math.round(ev.ttfa_ms)} ms after the sentence ended` : "");
        // back to "type" once the last chunk has been heard
        quiet = setTimeout(() => {
          if (!ended) setState(el.state, "listening", "type");
        }, player.ahead * 1000);
        break;
      }
      case "error":
        showError(el.error, ev.error.message);
        break;
      default:
        break;
    }
  }

  setState(el.state, "working", "connecting");
  el.stop.disabled = false;
  try {
    ws = openSocket("/v1/audio/speech/stream", "mlx-speech");
  } catch (e) {
    setTimeout(() => finish(e));
    return { input() {}, flush() {}, cancel() {}, close() {} };
  }
  ws.onopen = () => {
    opened = true;
    const session = { model: model.id };
    if (el.voice.value) session.voice = el.voice.value;
    if (el.seed.value !== "") session.seed = Number(el.seed.value);
    if (el.maxlen.value !== "") {
      session.max_frames = Math.max(1, Math.round(Number(el.maxlen.value) / FRAME_S));
    }
    send({ type: "session.update", session });
  };
  ws.onmessage = (m) => onEvent(JSON.parse(m.data));
  ws.onclose = async (ev) => {
    if (!ended) finish(new Error(await closeReason(ev, opened)));
  };

  return {
    input,
    /** Says the rest now; `tail` (a line break) is added to the box without being sent. */
    flush(tail = "") {
      input();
      send({ type: "input_text.flush" });
      if (tail) {
        el.text.value += tail;
        sent = el.text.value;
      }
    },
    cancel() {
      send({ type: "speech.cancel" });
      player.stop();
      clearTimeout(quiet);
      if (ready) setState(el.state, "listening", "type");
    },
    close() {
      finish(null);
    },
  };
}
