// Studies list: state, progress, best value, speed-up over the baseline, active workers.
import { api, el, fmt, LIVE_STATES, refreshing } from "./common.js";

const PAGE = 100;
const MAX_STUDIES = 1000;

async function allStudies() {
  const items = [];
  let total = 0;
  do {
    const page = await api(`studies?limit=${PAGE}&offset=${items.length}`);
    total = page.total;
    items.push(...page.items);
    if (page.items.length === 0) break;
  } while (items.length < Math.min(total, MAX_STUDIES));
  return { items, total };
}

async function row(s) {
  const [detail, best, running] = await Promise.all([
    api(`studies/${s.id}`),
    api(`studies/${s.id}/best`, { allow404: true }),
    LIVE_STATES.has(s.state)
      ? api(`studies/${s.id}/trials?state=running&limit=500`)
      : Promise.resolve({ items: [] }),
  ]);
  const p = detail.progress;
  const done = ["complete", "infeasible", "failed", "pruned"].reduce((a, k) => a + p.counts[k], 0);
  const workers = new Set(running.items.map((t) => t.worker_id).filter(Boolean));
  const link = el("a", { href: `study.html?id=${s.id}` }, s.name);
  return el(
    "tr",
    { dataset: { studyId: s.id, done, max: p.max_trials } },
    el("td", { class: "num" }, String(s.id)),
    el("td", {}, link),
    el("td", {}, s.workload_kind),
    el("td", { class: `state-${s.state}` }, s.state),
    el("td", { class: "num progress" }, `${done} / ${p.max_trials}`),
    el("td", { class: "num best" }, fmt(p.best_value)),
    el("td", { class: "num speedup" }, best && best.speedup ? `${best.speedup.toFixed(3)}×` : "–"),
    el("td", { class: "num workers" }, LIVE_STATES.has(s.state) ? String(workers.size) : "–"),
  );
}

refreshing(async () => {
  const { items, total } = await allStudies();
  const rows = await Promise.all(items.map(row));
  document.querySelector("#studies tbody").replaceChildren(...rows);
  document.getElementById("studies-total").textContent =
    `${total} stud${total === 1 ? "y" : "ies"}` + (total > items.length ? `, first ${items.length} shown` : "");
  return items.some((s) => LIVE_STATES.has(s.state));
});
