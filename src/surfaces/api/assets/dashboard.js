// npc dashboard: one page over the daemon's REST API (/api/v1). No
// framework, no CDN. A token, when the daemon needs one, is read from the
// URL fragment (#token=...) and sent as a bearer header only; events come
// from the SSE stream read with fetch (so the header can be sent), resumed
// after the last id seen when the connection drops.
"use strict";

const MAX_EVENTS_SHOWN = 200;
const REFRESH_DEBOUNCE_MS = 150;
const RECONNECT_MAX_MS = 5000;

const token = new URLSearchParams(location.hash.slice(1)).get("token");
let lastEventId = 0;
let refreshTimer = null;

function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  if (token) headers["Authorization"] = "Bearer " + token;
  return fetch("/api/v1" + path, Object.assign({}, options, { headers }));
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const child of children) node.append(child == null ? "" : String(child));
  return node;
}

function fillTable(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows.map((cells) => {
    const tr = el("tr");
    cells.forEach((cell, i) => {
      const td = el("td", i === 1 ? { class: "state-" + String(cell).split(" ")[0] } : {}, cell);
      tr.append(td);
    });
    return tr;
  }));
}

function showDiagnostics(report) {
  const list = document.getElementById("diagnostics");
  const diagnostics = (report && report.diagnostics) || [];
  list.replaceChildren(...diagnostics.map((d) => {
    const where = d.range ? `${d.range.start.line}:${d.range.start.column}` : "";
    return el("li", { "data-line": d.range ? d.range.start.line : "" },
      `${where} ${d.severity}: ${d.summary}${d.detail ? " — " + d.detail : ""}`);
  }));
  document.getElementById("invalid").hidden = diagnostics.length === 0;
}

async function refreshStatus() {
  const response = await api("/status");
  if (!response.ok) return;
  const status = await response.json();
  document.getElementById("daemon").textContent = `daemon pid ${status.pid}`;
  fillTable("components", (status.components || []).map((c) =>
    [c.id, c.state, c.pid ?? "-", c.restarts ?? 0, c.since ?? ""]));
  const servers = (status.mcp && status.mcp.servers) || [];
  fillTable("mcp", servers.map((s) =>
    [s.name ?? s.server ?? "", s.state ?? "", s.tools ?? s.tool_count ?? "", s.last_call ?? ""]));
}

async function refreshPlan() {
  const response = await api("/plan");
  const doc = await response.json();
  const section = document.getElementById("plan");
  if (response.status === 422) {
    showDiagnostics(doc.error && doc.error.detail && doc.error.detail.report);
    section.hidden = true;
    return;
  }
  showDiagnostics(null);
  if (!response.ok) return;
  const changes = (doc.actions || []).filter((a) => a.action !== "no-op");
  section.hidden = changes.length === 0;
  const s = doc.summary || {};
  document.getElementById("plan-summary").textContent =
    `${s.add} to add, ${s.update} to change, ${s.replace} to replace, ${s.remove} to remove` +
    (s.refused ? `, ${s.refused} refused` : "");
  document.getElementById("plan-actions").replaceChildren(...changes.map((a) =>
    el("li", {}, `${a.symbol} ${a.id}${a.cause ? " — " + a.cause : ""}`)));
}

function refresh() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => {
    refreshStatus().catch(() => {});
    refreshPlan().catch(() => {});
  }, REFRESH_DEBOUNCE_MS);
}

function onEvent(event) {
  lastEventId = Math.max(lastEventId, event.id);
  const list = document.getElementById("events");
  const line = `#${event.id} ${event.kind}${event.component ? " " + event.component : ""} ${JSON.stringify(event.payload)}`;
  list.prepend(el("li", { "data-kind": event.kind }, line));
  while (list.children.length > MAX_EVENTS_SHOWN) list.lastChild.remove();
  if (event.kind === "manifest.invalid") {
    showDiagnostics(event.payload && event.payload.report);
  }
  if (event.kind.startsWith("notice.") || (event.payload && event.payload.needs_attention)) {
    const notices = document.getElementById("notice-list");
    notices.prepend(el("li", {}, line));
    document.getElementById("notices").hidden = false;
  }
  refresh();
}

function setLive(on) {
  const badge = document.getElementById("live");
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

document.getElementById("apply").addEventListener("click", async () => {
  const result = document.getElementById("apply-result");
  result.textContent = "applying…";
  const response = await api("/apply", { method: "POST" });
  const doc = await response.json().catch(() => ({}));
  result.textContent = response.ok ? "applied" : (doc.error ? doc.error.message : "failed");
  refresh();
});

refresh();
follow();
