// Voices: the list (GET /v1/audio/voices) with each voice's version and evaluation where the
// key may read them; publish a held voice, delete one (where the key may); a voice's versions
// (GET /v1/voices/{id}/versions), promote one (roll forward or back), delete one not live.

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
    await call(voicePath(voice.id), { method: "DELETE" });
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

const voicePath = (id) => `/v1/voices/${encodeURIComponent(id)}`;

async function versionAction(voiceId, label, request, done) {
  try {
    await request();
    say(done, "ok");
    await loadVoices();
    await showVersions(voiceId);
  } catch (error) {
    say(`${label}: ${describe(error)}`, "error");
  }
}

function versionRow(voiceId, version) {
  const tr = document.createElement("tr");
  tr.dataset.version = String(version.version);
  const n = document.createElement("th");
  n.scope = "row";
  n.textContent = `${voiceId}@${version.version}`;
  const status = version.live ? `${version.status} (live)` : version.status;
  tr.append(n, cell(status), cell(version.checksum ? version.checksum.slice(0, 12) : "-"));
  tr.append(cell(evaluationSummary(version.manifest || {}) || "-"));
  const actions = document.createElement("td");
  const path = `${voicePath(voiceId)}/versions/${version.version}`;
  if (!version.live && version.status !== "held") {
    actions.append(
      button("Promote", () =>
        versionAction(voiceId, "Promote", () => call(`${path}/promote`, { method: "POST" }),
          `${voiceId}@${version.version} is live.`)),
    );
  }
  if (!version.live) {
    actions.append(
      button("Delete", () => {
        if (!confirm(`Delete version ${version.version} of ${voiceId}?`)) return;
        versionAction(voiceId, "Delete", () => call(path, { method: "DELETE" }),
          `Deleted ${voiceId}@${version.version}.`);
      }),
    );
  }
  tr.append(actions);
  return tr;
}

// Draws the versions of one voice below the list.
export async function showVersions(voiceId) {
  try {
    const list = await getJson(`${voicePath(voiceId)}/versions`);
    $("versions-title").textContent = `Versions of ${voiceId} (live: ${list.live})`;
    $("versions-list").replaceChildren(...list.versions.map((v) => versionRow(voiceId, v)));
    $("versions-panel").hidden = false;
  } catch (error) {
    say(`Versions of ${voiceId}: ${describe(error)}`, "error");
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
  if (voice.kind === "adapter" && voice.status !== "error") {
    actions.append(button("Versions", () => showVersions(voice.id)));
  }
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
