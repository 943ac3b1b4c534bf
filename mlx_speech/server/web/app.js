// The page: one tab per served model (GET /v1/models), the API key asked for once when the
// server wants one, the server's health, errors shown where they happen.

import { ApiError, apiFetch, forgetKey, hasKey, listModels, setKey } from "./api.js";
import { createAsr } from "./asr.js";
import { createDuplex } from "./duplex.js";
import { createTts } from "./tts.js";

const KINDS = {
  asr: ["speech to text", createAsr],
  tts: ["text to speech", createTts],
  duplex: ["conversation", createDuplex],
};

const $ = (id) => document.getElementById(id);

function banner(message) {
  $("banner-text").textContent = message;
  $("banner").hidden = !message;
}

/** Asks for the key; resolves true once one is entered, false when cancelled. */
function askKey(error = "") {
  const dialog = $("key-dialog");
  $("key-error").textContent = error;
  $("key-input").value = "";
  return new Promise((resolve) => {
    const done = (ok) => {
      $("key-form").onsubmit = null;
      $("key-cancel").onclick = null;
      dialog.close();
      resolve(ok);
    };
    $("key-form").onsubmit = (e) => {
      e.preventDefault();
      const value = $("key-input").value.trim();
      if (!value) return;
      setKey(value, $("key-remember").checked);
      done(true);
    };
    $("key-cancel").onclick = () => done(false);
    dialog.showModal();
    $("key-input").focus();
  });
}

/** The model list, asking for the API key while the server says 401. */
async function modelsWithKey() {
  let error = "";
  for (;;) {
    try {
      return await listModels();
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 401) throw e;
      if (hasKey()) {
        forgetKey();
        error = "The server did not accept that key.";
      }
      $("loading").textContent = "This server needs an API key.";
      $("key-button").hidden = false;
      if (!(await askKey(error))) return null;
    }
  }
}

/** Each id's repo or folder name (`mistralai/Voxtral-4B-TTS-2603` -> `Voxtral-4B-TTS-2603`,
 * `/models/vr-4bit/` -> `vr-4bit`), with more of the path where two would read the same. */
function shortNames(ids) {
  const parts = ids.map((id) => id.split(/[\\/]+/).filter(Boolean));
  const names = new Map();
  for (const [i, id] of ids.entries()) {
    let k = 1;
    const tail = (p, n) => p.slice(-n).join("/");
    while (k < parts[i].length &&
           parts.some((p, j) => j !== i && tail(p, k) === tail(parts[i], k))) k += 1;
    names.set(id, tail(parts[i], k) || id);
  }
  return names;
}

function buildTabs(models) {
  const tabs = $("tabs");
  const main = $("main");
  tabs.textContent = "";
  main.textContent = "";
  const panels = new Map();
  const names = shortNames(models.map((m) => m.id));
  for (const m of models) {
    const kind = KINDS[m.kind];
    if (!kind) continue;
    const tab = document.createElement("button");
    tab.className = "tab";
    tab.type = "button";
    tab.setAttribute("role", "tab");
    tab.dataset.model = m.id;
    tab.innerHTML = '<span class="kind"></span><span class="name"></span>';
    tab.querySelector(".kind").textContent = kind[0];
    tab.querySelector(".name").textContent = names.get(m.id);
    tab.title = m.sample_rate ? `${m.id} (${kind[0]}, ${m.sample_rate / 1000} kHz)`
      : `${m.id} (${kind[0]}, loaded when first used)`;
    tab.addEventListener("click", () => {
      location.hash = `model=${encodeURIComponent(m.id)}`;
    });
    tabs.append(tab);
    const panel = m.sample_rate ? kind[1](m) : unloaded(m);
    panel.hidden = true;
    panel.dataset.model = m.id;
    panel.setAttribute("role", "tabpanel");
    main.append(panel);
    panels.set(m.id, [tab, panel]);
  }
  return panels;
}

/** A model the server loads when first used: its panel needs the details (sample rate,
 * voices) the server knows once it is loaded, so selecting its tab loads it. */
function unloaded(m) {
  const panel = document.createElement("section");
  panel.className = "panel";
  const p = document.createElement("p");
  p.className = "placeholder";
  p.textContent = "This model is loaded when first used.";
  panel.append(p);
  return panel;
}

async function load(panels, models, id) {
  const m = models.find((x) => x.id === id);
  const [tab, old] = panels.get(id);
  if (m.sample_rate || old.dataset.loading) return;
  old.dataset.loading = "true";
  old.querySelector(".placeholder").textContent = "Loading the model…";
  try {
    const res = await apiFetch(`/v1/models/${encodeURIComponent(id)}/load`, { method: "POST" });
    Object.assign(m, await res.json());
  } catch (e) {
    old.querySelector(".placeholder").textContent = `Cannot load the model: ${e.message}`;
    delete old.dataset.loading;
    return;
  }
  const panel = KINDS[m.kind][1](m);
  panel.dataset.model = id;
  panel.setAttribute("role", "tabpanel");
  panel.hidden = old.hidden;
  old.replaceWith(panel);
  panels.set(id, [tab, panel]);
  tab.title = `${m.id} (${KINDS[m.kind][0]}, ${m.sample_rate / 1000} kHz)`;
}

function select(panels, models) {
  const wanted = new URLSearchParams(location.hash.slice(1)).get("model");
  let id = wanted;
  if (id === null || !panels.has(id)) {
    if (id !== null) {
      banner(`Model “${id}” is not served here. This server serves: ` +
             `${models.map((m) => m.id).join(", ")}.`);
    }
    id = panels.keys().next().value;
  } else {
    banner("");
  }
  for (const [mid, [tab, panel]] of panels) {
    tab.setAttribute("aria-selected", String(mid === id));
    panel.hidden = mid !== id;
  }
  load(panels, models, id);
}

async function watchHealth() {
  const dot = $("health");
  let wasDown = false;
  for (;;) {
    let ok = false;
    try {
      const res = await fetch("/health", { cache: "no-store" });
      ok = res.ok;
      dot.title = ok ? "the server is up" : `the server is unhealthy: ${(await res.json()).error}`;
    } catch {
      dot.title = "the server cannot be reached";
    }
    dot.dataset.state = ok ? "ok" : "down";
    dot.textContent = ok ? "server up" : "server down";
    if (!ok) banner(`The server is not answering (${dot.title}).`);
    else if (wasDown) banner("");
    wasDown = !ok;
    await new Promise((r) => setTimeout(r, ok ? 10000 : 3000));
  }
}

async function boot() {
  $("banner-close").addEventListener("click", () => banner(""));
  $("key-button").addEventListener("click", async () => {
    if (await askKey()) location.reload();
  });
  watchHealth();
  let models;
  try {
    models = await modelsWithKey();
  } catch (e) {
    $("loading").textContent = "";
    banner(`Cannot list the models: ${e.message}`);
    return;
  }
  if (models === null) {
    $("loading").textContent = "This server needs an API key: use the “API key” button above.";
    return;
  }
  if (hasKey()) $("key-button").hidden = false;
  if (!models.length) {
    $("loading").textContent = "This server serves no models.";
    return;
  }
  const panels = buildTabs(models);
  select(panels, models);
  window.addEventListener("hashchange", () => select(panels, models));
  document.body.dataset.ready = "true";
}

boot();
