// Voices: the list (GET /v1/audio/voices) with each voice's version and evaluation where the
// key may read them; publish a held voice, delete one (where the key may).

import { ApiError, call, describe, events, getJson } from "./api.js";
import { evaluationSummary } from "./speak.js";

const $ = (id) => document.getElementById(id);

function say(text, kind = "") {
  const status = $("voices-status");
  status.textContent = text;
  status.dataset.kind = kind;
}

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text;
  return td;
}

function button(label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = label;
  b.addEventListener("click", onClick);
  return b;
}

async function details(voice) {
  if (voice.status === "error") return null;
  try {
    return (await getJson(`/v1/voices/${encodeURIComponent(voice.id)}`)).voice;
  } catch (error) {
    if (error instanceof ApiError && (error.status === 403 || error.status === 404)) return null;
    throw error;
  }
}

async function remove(voice) {
  if (!confirm(`Delete the voice ${voice.id}?`)) return;
  try {
    await call(`/v1/voices/${encodeURIComponent(voice.id)}`, { method: "DELETE" });
    say(`Deleted ${voice.id}.`, "ok");
    await loadVoices();
  } catch (error) {
    say(describe(error), "error");
  }
}

async function publish(voice) {
  const reason = prompt(`Publish the held voice ${voice.id} anyway? Say why:`);
  if (!reason || !reason.trim()) return;
  try {
    await call(`/v1/voices/${encodeURIComponent(voice.id)}/publish`, {
      method: "POST",
      json: { reason },
    });
    say(`Published ${voice.id}.`, "ok");
    await loadVoices();
  } catch (error) {
    say(describe(error), "error");
  }
}

function row(voice, detail) {
  const tr = document.createElement("tr");
  tr.dataset.voice = voice.id;
  const name = document.createElement("th");
  name.scope = "row";
  name.textContent = voice.name === voice.id ? voice.id : `${voice.name} (${voice.id})`;
  tr.append(name, cell(voice.kind), cell(voice.status === "error" ? `error: ${voice.error}` : voice.status));
  const manifest = detail ? detail.manifest || {} : {};
  tr.append(cell(manifest.version !== undefined ? String(manifest.version) : "-"));
  tr.append(cell(evaluationSummary(manifest) || "-"));
  const actions = document.createElement("td");
  if (voice.status === "held") actions.append(button("Publish", () => publish(voice)));
  if (voice.kind === "adapter") actions.append(button("Delete", () => remove(voice)));
  tr.append(actions);
  return tr;
}

// Reads the list, tells the other views, and draws the table; the voices, or throws.
export async function loadVoices() {
  const { voices } = await getJson("/v1/audio/voices");
  events.dispatchEvent(new CustomEvent("voices", { detail: voices }));
  const detailed = await Promise.all(voices.map(details));
  $("voices-list").replaceChildren(...voices.map((voice, i) => row(voice, detailed[i])));
  say(`${voices.length} voices.`);
  return voices;
}

export function initVoices() {
  $("voices-refresh").addEventListener("click", async () => {
    try {
      await loadVoices();
    } catch (error) {
      say(describe(error), "error");
    }
  });
}
