// Speak: pick a voice, hear a text as it streams (POST /v1/audio/speech, pcm in SSE with its
// words timed), download it in any format; "type as you go" over the realtime socket or WebRTC,
// with barge-in, timing the first audio of each. Both show captions (captions.js: the word
// heard now, by the player's clock; after a barge-in, the words heard) and a level meter.

import {
  ApiError,
  bytesOf,
  call,
  describe,
  events,
  getJson,
  realtimeUrl,
  serverEvents,
  speechCredential,
} from "./api.js";
import { Captions } from "./captions.js";
import { isSample, sampleFor } from "./languages.js";
import { SAMPLE_RATE, StreamPlayer, rmsOf } from "./player.js";
import { PeerLink, webRtcAvailable } from "./webrtc.js";

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
  const parts = [voice.language, voice.kind, voice.status];
  return `${voice.name} (${voice.id}: ${parts.join(", ")})`;
}

function fillVoices(voices) {
  const select = $("speak-voice");
  const before = select.value;
  select.replaceChildren();
  for (const voice of voices) {
    if (voice.status === "error") continue;
    const option = new Option(optionText(voice), voice.id);
    option.dataset.language = voice.language;
    select.append(option);
  }
  if ([...select.options].some((o) => o.value === before)) select.value = before;
  offerSample();
  showVoiceInfo();
}

// A sample text in the picked voice's language, unless the text is the user's own.
function offerSample() {
  const option = $("speak-voice").selectedOptions[0];
  const text = $("speak-text");
  if (option && isSample(text.value)) text.value = sampleFor(option.dataset.language);
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
const speakCaptions = new Captions($("speak-captions"), () => player.position());
let speaking = null; // the AbortController of the request in flight

// --- the level meters: what each player plays now ------------------------------------------

const FLOOR_DB = -60;

function showMeter(id, rms) {
  const db = rms > 0 ? Math.max(FLOOR_DB, Math.min(0, 20 * Math.log10(rms))) : FLOOR_DB;
  $(id).value = db;
}

let metering = false;

// The players' meters, a frame at a time, from the first audio played (WebRTC's is measure's).
function followMeters() {
  if (metering) return;
  metering = true;
  const tick = () => {
    showMeter("speak-meter", player.level());
    if (live.transport === "websocket") showMeter("live-meter", livePlayer.level());
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}

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
    followMeters();
    player.reset();
    speakCaptions.start(input);
    const credential = await speechCredential();
    const started = performance.now();
    const response = await call("/v1/audio/speech", {
      method: "POST",
      json: {
        input,
        voice: selectedVoice(),
        response_format: "pcm",
        stream_format: "sse",
        timestamps: "word",
      },
      signal: controller.signal,
      credential,
    });
    let samples = 0;
    for await (const event of serverEvents(response)) {
      if (event.type === "speech.word") {
        speakCaptions.word(event);
      } else if (event.type === "error") {
        throw new Error(`${event.error.code}: ${event.error.message}.`);
      } else if (event.type === "speech.audio.delta") {
        const added = player.push(bytesOf(event.audio));
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
    }
    speakCaptions.end();
    say(status, `Done: ${seconds(samples / SAMPLE_RATE)} of audio.`, "ok");
  } catch (error) {
    if (error.name === "AbortError") say(status, "Stopped.");
    else say(status, describe(error), "error");
  } finally {
    if (speaking === controller) speaking = null;
  }
}

function stopSpeaking() {
  speakCaptions.stop(); // by the clock before the queue is dropped
  // a stream still coming says "Stopped." as it ends; one that came whole (a server faster
  // than real time) but still plays is stopped here
  if (speaking) speaking.abort();
  else if (player.clock.queued > 0) say($("speak-status"), "Stopped.");
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
      credential: await speechCredential(),
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

// --- type as you go: the realtime socket, or the same session over WebRTC -----------------

const live = {
  socket: null, // the session's link: a WebSocket, or a PeerLink (webrtc.js) that sends as one
  transport: "websocket", // the link's
  ready: false,
  pending: [], // messages until the config is accepted
  sent: 0, // characters of the text area already sent
  flushTimer: null,
  firstTextAt: null, // since the last start or barge-in: for the time to first audio
  openedAt: null, // when the link was made: for the time to its ready
  heard: false,
  stopping: false,
};

const TRANSPORT_NAMES = { websocket: "WebSocket", webrtc: "WebRTC" };
const firstAudio = {}; // the last time to first audio of each transport, in seconds

const livePlayer = new StreamPlayer((stats) => showSamples("live-samples", stats));

// The listener's clock over WebRTC: the track's played seconds (webrtc.js), read every
// PEER_CLOCK_MS and carried on between reads while it advances. The words' seconds count the
// audio the server sent, a barge-in's dropped audio too, so each run (from the session's start
// or a barge-in) is placed by its first word: heard when the analyser first heard audio.
// Never back: a read below what was carried on (the track played less than the estimate, or
// stalled) holds the clock there until the track catches up, or a caption would step back a word.
const PEER_CLOCK_MS = 100;
const peerClock = {
  seconds: 0,
  at: 0,
  advancing: false,
  timer: null,
  anchor: null,
  offset: null,
  shown: 0,
};

function peerSeconds() {
  let seconds = peerClock.seconds;
  if (peerClock.advancing) {
    const since = (performance.now() - peerClock.at) / 1000;
    seconds += Math.min(PEER_CLOCK_MS / 1000, since);
  }
  peerClock.shown = Math.max(peerClock.shown, seconds);
  return peerClock.shown;
}

function followPeerClock(link) {
  clearInterval(peerClock.timer);
  Object.assign(peerClock, {
    seconds: 0,
    at: 0,
    advancing: false,
    anchor: null,
    offset: null,
    shown: 0,
  });
  peerClock.timer = setInterval(async () => {
    if (link !== live.socket) return;
    const played = await link.playedSeconds();
    peerClock.advancing = played > peerClock.seconds;
    peerClock.seconds = played;
    peerClock.at = performance.now();
  }, PEER_CLOCK_MS);
}

// A new run over WebRTC: placed by its first word and first audio.
function newPeerRun() {
  peerClock.anchor = null;
  peerClock.offset = null;
}

// Seconds of the session's audio the listener has heard, by the transport's clock.
function liveClock() {
  if (live.transport !== "webrtc") return livePlayer.position();
  return peerClock.offset === null ? -1 : peerSeconds() + peerClock.offset;
}

const liveCaptions = new Captions($("live-captions"), liveClock);

function liveWord(event) {
  if (live.transport === "webrtc" && peerClock.offset === null) {
    const heardAt = peerClock.anchor === null ? peerSeconds() : peerClock.anchor;
    peerClock.offset = event.audio_start - heardAt;
  }
  liveCaptions.word(event);
}

function liveSend(message) {
  if (live.ready) live.socket.send(JSON.stringify(message));
  else live.pending.push(message);
}

// The first audio of an utterance is heard: its time since the text was first sent, shown for
// the transport beside the other's last (and as data-ttfa on the body, for tests).
function liveHeard(transport) {
  live.heard = true;
  const ms = Math.round(performance.now() - live.firstTextAt);
  $("live-ttfa").textContent = `${ms} ms`;
  firstAudio[transport] = ms / 1000;
  const parts = [`first audio ${seconds(ms / 1000)} (${TRANSPORT_NAMES[transport]})`];
  for (const [other, value] of Object.entries(firstAudio)) {
    if (other !== transport) parts.push(`${TRANSPORT_NAMES[other]} before: ${seconds(value)}`);
  }
  $("ttfa").textContent = parts.join("; ");
  document.body.dataset.ttfa = String(ms / 1000);
  document.body.dataset.ttfaTransport = transport;
}

// An event of the session, whichever its transport; the error of an "error" event, or null.
function liveEvent(link, event) {
  const status = $("live-status");
  if (event.type === "ready") {
    live.ready = true;
    for (const pending of live.pending.splice(0)) link.send(JSON.stringify(pending));
    const over = event.transport === "webrtc" ? " over WebRTC" : "";
    say(status, `Connected: ${event.voice}, ${event.response_format} at ${event.sample_rate} Hz${over}.`);
    document.body.dataset.connect = String((performance.now() - live.openedAt) / 1000);
  } else if (event.type === "segment.started") {
    $("live-segment").textContent = event.text;
  } else if (event.type === "segment.done") {
    $("live-segment").textContent = "-";
  } else if (event.type === "word") {
    liveWord(event);
  } else if (event.type === "cancelled") {
    live.stopping = false;
    if (live.transport === "webrtc") newPeerRun();
    $("live-audio").muted = false;
    $("live-segment").textContent = "-";
    say(status, "Stopped: the server cancelled what was left.", "ok");
  } else if (event.type === "done") {
    say(status, "Done: the server said everything.", "ok");
  } else if (event.type === "error") {
    const wait = event.retry_after ? ` Try again in ${event.retry_after} s.` : "";
    say(status, `${event.error.code}: ${event.error.message}.${wait}`, "error");
    return event.error;
  }
  return null;
}

// The socket opens once the page has its credential (a speech token, minted once a key is
// set); meanwhile a placeholder stands in for it, so text typed is queued and a close (another
// transport, another voice) is kept.
function openSocket() {
  const opening = {
    close() {
      if (live.socket === opening) live.socket = null;
    },
  };
  live.socket = opening;
  live.transport = "websocket";
  live.ready = false;
  speechCredential().then(
    (credential) => {
      if (live.socket === opening) connectSocket(credential);
    },
    (error) => {
      if (live.socket !== opening) return;
      live.socket = null;
      live.pending = [];
      say($("live-status"), describe(error), "error");
    },
  );
}

function connectSocket(credential) {
  const status = $("live-status");
  const socket = new WebSocket(realtimeUrl(credential));
  socket.binaryType = "arraybuffer";
  live.socket = socket;
  live.transport = "websocket";
  live.openedAt = performance.now();
  live.ready = false;
  livePlayer.reset(); // the session's audio clock starts at its first sample
  let refusal = null;
  socket.onopen = () => {
    const config = { voice: selectedVoice(), response_format: "pcm", timestamps: "word" };
    socket.send(JSON.stringify({ type: "config", ...config }));
  };
  socket.onmessage = (message) => {
    if (socket !== live.socket) return;
    if (typeof message.data !== "string") {
      if (live.stopping) {
        livePlayer.skip(message.data); // sent before the cancel came: on the clock, unheard
        return;
      }
      if (livePlayer.push(message.data) > 0 && !live.heard) liveHeard("websocket");
      return;
    }
    refusal = liveEvent(socket, JSON.parse(message.data)) || refusal;
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

// --- the WebRTC link: its track to the <audio> element and an analyser --------------------

const ENERGY_THRESHOLD = 0.003; // RMS (of full scale) that counts as audio: about -50 dBFS
const METER_MS = 10;

const meter = { context: null, analyser: null, source: null, timer: null, samples: null, max: 0 };

// The analyser's own context, at the device's rate (the track's 48 kHz, resampled if need be);
// made when the first track comes, after a key press in the live field (a gesture).
function meterContext() {
  if (meter.context === null) {
    meter.context = new AudioContext();
    meter.analyser = meter.context.createAnalyser();
    meter.analyser.fftSize = 1024;
    meter.samples = new Float32Array(meter.analyser.fftSize);
  }
  if (meter.context.state !== "running") meter.context.resume().catch(() => {});
  return meter.context;
}

function showLevel(rms) {
  const db = rms > 0 ? Math.max(-90, Math.round(20 * Math.log10(rms))) : -90;
  const text = db <= -90 ? "silence" : `${db} dBFS`;
  if ($("live-level").textContent !== text) $("live-level").textContent = text;
  showMeter("live-meter", rms);
  document.body.dataset.audioLevel = rms.toFixed(5);
}

function measure(link) {
  if (link !== live.socket) return;
  const rms = rmsOf(meter.analyser, meter.samples);
  showLevel(rms);
  if (rms > ENERGY_THRESHOLD && peerClock.anchor === null) peerClock.anchor = peerSeconds();
  if (rms > meter.max) {
    meter.max = rms;
    document.body.dataset.audioEnergy = rms.toFixed(5);
  }
  const counting = live.firstTextAt !== null && !live.heard && !live.stopping;
  if (counting && rms > ENERGY_THRESHOLD) liveHeard("webrtc");
}

function stopMeter() {
  clearInterval(meter.timer);
  meter.timer = null;
  if (meter.source) meter.source.disconnect();
  meter.source = null;
  showLevel(0);
}

function playTrack(link, stream) {
  const audio = $("live-audio");
  audio.muted = false;
  audio.srcObject = stream;
  audio.play().catch((error) => {
    say($("live-status"), `The browser would not play the audio (${error.message}).`, "error");
  });
  const context = meterContext();
  stopMeter();
  meter.source = context.createMediaStreamSource(stream);
  meter.source.connect(meter.analyser); // heard through the <audio> element, measured here
  meter.timer = setInterval(() => measure(link), METER_MS);
}

function openPeer() {
  const status = $("live-status");
  let refusal = null;
  const link = new PeerLink({
    onOpen: () => {
      link.send(JSON.stringify({ type: "config", voice: selectedVoice(), timestamps: "word" }));
    },
    onMessage: (text) => {
      if (link !== live.socket) return;
      refusal = liveEvent(link, JSON.parse(text)) || refusal;
    },
    onTrack: (stream) => playTrack(link, stream),
    onClose: (reason) => {
      if (link !== live.socket) return;
      live.socket = null;
      live.ready = false;
      live.pending = [];
      live.firstTextAt = null;
      stopMeter();
      clearInterval(peerClock.timer);
      $("live-audio").srcObject = null;
      if (refusal && refusal.code === "idle_timeout") {
        say(status, "The WebRTC session closed after a quiet spell; typing again reconnects.");
      } else if (!refusal && reason !== "page" && reason !== "server") {
        say(status, `${reason}; typing again reconnects.`, "error");
      }
    },
  });
  live.socket = link;
  live.transport = "webrtc";
  live.openedAt = performance.now();
  live.ready = false;
  followPeerClock(link);
  say(status, "Connecting over WebRTC...");
  link.connect().catch((error) => {
    if (link !== live.socket) return;
    live.socket = null;
    live.ready = false;
    live.pending = [];
    say(status, describe(error), "error");
  });
}

function openLink() {
  liveCaptions.start(""); // the words' spans count from the session's first character
  if ($("transport").value === "webrtc") openPeer();
  else openSocket();
}

function closeLink() {
  if (live.socket) live.socket.close(1000); // a PeerLink DELETEs its session
}

function liveInput() {
  const text = $("live-text").value;
  if (text.length < live.sent) live.sent = text.length; // deleted: what was sent is not unsaid
  const piece = text.slice(live.sent);
  if (!piece) return;
  live.sent = text.length;
  if (live.firstTextAt === null) {
    live.firstTextAt = performance.now();
    live.heard = false;
    $("live-ttfa").textContent = "-";
    meter.max = 0;
    delete document.body.dataset.ttfa;
    delete document.body.dataset.audioEnergy;
  }
  if (!live.socket) openLink();
  liveSend({ type: "text", text: piece });
  liveCaptions.append(piece);
  clearTimeout(live.flushTimer);
  live.flushTimer = setTimeout(() => {
    if (live.socket) liveSend({ type: "flush" });
  }, FLUSH_AFTER_MS);
}

function liveStop() {
  clearTimeout(live.flushTimer);
  liveCaptions.stop(); // by the clock before the queue is dropped
  livePlayer.clear();
  live.firstTextAt = null;
  if (live.socket && live.ready) {
    live.stopping = true;
    if (live.transport === "webrtc") $("live-audio").muted = true; // the jitter buffer's last
    live.socket.send(JSON.stringify({ type: "cancel" }));
    say($("live-status"), "Stopping...");
  }
}

// Another transport: the session ends, and the next piece typed opens one over the new one.
function switchTransport() {
  closeLink();
  live.firstTextAt = null; // the next utterance is timed over the new transport
  say($("live-status"), `Type to speak over ${TRANSPORT_NAMES[$("transport").value]}.`);
}

// Audio starts on a gesture: the first key press or click in the live field opens the player.
async function livePrepare() {
  try {
    await livePlayer.open();
    followMeters();
  } catch (error) {
    say($("live-status"), describe(error), "error");
  }
}

export function initSpeak() {
  events.addEventListener("voices", (event) => fillVoices(event.detail));
  $("speak-voice").addEventListener("change", () => {
    offerSample();
    showVoiceInfo();
    closeLink(); // the next piece opens one for the new voice
  });
  $("speak-play").addEventListener("click", speak);
  $("speak-stop").addEventListener("click", stopSpeaking);
  $("speak-download").addEventListener("click", download);
  $("live-text").addEventListener("keydown", livePrepare, { once: true });
  $("live-text").addEventListener("pointerdown", livePrepare, { once: true });
  $("live-text").addEventListener("input", liveInput);
  $("live-stop").addEventListener("click", liveStop);
  if (!webRtcAvailable()) $("transport").querySelector("option[value=webrtc]").disabled = true;
  $("transport").addEventListener("change", switchTransport);
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
    credential: await speechCredential(),
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
