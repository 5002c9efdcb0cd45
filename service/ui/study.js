// One study: best so far, the Pareto front (two objectives or more), the trials table
// (paged by the API), predicted against measured, knob importance, why configurations were
// infeasible, the best configuration, the top configurations. When every panel is drawn the
// first time, body[data-rendered] holds the milliseconds since navigation start (what
// `cubic bench dashboard` reports).
import { api, copyButton, el, fmt, LIVE_STATES, plotlyReady, refreshing, toYaml } from "./common.js";

const id = Number(new URLSearchParams(window.location.search).get("id"));
const table = { offset: 0, order: "number", state: "", sortKey: null, sortDir: 1, items: [], total: 0 };
let metric = "value";
let live = true;
const TOP = 50;
// Beyond this many points predicted against measured is drawn as a density (a 2-D
// histogram, one image): SVG markers cost a DOM node each (10,000 take seconds to lay out),
// WebGL costs a context that a software renderer builds slowly, and 10,000 overlapping
// markers hide where most of them lie anyway.
const DENSITY_POINTS = 1000;

function minimize(h) {
  return h.direction === "minimize";
}

// Best so far is a step function: only the trials that improved it (and the last trial,
// where the line ends) are plotted, which draws the same line from a few dozen points
// instead of one per trial.
function bestSoFar(h) {
  const byTrial = { x: [], y: [] };
  const byHours = { x: [], y: [] };
  const { number, value, gpu_hours: gpuHours } = h.trials;
  let best = null;
  let hours = 0;
  for (let i = 0; i < number.length; i++) {
    hours += gpuHours[i] || 0;
    const v = value[i];
    if (v === null) continue;
    if (best === null || (minimize(h) ? v < best : v > best)) {
      best = v;
      byTrial.x.push(number[i]);
      byTrial.y.push(best);
      byHours.x.push(hours);
      byHours.y.push(best);
    }
  }
  const last = number[number.length - 1];
  if (best !== null && byTrial.x[byTrial.x.length - 1] !== last) {
    byTrial.x.push(last);
    byTrial.y.push(best);
    byHours.x.push(hours);
    byHours.y.push(best);
  }
  const layout = (title, x) => ({ title: { text: title }, xaxis: { title: { text: x } }, yaxis: { title: { text: `best ${h.metric}` } } });
  const line = (s) => ({ x: s.x, y: s.y, mode: "lines+markers", line: { shape: "hv" } });
  return [
    Plotly.react("best-by-trial", [line(byTrial)], layout("Best so far by trial", "trial number")),
    Plotly.react("best-by-hours", [line(byHours)], layout("Best so far by GPU-hours", "GPU-hours used")),
  ];
}

// The Pareto front of a study of two or more objectives, in the plane of the first two:
// every measured trial (a density beyond DENSITY_POINTS, as predicted against measured),
// the front's trials (what GET /pareto answers) on top, joined as the staircase that bounds
// what they dominate. A click on a front point shows its configuration.
const pareto = { points: [], picked: null, wired: false };

function paretoLabel(o) {
  return `${o.metric} (${o.direction === "minimize" ? "lower" : "higher"} is better)`;
}

function paretoValues(p, objectives) {
  return objectives.map((o) => `${o.metric} ${fmt(p.values[o.metric])}`).join("<br>");
}

function pickFront(trialId) {
  const p = pareto.points.find((q) => q.trial.id === trialId);
  const box = document.getElementById("pareto-config");
  const line = document.getElementById("pareto-line");
  pareto.picked = p ? trialId : null;
  box.hidden = !p;
  if (!p) {
    delete line.dataset.trialId;
    line.textContent = "Click a point of the front for its configuration.";
    return;
  }
  line.dataset.trialId = String(p.trial.id);
  line.dataset.number = String(p.trial.number);
  line.textContent =
    `Trial #${p.trial.number} on the front: ` +
    Object.entries(p.values).map(([m, v]) => `${m} ${fmt(v)}`).join(", ");
  showConfig("pareto", p.trial.params);
}

function paretoFront(h, front) {
  const panel = document.getElementById("pareto-panel");
  const box = document.getElementById("pareto");
  const objectives = front ? front.objectives : [];
  panel.hidden = objectives.length < 2;
  if (panel.hidden) {
    Plotly.purge(box);
    return Promise.resolve();
  }
  const [ox, oy] = objectives;
  pareto.points = front.points;
  const note = document.getElementById("pareto-note");
  note.textContent =
    `${front.points.length} trials on the front of ${front.n_measured} measured configurations` +
    (objectives.length > 2
      ? `; the front is over all ${objectives.length} objectives (${objectives.map((o) => o.metric).join(", ")}), ` +
        `shown in the plane of the first two, where some of its trials may look dominated.`
      : ".");
  note.dataset.objectives = String(objectives.length);
  const cloud = { x: [], y: [], text: [] };
  const { number, value } = h.trials;
  const second = h.value2 || [];
  for (let i = 0; i < number.length; i++) {
    if (value[i] === null || second[i] === null || second[i] === undefined) continue;
    cloud.x.push(value[i]);
    cloud.y.push(second[i]);
    cloud.text.push(String(number[i]));
  }
  const dense = cloud.x.length > DENSITY_POINTS;
  const all = dense
    ? {
        x: cloud.x,
        y: cloud.y,
        type: "histogram2d",
        nbinsx: 60,
        nbinsy: 60,
        colorscale: [[0, "rgba(255,255,255,0)"], [1e-9, "#e5e5e5"], [0.2, "#a0a0a0"], [1, "#404040"]],
        colorbar: { title: { text: "trials" } },
        hovertemplate: `${ox.metric} %{x}<br>${oy.metric} %{y}<br>%{z} trials<extra></extra>`,
        name: "measured",
      }
    : {
        ...cloud,
        type: "scatter",
        mode: "markers",
        marker: { size: 5, color: "#b0b0b0" },
        hovertemplate: `trial #%{text}<br>${ox.metric} %{x}<br>${oy.metric} %{y}<extra>measured</extra>`,
        name: "measured",
      };
  const points = front.points;
  const onFront = {
    x: points.map((p) => p.values[ox.metric]),
    y: points.map((p) => p.values[oy.metric]),
    customdata: points.map((p) => p.trial.id),
    text: points.map((p) => `trial #${p.trial.number}<br>${paretoValues(p, objectives)}`),
    hovertemplate: "%{text}<extra>Pareto front</extra>",
    type: "scatter",
    // Best first by the first objective, so "hv" draws the staircase; over three or more
    // objectives the front is no staircase in this plane, so its points stand alone.
    mode: objectives.length > 2 ? "markers" : "lines+markers",
    line: { shape: "hv", color: "#c01c28", width: 2 },
    marker: { size: 10, color: "#c01c28", line: { color: "#fff", width: 1 } },
    name: "Pareto front",
  };
  const drawn = Plotly.react(box, [all, onFront], {
    title: { text: `Pareto front: ${ox.metric} against ${oy.metric}` },
    xaxis: { title: { text: paretoLabel(ox) } },
    yaxis: { title: { text: paretoLabel(oy) } },
    hovermode: "closest",
    legend: { orientation: "h", y: -0.2 },
    height: 460,
  });
  return drawn.then(() => {
    if (!pareto.wired) {
      pareto.wired = true;
      box.on("plotly_click", (ev) => {
        // a front trial is drawn twice (measured, and on the front): either one picks it
        for (const pt of ev.points) {
          const p =
            pt.data.name === "Pareto front"
              ? pareto.points[pt.pointIndex]
              : pareto.points.find((q) => String(q.trial.number) === pt.text);
          if (p) return pickFront(p.trial.id);
        }
      });
    }
    pickFront(pareto.picked); // kept while the trial stays on the front
  });
}

function predictedScatter(h) {
  const { number, value, predicted } = h.trials;
  const pts = { x: [], y: [], text: [] };
  for (let i = 0; i < number.length; i++) {
    if (predicted[i] === null || value[i] === null) continue;
    pts.x.push(predicted[i]);
    pts.y.push(value[i]);
    pts.text.push(`#${number[i]}`);
  }
  const dense = pts.x.length > DENSITY_POINTS;
  document.getElementById("kendall").textContent =
    `Kendall's tau ${h.kendall_tau === null ? "–" : h.kendall_tau.toFixed(3)} over ${h.n_predicted} complete trials with a prediction`;
  document.getElementById("kendall").dataset.tau = h.kendall_tau === null ? "" : String(h.kendall_tau);
  document.getElementById("kendall").dataset.n = String(h.n_predicted);
  return Plotly.react(
    "predicted-scatter",
    [
      dense
        ? {
            x: pts.x,
            y: pts.y,
            type: "histogram2d",
            nbinsx: 60,
            nbinsy: 60,
            // empty bins blank, then light to dark by count
            colorscale: [[0, "rgba(255,255,255,0)"], [1e-9, "#deebf7"], [0.2, "#6baed6"], [1, "#08306b"]],
            colorbar: { title: { text: "trials" } },
            hovertemplate: "predicted %{x}<br>measured %{y}<br>%{z} trials<extra></extra>",
          }
        : { ...pts, mode: "markers", type: "scatter", marker: { size: 6 } },
    ],
    { title: { text: "Predicted against measured" }, xaxis: { title: { text: "predicted" } }, yaxis: { title: { text: `measured ${h.metric}` } } },
  );
}

function importance(imp) {
  const note = document.getElementById("importance-note");
  const box = document.getElementById("importance");
  box.dataset.version = imp.model_version === null ? "" : String(imp.model_version);
  if (imp.knobs.length === 0) {
    note.textContent = imp.reason || "No knob importance yet.";
    box.hidden = true;
    Plotly.purge(box);
    return Promise.resolve();
  }
  box.hidden = false;
  note.textContent =
    `Proxy model ${imp.workload_kind} v${imp.model_version} (fitted on ${imp.n_train} trials): each knob's share of the trees' total gain; ` +
    `${(100 * imp.other_share).toFixed(1)} % of the gain is on workload columns no knob of this study moves.`;
  const knobs = [...imp.knobs].reverse(); // the largest share at the top
  return Plotly.react(
    box,
    [
      {
        type: "bar",
        orientation: "h",
        y: knobs.map((k) => k.knob),
        x: knobs.map((k) => k.share),
        text: knobs.map((k) => `${(100 * k.share).toFixed(1)} %`),
        hovertext: knobs.map((k) => k.features.slice(0, 6).join(", ")),
        hoverinfo: "y+text+hovertext",
      },
    ],
    {
      title: { text: "Knob importance (share of total gain)" },
      margin: { l: 180 },
      height: Math.max(300, 24 * knobs.length + 120),
      xaxis: { title: { text: "share" }, tickformat: ".0%" },
    },
  );
}

function infeasibility(h) {
  const none = h.errors.length === 0;
  document.getElementById("infeasible-knobs").hidden = none;
  document.getElementById("no-infeasible").hidden = !none;
  const label = (c) => `${c.knob}=${typeof c.value === "object" ? JSON.stringify(c.value) : c.value}`;
  const top = h.infeasible_by_value.slice(0, 25).reverse();
  const rows = h.errors.map((g) =>
    el("tr", {}, el("td", { class: "num" }, String(g.trials)), el("td", { class: "error" }, g.message)),
  );
  document.querySelector("#errors tbody").replaceChildren(...rows);
  return Plotly.react(
    "infeasible-knobs",
    [
      {
        type: "bar",
        orientation: "h",
        y: top.map(label),
        x: top.map((c) => c.infeasible),
        text: top.map((c) => `${c.infeasible} of ${c.finished}`),
        hoverinfo: "y+text",
      },
    ],
    { title: { text: "Infeasible trials per knob value" }, margin: { l: 200 }, xaxis: { title: { text: "infeasible trials" } } },
  );
}

// Viridis at 11 stops (plotly's own colours), for lines coloured by their value.
const VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725", "#fde725"];

function viridis(f) {
  return VIRIDIS[Math.max(0, Math.min(9, Math.floor(f * 10)))];
}

/** One axis of the parallel coordinates: where each value sits (0..1) and its tick labels.
 *  Values are placed in order, evenly spaced (parallel degrees 1, 2, 4, 8 as equal steps);
 *  an axis with more than 8 distinct values labels its ends only. */
function ordinalAxis(label, vals) {
  const numeric = vals.every((v) => typeof v === "number");
  const key = (v) => (typeof v === "object" ? JSON.stringify(v) : String(v));
  const distinct = [...new Map(vals.map((v) => [key(v), v])).values()];
  distinct.sort((a, b) => (numeric ? a - b : key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
  const pos = new Map(distinct.map((v, i) => [key(v), distinct.length > 1 ? i / (distinct.length - 1) : 0.5]));
  const shown = distinct.length <= 8 ? distinct : [distinct[0], distinct[distinct.length - 1]];
  return { label, at: (v) => pos.get(key(v)), ticks: shown.map((v) => [pos.get(key(v)), numeric ? fmt(v) : key(v)]) };
}

// The top configurations as parallel coordinates, drawn in SVG (one line per configuration,
// coloured by its value, the best drawn last): plotly's parcoords needs WebGL, which costs
// seconds where the browser renders it in software.
function parallel(h) {
  const top = h.top.slice(0, TOP);
  if (top.length === 0) return Promise.resolve();
  const knobs = [...new Set(top.flatMap((t) => Object.keys(t.params)))].sort();
  const param = (t, name) => (name in t.params ? t.params[name] : null);
  const axes = knobs.map((k) => ordinalAxis(k, top.map((t) => param(t, k))));
  const lo = Math.min(...top.map((t) => t.value));
  const hi = Math.max(...top.map((t) => t.value));
  const scale = (v) => (hi > lo ? (v - lo) / (hi - lo) : 0.5);
  axes.push({ label: h.metric, at: scale, ticks: [[0, fmt(lo)], [1, fmt(hi)]] });
  const xs = axes.map((_, i) => i);
  const lines = [...top].reverse().map((t) => ({
    type: "scatter",
    mode: "lines",
    x: xs,
    y: axes.map((a, i) => (i === knobs.length ? a.at(t.value) : a.at(param(t, knobs[i])))),
    line: { color: viridis(scale(t.value)), width: 1.5 },
    hovertemplate: `#${t.number}: ${h.metric} ${fmt(t.value)}<extra></extra>`,
    showlegend: false,
  }));
  const colorbar = {
    type: "scatter",
    mode: "markers",
    x: [null],
    y: [null],
    marker: { color: [lo, hi], cmin: lo, cmax: hi, colorscale: "Viridis", showscale: true, colorbar: { title: { text: h.metric } } },
    hoverinfo: "skip",
    showlegend: false,
  };
  const shapes = xs.map((x) => ({ type: "line", x0: x, x1: x, y0: 0, y1: 1, line: { color: "#888", width: 1 } }));
  // tick labels as one text trace: far cheaper to lay out than an annotation each
  const ticks = axes.flatMap((a, i) => a.ticks.map(([y, text]) => ({ x: i, y, text })));
  const labels = {
    type: "scatter",
    mode: "text",
    x: ticks.map((t) => t.x),
    y: ticks.map((t) => t.y),
    text: ticks.map((t) => t.text),
    textposition: "middle right",
    textfont: { size: 10 },
    hoverinfo: "skip",
    showlegend: false,
  };
  return Plotly.react("parallel", [...lines, labels, colorbar], {
    title: { text: `Top ${top.length} configurations` },
    xaxis: { tickvals: xs, ticktext: axes.map((a) => a.label), tickangle: -30, showgrid: false, zeroline: false, range: [-0.3, axes.length - 0.4] },
    yaxis: { visible: false, range: [-0.05, 1.05] },
    shapes,
    hovermode: "closest",
    margin: { l: 40, r: 40, b: 110 },
    height: 480,
  });
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
  showConfig("best", best.trial.params);
}

/** A configuration as YAML and JSON, each with a copy button (#<prefix>-yaml, -json). */
function showConfig(prefix, params) {
  const yaml = toYaml(params);
  const json = JSON.stringify(params, null, 2);
  document.getElementById(`${prefix}-yaml`).textContent = yaml;
  document.getElementById(`${prefix}-json`).textContent = json;
  document.getElementById(`${prefix}-copy-yaml`).replaceChildren(copyButton(() => yaml));
  document.getElementById(`${prefix}-copy-json`).replaceChildren(copyButton(() => json));
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

/** The trials page the table shows (a page past the end falls back to the last one). */
async function fetchTrials() {
  const limit = Number(document.getElementById("page-size").value);
  const q = new URLSearchParams({ limit, offset: table.offset, order: table.order });
  if (table.state) q.append("state", table.state);
  const page = await api(`studies/${id}/trials?${q}`);
  if (page.items.length === 0 && page.total > 0 && table.offset > 0) {
    table.offset = Math.max(0, Math.floor((page.total - 1) / limit) * limit);
    return fetchTrials();
  }
  table.items = page.items;
  table.total = page.total;
}

async function loadTrials() {
  await fetchTrials();
  renderTrials();
}

// When plotly.js (4 MB) has been fetched and run: `cubic bench dashboard` reports how long
// the page takes to draw after it, as well as from navigation start.
plotlyReady().then(() => {
  document.body.dataset.plotlyReady = performance.now().toFixed(0);
});

/** Once, when every panel has been drawn: milliseconds since navigation start. */
function markRendered() {
  if (document.body.dataset.rendered) return;
  requestAnimationFrame(() => {
    document.body.dataset.rendered = performance.now().toFixed(0);
  });
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
    // every request at once: the slowest one, not their sum, is what a load waits for
    const asked = api(`studies/${id}`);
    const [study, best, h, imp, front] = await Promise.all([
      asked,
      api(`studies/${id}/best`, { allow404: true }),
      live ? api(`studies/${id}/history?top=${TOP}`) : Promise.resolve(null),
      live ? api(`studies/${id}/importance`) : Promise.resolve(null),
      // the front only for two objectives or more (one objective's front is its best)
      live ? asked.then((s) => (s.spec.objectives.length > 1 ? api(`studies/${id}/pareto`) : null)) : Promise.resolve(null),
      fetchTrials(),
    ]);
    metric = study.spec.objectives ? study.spec.objectives[0].metric : metric;
    document.getElementById("value-header").textContent = metric;
    summary(study, best);
    bestConfig(best);
    renderTrials();
    await plotlyReady();
    const drawn = [];
    if (h) drawn.push(...bestSoFar(h), paretoFront(h, front), predictedScatter(h), infeasibility(h), parallel(h));
    if (imp) drawn.push(importance(imp));
    await Promise.all(drawn);
    markRendered();
    live = LIVE_STATES.has(study.state);
    return live;
  });
}
