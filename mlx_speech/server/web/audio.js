// Audio in the page: microphone capture through an AudioWorklet at the model's rate, gapless
// scheduled playback, 16-bit PCM and WAV helpers.

export const FRAME_S = 0.08; // every streaming model here steps in 80 ms frames

/** An AudioContext at `rate` (the model's), created inside the click that starts audio. */
export function audioContext(rate) {
  const Ctx = window.AudioContext || window.webkitAudioContext;
  if (!Ctx) throw new Error("this browser has no Web Audio API");
  const ctx = rate ? new Ctx({ sampleRate: rate, latencyHint: "interactive" }) : new Ctx();
  ctx.resume(); // allowed: we are inside the user's click
  return ctx;
}

function micError(e) {
  switch (e.name) {
    case "NotAllowedError":
    case "SecurityError":
      return new Error("microphone permission was denied: allow the microphone for this page " +
                       "(the icon left of the address bar), then try again");
    case "NotFoundError":
    case "OverconstrainedError":
      return new Error("no microphone was found: plug one in, or pick one in the system settings");
    case "NotReadableError":
    case "AbortError":
      return new Error("the microphone cannot be opened: another application may be using it");
    default:
      return new Error(`cannot open the microphone: ${e.message || e.name}`);
  }
}

/**
 * Opens the microphone into `ctx`: `onFrame(Float32Array)` gets frames of `frameSize` samples
 * at ctx.sampleRate. `processing` holds the browser's echoCancellation, noiseSuppression and
 * autoGainControl switches. Returns { stop(): Promise<Float32Array> } where stop hands back
 * the samples of the last, partial frame.
 */
export async function openMic(ctx, { frameSize, processing, onFrame }) {
  if (!window.isSecureContext || !navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new Error("the microphone needs a secure page: open this page as http://localhost:" +
                    `${location.port || 80} on the machine running the server, or over HTTPS`);
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, ...processing },
      video: false,
    });
  } catch (e) {
    throw micError(e);
  }
  let src, node;
  try {
    await ctx.audioWorklet.addModule("/web/capture-worklet.js");
    src = ctx.createMediaStreamSource(stream);
    node = new AudioWorkletNode(ctx, "mlx-capture", {
      numberOfInputs: 1,
      numberOfOutputs: 1,
      channelCount: 1,
      channelCountMode: "explicit",
      channelInterpretation: "speakers",
      processorOptions: { frameSize },
    });
  } catch (e) {
    stream.getTracks().forEach((t) => t.stop());
    throw new Error(`cannot capture the microphone at ${ctx.sampleRate} Hz: ${e.message}`);
  }
  let flushed = null;
  node.port.onmessage = (e) => {
    if (e.data.frame) onFrame(e.data.frame);
    else if (e.data.flushed && flushed) flushed(e.data.flushed);
  };
  src.connect(node);
  const track = stream.getAudioTracks()[0];
  return {
    track,
    async stop() {
      src.disconnect();
      stream.getTracks().forEach((t) => t.stop());
      // the audio thread answers at once; a closed context never does
      const rest = await new Promise((resolve) => {
        flushed = resolve;
        node.port.postMessage("flush");
        setTimeout(() => resolve(new Float32Array(0)), 1000);
      });
      node.port.onmessage = null;
      return rest;
    },
  };
}

/**
 * Plays chunks back to back: each chunk is one AudioBuffer at the context's rate started at the
 * exact sample where the previous one ends, so the joins have no gap. When a chunk comes late
 * (the queue ran dry) playback restarts `lead` seconds ahead (an underrun, counted), and the
 * lead grows so that a slow source stutters less. With `slack` set (a conversation), a chunk
 * that would play more than lead + slack seconds ahead is dropped (counted): after a stall the
 * burst that follows does not become lasting delay.
 */
export class Player {
  constructor(ctx, { lead = 0.1, maxLead = 0.5, slack = Infinity } = {}) {
    this.ctx = ctx;
    this.rate = ctx.sampleRate;
    this.lead = lead;
    this.maxLead = maxLead;
    this.slack = slack;
    this.out = ctx.createGain();
    this.out.connect(ctx.destination);
    this.next = null; // context frame where the next chunk starts
    this.sources = new Set();
    this.levels = []; // [start s, end s, rms] of scheduled chunks, for the level display
    this.underruns = 0;
    this.dropped = 0;
    this.samples = 0;
  }

  push(x) {
    if (!x.length) return true;
    const now = Math.ceil(this.ctx.currentTime * this.rate);
    if (this.next === null || this.next < now) {
      if (this.next !== null) {
        this.underruns += 1;
        this.lead = Math.min(this.maxLead, this.lead * 1.5);
      }
      this.next = now + Math.round(this.lead * this.rate);
    } else if ((this.next - now) / this.rate > this.lead + this.slack) {
      this.dropped += x.length;
      return false;
    }
    const buf = this.ctx.createBuffer(1, x.length, this.rate);
    buf.copyToChannel(x, 0);
    const src = this.ctx.createBufferSource();
    src.buffer = buf;
    src.connect(this.out);
    src.onended = () => this.sources.delete(src);
    this.sources.add(src);
    const start = this.next / this.rate;
    src.start(start);
    this.next += x.length;
    this.samples += x.length;
    this.levels.push([start, this.next / this.rate, rms(x)]);
    if (this.levels.length > 64) this.levels.shift();
    return true;
  }

  /** Seconds scheduled but not yet played. */
  get ahead() {
    return this.next === null ? 0 : Math.max(0, this.next / this.rate - this.ctx.currentTime);
  }

  /** The level of what is playing now (0 when nothing is). */
  level() {
    const t = this.ctx.currentTime;
    for (const [a, b, v] of this.levels) if (a <= t && t < b) return v;
    return 0;
  }

  stop() {
    for (const s of this.sources) {
      try {
        s.stop();
      } catch {
        // never started
      }
    }
    this.sources.clear();
    this.levels = [];
    this.next = null;
  }
}

export function rms(x) {
  let s = 0;
  for (let i = 0; i < x.length; i++) s += x[i] * x[i];
  return x.length ? Math.sqrt(s / x.length) : 0;
}

/** A level meter's width for an rms value (dB scale, -60 dB .. 0 dB). */
export function meterWidth(v) {
  const db = 20 * Math.log10(Math.max(v, 1e-6));
  return `${Math.max(0, Math.min(100, ((db + 60) / 60) * 100)).toFixed(0)}%`;
}

export function floatToPcm16(x) {
  const out = new Int16Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const v = Math.max(-1, Math.min(1, x[i]));
    out[i] = Math.round(v * 32767);
  }
  return out;
}

export function pcm16ToFloat(x) {
  const out = new Float32Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = x[i] / 32768;
  return out;
}

/** 16-bit little-endian bytes -> Int16Array (copies: the bytes may be unaligned). */
export function pcm16FromBytes(bytes) {
  const n = bytes.length >> 1;
  const out = new Int16Array(n);
  const view = new DataView(bytes.buffer, bytes.byteOffset, n * 2);
  for (let i = 0; i < n; i++) out[i] = view.getInt16(2 * i, true);
  return out;
}

export function bytesToBase64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

export function base64ToBytes(b64) {
  const s = atob(b64);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

/** A 16-bit mono WAV file of Int16Array chunks. */
export function wavBlob(chunks, rate) {
  const n = chunks.reduce((a, c) => a + c.length, 0);
  const head = new DataView(new ArrayBuffer(44));
  const text = (o, s) => [...s].forEach((ch, i) => head.setUint8(o + i, ch.charCodeAt(0)));
  text(0, "RIFF");
  head.setUint32(4, 36 + 2 * n, true);
  text(8, "WAVE");
  text(12, "fmt ");
  head.setUint32(16, 16, true);
  head.setUint16(20, 1, true); // PCM
  head.setUint16(22, 1, true); // mono
  head.setUint32(24, rate, true);
  head.setUint32(28, rate * 2, true);
  head.setUint16(32, 2, true);
  head.setUint16(34, 16, true);
  text(36, "data");
  head.setUint32(40, 2 * n, true);
  // WAV is little-endian, like every platform this page runs on
  return new Blob([head.buffer, ...chunks.map((c) => new Uint8Array(c.buffer, c.byteOffset, c.byteLength))],
                  { type: "audio/wav" });
}
