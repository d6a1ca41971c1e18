// Model view: every head of every layer as a small map, with one head metric printed on each.
// A click on a head opens it in the token and matrix views, whatever the views show. While the
// run's model reads (your text, repeated tokens), each head also has a ✕ that knocks it out
// (again: back): the model reads the same tokens again without it. On the repeated tokens the
// loss of each token and the induction scores come first (repeated.js).
import {paintMap} from "./colours.js";
import {el, formatValue} from "./dom.js";

const WIDTH = 380;  // px for the whole grid

export class ModelView {
  constructor(app, metricNames, repeated) {
    this.app = app;
    this.repeated = repeated;
    this.title = el("h2", {}, "Model view");
    this.metric = el("select", {"aria-label": "number shown on each head", onchange: () => app.redraw()},
      el("option", {value: ""}, "no number"),
      ...Object.entries(metricNames).map(([name, label]) => el("option", {value: name}, label)));
    this.grid = el("div", {class: "model-grid"});
    this.hint = el("p", {class: "hint"});
    this.root = el("section", {class: "panel model-view", "aria-label": "Model view"}, this.title, repeated.root,
      el("label", {class: "inline"}, "on each head: ", this.metric), this.hint, this.grid);
  }

  setRun(run, metrics) {
    const [L, H] = run.shape;
    const size = Math.max(24, Math.min(88, Math.floor(WIDTH / H) - 6));
    if (!this.metric.value) this.metric.value = this.app.settings.badge_metrics.find((name) => name in metrics) ?? "";
    this.grid.style.gridTemplateColumns = `auto repeat(${H}, ${size}px)`;
    this.cells = [];
    const heads = Array.from({length: H}, (_, h) => el("span", {class: "axis"}, `h${h}`));
    const rows = Array.from({length: L}, (_, layer) => [el("span", {class: "axis"}, `L${layer}`),
      ...heads.map((_, head) => {
        const canvas = el("canvas", {style: `width:${size}px;height:${size}px`});
        const badge = el("span", {class: "badge"});
        const open = el("button", {class: "open", "aria-label": `open layer ${layer} head ${head}`,
          onclick: () => this.app.set({layer, head, shown: new Set([head])})}, canvas, badge);
        const knock = el("button", {class: "knock", onclick: () => this.app.toggleKnockedOut(layer, head)}, "✕");
        const cell = el("div", {class: "head-cell", "data-layer": layer, "data-head": head}, open, knock);
        this.cells.push({cell, open, knock, canvas, badge, layer, head});
        return cell;
      })]);
    this.grid.replaceChildren(el("span"), ...heads, ...rows.flat());
  }

  draw(state) {
    const {weights, reading, source, layer, head, step, metricAt} = state;
    this.repeated.draw(state);
    const out = new Set(reading ? reading.knocked_out.map(([l, h]) => `${l}:${h}`) : []);
    this.title.textContent = reading ? `Model view · ${source} · ${reading.checkpoint} (step ${reading.step})` : `Model view · step ${step}`;
    this.hint.textContent = reading ? "Click a head to open it; its ✕ knocks it out (again: back), and the model reads again without it."
      : "Click a head to open it. To knock heads out, show your text or repeated random tokens: the run's model reads them.";
    for (const {cell, open, knock, canvas, badge, layer: l, head: h} of this.cells) {
      paintMap(canvas, weights.map(l, h), weights.T, weights.window);
      const value = this.metric.value ? metricAt(this.metric.value, l, h) : null;
      const knocked = out.has(`${l}:${h}`);
      badge.textContent = knocked ? "out" : this.metric.value ? formatValue(value, 2) : "";
      cell.classList.toggle("selected", l === layer && h === head);
      cell.classList.toggle("knocked", knocked);
      open.title = `layer ${l} head ${h}: ${metricAt.describe(l, h)}. Click to open it`;
      knock.hidden = !reading;
      knock.setAttribute("aria-pressed", knocked);
      knock.title = `${knocked ? "bring back" : "knock out"} layer ${l} head ${h}`;
      knock.setAttribute("aria-label", knock.title);
    }
  }
}
