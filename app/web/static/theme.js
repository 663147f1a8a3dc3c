// Light or dark: the system's choice (prefers-color-scheme) until the user picks one on
// the switch; the pick is remembered in localStorage. Loaded by both pages.

const KEY = "chatgate.theme";
const root = document.documentElement;

export function storedTheme() {
  const v = localStorage.getItem(KEY);
  return v === "light" || v === "dark" ? v : null;
}

export function effectiveTheme() {
  return storedTheme() || (window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
}

export function applyTheme() {
  const chosen = storedTheme();
  if (chosen) root.dataset.theme = chosen;
  else delete root.dataset.theme;
  root.dataset.effectiveTheme = effectiveTheme();
}

export function toggleTheme() {
  localStorage.setItem(KEY, effectiveTheme() === "dark" ? "light" : "dark");
  applyTheme();
}

/** Wire a button: shows the theme it switches to, and switches. */
export function themeButton(button, label) {
  const show = () => {
    const next = effectiveTheme() === "dark" ? "light" : "dark";
    button.textContent = next === "dark" ? "☾" : "☀";
    button.title = label(next);
    button.setAttribute("aria-label", label(next));
  };
  button.addEventListener("click", () => {
    toggleTheme();
    show();
  });
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => {
    applyTheme();
    show();
  });
  show();
  return show;
}

applyTheme();
