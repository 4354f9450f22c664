// The public API, as any client calls it: the key from sessionStorage as a bearer header (a
// speech token in its place for the streams), errors as {"error": {"code", "message"}} turned
// into words.

const KEY_STORAGE = "voicehost.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

const HINTS = {
  401: "Enter a valid API key in the Key view.",
  403: "This key lacks the scope for it.",
  429: "This key holds its most streams at once; try again in a moment.",
  503: "The server is busy or still starting; try again in a moment.",
};

// What went wrong, in words: the status, the server's code and message, and what to do.
export function describe(error) {
  if (error instanceof ApiError) {
    const hint = HINTS[error.status] ? ` ${HINTS[error.status]}` : "";
    return `${error.status} ${error.code}: ${error.message}.${hint}`;
  }
  if (error instanceof TypeError) {
    return `Lost the connection to the server (${error.message}). Is it running?`;
  }
  return String(error && error.message ? error.message : error);
}

function headers(credential) {
  const result = {};
  const key = credential === undefined ? apiKey() : credential;
  if (key) result.Authorization = `Bearer ${key}`;
  return result;
}

async function errorOf(response) {
  let code = "http_error";
  let message = response.statusText || "request failed";
  try {
    const body = await response.json();
    if (body && body.error) ({ code, message } = body.error);
  } catch {
    // not the error shape (a proxy's page): the status says it
  }
  return new ApiError(response.status, code, message);
}

// fetch() with the key (or a speech token as `credential`); resolves to the response when it
// is 2xx, throws ApiError otherwise. A body other than JSON goes with its contentType if given
// (the WebRTC offer's SDP).
export async function call(
  path,
  { method = "GET", json, body, contentType, signal, credential } = {},
) {
  const init = { method, headers: headers(credential), signal };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (body !== undefined) {
    if (contentType) init.headers["Content-Type"] = contentType;
    init.body = body;
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await errorOf(response);
  return response;
}

// The events of a text/event-stream response (POST /v1/audio/speech with stream_format
// "sse"): each "data:" block parsed as JSON, as it comes.
export async function* serverEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const lines = buffer.slice(0, end).split("\n");
      buffer = buffer.slice(end + 2);
      const data = lines.filter((line) => line.startsWith("data:")).map((l) => l.slice(5).trim());
      if (data.length > 0) yield JSON.parse(data.join("\n"));
    }
  }
}

// Base64 (an SSE audio delta) to bytes.
export function bytesOf(base64) {
  const text = atob(base64);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return bytes;
}

export async function getJson(path, options) {
  return (await call(path, options)).json();
}

// What the page speaks with: a short-lived speech token (POST /v1/tokens) when a key is set
// and the server mints them, so the key itself goes into no stream and no URL; the key when it
// cannot mint one (the speech route then says why); null on a server without keys. A token is
// kept for the next streams until a minute before it expires.
const TOKEN_SECONDS = 600;
const TOKEN_MARGIN_MS = 60_000;
let minted = null; // { key, token, until }

export async function speechCredential() {
  const key = apiKey();
  if (!key) return null;
  if (minted && minted.key === key && minted.until - Date.now() > TOKEN_MARGIN_MS) {
    return minted.token;
  }
  try {
    const json = { ttl_seconds: TOKEN_SECONDS };
    const body = await getJson("/v1/tokens", { method: "POST", json });
    minted = { key, token: body.token, until: Date.parse(body.expires_at) };
    return body.token;
  } catch (error) {
    if (error instanceof ApiError && error.status !== 401) return key;
    throw error;
  }
}

// The realtime socket's URL; the credential (a speech token, see above) goes in its documented
// api_key parameter (browsers cannot set headers on a WebSocket), nowhere else.
export function realtimeUrl(credential) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = new URL(`${scheme}//${location.host}/v1/audio/speech/ws`);
  if (credential) url.searchParams.set("api_key", credential);
  return url.toString();
}

// A tiny event bus between the views: "voices" when the list may have changed.
export const events = new EventTarget();
