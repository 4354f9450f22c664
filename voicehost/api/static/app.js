// The playground's entry: the views as keyboard-navigable tabs, the key, the first load.

import { ApiError, apiKey, describe, events, setApiKey } from "./api.js";
import { initClone } from "./clone.js";
import { initSpeak } from "./speak.js";
import { initVoices, loadVoices } from "./voices.js";

const $ = (id) => document.getElementById(id);

function tabs() {
  return [...document.querySelectorAll("[role=tab]")].filter((tab) => !tab.hidden);
}

export function show(name) {
  for (const tab of document.querySelectorAll("[role=tab]")) {
    const selected = tab.id === `tab-${name}`;
    tab.setAttribute("aria-selected", String(selected));
    tab.tabIndex = selected ? 0 : -1;
    $(tab.getAttribute("aria-controls")).hidden = !selected;
  }
}

function initTabs() {
  for (const tab of document.querySelectorAll("[role=tab]")) {
    tab.addEventListener("click", () => show(tab.id.slice(4)));
    tab.addEventListener("keydown", (event) => {
      const all = tabs();
      const at = all.indexOf(tab);
      const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
      let next = null;
      if (step) next = all[(at + step + all.length) % all.length];
      if (event.key === "Home") next = all[0];
      if (event.key === "End") next = all[all.length - 1];
      if (next) {
        event.preventDefault();
        show(next.id.slice(4));
        next.focus();
      }
    });
  }
}

function banner(text) {
  $("banner").textContent = text;
  $("banner").hidden = !text;
}

// The first call says whether the server wants a key: 401 shows the Key view.
async function refresh() {
  try {
    await loadVoices();
    banner("");
    return true;
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      $("tab-key").hidden = false;
      show("key");
      const why = apiKey() ? describe(error) : "This server needs an API key: enter it here.";
      $("key-status").textContent = why;
      $("key-status").dataset.kind = "error";
      banner(apiKey() ? `The key was refused: ${describe(error)}` : "");
    } else {
      banner(describe(error));
    }
    return false;
  }
}

function initKey() {
  $("key-input").value = apiKey();
  $("key-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    setApiKey($("key-input").value.trim());
    $("key-status").textContent = "Checking the key...";
    $("key-status").dataset.kind = "";
    if (await refresh()) {
      $("key-status").textContent = "The key works.";
      $("key-status").dataset.kind = "ok";
    }
  });
  $("key-forget").addEventListener("click", () => {
    setApiKey("");
    $("key-input").value = "";
    $("key-status").textContent = "Forgotten.";
  });
}

async function start() {
  initTabs();
  initKey();
  initSpeak();
  initClone();
  initVoices();
  events.addEventListener("voice-created", () => refresh());
  if (apiKey()) $("tab-key").hidden = false;
  await refresh();
  document.body.dataset.ready = "true";
}

start();
