// Speech to text: live microphone transcription over the realtime WebSocket (OpenAI's
// transcription dialect, at the model's own rate), and file transcription over the REST endpoint.

import { apiFetch, closeReason, openSocket, sseEvents } from "./api.js";
import { FRAME_S, audioContext, bytesToBase64, floatToPcm16, meterWidth, openMic, rms } from "./audio.js";
import { clearError, count, instantiate, saveBlob, seconds, setState, showError, stem } from "./ui.js";

export function createAsr(model) {
  const { node, el } = instantiate("tpl-asr");
  languagePicker(model, el);
  liveTranscription(model, el);
  fileTranscription(model, el);
  return node;
}

// ---------------------------------------------------------------- live

function liveTranscription(model, el) {
  let live = null;
  el.mic.addEventListener("click", () => (live ? live.stop() : (live = startLive(model, el, () => {
    live = null;
  }))));
  el.clear.addEventListener("click", () => {
    for (const p of el.live.querySelectorAll("p:not(.partial)")) p.remove();
    if (!el.live.querySelector("p")) addPlaceholder(el.live);
  });
  el.copy.addEventListener("click", () => {
    const text = [...el.live.querySelectorAll("p.turn")].map((p) => p.textContent).join("\n");
    navigator.clipboard?.writeText(text);
  });
}

function addPlaceholder(box) {
  const p = document.createElement("p");
  p.className = "placeholder";
  p.textContent = "Your words will appear here.";
  box.append(p);
}

/** One turn: microphone -> appends -> commit -> the final text. Returns { stop }. */
function startLive(model, el, onEnd) {
  clearError(el.error);
  el.live.querySelector(".placeholder")?.remove();
  const turn = document.createElement("p");
  turn.className = "turn partial";
  el.live.append(turn);

  const rate = model.sample_rate;
  const ctx = audioContext(rate);
  const frameSize = Math.round(rate * FRAME_S);
  let ws = null;
  let mic = null;
  let opened = false;
  let stopping = false;
  let ended = false;
  let sent = 0;
  const early = []; // frames captured before the socket opened

  setState(el.state, "connecting", "connecting");
  el.mic.textContent = "Stop";
  el.mic.classList.add("danger");

  const append = (x) => {
    const pcm = floatToPcm16(x);
    ws.send(JSON.stringify({
      type: "input_audio_buffer.append",
      audio: bytesToBase64(new Uint8Array(pcm.buffer)),
    }));
    sent += x.length;
  };

  function finish(err) {
    if (ended) return;
    ended = true;
    if (err) {
      showError(el.error, err);
      setState(el.state, "error", "error");
    } else {
      setState(el.state, "idle", "idle");
    }
    turn.classList.remove("partial");
    if (!turn.textContent) {
      if (err) turn.remove();
      else turn.classList.add("empty");
    }
    el.level.style.width = "0%";
    el.mic.textContent = "Start microphone";
    el.mic.classList.remove("danger");
    el.mic.disabled = false;
    if (mic) mic.stop().catch(() => {});
    if (ws && ws.readyState <= WebSocket.OPEN) ws.close(1000);
    ctx.close();
    onEnd();
  }

  function onEvent(ev) {
    switch (ev.type) {
      case "conversation.item.input_audio_transcription.delta":
        turn.append(ev.delta);
        break;
      case "conversation.item.input_audio_transcription.completed":
        turn.textContent = ev.transcript;
        heardLanguage(el, turn, ev.languages);
        shadeWords(turn, ev.words, ev.logprobs); // before the label: it rewrites the text
        if (ev.speaker) markSpeaker(turn, ev.speaker);
        finish();
        break;
      case "error":
        finish(new Error(ev.error.message));
        break;
      default: // session.created / session.updated / input_audio_buffer.committed
    }
  }

  async function stop() {
    if (stopping || ended) return;
    stopping = true;
    el.mic.disabled = true;
    setState(el.state, "finishing", "finishing");
    const rest = mic ? await mic.stop() : new Float32Array(0);
    mic = null;
    if (!opened) {
      early.push(rest); // sent, then committed, once the socket opens
      return;
    }
    if (rest.length) append(rest);
    commit();
  }

  function commit() {
    if (sent === 0) finish();
    else ws.send(JSON.stringify({ type: "input_audio_buffer.commit" }));
  }

  (async () => {
    try {
      ws = openSocket(`/v1/realtime?intent=transcription&model=${encodeURIComponent(model.id)}`,
                      "realtime");
    } catch (e) {
      finish(e);
      return;
    }
    ws.onopen = () => {
      opened = true;
      ws.send(JSON.stringify({
        type: "session.update",
        session: {
          type: "transcription",
          include: ["item.input_audio_transcription.logprobs"],
          audio: { input: { format: { type: "audio/pcm", rate: ctx.sampleRate },
                            transcription: { model: model.id, ...vocabulary(el), ...language(el),
                                             ...(model.diarize ? { diarize: true } : {}) },
                            turn_detection: null } },
        },
      }));
      for (const x of early.splice(0)) if (x.length) append(x);
      if (stopping) commit();
      else if (mic) setState(el.state, "recording", "listening");
    };
    ws.onmessage = (m) => onEvent(JSON.parse(m.data));
    ws.onclose = async (ev) => {
      if (!ended) finish(new Error(await closeReason(ev, opened)));
    };
    try {
      mic = await openMic(ctx, {
        frameSize,
        processing: { echoCancellation: false, noiseSuppression: el.nsup.checked,
                      autoGainControl: false },
        onFrame: (x) => {
          el.level.style.width = meterWidth(rms(x));
          if (opened && !stopping) append(x);
          else if (!stopping) early.push(x);
        },
      });
    } catch (e) {
      finish(e);
      return;
    }
    if (ended) mic.stop();
    else if (opened && !stopping) setState(el.state, "recording", "listening");
  })();

  return { stop };
}

// ---------------------------------------------------------------- language

/** A language's name for people: "German (Germany)" for "de-DE" (the browser's own names),
 * the tag itself where the browser has none. */
export function languageName(tag) {
  if (tag === "auto") return "Detect the language";
  try {
    const name = new Intl.DisplayNames(["en"], { type: "language", languageDisplay: "standard" }).of(tag);
    if (name && name !== tag) return name;
  } catch {
    // not a tag the browser knows
  }
  return tag;
}

/** The names a picker offers of a model's `languages` (GET /v1/models): `auto`, the locales,
 * and the bare codes no locale stands for (`de` is `de-DE`'s alias; `enGB`-style aliases are
 * left out); sorted by their names. */
export function pickerLanguages(names) {
  const tags = names.filter((n) => /^[a-z]{2,3}(-[A-Za-z0-9]{2,4})?$/.test(n));
  const shown = tags.filter((n) => n.includes("-") || !tags.some((m) => m.startsWith(`${n}-`)));
  shown.sort((a, b) => languageName(a).localeCompare(languageName(b)));
  return [...(names.includes("auto") ? ["auto"] : []), ...shown];
}

/** The panel's language picker, for models that take a language (`model.languages`). */
function languagePicker(model, el) {
  if (!model.languages || !model.languages.length) return;
  const add = (value, text) => {
    const o = document.createElement("option");
    o.value = value;
    o.textContent = text;
    el.language.append(o);
  };
  add("", "Model default");
  for (const tag of pickerLanguages(model.languages)) {
    add(tag, tag === "auto" ? `${languageName(tag)} (auto)` : `${languageName(tag)} · ${tag}`);
  }
  el.langbox.hidden = false;
}

/** The chosen language: { language } for the server, or {} for the model's default. */
function language(el) {
  return el.language.value ? { language: el.language.value } : {};
}

/** The language the server reports for a transcript (OpenAI's `languages`: [{code, locale}]),
 * as a tag, or "" when it reports none. */
function reportedLanguage(languages) {
  const l = languages && languages[0];
  return l ? l.locale || l.code : "";
}

/** Shows what language the model heard in the last live turn. */
function heardLanguage(el, turn, languages) {
  const tag = reportedLanguage(languages);
  if (!tag) return;
  turn.dataset.language = tag;
  turn.title = languageName(tag);
  el.heard.textContent = `Heard: ${languageName(tag)}`;
}

/** The vocabulary box: { hotwords, boost } for the server, or {} when it is empty. */
function vocabulary(el) {
  const hotwords = el.vocab.value.trim();
  if (!hotwords) return {};
  const boost = Number(el.boost.value);
  return { hotwords, boost: Number.isFinite(boost) && boost >= 0 ? boost : 1 };
}

export const LOW_CONFIDENCE = 0.5; // a word whose least likely token is below this is shaded

/** Per word of the token logprobs ({token, logprob}): its text and least likely token's
 * probability. A word starts at a token with a leading space (as the server groups words). */
export function wordConfidences(logprobs) {
  const out = [];
  let cur = null;
  for (const t of logprobs) {
    if (cur && cur.text.trim() && /^\s/.test(t.token)) {
      out.push(cur);
      cur = null;
    }
    if (!cur) cur = { text: "", lp: 0 };
    cur.text += t.token;
    cur.lp = Math.min(cur.lp, t.logprob);
  }
  if (cur && cur.text.trim()) out.push(cur);
  return out.map((w) => ({ text: w.text.trim(), p: Math.exp(w.lp) }));
}

/** Wrap the turn's words in spans, shading the unsure ones; the text stays as it is. */
function shadeWords(turn, words, logprobs) {
  if (!words || !logprobs) return;
  const conf = wordConfidences(logprobs);
  if (conf.length !== words.length) return; // tokens and words disagree: leave it plain
  const text = turn.textContent;
  turn.textContent = "";
  let at = 0;
  words.forEach((w, i) => {
    const k = text.indexOf(w.word, at);
    if (k < 0) return;
    if (k > at) turn.append(text.slice(at, k));
    const s = document.createElement("span");
    s.className = conf[i].p < LOW_CONFIDENCE ? "word low" : "word";
    s.textContent = w.word;
    s.title = `${w.start.toFixed(2)}–${w.end.toFixed(2)} s, confidence ${Math.round(conf[i].p * 100)} %`;
    turn.append(s);
    at = k + w.word.length;
  });
  if (at < text.length) turn.append(text.slice(at));
}

// ---------------------------------------------------------------- file

function fileTranscription(model, el) {
  let file = null;
  let result = null; // { text, words }
  const cache = new Map(); // format -> Blob (srt/vtt asked of the server once per file)

  function choose(f) {
    if (!f) return;
    file = f;
    result = null;
    cache.clear();
    el.fname.textContent = `${f.name} (${(f.size / 1e6).toFixed(2)} MB)`;
    el.go.disabled = false;
    el.player.src = URL.createObjectURL(f);
    el.player.hidden = false;
    el.words.hidden = true;
    el.speakers?.remove();
    el.speakers = null;
    el.downloads.hidden = true;
    clearError(el.ferror);
    setState(el.fstate, "idle", "ready");
  }

  el.file.addEventListener("change", () => choose(el.file.files[0]));
  el.drop.addEventListener("dragover", (e) => {
    e.preventDefault();
    el.drop.classList.add("over");
  });
  el.drop.addEventListener("dragleave", () => el.drop.classList.remove("over"));
  el.drop.addEventListener("drop", (e) => {
    e.preventDefault();
    el.drop.classList.remove("over");
    choose(e.dataTransfer.files[0]);
  });

  function form(format, stream) {
    const f = new FormData();
    f.append("file", file, file.name);
    f.append("model", model.id);
    f.append("response_format", format);
    if (stream) f.append("stream", "true");
    f.append("timestamp_granularities[]", "word");
    const v = vocabulary(el);
    if (v.hotwords) {
      f.append("hotwords", v.hotwords);
      f.append("boost", String(v.boost));
    }
    if (el.language.value) f.append("language", el.language.value);
    return f;
  }

  el.go.addEventListener("click", async () => {
    el.go.disabled = true;
    clearError(el.ferror);
    setState(el.fstate, "working", "transcribing");
    el.progress.hidden = false;
    el.words.hidden = false;
    el.downloads.hidden = true;
    el.words.textContent = "";
    const streaming = document.createElement("span");
    streaming.className = "streaming";
    el.words.append(streaming);
    const t0 = performance.now();
    const tick = setInterval(() => {
      el.elapsed.textContent = seconds((performance.now() - t0) / 1000);
    }, 200);
    try {
      const res = await apiFetch("/v1/audio/transcriptions", { method: "POST", body: form("json", true) });
      for await (const ev of sseEvents(res)) {
        if (ev.type === "transcript.text.delta") streaming.append(ev.delta);
        else if (ev.type === "transcript.text.done") {
          result = { text: ev.text, words: ev.words || [], language: reportedLanguage(ev.languages) };
        }
        else if (ev.type === "error") throw new Error(ev.error.message);
      }
      if (!result) throw new Error("the transcription ended early");
      renderWords(el, result);
      if (model.diarize) await renderSpeakers(el, form("diarized_json", false));
      el.downloads.hidden = false;
      setState(el.fstate, "idle", "done");
      el.elapsed.textContent = `${seconds((performance.now() - t0) / 1000)}, ${count(result.words.length, "word")}` +
        (result.language ? `, ${languageName(result.language)}` : "");
    } catch (e) {
      showError(el.ferror, e);
      setState(el.fstate, "error", "error");
    } finally {
      clearInterval(tick);
      el.progress.hidden = true;
      el.go.disabled = false;
    }
  });

  el.player.addEventListener("timeupdate", () => {
    const t = el.player.currentTime;
    for (const w of el.words.querySelectorAll(".word")) {
      w.classList.toggle("now", +w.dataset.start <= t && t < +w.dataset.end);
    }
  });

  async function serverFormat(format, button) {
    if (!cache.has(format)) {
      const label = button.textContent;
      button.disabled = true;
      button.textContent = "…";
      try {
        const res = await apiFetch("/v1/audio/transcriptions", { method: "POST", body: form(format, false) });
        cache.set(format, await res.blob());
      } catch (e) {
        showError(el.ferror, e);
        return;
      } finally {
        button.disabled = false;
        button.textContent = label;
      }
    }
    saveBlob(cache.get(format), `${stem(file.name)}.${format}`);
  }

  el["dl-txt"].addEventListener("click", () => {
    saveBlob(new Blob([result.text + "\n"], { type: "text/plain" }), `${stem(file.name)}.txt`);
  });
  el["dl-json"].addEventListener("click", () => {
    const body = JSON.stringify({ text: result.text, words: result.words }, null, 2);
    saveBlob(new Blob([body], { type: "application/json" }), `${stem(file.name)}.json`);
  });
  el["dl-srt"].addEventListener("click", (e) => serverFormat("srt", e.currentTarget));
  el["dl-vtt"].addEventListener("click", (e) => serverFormat("vtt", e.currentTarget));
}

function renderWords(el, result) {
  el.words.textContent = "";
  if (!result.words.length) {
    el.words.textContent = result.text || "(no speech recognised)";
    return;
  }
  result.words.forEach((w, i) => {
    if (i) el.words.append(" ");
    const s = document.createElement("span");
    s.className = "word";
    s.textContent = w.word;
    s.dataset.start = w.start;
    s.dataset.end = w.end;
    s.title = `${w.start.toFixed(2)}–${w.end.toFixed(2)} s`;
    s.addEventListener("click", () => {
      el.player.currentTime = w.start;
      el.player.play();
    });
    el.words.append(s);
  });
}

// ---------------------------------------------------------------- speakers (--diarizer)

/** Colour a transcript line by its speaker ("Speaker 1" or OpenAI's "A"). */
function markSpeaker(p, speaker) {
  const key = String(speaker).replace(/^Speaker /, "");
  const n = /^\d+$/.test(key) ? +key - 1 : key.charCodeAt(0) - 65;
  p.classList.add("speaker", `speaker-${((n % 6) + 6) % 6}`);
  p.dataset.speaker = speaker;
  const tag = document.createElement("b");
  tag.className = "who";
  tag.textContent = /^\d+$/.test(key) ? `${speaker}: ` : `Speaker ${speaker}: `;
  p.prepend(tag);
}

/** The file's speaker turns (response_format=diarized_json), one coloured line each. */
async function renderSpeakers(el, body) {
  const res = await apiFetch("/v1/audio/transcriptions", { method: "POST", body });
  const d = await res.json();
  const box = document.createElement("div");
  box.className = "transcript speakers";
  box.dataset.el = "speakers";
  for (const seg of d.segments) {
    const p = document.createElement("p");
    p.textContent = seg.text;
    p.dataset.start = seg.start;
    p.dataset.end = seg.end;
    markSpeaker(p, seg.speaker);
    box.append(p);
  }
  el.words.after(box);
  el.speakers?.remove();
  el.speakers = box;
}
