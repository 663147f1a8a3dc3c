// Tiny DOM helpers. Text always goes in through text nodes, never innerHTML, so nothing a
// message or a session key contains is ever parsed as markup.

import { t } from "./i18n.js";

const SVG_NS = "http://www.w3.org/2000/svg";

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function setAttrs(el, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2).toLowerCase(), value);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  return el;
}

/** h("div", {class: "x", onClick: fn}, "text", child, [more]) */
export function h(tag, attrs, ...children) {
  return append(setAttrs(document.createElement(tag), attrs), children);
}

/** The same for SVG elements. */
export function s(tag, attrs, ...children) {
  return append(setAttrs(document.createElementNS(SVG_NS, tag), attrs), children);
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

export function $(selector, root = document) {
  return root.querySelector(selector);
}

/** "3 min ago" / "in 2 h" with the exact time as a tooltip. */
export function ago(iso) {
  if (!iso) return h("span", { class: "muted" }, "—");
  const when = new Date(iso);
  const delta = Math.round((Date.now() - when.getTime()) / 1000);
  const secs = Math.abs(delta);
  let span;
  if (secs < 5) return h("time", { datetime: iso, title: when.toISOString() }, t("just now"));
  if (secs < 60) span = `${secs} s`;
  else if (secs < 3600) span = `${Math.floor(secs / 60)} min`;
  else if (secs < 86400) span = `${Math.floor(secs / 3600)} h`;
  else span = `${Math.floor(secs / 86400)} d`;
  const text = delta >= 0 ? t("{span} ago", { span }) : t("in {span}", { span });
  return h("time", { datetime: iso, title: when.toISOString() }, text);
}

export function prettyJson(value) {
  if (typeof value === "string") {
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      return value;
    }
  }
  return JSON.stringify(value, null, 2);
}
