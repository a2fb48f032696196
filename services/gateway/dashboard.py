"""The gateway's built-in dashboard: one static HTML page, plain JS, no build step.

The page holds no data itself. Its script asks for the gateway token (``#token=...`` in the
URL, or typed into the box; kept in the tab's ``sessionStorage``), then polls
``GET /v1/jobs`` and each job's ``GET /v1/jobs/{id}/metrics?since=<last ts>`` every
``?interval=`` milliseconds (default 2000) and redraws four SVG curves per job: reward mean,
staleness, queue depths (one line per stream) and tokens/s.

For tests and scripts the page exposes its state in the DOM: ``<body data-polls=N>``
counts successful polls; each chart ``<svg data-metric=... data-points=N>``; each job card
``<section class="job" data-job-id=... data-state=...>``.
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
  .job h2 { font-size: 1rem; margin: 0 0 .4rem; }
  .state { font-weight: normal; font-size: .85rem; padding: .1rem .4rem; border-radius: 3px; background: #eee; }
  .charts { display: flex; flex-wrap: wrap; gap: 1rem; }
  figure { margin: 0; }
  figcaption { font-size: .8rem; color: #555; }
  svg { background: #fcfcfc; border: 1px solid #eee; }
  #error { color: #b00; }
  #login { margin-bottom: 1rem; }
</style>
</head>
<body data-polls="0">
<h1>meshrl jobs</h1>
<form id="login" hidden><label>gateway token <input id="token" type="password" autocomplete="off"></label>
<button>show jobs</button></form>
<p id="error" role="alert"></p>
<div id="jobs"><p id="empty">no jobs yet</p></div>
<script>
"use strict";
(function () {
  const METRICS = [
    ["reward_mean", "reward mean"], ["staleness", "staleness (versions)"],
    ["queues", "queue depths"], ["tokens_per_s", "tokens / s"],
  ];
  const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];
  const W = 280, H = 120, PAD = 6;
  const params = new URLSearchParams(location.search);
  const interval = Math.max(100, parseInt(params.get("interval") || "2000", 10) || 2000);
  const hash = new URLSearchParams(location.hash.slice(1));
  let token = hash.get("token") || sessionStorage.getItem("meshrl_token") || "";
  const series = {};  // job id -> {since, points: []}

  function el(tag, attrs, text) {
    const svgTags = ["svg", "polyline", "text", "line"];
    const node = svgTags.includes(tag)
      ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  async function api(path) {
    const r = await fetch(path, { headers: { Authorization: "Bearer " + token } });
    if (r.status === 401) { showLogin("the gateway refused the token"); throw new Error("unauthorized"); }
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }

  function showLogin(msg) {
    document.getElementById("login").hidden = false;
    document.getElementById("error").textContent = msg || "";
  }

  function lines(points, key) {
    if (key !== "queues") return { [key]: points.map(p => [p.ts, p[key]]).filter(x => typeof x[1] === "number") };
    const out = {};
    for (const p of points) for (const [q, d] of Object.entries(p.queues || {})) (out[q] = out[q] || []).push([p.ts, d]);
    return out;
  }

  function draw(svg, byLine) {
    svg.replaceChildren();
    const all = Object.values(byLine).flat();
    svg.setAttribute("data-points", String(all.length));
    if (!all.length) { svg.appendChild(el("text", { x: 8, y: H / 2, "font-size": 11, fill: "#999" }, "no data yet")); return; }
    const xs = all.map(p => p[0]), ys = all.map(p => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(0, ...ys), y1 = Math.max(...ys);
    const sx = x => PAD + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (W - 2 * PAD);
    const sy = y => H - PAD - (y1 > y0 ? (y - y0) / (y1 - y0) : 0.5) * (H - 2 * PAD);
    Object.entries(byLine).forEach(([name, pts], i) => {
      svg.appendChild(el("polyline", {
        "data-line": name, fill: "none", stroke: COLORS[i % COLORS.length], "stroke-width": 1.5,
        points: pts.map(p => sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join(" "),
      }));
    });
    const last = all[all.length - 1][1];
    svg.appendChild(el("text", { x: W - PAD, y: 12, "font-size": 11, "text-anchor": "end", fill: "#333" },
      Object.keys(byLine).length > 1 ? Object.keys(byLine).join(", ") : String(+last.toFixed(4))));
  }

  function card(job) {
    let sec = document.querySelector('section[data-job-id="' + CSS.escape(job.id) + '"]');
    if (!sec) {
      sec = el("section", { class: "job", "data-job-id": job.id });
      const h = el("h2", {}, job.id + " ");
      h.appendChild(el("span", { class: "state" }));
      sec.appendChild(h);
      sec.appendChild(el("div", { class: "detail" }));
      const charts = el("div", { class: "charts" });
      for (const [key, label] of METRICS) {
        const fig = el("figure");
        fig.appendChild(el("svg", { width: W, height: H, "data-metric": key, "data-points": "0" }));
        fig.appendChild(el("figcaption", {}, label));
        charts.appendChild(fig);
      }
      sec.appendChild(charts);
      document.getElementById("jobs").appendChild(sec);
    }
    sec.setAttribute("data-state", job.state);
    sec.querySelector(".state").textContent = job.state;
    const p = job.progress || {};
    sec.querySelector(".detail").textContent =
      (p.step !== undefined && p.step !== null ? "step " + p.step + (p.total_steps ? "/" + p.total_steps : "") + " " : "") + (job.detail || "");
    return sec;
  }

  async function poll() {
    try {
      const { jobs } = await api("/v1/jobs?limit=20");
      document.getElementById("empty").hidden = jobs.length > 0;
      for (const job of jobs) {
        const sec = card(job);
        const s = series[job.id] = series[job.id] || { since: 0, points: [] };
        const m = await api("/v1/jobs/" + encodeURIComponent(job.id) + "/metrics?since=" + s.since);
        if (m.points.length) { s.points.push(...m.points); s.since = m.points[m.points.length - 1].ts; }
        s.points = s.points.slice(-2000);
        for (const [key] of METRICS) draw(sec.querySelector('svg[data-metric="' + key + '"]'), lines(s.points, key));
      }
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
    document.getElementById("login").hidden = true;
    poll();
  });
  if (!token) { showLogin(""); } else { sessionStorage.setItem("meshrl_token", token); }
  async function loop() { if (token) await poll(); setTimeout(loop, interval); }
  loop();
})();
</script>
</body>
</html>
"""
