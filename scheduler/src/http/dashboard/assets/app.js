// herald dashboard: reads /dashboard/api/* and renders with plain DOM calls. Every value from
// the server is set with textContent, never innerHTML: recipients, content and provider errors
// are data from outside.
"use strict";

const params = new URLSearchParams(location.search);
// The browser's own zone unless ?tz= says otherwise, so "today" is the operator's day.
const tz = params.get("tz") || Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
// The namespace asked for (?ns=, as the console's links pass it); the token's default without.
const ns = params.get("ns") || "";
const REFRESH_MS = 10000;
const SVG = "http://www.w3.org/2000/svg";

let failureCursor = null;
// Set once "More" was used: the timed refresh then leaves the longer list alone.
let failuresExpanded = false;

// An API path with the page's namespace, so every figure and action is the namespace shown.
function api(path, query) {
  const q = new URLSearchParams(query || {});
  if (ns) q.set("ns", ns);
  const s = q.toString();
  return s ? `api/${path}?${s}` : `api/${path}`;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function setText(id, value) {
  document.getElementById(id).textContent = String(value);
}

// Whether the page could load its figures; cleared by the next load that works.
function status(text, isError) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = isError ? "error" : "muted";
}

// What the operator's last action did, apart from the load status so neither hides the other.
function action(text, isError) {
  const a = document.getElementById("action");
  a.textContent = text;
  a.className = isError ? "error" : "muted";
}

async function getJson(path) {
  const response = await fetch(path, { headers: { accept: "application/json" } });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || `${path}: HTTP ${response.status}`);
  return body;
}

function ms(value) {
  if (value < 1000) return `${Math.round(value)} ms`;
  if (value < 60000) return `${(value / 1000).toFixed(1)} s`;
  return `${(value / 60000).toFixed(1)} min`;
}

function localTime(iso, withDate) {
  const options = { timeZone: tz, hour: "2-digit", minute: "2-digit" };
  if (withDate) Object.assign(options, { month: "short", day: "numeric", second: "2-digit" });
  return new Date(iso).toLocaleString(undefined, options);
}

function renderCounts(counts, today) {
  for (const state of ["scheduled", "leased", "succeeded", "failed", "expired", "cancelled"]) {
    setText(`count-${state}`, counts[state]);
  }
  setText("count-pending", counts.scheduled + counts.leased);
  // Why tasks ended: exhausted and skipped (suppressed, duplicate) apart from plain failures.
  for (const reason of ["exhausted", "permanent_error", "invalid_recipient",
                        "failed_after_acceptance", "suppressed", "duplicate_content"]) {
    setText(`reason-${reason}`, (counts.reasons || {})[reason] || 0);
  }
  setText("window", `today in ${today.time_zone}: ${localTime(today.start, true)} – ${localTime(today.end, true)}`);
}

function renderChart(perMinute) {
  const width = 720, height = 170, left = 32, bottom = 20, top = 8;
  const max = Math.max(1, ...perMinute.map((m) => m.sent + m.failed));
  const slot = (width - left) / perMinute.length;
  const scale = (height - bottom - top) / max;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "sends (green) and failures (red) per minute, last 60 minutes" });
  root.append(svg("line", { x1: left, y1: height - bottom, x2: width, y2: height - bottom }));
  const axis = svg("text", { x: 0, y: top + 8 });
  axis.textContent = String(max);
  root.append(axis);
  perMinute.forEach((m, i) => {
    const x = left + i * slot + 1;
    const w = Math.max(1, slot - 2);
    const sentH = m.sent * scale, failedH = m.failed * scale;
    const title = svg("title", {});
    // Attempts that did not send: most are retried (throttled, a number offline for a
    // while), so this is not the failed count above, which counts tasks.
    title.textContent = `${localTime(m.minute)}: ${m.sent} sent, ${m.failed} not sent`;
    const group = svg("g", {});
    group.append(title);
    if (m.sent) group.append(svg("rect", { class: "sent", x, width: w, y: height - bottom - sentH, height: sentH }));
    if (m.failed) group.append(svg("rect", { class: "failed", x, width: w,
      y: height - bottom - sentH - failedH, height: failedH }));
    root.append(group);
    if (i % 10 === 0 || i === perMinute.length - 1) {
      // The last label ends at the edge instead of running past it.
      const last = i === perMinute.length - 1;
      const label = svg("text", last ? { x: width, y: height - 5, "text-anchor": "end" } : { x, y: height - 5 });
      label.textContent = localTime(m.minute);
      root.append(label);
    }
  });
  document.getElementById("chart").replaceChildren(root);
}

function renderAccounts(accounts) {
  const body = document.querySelector("#accounts tbody");
  if (!accounts.length) {
    body.replaceChildren(el("tr", {}, el("td", { colSpan: 5, class: "muted" }, "no attempts today")));
    return;
  }
  body.replaceChildren(...accounts.map((a) => {
    const pct = (a.success_rate * 100).toFixed(1);
    const bar = el("span", { class: "bar" });
    bar.style.width = `${Math.round(a.success_rate * 80)}px`;
    return el("tr", { "data-account": a.account },
      el("td", {}, a.account || "(by queue)"),
      el("td", { class: "num" }, String(a.attempts)),
      el("td", { class: "num" }, String(a.succeeded)),
      el("td", { class: "num" }, String(a.failed)),
      el("td", {}, bar, `${pct} %`));
  }));
}

function renderDelivery(d) {
  for (const k of ["accepted", "delivered", "read", "failed_after_acceptance"]) {
    setText(`delivery-${k}`, d[k]);
  }
  setText("delivery-p50", d.latency_count ? ms(d.p50_ms) : "–");
  setText("delivery-p95", d.latency_count ? ms(d.p95_ms) : "–");
  setText("delivery-p99", d.latency_count ? ms(d.p99_ms) : "–");
}

function renderLag(lag) {
  setText("lag-p50", ms(lag.p50_ms));
  setText("lag-p90", ms(lag.p90_ms));
  setText("lag-p99", ms(lag.p99_ms));
  setText("lag-max", ms(lag.max_ms));
  setText("lag-count", lag.count);
}

function failureRow(f) {
  const button = el("button", { type: "button", class: "retry", "data-task-id": f.task_id }, "Retry");
  if (f.state !== "failed") {
    button.disabled = true;
    button.title = "only failed tasks can be retried";
  }
  button.addEventListener("click", () => retry(f.task_id, button));
  return el("tr", { "data-task-id": f.task_id, "data-state": f.state },
    el("td", { title: f.finished_at }, localTime(f.finished_at, true)),
    el("td", {}, f.queue),
    el("td", {}, f.recipient),
    el("td", { class: "content", title: JSON.stringify(f.labels) }, f.content),
    el("td", {}, f.account || ""),
    el("td", {}, f.state === "expired" ? `EXPIRED ${f.outcome}` : f.outcome),
    el("td", { class: "error" }, f.error || ""),
    el("td", { class: "num" }, String(f.attempts)),
    el("td", {}, button));
}

function failureQuery() {
  const q = new URLSearchParams({ tz });
  for (const [k, v] of new FormData(document.getElementById("filters"))) if (v) q.set(k, v);
  return q;
}

async function loadFailures(append) {
  const q = failureQuery();
  if (append && failureCursor) q.set("cursor", failureCursor);
  const data = await getJson(api("failures", q));
  const body = document.querySelector("#failures tbody");
  const rows = data.failures.map(failureRow);
  if (append) body.append(...rows);
  else if (rows.length) body.replaceChildren(...rows);
  else body.replaceChildren(el("tr", {}, el("td", { colSpan: 9, class: "muted" }, "no failures today")));
  failureCursor = data.next_cursor;
  document.getElementById("more").hidden = !failureCursor;
}

async function retry(id, button) {
  button.disabled = true;
  button.textContent = "Retrying…";
  try {
    const response = await fetch(api(`tasks/${encodeURIComponent(id)}/retry`), {
      method: "POST",
      // The server refuses retries without this header, which cross-site forms cannot send.
      headers: { "x-herald-dashboard": "1" },
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
    button.textContent = "Retried";
    button.closest("tr").dataset.retried = body.state;
    action(`task ${id} is ${body.state} again`, false);
  } catch (e) {
    button.textContent = "Retry";
    button.disabled = false;
    action(`retry failed: ${e.message}`, true);
  }
}

async function refresh() {
  try {
    const data = await getJson(api("overview", { tz }));
    setText("namespace", `namespace ${data.namespace}`);
    renderCounts(data.counts, data.today);
    renderChart(data.per_minute);
    renderAccounts(data.accounts);
    renderLag(data.lag);
    renderDelivery(data.delivery);
    if (!failuresExpanded) await loadFailures(false);
    // Tests and scripts wait on this instead of sleeping.
    document.body.dataset.loaded = "1";
    document.body.dataset.refreshedAt = data.now;
    status(`updated ${localTime(data.now, true)}`, false);
  } catch (e) {
    status(`cannot load: ${e.message}`, true);
  }
}

document.getElementById("filters").addEventListener("submit", (event) => {
  event.preventDefault();
  failuresExpanded = false;
  loadFailures(false).catch((e) => status(`cannot load failures: ${e.message}`, true));
});
document.getElementById("more").addEventListener("click", () => {
  failuresExpanded = true;
  loadFailures(true).catch((e) => status(`cannot load failures: ${e.message}`, true));
});
refresh();
setInterval(refresh, REFRESH_MS);
