// Shared helpers of the dashboard pages: API calls (with the token when one is needed),
// the token form, bounded periodic refresh, formatting.

const API = new URL("../v1/", window.location.href);
const TOKEN_KEY = "cubic-token";
export const REFRESH_MS = 5000;
export const MAX_REFRESHES = 720; // an hour of 5 s refreshes, then the page stops polling

export class Unauthorized extends Error {}

export function token() {
  return window.sessionStorage.getItem(TOKEN_KEY);
}

/** GET a JSON resource of the API (path relative to /v1/); null for a 404 when allowed. */
export async function api(path, { allow404 = false } = {}) {
  const headers = { Accept: "application/json" };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  const resp = await fetch(new URL(path, API), { headers });
  if (resp.status === 401) throw new Unauthorized((await resp.json()).detail);
  if (resp.status === 404 && allow404) return null;
  if (!resp.ok) {
    let detail = resp.statusText;
    try {
      detail = (await resp.json()).detail;
    } catch (e) {
      /* not JSON */
    }
    throw new Error(`${resp.status} ${path}: ${detail}`);
  }
  return resp.json();
}

/** Show the token form (authentication is on); submitting it stores the token and reruns. */
export function askToken(message, rerun) {
  const box = document.getElementById("auth");
  box.hidden = false;
  document.getElementById("auth-message").textContent = message || "";
  const form = document.getElementById("token-form");
  form.onsubmit = (ev) => {
    ev.preventDefault();
    const value = document.getElementById("token-input").value.trim();
    if (value) window.sessionStorage.setItem(TOKEN_KEY, value);
    box.hidden = true;
    rerun();
  };
}

export function showError(err) {
  const box = document.getElementById("error");
  box.hidden = !err;
  box.textContent = err ? String(err.message || err) : "";
}

/**
 * Run ``load`` now, then every REFRESH_MS while it returns true (something still runs),
 * at most MAX_REFRESHES times. A 401 shows the token form instead.
 */
export function refreshing(load) {
  let count = 0;
  let timer = null;
  const run = async () => {
    clearTimeout(timer);
    let again = false;
    try {
      again = await load();
      showError(null);
    } catch (err) {
      if (err instanceof Unauthorized) {
        askToken(err.message, run);
        return;
      }
      showError(err);
      again = true; // a passing outage: try again later
    }
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
    if (again && ++count <= MAX_REFRESHES) timer = setTimeout(run, REFRESH_MS);
  };
  run();
}

export function fmt(v, digits = 4) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") {
    if (Number.isInteger(v)) return v.toLocaleString("en-US");
    return Math.abs(v) >= 1000
      ? v.toLocaleString("en-US", { maximumFractionDigits: 1 })
      : v.toPrecision(digits);
  }
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

const PLAIN = /^[A-Za-z_][A-Za-z0-9_.\-]*$/;
const RESERVED = new Set(["true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"]);

function yamlScalar(v) {
  if (typeof v === "string") {
    return PLAIN.test(v) && !RESERVED.has(v.toLowerCase()) ? v : JSON.stringify(v);
  }
  return JSON.stringify(v); // numbers, booleans, null; lists and maps in flow style
}

/** A flat mapping as block YAML (nested values in flow style, which YAML reads too). */
export function toYaml(obj) {
  return Object.entries(obj)
    .map(([k, v]) => `${yamlScalar(k)}: ${yamlScalar(v)}`)
    .join("\n");
}

export function copyButton(getText) {
  const b = el("button", { type: "button", class: "copy" }, "Copy");
  b.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(getText());
      b.textContent = "Copied";
    } catch (e) {
      b.textContent = "Select and copy";
    }
    setTimeout(() => (b.textContent = "Copy"), 1500);
  });
  return b;
}

export const LIVE_STATES = new Set(["running", "paused"]);

/** Resolves once plotly.js, loaded by ``<script id="plotly-js" async>``, has run. */
export function plotlyReady() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  const script = document.getElementById("plotly-js");
  return new Promise((resolve, reject) => {
    script.addEventListener("load", () => resolve(window.Plotly));
    script.addEventListener("error", () => reject(new Error("plotly.js did not load")));
  });
}
