// The control plane's dashboard: plain JS over the public REST API, redrawn every 2 s.
// No external libraries or fonts (the page must work with no network but the API's).
"use strict";

const POLL_MS = 2000;
const COMPLETIONS_SHOWN = 6;  // the latest completions in their panel
const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2f6fed", "#e4572e", "#12a150", "#f2a600", "#7a2e8e", "#17becf", "#8c564b", "#e377c2"];
const OK_REASONS = new Set(["ok", "correct", "pass", "passed", "all_pass"]);
let selected = null;
let timer = null;
let configShown = null;  // the cascade whose config the Config section holds (it never changes)

function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  return node;
}

function pct(v) { return v === null || v === undefined ? "–" : (100 * v).toFixed(1) + "%"; }
// a score with its confidence interval: "45.3% [38.1–52.6]" (the interval left out when unknown)
function pctCI(v, ci) {
  if (v === null || v === undefined || !ci) return pct(v);
  return `${pct(v)} [${(100 * ci[0]).toFixed(1)}–${(100 * ci[1]).toFixed(1)}]`;
}

function colorFor(name, i) {
  if (OK_REASONS.has(name)) return "#12a150";
  let h = 0;
  for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return PALETTE[(i !== undefined ? i : h) % PALETTE.length];
}

async function api(path) {
  const resp = await fetch(path, { headers: { Accept: "application/json" } });
  if (!resp.ok) throw new Error(`${path}: HTTP ${resp.status}`);
  return resp.json();
}

function showError(message) {
  const box = document.getElementById("error");
  box.hidden = false;
  box.textContent = message;
  document.body.dataset.state = "error";
}

// ------------------------------------------------------------------ stage spans

function stageSpans(detail, evals) {
  // Each stage's [start, end) on the global-step axis: from its evals when it has any
  // (global_step - step is the stage's step 0), else right after the previous stage.
  const spans = [];
  let cursor = 0;
  for (const st of detail.stages) {
    const mine = evals.filter((e) => e.stage_index === st.index);
    const start = mine.length ? Math.min(...mine.map((e) => e.global_step - e.step)) : cursor;
    const planned = st.max_steps || st.steps_done || 1;
    const length = st.state === "pending" ? planned : Math.max(st.steps_done, 0);
    const span = { stage: st, start, end: start + length, planned: start + Math.max(planned, length) };
    spans.push(span);
    cursor = st.state === "pending" || st.state === "running" || st.state === "paused" ? span.planned : span.end;
  }
  return spans;
}

function renderTimeline(detail, spans) {
  const root = document.getElementById("timeline");
  root.replaceChildren();
  const W = 1000, H = 64, pad = 10;
  const maxX = Math.max(1, ...spans.map((s) => s.planned));
  const x = (g) => pad + ((W - 2 * pad) * g) / maxX;
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": "stages" });
  for (const s of spans) {
    const st = s.stage;
    chart.append(svg("rect", {
      x: x(s.start), y: 14, width: Math.max(2, x(s.planned) - x(s.start)), height: 26,
      fill: "none", stroke: "#c8cdd8", "stroke-dasharray": "4 3",
    }));
    if (s.end > s.start || st.state !== "pending") {
      chart.append(svg("rect", {
        class: `stage state-${st.state}`, "data-stage": st.name,
        x: x(s.start), y: 14, width: Math.max(2, x(s.end) - x(s.start)), height: 26, rx: 3,
      }));
    }
    const want = st.desired_state ? ` → ${st.desired_state} requested` : "";
    const steps = st.max_steps ? `${st.steps_done}/${st.max_steps}` : `${st.steps_done}`;
    chart.append(svg("text", { x: x(s.start) + 4, y: 10 }, `${st.name} (${st.domain})`));
    chart.append(svg("text", { x: x(s.start) + 4, y: 54 }, `${st.state} · ${steps} steps${want}`));
  }
  root.append(chart);
}

// ------------------------------------------------------------------ curves

// One chart over the global-step axis (the eval curves and the training curves both): a line per
// series (with its confidence band when it has one), each stage's start dashed and labelled, and
// the stages of `shade` (a domain) shaded. `y` maps a value into [0, 1] of the plot's height.
const CHART = { W: 380, H: 190, L: 42, R: 10, T: 18, B: 22 };

function lineChart({ attrs, title, spans, maxX, y, ticks, series, shade = null, lastText = null, empty }) {
  const { W, H, L, R, T, B } = CHART;
  const x = (g) => L + ((W - L - R) * g) / maxX;
  const py = (v) => T + (H - T - B) * (1 - y(v));
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", ...attrs });
  chart.append(svg("text", { x: L, y: 12, "font-weight": "600" }, title));
  for (const [v, text] of ticks) {
    chart.append(svg("line", { x1: L, x2: W - R, y1: py(v), y2: py(v), stroke: "#eceef2" }));
    chart.append(svg("text", { x: 4, y: py(v) + 4 }, text));
  }
  for (const s of spans) {
    if (shade !== null && s.stage.domain === shade) chart.append(svg("rect", {
      x: x(s.start), y: T, width: Math.max(0, x(s.end) - x(s.start)), height: H - T - B, fill: "#eef3fe",
    }));
    chart.append(svg("line", {
      x1: x(s.start), x2: x(s.start), y1: T, y2: H - B, stroke: "#9aa3b5", "stroke-dasharray": "3 3",
    }));
    chart.append(svg("text", { x: x(s.start) + 3, y: H - 6 }, s.stage.name));
  }
  const drawn = series.filter((line) => line.points.length);
  for (const line of drawn) {
    const pts = line.points;
    const band = pts.filter((p) => p.low !== null && p.low !== undefined && p.high !== null && p.high !== undefined);
    if (band.length) {  // the confidence interval of every point, as a band around the line
      const upper = band.map((p) => `${x(p.x).toFixed(1)},${py(p.high).toFixed(1)}`);
      const lower = band.slice().reverse().map((p) => `${x(p.x).toFixed(1)},${py(p.low).toFixed(1)}`);
      chart.append(svg("polygon", {
        class: "ci-band", fill: line.color, "fill-opacity": 0.15, stroke: "none", points: [...upper, ...lower].join(" "),
      }));
    }
    chart.append(svg("polyline", {
      fill: "none", stroke: line.color, "stroke-width": line.width || 2, ...(line.attrs || {}),
      points: pts.map((p) => `${x(p.x).toFixed(1)},${py(p.y).toFixed(1)}`).join(" "),
    }));
    if (line.dots !== false) {
      for (const p of pts) chart.append(svg("circle", { cx: x(p.x), cy: py(p.y), r: 2.5, fill: line.color }));
    }
  }
  if (drawn.length && lastText) chart.append(svg("text", { x: W - R, y: 12, "text-anchor": "end" }, lastText));
  if (!drawn.length) chart.append(svg("text", { x: L + 10, y: H / 2 }, empty));
  return chart;
}

function renderCurves(detail, evals, spans) {
  const root = document.getElementById("curves");
  root.replaceChildren();
  const domains = [...new Set([
    ...(detail.config.domains || []).map((d) => d.name), ...evals.map((e) => e.domain),
  ])];
  const maxX = Math.max(1, ...spans.map((s) => s.planned), ...evals.map((e) => e.global_step));
  const ticks = [0, 0.5, 1].map((v) => [v, `${v * 100}%`]);
  domains.forEach((domain, i) => {
    const pts = evals.filter((e) => e.domain === domain).sort((a, b) => a.global_step - b.global_step);
    const last = pts.length ? pts[pts.length - 1] : null;
    root.append(lineChart({
      attrs: { class: "curve", "data-domain": domain }, title: domain, spans, maxX, y: (v) => v, ticks,
      shade: domain, empty: "no evals yet",
      series: [{
        color: colorFor(domain, i),
        points: pts.map((p) => ({ x: p.global_step, y: p.score, low: p.low, high: p.high })),
      }],
      lastText: last && `last ${pctCI(last.score, last.low === null || last.low === undefined ? null : [last.low, last.high])}`,
    }));
  });
}

// The training curves: one chart per step metric the run recorded (a line per stage), by global step.
const TRAIN_METRICS = [
  ["reward_mean", "reward"], ["kl", "KL to the reference"], ["loss_distill", "distillation loss"],
  ["lambda", "lambda (distillation weight)"], ["completion_tokens_mean", "completion length (tokens)"],
  ["clip_fraction", "clip fraction"], ["entropy", "entropy"],
];
const TRAIN_POINTS = 300;  // per stage and chart: longer stages are drawn as means of consecutive steps

function thinned(points) {
  if (points.length <= TRAIN_POINTS) return points;
  const size = Math.ceil(points.length / TRAIN_POINTS);
  const out = [];
  for (let i = 0; i < points.length; i += size) {
    const bucket = points.slice(i, i + size);
    const mean = (f) => bucket.reduce((a, p) => a + f(p), 0) / bucket.length;
    out.push({ x: mean((p) => p.x), y: mean((p) => p.y) });
  }
  return out;
}

function fmtValue(v) {
  const a = Math.abs(v);
  if (a !== 0 && (a < 0.01 || a >= 100000)) return v.toExponential(1);
  return a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : v.toFixed(a >= 1 ? 2 : 3);
}

function renderTrainingCurves(detail, steps, spans) {
  const root = document.getElementById("train-curves");
  root.replaceChildren();
  const maxX = Math.max(1, ...spans.map((s) => s.planned), ...steps.map((s) => s.global_step));
  let any = false;
  for (const [key, title] of TRAIN_METRICS) {
    const series = [];
    const values = [];
    detail.stages.forEach((st, i) => {
      const points = steps
        .filter((s) => s.stage_index === st.index && typeof s.metrics[key] === "number" && Number.isFinite(s.metrics[key]))
        .map((s) => ({ x: s.global_step, y: s.metrics[key] }));
      if (!points.length) return;
      values.push(...points.map((p) => p.y));
      series.push({
        color: PALETTE[i % PALETTE.length], points: thinned(points), width: 1.5, dots: points.length <= 30,
        attrs: { "data-stage": st.name },
      });
    });
    if (!series.length) continue;
    any = true;
    let lo = Math.min(...values), hi = Math.max(...values);
    if (hi - lo < 1e-9 * Math.max(1, Math.abs(hi))) { lo -= Math.abs(lo) * 0.1 || 0.5; hi += Math.abs(hi) * 0.1 || 0.5; }
    const y = (v) => (v - lo) / (hi - lo);
    const last = values[values.length - 1];  // the latest stage's latest step
    root.append(lineChart({
      attrs: { class: "train-curve", "data-metric": key }, title, spans, maxX, y, series,
      ticks: [lo, (lo + hi) / 2, hi].map((v) => [v, fmtValue(v)]),
      lastText: `last ${fmtValue(last)}`, empty: "",
    }));
  }
  if (!any) root.append(el("p", { class: "muted" }, "no training steps recorded yet"));
}

// ------------------------------------------------------------------ latest completions

let completionsShown = null;  // what the panel holds: redrawn only when it changes (keeps its scroll)

function renderCompletions(out) {
  const key = JSON.stringify(out);
  if (key === completionsShown) return;
  completionsShown = key;
  const root = document.getElementById("completions");
  root.replaceChildren();
  const list = [...(out.completions || [])].reverse();  // newest first
  if (!list.length) {
    root.append(el("p", { class: "muted", id: "completions-empty" }, out.note || "no completions logged yet"));
    return;
  }
  for (const c of list) {
    const item = el("article", { class: "completion", "data-step": String(c.global_step), "data-domain": c.domain || "" });
    const head = el("div", { class: "completion-head" });
    const ok = OK_REASONS.has(c.reason);
    head.append(
      el("b", {}, `step ${c.global_step ?? "–"}`),
      ` · ${c.stage ? `stage ${c.stage} · ` : ""}${c.domain || "–"} · `,
      el("span", { class: ok ? "good" : "bad" }, `reward ${c.reward === null || c.reward === undefined ? "–" : num(c.reward)}`),
      ` · ${c.reason || "–"}`,
      el("span", { class: "muted" },
        ` · ${c.finish || "–"} · ${c.tokens ?? "–"} tokens${c.problem ? ` · problem ${c.problem}` : ""}`),
    );
    item.append(head);
    if (c.detail) item.append(el("div", { class: "muted completion-detail" }, c.detail));
    item.append(el("div", { class: "muted" }, "prompt"), el("pre", { class: "prompt" }, c.prompt || ""));
    item.append(el("div", { class: "muted" }, "completion"), el("pre", { class: "completion-text" }, c.completion || ""));
    root.append(item);
  }
}

// ------------------------------------------------------------------ tables

// Score metrics (greedy, avg@k, pass@k) and rates are shares, shown as %; any other metric (a
// count per task, tokens per episode) as a number.
const SCORE_METRIC = /^(greedy|avg@\d+|pass@\d+)$/;
function isShare(name) { return SCORE_METRIC.test(name) || /(_rate|_fraction)$/.test(name); }
function num(v) { return v === null || v === undefined ? "–" : Number(v).toFixed(2); }
function fmtMetric(name, v, ci) {
  if (isShare(name)) return pctCI(v, ci);
  return ci ? `${num(v)} [${num(ci[0])}–${num(ci[1])}]` : num(v);
}

function primaryOf(detail, stageIndex) {
  const st = (detail.config.stages || [])[stageIndex] || {};
  return ((st.eval || {}).metrics || ["greedy"])[0];
}

function renderEvalMetrics(detail, evals) {
  // Every eval metric beside a domain's primary score (the curves show that one), e.g. the
  // agent's calls per task and tool-error rate: its latest value in each stage, with its interval.
  const root = document.getElementById("eval-metrics");
  root.replaceChildren();
  const rows = new Map();
  const stages = new Set();
  for (const e of [...evals].sort((a, b) => a.global_step - b.global_step)) {
    const primary = primaryOf(detail, e.stage_index);
    for (const [name, m] of Object.entries(e.metrics || {})) {
      if (name === primary) continue;
      const key = `${e.domain}\u0000${name}`;
      if (!rows.has(key)) rows.set(key, { domain: e.domain, metric: name, byStage: {} });
      rows.get(key).byStage[e.stage_index] = m;
      stages.add(e.stage_index);
    }
  }
  if (!rows.size) { root.append(el("p", { class: "muted" }, "no eval metrics beside the primary scores")); return; }
  const cols = detail.stages.filter((s) => stages.has(s.index));
  const t = el("table", { id: "eval-metrics-table" });
  const head = el("tr");
  for (const c of ["domain", "metric", ...cols.map((s) => `latest in ${s.name}`)]) head.append(el("th", {}, c));
  t.append(head);
  for (const r of rows.values()) {
    const tr = el("tr", { "data-domain": r.domain, "data-metric": r.metric });
    tr.append(el("td", {}, r.domain), el("td", {}, r.metric));
    for (const s of cols) {
      const m = r.byStage[s.index];
      const ci = m && m.low !== null && m.low !== undefined ? [m.low, m.high] : null;
      const title = m && m.method ? `${m.method} interval over ${m.n} tasks` : "";
      tr.append(el("td", { title }, m ? fmtMetric(r.metric, m.value, ci) : "–"));
    }
    t.append(tr);
  }
  root.append(t);
}

// Step metrics shown per stage when a stage records them: groups by name prefix (the turn
// loop's `turns/...`), each with the model's share of the completion's tokens beside it.
const STEP_GROUPS = ["turns/"];
const STEP_EXTRAS = ["model_tokens_mean", "completion_tokens_mean"];
let stepCache = { cascade: null, run: null, steps: [] };

async function loadSteps(base, cascadeId) {
  // Only the steps after the last one seen are fetched (the page polls every 2 s).
  if (stepCache.cascade !== cascadeId) stepCache = { cascade: cascadeId, run: null, steps: [] };
  const after = stepCache.steps.length ? stepCache.steps[stepCache.steps.length - 1].global_step : -1;
  const got = await api(`${base}/metrics?after_global_step=${after}`);
  if (got.run_id !== stepCache.run) {
    stepCache = { cascade: cascadeId, run: got.run_id, steps: [] };
    if (after >= 0) return loadSteps(base, cascadeId);  // another run: read it from its start
  }
  const last = stepCache.steps.length ? stepCache.steps[stepCache.steps.length - 1].global_step : -1;
  stepCache.steps.push(...got.steps.filter((s) => s.global_step > last));  // an overlapping poll's too
  return stepCache.steps;
}

function renderStepMetrics(detail, steps) {
  const root = document.getElementById("step-metrics");
  root.replaceChildren();
  const t = el("table", { id: "step-metrics-table" });
  const head = el("tr");
  for (const c of ["stage", "metric", "last step", "mean over steps"]) head.append(el("th", {}, c));
  t.append(head);
  let any = false;
  for (const st of detail.stages) {
    const mine = steps.filter((s) => s.stage_index === st.index);
    const names = [...new Set(mine.flatMap((s) => Object.keys(s.metrics)))]
      .filter((k) => STEP_GROUPS.some((g) => k.startsWith(g))).sort();
    if (!names.length) continue;
    for (const k of STEP_EXTRAS) if (mine.some((s) => k in s.metrics)) names.push(k);
    for (const name of names) {
      const values = mine.map((s) => s.metrics[name]).filter((v) => typeof v === "number");
      if (!values.length) continue;
      any = true;
      const mean = values.reduce((a, b) => a + b, 0) / values.length;
      const tr = el("tr", { "data-stage": st.name, "data-metric": name });
      tr.append(
        el("td", {}, st.name), el("td", {}, name),
        el("td", {}, isShare(name) ? pct(values[values.length - 1]) : num(values[values.length - 1])),
        el("td", { title: `${values.length} steps` }, isShare(name) ? pct(mean) : num(mean)),
      );
      t.append(tr);
    }
  }
  root.append(any ? t : el("p", { class: "muted" }, "no stage records turn metrics"));
}


function renderRegression(table) {
  const root = document.getElementById("regression");
  root.replaceChildren();
  if (!table.rows.length) { root.append(el("p", { class: "muted" }, "no evals yet")); return; }
  const t = el("table", { id: "regression-table" });
  const head = el("tr");
  for (const c of ["domain", "start", ...table.stages.map((s) => `after ${s}`), "best", "final − best"]) {
    head.append(el("th", {}, c));
  }
  t.append(head);
  for (const r of table.rows) {
    const tr = el("tr", { "data-domain": r.domain });
    tr.append(el("td", {}, r.domain), el("td", {}, pctCI(r.start, r.start_ci)));
    for (const s of table.stages) tr.append(el("td", {}, pctCI(r.after[s], (r.after_ci || {})[s])));
    tr.append(el("td", {}, pctCI(r.best, r.best_ci)));
    const d = r.final_minus_best;
    const out = r.drop_outside_noise;
    // red only for a drop outside noise (non-overlapping intervals); without intervals, > 2 points
    const cls = d === null ? "" : (out === null || out === undefined ? d < -0.02 : out) ? "bad" : "good";
    let text = d === null ? "–" : `${(100 * d).toFixed(1)} pp`;
    if (d !== null && d <= -0.0005 && out !== null && out !== undefined) text += out ? ", outside noise" : ", within noise";
    tr.append(el("td", { class: cls, title: table.noise_rule || "" }, text));
    t.append(tr);
  }
  root.append(t);
}

function reasonBar(title, counts) {
  const wrap = el("div", { class: "reasons", "data-title": title });
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  wrap.append(el("div", {}, `${title} `), el("span", { class: "muted" }, `${total} verdicts`));
  const bar = el("div", { class: "reason-bar" });
  const legend = el("div", { class: "legend" });
  const entries = Object.entries(counts).sort((a, b) => b[1] - a[1]);
  for (const [reason, n] of entries) {
    const part = el("div", { title: `${reason}: ${n}` });
    part.style.width = `${total ? (100 * n) / total : 0}%`;
    part.style.background = colorFor(reason);
    bar.append(part);
    const item = el("span");
    const sw = el("i");
    sw.style.background = colorFor(reason);
    item.append(sw, `${reason} ${n}`);
    legend.append(item);
  }
  wrap.append(bar, legend);
  return wrap;
}

function renderReasons(reasons) {
  const root = document.getElementById("reasons");
  root.replaceChildren();
  const training = Object.entries(reasons.training || {});
  const evals = Object.entries(reasons.eval || {});
  if (!training.length && !evals.length) { root.append(el("p", { class: "muted" }, "no rollouts yet")); return; }
  for (const [stage, counts] of training) root.append(reasonBar(`training · ${stage}`, counts));
  for (const [domain, counts] of evals) root.append(reasonBar(`latest eval · ${domain}`, counts));
}

function eventText(e, stageNames) {
  const where = e.stage_id !== null && stageNames[e.stage_id] ? `${stageNames[e.stage_id]}: ` : "";
  const d = e.detail || {};
  if (e.kind === "teacher") {
    return `${where}teacher for ${d.domain} = checkpoint at step ${d.global_step} (${pct(d.score)})`;
  }
  if (e.kind === "gate_opened") {
    // the regression gate's decision with its evidence: each fallen domain's two intervals
    const fallen = (d.fallen || []).map(
      (f) => `${f.domain} ${pct(f.now)} [${pct(f.now_low)}-${pct(f.now_high)}] below its best ` +
        `${pct(f.best)} [${pct(f.best_low)}-${pct(f.best_high)}] (step ${f.best_step})`,
    );
    return `${where}regression gate at step ${d.global_step}: ${fallen.join("; ")}: MOPD phase`;
  }
  if (e.kind === "gate_closed") {
    return `${where}regression gate: ${d.outcome} after ${d.steps} steps`;
  }
  const move = e.from_state || e.to_state ? ` ${e.from_state || ""} → ${e.to_state || ""}` : "";
  const why = d.command ? ` (${d.command})` : d.stopped_by ? ` (${d.stopped_by})` : "";
  return `${where}${e.kind}${move}${why}`;
}

function renderEvents(events, detail) {
  const root = document.getElementById("events");
  root.replaceChildren();
  const stageNames = Object.fromEntries(detail.stages.map((s) => [s.id, s.name]));
  for (const e of [...events].reverse().slice(0, 30)) {
    const when = new Date(e.at).toLocaleTimeString();
    const li = el("li", {}, `${when} ${eventText(e, stageNames)} `);
    li.append(el("span", { class: "actor" }, `by ${e.actor}`));
    root.append(li);
  }
}

// ------------------------------------------------------------------ run status, config

function utcTime(iso) {
  return iso ? new Date(iso).toISOString().slice(11, 19) + " UTC" : null;
}

function renderRun(detail) {
  // The latest run; a `stalled` one (running in the store, its runner's lease expired) says so
  // with its last heartbeat, and the page does not claim to be live.
  const info = document.getElementById("run-info");
  const live = document.getElementById("live");
  info.replaceChildren();
  const run = detail.runs.length ? detail.runs[detail.runs.length - 1] : null;
  const active = detail.stages.some((s) => s.state === "running" || s.state === "paused");
  if (!run) {
    info.textContent = "no run yet";
  } else {
    const what = `${run.kind}, seed ${run.seed}, ${run.distill ? "distillation" : "no distillation"}`;
    info.append(`run #${run.id} (${what}, `);
    if (run.status === "stalled") {
      const beat = utcTime(run.heartbeat_at);
      info.append(el("span", { class: "stalled", id: "run-stalled", "data-heartbeat": run.heartbeat_at || "" },
        beat ? `stalled: last heartbeat ${beat}` : "stalled: no runner attached"));
    } else {
      info.append(run.status);
    }
    info.append(")");
    if (run.holder) info.append(el("span", { class: "muted", id: "run-holder" }, ` · runner ${run.holder}`));
    // what the runner is riding out now, and the outages it rode out (services/api/run_health.py)
    const degraded = Object.entries(run.degraded || {});
    if (degraded.length) {
      info.append(el("span", { class: "stalled", id: "run-degraded" },
        " · degraded: " + degraded.map(([dep, what]) => `${dep} ${what}`).join("; ")));
    }
    const outages = Object.entries(run.outages || {});
    if (outages.length) {
      info.append(el("span", { class: "muted", id: "run-outages" }, " · outages ridden out: " + outages
        .map(([dep, o]) => `${dep} ${o.outages}x (${o.down_s.toFixed(1)} s down)`).join(", ")));
    }
  }
  const stalled = run !== null && run.status === "stalled";
  live.hidden = !active;
  live.className = stalled ? "stalled" : "live";
  live.textContent = stalled ? "● stalled" : "● live";
}

async function renderConfig(cascadeId) {
  if (configShown === cascadeId) return;
  const out = await api(`/api/cascades/${cascadeId}/config`);
  document.getElementById("config").textContent = JSON.stringify(out.config, null, 2);
  document.getElementById("config-hash").textContent = out.config_hash
    ? `training hash ${out.config_hash.slice(0, 12)}` : "";
  document.getElementById("config-section").dataset.cascade = String(cascadeId);
  configShown = cascadeId;
}

// ------------------------------------------------------------------ steering (write token)
// The token lives in this tab's sessionStorage only (never localStorage, a cookie or a URL); it is
// sent only as a bearer header to /api/whoami and to the action paths the API itself offers.
// Which actions a stage or cascade offers, and the state each leads to, come from the API.

const TOKEN_KEY = "cascade.writeToken";
let principal = null;      // the stored token's {name, role, can_write} once /api/whoami accepted it
let tokenProblem = null;   // why steering is off although a token was given (refused, unreachable)
let inFlight = null;       // the action path while its request is pending: every action button waits
let pendingConfirm = null; // the action the confirmation dialog asks about
let lastDetail = null;
let actionsDone = 0;       // requests answered and redrawn after (body data-actions-done: tests wait on it)

function storedToken() { return sessionStorage.getItem(TOKEN_KEY); }

async function errorText(resp) {
  // The API's own words: {"detail": "..."} (FastAPI's validation errors: a list of {msg}).
  let text = `HTTP ${resp.status}`;
  try {
    const body = await resp.json();
    if (typeof body.detail === "string") text += `: ${body.detail}`;
    else if (Array.isArray(body.detail)) text += `: ${body.detail.map((d) => d.msg).join("; ")}`;
  } catch (_) { /* not JSON: the status says enough */ }
  return text;
}

async function checkToken() {
  const token = storedToken();
  principal = null;
  if (!token) { renderToken(); return; }
  tokenProblem = "checking the token…";
  renderToken();
  try {
    const resp = await fetch("/api/whoami", { headers: { Accept: "application/json", Authorization: `Bearer ${token}` } });
    if (resp.ok) {
      principal = await resp.json();
      tokenProblem = principal.can_write ? null : `token ${principal.name} is read-only (role ${principal.role})`;
    } else {
      tokenProblem = `token refused: ${await errorText(resp)}`;
      if (resp.status === 401) sessionStorage.removeItem(TOKEN_KEY);  // never valid here: not kept
    }
  } catch (err) {
    tokenProblem = `cannot check the token: ${err.message}`;
  }
  renderToken();
}

function steerBlocked() {
  // null when this page may steer, else the reason it may not (shown beside the buttons)
  if (!storedToken() && !tokenProblem) return "read-only: enter a write token to pause, resume, advance or abort";
  if (tokenProblem) return `read-only: ${tokenProblem}`;
  if (!principal || !principal.can_write) return "read-only: this token cannot steer";
  return null;
}

function renderToken() {
  const held = principal !== null && storedToken() !== null;
  document.getElementById("token-input").hidden = held;
  document.getElementById("token-use").hidden = held;
  document.getElementById("token-forget").hidden = !storedToken();
  const status = document.getElementById("token-status");
  status.textContent = held ? `${principal.can_write ? "steering" : "read-only"} as ${principal.name}` : "read-only";
  document.body.dataset.steer = steerBlocked() === null ? "on" : "off";
  if (lastDetail) renderControls(lastDetail);
}

function useToken() {
  const input = document.getElementById("token-input");
  const value = input.value.trim();
  input.value = "";  // the secret does not stay in the page
  if (!value) return;
  sessionStorage.setItem(TOKEN_KEY, value);
  tokenProblem = null;
  checkToken();
}

function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
  principal = null;
  tokenProblem = null;
  renderToken();
}

function showResult(kind, text) {
  const box = document.getElementById("action-result");
  box.hidden = false;
  box.className = `action-result ${kind}`;
  box.dataset.kind = kind;
  box.textContent = text;
}

function label(action) {
  return `${action.command[0].toUpperCase()}${action.command.slice(1)} → ${action.leads_to}`;
}

async function send(action, what) {
  const token = storedToken();
  if (!token || inFlight || !action.path.startsWith("/api/")) return;  // the token goes to this API only
  inFlight = action.path;
  document.body.dataset.inflight = action.path;
  if (lastDetail) renderControls(lastDetail);
  showResult("pending", `${what}: ${action.command} sent…`);
  try {
    const resp = await fetch(action.path, {
      method: "POST", headers: { Accept: "application/json", Authorization: `Bearer ${token}` },
    });
    if (resp.ok) {
      const body = await resp.json();
      const note = body.changed ? "the runner applies it at its next step boundary" : "already in effect";
      showResult("ok", `${what}: ${action.command} accepted → ${action.leads_to} (${note})`);
    } else {
      showResult("refused", `${what}: ${action.command} refused: ${await errorText(resp)}`);
      if (resp.status === 401 || resp.status === 403) await checkToken();
    }
  } catch (err) {
    showResult("refused", `${what}: ${action.command} failed: ${err.message}`);
  } finally {
    inFlight = null;
    delete document.body.dataset.inflight;
    await refresh();
    document.body.dataset.actionsDone = String(++actionsDone);
  }
}

function askConfirm(action, what, question) {
  pendingConfirm = { action, what };
  document.getElementById("confirm-text").textContent = question;
  document.getElementById("confirm-yes").textContent = label(action);
  document.getElementById("confirm").showModal();
}

function actionButton(action, what, question = null) {
  const b = el("button", {
    type: "button", class: `action action-${action.command}`, "data-command": action.command,
    "data-path": action.path,
  }, label(action));
  const blocked = steerBlocked();
  if (blocked !== null || inFlight !== null) {
    b.disabled = true;
    b.title = blocked !== null ? blocked : "waiting for the previous request";
  }
  b.addEventListener("click", () => (question ? askConfirm(action, what, question) : send(action, what)));
  return b;
}

function renderControls(detail) {
  lastDetail = detail;
  const root = document.getElementById("controls");
  root.replaceChildren();
  const table = el("table", { id: "controls-table" });
  for (const st of detail.stages) {
    if (!st.actions.length) continue;
    const tr = el("tr", { "data-stage": st.name });
    const state = st.desired_state ? `${st.state}, ${st.desired_state} requested` : st.state;
    tr.append(el("td", {}, `stage ${st.name}`), el("td", { class: "muted" }, state));
    const cell = el("td");
    for (const action of st.actions) cell.append(actionButton(action, `stage ${st.name}`));
    tr.append(cell);
    table.append(tr);
  }
  for (const action of detail.actions) {
    const tr = el("tr", { "data-cascade": String(detail.id) });
    tr.append(el("td", {}, `cascade ${detail.name}`), el("td", { class: "muted" }, detail.status));
    const question = `Abort cascade #${detail.id} ${detail.name}? Idle stages end at once, a running one at its ` +
      "next step boundary. An aborted cascade cannot be resumed.";
    const cell = el("td");
    cell.append(actionButton(action, `cascade ${detail.name}`, question));
    tr.append(cell);
    table.append(tr);
  }
  const note = document.getElementById("steer-note");
  const run = detail.runs.length ? detail.runs[detail.runs.length - 1] : null;
  const stalled = run !== null && run.status === "stalled"
    ? "no live runner holds this run: stage requests wait for it to be resumed; abort ends it at once" : null;
  if (table.childElementCount) {
    root.append(table);
    note.textContent = [steerBlocked(), stalled].filter((part) => part).join(" · ");
  } else {
    note.textContent = `nothing to steer: the cascade is ${detail.status}`;
  }
}

// ------------------------------------------------------------------ main loop

async function loadCascades() {
  const list = await api("/api/cascades");
  const select = document.getElementById("cascade-select");
  const wanted = new URLSearchParams(location.search).get("cascade");
  select.replaceChildren(...list.map((c) => el("option", { value: c.id }, `#${c.id} ${c.name} (${c.status})`)));
  if (selected === null) selected = wanted ? Number(wanted) : list.length ? list[0].id : null;
  if (selected !== null) select.value = String(selected);
  return list;
}

async function refresh() {
  try {
    await loadCascades();
    if (selected === null) {
      document.getElementById("status").textContent = "no cascades yet";
      document.body.dataset.state = "ready";
      return;
    }
    const base = `/api/cascades/${selected}`;
    const [detail, evals, table, reasons, events, steps, completions] = await Promise.all([
      api(base), api(`${base}/evals`), api(`${base}/regression`), api(`${base}/reasons`), api(`${base}/events`),
      loadSteps(base, selected), api(`${base}/completions?last=${COMPLETIONS_SHOWN}`),
    ]);
    const spans = stageSpans(detail, evals.evals);
    renderTimeline(detail, spans);
    renderCurves(detail, evals.evals, spans);
    renderTrainingCurves(detail, steps, spans);
    renderCompletions(completions);
    renderRegression(table);
    renderEvalMetrics(detail, evals.evals);
    renderStepMetrics(detail, steps);
    renderReasons(reasons);
    renderEvents(events, detail);
    renderRun(detail);
    renderControls(detail);
    await renderConfig(detail.id);
    document.getElementById("status").textContent =
      `${detail.name}: ${detail.status} · updated ${new Date().toLocaleTimeString()}`;
    document.getElementById("error").hidden = true;
    document.body.dataset.state = "ready";
    document.body.dataset.cascade = String(detail.id);
  } catch (err) {
    showError(`cannot load the dashboard: ${err.message}`);
  }
}

window.addEventListener("error", (ev) => showError(`script error: ${ev.message}`));
document.getElementById("cascade-select").addEventListener("change", (ev) => {
  selected = Number(ev.target.value);
  history.replaceState(null, "", `?cascade=${selected}`);
  refresh();
});
document.getElementById("token-use").addEventListener("click", useToken);
document.getElementById("token-input").addEventListener("keydown", (ev) => { if (ev.key === "Enter") useToken(); });
document.getElementById("token-forget").addEventListener("click", forgetToken);
document.getElementById("confirm-yes").addEventListener("click", () => {
  const chosen = pendingConfirm;
  document.getElementById("confirm").close();  // its close event forgets the question
  if (chosen) send(chosen.action, chosen.what);
});
document.getElementById("confirm-no").addEventListener("click", () => document.getElementById("confirm").close());
document.getElementById("confirm").addEventListener("close", () => { pendingConfirm = null; });
checkToken();
refresh();
timer = setInterval(refresh, POLL_MS);
