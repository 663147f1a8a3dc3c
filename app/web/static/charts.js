// Small inline-SVG charts for the dashboard (no chart library): a y axis with three
// ticks and grid lines, time labels under the x axis, and a tooltip that follows the
// pointer (one column per minute, or per day with `dayLabels`; also reachable by
// keyboard focus on the chart).

import { h, s } from "./dom.js";

const W = 300;
const H = 80;

function niceMax(values) {
  // Counts start at 1; a series of small amounts (a cost of 0.002) gets its own scale.
  const max = Math.max(...values.filter((v) => v !== null && v !== undefined), 0) || 1;
  const mag = 10 ** Math.floor(Math.log10(max));
  for (const f of [1, 2, 2.5, 5, 10]) if (max <= f * mag) return f * mag;
  return max;
}

function scale(values) {
  const max = niceMax(values);
  return { max, y: (v) => H - 1 - ((H - 4) * v) / max };
}

function timeLabel(iso) {
  return new Date(iso).toISOString().slice(11, 16);
}

const MINUTES = { label: timeLabel, zone: " UTC" };
/** For points whose `t` is a UTC day (YYYY-MM-DD): month-day under the axis, the date in the tip. */
export const dayLabels = { label: (day) => day.slice(5), tip: (day) => day, zone: " UTC" };

function fmt(v) {
  if (v === null || v === undefined) return "—";
  if (Number.isInteger(v)) return String(v);
  return Math.abs(v) < 1 ? String(Number(v.toPrecision(2))) : v.toFixed(1);
}

function gridLines(y, max) {
  return [0.5, 1].map((f) =>
    s("line", { class: "grid-line", x1: 0, x2: W, y1: y(max * f).toFixed(1), y2: y(max * f).toFixed(1) }),
  );
}

/** Bars, one per point. `points`: [{t, value}] */
export function barChart(title, points, { unit = "", bad = false, labels = MINUTES, id } = {}) {
  const values = points.map((p) => p.value ?? 0);
  const { max, y } = scale(values);
  const step = W / Math.max(1, points.length);
  const bars = points.map((p, i) =>
    s("rect", {
      class: bad ? "bar bad" : "bar",
      x: (i * step + step * 0.15).toFixed(2),
      y: y(p.value ?? 0).toFixed(2),
      width: Math.max(1, step * 0.7).toFixed(2),
      height: (H - 1 - y(p.value ?? 0)).toFixed(2),
    }),
  );
  const shapes = [...gridLines(y, max), s("line", { class: "axis", x1: 0, x2: W, y1: H - 1, y2: H - 1 }), ...bars];
  return frame(title, max, unit, points, shapes, (i) => i * step + step / 2, labels, id);
}

/** A line with a light area under it; gaps (null values) break the line. */
export function lineChart(title, points, { unit = "", labels = MINUTES, id } = {}) {
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
  const shapes = [...gridLines(y, max), s("line", { class: "axis", x1: 0, x2: W, y1: H - 1, y2: H - 1 })];
  for (const seg of segments) {
    if (seg.length === 1) {
      shapes.push(s("circle", { class: "dot", cx: seg[0][0].toFixed(1), cy: seg[0][1].toFixed(1), r: 2.5 }));
      continue;
    }
    const d = seg.map(([x, yy], i) => `${i ? "L" : "M"}${x.toFixed(1)},${yy.toFixed(1)}`).join("");
    const area = `${d}L${seg[seg.length - 1][0].toFixed(1)},${H - 1}L${seg[0][0].toFixed(1)},${H - 1}Z`;
    shapes.push(s("path", { class: "area", d: area }), s("path", { class: "line", d }));
  }
  return frame(title, max, unit, points, shapes, (i) => i * step, labels, id);
}

function frame(title, max, unit, points, shapes, xOf, labels, id) {
  const timeLabel = labels.label;
  const tipLabel = labels.tip || labels.label;
  const first = points[0];
  const last = points[points.length - 1];
  const middle = points[Math.floor(points.length / 2)];
  const hot = s("rect", { class: "hot", x: 0, y: 0, width: 0, height: H, visibility: "hidden" });
  const svg = s(
    "svg",
    { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", "aria-label": title, tabindex: 0 },
    ...shapes,
    hot,
  );
  const tip = h("div", { class: "chart-tip hidden", role: "tooltip" });
  const plotArea = h("div", { class: "plot-area" }, svg, tip);
  const show = (i) => {
    const p = points[i];
    if (!p) return;
    const colW = W / Math.max(1, points.length);
    hot.setAttribute("x", (xOf(i) - colW / 2).toFixed(1));
    hot.setAttribute("width", colW.toFixed(1));
    hot.setAttribute("visibility", "visible");
    tip.textContent = `${tipLabel(p.t)}${labels.zone} · ${fmt(p.value ?? (unit ? null : 0))}${p.value === null || p.value === undefined ? "" : unit}`;
    tip.style.left = `${(xOf(i) / W) * 100}%`;
    tip.style.top = "0";
    tip.classList.remove("hidden");
    svg.dataset.hover = String(i);
  };
  const hide = () => {
    tip.classList.add("hidden");
    hot.setAttribute("visibility", "hidden");
  };
  const indexAt = (clientX) => {
    const box = svg.getBoundingClientRect();
    const frac = Math.min(0.9999, Math.max(0, (clientX - box.left) / box.width));
    return Math.floor(frac * points.length);
  };
  svg.addEventListener("pointermove", (ev) => show(indexAt(ev.clientX)));
  svg.addEventListener("pointerleave", hide);
  svg.addEventListener("blur", hide);
  svg.addEventListener("keydown", (ev) => {
    const now = Number(svg.dataset.hover ?? points.length - 1);
    if (ev.key === "ArrowLeft") show(Math.max(0, now - 1));
    else if (ev.key === "ArrowRight") show(Math.min(points.length - 1, now + 1));
  });
  svg.addEventListener("focus", () => show(points.length - 1));
  const yaxis = h(
    "div",
    { class: "yaxis", "aria-hidden": "true" },
    h("span", null, `${fmt(max)}${unit}`),
    h("span", null, `${fmt(max / 2)}${unit}`),
    h("span", null, "0"),
  );
  return h(
    "div",
    { class: "card chart", id },
    h("div", { class: "row" }, h("span", { class: "k" }, title)),
    h("div", { class: "plot" }, yaxis, plotArea),
    first
      ? h(
          "div",
          { class: "xaxis small muted" },
          h("span", null, timeLabel(first.t)),
          h("span", null, timeLabel(middle.t)),
          h("span", null, `${timeLabel(last.t)}${labels.zone}`),
        )
      : null,
  );
}
