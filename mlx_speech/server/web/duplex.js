// Full duplex (Moshi, PersonaPlex): Kyutai's /api/chat protocol with raw 16-bit PCM frames
// (`format=pcm`: no codec in the page). One 80 ms microphone frame goes up per model step and
// one 80 ms frame of the model's voice comes back, with its text.

import { closeReason, openSocket } from "./api.js";
import { FRAME_S, Player, audioContext, floatToPcm16, meterWidth, openMic, pcm16FromBytes, pcm16ToFloat, rms } from "./audio.js";
import { clearError, count, instantiate, setState, showError } from "./ui.js";

const HANDSHAKE = 0, AUDIO = 1, TEXT = 2, ERROR = 5;
const SPEAKING_RMS = 0.015; // the model's output above this level counts as speaking

// PersonaPlex role prompts (free text; these are starting points)
const ROLES = [
  ["Friendly teacher", "You are a wise and friendly teacher. Answer questions or give advice " +
                       "in a clear and engaging way."],
  ["Casual conversation", "You enjoy having a good conversation. Chat casually, listen, and " +
                          "ask the other person about their day."],
  ["Help desk", "You work at the help desk of an electronics shop. Politely ask questions " +
                "to understand the customer's problem, then help them solve it."],
  ["Interview coach", "You are a job interview coach. Ask the user one interview question at " +
                      "a time and give short, constructive feedback on each answer."],
  ["Custom…", ""],
];

export function createDuplex(model) {
  const { node, el } = instantiate("tpl-duplex");
  if (model.roles) {
    el.persona.hidden = false;
    el.role.hidden = false;
    for (const v of model.voices) el.voice.append(new Option(v, v));
    if (model.voices.includes("NATF0")) el.voice.value = "NATF0";
    if (!model.voices.length) el.voice.append(new Option("(default)", ""));
    for (const [name] of ROLES) el.preset.append(new Option(name, name));
    el.role.value = ROLES[0][1];
    el.preset.addEventListener("change", () => {
      const r = ROLES.find(([name]) => name === el.preset.value);
      el.role.value = r[1];
      if (!r[1]) el.role.focus();
    });
    el.role.addEventListener("input", () => {
      if (!ROLES.some(([, text]) => text === el.role.value)) el.preset.value = "Custom…";
    });
  }

  let talk = null;
  el.start.addEventListener("click", () => {
    if (!talk) talk = converse(model, el, () => {
      talk = null;
    });
  });
  el.stop.addEventListener("click", () => talk && talk.stop());
  return node;
}

function converse(model, el, onEnd) {
  clearError(el.error);
  el.text.textContent = "";
  const words = document.createTextNode("");
  const para = document.createElement("p");
  para.append(words);
  el.text.append(para);

  const rate = model.sample_rate;
  const frameSize = Math.round(rate * FRAME_S);
  const ctx = audioContext(rate);
  const player = new Player(ctx, { lead: 0.12, slack: 0.2 });
  const decoder = new TextDecoder();
  let ws = null;
  let mic = null;
  let opened = false;
  let ready = false;
  let stopping = false;
  let ended = false;
  let sent = 0;
  let received = 0;
  let youLevel = 0;
  let drained = null; // resolves once every frame sent has been answered

  el.start.disabled = true;
  el.stop.disabled = false;
  el.seed.disabled = el.voice.disabled = el.preset.disabled = el.role.disabled = true;
  setState(el.state, "connecting", model.roles
    ? "connecting (preparing the voice and role)" : "connecting");

  const params = new URLSearchParams({ model: model.id, format: "pcm" });
  params.set("seed", el.seed.value !== "" ? el.seed.value : String(Math.floor(Math.random() * 2 ** 31)));
  if (model.roles) {
    if (el.voice.value) params.set("voice", el.voice.value);
    if (el.role.value.trim()) params.set("role", el.role.value.trim());
  }

  const ticker = setInterval(() => {
    el.you.style.width = meterWidth(youLevel);
    const level = player.level();
    el.model.style.width = meterWidth(level);
    if (ready && !stopping && !ended) {
      if (level > SPEAKING_RMS) setState(el.state, "speaking", "speaking");
      else setState(el.state, "listening", "listening");
    }
    el.stats.textContent = `↑ ${count(sent, "frame")} sent · ↓ ${received} received · ` +
      `${Math.round(player.ahead * 1000)} ms queued to play · ${count(player.underruns, "underrun")}` +
      (player.dropped ? ` · ${(player.dropped / rate).toFixed(2)} s skipped to stay live` : "") +
      ` · seed ${params.get("seed")}`;
  }, 100);

  function finish(err) {
    if (ended) return;
    ended = true;
    clearInterval(ticker);
    if (err) {
      showError(el.error, err);
      setState(el.state, "error", "error");
    } else {
      setState(el.state, "idle", "ended");
    }
    if (mic) mic.stop().catch(() => {});
    if (ws && ws.readyState <= WebSocket.OPEN) ws.close(1000);
    player.stop();
    ctx.close();
    el.you.style.width = el.model.style.width = "0%";
    el.start.disabled = false;
    el.stop.disabled = true;
    el.seed.disabled = el.voice.disabled = el.preset.disabled = el.role.disabled = false;
    onEnd();
  }

  function onMessage(m) {
    const bytes = new Uint8Array(m.data);
    switch (bytes[0]) {
      case HANDSHAKE:
        ready = true;
        setState(el.state, "listening", "listening");
        break;
      case AUDIO: {
        received += 1;
        if (!stopping) player.push(pcm16ToFloat(pcm16FromBytes(bytes.subarray(1))));
        if (drained && received >= sent) drained();
        break;
      }
      case TEXT:
        words.appendData(decoder.decode(bytes.subarray(1)));
        el.text.scrollTop = el.text.scrollHeight;
        break;
      case ERROR:
        finish(new Error(decoder.decode(bytes.subarray(1))));
        break;
      default: // control, ping: nothing to do
    }
  }

  async function stop() {
    if (stopping || ended) return;
    stopping = true;
    el.stop.disabled = true;
    player.stop();
    setState(el.state, "finishing", "finishing");
    if (mic) await mic.stop(); // the last partial frame is not sent: the model steps whole frames
    mic = null;
    // the text of every frame already sent is on its way: wait for it (bounded)
    if (ready && received < sent) {
      await Promise.race([new Promise((r) => (drained = r)), new Promise((r) => setTimeout(r, 3000))]);
    }
    finish();
  }

  (async () => {
    try {
      ws = openSocket(`/api/chat?${params}`, "mlx-speech");
    } catch (e) {
      finish(e);
      return;
    }
    ws.binaryType = "arraybuffer";
    ws.onopen = () => {
      opened = true;
    };
    ws.onmessage = onMessage;
    ws.onclose = async (ev) => {
      if (!ended) finish(new Error(await closeReason(ev, opened)));
    };
    try {
      mic = await openMic(ctx, {
        frameSize,
        processing: { echoCancellation: el.aec.checked, noiseSuppression: el.ns.checked,
                      autoGainControl: true },
        onFrame: (x) => {
          youLevel = rms(x);
          // nothing is sent before the handshake: the model is not listening yet
          if (!ready || stopping || ended || ws.readyState !== WebSocket.OPEN) return;
          const pcm = floatToPcm16(x);
          const msg = new Uint8Array(1 + 2 * pcm.length);
          msg[0] = AUDIO;
          msg.set(new Uint8Array(pcm.buffer), 1);
          ws.send(msg);
          sent += 1;
        },
      });
    } catch (e) {
      finish(e);
      return;
    }
    if (ended) mic.stop();
  })();

  return { stop };
}
