// recallserve console: plain JavaScript, no build step. Every value from the server is put into
// the page with textContent (never as HTML), and every request carries the signed-in API key.
"use strict";

const KEY_STORE = "recallserve.console.key";
const KINDS = ["text", "image", "table", "tool_result", "experience", "message"];
const BREAKDOWN_COLOURS = {
  system: "#7a8ca0", constraints: "#a8321f", entities: "#b8860b", summary: "#6a4fa8",
  recent: "#1f5fa8", retrieved: "#1f7a3a", pending: "#2b2b2b",
};
const state = { key: null, tenant: null, timer: null, lastHealth: null };

// ---- small DOM helpers ---------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const $ = (sel) => document.querySelector(sel);
function when(epoch) { return epoch ? new Date(epoch * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "—"; }
function num(v, digits = 3) { return v === null || v === undefined ? "—" : Number(v).toFixed(digits); }
function pct(v) { return v === null || v === undefined ? "—" : (100 * v).toFixed(1) + " %"; }
function cut(text, n = 160) { text = String(text ?? ""); return text.length > n ? text.slice(0, n - 1) + "…" : text; }
function json(v) { return JSON.stringify(v, null, 2); }
function kv(pairs) {
  return el("dl", { class: "kv" }, pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}
function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))), el("tbody", {}, rows));
}
function tag(text) { return el("span", { class: "tag " + text }, text); }

// ---- errors in plain words -----------------------------------------------------------------
class ConsoleError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}
function showError(message) { const box = $("#error"); box.textContent = message; box.hidden = false; }
function clearError() { const box = $("#error"); box.textContent = ""; box.hidden = true; }

function plainWords(status, body, path) {
  const err = (body && body.error) || {};
  const detail = err.message ? ` (${err.message})` : "";
  const rid = body && body.requestId ? `, request id ${body.requestId}` : "";
  if (status === 401) return "The API key was not accepted" + detail + ". Check the key and sign in again.";
  if (status === 403) return "This key is not allowed to do that" + detail + ".";
  if (status === 404) return "Not found" + detail + ".";
  if (status === 400 || status === 422) return "The server did not accept the request" + detail + ".";
  if (status === 413) return "The request is too large" + detail + ".";
  if (status === 429) return "Too many requests right now; wait a moment and retry" + detail + ".";
  if (status === 503) return "A part of the cluster is unavailable right now (503)" + detail +
    ". It may be restarting or overloaded (a dead memory shard or the state store); retry in a few seconds.";
  if (status === 504) return "The server took too long to answer (504)" + detail + "; retry.";
  if (status >= 500) return `The server failed while answering ${path} (${status}${rid})` + detail + ".";
  return `Unexpected answer ${status} from ${path}` + detail + ".";
}

async function api(method, path, body) {
  let response;
  try {
    response = await fetch(path, {
      method, headers: { "authorization": "Bearer " + state.key, ...(body ? { "content-type": "application/json" } : {}) },
      body: body ? JSON.stringify(body) : undefined,
    });
  } catch (exc) {
    throw new ConsoleError(`Cannot reach the server at ${location.origin} (${exc.message}). Is it running?`, 0);
  }
  let data = null;
  try { data = await response.json(); } catch (exc) { data = null; }
  if (!response.ok) {
    if (data && typeof data === "object") data.requestId = response.headers.get("x-request-id");
    throw new ConsoleError(plainWords(response.status, data, path), response.status);
  }
  if (data === null) throw new ConsoleError(`The server answered ${path} with something that is not JSON.`, response.status);
  return data;
}

// Runs a page action; any failure becomes the red banner (never a blank page).
async function guarded(action) {
  try {
    clearError();
    await action();
  } catch (exc) {
    showError(exc instanceof ConsoleError ? exc.message : `The console hit a problem: ${exc.message || exc}`);
    if (exc instanceof ConsoleError && exc.status === 401) signOut(false);
  }
}
window.addEventListener("error", (ev) => showError(`The console hit a problem: ${ev.message}`));
window.addEventListener("unhandledrejection", (ev) => showError(`The console hit a problem: ${ev.reason}`));

// ---- sign in / out -------------------------------------------------------------------------
async function signIn(key) {
  state.key = key;
  const me = await api("GET", "/v1/console/me");
  state.tenant = me.tenant;
  sessionStorage.setItem(KEY_STORE, key);
  const kept = Object.entries(me.retention || {}).filter(([, d]) => d != null)
    .map(([k, d]) => `${k.replace("_days", "")} ${d} d`);
  $("#tenant").textContent = "tenant " + me.tenant;
  $("#retention").textContent = "retention: " + (kept.length ? kept.join(", ") : "no limits");
  $("#signin-panel").hidden = true;
  $("#nav").hidden = false;
  $("#who").hidden = false;
  $("#page").hidden = false;
  route();
}
function signOut(clear = true) {
  state.key = null;
  state.tenant = null;
  sessionStorage.removeItem(KEY_STORE);
  stopTimer();
  $("#page").replaceChildren();
  $("#page").hidden = true;
  $("#nav").hidden = true;
  $("#who").hidden = true;
  $("#signin-panel").hidden = false;
  if (clear) clearError();
}
function stopTimer() { if (state.timer) { clearInterval(state.timer); clearTimeout(state.timer); state.timer = null; } }

// ---- pages ---------------------------------------------------------------------------------
const PAGES = { memories: memoriesPage, sessions: sessionsPage, turns: turnsPage, review: reviewPage, health: healthPage,
  erasures: erasuresPage };

function route() {
  if (!state.key) return;
  const name = (location.hash || "#memories").slice(1).split("/")[0];
  const page = PAGES[name] ? name : "memories";
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === page);
  stopTimer();
  clearError();
  const root = $("#page");
  root.replaceChildren();
  root.dataset.page = page;
  guarded(() => PAGES[page](root));
}

// Memories: hybrid search with every part of the score, filters, a record's parts, delete.
async function memoriesPage(root) {
  const kinds = KINDS.map((k) => el("label", { class: "inline" }, el("input", { type: "checkbox", name: "kind", value: k }), k));
  const results = el("div", { id: "memory-results" });
  const detail = el("div", { id: "memory-detail" });
  const form = el("form", { class: "bar", id: "memory-search" },
    el("label", {}, "Query", el("input", { name: "query", size: 40, required: true, placeholder: "what to recall" })),
    el("label", {}, "k", el("input", { name: "k", type: "number", min: 1, max: 100, value: 10, size: 4 })),
    el("label", {}, "Topic prefix", el("input", { name: "topic", size: 14 })),
    el("label", {}, "Created after", el("input", { name: "after", type: "date" })),
    el("label", {}, "Created before", el("input", { name: "before", type: "date" })),
    el("label", {}, "Kinds", el("span", { class: "checks" }, kinds)),
    el("label", {}, "Hybrid (BM25)", el("input", { name: "hybrid", type: "checkbox", checked: true })),
    el("button", { type: "submit" }, "Search"));
  form.addEventListener("submit", (ev) => { ev.preventDefault(); guarded(() => searchMemories(form, results, detail)); });
  const lookup = el("form", { class: "bar", id: "memory-open" },
    el("label", {}, "Memory id", el("input", { name: "id", size: 34, required: true })),
    el("button", { type: "submit", class: "plain" }, "Open"));
  lookup.addEventListener("submit", (ev) => { ev.preventDefault(); guarded(() => openMemory(lookup.elements.id.value.trim(), detail)); });
  root.append(el("h2", {}, "Memories"), form, lookup, results, detail);
}

async function searchMemories(form, results, detail) {
  const f = form.elements;
  const filters = {};
  const kinds = [...form.querySelectorAll("input[name=kind]:checked")].map((i) => i.value);
  if (kinds.length) filters.kinds = kinds;
  if (f.topic.value.trim()) filters.topic_prefix = f.topic.value.trim();
  if (f.after.value) filters.created_after = f.after.value + "T00:00:00Z";
  if (f.before.value) filters.created_before = f.before.value + "T00:00:00Z";
  const body = { query: f.query.value, k: Number(f.k.value) || 10, threshold: -1, hybrid: f.hybrid.checked };
  if (Object.keys(filters).length) body.filters = filters;
  const started = performance.now();
  const found = await api("POST", "/v1/memories/search", body);
  const ms = performance.now() - started;
  const rows = found.data.map((m) => el("tr", { class: "row", "data-id": m.id, onclick: () => guarded(() => openMemory(m.id, detail)) },
    el("td", { class: "num" }, num(m.score, 4)), el("td", { class: "num" }, num(m.similarity)),
    el("td", { class: "num" }, num(m.time_factor)), el("td", { class: "num" }, m.dense_rank ?? "—"),
    el("td", { class: "num" }, m.lexical_rank ?? "—"), el("td", {}, m.kind), el("td", {}, m.source_id),
    el("td", {}, m.topic || "—"), el("td", {}, when(m.created_at)), el("td", {}, m.shared ? "shared" : ""),
    el("td", {}, cut(m.text))));
  results.replaceChildren(
    el("p", { class: "note" }, `${found.data.length} result(s) in ${ms.toFixed(0)} ms. Score = reciprocal rank fusion of the dense and BM25 ranks; dense = similarity × time factor.`),
    found.data.length ? table(["score", "similarity", "time factor", "dense rank", "BM25 rank", "kind", "source id", "topic", "created", "", "text"], rows)
      : el("p", {}, "No memory matches."));
}

async function openMemory(id, detail) {
  if (!id) return;
  const m = await api("GET", "/v1/memories/" + encodeURIComponent(id));
  const del = el("button", { type: "button", class: "danger", id: "memory-delete" }, "Delete");
  del.addEventListener("click", () => guarded(async () => {
    if (del.dataset.armed !== "1") { del.dataset.armed = "1"; del.textContent = "Click again to delete"; return; }
    await api("DELETE", "/v1/memories/" + encodeURIComponent(m.id));
    detail.replaceChildren(el("p", { class: "ok" }, `Memory ${m.id} deleted.`));
    const row = document.querySelector(`#memory-results tr[data-id="${CSS.escape(m.id)}"]`);
    if (row) row.remove();
  }));
  detail.replaceChildren(el("div", { class: "detail" },
    el("h3", {}, "Memory " + m.id),
    kv([["kind", m.kind], ["source id", m.source_id], ["topic", m.topic || "—"], ["shared", m.shared ? "yes" : "no"],
      ["created", when(m.created_at)], ["last recalled", when(m.last_access_at)], ["expires", when(m.expires_at)]]),
    el("h3", {}, "Text"), el("pre", { id: "memory-text" }, m.text),
    m.image_description ? [el("h3", {}, "Image description"), el("pre", {}, m.image_description)] : null,
    m.ocr_text ? [el("h3", {}, "OCR text"), el("pre", {}, m.ocr_text)] : null,
    m.parts.length ? [el("h3", {}, "Parts"), table(["#", "part"], m.parts.map((p, i) => el("tr", {}, el("td", {}, i + 1), el("td", {}, el("pre", {}, json(p))))))] : null,
    Object.keys(m.metadata).length ? [el("h3", {}, "Metadata"), el("pre", {}, json(m.metadata))] : null,
    m.shared ? el("p", { class: "note" }, "Shared memories can only be deleted by their owner.") : del));
}

// Sessions: mode, token breakdown, rolling summary, entity table, the last context.
async function sessionsPage(root) {
  const detail = el("div", { id: "session-detail" });
  const lookup = el("form", { class: "bar", id: "session-open" },
    el("label", {}, "Session id", el("input", { name: "sid", required: true })),
    el("label", {}, "User", el("input", { name: "user", value: "default" })),
    el("button", { type: "submit", class: "plain" }, "Open"));
  lookup.addEventListener("submit", (ev) => {
    ev.preventDefault();
    guarded(() => openSession({ session_id: lookup.elements.sid.value.trim(), user: lookup.elements.user.value.trim() || "default" }, detail));
  });
  const list = await api("GET", "/v1/turns/sessions?limit=100");
  const rows = list.data.map((s) => el("tr", { class: "row", "data-id": s.session_id, onclick: () => guarded(() => openSession(s, detail)) },
    el("td", {}, s.session_id), el("td", {}, s.user), el("td", {}, s.mode || "—"), el("td", { class: "num" }, s.turns),
    el("td", { class: "num" }, s.breakdown.total ?? "—"), el("td", {}, when(s.last_at))));
  root.append(el("h2", {}, "Sessions"),
    el("p", { class: "note" }, "Sessions with turns in the trace store, most recently active first (open any other by id)."),
    lookup,
    rows.length ? table(["session", "user", "mode (last turn)", "turns", "prompt tokens (last turn)", "last turn"], rows)
      : el("p", {}, "No traced session yet: chat with metadata.session_id to create one."),
    detail);
}

function breakdownView(b) {
  const parts = Object.keys(BREAKDOWN_COLOURS).filter((k) => b[k]);
  const total = b.total || parts.reduce((s, k) => s + b[k], 0) || 1;
  return [
    el("div", { class: "bar-chart" }, parts.map((k) => el("span", { title: `${k}: ${b[k]}`, style: null, "data-w": b[k] / total, "data-c": BREAKDOWN_COLOURS[k] }))),
    table(["part", "tokens", "share"], [...parts, "total"].map((k) => el("tr", {}, el("td", {}, k), el("td", { class: "num" }, b[k] ?? 0),
      el("td", { class: "num" }, k === "total" ? "" : pct(b[k] / total))))),
  ];
}
// NOTE: widths and colours are set through the DOM (the page's CSP forbids inline style attributes).
function paintBars(root) {
  for (const span of root.querySelectorAll(".bar-chart span")) {
    span.style.width = (100 * Number(span.dataset.w)).toFixed(2) + "%";
    span.style.background = span.dataset.c;
  }
}

async function openSession(s, detail) {
  if (!s.session_id) return;
  const q = "?user=" + encodeURIComponent(s.user || "default");
  const session = await api("GET", "/v1/sessions/" + encodeURIComponent(s.session_id) + q);
  let last = null;
  if (s.last_turn_id) last = await api("GET", "/v1/turns/" + encodeURIComponent(s.last_turn_id));
  const sum = session.summary;
  const box = el("div", { class: "detail" },
    el("h3", {}, "Session " + session.id),
    kv([["user", session.user], ["mode", session.mode || "server default"], ["messages", session.message_count],
      ["created", when(session.created_at)], ["mode on the last turn", last ? (last.context.mode || "—") : "—"]]),
    el("h3", {}, "Token breakdown (last turn)"),
    last && last.context.breakdown ? breakdownView(last.context.breakdown) : el("p", { class: "note" }, "No traced turn."),
    el("h3", {}, "Rolling summary"),
    sum.text ? [el("p", { class: "note" }, `covers messages up to #${sum.until_seq}, ${sum.tokens} tokens, refreshed ${when(sum.updated_at)} by ${sum.summariser || "—"}`),
      el("pre", { id: "session-summary" }, sum.text)] : el("p", { class: "note" }, "No summary yet (the session is short)."),
    el("h3", {}, "Entity table"),
    session.entities.length ? table(["kind", "value", "snippet"], session.entities.map((e) => el("tr", {}, el("td", {}, e.kind), el("td", {}, e.value), el("td", {}, e.snippet))))
      : el("p", { class: "note" }, "No entities."),
    el("h3", {}, "Context as the model received it on the last turn"),
    last && last.prompt.length ? promptView(last.prompt) : el("p", { class: "note" }, last ? "No model was called on the last turn." : "No traced turn."));
  detail.replaceChildren(box);
  paintBars(box);
}

function promptView(messages) {
  return el("div", { class: "prompt" }, messages.map((m) => [el("div", { class: "msg-role" }, m.role), el("pre", {}, m.content)]));
}

// Turns: recent turns, and one turn's whole trace.
async function turnsPage(root) {
  const detail = el("div", { id: "turn-detail" });
  const listBox = el("div", { id: "turn-list" });
  const filter = el("form", { class: "bar", id: "turn-filter" },
    el("label", {}, "Session id", el("input", { name: "sid" })),
    el("label", {}, "Most", el("input", { name: "limit", type: "number", min: 1, max: 500, value: 50, size: 4 })),
    el("button", { type: "submit", class: "plain" }, "Show"));
  const load = async () => {
    const params = new URLSearchParams({ limit: filter.elements.limit.value || "50" });
    if (filter.elements.sid.value.trim()) params.set("session_id", filter.elements.sid.value.trim());
    const list = await api("GET", "/v1/turns?" + params);
    const rows = list.data.map((t) => el("tr", { class: "row", "data-id": t.id, onclick: () => guarded(() => openTurn(t.id, detail)) },
      el("td", {}, when(t.created_at)), el("td", {}, t.user), el("td", {}, t.session_id || "—"), el("td", {}, t.path),
      el("td", {}, t.route || "—"), el("td", {}, cut(t.question, 90)), el("td", {}, t.finish_reason),
      el("td", { class: "num" }, t.steps), el("td", { class: "num" }, t.tool_calls), el("td", { class: "num" }, num(t.total_ms, 0))));
    listBox.replaceChildren(rows.length ? table(["time", "user", "session", "path", "route", "question", "finish", "steps", "tool calls", "ms"], rows)
      : el("p", {}, "No traced turn yet."));
  };
  filter.addEventListener("submit", (ev) => { ev.preventDefault(); guarded(load); });
  root.append(el("h2", {}, "Turns"), filter, listBox, detail);
  await load();
}

async function erasuresPage(root) {
  // NOTE: the audit rows hold the user's hash, never the user id or any content (docs/erasure.md).
  const list = await api("GET", "/v1/erasures?limit=200");
  const rows = list.data.map((r) => el("tr", { class: "row" },
    el("td", {}, when(r.created_at)), el("td", {}, r.object), el("td", {}, r.id), el("td", {}, r.user_hash),
    el("td", {}, r.requester), el("td", {}, tag(r.status)), el("td", {}, r.done_at ? when(r.done_at) : "—"),
    el("td", {}, Object.entries(r.counts).map(([k, v]) => `${k} ${v}`).join(", ") || "—")));
  root.append(el("h2", {}, "Erasures and exports"),
    rows.length ? table(["requested", "kind", "id", "user hash", "requester key", "status", "done", "counts"], rows)
      : el("p", {}, "No erasure or export yet."));
}

async function openTurn(id, detail) {
  const t = await api("GET", "/v1/turns/" + encodeURIComponent(id));
  for (const row of document.querySelectorAll("#turn-list tr.row")) row.classList.toggle("selected", row.dataset.id === id);
  const route = t.route ? `${t.route.route} (decided by ${t.route.source}${t.route.tools.length ? "; tools: " + t.route.tools.join(", ") : ""})` : "—";
  const box = el("div", { class: "detail", id: "turn-trace" },
    el("h3", {}, "Turn " + t.id),
    kv([["time", when(t.created_at)], ["user", t.user], ["session", t.session_id || "—"], ["path", t.path + (t.stream ? " (streamed)" : "")],
      ["route", route], ["finish", t.finish_reason], ["tokens", `${t.usage.prompt_tokens ?? 0} prompt + ${t.usage.completion_tokens ?? 0} completion`],
      ["timings (ms)", Object.entries(t.timings_ms).map(([k, v]) => `${k} ${num(v, 1)}`).join(", ")],
      ["cut to the size limits", t.truncated ? "yes" : "no"]]),
    el("h3", {}, "Question"), el("pre", {}, t.question),
    el("h3", {}, "Answer"), el("pre", { id: "turn-answer" }, t.answer),
    el("h3", {}, `Steps (${t.steps.length})`),
    t.steps.length ? table(["step", "kind", "content", "ms"], t.steps.map((s) => el("tr", {}, el("td", { class: "num" }, s.step), el("td", {}, tag(s.kind)),
      el("td", {}, el("pre", {}, s.content)), el("td", { class: "num" }, num(s.elapsed_ms, 1))))) : el("p", { class: "note" }, "No agent steps (plain or segmented path)."),
    el("h3", {}, `Tool calls (${t.tool_calls.length})`),
    t.tool_calls.length ? table(["call", "step", "tool", "arguments", "status", "ms", "observation"], t.tool_calls.map((c) => el("tr", {},
      el("td", {}, c.id), el("td", { class: "num" }, c.step), el("td", {}, c.name), el("td", {}, el("pre", {}, json(c.args))),
      el("td", {}, tag(c.status)), el("td", { class: "num" }, num(c.elapsed_ms, 1)), el("td", {}, el("pre", {}, c.observation))))) : el("p", { class: "note" }, "No tool calls."),
    el("h3", {}, `Memories used (${t.memories.length})`),
    t.memory_error ? el("p", { class: "note" }, "Recall failed: " + t.memory_error) : null,
    t.memories.length ? table(["id", "kind", "source", "score", "similarity", "time factor", "text"], t.memories.map((m) => el("tr", {},
      el("td", {}, m.id), el("td", {}, m.kind), el("td", {}, m.source_id), el("td", { class: "num" }, num(m.score, 4)),
      el("td", { class: "num" }, num(m.similarity)), el("td", { class: "num" }, num(m.time_factor)), el("td", {}, cut(m.text, 300))))) : el("p", { class: "note" }, "No memories recalled."),
    el("h3", {}, "Context"),
    t.context.breakdown ? [el("p", { class: "note" }, `mode ${t.context.mode} (asked: ${t.context.requested_mode ?? "default"}), budget ${t.context.budget} tokens, ${t.context.dropped_messages ?? 0} message(s) dropped`), breakdownView(t.context.breakdown)] : el("p", { class: "note" }, "—"),
    t.experience ? [el("h3", {}, "Experience record"), el("pre", {}, json(t.experience))] : null,
    el("h3", {}, "Prompt as the model received it"),
    t.prompt.length ? promptView(t.prompt) : el("p", { class: "note" }, "No model was called on this turn (a routing rule answered)."));
  detail.replaceChildren(box);
  paintBars(box);
}

// Review queue: filter, label correct / wrong with a note (the label API), the cache it lands in.
async function reviewPage(root) {
  const detail = el("div", { id: "review-detail" });
  const listBox = el("div", { id: "review-list" });
  const filter = el("form", { class: "bar", id: "review-filter" },
    el("label", {}, "Domain", el("input", { name: "domain", size: 12 })),
    el("label", {}, "Topic prefix", el("input", { name: "topic", size: 16 })),
    el("label", {}, "Confidence", el("select", { name: "confidence" }, ["any", "low", "medium", "high"].map((c) => el("option", { value: c }, c)))),
    el("button", { type: "submit", class: "plain" }, "Filter"));
  // NOTE: the queue is read a page at a time (issue 18: 500 records per visit through the state
  // store cost ~4x an empty queue); "Show more" asks for the next page, up to the API's 500.
  const PAGE = 50, MOST = 500;
  let queue = [], limit = PAGE;
  const load = async () => { queue = await api("GET", `/v1/experiences/review?limit=${limit}`); render(); };
  const more = () => el("button", { type: "button", class: "plain", id: "review-more",
    onclick: () => guarded(async () => { limit = Math.min(limit + PAGE, MOST); await load(); }) }, `Show ${PAGE} more`);
  const render = () => {
    const f = filter.elements;
    const shown = queue.filter((v) => {
      const md = v.record.metadata;
      return (!f.domain.value.trim() || md.task_domain === f.domain.value.trim()) &&
        (!f.topic.value.trim() || md.topic.startsWith(f.topic.value.trim())) &&
        (f.confidence.value === "any" || v.record.outcome.confidence === f.confidence.value);
    });
    const rows = shown.map((v) => el("tr", { class: "row", "data-id": v.record.metadata.id, onclick: () => guarded(() => openExperience(v, detail, listBox)) },
      el("td", {}, v.record.metadata.id), el("td", {}, v.record.metadata.task_domain), el("td", {}, v.record.metadata.topic),
      el("td", {}, v.record.outcome.confidence), el("td", {}, cut(v.record.context.raw_text, 80)), el("td", {}, String(v.record.outcome.answer)),
      el("td", {}, when(v.record.metadata.timestamp))));
    const full = queue.length >= limit;
    listBox.replaceChildren(el("p", { class: "note" }, full ? `${shown.length} of the oldest ${queue.length} waiting for review (there are more).`
      : `${shown.length} of ${queue.length} waiting for review.`),
      rows.length ? table(["id", "domain", "topic", "confidence", "problem", "answer", "created"], rows) : el("p", {}, "Nothing to review."),
      full && limit < MOST ? more() : null);
  };
  filter.addEventListener("submit", (ev) => { ev.preventDefault(); guarded(async () => render()); });
  root.append(el("h2", {}, "Review queue"), filter, listBox, detail);
  await load();
}

async function openExperience(view, detail, listBox) {
  const r = view.record;
  const form = el("form", { class: "bar", id: "label-form" },
    el("label", {}, "Verdict", el("span", { class: "checks" },
      el("label", { class: "inline" }, el("input", { type: "radio", name: "label", value: "correct", required: true }), "correct"),
      el("label", { class: "inline" }, el("input", { type: "radio", name: "label", value: "wrong" }), "wrong"))),
    el("label", {}, "Error tags (comma separated)", el("input", { name: "tags", size: 20 })),
    el("label", {}, "Note", el("textarea", { name: "note", rows: 2, cols: 40, maxlength: 2000 })),
    el("button", { type: "submit" }, "Save label"));
  const outcome = el("div", { id: "label-result" });
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    guarded(async () => {
      const f = form.elements;
      const tags = f.tags.value.split(",").map((t) => t.trim()).filter(Boolean);
      const done = await api("POST", `/v1/experiences/${encodeURIComponent(r.metadata.id)}/label`,
        { label: f.label.value, error_tags: tags, note: f.note.value });
      const where = done.tier === "active" ? "the active cache (it will be injected into matching prompts)"
        : done.tier === "archival" ? "the archival cache (kept as a known error pattern, never injected as guidance)" : "the " + done.tier + " tier";
      outcome.replaceChildren(el("p", { class: "ok" }, `Labelled ${done.record.evaluation.human_label}: moved to ${where}.`),
        kv([["tier", tag(done.tier)], ["reviewer", done.record.metadata.reviewer || "—"], ["note", done.record.evaluation.review_note || "—"],
          ["error tags", done.record.evaluation.error_tags.join(", ") || "—"], ["decay", num(done.decay)], ["uses", done.use_count]]));
      const row = listBox.querySelector(`tr[data-id="${CSS.escape(r.metadata.id)}"]`);
      if (row) row.remove();
    });
  });
  detail.replaceChildren(el("div", { class: "detail" },
    el("h3", {}, "Experience " + r.metadata.id),
    kv([["tier", tag(view.tier)], ["domain", r.metadata.task_domain], ["topic", r.metadata.topic], ["model", r.metadata.source_model],
      ["confidence", `${r.outcome.confidence} (model said: ${r.outcome.stated_confidence || "—"})`], ["answer", String(r.outcome.answer)]]),
    el("h3", {}, "Problem"), el("pre", {}, r.context.raw_text),
    el("h3", {}, "Reasoning"), table(["#", "step", "principle"], r.reasoning.map((s) => el("tr", {}, el("td", {}, s.step_id), el("td", {}, s.text), el("td", {}, s.principle)))),
    el("h3", {}, "Verification (run by code)"), table(["type", "target", "expected", "actual", "status", "notes"], r.verification.map((v) => el("tr", {},
      el("td", {}, v.type), el("td", {}, v.target), el("td", {}, json(v.expected)), el("td", {}, json(v.actual)), el("td", {}, tag(v.status)), el("td", {}, v.notes)))),
    el("h3", {}, "Label"), form, outcome));
}

// Health: the first figures an operator checks, from the metrics (refreshed every 5 s).
async function healthPage(root) {
  const cards = el("div", { class: "cards", id: "health-cards" });
  const status = el("p", { class: "note" });
  root.append(el("h2", {}, "Health"), status, cards);
  const refresh = async () => {
    const [h, z] = await Promise.all([api("GET", "/v1/console/health"), api("GET", "/healthz")]);
    const now = performance.now();
    let rate = null;
    if (state.lastHealth && now > state.lastHealth.at) rate = (h.requests - state.lastHealth.requests) / ((now - state.lastHealth.at) / 1000);
    state.lastHealth = { at: now, requests: h.requests };
    const card = (label, value, note) => el("div", { class: "card" }, el("div", { class: "label" }, label), el("div", { class: "value" }, value), note ? el("div", { class: "note" }, note) : null);
    const classes = Object.entries(h.requests_by_class).map(([k, v]) => `${k}: ${v}`).join(", ");
    cards.replaceChildren(
      card("Request rate", rate === null ? "—" : rate.toFixed(2) + " /s", "between the last two readings"),
      card("Requests", h.requests, classes || "none yet"),
      card("Server errors", pct(h.error_rate), "5xx / all requests"),
      card("Latency p50", h.latency_p50_s === null ? "—" : "≤ " + h.latency_p50_s + " s", "your requests, histogram bucket bound"),
      card("Latency p95", h.latency_p95_s === null ? "—" : "≤ " + h.latency_p95_s + " s", ""),
      card("Memory records", h.memory_records ?? "—", h.memory_error ? "memory tier: " + h.memory_error : "yours (the shared collection not counted)"),
      card("Experience cache hit rate", pct(h.cache_hit_rate), `${h.cache_lookups} lookups`),
      card("Verification pass rate", pct(h.verification_pass_rate), `${h.verification_items} items run`));
    status.textContent = `Server ${z.status}, profile ${z.profile || "—"}, models ${z.models.join(", ")}; updated ${new Date().toLocaleTimeString()}.`;
  };
  state.lastHealth = null;
  await refresh();
  // NOTE: a rate needs two readings: the second comes after 1 s, then every 5 s.
  state.timer = setTimeout(() => guarded(async () => {
    await refresh();
    state.timer = setInterval(() => guarded(refresh), 5000);
  }), 1000);
}

// ---- start ---------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  $("#signin").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const key = $("#api-key").value.trim();
    guarded(() => signIn(key));
  });
  $("#signout").addEventListener("click", () => signOut());
  window.addEventListener("hashchange", route);
  const saved = sessionStorage.getItem(KEY_STORE);
  if (saved) guarded(() => signIn(saved));
});
