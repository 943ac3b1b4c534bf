// Text to speech: POST /v1/audio/speech as server-sent events of 16-bit PCM; each chunk is
// scheduled for playback as it arrives, so speech starts while the rest is being generated.
// "Speak as I type" streams the text in instead (tts-live.js): each sentence is heard as soon
// as it is typed.

import { apiFetch, sseEvents } from "./api.js";
import { FRAME_S, Player, audioContext, base64ToBytes, meterWidth, pcm16FromBytes, pcm16ToFloat, wavBlob } from "./audio.js";
import { startLive } from "./tts-live.js";
import { clearError, instantiate, seconds, setState, showError } from "./ui.js";

export function createTts(model) {
  const { node, el } = instantiate("tpl-tts");
  for (const v of model.voices) el.voice.append(new Option(v, v));
  if (!model.voices.length) el.voice.append(new Option("(default)", ""));

  let ctx = null;
  let job = null;
  let live = null;

  el.speak.addEventListener("click", () => {
    if (live) {
      live.flush();
      return;
    }
    if (job) job.cancel();
    ctx = ctx || audioContext(model.sample_rate);
    ctx.resume();
    job = speak(model, el, ctx, () => {
      job = null;
    });
  });
  el.stop.addEventListener("click", () => {
    if (live) live.cancel();
    else if (job) job.cancel();
  });
  el.live.addEventListener("change", () => {
    if (!el.live.checked) {
      if (live) live.close();
      return;
    }
    if (job) job.cancel();
    ctx = ctx || audioContext(model.sample_rate);
    ctx.resume();
    el.text.value = "";
    el.text.placeholder = "Type here: each sentence is spoken as soon as it ends";
    el.speak.textContent = "Say the rest";
    live = startLive(model, el, ctx, () => {
      live = null;
      el.live.checked = false;
      el.speak.textContent = "Speak";
    });
    el.text.focus();
  });
  el.text.addEventListener("input", () => live && live.input());
  el.text.addEventListener("keydown", (e) => {
    if (live && e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      live.flush("\n");
    } else if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      el.speak.click();
    }
  });
  return node;
}

function speak(model, el, ctx, onEnd) {
  clearError(el.error);
  const text = el.text.value.trim();
  const abort = new AbortController();
  const player = new Player(ctx, { lead: 0.1 });
  const chunks = [];
  let samples = 0;
  let cancelled = false;
  let meter = null;

  const body = { model: model.id, input: text, response_format: "pcm", stream_format: "sse" };
  if (el.voice.value) body.voice = el.voice.value;
  if (el.seed.value !== "") body.seed = Number(el.seed.value);
  if (el.maxlen.value !== "") body.max_frames = Math.max(1, Math.round(Number(el.maxlen.value) / FRAME_S));

  function done(state, label) {
    clearInterval(meter);
    el.level.style.width = "0%";
    setState(el.state, state, label);
    el.stop.disabled = true;
    onEnd();
  }

  const job = {
    cancel() {
      cancelled = true;
      abort.abort();
      player.stop();
      done("idle", "stopped");
    },
  };

  (async () => {
    if (!text) {
      showError(el.error, "type some text to say");
      done("idle", "idle");
      return;
    }
    el.stop.disabled = false;
    el.result.hidden = true;
    setState(el.state, "working", "generating");
    el.status.textContent = "Generating…";
    const t0 = performance.now();
    let seed = "";
    try {
      const res = await apiFetch("/v1/audio/speech", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
        signal: abort.signal,
      });
      seed = res.headers.get("x-seed") || "";
      meter = setInterval(() => {
        el.level.style.width = meterWidth(player.level());
      }, 80);
      for await (const ev of sseEvents(res)) {
        if (ev.type === "speech.audio.delta") {
          const pcm = pcm16FromBytes(base64ToBytes(ev.audio));
          chunks.push(pcm);
          samples += pcm.length;
          player.push(pcm16ToFloat(pcm));
          setState(el.state, "playing", "playing");
          el.status.textContent = `Generating… ${seconds(samples / model.sample_rate)} of audio so far`;
        } else if (ev.type === "error") {
          throw new Error(ev.error.message);
        }
      }
    } catch (e) {
      if (cancelled) return;
      player.stop();
      showError(el.error, e);
      el.status.textContent = "";
      done("error", "error");
      return;
    }
    if (cancelled) return;
    const took = (performance.now() - t0) / 1000;
    const audio = samples / model.sample_rate;
    el.status.textContent = `${seconds(audio)} of audio generated in ${seconds(took)}` +
      (seed ? ` · seed ${seed}` : "");
    const wav = wavBlob(chunks, model.sample_rate);
    if (el.audio.src) URL.revokeObjectURL(el.audio.src);
    el.audio.src = URL.createObjectURL(wav);
    el.download.href = el.audio.src;
    el.download.download = `speech${seed ? "-" + seed : ""}.wav`;
    el.result.hidden = false;
    // the state follows playback: "playing" until the last chunk has been heard
    const left = player.ahead;
    setTimeout(() => {
      if (!cancelled) done("idle", "done");
    }, left * 1000);
  })();
  return job;
}
