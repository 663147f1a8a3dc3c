// Markdown of assistant answers: parsed by marked, sanitised by DOMPurify (both vendored
// under vendor/, see vendor/README.md), inserted as a DOM fragment. No raw HTML from a
// message survives: DOMPurify drops scripts, event handlers and javascript: URLs, and the
// page's CSP would refuse them anyway.

import { marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.js";

marked.use({ gfm: true, breaks: true });

// Links open in a new tab without handing it this page.
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

const PURIFY = {
  RETURN_DOM_FRAGMENT: true,
  // Remote images would be refused by the CSP (img-src 'self'); forms and styles have no
  // place in an answer.
  FORBID_TAGS: ["img", "style", "form", "input", "button", "textarea", "select", "iframe"],
  FORBID_ATTR: ["style"],
};

/** Replace el's content with `text` rendered as sanitised Markdown. */
export function renderMarkdown(el, text) {
  const html = marked.parse(text ?? "", { async: false });
  el.replaceChildren(DOMPurify.sanitize(html, PURIFY));
  el.classList.add("md");
  return el;
}
