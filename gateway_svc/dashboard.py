"""The gateway's built-in dashboard: one static HTML page, plain JS, no build step.

The page holds no data itself. Its script asks for the gateway token (``#token=...`` in the
URL, or typed into the box; kept in the tab's ``sessionStorage``), then polls ``GET /v1/jobs``
and, per job, ``/metrics?since=<last ts>``, ``/events`` and (when its logs are open)
``/logs?service=..&tail=200``, and ``GET /v1/fleets`` and, per fleet, ``/events?since=<last ts>``,
every ``?interval=`` milliseconds (default 2000).

Per fleet (docs/fleet.md; the panel is hidden while the gateway has none): its state, model
and detail; the scaling block (replicas desired of min..max, the policy, the backlog and the
backlog per replica, the trainer's wait, tokens/s, bounds asked for and not yet taken); a
table of its replicas (phase, restarts, alive / ready) with a column per attached job giving
the version that replica serves the job (or its report: refused, detached); and its last
scaling decisions as lines ("12:03:04 add rollout-1 (backlog_high: 6.0 per replica)").

Per job: its state, step and detail, its sample ledger and service restarts (when the job reports them); its weight
plane (when reported): per replica the version it serves and its role (canary / promoted), the
promoted and candidate versions and the canary gate's last decisions; pause / resume / cancel buttons for the states that
allow them; nine charts (reward mean, staleness, queue depths with a colour key per stream,
tokens/s, loss, KL, entropy, gradient norm, validation score), each with y ticks in its
unit, time ticks on x, the last value rounded to three significant digits, and the values
under the pointer on hover; the job's last events; and its per-service logs.

A refused token is a state of its own (the token box and "the gateway refused the token",
never "no jobs yet"); so is a missing one.

For tests and scripts the page exposes its state in the DOM: ``<body data-polls=N
data-auth=ok|refused|missing>``; each job card ``<section class="job" data-job-id=...
data-state=...>``; the weight plane ``div.weights[data-mode=all|canary]`` with a
``span.replica[data-replica=... data-role=... data-version=...]`` per replica and
``li[data-kind=promoted|rejected|paused|resumed][data-version=...]`` per decision; each chart ``<svg data-metric=... data-points=N>`` with ``polyline
data-line=<series>``; the hover box ``.tip``; the log box ``pre.log[data-service=...]``. Each
fleet ``<section class="fleet" data-fleet=... data-state=...>`` with ``div.scaling[data-min
data-max data-desired data-backlog-per-replica data-trainer-wait]``, a row ``tr.replica[data-replica
data-phase data-restarts data-alive]`` per replica whose ``td.served[data-job data-state
data-version]`` cells are the attached jobs (``th[data-job]`` heads the column), and
``li.decision[data-action data-reason data-replicas]`` per scaling decision, oldest first.
"""

DASHBOARD_HTML = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>meshrl jobs</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 1.5rem; background: #fafafa; color: #222; }
  h1 { font-size: 1.3rem; margin: 0 0 1rem; }
  .job { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: .8rem 1rem; margin-bottom: 1rem; }
  .job h2 { font-size: 1rem; margin: 0 0 .4rem; display: flex; gap: .6rem; align-items: center; flex-wrap: wrap; }
  .state { font-weight: normal; font-size: .85rem; padding: .1rem .4rem; border-radius: 3px; background: #eee; }
  .state.running { background: #d8f0d8; } .state.paused { background: #fff0c0; }
  .state.failed { background: #f8d0d0; } .state.succeeded { background: #d0e4f8; }
  .actions button { font-size: .8rem; margin-right: .3rem; }
  .ledger { font-size: .8rem; color: #555; margin-bottom: .3rem; font-variant-numeric: tabular-nums; }
  .weights { font-size: .8rem; color: #333; margin-bottom: .4rem; font-variant-numeric: tabular-nums; }
  .weights .replica { margin-right: .8rem; } .weights .replica[data-role="canary"] { color: #8a5a00; }
  .weights ul { margin: .2rem 0 0; padding-left: 1.1rem; color: #444; } .weights li[data-kind="rejected"] { color: #b00; }
  .detail { font-size: .85rem; color: #444; margin-bottom: .4rem; white-space: pre-wrap; max-height: 6em; overflow: auto; }
  .charts { display: flex; flex-wrap: wrap; gap: .8rem; }
  figure { margin: 0; position: relative; }
  figcaption { font-size: .8rem; color: #333; display: flex; justify-content: space-between; gap: .5rem; }
  figcaption .last { font-variant-numeric: tabular-nums; font-weight: 600; }
  svg.chart { background: #fcfcfc; border: 1px solid #eee; }
  .axis { font-size: 9px; fill: #666; font-variant-numeric: tabular-nums; }
  .grid { stroke: #eee; }
  .legend { font-size: .75rem; display: flex; gap: .7rem; }
  .legend i { display: inline-block; width: .9em; height: .9em; border-radius: 2px; margin-right: .25em; vertical-align: -.1em; }
  .tip { position: absolute; pointer-events: none; background: rgba(30,30,30,.88); color: #fff; font-size: .72rem;
         padding: .2rem .4rem; border-radius: 3px; white-space: pre; font-variant-numeric: tabular-nums; z-index: 2; }
  .events { font-size: .78rem; color: #444; margin: .5rem 0 0; padding-left: 1.1rem; }
  details.logs { margin-top: .5rem; font-size: .85rem; }
  pre.log { background: #1e1e1e; color: #ddd; font-size: .72rem; padding: .5rem; max-height: 16em; overflow: auto; margin: .3rem 0 0; }
  #fleets > h2, #jobs > h2.panel { font-size: 1.05rem; margin: 0 0 .5rem; }
  .fleet { background: #fff; border: 1px solid #cfd8e8; border-radius: 6px; padding: .8rem 1rem; margin-bottom: 1rem; }
  .fleet h3 { font-size: 1rem; margin: 0 0 .4rem; display: flex; gap: .6rem; align-items: center; flex-wrap: wrap; }
  .fleet .model { font-weight: normal; font-size: .8rem; color: #555; }
  .state.ready { background: #d8f0d8; } .state.starting, .state.stopping { background: #fff0c0; }
  .state.stopped { background: #e4e4e4; }
  .scaling { font-size: .8rem; color: #333; margin-bottom: .4rem; font-variant-numeric: tabular-nums; }
  table.replicas { border-collapse: collapse; font-size: .8rem; font-variant-numeric: tabular-nums; margin-bottom: .3rem; }
  table.replicas th, table.replicas td { border-bottom: 1px solid #eee; padding: .15rem .6rem .15rem 0; text-align: left; }
  table.replicas th { font-weight: 600; color: #444; }
  tr.replica[data-phase="off"] { color: #999; } tr.replica[data-phase="starting"] td.phase { color: #8a5a00; }
  tr.replica[data-phase="draining"] td.phase { color: #8a5a00; } tr.replica[data-phase="serving"] td.phase { color: #1a7a1a; }
  td.served[data-state="refused"], td.served[data-state="failed"] { color: #b00; }
  ul.decisions { font-size: .78rem; color: #444; margin: .3rem 0 0; padding-left: 1.1rem; font-variant-numeric: tabular-nums; }
  li.decision[data-action="remove"] { color: #7a4a00; }
  #error { color: #b00; }
  #login { margin-bottom: 1rem; }
</style>
</head>
<body data-polls="0" data-auth="missing">
<h1>meshrl jobs</h1>
<form id="login" hidden><label>gateway token <input id="token" type="password" autocomplete="off"></label>
<button>show jobs</button></form>
<p id="error" role="alert"></p>
<div id="fleets" hidden><h2>fleets</h2></div>
<div id="jobs"><p id="empty" hidden>no jobs yet</p></div>
<script>
"use strict";
(function () {
  // [key, caption, unit shown on the axis and in values]
  const METRICS = [
    ["reward_mean", "reward mean", ""], ["staleness", "staleness", "versions"], ["queues", "queue depths", "items"],
    ["tokens_per_s", "generation", "tok/s"], ["loss", "loss", ""], ["kl", "KL", "nats"],
    ["entropy", "entropy", "nats"], ["grad_norm", "grad norm", ""], ["val_score", "validation score", ""],
  ];
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
  const W = 300, H = 150, ML = 46, MR = 8, MT = 8, MB = 22;
  const params = new URLSearchParams(location.search);
  const interval = Math.max(100, parseInt(params.get("interval") || "2000", 10) || 2000);
  const hash = new URLSearchParams(location.hash.slice(1));
  let token = hash.get("token") || sessionStorage.getItem("meshrl_token") || "";
  const series = {};  // job id -> {since, points: [], lines: {metric: {name: [[ts, v]]}}}
  const colorOf = {};  // queue name -> colour, stable across redraws
  const fleetEvents = {};  // fleet name -> {since, events: []} (its scaling decisions)

  function el(tag, attrs, text) {
    const svgTags = ["svg", "polyline", "text", "line", "circle", "rect", "g"];
    const node = svgTags.includes(tag)
      ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // Three significant digits, no float noise: 149.9055 -> "150", 0.012345 -> "0.0123", 12345.6 -> "12,346".
  function fmt(v) {
    if (typeof v !== "number" || !isFinite(v)) return "–";
    const a = Math.abs(v);
    if (a >= 1000) return Math.round(v).toLocaleString("en-US");
    if (a !== 0 && a < 0.001) return v.toExponential(2);
    return String(Number(v.toPrecision(3)));
  }
  const withUnit = (v, unit) => fmt(v) + (unit ? " " + unit : "");
  const hms = (ts, fine) => new Date(ts * 1000).toISOString().slice(11, fine ? 21 : 19);

  // Tick labels: as many decimals as the tick step needs, so neighbouring ticks never print alike.
  function tickFmt(t, step) {
    const d = Math.min(6, Math.max(0, -Math.floor(Math.log10(step) + 1e-9)));
    return Math.abs(t) >= 1000 && d === 0 ? Math.round(t).toLocaleString("en-US") : t.toFixed(d);
  }

  function niceTicks(lo, hi, n) {
    if (!(hi > lo)) { const d = Math.abs(lo) * 0.1 || 1; lo -= d; hi += d; }
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) || 10 * mag;
    const t0 = Math.floor(lo / step) * step, ticks = [];
    for (let t = t0; t <= hi + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
    if (ticks[ticks.length - 1] < hi) ticks.push(Number((ticks[ticks.length - 1] + step).toPrecision(12)));
    return ticks;
  }

  function setAuth(state, msg) {
    document.body.dataset.auth = state;
    const login = document.getElementById("login");
    login.hidden = state === "ok";
    document.getElementById("error").textContent = msg || "";
    if (state !== "ok") {
      document.getElementById("empty").hidden = true;
      for (const s of document.querySelectorAll("section.job, section.fleet")) s.remove();
      document.getElementById("fleets").hidden = true;
      for (const k of Object.keys(series)) delete series[k];
      for (const k of Object.keys(fleetEvents)) delete fleetEvents[k];
    }
  }

  async function api(path, opts) {
    const r = await fetch(path, Object.assign({ headers: { Authorization: "Bearer " + token } }, opts || {}));
    if (r.status === 401) { setAuth("refused", "the gateway refused the token: enter the right one"); throw new Error("unauthorized"); }
    if (!r.ok) {
      let why = "HTTP " + r.status;
      try { why = (await r.json()).detail || why; } catch (e) { /* not JSON */ }
      throw new Error(path.split("?")[0] + ": " + why);
    }
    return r;
  }

  function lines(points, key) {
    if (key !== "queues") return { [key]: points.map(p => [p.ts, p[key]]).filter(x => typeof x[1] === "number") };
    const out = {};
    for (const p of points) for (const [q, d] of Object.entries(p.queues || {})) (out[q] = out[q] || []).push([p.ts, d]);
    return out;
  }

  function colour(name, key) {
    if (key !== "queues") return COLORS[0];
    if (!(name in colorOf)) colorOf[name] = COLORS[Object.keys(colorOf).length % COLORS.length];
    return colorOf[name];
  }

  function draw(fig, key, unit, byLine) {
    const svg = fig.querySelector("svg");
    svg.replaceChildren();
    svg._lines = byLine;
    const all = Object.values(byLine).flat();
    svg.setAttribute("data-points", String(all.length));
    const last = fig.querySelector(".last");
    const legend = fig.querySelector(".legend");
    if (!all.length) {
      last.textContent = "";
      const msg = key === "val_score" ? "no validation in this job yet" : "no data yet";
      svg.appendChild(el("text", { x: W / 2, y: H / 2, "font-size": 11, fill: "#999", "text-anchor": "middle" }, msg));
      return;
    }
    const xs = all.map(p => p[0]), ys = all.map(p => p[1]);
    let x0 = Math.min(...xs), x1 = Math.max(...xs);
    if (x1 - x0 < 1) { x0 -= 0.5; x1 += 0.5; }
    const yt = niceTicks(key === "queues" || key === "tokens_per_s" ? Math.min(0, ...ys) : Math.min(...ys), Math.max(...ys), 4);
    const y0 = yt[0], y1 = yt[yt.length - 1];
    const sx = x => ML + (x - x0) / (x1 - x0) * (W - ML - MR);
    const sy = y => H - MB - (y - y0) / (y1 - y0) * (H - MT - MB);
    svg._scale = { x0, x1, sx, sy, unit };
    const ystep = yt.length > 1 ? yt[1] - yt[0] : 1;
    for (const t of yt) {
      svg.appendChild(el("line", { class: "grid", x1: ML, x2: W - MR, y1: sy(t), y2: sy(t) }));
      svg.appendChild(el("text", { class: "axis", "data-tick": "y", x: ML - 4, y: sy(t) + 3, "text-anchor": "end" }, tickFmt(t, ystep)));
    }
    if (unit) {
      const ym = (MT + H - MB) / 2;
      svg.appendChild(el("text", { class: "axis unit", x: 9, y: ym, "text-anchor": "middle", transform: "rotate(-90 9 " + ym + ")" }, unit));
    }
    svg.appendChild(el("line", { stroke: "#999", x1: ML, x2: ML, y1: MT, y2: H - MB }));
    svg.appendChild(el("line", { stroke: "#999", x1: ML, x2: W - MR, y1: H - MB, y2: H - MB }));
    const nx = 3;
    for (let i = 0; i <= nx; i++) {
      const t = x0 + (x1 - x0) * i / nx, x = sx(t);
      svg.appendChild(el("line", { stroke: "#999", x1: x, x2: x, y1: H - MB, y2: H - MB + 3 }));
      svg.appendChild(el("text", { class: "axis", "data-tick": "x", x, y: H - 6, "text-anchor": i === 0 ? "start" : i === nx ? "end" : "middle" }, hms(t, x1 - x0 < 6)));
    }
    for (const [name, pts] of Object.entries(byLine)) {
      svg.appendChild(el("polyline", {
        "data-line": name, fill: "none", stroke: colour(name, key), "stroke-width": 1.5,
        points: pts.map(p => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join(" "),
      }));
      if (pts.length === 1)  // a lone point draws no line: mark it
        svg.appendChild(el("circle", { cx: sx(pts[0][0]), cy: sy(pts[0][1]), r: 2.5, fill: colour(name, key) }));
    }
    if (key === "queues") {
      legend.replaceChildren(...Object.keys(byLine).map(name => {
        const s = el("span", { "data-line": name });
        s.appendChild(el("i", { style: "background:" + colour(name, key) }));
        s.appendChild(document.createTextNode(name + " " + fmt(byLine[name][byLine[name].length - 1][1])));
        return s;
      }));
      last.textContent = "";
    } else {
      last.textContent = withUnit(all[all.length - 1][1], unit);
    }
  }

  function hover(fig, ev) {
    const svg = fig.querySelector("svg"), tip = fig.querySelector(".tip"), sc = svg._scale;
    svg.querySelectorAll(".hover").forEach(n => n.remove());
    if (!sc) { tip.hidden = true; return; }
    const box = svg.getBoundingClientRect(), mx = ev.clientX - box.left;
    const t = sc.x0 + (mx - ML) / (W - ML - MR) * (sc.x1 - sc.x0);
    const rows = [];
    let at = null;
    for (const [name, pts] of Object.entries(svg._lines || {})) {
      if (!pts.length) continue;
      let best = pts[0];
      for (const p of pts) if (Math.abs(p[0] - t) < Math.abs(best[0] - t)) best = p;
      at = at === null ? best[0] : at;
      rows.push((Object.keys(svg._lines).length > 1 ? name + ": " : "") + withUnit(best[1], sc.unit));
      svg.appendChild(el("circle", { class: "hover", cx: sc.sx(best[0]), cy: sc.sy(best[1]), r: 3, fill: "#000" }));
    }
    if (at === null) { tip.hidden = true; return; }
    svg.appendChild(el("line", { class: "hover", stroke: "#888", "stroke-dasharray": "2,2", x1: sc.sx(at), x2: sc.sx(at), y1: MT, y2: H - MB }));
    tip.textContent = hms(at) + "\n" + rows.join("\n");
    tip.hidden = false;
    tip.style.left = Math.min(W - 90, Math.max(0, sc.sx(at) + 8)) + "px";
    tip.style.top = "18px";
  }

  async function act(jobId, verb) {
    try {
      await api("/v1/jobs/" + encodeURIComponent(jobId) + ":" + verb, { method: "POST" });
      await poll();
    } catch (e) {
      if (e.message !== "unauthorized") document.getElementById("error").textContent = verb + " failed: " + e.message;
    }
  }

  const ALLOWED = { pause: ["running"], resume: ["paused"], cancel: ["pending", "running", "paused"] };

  function card(job) {
    let sec = document.querySelector('section[data-job-id="' + CSS.escape(job.id) + '"]');
    if (!sec) {
      sec = el("section", { class: "job", "data-job-id": job.id });
      const h = el("h2", {}, job.id);
      h.appendChild(el("span", { class: "state" }));
      const actions = el("span", { class: "actions" });
      for (const verb of Object.keys(ALLOWED)) {
        const b = el("button", { type: "button", "data-action": verb }, verb);
        b.addEventListener("click", () => act(job.id, verb));
        actions.appendChild(b);
      }
      h.appendChild(actions);
      sec.appendChild(h);
      sec.appendChild(el("div", { class: "detail" }));
      sec.appendChild(el("div", { class: "ledger" }));
      const weights = el("div", { class: "weights" });
      weights.hidden = true;
      sec.appendChild(weights);
      const charts = el("div", { class: "charts" });
      for (const [key, label, unit] of METRICS) {
        const fig = el("figure", { "data-metric": key });
        const cap = el("figcaption");
        cap.appendChild(el("span", {}, label));
        cap.appendChild(el("span", { class: "last" }));
        fig.appendChild(cap);
        fig.appendChild(el("svg", { class: "chart", width: W, height: H, "data-metric": key, "data-points": "0" }));
        if (key === "queues") fig.appendChild(el("div", { class: "legend" }));
        const tip = el("div", { class: "tip" });
        tip.hidden = true;
        fig.appendChild(tip);
        fig.querySelector("svg").addEventListener("mousemove", ev => hover(fig, ev));
        fig.querySelector("svg").addEventListener("mouseleave", () => {
          tip.hidden = true; fig.querySelectorAll(".hover").forEach(n => n.remove());
        });
        charts.appendChild(fig);
      }
      sec.appendChild(charts);
      sec.appendChild(el("ul", { class: "events" }));
      const logs = el("details", { class: "logs" });
      logs.appendChild(el("summary", {}, "logs"));
      const pick = el("select", { "aria-label": "service" });
      pick.appendChild(el("option", { value: "job" }, "job"));
      pick.addEventListener("change", () => loadLog(job.id, sec));
      logs.appendChild(pick);
      logs.appendChild(el("pre", { class: "log", "data-service": "job" }));
      logs.addEventListener("toggle", () => { if (logs.open) loadLog(job.id, sec); });
      sec.appendChild(logs);
      document.getElementById("jobs").appendChild(sec);
    }
    sec.setAttribute("data-state", job.state);
    const st = sec.querySelector(".state");
    st.textContent = job.state;
    st.className = "state " + job.state;
    for (const [verb, states] of Object.entries(ALLOWED)) sec.querySelector('[data-action="' + verb + '"]').hidden = !states.includes(job.state);
    const p = job.progress || {};
    const ledger = Object.entries(p.ledger || {}), restarts = Object.entries(p.restarts || {}).filter(([, n]) => n > 0);
    sec.querySelector(".ledger").textContent =
      (ledger.length ? "samples: " + ledger.map(([k, v]) => k.replace(/_/g, " ") + " " + fmt(v)).join(" · ") : "") +
      (restarts.length ? (ledger.length ? "   " : "") + "restarts: " + restarts.map(([k, v]) => k + " " + v).join(", ") : "");
    weightsView(sec.querySelector(".weights"), p.weights);
    sec.querySelector(".detail").textContent =
      (p.step !== undefined && p.step !== null ? "step " + p.step + (p.total_steps ? " / " + p.total_steps : "") + "  " : "") + (job.detail || "");
    return sec;
  }

  // The weight plane: which version each replica serves and its role; the canary gate's decisions.
  function weightsView(box, w) {
    box.hidden = !w;
    if (!w) return;
    box.dataset.mode = w.mode;
    const head = el("div", {}, "weights (" + w.mode + ")" + (w.promoted !== undefined && w.promoted !== null ? ": promoted v" + w.promoted : "") +
      (w.candidate !== undefined && w.candidate !== null ? ", candidate v" + w.candidate : "") + (w.paused ? "; PAUSED: " + w.paused : "") + "  ");
    for (const [name, r] of Object.entries(w.replicas || {}).sort()) {
      const v = r.served_version === undefined || r.served_version === null ? "" : String(r.served_version);
      head.appendChild(el("span", { class: "replica", "data-replica": name, "data-role": r.role, "data-version": v },
        name + " " + (v ? "v" + v : "–") + (r.role === "all" ? "" : " " + r.role)));
    }
    const decisions = (w.events || []).filter(e => ["promoted", "rejected", "paused", "resumed"].includes(e.kind)).slice(-5);
    const list = el("ul", {});
    for (const e of decisions) {
      const m = Object.entries(e.measurements || {}).filter(([k]) => k.includes("logprob_gap") || k.includes("error_rate"));
      list.appendChild(el("li", { "data-kind": e.kind, "data-version": String(e.version) }, hms(e.ts) + "  v" + e.version + " " + e.kind +
        (e.reason ? ": " + e.reason : "") + (m.length ? " (" + m.map(([k, v]) => k + " " + fmt(v)).join(", ") + ")" : "")));
    }
    box.replaceChildren(head, ...(decisions.length ? [list] : []));
  }

  // A fleet: state, scaling block, replicas (phase, restarts) with the version each serves each
  // attached job, and its last scaling decisions.
  function fleetCard(f) {
    let sec = document.querySelector('section.fleet[data-fleet="' + CSS.escape(f.name) + '"]');
    if (!sec) {
      sec = el("section", { class: "fleet", "data-fleet": f.name });
      const h = el("h3", {}, "fleet " + f.name);
      h.appendChild(el("span", { class: "state" }));
      h.appendChild(el("span", { class: "model" }));
      sec.appendChild(h);
      sec.appendChild(el("div", { class: "detail" }));
      sec.appendChild(el("div", { class: "scaling" }));
      sec.appendChild(el("table", { class: "replicas" }));
      sec.appendChild(el("ul", { class: "decisions" }));
      document.getElementById("fleets").appendChild(sec);
    }
    sec.setAttribute("data-state", f.state);
    const st = sec.querySelector(".state");
    st.textContent = f.state;
    st.className = "state " + f.state;
    sec.querySelector(".model").textContent = (f.model || "") + (f.max_jobs ? "  ·  " + f.max_jobs + " adapter slot(s) per replica" : "");
    const detail = sec.querySelector(".detail");
    detail.textContent = f.detail || "";
    detail.hidden = !f.detail;
    scalingView(sec.querySelector(".scaling"), f.scaling);
    replicaTable(sec.querySelector("table.replicas"), f);
    return sec;
  }

  function scalingView(box, sc) {
    box.hidden = !sc;
    if (!sc) return;
    const sig = sc.signals || {}, num = v => (typeof v === "number" ? v : null);
    const per = num(sig.backlog_per_replica), wait = num(sig.trainer_wait);
    box.dataset.min = String(sc.min); box.dataset.max = String(sc.max); box.dataset.desired = String(sc.desired);
    box.dataset.backlogPerReplica = per === null ? "" : String(per);
    box.dataset.trainerWait = wait === null ? "" : String(wait);
    const parts = ["scaling: " + sc.desired + " replica(s) desired of " + sc.min + ".." + sc.max + (sc.policy ? " (" + sc.policy + ")" : "")];
    if (num(sig.backlog) !== null) parts.push("backlog " + fmt(sig.backlog) + " group(s), " + (per === null ? "–" : per.toFixed(2)) + " per replica");
    if (wait !== null) parts.push("trainer wait " + Math.round(wait * 100) + "%");
    if (num(sig.jobs) !== null) parts.push(sig.jobs + " job(s)");
    if (num(sig.tokens_per_s) !== null) parts.push(fmt(sig.tokens_per_s) + " tok/s");
    if (num(sig.dropped_stale_per_s)) parts.push(fmt(sig.dropped_stale_per_s) + " stale drops/s");
    const req = sc.requested;
    if (req && (req.min !== sc.min || req.max !== sc.max)) parts.push("bounds " + req.min + ".." + req.max + " asked for");
    box.textContent = parts.join("  ·  ");
  }

  function replicaTable(table, f) {
    const jobs = Object.keys(f.jobs || {}).sort();
    const head = el("tr", {});
    for (const t of ["replica", "phase", "restarts", "process"]) head.appendChild(el("th", {}, t));
    for (const j of jobs) head.appendChild(el("th", { "data-job": j }, j));
    const rows = [head];
    for (const [name, r] of Object.entries(f.replicas || {})) {
      const phase = r.phase || (r.alive ? (r.ready ? "serving" : "starting") : "off");
      const tr = el("tr", { class: "replica", "data-replica": name, "data-phase": phase, "data-restarts": String(r.restarts),
                            "data-alive": String(!!r.alive) });
      tr.appendChild(el("td", {}, name));
      tr.appendChild(el("td", { class: "phase" }, phase));
      tr.appendChild(el("td", { class: "restarts" }, String(r.restarts)));
      tr.appendChild(el("td", { class: "proc" }, r.alive ? (r.ready ? "ready" : "alive") + (r.pid ? " (pid " + r.pid + ")" : "") : "–"));
      for (const j of jobs) {
        const rep = (f.jobs[j] || {})[name];
        const v = rep && rep.served_version !== null && rep.served_version !== undefined ? String(rep.served_version) : "";
        const text = !rep ? "–" : rep.state === "attached" ? (v ? "v" + v : "attached") : rep.state;
        const td = el("td", { class: "served", "data-job": j, "data-state": rep ? rep.state : "", "data-version": v }, text);
        if (rep && rep.detail) td.title = rep.detail;
        tr.appendChild(td);
      }
      rows.push(tr);
    }
    table.replaceChildren(...rows);
  }

  // "12:03:04 add rollout-1 (backlog_high: 6.0 per replica)"
  function decisionText(e) {
    const per = (e.signals || {}).backlog_per_replica;
    let why = e.reason;
    if (e.reason === "backlog_high" || e.reason === "backlog_low") why += ": " + (typeof per === "number" ? per.toFixed(1) : "–") + " per replica";
    else if (e.reason === "idle") why += ": no job attached";
    else if (e.from !== null && e.from !== undefined) why += ": " + e.from + " -> " + e.to + " replica(s)";
    return hms(e.ts) + " " + e.action + " " + ((e.replicas || []).join(", ") || "–") + " (" + why + ")";
  }

  async function pollFleets() {
    const r = await fetch("/v1/fleets", { headers: { Authorization: "Bearer " + token } });
    if (r.status === 404) { document.getElementById("fleets").hidden = true; return; }  // a gateway without fleets
    if (r.status === 401) { setAuth("refused", "the gateway refused the token: enter the right one"); throw new Error("unauthorized"); }
    if (!r.ok) throw new Error("/v1/fleets: HTTP " + r.status);
    const { fleets } = await r.json();
    document.getElementById("fleets").hidden = fleets.length === 0;
    const names = new Set(fleets.map(f => f.name));
    for (const s of document.querySelectorAll("section.fleet")) if (!names.has(s.dataset.fleet)) s.remove();
    for (const f of fleets) {
      const sec = fleetCard(f);
      const fe = fleetEvents[f.name] = fleetEvents[f.name] || { since: 0, events: [] };
      const got = await (await api("/v1/fleets/" + encodeURIComponent(f.name) + "/events?since=" + fe.since)).json();
      const fresh = got.events.filter(e => e.ts > fe.since);
      if (fresh.length) { fe.events.push(...fresh); fe.since = fresh[fresh.length - 1].ts; }
      fe.events = fe.events.slice(-8);
      sec.querySelector("ul.decisions").replaceChildren(...fe.events.map(e => el("li", {
        class: "decision", "data-action": e.action, "data-reason": e.reason, "data-replicas": (e.replicas || []).join(","),
      }, decisionText(e))));
    }
  }

  async function loadLog(jobId, sec) {
    const pick = sec.querySelector("details.logs select"), pre = sec.querySelector("pre.log");
    const service = pick.value || "job";
    try {
      const r = await api("/v1/jobs/" + encodeURIComponent(jobId) + "/logs?tail=200&service=" + encodeURIComponent(service));
      const names = (r.headers.get("X-Log-Services") || "").split(",").filter(Boolean);
      if (names.join() !== [...pick.options].map(o => o.value).join()) {
        pick.replaceChildren(...names.map(n => el("option", { value: n }, n)));
        pick.value = names.includes(service) ? service : names[0] || "job";
      }
      const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      // A progress bar rewrites its line with "\r": show each line as it last looked.
      pre.textContent = (await r.text()).split("\n").map(l => l.replace(/\r+$/, "").split("\r").pop()).join("\n");
      pre.dataset.service = service;
      if (stick) pre.scrollTop = pre.scrollHeight;
    } catch (e) {
      if (e.message !== "unauthorized") { pre.textContent = String(e.message || e); pre.dataset.service = service; }
    }
  }

  // One poll at a time: a button's poll and the timer's never interleave (which would draw a point twice).
  let polling = null;
  function poll() {
    if (!polling) polling = pollOnce().finally(() => { polling = null; });
    return polling;
  }

  async function pollOnce() {
    try {
      const { jobs } = await (await api("/v1/jobs?limit=20")).json();
      if (document.body.dataset.auth !== "ok") setAuth("ok");
      document.getElementById("empty").hidden = jobs.length > 0;
      for (const job of jobs) {
        const sec = card(job);
        const s = series[job.id] = series[job.id] || { since: 0, points: [] };
        const m = await (await api("/v1/jobs/" + encodeURIComponent(job.id) + "/metrics?since=" + s.since)).json();
        const fresh = m.points.filter(p => p.ts > s.since);  // never the same point twice
        if (fresh.length) { s.points.push(...fresh); s.since = fresh[fresh.length - 1].ts; }
        s.points = s.points.slice(-2000);
        for (const [key, , unit] of METRICS) draw(sec.querySelector('figure[data-metric="' + key + '"]'), key, unit, lines(s.points, key));
        const ev = await (await api("/v1/jobs/" + encodeURIComponent(job.id) + "/events")).json();
        sec.querySelector(".events").replaceChildren(...ev.events.slice(-5).map(e =>
          el("li", { "data-kind": e.kind }, hms(e.ts) + "  " + e.kind + (e.detail ? ": " + e.detail : ""))));
        if (sec.querySelector("details.logs").open) await loadLog(job.id, sec);
      }
      await pollFleets();
      document.getElementById("error").textContent = "";
      document.body.dataset.polls = String(+document.body.dataset.polls + 1);
    } catch (e) {
      if (e.message !== "unauthorized") document.getElementById("error").textContent = String(e.message || e);
    }
  }

  document.getElementById("login").addEventListener("submit", ev => {
    ev.preventDefault();
    token = document.getElementById("token").value;
    sessionStorage.setItem("meshrl_token", token);
    document.getElementById("error").textContent = "";
    poll();
  });
  if (!token) { setAuth("missing", "enter the gateway token to see its jobs"); } else { sessionStorage.setItem("meshrl_token", token); }
  async function loop() { if (token && document.body.dataset.auth !== "refused") await poll(); setTimeout(loop, interval); }
  loop();
})();
</script>
</body>
</html>
"""
