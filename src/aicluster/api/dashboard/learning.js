// aicluster dashboard: models with their lineage, and continuous-learning pipelines.
// Loaded before app.js, whose helpers ($, esc, when, badge, api) these views call at run time.
"use strict";

// #/models: every model the caller can see, each linking to its latest version's lineage.
async function modelsView(_, main) {
  const models = await api("/v1/models");
  const rows = models.map((m) => `<tr><td><a href="#/model/${encodeURIComponent(m.tenant)}/${encodeURIComponent(`${m.name}:${m.latest_version}`)}">${esc(m.name)}</a></td>
    <td>${esc(m.tenant)}</td><td class="num">${esc(m.latest_version)}</td><td>${when(m.registered_at)}</td><td>${esc(m.job_id || "–")}</td></tr>`).join("");
  main.innerHTML = `<div class="toolbar"><h2>Models</h2><span class="muted">registered versions and where they came from</span></div>
    ${rows ? `<div class="table-wrap"><table id="models"><thead><tr><th>model</th><th>tenant</th><th class="num">latest</th><th>registered</th><th>job</th></tr></thead><tbody>${rows}</tbody></table></div>`
    : `<div class="card empty">No models yet.</div>`}`;
}

// #/model/TENANT/NAME:VERSION: the chain dataset versions → job → model version → deployment.
async function modelView(arg, main) {
  const [tenant, ref = ""] = (arg || "").split("/");
  const [name, version] = ref.split(":");
  const q = `?tenant=${encodeURIComponent(tenant)}`;
  const [item, versions] = await Promise.all([
    api(`/v1/models/${encodeURIComponent(name)}/versions/${encodeURIComponent(version)}${q}`),
    api(`/v1/models/${encodeURIComponent(name)}${q}`),
  ]);
  const datasets = item.datasets.length ? item.datasets.map((d) => `<li class="dataset${d.deleted ? " deleted" : ""}">dataset <b>${esc(d.ref)}</b>
    <code title="${esc(d.manifest_sha256 || "")}">${esc((d.manifest_sha256 || "?").slice(0, 12))}</code>${d.deleted ? ' <span class="badge s-FAILED">deleted</span>' : ""}</li>`).join("")
    : `<li class="muted">no recorded datasets</li>`;
  const job = item.job_id ? `<a href="#/job/${encodeURIComponent(item.job_id)}">job ${esc(item.job_id)}</a>` : "no job";
  const parent = item.parent ? ` · from <a href="#/model/${encodeURIComponent(tenant)}/${encodeURIComponent(item.parent)}">${esc(item.parent)}</a>` : "";
  const serving = item.traffic == null ? `<span class="muted">not deployed</span>` : `deployment <b>${esc(item.name)}</b>: ${esc(item.traffic)}% of traffic`;
  const others = versions.map((v) => `<a href="#/model/${encodeURIComponent(tenant)}/${encodeURIComponent(v.ref)}">${esc(v.ref)}</a>`).join(" · ");
  main.innerHTML = `<div class="toolbar"><h2>${esc(item.ref)}</h2><span class="muted">tenant ${esc(tenant)} · registered ${when(item.registered_at)} by ${esc(item.registered_by)}</span></div>
    <section class="card"><h3>Lineage</h3><ol class="lineage" id="lineage">
      <li><ul>${datasets}</ul></li>
      <li>${job} <span class="muted small">spec ${esc((item.spec_hash || "–").slice(0, 12))} · code ${esc(item.code_version.slice(0, 12))}</span>${parent}</li>
      <li>model <b>${esc(item.ref)}</b> <span class="muted small">${esc(Object.entries(item.metrics).map(([k, v]) => `${k} ${v.toPrecision(4)}`).join(", "))}</span></li>
      <li>${serving}</li></ol></section>
    <section class="card"><h3>Configuration</h3><pre class="small">${esc(JSON.stringify(item.config, null, 2))}</pre></section>
    <p class="small">Versions: ${others}</p>`;
}

// #/pipelines: every pipeline the caller can see with its recent runs (each step is an event).
async function pipelinesView(_, main) {
  const pipelines = await api("/v1/pipelines");
  const cards = pipelines.map((p) => {
    const runs = p.runs.map((r) => `<tr class="run"><td>${esc(r.id)}</td><td>${badge(r.state)}</td><td>${esc(r.reasons.join("; "))}</td>
      <td>${r.job_id ? `<a href="#/job/${encodeURIComponent(r.job_id)}">${esc(r.job_id)}</a>` : "–"}</td>
      <td>${r.model_version ? `<a href="#/model/${encodeURIComponent(p.tenant)}/${encodeURIComponent(`${p.deployment}:${r.model_version}`)}">v${esc(r.model_version)}</a>` : "–"}</td>
      <td>${when(r.started_at)}</td><td>${esc(r.detail || "")}</td></tr>`).join("");
    return `<section class="card pipeline"><h3>${esc(p.tenant)}/${esc(p.name)} ${p.paused ? badge("PAUSED") : badge("ACTIVE")}</h3>
      <p class="small">serves <b>${esc(p.deployment)}</b> · triggers: ${esc(p.triggers.join(", "))}</p>
      ${runs ? `<table class="small"><thead><tr><th>run</th><th>state</th><th>why</th><th>job</th><th>model</th><th>started</th><th>detail</th></tr></thead><tbody>${runs}</tbody></table>` : `<p class="muted small">No runs yet.</p>`}</section>`;
  }).join("");
  main.innerHTML = `<div class="toolbar"><h2>Pipelines</h2><span class="muted">continuous learning: drift, new data or a schedule → retrain → canary</span></div>
    ${cards ? `<div class="grid">${cards}</div>` : `<div class="card empty" id="no-pipelines">No pipelines yet (aicluster pipeline create -f pipeline.yaml).</div>`}`;
}
