// Matrix view: one head's weights as a heatmap, queries down, keys across, on the heatmap
// images' colour scale. The pointer (or the arrow keys, once the map has focus) reads out the
// exact weight with its query and key; a click sends that query to the token view.
import {hidden, paintMap} from "./colours.js";
import {el} from "./dom.js";

const SIZE = 352;  // px the map takes at most
const ASK = "Point at a cell: its query, key and weight.";

export class MatrixView {
  constructor(app, headMetrics) {
    this.app = app;
    this.cursor = null;  // [query, key] under the pointer or keyboard
    this.title = el("h2", {}, "Matrix view");
    this.canvas = el("canvas", {class: "matrix", tabindex: 0, "aria-label": "attention matrix: arrow keys move, Enter pins the query",
      onmousemove: (event) => this.pointAt(event), onmouseleave: () => this.read(null),
      onclick: (event) => this.pinAt(event), onkeydown: (event) => this.key(event)});
    this.row = el("div", {class: "matrix-row", "aria-hidden": "true"});
    this.readout = el("p", {class: "readout", "aria-live": "polite"}, ASK);
    this.hint = el("p", {class: "hint"});  // what grey means: the model's window, if any, hides more than the future
    this.root = el("section", {class: "panel matrix-view", "aria-label": "Matrix view"}, this.title,
      el("div", {class: "matrix-frame"}, this.canvas, this.row),
      this.hint, this.readout,
      headMetrics.root);
  }

  draw({weights, labels, reading, layer, head, token}) {
    this.state = {weights, layer, head, labels};
    const {T} = weights;
    this.cell = Math.max(2, Math.floor(SIZE / T));
    const out = reading?.knocked_out.some(([l, h]) => l === layer && h === head);
    this.title.textContent = `Matrix view · layer ${layer} · head ${head}${out ? " · knocked out: where it would look" : ""}`;
    const windowSize = weights.window;
    this.hint.textContent = `rows: queries · columns: keys · grey: masked, the future${windowSize === null ? ""
      : ` and the keys ${windowSize} or more back (the model's window)`}`;
    paintMap(this.canvas, weights.map(layer, head), T, windowSize);
    this.canvas.style.width = this.canvas.style.height = `${T * this.cell}px`;
    const query = token.side === "query" ? token.index : null;
    this.row.hidden = query === null;
    Object.assign(this.row.style, {top: `${(query ?? 0) * this.cell}px`, height: `${this.cell}px`, width: `${T * this.cell}px`});
    // The cell read before may be past a shorter text now: the readout then asks again.
    this.read(this.cursor && Math.max(...this.cursor) < T ? this.cursor : null);
  }

  cellAt(event) {
    const T = this.state.weights.T;
    const clamp = (v) => Math.max(0, Math.min(T - 1, Math.floor(v / this.cell)));
    return [clamp(event.offsetY), clamp(event.offsetX)];
  }

  pointAt(event) {
    this.read(this.cellAt(event));
  }

  pinAt(event) {
    const [query] = this.cellAt(event);
    this.app.pin({side: "query", index: query, reveal: true});
  }

  key(event) {
    const T = this.state.weights.T;
    const [query, key] = this.cursor ?? [T - 1, 0];
    const moves = {ArrowUp: [query - 1, key], ArrowDown: [query + 1, key], ArrowLeft: [query, key - 1], ArrowRight: [query, key + 1]};
    if (event.key === "Enter") return this.app.pin({side: "query", index: query, reveal: true});
    if (!(event.key in moves)) return;
    event.preventDefault();
    this.read(moves[event.key].map((v) => Math.max(0, Math.min(T - 1, v))));
  }

  read(cell) {
    this.cursor = cell;
    if (!cell) {  // the pointer left, or the cell is gone: no stale numbers under another map
      this.readout.textContent = ASK;
      Object.assign(this.readout.dataset, {query: "", key: "", weight: ""});
      return;
    }
    const [query, key] = cell;
    const {weights, layer, head, labels} = this.state;
    const weight = hidden(query, key, weights.window) ? null : weights.at(layer, head, query, key);
    const shown = weight !== null ? weight.toPrecision(4) : key > query ? "masked (the future)"
      : `masked (${weights.window} or more back: outside the window)`;
    this.readout.textContent = `query ${query} “${labels[query]}” → key ${key} “${labels[key]}”: ${shown}`;
    Object.assign(this.readout.dataset, {query, key, weight: weight ?? ""});
  }
}
