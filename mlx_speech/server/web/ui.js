// Small DOM helpers shared by the panels.

/** A clone of template `id`; `el` maps each [data-el] name to its element. */
export function instantiate(id) {
  const node = document.getElementById(id).content.firstElementChild.cloneNode(true);
  const el = {};
  for (const e of node.querySelectorAll("[data-el]")) el[e.dataset.el] = e;
  return { node, el };
}

/** A state badge: `state` drives its colour (and tests), `label` is what a person reads. */
export function setState(badge, state, label = state) {
  badge.dataset.state = state;
  badge.textContent = label;
}

export function showError(line, err) {
  const msg = err instanceof Error ? err.message : String(err);
  line.textContent = msg ? msg.charAt(0).toUpperCase() + msg.slice(1) : "";
  if (err && !(err instanceof Error && err.expected)) console.warn(err);
}

export function clearError(line) {
  line.textContent = "";
}

export function saveBlob(blob, name) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}

/** "1 word", "2 words", "0 words": a count and its noun (regular plurals). */
export function count(n, noun) {
  return `${n} ${noun}${n === 1 ? "" : "s"}`;
}

export function seconds(s) {
  return `${s.toFixed(1)} s`;
}

/** A filename-safe stem for downloads. */
export function stem(name) {
  return (name || "audio").replace(/\.[^.]+$/, "").replace(/[^\w.-]+/g, "_") || "audio";
}
