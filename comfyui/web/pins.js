// pins in ComfyUI's web UI: its settings (settings dialog, category "pins") and
// a sidebar tab that shows what pins holds and does, from GET /pins/stats
// (comfyui/routes.py). Settings that pins can change in a running ComfyUI go to
// POST /pins/settings at once; the others apply at the next start (Note
// [ComfyUI settings of pins] in comfyui/settings.py).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const POLL_MS = 2000;
const SUBSETS = ["weights", "weights-loaded", "patches", "patches-loaded"];
const COLORS = { served: "#4caf50", disk: "#e57373", fills: "#64b5f6" };

function size(n) {
  if (n === null || n === undefined) return "n/a";
  for (const [unit, shift] of [["GiB", 30], ["MiB", 20], ["KiB", 10]]) {
    if (Math.abs(n) >= 2 ** shift) return `${(n / 2 ** shift).toFixed(1)} ${unit}`;
  }
  return `${n} B`;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "style") e.style.cssText = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

async function fetchStats() {
  const r = await api.fetchApi("/pins/stats");
  if (!r.ok) throw new Error(`GET /pins/stats: HTTP ${r.status}`);
  return r.json();
}

async function applySetting(id, value) {
  const r = await api.fetchApi("/pins/settings", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ [id]: value }),
  });
  const body = await r.json();
  const toast = app.extensionManager?.toast;
  if (!r.ok) {
    toast?.add({ severity: "error", summary: "pins", detail: body.error, life: 8000 });
    return;
  }
  const detail = body.next_start.length
    ? `${body.next_start.join(", ")}: applied at the next start of ComfyUI`
    : `applied now (${body.applied || "pins' own value"})`;
  toast?.add({ severity: "info", summary: "pins", detail, life: 5000 });
  panel.refresh();
}

// A setting's onChange runs at registration too (oldValue undefined): only a
// change the user makes goes to the server.
function onChange(id) {
  return (value, oldValue) => {
    if (oldValue !== undefined && value !== oldValue) applySetting(id, value);
  };
}

const SETTINGS = [
  { id: "pins.Enabled", name: "Use pins (pinned host-RAM cache of model weights)", type: "boolean",
    defaultValue: true, category: ["pins", "pins", "Enabled"],
    tooltip: "Applied at the next start of ComfyUI. Off: pins installs no hook and ComfyUI runs as without it." },
  { id: "pins.Policy", name: "Eviction policy", type: "combo", defaultValue: "default",
    options: ["default", "trace", "mru", "lru", "reuse"], category: ["pins", "pins", "Policy"],
    tooltip: "Which pin goes first when RAM runs short. default: PINS_CONF's or pins' own (trace). Applied at once." },
  { id: "pins.Headroom", name: "RAM headroom (e.g. 6G; empty: derived from the machine)", type: "text",
    defaultValue: "", category: ["pins", "pins", "Headroom"],
    tooltip: "Available RAM pins keeps free. Applied at once; emptied, at the next start." },
  { id: "pins.Share", name: "Share pins with the other ComfyUI processes of this machine", type: "boolean",
    defaultValue: false, category: ["pins", "pins", "Share"],
    tooltip: "One pinned copy of a file's tensors for every process that has it on (Linux). Applied at the next start." },
  { id: "pins.CpuTargets", name: "Serve casts to the CPU (--cpu)", type: "boolean", defaultValue: false,
    category: ["pins", "pins", "CPU"],
    tooltip: "Under --cpu a pin only adds a copy of each weight in RAM: off unless testing. Applied at the next start." },
].map((s) => ({ ...s, onChange: onChange(s.id) }));

// The bars of the last prompts: bytes served from pins, read from disk by the
// process, read from files into pins.
function chart(prompts) {
  const w = 300, h = 110, pad = 14;
  const svgNS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("width", w);
  svg.setAttribute("height", h + pad);
  svg.setAttribute("data-pins", "chart");
  const keys = [["hit_bytes", COLORS.served], ["disk_read_bytes", COLORS.disk], ["file_fill_bytes", COLORS.fills]];
  const top = Math.max(1, ...prompts.flatMap((p) => keys.map(([k]) => p[k] || 0)));
  const slot = w / Math.max(prompts.length, 8);
  prompts.forEach((p, i) => {
    keys.forEach(([k, color], j) => {
      const v = p[k] || 0;
      const r = document.createElementNS(svgNS, "rect");
      const bh = Math.max(v ? 1 : 0, (v / top) * h);
      r.setAttribute("x", i * slot + j * (slot / 3.5));
      r.setAttribute("y", h - bh);
      r.setAttribute("width", slot / 3.5 - 1);
      r.setAttribute("height", bh);
      r.setAttribute("fill", color);
      const t = document.createElementNS(svgNS, "title");
      t.textContent = `prompt ${p.prompt}: ${k} ${size(v)}`;
      r.append(t);
      svg.append(r);
    });
    const label = document.createElementNS(svgNS, "text");
    label.setAttribute("x", i * slot + 1);
    label.setAttribute("y", h + pad - 2);
    label.setAttribute("font-size", "9");
    label.setAttribute("fill", "currentColor");
    label.textContent = p.prompt;
    svg.append(label);
  });
  return svg;
}

// "this prompt" while one runs, else the last one finished; and the totals.
function counterTable(prompts, running) {
  const rows = [
    ["hits", "hits", (v) => v], ["misses", "misses", (v) => v],
    ["served from pins", "hit_bytes", size], ["copied at a miss", "miss_bytes", size],
    ["read from files into pins", "file_fill_bytes", size], ["read from disk (process)", "disk_read_bytes", size],
    ["evictions", "evictions", (v) => v],
  ];
  const last = prompts.last[prompts.last.length - 1];
  const [label, now] = running || !last ? ["this prompt", prompts.current] : [`last prompt (${last.prompt})`, last];
  const t = el("table", { style: "width:100%;border-collapse:collapse" },
    el("tr", {}, el("th", { style: "text-align:left" }, ""), el("th", {}, label), el("th", {}, "in total")));
  for (const [name, key, fmt] of rows) {
    t.append(el("tr", {}, el("td", {}, name),
      el("td", { "data-pins": `prompt-${key}`, style: "text-align:right" }, fmt(now[key])),
      el("td", { "data-pins": `total-${key}`, style: "text-align:right" }, fmt(prompts.total[key]))));
  }
  return t;
}

// A row per model: its pinned bytes, hits and misses; under it, its subsets.
function modelTable(models) {
  const t = el("table", { style: "width:100%;border-collapse:collapse", "data-pins": "models" },
    el("tr", {}, el("th", { style: "text-align:left" }, "model"), el("th", {}, "pinned"), el("th", {}, "hits"),
      el("th", {}, "misses")));
  for (const m of models) {
    t.append(el("tr", { "data-pins-model": m.name },
      el("td", {}, `${m.name}${m.active ? " (active)" : ""}`), el("td", { style: "text-align:right" }, size(m.bytes)),
      el("td", { style: "text-align:right" }, m.hits), el("td", { style: "text-align:right" }, m.misses)));
    const parts = SUBSETS.filter((s) => m.subsets[s].pins).map((s) => `${s} ${size(m.subsets[s].bytes)}`);
    t.append(el("tr", {}, el("td", { colspan: 4, style: "font-size:11px;padding-left:10px;opacity:0.8" },
      parts.join(", ") || "no pins")));
  }
  if (!models.length) t.append(el("tr", {}, el("td", { colspan: 4 }, "no model registered yet")));
  return t;
}

function render(root, r) {
  root.replaceChildren();
  const h = (text) => el("h4", { style: "margin:10px 0 4px" }, text);
  if (r.enabled === false && !r.config) {  // torch-pins missing or not loading
    root.append(el("p", { "data-pins": "state" }, `pins is off: ${r.why}`));
    return;
  }
  const comfy = r.comfy || {};
  const policy = r.config.policy, share = r.config.share;
  const state = comfy.enabled
    ? `pins is on (${comfy.mode} mode): policy ${policy.value} (${policy.source}), sharing ${share.value === "true" ? "on" : "off"}`
    : `pins is off: ${comfy.why || "not enabled"}`;
  root.append(el("p", { "data-pins": "state" }, state));
  const b = r.budget;
  const share_of = b.limit_bytes ? Math.min(100, (100 * b.pinned_bytes) / b.limit_bytes) : 0;
  root.append(h("Pinned memory against the budget"),
    el("div", { style: "background:#444;height:10px;border-radius:3px" },
      el("div", { style: `background:${COLORS.served};height:10px;width:${share_of}%;border-radius:3px` })),
    el("p", { "data-pins": "budget" }, `${size(b.pinned_bytes)} pinned of ${size(b.limit_bytes)} `
      + `(available RAM ${size(b.available_bytes)}, headroom ${size(b.headroom_bytes)})`),
    modelTable(r.models), h("Casts"), counterTable(r.prompts, r.counters.prompt === 1),
    h(`Last prompts (${r.prompts.recorded} in all)`), chart(r.prompts.last),
    el("p", { style: "font-size:11px" },
      el("span", { style: `color:${COLORS.served}` }, "served from pins "),
      el("span", { style: `color:${COLORS.disk}` }, "read from disk "),
      el("span", { style: `color:${COLORS.fills}` }, "read from files into pins")));
  const next = (r.settings && r.settings.next_start) || [];
  if (next.length) root.append(el("p", { "data-pins": "next-start" }, `At the next start: ${next.join(", ")}`));
  root.append(h("Configuration in force (key value (source))"),
    el("pre", { "data-pins": "config", style: "font-size:11px;white-space:pre-wrap" },
      Object.entries(r.config).map(([k, c]) => `${k} ${c.value} (${c.source})`).join("\n")));
}

const panel = {
  root: null,
  timer: null,
  async refresh() {
    if (!this.root || !this.root.isConnected) return;
    try {
      render(this.root, await fetchStats());
    } catch (e) {
      this.root.replaceChildren(el("p", { "data-pins": "state" }, `pins: ${e.message}`));
    }
  },
  mount(element) {
    this.root = el("div", { id: "pins-panel", style: "padding:8px;font-size:13px;overflow:auto;height:100%" });
    element.replaceChildren(this.root);
    this.refresh();
    clearInterval(this.timer);
    this.timer = setInterval(() => this.refresh(), POLL_MS);
  },
};

app.registerExtension({
  name: "pins.panel",
  settings: SETTINGS,
  async setup() {
    app.extensionManager.registerSidebarTab({
      id: "pins",
      icon: "pi pi-database",
      title: "pins",
      tooltip: "pins: pinned model weights",
      type: "custom",
      render: (element) => panel.mount(element),
    });
    // A prompt's end moves the counters: refresh then, not only on the poll.
    api.addEventListener("execution_success", () => panel.refresh());
  },
});
