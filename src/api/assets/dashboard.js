// npc dashboard: one page over the daemon's REST API (/api/v1). No
// framework, no CDN; the one library is the vendored terminal emulator
// (/vendor/xterm.js, the global `Terminal`). The page authenticates with a
// session cookie (HttpOnly, SameSite=Strict) the daemon sets when the page
// redeems the one-time code in its URL fragment (#code=..., printed by
// `npc daemon` and `npc dashboard`; a fragment never reaches a server log
// or a Referer); the code is then dropped from the address bar. Requests,
// the SSE stream and the terminal WebSocket carry the cookie by themselves.
// Events come from the SSE stream read with fetch, resumed after the last
// id seen when the connection drops. Everything the server says is written
// as text (textContent, text nodes), never parsed as HTML.
"use strict";

const MAX_EVENTS_SHOWN = 200;
const MAX_NOTICES_SHOWN = 50;
const MAX_RUN_EVENTS_SHOWN = 2000;
const MAX_TEXT_SHOWN = 4000;
// `GET /runs/{id}/events` pages (at most 1000 events each) read when a run opens.
const RUN_EVENTS_PAGE = 1000;
const MAX_RUN_EVENT_PAGES = 20;
const RUNS_LISTED = 50;
// Runs the runs timeline draws (the newest; the table lists RUNS_LISTED of
// them), and how often it moves its running bars between reads.
const RUNS_TIMELINE_SHOWN = 200;
const TIMELINE_TICK_MS = 1000;
// Patch lines the run view colours; the rest of a longer patch is plain text.
const MAX_DIFF_LINES_COLOURED = 20000;
const REFRESH_DEBOUNCE_MS = 150;
const RECONNECT_MAX_MS = 5000;
// The API's bound on one `POST /panes/{name}/input` (8 KiB); keystrokes
// and lines longer than this go in pieces.
const MAX_INPUT_CHARS = 2048;
const TERMINAL_SCROLLBACK = 5000;
// Slash commands the dashboard runs itself; they never reach the pane.
const SLASH_COMMANDS = ["/restart", "/relaunch", "/status"];
const RUN_ACTIVE = ["queued", "running", "waiting"];
// Pane states `/relaunch` applies to (`held`: exited, a plugin's relaunch pending).
const PANE_ENDED = ["exited", "held", "closed"];
// The fleet panel (a daemon with `[store] url`): runs drawn on the timeline,
// how often it is read again (heartbeat ages and running bars move without
// events), the longest time it spans, and its shortest.
const FLEET_RUNS_SHOWN = 200;
const FLEET_REFRESH_MS = 2000;
const TIMELINE_MAX_SPAN_MS = 60 * 60 * 1000;
const TIMELINE_MIN_SPAN_MS = 10 * 1000;
// Timeline geometry, in pixels.
const LANE_HEIGHT = 26;
const BAR_HEIGHT = 14;
const QUEUED_HEIGHT = 6;
const LABEL_WIDTH = 230;
// Characters of a lane's label drawn (its tooltip has all of it).
const LANE_LABEL_CHARS = 32;
const AXIS_HEIGHT = 20;
const MIN_BAR_WIDTH = 2;
// Tracks a lane grows to for runs that overlap; more share the last.
const MAX_TRACKS = 8;
const TIMELINE_FALLBACK_WIDTH = 900;
// Tick steps the time axis picks from, and the most ticks it draws.
const TICK_STEPS_MS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600].map((s) => s * 1000);
const MAX_TICKS = 8;
// Room a tick's time label needs; a tick nearer the right edge has none.
const TICK_LABEL_WIDTH = 70;
// Outcomes the timeline colours (its legend, in order).
const OUTCOMES = ["succeeded", "failed", "blocked", "cancelled", "interrupted", "timed_out", "running", "waiting"];
const SVG_NS = "http://www.w3.org/2000/svg";
// The workflows panel: declared workflows listed, and the graph of a
// workflow run: steps drawn, instances of a fan-out drawn in a node, gates
// offered in a node (and whose approval is read), and its geometry in pixels.
const MAX_WORKFLOWS_LISTED = 200;
const MAX_GRAPH_STEPS = 200;
const MAX_INSTANCES_DRAWN = 12;
const MAX_GATES_DRAWN = 12;
const NODE_WIDTH = 200;
const NODE_HEADER = 42;
const NODE_PAD = 6;
const NODE_GAP = 22;
const COLUMN_GAP = 70;
const GRAPH_PAD = 14;
const INSTANCE_HEIGHT = 20;
const GATE_ROW = 28;
const GATE_BUTTON_WIDTH = 70;
// Characters of a node's name and of its other lines drawn (its tooltip has all).
const NODE_LABEL_CHARS = 26;
const NODE_SUB_CHARS = 30;

const code = new URLSearchParams(location.hash.slice(1)).get("code");
// An answer link (`/#run=RUN_ID`, a notification's) opens that run's view.
const linkedRun = new URLSearchParams(location.hash.slice(1)).get("run");
let lastEventId = 0;
let refreshTimer = null;
const dirty = new Set();
let profiles = [];
// The run shown in the run view: its id, the last event id drawn, open tool calls.
let openRun = null;
// The pane shown in the terminal view: name, terminal, socket, reconnect timer.
let openPane = null;
// The fleet panel's refresh timer, and what it last drew (redrawn on resize).
let fleetTimer = null;
let fleetDrawn = null;
// What the runs timeline last drew (its runs, lanes, the daemon's clock and
// when it was read), and the timer that moves its running bars.
let runsDrawn = null;
let runsTicker = null;
// The workflow run shown in the workflow view: its id, and the approval
// each of its waiting gates parked (`run.waiting`); what the declared
// workflows' table last drew.
let openWorkflow = null;
let workflowsDeclared = null;

// ---------------------------------------------------------------- helpers

function api(path, options = {}) {
  return fetch("/api/v1" + path, Object.assign({ credentials: "same-origin" }, options));
}

// Redeem the URL's one-time code for the session cookie, then drop it from
// the address bar (it serves once).
async function redeemCode() {
  if (!code) return;
  history.replaceState(null, "", location.pathname + location.search);
  try {
    await api("/session", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ code }),
    });
  } catch (e) {
    // Without a session every request says so (401).
  }
}

// One JSON request: `{ ok, status, doc }`; a network failure is status 0.
async function call(method, path, body) {
  const options = { method };
  if (body !== undefined) {
    options.body = JSON.stringify(body);
    options.headers = { "Content-Type": "application/json" };
  }
  try {
    const response = await api(path, options);
    const doc = await response.json().catch(() => ({}));
    return { ok: response.ok, status: response.status, doc };
  } catch (e) {
    return { ok: false, status: 0, doc: { error: { message: "the daemon does not answer" } } };
  }
}

function errorText(answer) {
  const e = answer.doc && answer.doc.error;
  return e && e.message ? String(e.message) : `failed (HTTP ${answer.status})`;
}

// An element; `children` are nodes or values shown as text.
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : child == null ? "" : String(child));
  }
  return node;
}

function button(label, onClick, attrs = {}) {
  const b = el("button", Object.assign({ type: "button" }, attrs), label);
  b.addEventListener("click", onClick);
  return b;
}

function cut(text) {
  const s = typeof text === "string" ? text : JSON.stringify(text);
  return s.length > MAX_TEXT_SHOWN ? s.slice(0, MAX_TEXT_SHOWN) + "…" : s;
}

// How a process ended, in words: `exit 3`, `killed by signal 9`.
function exitText(exit) {
  if (exit == null) return "";
  if (typeof exit !== "object") return `exit ${exit}`;
  if (exit.code != null) return `exit ${exit.code}`;
  if (exit.signal != null) return `killed by signal ${exit.signal}`;
  return "";
}

// Fields of a payload a line names first, in this order; other plain
// fields follow, nested ones are counted, never dumped.
const LEAD_FIELDS = ["message", "reason", "error", "detail", "summary", "outcome", "state", "run_id", "trigger", "profile", "name", "tool", "path", "route"];
const MAX_LINE_FIELDS = 8;

// A payload as words: `field value` pairs (the lead fields first), an exit
// as `exit 3`, a list or object as its count; never JSON.
function fieldsText(payload) {
  if (payload == null || typeof payload !== "object") return payload == null ? "" : String(payload);
  const keys = Object.keys(payload);
  const ordered = LEAD_FIELDS.filter((k) => keys.includes(k)).concat(keys.filter((k) => !LEAD_FIELDS.includes(k)));
  const parts = [];
  for (const k of ordered) {
    const v = payload[k];
    if (v == null || v === "" || v === false) continue;
    let shown;
    if (k === "exit") shown = exitText(v);
    else if (Array.isArray(v)) shown = v.length ? `${v.length} item${v.length === 1 ? "" : "s"}` : "";
    else if (typeof v === "object") shown = "…";
    else shown = v === true ? "yes" : String(v);
    if (shown === "") continue;
    parts.push(k === "exit" ? shown : `${k} ${shown}`);
    if (parts.length === MAX_LINE_FIELDS) break;
  }
  return cut(parts.join(" · "));
}

// One time format with the command line (`cli::human::when_at`): local
// time and how long ago, `2026-12-05 06:41:02 (3m ago)`, whatever the
// browser's locale; the API's JSON keeps milliseconds and RFC 3339.
function when(value) {
  if (value === undefined || value === null || value === "") return "";
  const date = typeof value === "number" ? new Date(value) : new Date(String(value));
  if (isNaN(date)) return String(value);
  return `${localDay(date)} ${clock(date)} (${age(Date.now() - date.getTime())})`;
}

function pad2(n) {
  return String(n).padStart(2, "0");
}

function localDay(date) {
  return `${date.getFullYear()}-${pad2(date.getMonth() + 1)}-${pad2(date.getDate())}`;
}

// `HH:MM:SS`, local, 24-hour (the timeline's ticks).
function clock(date) {
  return `${pad2(date.getHours())}:${pad2(date.getMinutes())}:${pad2(date.getSeconds())}`;
}

// Closer than this to now reads "just now" (as `cli::human::age`).
const JUST_NOW_MS = 1000;

// How long ago `ms` is: `just now`, `42s ago`, `5m ago`, `in 2h`.
function age(ms) {
  if (Math.abs(ms) < JUST_NOW_MS) return "just now";
  const s = Math.floor(Math.abs(ms) / 1000);
  const short = s < 60 ? `${s}s` : s < 3600 ? `${Math.floor(s / 60)}m`
    : s < 86400 ? `${Math.floor(s / 3600)}h` : `${Math.floor(s / 86400)}d`;
  return ms < 0 ? `in ${short}` : `${short} ago`;
}

function byId(id) {
  return document.getElementById(id);
}

// Rows of cells (nodes or text) into `#id tbody`; the second cell is the state.
function fillTable(id, rows, empty) {
  const body = document.querySelector("#" + id + " tbody");
  if (rows.length === 0 && empty) {
    const cols = document.querySelectorAll("#" + id + " thead th").length;
    body.replaceChildren(el("tr", { class: "empty" }, el("td", { colspan: cols }, empty)));
    return;
  }
  body.replaceChildren(...rows.map(({ key, cells, detail }) => {
    const tr = el("tr", { "data-key": key });
    cells.forEach((cell, i) => {
      const attrs = i === 1 ? { class: "state-" + String(cell).split(" ")[0] } : {};
      if (i === 1 && detail) attrs.title = detail;
      tr.append(el("td", attrs, cell));
    });
    return tr;
  }));
}

function say(id, text) {
  byId(id).textContent = text;
}

// ---------------------------------------------------------- status, plan

function showDiagnostics(report) {
  const list = byId("diagnostics");
  const diagnostics = (report && report.diagnostics) || [];
  list.replaceChildren(...diagnostics.map((d) => {
    const where = d.range ? `${d.range.start.line}:${d.range.start.column}` : "";
    return el("li", { "data-line": d.range ? d.range.start.line : "" },
      `${where} ${d.severity}: ${d.summary}${d.detail ? " — " + d.detail : ""}`);
  }));
  byId("invalid").hidden = diagnostics.length === 0;
}

function toolNames(server) {
  const names = server.tool_names || (Array.isArray(server.tools) ? server.tools : null);
  if (!names) return server.tools ?? server.tool_count ?? "";
  return names.map((t) => (typeof t === "string" ? t : t.name || t.tool || "")).join(", ");
}

async function refreshStatus() {
  const answer = await call("GET", "/status");
  if (!answer.ok) return;
  const status = answer.doc;
  say("daemon", `daemon pid ${status.pid}`);
  const components = status.components || [];
  fillTable("components", components.map((c) => ({
    key: c.id,
    // The state word `npc status` prints (`per_call` reads "per call"), with
    // what it means for a component no process stands for.
    cells: [c.id, String(c.state).replaceAll("_", " "), c.pid ?? "-", c.restarts ?? 0, when(c.since)],
    detail: c.detail || c.error,
  })));
  const servers = (status.mcp && status.mcp.servers) || [];
  fillTable("mcp", servers.map((s) => ({
    key: s.name,
    cells: [s.name ?? "", s.state ?? "", toolNames(s),
      s.error ?? (s.last_call ? `${s.last_call.tool ?? ""} ${s.last_call.outcome ?? ""}` : "")],
  })), "no MCP servers");
  profiles = components.filter((c) => c.kind === "profile" || String(c.id).startsWith("profile."))
    .map((c) => String(c.id).replace(/^profile\./, ""));
  fillProfiles();
  showFleet(Boolean(status.store && status.store.kind === "postgres"));
}

async function refreshPlugins() {
  const answer = await call("GET", "/plugins");
  if (!answer.ok) return;
  fillTable("plugins", (answer.doc.plugins || []).map((p) => ({
    key: p.id,
    cells: [
      `${p.id}${p.version ? " " + p.version : ""}`,
      `${p.saved ?? ""} ${p.package ?? ""}`.trim(),
      (p.servers || []).join(", "),
      (p.skills || []).join(", "),
      p.hooks ?? 0,
      p.source ?? "",
    ],
  })), "no plugin packages");
}

function fillProfiles() {
  const select = byId("run-profile");
  const chosen = select.value;
  const names = profiles.slice().sort();
  if (select.options.length === names.length &&
      names.every((n, i) => select.options[i].value === n)) return;
  select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  if (names.includes(chosen)) select.value = chosen;
  byId("run-start").disabled = names.length === 0;
}

async function refreshPlan() {
  const answer = await call("GET", "/plan");
  const doc = answer.doc;
  const section = byId("plan");
  if (answer.status === 422) {
    showDiagnostics(doc.error && doc.error.detail && doc.error.detail.report);
    section.hidden = true;
    return;
  }
  if (!answer.ok) return;
  showDiagnostics(null);
  const changes = (doc.actions || []).filter((a) => a.action !== "no-op");
  section.hidden = changes.length === 0;
  const s = doc.summary || {};
  say("plan-summary",
    `${s.add} to add, ${s.update} to change, ${s.replace} to replace, ${s.remove} to remove` +
    (s.refused ? `, ${s.refused} refused` : ""));
  byId("plan-actions").replaceChildren(...changes.map((a) =>
    el("li", {}, `${a.symbol} ${a.id}${a.cause ? " — " + a.cause : ""}`)));
}

// ---------------------------------------------------------------- triggers

// What a trigger watches; a webhook's the URL to paste into GitHub (the
// listener's own address: a sender elsewhere reaches it through whatever
// forwards a public address to it).
function triggerTarget(t) {
  if (t.kind === "webhook") {
    return el("span", {}, `route ${t.route ?? ""} `, t.url
      ? el("code", { class: "webhook-url", title: "the payload URL for GitHub's webhook settings (content type application/json)" }, t.url)
      : el("span", { class: "subtle" }, "(the webhook listener is not bound)"));
  }
  if (t.route) return `route ${t.route}`;
  if (Array.isArray(t.paths)) return `paths ${t.paths.join(", ")}`;
  if (t.schedule) return `${t.schedule}${t.timezone ? " " + t.timezone : ""}`;
  return "";
}

async function refreshTriggers() {
  const answer = await call("GET", "/triggers");
  if (!answer.ok) {
    say("triggers-note", answer.status === 404 ? "this daemon lists no triggers over the API" : errorText(answer));
    return;
  }
  say("triggers-note", "");
  const triggers = answer.doc.triggers || [];
  fillTable("triggers", triggers.map((t) => ({
    key: t.name,
    cells: [
      t.name,
      t.kind + (t.enabled === false ? " (disabled)" : ""),
      (t.next_fire_times || []).slice(0, 3).map(when).join(", "),
      triggerTarget(t),
      el("span", {}, ...(t.recent_runs || []).slice(0, 5).map((r) =>
        el("a", { href: "#run", class: "run-link state-" + r.state, "data-run": r.id, title: r.id },
          r.state))),
      button("Fire", () => fireTrigger(t.name), { class: "fire", "data-trigger": t.name }),
    ],
  })), "no triggers");
}

async function fireTrigger(name) {
  say("trigger-result", `firing ${name}…`);
  const answer = await call("POST", `/triggers/${encodeURIComponent(name)}/fire`, {});
  if (!answer.ok) {
    say("trigger-result", `${name}: ${errorText(answer)}`);
    return;
  }
  say("trigger-result", `${name} fired: run ${answer.doc.run_id}`);
  markDirty("runs", "triggers");
  if (answer.doc.run_id) showRun(answer.doc.run_id);
}

// -------------------------------------------------------------------- runs

async function refreshRuns() {
  const answer = await call("GET", `/runs?limit=${RUNS_TIMELINE_SHOWN}`);
  if (!answer.ok) {
    say("runs-note", answer.status === 404 ? "this daemon lists no runs over the API" : errorText(answer));
    return;
  }
  say("runs-note", "");
  const runs = answer.doc.runs || [];
  const now = answer.doc.now_ms || Date.now();
  fillTable("runs", runs.slice(0, RUNS_LISTED).map((r) => {
    const queued = Date.parse(r.created_at);
    const started = r.started_at ? Date.parse(r.started_at) : null;
    const finished = r.finished_at ? Date.parse(r.finished_at) : null;
    return {
      key: r.id,
      cells: [
        el("a", { href: "#run", class: "run-link", "data-run": r.id }, r.id),
        r.state,
        startedBy(r),
        r.profile ?? r.command ?? "",
        el("span", { class: "start", title: `queued ${when(r.created_at)}` },
          started != null ? when(started) : finished != null ? "never started" : "not yet"),
        el("span", { class: "wait" }, started != null ? seconds(started - queued)
          : finished != null ? "" : `${seconds(now - queued)} so far`),
        el("span", { class: "duration" }, started == null ? ""
          : finished != null ? seconds(finished - started) : `${seconds(now - started)} so far`),
        runWhy(r),
      ],
    };
  }), "no runs yet");
  runsDrawn = { runs: runs.map(timelineRun), now, at: Date.now() };
  drawRunsTimeline();
  if (openRun) {
    const mine = runs.find((r) => r.id === openRun.id);
    if (mine) showRunState(mine);
  }
}

// What started a run, as a cell: its trigger and origin (or who ran it by
// hand), and what its firing recorded: a webhook's event and the issue or
// pull request it is about (number, title, a link to its page), a file
// watch's path, a cron firing's scheduled time. The API bounds each text
// and passes only http(s) links; the page writes them as text and an href.
function startedBy(r) {
  const cause = r.cause || {};
  const parts = [r.trigger ? `${r.trigger} (${r.origin || "trigger"})` : `by hand (${r.origin || r.source})`];
  if (cause.event) parts.push(cause.event);
  if (cause.path) parts.push(cause.path);
  if (cause.scheduled_at) parts.push(`due ${when(cause.scheduled_at)}`);
  const cell = el("span", { class: "started-by", title: cause.delivery ? `delivery ${cause.delivery}` : undefined }, parts.join(" · "));
  const subject = cause.subject;
  if (subject) {
    const name = `${subject.kind === "pull_request" ? "PR" : "issue"}${subject.number != null ? " #" + subject.number : ""}`;
    const text = subject.title ? `${name} ${subject.title}` : name;
    // The API passes only http(s) addresses; the page checks again.
    const web = typeof subject.url === "string" && /^https?:\/\//.test(subject.url);
    cell.append(" · ", web
      ? el("a", { class: "subject", href: subject.url, target: "_blank", rel: "noopener noreferrer" }, text)
      : el("span", { class: "subject" }, text));
  }
  return cell;
}

// A run of the runs API as the timeline draws it: its lane is its trigger
// and concurrency key, or who ran it by hand.
function timelineRun(r) {
  const lane = r.trigger
    ? r.trigger + (r.concurrency_key ? ` · ${r.concurrency_key}` : "")
    : `by hand (${r.origin || r.source})`;
  return {
    id: r.id,
    state: r.state,
    lane,
    enqueued_at_ms: Date.parse(r.created_at),
    started_at_ms: r.started_at ? Date.parse(r.started_at) : null,
    finished_at_ms: r.finished_at ? Date.parse(r.finished_at) : null,
    about: [`${r.source}${r.profile || r.command ? " · " + (r.profile ?? r.command) : ""}`,
      r.detail ? cut(r.detail) : ""],
  };
}

// The runs timeline: a lane per trigger (and concurrency key), then one per
// way of running by hand, each with a run in the window (the last hour at
// most); its running bars move on between reads.
function drawRunsTimeline() {
  if (!runsDrawn) return;
  const now = runsDrawn.now + (Date.now() - runsDrawn.at);
  const names = [...new Set(runsDrawn.runs.map((r) => r.lane))];
  const byHand = (name) => name.startsWith("by hand");
  names.sort((a, b) => (byHand(a) - byHand(b)) || a.localeCompare(b));
  drawTimeline(byId("runs-timeline"), {
    lanes: names.map((name) => ({ id: name, state: byHand(name) ? "manual" : "trigger", label: name })),
    runs: runsDrawn.runs,
    now,
    empty: runsDrawn.runs.length ? "no runs in the last hour" : "no runs yet",
    onlyBusy: true,
  });
  const active = runsDrawn.runs.some((r) => r.finished_at_ms == null);
  if (active && !runsTicker) {
    runsTicker = setInterval(() => { if (!document.hidden) drawRunsTimeline(); }, TIMELINE_TICK_MS);
  } else if (!active && runsTicker) {
    clearInterval(runsTicker);
    runsTicker = null;
  }
}

// Why a run ended as it did, in words: a blocked run's denials (tool, who,
// rule), a worktree run that changed nothing, else the queue's detail.
// Text only (`fillTable` and `say` set text, never markup).
function runWhy(run) {
  const denials = (run.denials || []).map((d) => `${d.tool} denied by ${d.by} (${d.rule})`);
  if (denials.length) return cut("blocked: " + denials.join(", "));
  if (run.result && run.result.unchanged) return "no changes";
  return run.detail ? cut(run.detail) : "";
}

function showRunState(run) {
  openRun.state = run.state;
  const cancellable = !openRun.fleet && RUN_ACTIVE.includes(run.state);
  say("run-state", [run.state, run.source, run.profile ?? run.command,
    exitText(run.exit), run.reason ?? "", runWhy(run)]
    .filter((x) => x !== undefined && x !== null && x !== "").join(" · "));
  byId("run-state").className = "state-" + run.state;
  // A local run's listing says what started it (a fleet's has its own words).
  byId("run-cause").replaceChildren(...(run.origin ? ["started by ", startedBy(run)] : []));
  byId("run-cancel").hidden = !cancellable;
  // A run parked on an `ask`: a person allows or denies the call.
  const waiting = !openRun.fleet && run.state === "waiting";
  byId("run-approval").hidden = !waiting;
  // A worktree run's result: its branch and diff stat, the patch on demand.
  const r = run.result;
  byId("run-branch").hidden = !r;
  if (r) {
    say("run-branch-text", `branch ${r.branch} (${r.base.slice(0, 12)} → ${r.head.slice(0, 12)}): ` +
      (r.unchanged ? "no changes: the run changed no file" : `${r.files} files changed, +${r.insertions} −${r.deletions}`) +
      (run.worktree ? ` · worktree kept: ${run.worktree}` : ""));
  }
}

async function showDiff(event) {
  event.preventDefault();
  if (!openRun) return;
  const answer = await call("GET", `/runs/${encodeURIComponent(openRun.id)}/diff`);
  const pre = byId("run-patch");
  pre.hidden = false;
  if (!answer.ok) {
    pre.textContent = errorText(answer);
    return;
  }
  showPatch(pre, String(answer.doc.patch ?? "") + (answer.doc.truncated ? "\n… (cut at 16 MiB)" : ""));
}

// A patch, each line coloured by what it is (a file header, a hunk, an
// added or removed line); text nodes only, never markup: the patch is
// whatever the agent wrote.
function showPatch(pre, patch) {
  const lines = patch.split("\n");
  const kind = (line) =>
    line.startsWith("+++") || line.startsWith("---") || line.startsWith("diff ") || line.startsWith("index ") ? "file"
      : line.startsWith("@@") ? "hunk"
        : line.startsWith("+") ? "add"
          : line.startsWith("-") ? "del" : null;
  const shown = lines.slice(0, MAX_DIFF_LINES_COLOURED).map((line) => {
    const k = kind(line);
    return k ? el("span", { class: "diff-" + k }, line + "\n") : document.createTextNode(line + "\n");
  });
  const rest = lines.slice(MAX_DIFF_LINES_COLOURED);
  const all = document.createDocumentFragment();
  for (const node of shown) all.append(node);
  if (rest.length) all.append(rest.join("\n"));
  pre.replaceChildren(all);
}

// Open the run view on run `id`, empty; `fleet`: a run of the fleet's
// shared store (its events come from /fleet/events, read on each refresh).
function openRunView(id, fleet) {
  // Live events that arrive while the run's past is fetched wait in `early`.
  openRun = { id: String(id), lastId: 0, calls: new Map(), state: null, message: null, early: fleet ? null : [], fleet };
  byId("run-view").hidden = false;
  say("run-title", `Run ${id}`);
  say("run-state", "");
  say("run-result", "");
  byId("run-cause").replaceChildren();
  byId("run-branch").hidden = true;
  byId("run-patch").hidden = true;
  byId("run-patch").textContent = "";
  byId("run-cancel").hidden = true;
  byId("run-approval").hidden = true;
  byId("run-events").replaceChildren();
  byId("run-view").scrollIntoView({ block: "nearest" });
}

async function showRun(id) {
  openRunView(id, false);
  const [run, past] = await Promise.all([
    call("GET", `/runs/${encodeURIComponent(id)}`),
    runEvents(id),
  ]);
  if (!openRun || openRun.id !== String(id)) return;
  if (run.ok) showRunState(run.doc.run || run.doc);
  else say("run-result", errorText(run));
  const early = openRun.early;
  openRun.early = null;
  for (const event of past.concat(early).sort((a, b) => a.id - b.id)) drawRunEvent(event);
}

// The run's recorded events, oldest first, a page at a time (the view
// keeps the newest MAX_RUN_EVENTS_SHOWN).
async function runEvents(id) {
  let events = [];
  let since = 0;
  for (let page = 0; page < MAX_RUN_EVENT_PAGES; page++) {
    const answer = await call("GET", `/runs/${encodeURIComponent(id)}/events?since=${since}&limit=${RUN_EVENTS_PAGE}`);
    if (!answer.ok) break;
    const got = answer.doc.events || [];
    events = events.concat(got).slice(-MAX_RUN_EVENTS_SHOWN);
    if (got.length < RUN_EVENTS_PAGE) break;
    since = got[got.length - 1].id;
  }
  return events;
}

function belongsToOpenRun(event) {
  if (!openRun) return false;
  const p = event.payload || {};
  return String(p.run_id ?? "") === openRun.id || event.component === "run." + openRun.id;
}

// One event of the open run, as the parsed stream a person reads.
function drawRunEvent(event) {
  // Events come in id order (the past sorted, then live), each once.
  if (event.id <= openRun.lastId) return;
  openRun.lastId = event.id;
  const list = byId("run-events");
  const p = event.payload || {};
  const kind = event.kind;
  const item = (cls, ...children) => el("li", { class: cls, "data-kind": kind, "data-id": event.id }, ...children);
  let node = null;
  switch (kind) {
    case "agent.message":
      if (p.delta && openRun.message) {
        openRun.message.append(String(p.text ?? ""));
        return;
      }
      node = item("message", el("span", { class: "label" }, "agent"), el("div", { class: "text" }, cut(p.text ?? "")));
      openRun.message = p.delta ? node.querySelector(".text") : null;
      break;
    case "agent.tool_call": {
      const result = el("div", { class: "result pending" }, "…");
      node = item("tool-call", el("span", { class: "label" }, "tool"), el("code", {}, p.name ?? "?"),
        el("pre", { class: "input" }, cut(JSON.stringify(p.input ?? {}, null, 1))), result);
      if (p.id != null) openRun.calls.set(String(p.id), result);
      break;
    }
    case "agent.tool_result": {
      const target = p.id != null ? openRun.calls.get(String(p.id)) : null;
      const text = (p.is_error ? "error: " : "") + cut(p.output ?? "");
      if (target) {
        target.textContent = text;
        target.className = "result" + (p.is_error ? " error" : "");
        target.setAttribute("data-kind", kind);
        return;
      }
      node = item("tool-result" + (p.is_error ? " error" : ""), el("span", { class: "label" }, `result ${p.name ?? ""}`), el("pre", {}, text));
      break;
    }
    case "agent.error":
      node = item("error", el("span", { class: "label" }, `error (${p.kind ?? "?"})`), cut(p.message ?? ""));
      break;
    case "agent.started":
      node = item("meta", `session ${p.session_id ?? "?"}${p.model ? " · model " + p.model : ""}`);
      break;
    case "agent.usage":
      node = item("meta", `tokens in ${p.input_tokens ?? "?"} · out ${p.output_tokens ?? "?"}${p.cost_usd != null ? " · $" + p.cost_usd : ""}`);
      break;
    case "agent.idle":
      node = item("meta", `turn ended: ${p.status ?? ""}${p.result ? " — " + cut(p.result) : ""}`);
      break;
    case "run.output":
      node = item("output", el("pre", {}, cut(p.line ?? "")));
      break;
    case "run.queued":
    case "run.started":
      node = item("meta", `${kind.slice(4)}${p.profile ? " · profile " + p.profile : ""}${p.provider ? " · provider " + p.provider : ""}${p.program ? " · " + p.program : ""}`);
      break;
    case "run.waiting":
      node = item("outcome bad", el("span", { class: "label" }, "waiting"),
        `approval of ${p.tool ?? "?"} (${p.rule ?? ""})${p.reason ? " — " + cut(p.reason) : ""} · ${cut(JSON.stringify(p.arguments ?? null))}`);
      if (p.approval_id) openRun.asked = [...(openRun.asked ?? []), p.approval_id];
      markDirty("runs");
      break;
    case "run.approval":
      node = item("meta", `approval of ${p.tool ?? "?"}: ${p.decision ?? ""}${p.always ? " (always)" : ""} by ${p.by ?? "?"}${p.reason ? " — " + cut(p.reason) : ""}`);
      openRun.asked = (openRun.asked ?? []).filter((id) => id !== p.approval_id);
      markDirty("runs");
      break;
    case "run.finished":
    case "run.cancelled":
    case "run.skipped":
    case "run.interrupted":
      node = item("outcome " + (p.outcome === "succeeded" ? "ok" : "bad"),
        el("span", { class: "label" }, "outcome"),
        `${p.outcome ?? kind.slice(4)}${p.exit != null ? " · " + exitText(p.exit) : ""}${p.error ? " — " + cut(p.error) : ""}${p.detail ? " — " + cut(p.detail) : ""}`);
      markDirty("runs");
      break;
    default:
      node = item("meta", `${kind} ${fieldsText(p)}`);
  }
  if (kind !== "agent.message") openRun.message = null;
  list.append(node);
  while (list.children.length > MAX_RUN_EVENTS_SHOWN) list.firstChild.remove();
}

async function cancelRun() {
  if (!openRun) return;
  say("run-result", "cancelling…");
  const answer = await call("POST", `/runs/${encodeURIComponent(openRun.id)}/cancel`);
  say("run-result", answer.ok ? `cancel requested (${answer.doc.state ?? "…"})` : errorText(answer));
  markDirty("runs");
}

// Answer the approval the open run waits on (`approve`, `approve` with
// `always`, or `deny` with the reason typed): the oldest one this page
// showed, named, so an answer given elsewhere meanwhile is not taken for
// the run's next question.
async function answerRun(verb, body) {
  if (!openRun) return;
  say("run-result", "answering…");
  const shown = (openRun.asked ?? [])[0];
  if (shown) body = { ...body, approval_id: shown };
  const answer = await call("POST", `/runs/${encodeURIComponent(openRun.id)}/${verb}`, body);
  say("run-result", answer.ok ? `${answer.doc.tool}: ${answer.doc.state}` : errorText(answer));
  markDirty("runs");
}

async function startRun(submit) {
  submit.preventDefault();
  const profile = byId("run-profile").value;
  if (!profile) return;
  const body = { profile };
  const prompt = byId("run-prompt").value;
  if (prompt.trim()) body.prompt = prompt;
  const workspace = byId("run-workspace").value;
  if (workspace) body.workspace = workspace;
  say("run-start-result", `starting ${profile}…`);
  const answer = await call("POST", "/runs", body);
  if (!answer.ok) {
    say("run-start-result", errorText(answer));
    return;
  }
  say("run-start-result", `started run ${answer.doc.run_id}`);
  markDirty("runs");
  showRun(answer.doc.run_id);
}

// ------------------------------------------------------------------- fleet

// The fleet panel is shown while the daemon fronts a fleet (`[store] url`)
// and read again every FLEET_REFRESH_MS while the page is visible.
function showFleet(on) {
  byId("fleet-section").hidden = !on;
  byId("fleet-link").hidden = !on;
  if (on && !fleetTimer) {
    fleetTimer = setInterval(() => { if (!document.hidden) markDirty("fleet"); }, FLEET_REFRESH_MS);
    markDirty("fleet");
  } else if (!on && fleetTimer) {
    clearInterval(fleetTimer);
    fleetTimer = null;
  }
}

function seconds(ms) {
  if (ms == null || isNaN(ms)) return "";
  const s = Math.max(0, ms) / 1000;
  if (s < 60) return `${s.toFixed(1)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${Math.round(s % 60)}s`;
  return `${Math.floor(s / 3600)}h ${Math.round((s % 3600) / 60)}m`;
}

async function refreshFleet() {
  const [roster, listed] = await Promise.all([
    call("GET", "/fleet/workers"),
    call("GET", `/fleet/runs?limit=${FLEET_RUNS_SHOWN}`),
  ]);
  const failed = !roster.ok ? roster : !listed.ok ? listed : null;
  if (failed) {
    say("fleet-note", errorText(failed));
    return;
  }
  say("fleet-note", "");
  say("fleet-name", roster.doc.fleet ?? "");
  const workers = roster.doc.workers || [];
  const runs = listed.doc.runs || [];
  const now = listed.doc.now_ms;
  fillTable("workers", workers.map((w) => ({
    key: w.id,
    cells: [
      w.id,
      w.state,
      w.host ?? "",
      w.version ?? "",
      `${seconds(w.heartbeat_age_ms)} ago`,
      (w.running || []).length === 0 ? "idle" : el("span", {}, ...w.running.map((id) =>
        el("a", { href: "#run", class: "run-link", "data-fleet-run": id }, id))),
    ],
  })), "no workers yet: start one with `npc worker` on a machine with a checkout");
  const waiting = runs.filter((r) => r.state === "queued");
  const oldest = waiting.reduce((min, r) => Math.min(min, r.enqueued_at_ms), now);
  say("fleet-summary", [
    `${workers.filter((w) => w.state === "alive").length} of ${workers.length} workers alive`,
    `${runs.filter((r) => r.state === "running").length} running`,
    `${waiting.length} queued` + (waiting.length ? ` (oldest waiting ${seconds(now - oldest)})` : ""),
  ].join(" · "));
  fleetDrawn = { workers, runs, now };
  drawFleetTimeline();
  if (openRun && openRun.fleet) {
    const mine = runs.find((r) => r.id === openRun.id);
    if (mine) showRunState(fleetRunView(mine));
    pollFleetRun();
  }
}

// An SVG element with attributes; text only through `textContent`.
function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  }
  if (text !== undefined) node.textContent = String(text);
  return node;
}

// The legends, drawn once, and the queued hatch pattern every queued
// segment fills with (in an SVG of no size of its own, outside any panel
// that may be hidden, where a pattern would not paint).
function drawLegends() {
  const pattern = svg("pattern", {
    id: "queued-hatch", width: 4, height: 4, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)",
  });
  pattern.append(svg("rect", { width: 1.5, height: 4, class: "hatch-line" }));
  const defs = svg("svg", { width: 0, height: 0, class: "svg-defs", "aria-hidden": "true" });
  defs.append(svg("defs"));
  defs.firstChild.append(pattern);
  document.body.append(defs);
  const swatch = (cls) => {
    const box = svg("svg", { width: 14, height: 10 });
    box.append(svg("rect", { width: 14, height: 10, class: cls }));
    return box;
  };
  for (const legend of document.querySelectorAll(".legend")) {
    // A legend naming its states (the workflow graph's) has only those.
    const own = legend.getAttribute("data-outcomes");
    const outcomes = own ? own.split(" ") : OUTCOMES;
    legend.replaceChildren(
      ...(own ? [] : [el("span", {}, swatch("queued-segment"), "queued (enqueue → start)")]),
      ...outcomes.map((o) => el("span", { "data-outcome": o }, swatch("outcome-" + o), o.replace("_", " "))));
  }
}

// The fleet's timeline: one lane per worker (the roster's, then owners no
// longer on it), and a lane for runs no worker holds yet.
function drawFleetTimeline() {
  const { workers, runs, now } = fleetDrawn;
  const lanes = workers.map((w) => ({ id: w.id, state: w.state, label: w.state === "alive" ? w.id : `${w.id} (${w.state})` }));
  for (const r of runs) {
    if (r.owner && !lanes.some((l) => l.id === r.owner)) lanes.push({ id: r.owner, state: "gone", label: `${r.owner} (gone)` });
  }
  if (runs.some((r) => !r.owner)) lanes.push({ id: "", state: "waiting", label: "queued, no worker yet" });
  drawTimeline(byId("timeline"), {
    lanes,
    runs: runs.map((r) => Object.assign({}, r, {
      lane: r.owner ?? "",
      about: [`${r.trigger} (${r.origin})`, r.owner ? `worker ${r.owner}` : "waiting for a worker", r.detail ? cut(r.detail) : ""],
    })),
    now,
    empty: "no workers and no runs yet",
  });
}

// A timeline into `host`: a lane per entry of `lanes` ({id, state, label});
// each run ({id, state, lane, enqueued_at_ms, started_at_ms,
// finished_at_ms, about: lines of its tooltip}) a bar in its lane from its
// start to its end (or now), coloured by outcome, after a hatched segment
// for its time queued. Runs of a lane that overlap get a track each in it.
// `onlyBusy`: a lane with no run in the window is left out.
function drawTimeline(host, { lanes, runs, now, empty, onlyBusy }) {
  const width = Math.max(host.clientWidth || TIMELINE_FALLBACK_WIDTH, LABEL_WIDTH + 200);
  const earliest = runs.reduce((min, r) => Math.min(min, r.enqueued_at_ms), now);
  const from = Math.max(now - TIMELINE_MAX_SPAN_MS, Math.min(earliest, now - TIMELINE_MIN_SPAN_MS));
  const plot = width - LABEL_WIDTH - 10;
  const x = (ms) => LABEL_WIDTH + ((Math.min(Math.max(ms, from), now) - from) / (now - from)) * plot;
  // Each lane's runs in the window, oldest first, each on the first track
  // free at its enqueue (in pixels, so bars never touch).
  const placed = lanes.map((lane) => {
    const ends = [];
    const mine = runs
      .filter((r) => r.lane === lane.id && (r.finished_at_ms ?? now) >= from)
      .sort((a, b) => a.enqueued_at_ms - b.enqueued_at_ms)
      .map((r) => {
        const left = x(r.enqueued_at_ms);
        const right = Math.max(x(r.finished_at_ms ?? now), x(r.started_at_ms ?? now) + MIN_BAR_WIDTH);
        let track = ends.findIndex((end) => end + 1 < left);
        if (track < 0) track = ends.length < MAX_TRACKS ? ends.length : MAX_TRACKS - 1;
        ends[track] = Math.max(ends[track] ?? 0, right);
        return { r, track };
      });
    return { lane, runs: mine, tracks: Math.max(ends.length, 1) };
  }).filter((l) => !onlyBusy || l.runs.length > 0);
  const rows = placed.reduce((n, l) => n + l.tracks, 0);
  const height = AXIS_HEIGHT + Math.max(rows, 1) * LANE_HEIGHT + 4;
  const root = svg("svg", { width, height, role: "img", "aria-label": "runs timeline" });
  // The time axis: a tick per step, as many as fit.
  const step = TICK_STEPS_MS.find((s) => (now - from) / s <= MAX_TICKS) || TICK_STEPS_MS[TICK_STEPS_MS.length - 1];
  for (let t = Math.ceil(from / step) * step; t <= now; t += step) {
    root.append(svg("line", { x1: x(t), x2: x(t), y1: AXIS_HEIGHT - 4, y2: height, class: "grid" }));
    if (x(t) + TICK_LABEL_WIDTH <= width) {
      root.append(svg("text", { x: x(t) + 2, y: AXIS_HEIGHT - 7, class: "tick" }, clock(new Date(t))));
    }
  }
  if (placed.length === 0) {
    root.append(svg("text", { x: 8, y: AXIS_HEIGHT + 17, class: "empty" }, empty));
  }
  let top = AXIS_HEIGHT;
  for (const { lane, runs: laneRuns, tracks } of placed) {
    const g = svg("g", { class: "lane", "data-lane": lane.id, "data-state": lane.state });
    g.append(svg("rect", { x: 0, y: top + 1, width, height: tracks * LANE_HEIGHT - 2, class: "lane-bg" }));
    const label = svg("text", { x: 6, y: top + LANE_HEIGHT / 2 + 4, class: "lane-label " + lane.state },
      lane.label.length > LANE_LABEL_CHARS ? lane.label.slice(0, LANE_LABEL_CHARS - 1) + "…" : lane.label);
    label.append(svg("title", {}, lane.label));
    g.append(label);
    for (const { r, track } of laneRuns) {
      const y = top + track * LANE_HEIGHT;
      const started = r.started_at_ms ?? null;
      const ended = r.finished_at_ms ?? now;
      const tip = [`${r.id} · ${r.state}`,
        `queued ${seconds((started ?? ended) - r.enqueued_at_ms)}` +
          (started != null ? ` · ran ${seconds(ended - started)}` : ""),
        ...(r.about || [])].filter(Boolean).join("\n");
      const queuedEnd = started ?? ended;
      if (queuedEnd > r.enqueued_at_ms) {
        const qx = x(r.enqueued_at_ms);
        const segment = svg("rect", {
          x: qx, y: y + (LANE_HEIGHT - QUEUED_HEIGHT) / 2, width: Math.max(x(queuedEnd) - qx, 1),
          height: QUEUED_HEIGHT, class: "queued-segment", "data-run": r.id,
        });
        segment.append(svg("title", {}, tip));
        g.append(segment);
      }
      if (started != null) {
        const bx = x(started);
        const bar = svg("rect", {
          x: bx, y: y + (LANE_HEIGHT - BAR_HEIGHT) / 2, width: Math.max(x(ended) - bx, MIN_BAR_WIDTH),
          height: BAR_HEIGHT, rx: 2, class: `bar outcome-${r.state}`, "data-run": r.id, "data-state": r.state,
        });
        bar.append(svg("title", {}, tip));
        g.append(bar);
      }
    }
    root.append(g);
    top += tracks * LANE_HEIGHT;
  }
  host.replaceChildren(root);
}

// A fleet run's listing as the run view's state line reads it.
function fleetRunView(r) {
  return {
    state: r.state,
    source: `${r.trigger} (${r.origin})`,
    profile: r.profile,
    detail: [r.owner ? `worker ${r.owner}` : "no worker yet", r.detail].filter(Boolean).join(" · "),
  };
}

function showFleetRun(id) {
  openRunView(id, true);
  const mine = fleetDrawn && fleetDrawn.runs.find((r) => r.id === String(id));
  if (mine) showRunState(fleetRunView(mine));
  byId("run-cancel").hidden = true;
  pollFleetRun();
}

// Draw the open fleet run's events recorded since the last one drawn.
async function pollFleetRun() {
  const run = openRun;
  if (!run || !run.fleet || run.polling) return;
  run.polling = true;
  try {
    for (let page = 0; page < MAX_RUN_EVENT_PAGES; page++) {
      const answer = await call("GET",
        `/fleet/events?run=${encodeURIComponent(run.id)}&after=${run.lastId}&limit=${RUN_EVENTS_PAGE}`);
      if (!answer.ok || openRun !== run) return;
      const got = answer.doc.events || [];
      for (const event of got) drawRunEvent(event);
      if (got.length < RUN_EVENTS_PAGE) return;
    }
  } finally {
    run.polling = false;
  }
}

// ------------------------------------------------------------------- panes

let panes = [];

async function refreshPanes() {
  const answer = await call("GET", "/panes");
  if (!answer.ok) {
    say("panes-note", answer.status === 404 ? "this daemon lists no panes over the API" : errorText(answer));
    return;
  }
  say("panes-note", "");
  panes = answer.doc.panes || [];
  fillTable("panes", panes.map((p) => ({
    key: p.name,
    cells: [
      el("a", { href: "#pane", class: "pane-link", "data-pane": p.name }, p.name),
      p.state + (p.exit != null ? ` (${typeof p.exit === "string" ? p.exit : JSON.stringify(p.exit)})` : ""),
      p.generation ?? "",
      p.pid ?? "-",
      p.status == null ? "" : cut(typeof p.status === "string" ? p.status : JSON.stringify(p.status)),
      p.attention === true ? "needs attention" : p.attention ? cut(String(p.attention)) : "",
    ],
  })), "no panes");
  if (openPane) {
    const mine = panes.find((p) => p.name === openPane.name);
    say("pane-state", mine ? `${mine.state} · generation ${mine.generation}` : "not configured");
  }
}

function paneMessage(text) {
  say("pane-message", text);
}

function showPane(name) {
  closePane();
  byId("pane-view").hidden = false;
  say("pane-title", `Pane ${name}`);
  byId("pane-status").hidden = true;
  paneMessage("");
  const pane = panes.find((p) => p.name === name) || {};
  const host = byId("terminal");
  host.replaceChildren();
  let term = null;
  if (typeof Terminal === "function") {
    term = new Terminal({
      cols: pane.cols || 80,
      rows: pane.rows || 24,
      scrollback: TERMINAL_SCROLLBACK,
      fontSize: 13,
      cursorBlink: false,
    });
    term.open(host);
  } else {
    paneMessage("the terminal emulator did not load");
  }
  // `ended`: the pane's output ended (an `exited` frame); no reconnecting
  // until /restart or /relaunch opens it again.
  openPane = { name, term, socket: null, timer: null, pause: 250, ended: false };
  if (term) term.onData((data) => sendToPane(name, data));
  connectPane(openPane);
  refreshPanes().catch(() => {});
  byId("pane-input").focus();
}

function closePane() {
  if (!openPane) return;
  const pane = openPane;
  openPane = null;
  clearTimeout(pane.timer);
  detachSocket(pane);
  if (pane.term) pane.term.dispose();
}

// Drop the pane's terminal socket (its late frames and close are ignored).
function detachSocket(pane) {
  const old = pane.socket;
  pane.socket = null;
  clearTimeout(pane.timer);
  if (old) old.close();
}

function connectPane(pane) {
  detachSocket(pane);
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = `${scheme}//${location.host}/api/v1/panes/${encodeURIComponent(pane.name)}/terminal`;
  const protocols = ["npc.v1"];
  let socket;
  try {
    socket = new WebSocket(url, protocols);
  } catch (e) {
    paneMessage(`cannot open the terminal: ${e.message}`);
    return;
  }
  socket.binaryType = "arraybuffer";
  pane.socket = socket;
  socket.addEventListener("open", () => {
    if (openPane !== pane || pane.socket !== socket) return;
    pane.pause = 250;
    // The server starts with the scrollback: draw it on a clean screen.
    if (pane.term) pane.term.reset();
    byId("pane-view").setAttribute("data-connected", "true");
  });
  socket.addEventListener("message", (message) => {
    if (typeof message.data === "string") {
      let frame = {};
      try { frame = JSON.parse(message.data); } catch (_) { return; }
      if (openPane !== pane || pane.socket !== socket) return;
      if (frame.type === "exited") {
        pane.ended = true;
        paneMessage(`the pane exited${frame.exit != null ? " (" + JSON.stringify(frame.exit) + ")" : ""}; type /relaunch to start it again`);
        markDirty("panes");
      } else if (frame.type === "status") {
        paneMessage(`plugin status: ${frame.state ?? "?"}${frame.detail ? " — " + cut(String(frame.detail)) : ""}`);
        markDirty("panes");
      }
      return;
    }
    if (openPane === pane && pane.socket === socket && pane.term) {
      pane.term.write(new Uint8Array(message.data));
    }
  });
  socket.addEventListener("close", () => {
    if (openPane !== pane || pane.socket !== socket) return;
    byId("pane-view").setAttribute("data-connected", "false");
    pane.socket = null;
    if (pane.ended) return;
    pane.timer = setTimeout(() => {
      if (openPane === pane && !pane.ended && !pane.socket) connectPane(pane);
    }, pane.pause);
    pane.pause = Math.min(pane.pause * 2, RECONNECT_MAX_MS);
  });
}

// Send `data` to pane `name`: over its terminal socket when open, else by POST.
async function sendToPane(name, data) {
  for (let at = 0; at < data.length; at += MAX_INPUT_CHARS) {
    const piece = data.slice(at, at + MAX_INPUT_CHARS);
    const socket = openPane && openPane.name === name ? openPane.socket : null;
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "input", data: piece }));
    } else {
      const answer = await call("POST", `/panes/${encodeURIComponent(name)}/input`, { data: piece });
      if (!answer.ok) {
        paneMessage(errorText(answer));
        return;
      }
    }
  }
}

async function paneStatus(name) {
  const answer = await call("GET", "/panes");
  if (!answer.ok) return { error: errorText(answer) };
  const pane = (answer.doc.panes || []).find((p) => p.name === name);
  return pane ? { pane } : { error: `no pane \`${name}\`` };
}

// Close pane `name` (an already closed or exited one is fine) and open it
// again; why not, or null.
async function closeAndOpen(name) {
  const path = `/panes/${encodeURIComponent(name)}`;
  const closed = await call("POST", `${path}/close`);
  if (!closed.ok && closed.status !== 404 && closed.status !== 409) return errorText(closed);
  const opened = await call("POST", `${path}/open`);
  return opened.ok ? null : errorText(opened);
}

async function reopenPane(name, { onlyExited }) {
  const verb = onlyExited ? "relaunch" : "restart";
  const { pane, error } = await paneStatus(name);
  if (error) return paneMessage(`/${verb}: ${error}`);
  if (onlyExited && !PANE_ENDED.includes(pane.state)) {
    return paneMessage(`/relaunch: the pane is ${pane.state}, not exited; use /restart to close and open it`);
  }
  paneMessage(`${verb}ing ${name}…`);
  const viewing = openPane && openPane.name === name ? openPane : null;
  if (viewing) {
    // The old process's stream ends here; the new one is connected below.
    viewing.ended = true;
    detachSocket(viewing);
  }
  const failure = await closeAndOpen(name);
  paneMessage(failure ? `/${verb}: ${failure}` : `${name} ${verb}ed`);
  markDirty("panes");
  if (viewing && openPane === viewing) {
    viewing.ended = false;
    connectPane(viewing);
  }
}

async function showPaneStatus(name) {
  const { pane, error } = await paneStatus(name);
  const box = byId("pane-status");
  box.hidden = false;
  box.setAttribute("data-pane", name);
  if (error) {
    box.textContent = `/status: ${error}`;
    return;
  }
  box.setAttribute("data-pid", pane.pid ?? "");
  box.setAttribute("data-state", pane.state);
  const lines = [
    `pane ${pane.name} (${pane.id ?? "?"})`,
    `state ${pane.state} · generation ${pane.generation ?? "?"} · pid ${pane.pid ?? "-"} · ${pane.cols ?? "?"}×${pane.rows ?? "?"}`,
  ];
  if (pane.exit != null) lines.push(`exit ${JSON.stringify(pane.exit)}`);
  lines.push(`plugin status: ${pane.status == null ? "none" : JSON.stringify(pane.status)}`);
  lines.push(`attention: ${pane.attention ? "needs attention" : "none"}`);
  box.textContent = lines.join("\n");
}

// A line typed under the terminal: a dashboard slash command, or input.
function submitPaneLine(submit) {
  submit.preventDefault();
  if (!openPane) return;
  const input = byId("pane-input");
  const line = input.value;
  input.value = "";
  const name = openPane.name;
  const command = line.trim().split(/\s+/)[0];
  if (SLASH_COMMANDS.includes(command)) {
    // Intercepted: handled here, never sent to the pane.
    byId("pane-view").setAttribute("data-last-command", command);
    if (command === "/status") showPaneStatus(name);
    else reopenPane(name, { onlyExited: command === "/relaunch" });
    return;
  }
  sendToPane(name, line + "\r");
}

// --------------------------------------------------------------- workflows

// Whether a state may be a class name (the API's text is never trusted).
function stateClass(state) {
  return /^[a-z_]{1,32}$/.test(String(state)) ? String(state) : "unknown";
}

function short(text, n) {
  const s = String(text ?? "");
  return s.length > n ? s.slice(0, n - 1) + "…" : s;
}

async function refreshWorkflows() {
  const answer = await call("GET", "/workflows");
  if (!answer.ok) {
    say("workflows-note", answer.status === 404 ? "this daemon lists no workflows over the API" : errorText(answer));
  } else {
    say("workflows-note", "");
    const declared = (answer.doc.workflows || []).slice(0, MAX_WORKFLOWS_LISTED);
    // Drawn again only when the declarations change: a person may be
    // typing an input.
    const signature = JSON.stringify(declared);
    if (signature !== workflowsDeclared) {
      workflowsDeclared = signature;
      fillTable("workflows", declared.map((w) => ({
        key: w.name,
        cells: [w.name, (w.steps || []).join(" → "), w.description ?? "", workflowStart(w)],
      })), "no workflows; declare them under [workflows.NAME]");
    }
    fillTable("workflow-runs", (answer.doc.runs || []).map((r) => ({
      key: r.id,
      cells: [
        el("a", { href: "#workflow", class: "run-link", "data-workflow-run": r.id }, r.id),
        r.state,
        r.workflow,
        when(r.created_at_ms),
        when(r.finished_at_ms),
      ],
    })), "no workflow runs yet");
  }
  await refreshWorkflowView();
}

// A declared workflow's start: a field per input (left empty: its default)
// and a button.
function workflowStart(w) {
  const fields = (w.inputs || []).map((name) =>
    el("input", { type: "text", size: 14, placeholder: name, title: `input ${name}`, "data-input": name }));
  const cell = el("span", { class: "workflow-start", "data-workflow": w.name }, ...fields);
  cell.append(button("Start", () => startWorkflow(w.name, cell), { class: "start-workflow", "data-workflow": w.name }));
  return cell;
}

async function startWorkflow(name, cell) {
  const inputs = {};
  for (const field of cell.querySelectorAll("input[data-input]")) {
    if (field.value !== "") inputs[field.getAttribute("data-input")] = field.value;
  }
  say("workflow-start-result", `starting ${name}…`);
  const answer = await call("POST", `/workflows/${encodeURIComponent(name)}/runs`, { inputs });
  if (!answer.ok) {
    say("workflow-start-result", `${name}: ${errorText(answer)}`);
    return;
  }
  say("workflow-start-result", `${name} started: workflow run ${answer.doc.id}`);
  markDirty("workflows");
  showWorkflowRun(String(answer.doc.id));
}

function showWorkflowRun(id) {
  openWorkflow = { id, approvals: new Map() };
  const view = byId("workflow-view");
  view.hidden = false;
  view.setAttribute("data-workflow-run", id);
  say("workflow-title", id);
  say("workflow-state", "");
  say("workflow-result", "");
  say("workflow-detail", "");
  byId("workflow-graph").replaceChildren();
  view.scrollIntoView();
  refreshWorkflowView().catch(() => {});
}

// Read the open workflow run again and draw it.
async function refreshWorkflowView() {
  if (!openWorkflow) return;
  const mine = openWorkflow;
  const answer = await call("GET", `/workflow-runs/${encodeURIComponent(mine.id)}`);
  if (openWorkflow !== mine) return;
  if (!answer.ok) {
    say("workflow-result", errorText(answer));
    return;
  }
  const view = answer.doc;
  await readGateApprovals(mine, view);
  if (openWorkflow !== mine) return;
  say("workflow-title", `${view.workflow} ${view.id}`);
  const state = byId("workflow-state");
  state.textContent = view.state;
  state.className = "state-" + stateClass(view.state);
  byId("workflow-cancel").hidden = view.state !== "running";
  const inputs = Object.entries(view.inputs || {}).map(([k, v]) => `${k} ${typeof v === "string" ? v : JSON.stringify(v)}`);
  say("workflow-detail", cut([`started by ${view.origin}`, when(view.created_at_ms), ...inputs, view.detail ?? ""]
    .filter((part) => part !== "").join(" · ")));
  drawWorkflowGraph(view);
}

// The gates of `view` that wait: the step itself, or each instance of a
// fan-out (its run, and the instance's label).
function waitingGates(step) {
  const all = [step, ...(step.instances || [])];
  return all.filter((s) => s.state === "waiting" && typeof s.gate_run === "string").slice(0, MAX_GATES_DRAWN);
}

// The approval each waiting gate's run parked, from its `run.waiting`
// event (an answer names it, so it never answers a later question).
async function readGateApprovals(mine, view) {
  const gates = Object.values(view.steps || {}).flatMap(waitingGates)
    .map((s) => s.gate_run).filter((g) => !mine.approvals.has(g)).slice(0, MAX_GATES_DRAWN);
  for (const gate of gates) {
    const answer = await call("GET", `/runs/${encodeURIComponent(gate)}/events?limit=${RUN_EVENTS_PAGE}`);
    if (!answer.ok) continue;
    const waiting = (answer.doc.events || []).filter((e) => e.kind === "run.waiting").pop();
    if (waiting && waiting.payload && typeof waiting.payload.approval_id === "string") {
      mine.approvals.set(gate, waiting.payload.approval_id);
    }
  }
}

// A workflow run as a graph: a node per step in a column by the depth of
// its `needs`, an arrow per need, each node (and each instance of a
// fan-out) in its state's colour; a waiting gate offers Approve and Deny.
function drawWorkflowGraph(view) {
  const ids = Object.keys(view.steps || {}).slice(0, MAX_GRAPH_STEPS);
  const steps = new Map(ids.map((id) => [id, view.steps[id] || {}]));
  const needsOf = (id) => (Array.isArray(steps.get(id).needs) ? steps.get(id).needs : []).filter((n) => steps.has(n));
  const depth = new Map();
  const depthOf = (id, seen) => {
    if (depth.has(id)) return depth.get(id);
    // A cycle (never in a validated manifest) goes no deeper.
    if (seen.has(id)) return 0;
    seen.add(id);
    const needs = needsOf(id);
    const d = needs.length ? 1 + Math.max(...needs.map((n) => depthOf(n, seen))) : 0;
    seen.delete(id);
    depth.set(id, d);
    return d;
  };
  const columns = [];
  for (const id of ids) {
    const d = depthOf(id, new Set());
    (columns[d] = columns[d] || []).push(id);
  }
  const place = new Map();
  let width = 0;
  let height = 0;
  columns.forEach((column, d) => {
    let y = GRAPH_PAD;
    for (const id of column || []) {
      const h = nodeHeight(steps.get(id));
      const x = GRAPH_PAD + d * (NODE_WIDTH + COLUMN_GAP);
      place.set(id, { x, y, h });
      y += h + NODE_GAP;
      width = Math.max(width, x + NODE_WIDTH + GRAPH_PAD);
      height = Math.max(height, y - NODE_GAP + GRAPH_PAD);
    }
  });
  const root = svg("svg", { width: Math.max(width, 1), height: Math.max(height, 1), class: "workflow-graph", "data-workflow-run": view.id });
  const marker = svg("marker", { id: "workflow-arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrow" }));
  const defs = svg("defs");
  defs.append(marker);
  root.append(defs);
  for (const id of ids) {
    const to = place.get(id);
    for (const need of needsOf(id)) {
      const from = place.get(need);
      const x1 = from.x + NODE_WIDTH;
      const y1 = from.y + NODE_HEADER / 2;
      const x2 = to.x;
      const y2 = to.y + NODE_HEADER / 2;
      const mid = (x1 + x2) / 2;
      root.append(svg("path", {
        class: "edge", "data-from": need, "data-to": id, "marker-end": "url(#workflow-arrow)",
        d: `M ${x1} ${y1} C ${mid} ${y1}, ${mid} ${y2}, ${x2} ${y2}`,
      }));
    }
  }
  for (const id of ids) root.append(drawStep(id, steps.get(id), place.get(id)));
  byId("workflow-graph").replaceChildren(root);
}

function nodeHeight(step) {
  const instances = (step.instances || []).length;
  const shown = Math.min(instances, MAX_INSTANCES_DRAWN);
  const more = instances > shown ? 1 : 0;
  return NODE_HEADER + (shown + more) * INSTANCE_HEIGHT + waitingGates(step).length * GATE_ROW + NODE_PAD;
}

// A matrix entry as words: `task lexer · size big`.
function matrixText(matrix) {
  if (matrix == null || typeof matrix !== "object") return "";
  return Object.entries(matrix).map(([k, v]) => `${k} ${typeof v === "string" ? v : JSON.stringify(v)}`).join(" · ");
}

function drawStep(id, step, at) {
  const state = stateClass(step.state);
  const instances = Array.isArray(step.instances) ? step.instances : [];
  const g = svg("g", { class: "node", "data-step": id, "data-state": state, transform: `translate(${at.x},${at.y})` });
  if (typeof step.run === "string") g.setAttribute("data-run", step.run);
  const about = [`step ${id}`, `state ${step.state}`];
  if (step.run) about.push(`run ${step.run}`);
  if (step.gate_run) about.push(`gate run ${step.gate_run}`);
  if (step.branch) about.push(`branch ${step.branch}`);
  if ((step.needs || []).length) about.push(`needs ${step.needs.join(", ")}`);
  if (step.detail) about.push(String(step.detail));
  g.append(svg("title", {}, cut(about.join("\n"))));
  g.append(svg("rect", { class: "node-box outcome-" + state, width: NODE_WIDTH, height: at.h, rx: 6 }));
  g.append(svg("text", { class: "node-label", x: 8, y: 17 }, short(id, NODE_LABEL_CHARS)));
  const sub = instances.length ? `${step.state} · ${instances.length} instances`
    : step.branch ? `${step.state} · ${step.branch}` : String(step.state ?? "");
  g.append(svg("text", { class: "node-sub", x: 8, y: 34 }, short(sub, NODE_SUB_CHARS)));
  let y = NODE_HEADER;
  instances.slice(0, MAX_INSTANCES_DRAWN).forEach((instance, i) => {
    const s = stateClass(instance.state);
    const row = svg("g", { class: "instance", "data-instance": i, "data-state": s, transform: `translate(8,${y})` });
    if (typeof instance.run === "string") row.setAttribute("data-run", instance.run);
    const label = matrixText(instance.matrix) || `instance ${i}`;
    row.append(svg("title", {}, cut(`${label}\nstate ${instance.state}${instance.run ? "\nrun " + instance.run : ""}${instance.branch ? "\nbranch " + instance.branch : ""}${instance.detail ? "\n" + instance.detail : ""}`)));
    row.append(svg("rect", { class: "instance-box outcome-" + s, width: NODE_WIDTH - 16, height: INSTANCE_HEIGHT - 3, rx: 3 }));
    row.append(svg("text", { x: 5, y: INSTANCE_HEIGHT - 7 }, short(`${label} · ${instance.state}`, NODE_SUB_CHARS)));
    g.append(row);
    y += INSTANCE_HEIGHT;
  });
  if (instances.length > MAX_INSTANCES_DRAWN) {
    g.append(svg("text", { class: "more", x: 8, y: y + INSTANCE_HEIGHT - 6 }, `+${instances.length - MAX_INSTANCES_DRAWN} more`));
    y += INSTANCE_HEIGHT;
  }
  for (const gate of waitingGates(step)) {
    const row = svg("g", { class: "gate", "data-gate-run": gate.gate_run, transform: `translate(8,${y + 2})` });
    const approval = openWorkflow && openWorkflow.approvals.get(gate.gate_run);
    if (approval) row.setAttribute("data-approval-id", approval);
    row.append(gateButton("Approve", "approve", gate.gate_run, 0));
    row.append(gateButton("Deny", "deny", gate.gate_run, GATE_BUTTON_WIDTH + 6));
    g.append(row);
    y += GATE_ROW;
  }
  return g;
}

// A button drawn in the graph: `verb` (`approve`, `deny`) for `gate`.
function gateButton(label, verb, gate, x) {
  const b = svg("g", {
    class: "gate-button " + verb, role: "button", tabindex: 0, "data-verb": verb, "data-gate-run": gate,
    transform: `translate(${x},0)`, "aria-label": `${label} the gate ${gate}`,
  });
  b.append(svg("rect", { width: GATE_BUTTON_WIDTH, height: GATE_ROW - 6, rx: 4 }));
  b.append(svg("text", { x: GATE_BUTTON_WIDTH / 2, y: GATE_ROW - 11, "text-anchor": "middle" }, label));
  return b;
}

async function answerGate(verb, gate) {
  const approval = openWorkflow && openWorkflow.approvals.get(gate);
  const body = approval ? { approval_id: approval } : {};
  if (verb === "deny") body.reason = "denied from the dashboard";
  say("workflow-result", `${verb === "approve" ? "approving" : "denying"} gate ${gate}…`);
  const answer = await call("POST", `/runs/${encodeURIComponent(gate)}/${verb}`, body);
  say("workflow-result", answer.ok ? `gate ${gate}: ${answer.doc.state}` : errorText(answer));
  markDirty("workflows", "runs");
}

async function cancelWorkflow() {
  if (!openWorkflow) return;
  const id = openWorkflow.id;
  say("workflow-result", `cancelling ${id}…`);
  const answer = await call("POST", `/workflow-runs/${encodeURIComponent(id)}/cancel`);
  say("workflow-result", answer.ok ? `${id}: ${answer.doc.state}` : errorText(answer));
  markDirty("workflows", "runs");
}

// ------------------------------------------------------------ live events

// Notices: `notice*` events and `pane.notice` (a pane entering
// `needs_attention`, or a plugin's attention request; the `pane.status` and
// `pane.attention` events behind them are not repeated here).
function isNotice(event) {
  const p = event.payload || {};
  return event.kind === "notice" || event.kind.startsWith("notice.") ||
    event.kind === "pane.notice" || p.needs_attention === true;
}

function noticeText(event) {
  const p = event.payload || {};
  const what = p.reason ?? p.message ?? p.detail ?? fieldsText(p);
  return `${when(event.ts_ms)} ${event.component ?? event.kind}: ${what}${p.plugin ? " (plugin " + p.plugin + ")" : ""}`;
}

function markDirty(...parts) {
  for (const part of parts) dirty.add(part);
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(refresh, REFRESH_DEBOUNCE_MS);
}

function refresh() {
  const parts = [...dirty];
  dirty.clear();
  const work = {
    status: refreshStatus, plan: refreshPlan, plugins: refreshPlugins, triggers: refreshTriggers,
    runs: refreshRuns, panes: refreshPanes, fleet: refreshFleet, workflows: refreshWorkflows,
  };
  for (const part of parts) work[part]().catch(() => {});
}

// Which parts of the page an event makes stale.
function staleParts(kind) {
  if (kind.startsWith("agent.")) return [];
  if (kind.startsWith("workflow.")) return ["workflows"];
  // A step is a run: the open workflow run moves with its runs.
  if (kind.startsWith("run.")) return ["runs", "triggers"].concat(openWorkflow ? ["workflows"] : []);
  if (kind.startsWith("trigger.")) return ["triggers", "runs"];
  if (kind.startsWith("pane")) return ["panes", "status"];
  if (["manifest.", "reload", "plugin", "files.", "component."].some((p) => kind.startsWith(p))) {
    return ["status", "plan", "plugins", "triggers", "panes"];
  }
  return ["status", "plan", "triggers", "panes"];
}

function onEvent(event) {
  lastEventId = Math.max(lastEventId, event.id);
  const list = byId("events");
  list.prepend(el("li", { "data-kind": event.kind },
    el("span", { class: "when" }, when(event.ts_ms)), " ",
    el("span", { class: "kind" }, event.kind),
    event.component ? el("span", { class: "component" }, " " + event.component) : "",
    " ", fieldsText(event.payload)));
  while (list.children.length > MAX_EVENTS_SHOWN) list.lastChild.remove();
  if (event.kind === "manifest.invalid") showDiagnostics(event.payload && event.payload.report);
  if (event.kind === "manifest.valid") showDiagnostics(null);
  if (isNotice(event)) {
    const notices = byId("notice-list");
    notices.prepend(el("li", { "data-kind": event.kind }, noticeText(event)));
    while (notices.children.length > MAX_NOTICES_SHOWN) notices.lastChild.remove();
    byId("notices").hidden = false;
  }
  if (belongsToOpenRun(event)) {
    if (openRun.early) {
      openRun.early.push(event);
      if (openRun.early.length > MAX_RUN_EVENTS_SHOWN) openRun.early.shift();
    }
    else drawRunEvent(event);
  }
  markDirty(...staleParts(event.kind));
}

function setLive(on) {
  const badge = byId("live");
  badge.textContent = on ? "live" : "offline";
  badge.className = "badge " + (on ? "on" : "off");
}

async function follow() {
  let pause = 250;
  for (;;) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (lastEventId) headers["Last-Event-ID"] = String(lastEventId);
      const response = await api("/events/stream", { headers });
      if (!response.ok || !response.body) throw new Error("stream " + response.status);
      setLive(true);
      pause = 250;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = frame.split("\n").filter((l) => l.startsWith("data:"))
            .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
          if (data) onEvent(JSON.parse(data));
        }
      }
    } catch (_) {
      // fall through to the reconnect
    }
    setLive(false);
    await new Promise((r) => setTimeout(r, pause));
    pause = Math.min(pause * 2, RECONNECT_MAX_MS);
  }
}

// ------------------------------------------------------------------ wiring

byId("apply").addEventListener("click", async () => {
  say("apply-result", "applying…");
  const answer = await call("POST", "/apply");
  say("apply-result", answer.ok ? "applied" : errorText(answer));
  markDirty("status", "plan");
});
byId("run-form").addEventListener("submit", startRun);
byId("run-cancel").addEventListener("click", cancelRun);
byId("run-approve").addEventListener("click", () => answerRun("approve", { always: false }));
byId("run-approve-always").addEventListener("click", () => answerRun("approve", { always: true }));
byId("run-deny").addEventListener("click", () => {
  const reason = byId("run-deny-reason").value.trim();
  answerRun("deny", reason ? { reason } : {});
});
byId("run-diff").addEventListener("click", showDiff);
byId("run-close").addEventListener("click", () => {
  openRun = null;
  byId("run-view").hidden = true;
});
byId("pane-form").addEventListener("submit", submitPaneLine);
byId("pane-close").addEventListener("click", () => {
  closePane();
  byId("pane-view").hidden = true;
});
// Links: open a run or a pane, or scroll to a section.
document.addEventListener("click", (click) => {
  const link = click.target.closest && click.target.closest("a[href^='#']");
  if (!link) return;
  click.preventDefault();
  if (link.hasAttribute("data-run")) showRun(link.getAttribute("data-run"));
  else if (link.hasAttribute("data-fleet-run")) showFleetRun(link.getAttribute("data-fleet-run"));
  else if (link.hasAttribute("data-pane")) showPane(link.getAttribute("data-pane"));
  else if (link.hasAttribute("data-workflow-run")) showWorkflowRun(link.getAttribute("data-workflow-run"));
  else {
    const target = document.getElementById(link.getAttribute("href").slice(1));
    if (target) target.scrollIntoView();
  }
});

// A bar of a timeline opens its run (the fleet's, from the shared log).
byId("timeline").addEventListener("click", (click) => {
  const bar = click.target.closest && click.target.closest("[data-run]");
  if (bar) showFleetRun(bar.getAttribute("data-run"));
});
byId("runs-timeline").addEventListener("click", (click) => {
  const bar = click.target.closest && click.target.closest("[data-run]");
  if (bar) showRun(bar.getAttribute("data-run"));
});
// The workflow graph: a gate's button answers it, a step opens its run.
function onGraph(event) {
  const target = event.target.closest && event.target.closest("[data-verb], [data-run]");
  if (!target) return;
  if (target.hasAttribute("data-verb")) answerGate(target.getAttribute("data-verb"), target.getAttribute("data-gate-run"));
  else showRun(target.getAttribute("data-run"));
}
byId("workflow-graph").addEventListener("click", onGraph);
byId("workflow-graph").addEventListener("keydown", (key) => {
  if (key.key === "Enter" || key.key === " ") {
    key.preventDefault();
    onGraph(key);
  }
});
byId("workflow-cancel").addEventListener("click", cancelWorkflow);
byId("workflow-close").addEventListener("click", () => {
  openWorkflow = null;
  byId("workflow-view").hidden = true;
});
window.addEventListener("resize", () => {
  if (fleetDrawn && !byId("fleet-section").hidden) drawFleetTimeline();
  drawRunsTimeline();
});
drawLegends();

redeemCode().then(() => {
  markDirty("status", "plan", "plugins", "triggers", "runs", "panes", "workflows");
  follow();
  if (linkedRun) showRun(linkedRun);
});
