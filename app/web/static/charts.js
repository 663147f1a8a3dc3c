// Small inline-SVG charts for the dashboard (no chart library).

import { h, s } from "./dom.js";

const W = 300;
const H = 80;

function scale(values) {
  const max = Math.max(1, ...values.filter((v) => v !== null && v !== undefined));
  return { max, y: (v) => H - 2 - ((H - 6) * v) / max };
}

function timeLabel(iso) {
  return new Date(iso).toISOString().slice(11, 16);
}

/** Bars, one per point. `points`: [{t, value}] */
export function barChart(title, points, { unit = "", bad = false } = {}) {
  const values = points.map((p) => p.value ?? 0);
  const { max, y } = scale(values);
  const step = W / Math.max(1, points.length);
  const bars = points.map((p, i) =>
    s(
      "rect",
      {
        class: bad ? "bar bad" : "bar",
        x: (i * step + step * 0.15).toFixed(2),
        y: y(p.value ?? 0).toFixed(2),
        width: Math.max(1, step * 0.7).toFixed(2),
        height: (H - 2 - y(p.value ?? 0)).toFixed(2),
      },
      s("title", null, `${timeLabel(p.t)} UTC: ${p.value ?? 0}${unit}`),
    ),
  );
  return frame(title, max, unit, points, [s("line", { class: "axis", x1: 0, x2: W, y1: H - 1, y2: H - 1 }), ...bars]);
}

/** A line with a light area under it; gaps (null values) break the line. */
export function lineChart(title, points, { unit = "" } = {}) {
  const values = points.map((p) => p.value);
  const { max, y } = scale(values);
  const step = points.length > 1 ? W / (points.length - 1) : W;
  const segments = [];
  let current = [];
  points.forEach((p, i) => {
    if (p.value === null || p.value === undefined) {
      if (current.length) segments.push(current);
      current = [];
    } else {
      current.push([i * step, y(p.value)]);
    }
  });
  if (current.length) segments.push(current);
  const shapes = [s("line", { class: "axis", x1: 0, x2: W, y1: H - 1, y2: H - 1 })];
  for (const seg of segments) {
    if (seg.length === 1) {
      shapes.push(s("circle", { class: "dot", cx: seg[0][0].toFixed(1), cy: seg[0][1].toFixed(1), r: 2.5 }));
      continue;
    }
    const pts = seg;
    const d = pts.map(([x, yy], i) => `${i ? "L" : "M"}${x.toFixed(1)},${yy.toFixed(1)}`).join("");
    const area = `${d}L${pts[pts.length - 1][0].toFixed(1)},${H - 1}L${pts[0][0].toFixed(1)},${H - 1}Z`;
    shapes.push(s("path", { class: "area", d: area }), s("path", { class: "line", d }));
  }
  points.forEach((p, i) => {
    if (p.value === null || p.value === undefined) return;
    shapes.push(
      s("circle", { cx: (i * step).toFixed(1), cy: y(p.value).toFixed(1), r: 4, fill: "transparent" },
        s("title", null, `${timeLabel(p.t)} UTC: ${p.value}${unit}`)),
    );
  });
  return frame(title, max, unit, points, shapes);
}

function frame(title, max, unit, points, shapes) {
  const first = points[0];
  const last = points[points.length - 1];
  return h(
    "div",
    { class: "card chart" },
    h("div", { class: "row" }, h("span", { class: "k" }, title), h("span", { class: "spacer" }),
      h("span", { class: "small muted" }, `max ${max}${unit}`)),
    s("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", "aria-label": title }, ...shapes),
    first
      ? h("div", { class: "row small muted" }, timeLabel(first.t), h("span", { class: "spacer" }), `${timeLabel(last.t)} UTC`)
      : null,
  );
}
