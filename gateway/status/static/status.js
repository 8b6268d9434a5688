// The status page's one script: reads the gateway's server-sent events and renders them.
// fetch() rather than EventSource, which cannot send the admin token as a header.
"use strict";

const TOKEN_KEY = "unitgate-admin-token";
const RETRY_MS = 1000;

function token() { return sessionStorage.getItem(TOKEN_KEY); }

// The link `unitgate up` prints signs the page in: /status#token=... A fragment never leaves
// the browser (no request, no log has it); it is kept like a pasted token, then taken out of
// the address bar (and so out of the history and of anything copied from it).
function tokenFromFragment() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (!params.has("token")) return;
  const given = params.get("token");
  if (given) sessionStorage.setItem(TOKEN_KEY, given);
  params.delete("token");
  const rest = params.toString();
  window.history.replaceState(window.history.state, "", location.pathname + location.search + (rest ? "#" + rest : ""));
}
function headers() {
  const t = token();
  return t ? { Authorization: "Bearer " + t } : {};
}
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const child of children) node.append(child);
  return node;
}
function state(text, value = text) {
  return el("span", { class: "state", "data-state": value }, text);
}

function setLive(value, text) {
  const live = document.getElementById("live");
  live.dataset.state = value;
  live.title = text;
  if (text) document.getElementById("summary").textContent = text;
}

function askForToken(message) {
  const form = document.getElementById("login");
  form.hidden = false;
  document.getElementById("login-error").textContent = message;
}

async function follow() {
  for (;;) {
    let response;
    try {
      response = await fetch("/status/stream", { headers: headers(), cache: "no-store" });
    } catch (err) {
      setLive("lost", "gateway unreachable, retrying");
      await new Promise((r) => setTimeout(r, RETRY_MS));
      continue;
    }
    if (response.status === 401 || response.status === 403) {
      sessionStorage.removeItem(TOKEN_KEY);
      setLive("lost", "an admin token is needed to read the fleet's state");
      askForToken(response.status === 403 ? "that token was refused" : "");
      return; // the form starts following again
    }
    if (!response.ok) {
      setLive("lost", "HTTP " + response.status + ", retrying");
      await new Promise((r) => setTimeout(r, RETRY_MS));
      continue;
    }
    document.getElementById("login").hidden = true;
    await readEvents(response.body.getReader());
    setLive("lost", "stream ended, reconnecting");
    await new Promise((r) => setTimeout(r, RETRY_MS));
  }
}

async function readEvents(reader) {
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (err) {
      return;
    }
    if (chunk.done) return;
    buffer += decoder.decode(chunk.value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      handle(buffer.slice(0, end));
      buffer = buffer.slice(end + 2);
    }
  }
}

function handle(block) {
  let event = "message";
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) event = line.slice(7);
    else if (line.startsWith("data: ")) data += line.slice(6);
  }
  if (event === "snapshot") {
    render(JSON.parse(data));
  } else if (event === "failed") {
    setLive("lost", JSON.parse(data).error);
  }
}

function render(snap) {
  const units = snap.units;
  const routable = units.filter((u) => u.routable).length;
  setLive("live", `${routable} of ${units.length} units routable · updated ${new Date(snap.time * 1000).toLocaleTimeString()}`);
  const panic = document.getElementById("panic");
  const panics = Object.entries(snap.panic);
  panic.hidden = panics.length === 0;
  panic.textContent = panics.map(([m, why]) => `panic routing for ${m}: ${why}`).join("; ");
  const body = document.querySelector("#units tbody");
  body.replaceChildren(...units.map(row));
  drawCharts(snap);
  drawClasses(snap);
  drawRollout(snap);
  const events = document.getElementById("events");
  events.replaceChildren(...snap.events.slice().reverse().map((e) => el("li", {},
    `${new Date(e.time * 1000).toLocaleTimeString()} ${e.unit}: ${e.what} (${e.reason}) by ${e.who}` +
    (e.replica ? ` @${e.replica}` : ""))));
}

function row(unit) {
  const nodes = el("div", { class: "nodes" }, ...unit.nodes.map((n) => el("span", {
    class: "node", "data-rank": String(n.rank), "data-healthy": String(n.healthy),
    title: n.error || n.url,
  }, `${n.role} ${n.rank}: ${n.latency_ms == null ? "–" : n.latency_ms.toFixed(1) + " ms"}`)));
  const admin = unit.admin.state;
  const actions = el("td", { class: "actions" },
    button("disable", unit.id, admin === "disabled"),
    button("drain", unit.id, admin === "draining" || admin === "drained"),
    button("enable", unit.id, admin === "enabled"));
  const inFlight = unit.fleet && unit.fleet.in_flight !== undefined
    ? `${unit.in_flight} here, ${unit.fleet.in_flight} fleet` : String(unit.in_flight);
  return el("tr", { "data-unit": unit.id },
    el("td", { class: "id" }, unit.id, el("div", { class: "why" },
       `cell ${unit.cell}${unit.revision ? " · " + unit.revision : ""}`)),
    el("td", { class: "health" }, state(unit.health.state)),
    el("td", { class: "breaker" }, state(unit.breaker.state)),
    el("td", { class: "admin" }, state(admin)),
    el("td", { class: "routable" }, state(unit.routable ? "yes" : "no"), " ",
       el("span", { class: "why" }, unit.why), latency(unit.latency)),
    el("td", { class: "in-flight" }, inFlight),
    el("td", {}, nodes),
    actions);
}

// What the gateway learned of the unit's speed (absent until it has seen enough answers).
function latency(learned) {
  if (!learned) return "";
  const ms = (s) => `${(s * 1000).toFixed(s < 0.01 ? 1 : 0)} ms`;
  return el("div", { class: "latency", title: "learned from its answers" },
    `first token (1k tokens, idle) ${ms(learned.ttft_1k_idle_s)} · ${ms(learned.tpot_s)}/token`);
}

function button(verb, unitId, disabled) {
  const b = el("button", { type: "button", "data-action": verb }, verb);
  b.disabled = disabled;
  b.addEventListener("click", () => act(verb, unitId));
  return b;
}

async function act(verb, unitId) {
  let reason = "";
  if (verb === "disable") {
    reason = window.prompt(`Why disable ${unitId}?`, "from the status page");
    if (reason === null) return;
  }
  const result = document.getElementById("action-result");
  const response = await fetch(`/admin/units/${encodeURIComponent(unitId)}/${verb}`, {
    method: "POST",
    headers: { ...headers(), "Content-Type": "application/json" },
    body: JSON.stringify({ reason: reason || `${verb} from the status page` }),
  });
  const body = await response.json().catch(() => ({}));
  result.textContent = response.ok
    ? `${unitId}: ${body.admin ? body.admin.state : verb}`
    : `${unitId}: ${verb} refused: ${body.error ? body.error.message : "HTTP " + response.status}`;
  result.dataset.ok = String(response.ok);
}

document.getElementById("login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
  follow();
});
tokenFromFragment();
follow();
