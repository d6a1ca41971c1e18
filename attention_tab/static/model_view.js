// Model view: every head of every layer as a small map, with one head metric printed on each;
// a click opens that head in the token and matrix views.
import {paintMap} from "./colours.js";
import {el, formatValue} from "./dom.js";

const WIDTH = 380;  // px for the whole grid

export class ModelView {
  constructor(app, metricNames) {
    this.app = app;
    this.title = el("h2", {}, "Model view");
    this.metric = el("select", {"aria-label": "number shown on each head", onchange: () => app.redraw()},
      el("option", {value: ""}, "no number"),
      ...Object.entries(metricNames).map(([name, label]) => el("option", {value: name}, label)));
    this.grid = el("div", {class: "model-grid"});
    this.root = el("section", {class: "panel model-view", "aria-label": "Model view"}, this.title,
      el("label", {class: "inline"}, "on each head: ", this.metric), this.grid);
  }

  setRun(run, metrics) {
    const [L, H] = run.shape;
    const size = Math.max(24, Math.min(88, Math.floor(WIDTH / H) - 6));
    if (!this.metric.value) this.metric.value = ["recall", "induction"].find((name) => name in metrics) ?? "";
    this.grid.style.gridTemplateColumns = `auto repeat(${H}, ${size}px)`;
    this.cells = [];
    const heads = Array.from({length: H}, (_, h) => el("span", {class: "axis"}, `h${h}`));
    const rows = Array.from({length: L}, (_, layer) => [el("span", {class: "axis"}, `L${layer}`),
      ...heads.map((_, head) => {
        const canvas = el("canvas", {style: `width:${size}px;height:${size}px`});
        const badge = el("span", {class: "badge"});
        const cell = el("button", {class: "head-cell", "data-layer": layer, "data-head": head,
          onclick: () => this.app.set({layer, head, shown: new Set([head])})}, canvas, badge);
        this.cells.push({cell, canvas, badge, layer, head});
        return cell;
      })]);
    this.grid.replaceChildren(el("span"), ...heads, ...rows.flat());
  }

  draw({weights, layer, head, step, metricAt}) {
    this.title.textContent = `Model view · step ${step}`;
    for (const {cell, canvas, badge, layer: l, head: h} of this.cells) {
      paintMap(canvas, weights.map(l, h), weights.T);
      const value = this.metric.value ? metricAt(this.metric.value, l, h) : null;
      badge.textContent = this.metric.value ? formatValue(value, 2) : "";
      cell.classList.toggle("selected", l === layer && h === head);
      cell.title = `layer ${l} head ${h}: ${metricAt.describe(l, h)}`;
      cell.setAttribute("aria-label", `open layer ${l} head ${h}`);
    }
  }
}
