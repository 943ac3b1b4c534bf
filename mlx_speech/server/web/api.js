// Talking to mlx_speech.server from its own page: the API key, REST calls, server-sent events
// and WebSockets. Browsers cannot set headers on a WebSocket, so the key travels as the
// `openai-insecure-api-key.KEY` subprotocol (the server checks it and names another one back).

const STORE = "mlx_speech.api_key";
const KEY_PROTOCOL = "openai-insecure-api-key.";

let key = localStorage.getItem(STORE) || sessionStorage.getItem(STORE) || null;

export function hasKey() {
  return key !== null;
}

export function setKey(value, remember) {
  key = value;
  localStorage.removeItem(STORE);
  sessionStorage.removeItem(STORE);
  (remember ? localStorage : sessionStorage).setItem(STORE, value);
}

export function forgetKey() {
  key = null;
  localStorage.removeItem(STORE);
  sessionStorage.removeItem(STORE);
}

export class ApiError extends Error {
  constructor(message, status = 0, code = null) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const UNREACHABLE = "cannot reach the server: is mlx_speech.server still running?";

async function errorOf(res) {
  let message = `the server answered ${res.status} ${res.statusText}`;
  let code = null;
  try {
    const body = await res.json();
    if (body && body.error) {
      message = body.error.message || message;
      code = body.error.code || null;
    }
  } catch {
    // not JSON: keep the status line
  }
  if (res.status === 401) message = "missing or wrong API key: use the “API key” button above";
  return new ApiError(message, res.status, code);
}

/** fetch() with the key; throws ApiError (status, server message) on anything but 2xx. */
export async function apiFetch(path, init = {}) {
  const headers = new Headers(init.headers || {});
  if (key !== null) headers.set("Authorization", `Bearer ${key}`);
  let res;
  try {
    res = await fetch(path, { ...init, headers });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(UNREACHABLE);
  }
  if (!res.ok) throw await errorOf(res);
  return res;
}

/** The JSON objects of a text/event-stream body, in order (`data: [DONE]` ends it). */
export async function* sseEvents(res) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

/** A WebSocket to `path` on this server, the key as a subprotocol when there is one. */
export function openSocket(path, protocol) {
  const url = new URL(path, location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  const protocols = [protocol];
  if (key !== null) protocols.push(KEY_PROTOCOL + key);
  try {
    return new WebSocket(url, protocols);
  } catch (e) {
    if (e.name === "SyntaxError" && key !== null) {
      throw new ApiError("this API key cannot travel on a browser WebSocket: use only letters, " +
                         "digits and - . _ ~ in --api-key");
    }
    throw e;
  }
}

/** Why a socket closed, in words; `opened` tells a refused handshake from a dropped line. */
export async function closeReason(ev, opened) {
  if (!opened) {
    try {
      await fetch("/health", { cache: "no-store" });
    } catch {
      return UNREACHABLE;
    }
    return "the server refused the connection: wrong API key, or this page's origin is not " +
           "allowed (--allowed-origin)";
  }
  const why = ev.reason ? `: ${ev.reason}` : "";
  if (ev.code === 1012 || ev.code === 1001) return `the server is shutting down (${ev.code})${why}`;
  if (ev.code === 1006) return "the connection to the server was lost";
  return `the server closed the connection (${ev.code})${why}`;
}

export async function listModels() {
  const res = await apiFetch("/v1/models");
  return (await res.json()).data;
}
