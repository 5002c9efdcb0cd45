// Proxy models: stored versions per workload kind and their measured quality.
import { api, el, fmt, refreshing } from "./common.js";

function tau(section) {
  return section && typeof section.kendall_tau === "number" ? section.kendall_tau : null;
}

function others(metrics) {
  const out = {};
  for (const [k, v] of Object.entries(metrics || {})) {
    if (k === "cv" || k === "holdout") continue;
    out[k] = v;
  }
  return JSON.stringify(out);
}

refreshing(async () => {
  const { models } = await api("proxy-models");
  const rows = models.map((m) =>
    el(
      "tr",
      { dataset: { kind: m.workload_kind, version: m.version } },
      el("td", {}, m.workload_kind),
      el("td", { class: "num" }, String(m.version)),
      el("td", {}, new Date(m.created_at).toLocaleString()),
      el("td", { class: "num" }, fmt(m.n_train)),
      el("td", { class: "num" }, fmt(m.n_features)),
      el("td", { class: "num" }, fmt(tau(m.metrics.cv), 3)),
      el("td", { class: "num" }, fmt(tau(m.metrics.holdout), 3)),
      el("td", { class: "params" }, others(m.metrics)),
    ),
  );
  document.querySelector("#models tbody").replaceChildren(...rows);
  document.getElementById("models-total").textContent = `${models.length} model version(s)`;
  const kinds = [...new Set(models.map((m) => m.workload_kind))];
  const traces = kinds.flatMap((k) => {
    const ms = models.filter((m) => m.workload_kind === k);
    return [
      { x: ms.map((m) => m.version), y: ms.map((m) => tau(m.metrics.cv)), name: `${k} CV`, mode: "lines+markers" },
      { x: ms.map((m) => m.version), y: ms.map((m) => tau(m.metrics.holdout)), name: `${k} hold-out`, mode: "lines+markers" },
    ];
  });
  Plotly.react("tau-plot", traces, {
    title: { text: "Kendall's tau by model version" },
    xaxis: { title: { text: "version" } },
    yaxis: { title: { text: "tau" }, range: [-1, 1] },
  });
  return true; // models are refitted while studies run
});
