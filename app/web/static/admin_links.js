// Hash routes of the dashboard and the small formatters its pages share.

import { h } from "./dom.js";

export function parseHash() {
  const raw = window.location.hash.replace(/^#\/?/, "");
  const [path, query = ""] = raw.split("?");
  const [route, ...rest] = path.split("/");
  return {
    route: route || "overview",
    arg: rest.length ? decodeURIComponent(rest.join("/")) : null,
    params: Object.fromEntries(new URLSearchParams(query)),
  };
}

export function link(route, arg, params) {
  let out = `#/${route}`;
  if (arg !== undefined && arg !== null) out += `/${encodeURIComponent(arg)}`;
  const q = new URLSearchParams(Object.entries(params || {}).filter(([, v]) => v !== "" && v != null));
  if ([...q].length) out += `?${q}`;
  return out;
}

export const sessionLink = (key, generation) =>
  h("a", { href: link("session", key, generation ? { generation } : null), class: "mono" }, key);

export const ms = (v) => (v === null || v === undefined ? "—" : v >= 1000 ? `${(v / 1000).toFixed(1)} s` : `${v} ms`);
