// Model view: every head of every layer as a small map, with one head metric printed on each;
// a click opens that head in the token and matrix views. On your text a click knocks the head
// out instead (and a second click brings it back): the model reads the text again without it.
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
    this.hint = el("p", {class: "hint"});
    this.root = el("section", {class: "panel model-view", "aria-label": "Model view"}, this.title,
      el("label", {class: "inline"}, "on each head: ", this.metric), this.hint, this.grid);
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
          onclick: () => this.click(layer, head)}, canvas, badge);
        this.cells.push({cell, canvas, badge, layer, head});
        return cell;
      })]);
    this.grid.replaceChildren(el("span"), ...heads, ...rows.flat());
  }

  click(layer, head) {
    if (this.knocking) this.app.toggleKnockedOut(layer, head);
    else this.app.set({layer, head, shown: new Set([head])});
  }

  draw({weights, reading, layer, head, step, metricAt}) {
    this.knocking = Boolean(reading);
    const out = new Set(reading ? reading.knocked_out.map(([l, h]) => `${l}:${h}`) : []);
    this.title.textContent = reading ? `Model view · your text · ${reading.checkpoint} (step ${reading.step})` : `Model view · step ${step}`;
    this.hint.textContent = reading ? "Click a head to knock it out, again to bring it back." : "";
    this.hint.hidden = !reading;
    for (const {cell, canvas, badge, layer: l, head: h} of this.cells) {
      paintMap(canvas, weights.map(l, h), weights.T);
      const value = this.metric.value ? metricAt(this.metric.value, l, h) : null;
      const knocked = out.has(`${l}:${h}`);
      badge.textContent = knocked ? "out" : this.metric.value ? formatValue(value, 2) : "";
      cell.classList.toggle("selected", l === layer && h === head);
      cell.classList.toggle("knocked", knocked);
      cell.title = `layer ${l} head ${h}: ${metricAt.describe(l, h)}`;
      if (this.knocking) cell.setAttribute("aria-pressed", knocked);
      else cell.removeAttribute("aria-pressed");
      cell.setAttribute("aria-label", this.knocking ? `knock out layer ${l} head ${h}` : `open layer ${l} head ${h}`);
    }
  }
}
