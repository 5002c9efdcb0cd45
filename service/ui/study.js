// One study: best so far, the trials table (paged by the API), predicted against measured,
// why configurations were infeasible, the best configuration, the top configurations.
import { api, copyButton, el, fmt, LIVE_STATES, refreshing, toYaml } from "./common.js";

const id = Number(new URLSearchParams(window.location.search).get("id"));
const table = { offset: 0, order: "number", state: "", sortKey: null, sortDir: 1, items: [], total: 0 };
let metric = "value";
let live = true;
const TOP = 50;

function minimize(h) {
  return h.direction === "minimize";
}

function bestSoFar(h) {
  const byTrial = { x: [], y: [] };
  const byHours = { x: [], y: [] };
  let best = null;
  let hours = 0;
  for (const t of h.trials) {
    hours += t.gpu_hours || 0;
    if (t.value === null) continue;
    if (best === null || (minimize(h) ? t.value < best : t.value > best)) best = t.value;
    byTrial.x.push(t.number);
    byTrial.y.push(best);
    byHours.x.push(hours);
    byHours.y.push(best);
  }
  const layout = (title, x) => ({ title: { text: title }, xaxis: { title: { text: x } }, yaxis: { title: { text: `best ${h.metric}` } } });
  const line = (s) => ({ x: s.x, y: s.y, mode: "lines+markers", line: { shape: "hv" } });
  Plotly.react("best-by-trial", [line(byTrial)], layout("Best so far by trial", "trial number"));
  Plotly.react("best-by-hours", [line(byHours)], layout("Best so far by GPU-hours", "GPU-hours used"));
}

function predictedScatter(h) {
  const pts = h.trials.filter((t) => t.predicted !== null && t.value !== null);
  document.getElementById("kendall").textContent =
    `Kendall's tau ${h.kendall_tau === null ? "–" : h.kendall_tau.toFixed(3)} over ${h.n_predicted} complete trials with a prediction`;
  document.getElementById("kendall").dataset.tau = h.kendall_tau === null ? "" : String(h.kendall_tau);
  document.getElementById("kendall").dataset.n = String(h.n_predicted);
  Plotly.react(
    "predicted-scatter",
    [{ x: pts.map((t) => t.predicted), y: pts.map((t) => t.value), text: pts.map((t) => `#${t.number}`), mode: "markers", type: "scatter" }],
    { title: { text: "Predicted against measured" }, xaxis: { title: { text: "predicted" } }, yaxis: { title: { text: `measured ${h.metric}` } } },
  );
}

function errorKey(msg) {
  return msg.split("\n")[0].replace(/\d+(\.\d+)?/g, "#").slice(0, 160);
}

function infeasibility(h) {
  const counts = new Map(); // "knob=value" -> [infeasible, all finished]
  const errors = new Map();
  for (const t of h.trials) {
    if (!["complete", "infeasible"].includes(t.state)) continue;
    for (const [k, v] of Object.entries(t.params)) {
      const key = `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`;
      const c = counts.get(key) || [0, 0];
      c[1] += 1;
      if (t.state === "infeasible") c[0] += 1;
      counts.set(key, c);
    }
    if (t.state === "infeasible") {
      const e = errorKey(t.error || "(no message)");
      errors.set(e, (errors.get(e) || 0) + 1);
    }
  }
  document.getElementById("infeasible-knobs").hidden = errors.size === 0;
  document.getElementById("no-infeasible").hidden = errors.size !== 0;
  const top = [...counts.entries()].filter(([, c]) => c[0] > 0).sort((a, b) => b[1][0] - a[1][0]).slice(0, 25).reverse();
  Plotly.react(
    "infeasible-knobs",
    [
      {
        type: "bar",
        orientation: "h",
        y: top.map(([k]) => k),
        x: top.map(([, c]) => c[0]),
        text: top.map(([, c]) => `${c[0]} of ${c[1]}`),
        hoverinfo: "y+text",
      },
    ],
    { title: { text: "Infeasible trials per knob value" }, margin: { l: 200 }, xaxis: { title: { text: "infeasible trials" } } },
  );
  const rows = [...errors.entries()].sort((a, b) => b[1] - a[1]).map(([e, n]) =>
    el("tr", {}, el("td", { class: "num" }, String(n)), el("td", { class: "error" }, e)),
  );
  document.querySelector("#errors tbody").replaceChildren(...rows);
}

function parallel(h) {
  const done = h.trials.filter((t) => t.value !== null);
  done.sort((a, b) => (minimize(h) ? a.value - b.value : b.value - a.value));
  const top = done.slice(0, TOP);
  if (top.length === 0) return;
  const knobs = [...new Set(top.flatMap((t) => Object.keys(t.params)))].sort();
  const dims = knobs.map((k) => {
    const vals = top.map((t) => t.params[k]);
    if (vals.every((v) => typeof v === "number")) return { label: k, values: vals };
    const cats = [...new Set(vals.map((v) => String(v)))].sort();
    return { label: k, values: vals.map((v) => cats.indexOf(String(v))), tickvals: cats.map((_, i) => i), ticktext: cats };
  });
  dims.push({ label: h.metric, values: top.map((t) => t.value) });
  Plotly.react(
    "parallel",
    [{ type: "parcoords", line: { color: top.map((t) => t.value), colorscale: "Viridis", showscale: true }, dimensions: dims }],
    { title: { text: `Top ${top.length} configurations` }, margin: { l: 60, r: 60 } },
  );
}

function bestConfig(best) {
  const line = document.getElementById("best-line");
  if (!best) {
    line.textContent = "No complete trial within the constraints yet.";
    return;
  }
  line.textContent =
    `Trial #${best.trial.number}: ${best.metric} ${fmt(best.value)}` +
    (best.speedup ? `, ${best.speedup.toFixed(3)}× the baseline (${fmt(best.baseline_value)})` : "");
  line.dataset.value = String(best.value);
  const yaml = toYaml(best.trial.params);
  const json = JSON.stringify(best.trial.params, null, 2);
  document.getElementById("best-yaml").textContent = yaml;
  document.getElementById("best-json").textContent = json;
  document.getElementById("copy-yaml").replaceChildren(copyButton(() => yaml));
  document.getElementById("copy-json").replaceChildren(copyButton(() => json));
}

function summary(study, best) {
  const p = study.progress;
  const done = ["complete", "infeasible", "failed", "pruned"].reduce((a, k) => a + p.counts[k], 0);
  document.title = `${study.name} · cubic`;
  document.getElementById("study-name").textContent = `Study ${study.id}: ${study.name}`;
  const s = document.getElementById("summary");
  s.dataset.done = String(done);
  s.dataset.max = String(p.max_trials);
  s.replaceChildren(
    el("span", { class: `state-${study.state}` }, `state ${study.state}`),
    el("span", { id: "progress" }, `${done} / ${p.max_trials} trials`),
    el("span", {}, Object.entries(p.counts).filter(([, n]) => n).map(([k, n]) => `${k} ${n}`).join(", ")),
    el("span", { id: "best-value" }, `best ${fmt(p.best_value)}`),
    el("span", {}, best && best.speedup ? `speed-up ${best.speedup.toFixed(3)}×` : ""),
  );
}

function configText(params) {
  return Object.entries(params)
    .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`)
    .join(" ");
}

function cell(v, cls = "num") {
  return el("td", { class: cls }, fmt(v));
}

function renderTrials() {
  const items = [...table.items];
  if (table.sortKey) {
    const key = (t) =>
      table.sortKey === "value" ? (t.metrics || {})[metric] ?? null
      : table.sortKey === "predicted" ? (t.predicted || {}).value ?? null
      : table.sortKey === "gpu_hours" ? (t.metrics || {}).gpu_hours ?? null
      : t[table.sortKey];
    items.sort((a, b) => {
      const x = key(a), y = key(b);
      if (x === y) return a.number - b.number;
      if (x === null) return 1;
      if (y === null) return -1;
      return (x < y ? -1 : 1) * table.sortDir;
    });
  }
  const rows = items.map((t) =>
    el(
      "tr",
      { dataset: { number: t.number, state: t.state } },
      cell(t.number),
      el("td", { class: `state-${t.state}` }, t.state),
      cell(t.state === "complete" ? (t.metrics || {})[metric] : null),
      cell((t.predicted || {}).value ?? null),
      cell((t.metrics || {}).gpu_hours ?? null),
      el("td", {}, t.finished_at ? new Date(t.finished_at).toLocaleTimeString() : "–"),
      el("td", { class: "params" }, configText(t.params)),
      el("td", { class: "error" }, t.error ? t.error.split("\n")[0].slice(0, 200) : ""),
    ),
  );
  document.querySelector("#trials tbody").replaceChildren(...rows);
  const end = table.offset + table.items.length;
  const range = document.getElementById("trials-range");
  range.textContent = table.total ? `${table.offset + 1}–${end} of ${table.total}` : "no trials";
  range.dataset.total = String(table.total);
  document.getElementById("prev").disabled = table.offset === 0;
  document.getElementById("next").disabled = end >= table.total;
}

async function loadTrials() {
  const limit = Number(document.getElementById("page-size").value);
  const q = new URLSearchParams({ limit, offset: table.offset, order: table.order });
  if (table.state) q.append("state", table.state);
  const page = await api(`studies/${id}/trials?${q}`);
  if (page.items.length === 0 && page.total > 0 && table.offset > 0) {
    table.offset = Math.max(0, Math.floor((page.total - 1) / limit) * limit);
    return loadTrials();
  }
  table.items = page.items;
  table.total = page.total;
  renderTrials();
}

function wireTable() {
  document.getElementById("state-filter").addEventListener("change", (ev) => {
    table.state = ev.target.value;
    table.offset = 0;
    loadTrials();
  });
  document.getElementById("page-size").addEventListener("change", () => {
    table.offset = 0;
    loadTrials();
  });
  document.getElementById("prev").addEventListener("click", () => {
    table.offset = Math.max(0, table.offset - Number(document.getElementById("page-size").value));
    loadTrials();
  });
  document.getElementById("next").addEventListener("click", () => {
    table.offset += Number(document.getElementById("page-size").value);
    loadTrials();
  });
  for (const th of document.querySelectorAll("#trials th.sortable")) {
    th.addEventListener("click", () => {
      if (th.dataset.order) {
        const o = th.dataset.order;
        table.order = table.order === o ? `-${o}` : o;
        table.sortKey = null;
        table.offset = 0;
        loadTrials();
      } else {
        table.sortDir = table.sortKey === th.dataset.key ? -table.sortDir : 1;
        table.sortKey = th.dataset.key;
        renderTrials();
      }
    });
  }
}

if (!id) {
  document.getElementById("error").hidden = false;
  document.getElementById("error").textContent = "no study: open study.html?id=<study id>";
} else {
  wireTable();
  refreshing(async () => {
    const [study, best, h] = await Promise.all([
      api(`studies/${id}`),
      api(`studies/${id}/best`, { allow404: true }),
      live ? api(`studies/${id}/history`) : Promise.resolve(null),
    ]);
    metric = study.spec.objectives ? study.spec.objectives[0].metric : metric;
    document.getElementById("value-header").textContent = metric;
    summary(study, best);
    bestConfig(best);
    await loadTrials();
    if (h) {
      bestSoFar(h);
      predictedScatter(h);
      infeasibility(h);
      parallel(h);
    }
    live = LIVE_STATES.has(study.state);
    return live;
  });
}
