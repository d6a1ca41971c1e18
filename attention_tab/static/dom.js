// el("div", {class: "x", onclick: f}, child, "text", ...) -> an element; attributes starting with
// "on" become listeners, the others attributes; children may be nodes, strings or arrays of them.
export function el(tag, attributes = {}, ...children) {
  const element = tag === "svg" || tag === "line"
    ? document.createElementNS("http://www.w3.org/2000/svg", tag)
    : document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) element.setAttribute(name, value);
  }
  element.append(...children.flat());
  return element;
}

// "+1.20", "−0.45" (a minus sign), or "0.00" for a change that rounds to nothing.
export function formatChange(value, digits = 2) {
  const shown = formatValue(Math.abs(value), digits);
  return Number(shown) === 0 ? shown : `${value > 0 ? "+" : "−"}${shown}`;
}

// "0.8312"-style numbers, negative ones with a minus sign ("−2.30", as formatChange writes them), or
// a dash where a value is missing.
export function formatValue(value, digits = 3) {
  return value === null || value === undefined || Number.isNaN(value) ? "–" : value.toFixed(digits).replace(/^-/, "−");
}
