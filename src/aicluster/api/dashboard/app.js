// aicluster dashboard: a single page over the JSON API. Signing in hands the token to the server
// once (POST /v1/ui/session), which keeps it in an HttpOnly, SameSite=Strict cookie that no script
// can read; calls that change state carry the session's CSRF token (kept in sessionStorage).
// Nothing here bypasses the API's authorization.
// Views re-read their data every POLL_MS while visible. All text from the API is escaped.
"use strict";

const POLL_MS = 2000;
const CSRF_KEY = "aicluster.csrf";
const SAFE_METHODS = new Set(["GET", "HEAD", "OPTIONS"]);
const STATES = ["PENDING", "STARTING", "RUNNING", "PREEMPTING", "RESTARTING", "SUCCEEDED", "FAILED", "CANCELLED"];
const STATE_COLORS = {
  PENDING: "#b8c0cc", STARTING: "#6d9cf0", RUNNING: "#2fb36b", PREEMPTING: "#f0b23a",
  RESTARTING: "#f08a3a", SUCCEEDED: "#3aa0e0", FAILED: "#e05252", CANCELLED: "#9a9a9a",
};
const HUES = [214, 150, 28, 280, 350, 190, 95, 45, 320, 250];

const $ = (selector, root = document) => root.querySelector(selector);
const esc = (value) => String(value ?? "").replace(/[&<>"']/g, (c) => (
  { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const fmt = (n, digits = 0) => (n == null || Number.isNaN(n) ? "–" : Number(n).toLocaleString("en-US", {
  maximumFractionDigits: digits, minimumFractionDigits: digits }));
// A duration for people: milliseconds below 1 s and tenths below 10 s (a short job's 0.4 s of
// work is not "0 s").
const ago = (seconds) => {
  if (seconds == null) return "–";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 10) return `${seconds.toFixed(1)} s`;
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} d`;
};
const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");
const badge = (state) => `<span class="badge s-${esc(state)}">${esc(state)}</span>`;
const tenantColor = (index, shade = 1) => `hsl(${HUES[index % HUES.length]}, 62%, ${[34, 44, 54, 64][shade % 4]}%)`;

// -- session and API ------------------------------------------------------------------------

const session = { csrf: sessionStorage.getItem(CSRF_KEY), who: null, signedIn: false };

class Unauthorized extends Error {}

async function api(path, options = {}) {
  const headers = { "X-Aicluster-Client": "dashboard", ...(options.headers || {}) };
  if (!SAFE_METHODS.has((options.method || "GET").toUpperCase()) && session.csrf) {
    headers["X-CSRF-Token"] = session.csrf;
  }
  const response = await fetch(path, { ...options, headers, cache: "no-store", credentials: "same-origin" });
  if (response.status === 401) throw new Unauthorized("the token is not valid (any more)");
  if (!response.ok) {
    let message = `${response.status}`;
    try { message = (await response.json()).error || message; } catch (_) { /* not JSON */ }
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return options.raw ? response : response.json();
}

async function signIn(token) {
  accept(await api("/v1/ui/session", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token }),
  }));
}

function accept(answer) {
  session.csrf = answer.csrf_token;
  session.who = answer;
  session.signedIn = true;
  sessionStorage.setItem(CSRF_KEY, answer.csrf_token);
}

function signOut(message = "") {
  // The server forgets the cookie (a write: it needs the CSRF token this tab was given).
  if (session.csrf) api("/v1/ui/session", { method: "DELETE", raw: true }).catch(() => {});
  sessionStorage.removeItem(CSRF_KEY);
  session.csrf = null;
  session.signedIn = false;
  session.who = null;
  stopPolling();
  $("#app").hidden = true;
  $("#login").hidden = false;
  $("#login-error").textContent = message;
  $("#token").value = "";
  $("#token").focus();
}

// -- routing and polling --------------------------------------------------------------------

let timer = null;
let inFlight = false;
let lastOk = 0;
let current = null; // {name, arg, view}

function route() {
  const [, name = "cluster", ...rest] = location.hash.replace(/^#/, "").split("/");
  return { name: VIEWS[name] ? name : "cluster", arg: rest.length ? decodeURIComponent(rest.join("/")) : null };
}

function show() {
  const { name, arg } = route();
  document.querySelectorAll("#nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === name
    || (name === "job" && a.dataset.view === "jobs") || (name === "model" && a.dataset.view === "models")));
  const main = $("#view");
  main.innerHTML = `<p class="muted">Loading…</p>`;
  main.dataset.view = name;
  delete main.dataset.ready;
  current = { name, arg, view: VIEWS[name], state: {} };
  refresh();
  stopPolling();
  timer = setInterval(() => { if (!document.hidden) refresh(); }, POLL_MS);
}

function stopPolling() {
  if (timer) clearInterval(timer);
  timer = null;
}

async function refresh() {
  if (inFlight || !current || !session.signedIn) return;
  inFlight = true;
  const target = current;
  try {
    await target.view(target.arg, $("#view"), target.state);
    if (target === current) {
      if (!$("#view").dataset.ready) performance.mark(`ready:${target.name}`); // read by bench/
      $("#view").dataset.ready = "1";
      lastOk = Date.now();
    }
  } catch (error) {
    if (error instanceof Unauthorized) { signOut(error.message); return; }
    if (target === current && !$("#view").dataset.ready) {
      $("#view").innerHTML = `<div class="card error">${esc(error.message)}</div>`;
    }
  } finally {
    inFlight = false;
    liveIndicator();
  }
}

function liveIndicator() {
  const live = $("#live");
  const fresh = Date.now() - lastOk < POLL_MS * 3;
  live.classList.toggle("stale", !fresh);
  live.textContent = lastOk ? `live · ${new Date(lastOk).toLocaleTimeString()}` : "connecting";
}

// -- tooltip --------------------------------------------------------------------------------

function tip(event, html) {
  const box = $("#tip");
  if (!html) { box.hidden = true; return; }
  box.innerHTML = html;
  box.hidden = false;
  const x = Math.min(event.clientX + 14, window.innerWidth - box.offsetWidth - 8);
  const y = Math.min(event.clientY + 14, window.innerHeight - box.offsetHeight - 8);
  box.style.left = `${x}px`;
  box.style.top = `${y}px`;
}

// -- cluster map ----------------------------------------------------------------------------

async function clusterView(_, main, state) {
  const response = await api("/v1/ui/cluster-map", { raw: true });
  const key = await response.text();
  if (key === state.key) return; // nothing changed since the last poll
  state.key = key;
  const map = JSON.parse(key);
  state.map = map;
  const tenants = new Map(map.tenants.map((t, i) => [t, i]));
  const nodes = map.pods.reduce((n, p) => n + p.racks.reduce((m, r) => m + r.nodes.length, 0), 0);
  const bad = [];
  const racks = (pod) => pod.racks.map((rack) => `<div class="rack"><h4>${esc(rack.name)}${rackPower(rack)}</h4>${
    rack.nodes.map((node) => {
      if (node.health !== "healthy") bad.push(node);
      return nodeHtml(node, map.jobs, tenants);
    }).join("")}</div>`).join("");
  const pods = map.pods.map((pod) => `<section class="pod"><h3>${esc(pod.name)}</h3>
    <div class="racks">${racks(pod)}</div></section>`).join("");
  const mine = map.jobs.reduce((n, j) => n + j.gpus, 0);
  const racksAll = map.pods.flatMap((p) => p.racks);
  const watts = racksAll.reduce((w, r) => w + (r.watts ?? 0), 0);
  const measured = racksAll.every((r) => r.watts_source === "measured");
  const palette = map.tenants.flatMap((_, t) => [0, 1, 2, 3].map((s) => `.c${t}_${s}{background:${tenantColor(t, s)}}`)).join("");
  main.innerHTML = `<style>${palette}</style>
    <div class="stats">
      ${stat(fmt(nodes), "nodes")}
      ${stat(`${fmt(map.busy)} / ${fmt(map.gpus)}`, "GPUs busy")}
      ${stat(fmt(mine), "GPUs of your jobs")}
      ${stat(fmt(map.running_jobs), "jobs running")}
      ${stat(fmt(map.pending_jobs), "jobs pending")}
      ${stat(fmt(bad.length), "nodes out of service")}
      ${stat(kw(watts), measured ? "kW drawn, measured" : "kW drawn (modelled where not measured)")}
    </div>
    <div class="legend">${map.tenants.map((t, i) => `<span><i style="background:${tenantColor(i)}"></i>${esc(t)}</span>`).join("")}
      <span><i class="g x"></i>other tenants</span><span><i style="background:var(--free)"></i>free</span>
      <span><i style="outline:2px solid var(--bad)"></i>unhealthy</span>
      <span><i style="outline:2px dashed var(--warn)"></i>cordoned / draining</span></div>
    <div class="pods ${nodes > 150 ? "dense" : ""}" id="map" data-busy="${map.busy}" data-nodes="${nodes}">${pods}</div>`;
}

function kw(watts) {
  return (watts / 1000).toFixed(1);
}

// A rack's draw in its header, marked * where any node's figure is the power model's.
function rackPower(rack) {
  if (rack.watts == null) return "";
  const mark = rack.watts_source === "measured" ? "" : "*";
  return ` <span class="kw" title="${esc(rack.watts_source)}">${kw(rack.watts)} kW${mark}</span>`;
}

function stat(value, label) {
  return `<div class="stat"><b>${value}</b><span>${esc(label)}</span></div>`;
}

function nodeHtml(node, jobs, tenants) {
  const cells = [];
  for (const [index, gpus] of node.slots) {
    const job = index >= 0 ? jobs[index] : null;
    // A class per (tenant, shade), not a style per cell: thousands of cells parse faster.
    const cell = job ? `<i class="g busy c${tenants.get(job.tenant) ?? 0}_${index % 4}" data-j="${index}"></i>`
      : `<i class="g x" data-j="-1"></i>`;
    for (let g = 0; g < gpus; g += 1) cells.push(cell);
  }
  while (cells.length < node.gpus) cells.push(`<i class="g"></i>`);
  const off = node.power && node.power !== "on";
  const flag = node.health !== "healthy" ? `<span class="flag">${esc(node.health)}</span>`
    : off ? `<span class="flag">${esc(node.power)}</span>` : "";
  return `<div class="node ${esc(node.health)}" data-node="${esc(node.name)}"><span class="nn">${esc(node.name)}</span>`
    + `<span class="gpus">${cells.join("")}</span>${flag}</div>`;
}

function mapTip(event) {
  const state = current && current.name === "cluster" ? current.state : null;
  const nodeEl = event.target.closest && event.target.closest(".node");
  if (!state || !state.map || !nodeEl) { tip(event, null); return; }
  const node = findNode(state.map, nodeEl.dataset.node);
  let html = `<b>${esc(node.name)}</b> · ${esc(node.gpu_type)} × ${node.gpus} · ${esc(node.health)}`;
  if (node.power) html += ` · power ${esc(node.power)}`;
  if (node.watts != null) html += `<br>${fmt(Math.round(node.watts))} W (${esc(node.watts_source)})`;
  if (node.reason) html += `<br>${esc(node.reason)}`;
  const j = event.target.dataset.j;
  if (j !== undefined) {
    const job = Number(j) >= 0 ? state.map.jobs[Number(j)] : null;
    html += job ? `<br>${esc(job.name)} (${esc(job.id)})<br>tenant ${esc(job.tenant)} · ${esc(job.state)} · ${job.gpus} GPUs`
      : "<br>busy: another tenant's job";
  }
  tip(event, html);
}

function findNode(map, name) {
  for (const pod of map.pods) for (const rack of pod.racks) for (const node of rack.nodes) if (node.name === name) return node;
  return null;
}

function mapClick(event) {
  const j = event.target.dataset && event.target.dataset.j;
  if (!current || current.name !== "cluster" || j === undefined || Number(j) < 0) return;
  location.hash = `#/job/${encodeURIComponent(current.state.map.jobs[Number(j)].id)}`;
}

// -- queue ----------------------------------------------------------------------------------

const QUEUE_ROWS = 300;

async function queueView(_, main, state) {
  const entries = await api("/v1/queue");
  const tenants = [...new Set(entries.map((e) => e.tenant))].sort();
  const filter = state.tenant || "";
  const shown = entries.filter((e) => !filter || e.tenant === filter);
  const limit = state.all ? shown.length : QUEUE_ROWS;
  const rows = shown.slice(0, limit).map((e) => `<tr data-job="${esc(e.job_id)}">
    <td class="num">${e.position}</td><td><a href="#/job/${encodeURIComponent(e.job_id)}">${esc(e.name)}</a>
    <div class="muted small mono">${esc(e.job_id)}</div></td><td>${esc(e.tenant)}</td>
    <td class="num">${e.gpus}</td><td class="num">${e.priority}</td><td class="num">${ago(e.waiting_seconds)}</td>
    <td class="num est">${e.estimated_start == null ? "–" : when(e.estimated_start)}</td>
    <td>${e.code ? `<span class="badge code">${esc(e.code)}</span>` : ""}</td><td class="reason">${esc(e.reason)}</td></tr>`).join("");
  main.innerHTML = `<div class="toolbar"><h2>Queue</h2><span class="muted">${fmt(entries.length)} pending, in scheduling order</span>
    <select id="queue-tenant"><option value="">all tenants</option>${tenants.map((t) => `<option ${t === filter ? "selected" : ""}>${esc(t)}</option>`).join("")}</select></div>
    ${entries.length ? `<div class="table-wrap"><table><thead><tr><th class="num">#</th><th>job</th><th>tenant</th><th class="num">GPUs</th>
    <th class="num">priority</th><th class="num">waiting</th><th class="num" title="estimated start (a forecast by the scheduler)">est. start</th><th>code</th><th>why it waits</th></tr></thead><tbody>${rows}</tbody></table></div>
    ${shown.length > limit ? `<p><button id="queue-all">Show all ${fmt(shown.length)}</button></p>` : ""}`
    : `<div class="card empty">The queue is empty.</div>`}`;
  const select = $("#queue-tenant", main);
  if (select) select.onchange = () => { state.tenant = select.value; refresh(); };
  const all = $("#queue-all", main);
  if (all) all.onclick = () => { state.all = true; refresh(); };
}

// -- jobs -----------------------------------------------------------------------------------

// A model deployment's replica (a job of kind service) says which model version it serves.
function serviceOf(job) {
  if (job.kind !== "service" || !job.service) return "";
  return `<div class="muted small">service · ${esc(job.service.model)} v${esc(String(job.service.version))}</div>`;
}

async function jobsView(_, main, state) {
  const filter = state.state || "";
  const page = await api(`/v1/jobs?limit=200${filter ? `&state=${filter}` : ""}`);
  const rows = page.jobs.map((job) => `<tr><td><a href="#/job/${encodeURIComponent(job.id)}">${esc(job.name)}</a>
    <div class="muted small mono">${esc(job.id)}</div>${serviceOf(job)}</td><td>${esc(job.tenant)}</td><td>${badge(job.state)}</td>
    <td class="num">${gpusOf(job)}</td><td class="num">${job.restarts}</td><td>${when(job.submitted_at)}</td>
    <td class="small">${esc(job.pending ? job.pending.reason : job.exit_message || "")}</td></tr>`).join("");
  main.innerHTML = `<div class="toolbar"><h2>Jobs</h2><select id="jobs-state"><option value="">all states</option>
    ${STATES.map((s) => `<option ${s === filter ? "selected" : ""}>${s}</option>`).join("")}</select>
    <span class="muted">newest ${fmt(page.jobs.length)}</span></div>
    ${page.jobs.length ? `<div class="table-wrap"><table><thead><tr><th>job</th><th>tenant</th><th>state</th><th class="num">GPUs</th>
    <th class="num">restarts</th><th>submitted</th><th>note</th></tr></thead><tbody>${rows}</tbody></table></div>`
    : `<div class="card empty">No jobs.</div>`}`;
  const select = $("#jobs-state", main);
  select.onchange = () => { state.state = select.value; refresh(); };
}

function gpusOf(job) {
  const spec = job.spec || {};
  const per = (spec.resources && spec.resources.gpus) ?? 0;
  return (spec.workers || 1) * per;
}

// -- job page -------------------------------------------------------------------------------

async function jobView(jobId, main, state) {
  const page = await api(`/v1/ui/jobs/${encodeURIComponent(jobId)}`);
  const job = page.job;
  if (!state.built) {
    main.innerHTML = `<div class="job-head"><h2 id="job-name"></h2><span id="job-state"></span>
      <span class="muted mono" id="job-id"></span><span id="job-facts" class="muted"></span></div>
      <div class="grid">
        <section class="card why" id="why"></section>
        <section class="card" id="goodput"></section>
        <section class="card full" id="timeline"></section>
        <section class="card" id="loss"></section>
        <section class="card" id="heatmap"></section>
        <section class="card" id="jitter"></section>
        <section class="card" id="checkpoints"></section>
        <section class="card" id="observations"></section>
        <section class="card full" id="logs"><div class="toolbar"><h3>Logs</h3>
          <label>rank <select id="log-rank"></select></label>
          <label><select id="log-stream"><option>stdout</option><option>stderr</option></select></label></div>
          <pre class="logs" id="log-text"></pre></section>
      </div>`;
    state.built = true;
    state.log = { rank: 0, stream: "stdout", offset: 0, attempt: null };
    $("#log-rank", main).onchange = (e) => resetLog(state, { rank: Number(e.target.value) });
    $("#log-stream", main).onchange = (e) => resetLog(state, { stream: e.target.value });
  }
  $("#job-name", main).textContent = job.name;
  $("#job-state", main).innerHTML = badge(job.state);
  $("#job-id", main).textContent = job.id;
  $("#job-facts", main).textContent = `tenant ${job.tenant} · ${gpusOf(job)} GPUs · attempt ${job.attempt} · ${job.restarts} restarts`;
  $("#why", main).outerHTML = whyHtml(page);
  $("#goodput", main).innerHTML = goodputHtml(page.goodput, job);
  $("#timeline", main).innerHTML = timelineHtml(page.timeline, job);
  $("#loss", main).innerHTML = `<h3>Loss</h3>${page.training && page.training.loss.length
    ? lossChart(page.training) : `<p class="muted">No training telemetry yet.</p>`}`;
  $("#heatmap", main).innerHTML = `<h3>Step time per rank</h3>${page.training && page.training.heatmap.steps.length
    ? heatmap(page.training.heatmap, page.observations, page.training.last_step) : `<p class="muted">No steps yet.</p>`}`;
  $("#jitter", main).innerHTML = jitterHtml(page);
  $("#checkpoints", main).innerHTML = checkpointsHtml(page.training);
  $("#observations", main).innerHTML = observationsHtml(page);
  await updateLogs(jobId, job, page, main, state);
}

function whyHtml(page) {
  const why = page.why;
  if (why.failure) return failureHtml(why);
  const placed = why.placement != null;
  let body = `<h3>${placed ? "Where it runs and why" : "Why it waits"}</h3>`;
  if (why.position != null) body += `<p>Position <b>${why.position}</b> in the queue</p>`;
  if (why.state === "PENDING") {
    const start = why.estimated_start == null ? "unknown (none yet, or beyond the forecast)" : when(why.estimated_start);
    body += `<p id="why-start">Estimated start: <b>${esc(start)}</b></p>`;
  }
  if (why.code) body += `<p><span class="badge code" id="why-code">${esc(why.code)}</span></p>`;
  body += `<p id="why-reason">${esc(why.reason)}</p>`;
  if (placed) {
    const nodes = [...new Set(why.placement.slots.map((s) => s[0]))];
    body += `<dl class="kv"><dt>domain</dt><dd>${esc(why.placement.level)} ${esc(why.placement.domain)}</dd>
      <dt>nodes</dt><dd class="mono small">${nodes.map(esc).join(", ")}</dd></dl>`;
    if (why.score.length) {
      body += `<table class="small" id="score"><thead><tr><th>score term</th><th class="num">value</th><th>meaning</th></tr></thead><tbody>${
        why.score.map((t) => `<tr><td class="mono">${esc(t.term)}</td><td class="num">${fmt(t.value, 0)}</td><td>${esc(t.meaning)}</td></tr>`).join("")}</tbody></table>`;
    }
  }
  return `<section class="card why ${placed ? "placed" : ""}" id="why">${body}</section>`;
}

// A failed job: its first failed rank and node, its exit code or signal, its stderr's last lines
// (the job's own text: escaped, shown as text).
function failureHtml(why) {
  const f = why.failure;
  const exit = f.lost ? "none: its actor or node died"
    : f.signal ? `killed by ${esc(f.signal)} (${esc(String(f.exit_code))})` : esc(String(f.exit_code));
  return `<section class="card why failed" id="why"><h3>Why it failed</h3>
    <p id="why-reason">${esc(why.reason)}</p>
    <dl class="kv" id="why-failure"><dt>rank</dt><dd>${esc(String(f.rank))} on <span class="mono">${esc(f.node)}</span></dd>
      <dt>attempt</dt><dd>${esc(String(f.attempt ?? "–"))}</dd><dt>exit</dt><dd>${exit}</dd></dl>
    ${f.stderr_tail.length ? `<p class="muted small">its stderr's last ${f.stderr_tail.length} lines</p>
    <pre class="logs" id="why-tail">${esc(f.stderr_tail.join("\n"))}</pre>` : `<p class="muted">its stderr is empty</p>`}</section>`;
}

function goodputHtml(goodput, job) {
  if (!goodput || goodput.ettr == null) {
    return `<h3>Goodput</h3><p class="muted">Known once the job has run.</p>`;
  }
  return `<h3>Goodput</h3><dl class="kv">
    <dt>ETTR</dt><dd><b>${fmt(100 * goodput.ettr, 1)}%</b> of wall time was productive</dd>
    <dt>productive</dt><dd>${ago(goodput.productive_seconds)}</dd>
    <dt>lost work</dt><dd>${ago(goodput.lost_seconds)}</dd>
    <dt>restart time</dt><dd>${ago(goodput.restart_seconds)}</dd>
    <dt>attempts</dt><dd>${fmt(goodput.attempts)} (${job.restarts} restarts)</dd>
    <dt>checkpoints</dt><dd>${fmt(goodput.checkpoints)}</dd></dl>`;
}

function timelineHtml(transitions, job) {
  if (!transitions.length) return `<h3>State timeline</h3><p class="muted">No transitions yet.</p>`;
  const terminal = ["SUCCEEDED", "FAILED", "CANCELLED"].includes(job.state);
  const end = terminal ? transitions[transitions.length - 1].at : Date.now() / 1000;
  const start = transitions[0].at;
  const span = Math.max(end - start, 1e-6);
  const segments = transitions.map((t, i) => {
    const until = i + 1 < transitions.length ? transitions[i + 1].at : end;
    const width = Math.max(0.4, (100 * (until - t.at)) / span);
    return `<span title="${esc(t.state)} · ${ago(until - t.at)}" style="width:${width}%;background:${STATE_COLORS[t.state] || "#999"}"></span>`;
  }).join("");
  const rows = transitions.map((t) => `<tr class="${t.state === "RESTARTING" ? "restart" : ""}"><td>${when(t.at)}</td>
    <td>${badge(t.state)}</td><td class="small">${esc(t.reason || "")}</td><td class="muted small">${esc(t.actor)}</td></tr>`).join("");
  return `<h3>State timeline</h3><div class="timeline" id="state-bar">${segments}</div>
    <div class="table-wrap"><table class="small"><tbody>${rows}</tbody></table></div>`;
}

function lossChart(training) {
  const points = training.loss;
  const w = 640, h = 260, left = 48, bottom = 28, top = 10, right = 12;
  const steps = points.map((p) => p[0]), losses = points.map((p) => p[1]);
  const x0 = Math.min(...steps), x1 = Math.max(...steps, x0 + 1);
  let y0 = Math.min(...losses), y1 = Math.max(...losses);
  if (y1 - y0 < 1e-9) { y0 -= 0.5; y1 += 0.5; }
  const sx = (s) => left + ((s - x0) / (x1 - x0)) * (w - left - right);
  const sy = (v) => top + (1 - (v - y0) / (y1 - y0)) * (h - top - bottom);
  const path = points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((f) => y0 + f * (y1 - y0));
  const ckpts = training.checkpoints.filter((c) => c.step != null && c.step >= x0 && c.step <= x1)
    .map((c) => `<line class="ckpt" x1="${sx(c.step)}" x2="${sx(c.step)}" y1="${top}" y2="${h - bottom}"></line>`).join("");
  return `<svg viewBox="0 0 ${w} ${h}" id="loss-chart" role="img" aria-label="loss curve">
    ${ticks.map((v) => `<line class="axis" x1="${left}" x2="${w - right}" y1="${sy(v)}" y2="${sy(v)}"></line>
      <text x="${left - 6}" y="${sy(v) + 4}" text-anchor="end">${v.toPrecision(3)}</text>`).join("")}
    ${ckpts}<path class="chart-line" d="${path}"></path>
    <text x="${left}" y="${h - 8}">step ${x0}</text><text x="${w - right}" y="${h - 8}" text-anchor="end">step ${x1}</text>
  </svg><p class="muted small">Rank 0, attempt ${training.attempt}; dashed lines: checkpoints. Latest step ${fmt(training.last_step)}${
    training.throughput ? `, ${fmt(training.throughput, 1)} samples/s` : ""}.</p>`;
}

function heatmap(map, observations, lastStep) {
  const flagged = new Set(observations.filter((o) => o.kind === "job.straggler").map((o) => o.details.rank));
  const values = map.seconds.flat().filter((v) => v != null).sort((a, b) => a - b);
  const median = values[Math.floor(values.length / 2)] || 1;
  const cols = map.steps.length, rows = map.ranks.length;
  const cw = Math.max(4, Math.min(24, Math.floor(600 / cols))), ch = Math.max(6, Math.min(22, Math.floor(300 / rows)));
  const left = 64, w = left + cols * cw + 8, h = rows * ch + 26;
  const color = (v) => {
    if (v == null) return "#eef1f5";
    const r = Math.min(v / median, 3); // 1 = the median step time; 3 or more = darkest
    const t = Math.max(0, (r - 0.5) / 2.5);
    return `hsl(${Math.round(200 - 200 * t)}, 70%, ${Math.round(88 - 45 * t)}%)`;
  };
  const cells = map.seconds.map((row, r) => row.map((v, c) => `<rect x="${left + c * cw}" y="${r * ch}" width="${cw - 1}" height="${ch - 1}" fill="${color(v)}"><title>rank ${map.ranks[r]}, steps ${map.steps[c]}+: ${v == null ? "–" : `${v.toFixed(3)} s`}</title></rect>`).join("")).join("");
  const slow = map.slow.map(([r, c]) => `<rect class="slow" x="${left + c * cw}" y="${r * ch}" width="${cw - 1}" height="${ch - 1}"></rect>`).join("");
  const labels = map.ranks.map((rank, r) => `<text x="${left - 6}" y="${r * ch + ch / 2 + 4}" text-anchor="end" ${flagged.has(rank) ? 'style="fill:var(--bad);font-weight:700"' : ""}>${flagged.has(rank) ? "⚠ " : ""}rank ${rank}</text>`).join("");
  return `<svg viewBox="0 0 ${w} ${h}" id="step-heatmap" style="max-width:${w * 1.6}px" role="img" aria-label="step time heatmap">
    ${labels}${cells}${slow}<text x="${left}" y="${h - 6}">step ${map.steps[0]}</text>
    <text x="${w - 8}" y="${h - 6}" text-anchor="end">step ${lastStep ?? map.steps[cols - 1]}</text></svg>
    <p class="muted small">Mean step time per rank and step range (median ${median.toFixed(3)} s); red outlines: at least 1.5× the other ranks; ⚠ ranks flagged as stragglers.</p>`;
}

function jitterHtml(page) {
  const jitter = page.training ? page.training.jitter : null;
  const flagged = page.observations.filter((o) => o.kind === "job.straggler");
  let body = "<h3>Synchronization jitter</h3>";
  if (!jitter) return `${body}<p class="muted">Not measured yet (two ranks or more, with steps).</p>`;
  body += `<p>Job: <b id="jitter-job">${fmt(jitter.seconds, 3)} s</b> <span class="muted small">(median over ${fmt(jitter.steps)} steps of slowest minus fastest rank's compute time)</span></p>`;
  const nodes = Object.entries(jitter.nodes).sort((a, b) => b[1] - a[1]).slice(0, 12);
  if (nodes.length) {
    body += `<table class="small" id="jitter-nodes"><thead><tr><th>node</th><th class="num">jitter (s)</th></tr></thead><tbody>${
      nodes.map(([n, v]) => `<tr><td class="mono">${esc(n)}</td><td class="num">${fmt(v, 3)}</td></tr>`).join("")}</tbody></table>`;
  }
  if (flagged.length) {
    body += `<p id="jitter-stragglers">Straggler: ${flagged.map((o) => `<b>rank ${esc(String(o.details.rank))}</b>${o.details.node ? ` on <b>${esc(o.details.node)}</b>` : ""}`).join(", ")}</p>`;
  }
  return body;
}

function checkpointsHtml(training) {
  const list = training ? training.checkpoints : [];
  return `<h3>Checkpoints</h3>${list.length ? `<table class="small"><thead><tr><th class="num">step</th><th>written</th></tr></thead><tbody>${
    list.slice(-12).reverse().map((c) => `<tr><td class="num">${fmt(c.step)}</td><td>${when(c.time)}</td></tr>`).join("")}</tbody></table>`
    : `<p class="muted">None in this attempt yet.</p>`}`;
}

function observationsHtml(page) {
  const restarts = page.timeline.filter((t) => t.state === "RESTARTING");
  const items = [
    ...restarts.map((t) => ({ at: t.at, what: "restart", text: t.reason || "" })),
    ...page.observations.filter((o) => o.kind !== "job.goodput").map((o) => ({
      at: o.at, what: o.kind.replace("job.", ""),
      text: o.kind === "job.straggler" ? `rank ${o.details.rank}${o.details.node ? ` on ${o.details.node}` : ""} is ${fmt(o.details.ratio, 2)}× slower than the median`
        : o.details.reason || "",
    })),
  ].sort((a, b) => b.at - a.at);
  return `<h3>Restarts and incidents</h3>${items.length ? `<table class="small"><tbody>${items.map((i) => `<tr><td>${when(i.at)}</td>
    <td><span class="badge ${i.what === "restart" ? "s-RESTARTING" : "s-FAILED"}">${esc(i.what)}</span></td><td>${esc(i.text)}</td></tr>`).join("")}</tbody></table>`
    : `<p class="muted">None.</p>`}`;
}

function resetLog(state, change) {
  Object.assign(state.log, change, { offset: 0 });
  $("#log-text").textContent = "";
  refresh();
}

async function updateLogs(jobId, job, page, main, state) {
  const ranks = page.training ? page.training.heatmap.ranks : [0];
  const select = $("#log-rank", main);
  const options = ranks.map((r) => `<option value="${r}" ${r === state.log.rank ? "selected" : ""}>${r}</option>`).join("");
  if (select.innerHTML !== options) select.innerHTML = options;
  if (job.attempt === 0) { $("#log-text", main).textContent = "(no output before the job starts)"; return; }
  const { rank, stream, offset } = state.log;
  const chunk = await api(`/v1/jobs/${encodeURIComponent(jobId)}/logs?rank=${rank}&stream=${stream}&offset=${offset}`);
  if (chunk.attempt !== state.log.attempt) {
    state.log.attempt = chunk.attempt;
    if (offset) return resetLog(state, {});
  }
  state.log.offset = chunk.next_offset;
  if (chunk.text) {
    const pre = $("#log-text", main);
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = (pre.textContent + chunk.text).slice(-200000);
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }
  return undefined;
}

// -- tenants --------------------------------------------------------------------------------

async function tenantsView(_, main) {
  const [tenants, cluster] = await Promise.all([api("/v1/tenants"), api("/v1/cluster")]);
  const rows = tenants.flatMap((t) => {
    const types = [...new Set([...Object.keys(t.quota), ...Object.keys(t.used)])].sort();
    return (types.length ? types : ["–"]).map((type, i) => {
      const quota = t.quota[type] || 0, used = t.used[type] || 0, borrowed = Math.max(0, used - quota);
      const scale = Math.max(quota, used, 1);
      return `<tr>${i ? "<td></td>" : `<td><b>${esc(t.name)}</b><div class="muted small">weight ${fmt(t.weight, 1)}</div></td>`}
        <td>${esc(type)}</td><td class="num">${fmt(quota)}</td><td class="num">${fmt(used)}</td><td class="num">${fmt(borrowed)}</td>
        <td class="num">${fmt(t.borrow_limit[type] || 0)}</td>
        <td><div class="bar" title="used ${used} of quota ${quota}"><span style="width:${(100 * Math.min(used, quota)) / scale}%;background:var(--ok)"></span>
        <span style="width:${(100 * borrowed) / scale}%;background:var(--warn)"></span></div></td></tr>`;
    });
  }).join("");
  main.innerHTML = `<div class="toolbar"><h2>Tenants</h2><span class="muted">quota, use and borrowing per GPU type</span></div>
    ${tenants.length ? `<div class="table-wrap"><table><thead><tr><th>tenant</th><th>GPU type</th><th class="num">quota</th><th class="num">used</th>
    <th class="num">borrowed</th><th class="num">borrow limit</th><th>use (green: own quota, amber: borrowed)</th></tr></thead><tbody>${rows}</tbody></table></div>`
    : `<div class="card empty">You are not a member of any tenant.</div>`}
    ${preemptionCostHtml(cluster.preemption_cost || {})}`;
}

// The cost of preemption of the tenants the caller sees (GET /v1/cluster scopes it).
function preemptionCostHtml(costs) {
  const names = Object.keys(costs).sort();
  if (!names.length) return "";
  const rows = names.map((name) => {
    const c = costs[name];
    const kinds = Object.entries(c.by_kind).map(([kind, n]) => `${fmt(n)} ${esc(kind)}`).join(", ") || "–";
    return `<tr><td><b>${esc(name)}</b></td><td class="num">${fmt(c.preemptions)}</td><td>${kinds}</td>
      <td class="num">${fmt(c.lost_gpu_hours, 2)}</td><td class="num">${fmt(c.admitted_gpu_hours, 1)}</td>
      <td class="num">${fmt(c.evictions_per_gpu_hour, 4)}</td></tr>`;
  }).join("");
  return `<div class="toolbar"><h3>Cost of preemption</h3><span class="muted">runs stopped and requeued, the work they lost since their last save</span></div>
    <div class="table-wrap"><table id="preemption-cost"><thead><tr><th>tenant</th><th class="num">preemptions</th><th>by kind</th>
    <th class="num">lost GPU-h</th><th class="num">admitted GPU-h</th><th class="num">evictions / GPU-h</th></tr></thead><tbody>${rows}</tbody></table></div>`;
}

// -- deployments ----------------------------------------------------------------------------

function quantile(buckets, q) {
  const total = buckets.length ? buckets[buckets.length - 1][1] : 0;
  if (!total) return null;
  for (const [le, count] of buckets) if (count >= q * total) return le === "+Inf" ? Infinity : Number(le);
  return null;
}

// "v1 90% · v2 10%" from a traffic map {"1": 90, "2": 10}.
const splitText = (traffic) => Object.entries(traffic || {}).sort((a, b) => a[0] - b[0])
  .map(([version, weight]) => `v${version} ${fmt(weight)}%`).join(" · ") || "none";

function scalingText(scaling) {
  const auto = scaling && scaling.autoscaling;
  if (auto) return `${auto.min}–${auto.max} replicas (autoscaling, ${fmt(auto.target_ongoing_requests, 1)} in flight each)`;
  return `${scaling?.replicas ?? "?"} replica${scaling?.replicas === 1 ? "" : "s"}`;
}

// One line a person reads for a serving event (the raw details stay in the row's tooltip).
function describeServingEvent(kind, d) {
  const because = d.reason ? ` — ${d.reason}` : "";
  const canary = `v${d.to_version} over v${d.from_version}`;
  const figures = d.figures && d.figures.requests != null
    ? ` (${fmt(d.figures.requests)} requests, ${fmt(100 * (d.figures.error_rate || 0), 2)}% errors${
      d.figures.p99_ms != null ? `, p99 ${fmt(d.figures.p99_ms, 1)} ms` : ""})` : "";
  switch (kind) {
    case "deployment.put": return ["deployed", `${splitText(d.traffic)} on ${scalingText(d.scaling)}`];
    case "deployment.traffic": return ["traffic", `${splitText(d.from)} → ${splitText(d.to)}${because}`];
    case "deployment.deleted": return ["undeployed", `was ${splitText(d.traffic)}`];
    case "rollout.started": return ["rollout started", `${canary}: ${splitText(d.traffic)}`];
    case "rollout.step": return ["rollout step", `${canary}: ${fmt(d.previous_weight)}% → ${fmt(d.weight)}%${figures}${because}`];
    case "rollout.promoted": return ["promoted", `v${d.to_version} takes all traffic${figures}${because}`];
    case "rollout.rolled_back": return ["rolled back", `v${d.to_version} back to 0%, v${d.from_version} serves${figures}${because}`];
    case "rollout.aborted": return ["aborted", `v${d.to_version} back to 0%${because}`];
    default: return [kind, JSON.stringify(d)];
  }
}

async function deploymentsView(_, main) {
  const data = await api("/v1/ui/deployments");
  const models = new Map();
  for (const v of data.versions) {
    const key = `${v.tenant}/${v.model}`;
    if (!models.has(key)) models.set(key, []);
    models.get(key).push(v);
  }
  const cards = [...models.entries()].map(([key, versions]) => {
    const split = versions.map((v, i) => `<span style="width:${100 * (v.traffic || 0)}%;background:${tenantColor(i)}" title="${esc(v.version)} ${fmt(100 * (v.traffic || 0))}%"></span>`).join("");
    const rows = versions.map((v) => {
      const p50 = quantile(v.buckets, 0.5), p95 = quantile(v.buckets, 0.95);
      const rate = v.requests ? (100 * (v.errors || 0)) / v.requests : 0;
      // healthy / desired; just the desired count where this server does not run the serving layer
      const replicas = v.desired_replicas == null ? "–"
        : v.healthy_replicas == null ? esc(v.desired_replicas) : `${fmt(v.healthy_replicas)} / ${esc(v.desired_replicas)}`;
      return `<tr><td>${esc(v.version)}</td><td class="num">${fmt(100 * (v.traffic || 0))}%</td><td class="num">${replicas}</td><td class="num">${fmt(v.requests || 0)}</td>
        <td class="num">${fmt(rate, 2)}%</td><td class="num">${p50 == null ? "–" : `≤ ${fmt(1000 * p50)} ms`}</td><td class="num">${p95 == null ? "–" : `≤ ${fmt(1000 * p95)} ms`}</td></tr>`;
    }).join("");
    return `<section class="card"><h3>${esc(key)}</h3><div class="bar">${split}</div>
      <table class="small"><thead><tr><th>version</th><th class="num">traffic</th><th class="num" title="healthy / desired (a range when autoscaling)">replicas</th><th class="num">requests</th><th class="num">errors</th>
      <th class="num">p50</th><th class="num">p95</th></tr></thead><tbody>${rows}</tbody></table></section>`;
  }).join("");
  const history = data.rollouts.slice().reverse().map((e) => {
    const [what, text] = describeServingEvent(e.kind, e.details || {});
    return `<tr><td>${when(e.at)}</td><td>${esc(e.tenant)}/${esc(e.details?.name || e.details?.model || "")}</td>
      <td>${esc(what)}</td><td title="${esc(JSON.stringify(e.details))}">${esc(text)}</td></tr>`;
  }).join("");
  main.innerHTML = `<div class="toolbar"><h2>Deployments</h2><span class="muted">traffic split, latency and errors per model version</span></div>
    ${cards ? `<div class="grid">${cards}</div>` : `<div class="card empty" id="no-deployments">No deployments yet. Models served by aicluster appear here with their traffic split, latency, error rate and rollout history.</div>`}
    <h3 style="margin-top:1rem">Rollout history</h3>${history ? `<div class="table-wrap"><table><tbody>${history}</tbody></table></div>` : `<p class="muted">No rollouts yet.</p>`}`;
}

// -- audit log ------------------------------------------------------------------------------

const AUDIT_PAGE = 50;
const AUDIT_SINCE = [["", "any time"], ["3600", "last hour"], ["86400", "last day"], ["604800", "last week"]];
const OBJECT_KEYS = ["object", "node", "user", "token_id", "name", "model"];

// What an event is about: its job, else the object its details name, else its tenant.
function auditObject(e) {
  if (e.job_id) return e.job_id;
  const key = OBJECT_KEYS.find((k) => e.details[k] != null && e.details[k] !== "");
  if (key) return String(e.details[key]);
  return e.kind.startsWith("tenant.") ? e.tenant : "";
}

function auditWhat(e) {
  const d = e.details || {};
  if (e.kind.startsWith("api.")) return `${d.method} ${d.route} → ${d.status} ${d.outcome || ""}`;
  const moved = e.from_state || e.to_state ? `${e.from_state || "–"} → ${e.to_state || "–"} ` : "";
  return moved + (d.reason || "");
}

// The server scopes the log (a member reads only its tenants' events); this view only asks.
async function auditView(_, main, state) {
  if (!state.built) {
    const since = AUDIT_SINCE.map(([v, label]) => `<option value="${v}">${label}</option>`).join("");
    main.innerHTML = `<div class="toolbar"><h2>Audit log</h2><span class="muted">API calls that changed something, the changes, and the scheduler's moves; newest first</span></div>
      <form id="audit-form" class="toolbar" autocomplete="off">
        <select name="since" aria-label="since">${since}</select>
        <input name="actor" placeholder="actor" aria-label="actor" maxlength="128">
        <input name="action" placeholder="action (job. or api.submit_job)" aria-label="action" maxlength="64">
        <input name="object" placeholder="object (job id, node, model…)" aria-label="object" maxlength="253">
        <input name="tenant" placeholder="tenant" aria-label="tenant" maxlength="63">
        <button type="submit" id="audit-filter">Filter</button></form>
      <div id="audit-table"></div>
      <p class="toolbar"><button id="audit-newer" class="link">← newer</button><span class="muted" id="audit-page"></span><button id="audit-older" class="link">older →</button></p>`;
    state.built = true;
    state.filters = {};
    state.cursors = [null]; // the cursor of each page walked so far; the last is shown
    const form = $("#audit-form", main);
    form.onsubmit = (event) => {
      event.preventDefault();
      state.filters = Object.fromEntries(new FormData(form));
      state.cursors = [null];
      refresh();
    };
    $("#audit-older", main).onclick = () => { if (state.next != null) { state.cursors.push(state.next); refresh(); } };
    $("#audit-newer", main).onclick = () => { if (state.cursors.length > 1) { state.cursors.pop(); refresh(); } };
  }
  const params = new URLSearchParams({ limit: String(AUDIT_PAGE) });
  for (const [key, value] of Object.entries(state.filters)) {
    if (!value.trim()) continue;
    params.set(key, key === "since" ? String(Date.now() / 1000 - Number(value)) : value.trim());
  }
  const cursor = state.cursors[state.cursors.length - 1];
  if (cursor != null) params.set("cursor", String(cursor));
  const table = $("#audit-table", main);
  let page;
  try {
    page = await api(`/v1/audit?${params}`);
  } catch (error) {
    if (error instanceof Unauthorized) throw error;
    table.innerHTML = `<div class="card error" id="audit-error">${esc(error.message)}</div>`;
    return;
  }
  state.next = page.next_cursor;
  table.dataset.query = params.toString(); // what the rows answer (tests wait for it)
  const rows = page.items.map((e) => `<tr data-event="${e.id}" data-tenant="${esc(e.tenant ?? "")}"><td>${when(e.at)}</td><td>${esc(e.actor)}</td>
    <td class="mono small">${esc(e.kind)}</td><td>${esc(e.tenant ?? "–")}</td><td class="mono small">${esc(auditObject(e))}</td>
    <td class="small" title="${esc(JSON.stringify(e.details))}">${esc(auditWhat(e))}</td></tr>`).join("");
  table.innerHTML = page.items.length ? `<div class="table-wrap"><table id="audit-events"><thead><tr><th>time</th><th>actor</th><th>action</th>
    <th>tenant</th><th>object</th><th>what</th></tr></thead><tbody>${rows}</tbody></table></div>`
    : `<div class="card empty">No events${Object.values(state.filters).some((v) => v.trim()) ? " match the filter" : ""}.</div>`;
  $("#audit-page", main).textContent = `page ${state.cursors.length}`;
  $("#audit-newer", main).disabled = state.cursors.length < 2;
  $("#audit-older", main).disabled = state.next == null;
}

// -- simulation reports ---------------------------------------------------------------------

const REPORT_COLUMNS = [
  ["policy", "policy", (v) => esc(v)], ["completed", "done", (v) => fmt(v)],
  ["jct_mean", "JCT h", (v) => fmt(v / 3600, 2)], ["queue_delay_mean", "wait h", (v) => fmt(v / 3600, 2)],
  ["utilization", "util", (v) => `${fmt(100 * v, 1)}%`], ["jain_fairness", "Jain", (v) => fmt(v, 3)],
  ["preemptions", "preempt", (v) => fmt(v)], ["lost_gpu_hours_preemptions", "pre-lost GPU-h", (v) => fmt(v)],
  ["evictions_per_gpu_hour", "evict/GPU-h", (v) => fmt(v, 4)], ["goodput", "goodput", (v) => `${fmt(100 * v, 1)}%`],
];

async function reportsView(_, main, state) {
  const reports = await api("/v1/ui/reports");
  const key = JSON.stringify(reports.map((r) => [r.name, r.modified]));
  if (key === state.key) return;
  state.key = key;
  main.innerHTML = `<div class="toolbar"><h2>Simulations</h2><span class="muted">reports under the state directory's reports/ (aicluster sim --out)</span></div>
    ${reports.length ? `<div class="reports">${reports.map((r) => `<section class="card report" data-report="${esc(r.name)}"><h3>${esc(r.name)}</h3>
      <p class="muted small">${when(r.modified)} · ${r.files.map(esc).join(", ")}</p>${r.summary && r.summary.runs ? `<div class="table-wrap"><table class="small"><thead><tr>${
        REPORT_COLUMNS.map(([, label]) => `<th>${label}</th>`).join("")}</tr></thead><tbody>${r.summary.runs.map((run) => `<tr>${
        REPORT_COLUMNS.map(([k, , f]) => `<td>${run[k] == null ? "–" : f(run[k])}</td>`).join("")}</tr>`).join("")}</tbody></table></div>` : ""}
      <div class="plots">${r.files.filter((f) => f.endsWith(".png")).map((f) => `<img alt="${esc(f)}" data-src="/v1/ui/reports/${encodeURIComponent(r.name)}/${encodeURIComponent(f)}">`).join("")}</div>
      </section>`).join("")}</div>` : `<div class="card empty">No simulation reports yet.</div>`}`;
  for (const img of main.querySelectorAll("img[data-src]")) {
    // <img src> cannot send the token: fetch the plot with it and show it from a blob URL.
    api(img.dataset.src, { raw: true }).then((r) => r.blob()).then((b) => { img.src = URL.createObjectURL(b); }).catch(() => {});
  }
}

// -- start ----------------------------------------------------------------------------------

const VIEWS = {
  cluster: clusterView, queue: queueView, jobs: jobsView, job: jobView,
  tenants: tenantsView, deployments: deploymentsView, reports: reportsView, audit: auditView,
  models: modelsView, model: modelView, pipelines: pipelinesView, // learning.js
};

function enter() {
  $("#login").hidden = true;
  $("#app").hidden = false;
  show();
}

function showWho(who) {
  const roles = Object.entries(who.roles).map(([t, r]) => `${t}: ${r}`).join(", ");
  $("#who").textContent = `${who.user}${who.cluster_admin ? " (cluster admin)" : roles ? ` (${roles})` : ""}`;
  // A cluster started with --insecure-no-sandbox says so on every page.
  api("/healthz").then((health) => { $("#unsandboxed").hidden = health.sandboxed !== false; })
    .catch(() => {});
}

document.addEventListener("DOMContentLoaded", () => {
  $("#login-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("#login-error").textContent = "";
    try {
      await signIn($("#token").value.trim());
      showWho(session.who);
      enter();
    } catch (error) {
      session.signedIn = false;
      $("#login-error").textContent = error instanceof Unauthorized ? "That token is not valid." : error.message;
    }
  });
  $("#logout").addEventListener("click", () => signOut());
  window.addEventListener("hashchange", () => { if (session.signedIn) show(); });
  const main = $("#view");
  main.addEventListener("mousemove", (e) => { if (current && current.name === "cluster") mapTip(e); });
  main.addEventListener("mouseleave", (e) => tip(e, null));
  main.addEventListener("click", mapClick);
  // Signed in earlier (the session cookie), or a server without authentication: go straight in.
  api("/v1/ui/session")
    .then((answer) => { accept(answer); showWho(answer); enter(); })
    .catch((error) => signOut(error instanceof Unauthorized ? "" : error.message));
});
