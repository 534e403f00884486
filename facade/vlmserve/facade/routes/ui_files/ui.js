// The /ui page: plain JavaScript against the facade's own API (GET /readyz, GET /v1/models,
// POST /v1/responses with "stream": true), with the same API key any client sends.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { key: sessionStorage.getItem("vlmserve-key") || "", attachment: null, controller: null };

function headers(extra) {
  const found = Object.assign({}, extra || {});
  if (state.key) found["Authorization"] = "Bearer " + state.key;
  return found;
}

async function api(path, options) {
  const response = await fetch(path, Object.assign({}, options, { headers: headers(options && options.headers) }));
  if (response.status === 401) {
    $("key-row").hidden = false;
    throw new Error("This server needs an API key: enter it above.");
  }
  return response;
}

async function errorText(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || JSON.stringify(body);
  } catch (_) {
    return response.status + " " + response.statusText;
  }
}

async function refreshHealth() {
  const pill = $("health");
  try {
    const response = await api("/readyz");
    const body = await response.json();
    pill.textContent = response.ok ? "ready" : "not ready";
    pill.className = "pill " + (response.ok ? "ok" : "bad");
    pill.title = JSON.stringify(body);
  } catch (error) {
    pill.textContent = "unreachable";
    pill.className = "pill bad";
    pill.title = String(error);
  }
}

async function refreshModels() {
  const select = $("model");
  const list = $("models");
  try {
    const response = await api("/v1/models");
    if (!response.ok) throw new Error(await errorText(response));
    const body = await response.json();
    const chosen = select.value;
    select.replaceChildren();
    list.replaceChildren();
    for (const model of body.data) {
      const option = document.createElement("option");
      option.value = option.textContent = model.id;
      select.appendChild(option);
      const item = document.createElement("li");
      const info = model.vlmserve || {};
      const details = [info.architecture || "", info.context_length ? "context " + info.context_length : "", info.status || ""];
      item.textContent = model.id + (details.filter(Boolean).length ? " — " + details.filter(Boolean).join(", ") : "");
      list.appendChild(item);
    }
    if (chosen) select.value = chosen;
  } catch (error) {
    $("error").textContent = String(error.message || error);
  }
}

function readFile(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function attach() {
  const file = $("file").files[0];
  const preview = $("preview");
  state.attachment = null;
  preview.hidden = true;
  $("attached").textContent = "";
  if (!file) return;
  const url = await readFile(file);
  state.attachment = { name: file.name, type: file.type, url: url };
  const size = file.size < 1024 ? file.size + " bytes" : (file.size / 1024).toFixed(1) + " KiB";
  $("attached").textContent = file.name + " (" + size + ")";
  if (file.type.startsWith("image/")) {
    preview.src = url;
    preview.hidden = false;
  }
}

function content() {
  const parts = [{ type: "input_text", text: $("prompt").value }];
  const file = state.attachment;
  if (file && file.type === "application/pdf") {
    parts.push({ type: "input_file", filename: file.name, file_data: file.url });
  } else if (file) {
    parts.push({ type: "input_image", image_url: file.url });
  }
  return parts;
}

// Server-sent events from a fetch body: "event:" / "data:" lines, a blank line ends one event.
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (data && data !== "[DONE]") yield JSON.parse(data);
    }
  }
}

function showStats(started, firstToken, response) {
  const seconds = (performance.now() - started) / 1000;
  const usage = (response && response.usage) || {};
  const decode = firstToken ? (performance.now() - firstToken) / 1000 : 0;
  const rate = usage.output_tokens && decode > 0 ? (usage.output_tokens / decode).toFixed(1) + " tokens/s" : "";
  const parts = [
    "input " + (usage.input_tokens ?? "?") + " tokens",
    "output " + (usage.output_tokens ?? "?") + " tokens",
    firstToken ? "first token " + ((firstToken - started) / 1000).toFixed(2) + " s" : "",
    "total " + seconds.toFixed(2) + " s",
    rate,
    response && response.status && response.status !== "completed" ? "status " + response.status : "",
  ];
  $("stats").textContent = parts.filter(Boolean).join(" · ");
}

async function send(event) {
  event.preventDefault();
  state.key = $("key").value || state.key;
  if (state.key) sessionStorage.setItem("vlmserve-key", state.key);
  $("answer").textContent = "";
  $("stats").textContent = "";
  $("error").textContent = "";
  $("send").disabled = true;
  $("stop").disabled = false;
  state.controller = new AbortController();
  const started = performance.now();
  let firstToken = 0;
  let final = null;
  try {
    const response = await api("/v1/responses", {
      method: "POST",
      headers: { "content-type": "application/json" },
      signal: state.controller.signal,
      body: JSON.stringify({
        model: $("model").value || "default",
        input: [{ role: "user", content: content() }],
        max_output_tokens: Number($("max-tokens").value) || 256,
        stream: true,
        store: false,
      }),
    });
    if (!response.ok) throw new Error(await errorText(response));
    for await (const item of events(response)) {
      if (item.type === "response.output_text.delta") {
        if (!firstToken) firstToken = performance.now();
        $("answer").textContent += item.delta;
        showStats(started, firstToken, null);
      } else if (item.type === "response.completed" || item.type === "response.incomplete" || item.type === "response.failed") {
        final = item.response;
        if (final && final.error) $("error").textContent = final.error.message;
      } else if (item.type === "error") {
        $("error").textContent = item.message || (item.error && item.error.message) || "error";
      }
    }
    showStats(started, firstToken, final);
    document.body.dataset.answered = "1";
  } catch (error) {
    if (error.name !== "AbortError") $("error").textContent = String(error.message || error);
  } finally {
    $("send").disabled = false;
    $("stop").disabled = true;
    state.controller = null;
  }
}

window.addEventListener("DOMContentLoaded", () => {
  $("key").value = state.key;
  $("form").addEventListener("submit", send);
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("file").addEventListener("change", () => attach().catch((e) => ($("error").textContent = String(e))));
  $("key").addEventListener("change", () => {
    state.key = $("key").value;
    sessionStorage.setItem("vlmserve-key", state.key);
    refreshHealth();
    refreshModels();
  });
  refreshHealth();
  refreshModels();
  setInterval(refreshHealth, 10000);
});
