// Speak: pick a voice, hear a text as it streams (POST /v1/audio/speech, pcm), download it
// in any format; "type as you go" over the realtime socket, with barge-in.

import { ApiError, call, describe, events, getJson, realtimeUrl } from "./api.js";
import { SAMPLE_RATE, StreamPlayer } from "./player.js";

const $ = (id) => document.getElementById(id);
const EXTENSIONS = { opus: "ogg", mulaw: "ulaw", alaw: "alaw" };
const FLUSH_AFTER_MS = 700; // a pause in typing speaks what is buffered

function seconds(value) {
  return `${value.toFixed(2)} s`;
}

function say(element, text, kind = "") {
  element.textContent = text;
  element.dataset.kind = kind;
}

export function selectedVoice() {
  return $("speak-voice").value;
}

// --- the voice picker ----------------------------------------------------------------------

function optionText(voice) {
  const parts = [voice.kind, voice.status];
  return `${voice.name} (${voice.id}: ${parts.join(", ")})`;
}

function fillVoices(voices) {
  const select = $("speak-voice");
  const before = select.value;
  select.replaceChildren();
  for (const voice of voices) {
    if (voice.status === "error") continue;
    const option = new Option(optionText(voice), voice.id);
    select.append(option);
  }
  if ([...select.options].some((o) => o.value === before)) select.value = before;
  showVoiceInfo();
}

export function evaluationSummary(manifest) {
  const evaluation = manifest && manifest.eval;
  if (!evaluation) return "";
  const parts = [];
  if (evaluation.similarity) parts.push(`similarity ${evaluation.similarity.mean.toFixed(3)}`);
  if (evaluation.baseline_voice && evaluation.baseline) {
    parts.push(`${evaluation.baseline_voice} ${evaluation.baseline.mean.toFixed(3)}`);
  }
  if (typeof evaluation.gain === "number") parts.push(`gain ${evaluation.gain.toFixed(3)}`);
  if (evaluation.real_time_factor) {
    parts.push(`RTF ${evaluation.real_time_factor.mean.toFixed(2)}`);
  }
  if (evaluation.report_only) parts.push("report only");
  return parts.join(", ");
}

async function showVoiceInfo() {
  const info = $("speak-voice-info");
  const id = selectedVoice();
  if (!id) {
    say(info, "No voice to speak with.");
    return;
  }
  try {
    const { voice } = await getJson(`/v1/voices/${encodeURIComponent(id)}`);
    const manifest = voice.manifest || {};
    const parts = [voice.kind];
    if (manifest.status) parts.push(String(manifest.status));
    if (manifest.version !== undefined) parts.push(`version ${manifest.version}`);
    const figures = evaluationSummary(manifest);
    if (figures) parts.push(`evaluation: ${figures}`);
    say(info, parts.join(" · "));
  } catch (error) {
    // details need the 'voices' scope; speaking does not
    say(info, error instanceof ApiError && error.status === 403 ? "" : describe(error), "error");
  }
}

// --- speaking over HTTP --------------------------------------------------------------------

function showSamples(id, stats) {
  $(id).textContent = String(stats.received);
  if (stats.played !== undefined) $(id).dataset.played = String(stats.played);
}

const player = new StreamPlayer((stats) => showSamples("speak-samples", stats));
let speaking = null; // the AbortController of the request in flight

async function speak() {
  const status = $("speak-status");
  const input = $("speak-text").value;
  if (speaking) speaking.abort();
  const controller = new AbortController();
  speaking = controller;
  for (const id of ["speak-ttfa", "speak-rtf", "speak-seconds"]) $(id).textContent = "-";
  $("speak-samples").textContent = "0";
  say(status, "Speaking...");
  try {
    await player.open();
    player.reset();
    const started = performance.now();
    const response = await call("/v1/audio/speech", {
      method: "POST",
      json: { input, voice: selectedVoice(), response_format: "pcm" },
      signal: controller.signal,
    });
    const reader = response.body.getReader();
    let samples = 0;
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      const added = player.push(value);
      if (added > 0 && samples === 0) {
        $("speak-ttfa").textContent = `${Math.round(performance.now() - started)} ms`;
      }
      samples += added;
      const audio = samples / SAMPLE_RATE;
      $("speak-seconds").textContent = seconds(audio);
      if (audio > 0) {
        $("speak-rtf").textContent = ((performance.now() - started) / 1000 / audio).toFixed(2);
      }
    }
    say(status, `Done: ${seconds(samples / SAMPLE_RATE)} of audio.`, "ok");
  } catch (error) {
    if (error.name === "AbortError") say(status, "Stopped.");
    else say(status, describe(error), "error");
  } finally {
    if (speaking === controller) speaking = null;
  }
}

function stopSpeaking() {
  if (speaking) speaking.abort();
  player.clear();
}

async function download() {
  const status = $("speak-status");
  const format = $("speak-format").value;
  say(status, `Making ${format}...`);
  try {
    const response = await call("/v1/audio/speech", {
      method: "POST",
      json: { input: $("speak-text").value, voice: selectedVoice(), response_format: format },
    });
    const blob = await response.blob();
    const link = $("speak-file");
    if (link.href) URL.revokeObjectURL(link.href);
    link.href = URL.createObjectURL(blob);
    link.download = `${selectedVoice()}.${EXTENSIONS[format] || format}`;
    link.textContent = `${link.download} (${Math.round(blob.size / 1024)} KB)`;
    link.hidden = false;
    link.click();
    say(status, `Downloaded ${link.download}.`, "ok");
  } catch (error) {
    say(status, describe(error), "error");
  }
}

async function fillFormats() {
  // the formats the server serves, from its own OpenAPI document
  try {
    const doc = await getJson("/openapi.json");
    const formats = doc.components.schemas.SpeechRequest.properties.response_format.enum;
    const select = $("speak-format");
    select.replaceChildren(...formats.map((f) => new Option(f, f)));
    select.value = formats.includes("wav") ? "wav" : formats[0];
  } catch (error) {
    say($("speak-status"), describe(error), "error");
  }
}

// --- type as you go: the realtime socket ---------------------------------------------------

const live = {
  socket: null,
  ready: false,
  pending: [], // messages until the config is accepted
  sent: 0, // characters of the text area already sent
  flushTimer: null,
  firstTextAt: null, // since the last start or barge-in: for the time to first audio
  heard: false,
  stopping: false,
};

const livePlayer = new StreamPlayer((stats) => showSamples("live-samples", stats));

function liveSend(message) {
  if (live.ready) live.socket.send(JSON.stringify(message));
  else live.pending.push(message);
}

function openSocket() {
  const status = $("live-status");
  const socket = new WebSocket(realtimeUrl());
  socket.binaryType = "arraybuffer";
  live.socket = socket;
  live.ready = false;
  let refusal = null;
  socket.onopen = () => {
    socket.send(JSON.stringify({ type: "config", voice: selectedVoice(), response_format: "pcm" }));
  };
  socket.onmessage = (message) => {
    if (socket !== live.socket) return;
    if (typeof message.data !== "string") {
      if (live.stopping) return;
      if (livePlayer.push(message.data) > 0 && !live.heard) {
        live.heard = true;
        const ms = Math.round(performance.now() - live.firstTextAt);
        $("live-ttfa").textContent = `${ms} ms`;
      }
      return;
    }
    const event = JSON.parse(message.data);
    if (event.type === "ready") {
      live.ready = true;
      for (const pending of live.pending.splice(0)) socket.send(JSON.stringify(pending));
      say(status, `Connected: ${event.voice}, ${event.response_format} at ${event.sample_rate} Hz.`);
    } else if (event.type === "segment.started") {
      $("live-segment").textContent = event.text;
    } else if (event.type === "segment.done") {
      $("live-segment").textContent = "-";
    } else if (event.type === "cancelled") {
      live.stopping = false;
      $("live-segment").textContent = "-";
      say(status, "Stopped: the server cancelled what was left.", "ok");
    } else if (event.type === "error") {
      refusal = event.error;
      const wait = event.retry_after ? ` Try again in ${event.retry_after} s.` : "";
      say(status, `${event.error.code}: ${event.error.message}.${wait}`, "error");
    }
  };
  socket.onclose = (close) => {
    if (socket !== live.socket) return;
    live.socket = null;
    live.ready = false;
    live.pending = [];
    if (refusal && refusal.code === "idle_timeout") {
      say(status, "The realtime socket closed after a quiet spell; typing again reconnects.");
    } else if (!refusal && close.code !== 1000) {
      say(status, `Lost the realtime connection (code ${close.code}); typing again reconnects.`, "error");
    }
  };
}

function liveInput() {
  const text = $("live-text").value;
  if (text.length < live.sent) live.sent = text.length; // deleted: what was sent is not unsaid
  const piece = text.slice(live.sent);
  if (!piece) return;
  live.sent = text.length;
  if (!live.socket) openSocket();
  if (live.firstTextAt === null) {
    live.firstTextAt = performance.now();
    live.heard = false;
    $("live-ttfa").textContent = "-";
  }
  liveSend({ type: "text", text: piece });
  clearTimeout(live.flushTimer);
  live.flushTimer = setTimeout(() => {
    if (live.socket) liveSend({ type: "flush" });
  }, FLUSH_AFTER_MS);
}

function liveStop() {
  clearTimeout(live.flushTimer);
  livePlayer.clear();
  live.firstTextAt = null;
  if (live.socket && live.ready) {
    live.stopping = true;
    live.socket.send(JSON.stringify({ type: "cancel" }));
    say($("live-status"), "Stopping...");
  }
}

// Audio starts on a gesture: the first key press or click in the live field opens the player.
async function livePrepare() {
  try {
    await livePlayer.open();
  } catch (error) {
    say($("live-status"), describe(error), "error");
  }
}

export function initSpeak() {
  events.addEventListener("voices", (event) => fillVoices(event.detail));
  $("speak-voice").addEventListener("change", () => {
    showVoiceInfo();
    if (live.socket) live.socket.close(1000); // the next piece opens one for the new voice
  });
  $("speak-play").addEventListener("click", speak);
  $("speak-stop").addEventListener("click", stopSpeaking);
  $("speak-download").addEventListener("click", download);
  $("live-text").addEventListener("keydown", livePrepare, { once: true });
  $("live-text").addEventListener("pointerdown", livePrepare, { once: true });
  $("live-text").addEventListener("input", liveInput);
  $("live-stop").addEventListener("click", liveStop);
  fillFormats();
}

// Speak a text with a voice through the page's player (the clone view's "hear the clone").
export async function speakWith(voice, input, status) {
  const samples = [0];
  const hearing = new StreamPlayer(() => {});
  await hearing.open();
  const response = await call("/v1/audio/speech", {
    method: "POST",
    json: { input, voice, response_format: "pcm" },
  });
  const reader = response.body.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    samples[0] += hearing.push(value);
    say(status, `Playing: ${seconds(samples[0] / SAMPLE_RATE)} received.`);
  }
  say(status, `The clone said it: ${seconds(samples[0] / SAMPLE_RATE)}.`, "ok");
}
