// Clone: record prompted sentences (MediaRecorder, one take per sentence, so the transcripts
// are known) or upload files with a transcripts file; POST /v1/voices; follow the job
// (GET /v1/jobs/{id}: stage, progress, the data report, the evaluation); then hear the clone
// beside a reference clip.

import { call, describe, events, getJson } from "./api.js";
import { PROMPTS_BY_LANGUAGE, primary } from "./languages.js";
import { speakWith } from "./speak.js";

const $ = (id) => document.getElementById(id);
const POLL_MS = 1000;
const FINISHED = new Set(["done", "held", "failed", "cancelled"]);
// Harvard sentences: short, phonetically balanced, free to use.
export const PROMPTS = [
  "The birch canoe slid on the smooth planks.",
  "Glue the sheet to the dark blue background.",
  "It's easy to tell the depth of a well.",
  "These days a chicken leg is a rare dish.",
  "Rice is often served in round bowls.",
  "The juice of lemons makes fine punch.",
  "The box was thrown beside the parked truck.",
  "The hogs were fed chopped corn and garbage.",
  "Four hours of steady work faced us.",
  "A large size in stockings is hard to sell.",
  "The boy was there when the sun rose.",
  "A rod is used to catch pink salmon.",
  "The source of the huge river is the clear spring.",
  "Kick the ball straight and follow through.",
  "Help the woman get back to her feet.",
  "A pot of tea helps to pass the evening.",
  "Smoky fires lack flame and heat.",
  "The soft cushion broke the man's fall.",
  "The salt breeze came across from the sea.",
  "The girl at the booth sold fifty bonds.",
];

const takes = []; // {sentence, blob, url}
const recording = { stream: null, recorder: null, chunks: [] };
let job = null; // the job being followed
let reference = null; // {url, sentence}: what the clone is heard beside

function say(id, text, kind = "") {
  $(id).textContent = text;
  $(id).dataset.kind = kind;
}

// The language the clone speaks: one a served model speaks (GET /v1/models: behind a gateway,
// each of its workers' models), the served model's first by default.
function language() {
  return $("clone-language").value || "en";
}

export function promptsFor(tag) {
  return PROMPTS_BY_LANGUAGE[primary(tag)] || PROMPTS;
}

async function fillLanguages() {
  const select = $("clone-language");
  try {
    const { data } = await getJson("/v1/models");
    const spoken = new Set(data.flatMap((model) => model.languages || []));
    const languages = spoken.size ? [...spoken] : ["en"];
    select.replaceChildren(...languages.map((tag) => new Option(tag, tag)));
  } catch {
    select.replaceChildren(new Option("en", "en"));
  }
  showPrompt();
}

function source() {
  return $("clone-source-upload").checked ? "upload" : "record";
}

function showPrompt() {
  const index = takes.length;
  $("clone-take-label").textContent = `Take ${index + 1}`;
  const prompts = promptsFor(language());
  $("clone-prompt").textContent = prompts[index % prompts.length];
}

function drawTakes() {
  const items = takes.map((take, i) => {
    const li = document.createElement("li");
    const text = document.createElement("span");
    text.textContent = take.sentence;
    const audio = document.createElement("audio");
    audio.controls = true;
    audio.src = take.url;
    audio.setAttribute("aria-label", `Take ${i + 1}`);
    li.append(text, audio);
    return li;
  });
  $("clone-takes").replaceChildren(...items);
  $("clone-record-redo").disabled = takes.length === 0;
  showPrompt();
  updateSubmit();
}

function updateSubmit() {
  const ready =
    source() === "record"
      ? takes.length > 0 && !recording.recorder
      : $("clone-files").files.length > 0;
  $("clone-submit").disabled = !ready || (job !== null && !FINISHED.has(job.status));
}

async function startTake() {
  try {
    if (!recording.stream) {
      recording.stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    }
  } catch (error) {
    say("clone-record-status", `The microphone is not available: ${error.message}.`, "error");
    return;
  }
  const recorder = new MediaRecorder(recording.stream);
  const prompts = promptsFor(language());
  const sentence = prompts[takes.length % prompts.length];
  recording.recorder = recorder;
  recording.chunks = [];
  recorder.ondataavailable = (event) => {
    if (event.data.size > 0) recording.chunks.push(event.data);
  };
  recorder.onstop = () => {
    const blob = new Blob(recording.chunks, { type: recorder.mimeType || "audio/webm" });
    takes.push({ sentence, blob, url: URL.createObjectURL(blob) });
    recording.recorder = null;
    $("clone-record-start").disabled = false;
    $("clone-record-stop").disabled = true;
    say("clone-record-status", `${takes.length} takes recorded.`, "ok");
    drawTakes();
  };
  recorder.start();
  $("clone-record-start").disabled = true;
  $("clone-record-stop").disabled = false;
  $("clone-record-stop").focus();
  say("clone-record-status", "Recording: read the sentence aloud, then stop the take.");
  updateSubmit();
}

function stopTake() {
  if (recording.recorder) recording.recorder.stop();
}

function redoTake() {
  const take = takes.pop();
  if (take) URL.revokeObjectURL(take.url);
  drawTakes();
}

function extension(mime) {
  if (mime.includes("ogg")) return "ogg";
  if (mime.includes("mp4")) return "m4a";
  return "webm";
}

async function firstTranscript(file) {
  // the transcript of the first uploaded file, for hearing the clone say the same
  const stem = file.name.replace(/\.[^.]*$/, "");
  const transcripts = $("clone-transcripts").files[0];
  if (!transcripts) return PROMPTS[0];
  for (const line of (await transcripts.text()).split(/\r?\n/)) {
    const [name, ...text] = line.split("|");
    if (name.trim().replace(/\.[^.]*$/, "") === stem && text.length) return text.join("|").trim();
  }
  return PROMPTS[0];
}

// The consent part (POST /v1/voices' ``consent``), when the form names a speaker; the
// server says in words what is missing or wrong (400 invalid_consent / consent_required).
function consentRecord() {
  const speaker = $("consent-speaker").value.trim();
  if (!speaker) return null;
  return {
    speaker_name: speaker,
    statement: $("consent-statement").value.trim(),
    collected_by: $("consent-collected-by").value.trim(),
    collected_at: new Date().toISOString(),
    purpose: $("consent-purpose").value.trim(),
  };
}

async function submit() {
  const form = new FormData();
  const name = $("clone-name").value.trim();
  if (name) form.append("name", name);
  form.append("language", language());
  if (source() === "record") {
    const lines = [];
    takes.forEach((take, i) => {
      const file = `take-${i + 1}`;
      form.append("audio", take.blob, `${file}.${extension(take.blob.type)}`);
      lines.push(`${file}|${take.sentence}`);
    });
    const csv = new Blob([`${lines.join("\n")}\n`], { type: "text/csv" });
    form.append("transcripts", csv, "metadata.csv");
    reference = { url: takes[0].url, sentence: takes[0].sentence };
  } else {
    const files = [...$("clone-files").files];
    for (const file of files) form.append("audio", file, file.name);
    const transcripts = $("clone-transcripts").files[0];
    if (transcripts) form.append("transcripts", transcripts, "metadata.csv");
    reference = { url: URL.createObjectURL(files[0]), sentence: await firstTranscript(files[0]) };
  }
  const consent = consentRecord();
  if (consent) form.append("consent", JSON.stringify(consent));
  const recording = $("consent-recording").files[0];
  if (recording) form.append("consent_recording", recording, recording.name);
  say("clone-status", "Uploading...");
  $("clone-submit").disabled = true;
  try {
    const response = await call("/v1/voices", { method: "POST", body: form });
    job = (await response.json()).job;
    say("clone-status", `Job ${job.id} created for the voice ${job.voice_id}.`, "ok");
    follow();
  } catch (error) {
    say("clone-status", describe(error), "error");
    updateSubmit();
  }
}

function figures(list, entries) {
  list.replaceChildren(
    ...entries.map(([term, value]) => {
      const div = document.createElement("div");
      const dt = document.createElement("dt");
      const dd = document.createElement("dd");
      dt.textContent = term;
      dd.textContent = value;
      div.append(dt, dd);
      return div;
    }),
  );
}

function items(list, texts) {
  list.replaceChildren(
    ...texts.map((text) => {
      const li = document.createElement("li");
      li.textContent = text;
      return li;
    }),
  );
}

const mean = (values) => values.reduce((a, b) => a + b, 0) / Math.max(values.length, 1);

function showReport(data) {
  $("clone-report").hidden = false;
  const clips = data.clips || [];
  const snrs = clips.map((c) => c.snr_db).filter((v) => typeof v === "number");
  figures($("clone-report-figures"), [
    ["Clips", String(clips.length)],
    ["Speech", `${(data.speech_minutes * 60).toFixed(1)} s`],
    ["Mean SNR", snrs.length ? `${mean(snrs).toFixed(1)} dB` : "-"],
    ["Left out (another speaker)", String((data.excluded || []).length)],
    ["Files that did not decode", String((data.rejected || []).length)],
  ]);
  const notes = [...(data.warnings || [])];
  for (const clip of data.excluded || []) notes.push(`${clip.file}: ${clip.reason}`);
  for (const file of data.rejected || []) notes.push(`${file.file}: ${file.reason}`);
  items($("clone-report-warnings"), notes);
}

function showEvaluation(evaluation, heldReason) {
  $("clone-eval").hidden = false;
  const entries = [["Speaker similarity", evaluation.similarity.mean.toFixed(3)]];
  if (evaluation.baseline) {
    entries.push([`Closest built-in (${evaluation.baseline_voice})`, evaluation.baseline.mean.toFixed(3)]);
  }
  if (typeof evaluation.gain === "number") entries.push(["Gain", evaluation.gain.toFixed(3)]);
  if (evaluation.ceiling) entries.push(["References among themselves", evaluation.ceiling.mean.toFixed(3)]);
  if (evaluation.leading_silence_ms) {
    entries.push(["Start of speech (p50)", `${Math.round(evaluation.leading_silence_ms.p50)} ms`]);
  }
  if (evaluation.real_time_factor) {
    entries.push(["Real-time factor", evaluation.real_time_factor.mean.toFixed(2)]);
  }
  entries.push(["Gate", evaluation.report_only ? "reports only" : "holds a voice below it"]);
  figures($("clone-eval-figures"), entries);
  const notes = [...(evaluation.findings || [])];
  if (heldReason) notes.unshift(`Held: ${heldReason}`);
  items($("clone-eval-findings"), notes);
}

function showJob(current) {
  $("clone-job").hidden = false;
  $("clone-job-id").textContent = current.id;
  $("clone-job-status").textContent = current.status;
  $("clone-job-stage").textContent = current.stage && current.stage !== current.status ? `(${current.stage})` : "";
  $("clone-job-progress").value = current.progress;
  $("clone-job-progress").textContent = `${Math.round(current.progress * 100)} %`;
  if (current.data) showReport(current.data);
  if (current.eval) showEvaluation(current.eval, current.held_reason);
  $("clone-cancel").hidden = FINISHED.has(current.status);
  if (current.status === "failed") say("clone-status", `The job failed: ${current.error}`, "error");
  if (current.status === "cancelled") say("clone-status", "The job was cancelled.");
  if (current.status === "done" || current.status === "held") {
    const held = current.status === "held" ? " It is held: publish it in the Voices view to share it." : "";
    say("clone-status", `The voice ${current.voice_id} is ready.${held}`, "ok");
    $("clone-listen").hidden = false;
    if (reference) $("clone-reference").src = reference.url;
    events.dispatchEvent(new Event("voice-created"));
  }
}

async function follow() {
  let failures = 0;
  while (job && !FINISHED.has(job.status)) {
    showJob(job);
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    try {
      job = (await getJson(`/v1/jobs/${job.id}`)).job;
      failures = 0;
    } catch (error) {
      failures += 1;
      say("clone-status", `${describe(error)} (still trying)`, "error");
      if (failures >= 30) return;
    }
  }
  showJob(job);
  updateSubmit();
}

async function cancelJob() {
  try {
    const response = await call(`/v1/jobs/${job.id}`, { method: "DELETE" });
    job = (await response.json()).job;
    showJob(job);
  } catch (error) {
    say("clone-status", describe(error), "error");
  }
}

async function hear() {
  try {
    await speakWith(job.voice_id, reference ? reference.sentence : PROMPTS[0], $("clone-hear-status"));
  } catch (error) {
    say("clone-hear-status", describe(error), "error");
  }
}

export function initClone() {
  for (const radio of document.querySelectorAll("input[name=clone-source]")) {
    radio.addEventListener("change", () => {
      $("clone-record").hidden = source() !== "record";
      $("clone-upload").hidden = source() !== "upload";
      updateSubmit();
    });
  }
  $("clone-record-start").addEventListener("click", startTake);
  $("clone-record-stop").addEventListener("click", stopTake);
  $("clone-record-redo").addEventListener("click", redoTake);
  $("clone-files").addEventListener("change", updateSubmit);
  $("clone-submit").addEventListener("click", submit);
  $("clone-cancel").addEventListener("click", cancelJob);
  $("clone-hear").addEventListener("click", hear);
  $("clone-language").addEventListener("change", showPrompt);
  events.addEventListener("voices", fillLanguages, { once: true }); // once a key may be known
  showPrompt();
}
