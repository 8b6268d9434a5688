// Live charts per unit, drawn as SVG by hand (no library, no CDN): the last HISTORY_S of each
// unit's traffic as the snapshots report it, one point a second, kept in this page only.
"use strict";

// One global: drawCharts(snapshot), called by status.js for every snapshot.
const drawCharts = (() => {
  const HISTORY_S = 300;
  const POINT_EVERY_S = 1;
  const MIN_SPAN_S = 60;
  const SVG_NS = "http://www.w3.org/2000/svg";
  const W = 280, H = 130, PAD = { left: 34, right: 6, top: 22, bottom: 16 };

  // What each chart draws: its title, and its lines (a field of a point, a legend, a class).
  const CHARTS = [
    { key: "rps", title: "requests/s", lines: [["rps", "answered", "l1"], ["err", "5xx", "bad"]] },
    { key: "ttft", title: "TTFT (ms)", lines: [["p50", "p50", "l1"], ["p99", "p99", "l2"]] },
    { key: "tps", title: "tokens/s", lines: [["tps", "completion", "l1"], ["pps", "prompt", "l2"]] },
    { key: "load", title: "in flight", lines: [["inflight", "in flight", "l1"]] },
    { key: "kv", title: "KV cache %", lines: [["kv", "leader", "l1"]], optional: true },
  ];

  const series = new Map(); // unit id -> its points, oldest first

  function pointOf(unit, time) {
    const t = unit.traffic || {};
    const ms = (s) => (s == null ? null : s * 1000);
    const leader = unit.nodes.find((n) => n.role === "leader") || unit.nodes[0];
    const kv = leader && leader.kv_usage != null ? leader.kv_usage * 100 : null;
    const inflight = unit.fleet && unit.fleet.in_flight !== undefined ? unit.fleet.in_flight : unit.in_flight;
    return {
      t: time, rps: t.rps ?? null, err: t.errors_per_s ?? null, tps: t.tokens_per_s ?? null,
      pps: t.prompt_tokens_per_s ?? null, p50: ms(t.ttft_p50), p99: ms(t.ttft_p99), inflight, kv,
    };
  }

  // Take a snapshot's units into the history (at most one point a second per unit); whether
  // a point was added.
  function record(snap) {
    const seen = new Set();
    let added = false;
    for (const unit of snap.units) {
      seen.add(unit.id);
      let points = series.get(unit.id);
      if (!points) series.set(unit.id, (points = []));
      const last = points[points.length - 1];
      if (last && snap.time - last.t < POINT_EVERY_S) continue;
      points.push(pointOf(unit, snap.time));
      added = true;
      while (points.length && points[0].t < snap.time - HISTORY_S) points.shift();
    }
    for (const id of [...series.keys()]) if (!seen.has(id)) series.delete(id);
    return added;
  }

  function svg(tag, attrs = {}, text) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // A round upper bound for the y axis: 1, 2 or 5 times a power of ten.
  function niceMax(value) {
    if (!(value > 0)) return 1;
    const power = 10 ** Math.floor(Math.log10(value));
    for (const step of [1, 2, 5, 10]) if (value <= step * power) return step * power;
    return 10 * power;
  }

  function label(value) {
    if (value >= 1000) return (value / 1000).toFixed(value >= 10000 ? 0 : 1) + "k";
    return value >= 10 || value === 0 ? value.toFixed(0) : value.toFixed(value >= 1 ? 1 : 2);
  }

  // The path of one line: M at the start and after each gap (a null value), L between.
  function pathData(points, field, x, y) {
    let d = "", drawn = 0, gap = true;
    for (const p of points) {
      const v = p[field];
      if (v == null) { gap = true; continue; }
      d += (gap ? "M" : "L") + x(p.t).toFixed(1) + " " + y(v).toFixed(1) + " ";
      gap = false;
      drawn += 1;
    }
    return [d.trim(), drawn];
  }

  function drawChart(node, chart, points, now, span) {
    const values = chart.lines.flatMap(([field]) => points.map((p) => p[field])).filter((v) => v != null);
    const top = niceMax(Math.max(0, ...values));
    const x = (t) => PAD.left + ((t - (now - span)) / span) * (W - PAD.left - PAD.right);
    const y = (v) => H - PAD.bottom - (v / top) * (H - PAD.top - PAD.bottom);
    const parts = [svg("text", { x: 2, y: 11, class: "title" }, chart.title)];
    for (const v of [0, top / 2, top]) {
      parts.push(svg("line", { x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v), class: "grid" }));
      parts.push(svg("text", { x: PAD.left - 4, y: y(v) + 3, class: "axis", "text-anchor": "end" }, label(v)));
    }
    const ago = span >= 120 ? `-${Math.round(span / 60)} min` : `-${Math.round(span)} s`;
    parts.push(svg("text", { x: PAD.left, y: H - 3, class: "axis" }, ago));
    parts.push(svg("text", { x: W - PAD.right, y: H - 3, class: "axis", "text-anchor": "end" }, "now"));
    let legend = W - PAD.right;
    for (const [field, name, cls] of chart.lines.slice().reverse()) {
      const [d, drawn] = pathData(points, field, x, y);
      parts.push(svg("path", { d, class: "line " + cls, "data-series": field, "data-points": drawn }));
      parts.push(svg("text", { x: legend, y: 11, class: "legend " + cls, "text-anchor": "end" }, name));
      legend -= 10 + name.length * 6;
    }
    node.replaceChildren(...parts);
  }

  function summary(p) {
    if (!p) return "";
    const out = [];
    if (p.rps != null) out.push(`${label(p.rps)} req/s`);
    if (p.p50 != null) out.push(`TTFT p50 ${label(p.p50)} ms, p99 ${label(p.p99)} ms`);
    if (p.tps != null) out.push(`${label(p.tps)} tok/s`);
    out.push(`${p.inflight} in flight`);
    if (p.kv != null) out.push(`KV ${p.kv.toFixed(0)}%`);
    return out.join(" · ");
  }

  function card(id) {
    const charts = CHARTS.map((c) => svg("svg", {
      viewBox: `0 0 ${W} ${H}`, class: "chart", "data-chart": c.key, role: "img", "aria-label": `${id} ${c.title}`,
    }));
    return el("section", { class: "unit-charts", "data-unit": id },
      el("h3", {}, id, " ", el("span", { class: "now" })), el("div", { class: "charts" }, ...charts));
  }

  // Draw every unit's charts from its history, one card per unit, in the snapshot's order.
  function drawCharts(snap) {
    const box = document.getElementById("charts");
    if (!record(snap) && box.children.length === snap.units.length) return;
    const cards = new Map([...box.children].map((c) => [c.dataset.unit, c]));
    const ordered = snap.units.map((u) => cards.get(u.id) || card(u.id));
    box.replaceChildren(...ordered);
    for (const section of ordered) {
      const points = series.get(section.dataset.unit) || [];
      // The time axis spans what the page has seen: a minute at first, up to HISTORY_S.
      const seen = points.length ? snap.time - points[0].t : 0;
      const span = Math.min(HISTORY_S, Math.max(MIN_SPAN_S, seen));
      section.querySelector(".now").textContent = summary(points[points.length - 1]);
      for (const chart of CHARTS) {
        const node = section.querySelector(`svg[data-chart="${chart.key}"]`);
        const shown = !chart.optional || points.some((p) => p[chart.lines[0][0]] != null);
        node.style.display = shown ? "" : "none";
        if (shown) drawChart(node, chart, points, snap.time, span);
      }
    }
  }

  return drawCharts;
})();
