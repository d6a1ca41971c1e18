// The heads of the chosen layer. HeadToggles: which heads the token view draws, each in its own
// colour. HeadMetrics: the head metrics logged at the step shown (inspection/head_metrics.py,
// inspection/recall_probe.py, inspection/ablation.py), one row per head; a row's name opens that
// head in the matrix view.
import {headColour} from "./colours.js";
import {el, formatValue} from "./dom.js";

const swatch = (head, nHead) => el("i", {class: "swatch", style: `background:${headColour(head, nHead)}`});

export class HeadToggles {
  constructor(app) {
    this.app = app;
    this.layer = el("select", {"aria-label": "layer", onchange: () => app.set({layer: Number(this.layer.value)})});
    this.chips = el("span", {class: "chips"});
    this.root = el("div", {class: "head-toggles"}, el("label", {class: "inline"}, "layer ", this.layer),
      el("button", {onclick: () => app.set({shown: new Set(this.heads)})}, "all heads"),
      el("button", {onclick: () => app.set({shown: new Set()})}, "none"), this.chips);
  }

  setRun(run) {
    const [L, H] = run.shape;
    this.heads = Array.from({length: H}, (_, h) => h);
    this.layer.replaceChildren(...Array.from({length: L}, (_, l) => el("option", {value: l}, `${l}`)));
    this.chips.replaceChildren(...this.heads.map((head) => el("button", {class: "chip", "data-head": head,
      title: `draw head ${head} or not`, onclick: () => this.app.toggleHead(head)}, swatch(head, H), `h${head}`)));
  }

  draw({layer, shown}) {
    this.layer.value = layer;
    for (const chip of this.chips.children) chip.setAttribute("aria-pressed", shown.has(Number(chip.dataset.head)));
  }
}

// The metrics: the settings route's {name: [label, meaning]} (inspection/tab_format.py's TAB_METRICS).
export class HeadMetrics {
  constructor(app) {
    this.app = app;
    this.metrics = app.settings.metrics;
    this.title = el("h3", {});
    this.body = el("tbody");
    this.root = el("div", {class: "head-metrics"}, this.title, el("table", {},
      el("thead", {}, el("tr", {}, el("th", {}, "head"),
        ...Object.values(this.metrics).map(([label, meaning]) => el("th", {title: meaning}, label)))), this.body));
  }

  setRun(run) {
    const H = run.shape[1];
    this.rows = Array.from({length: H}, (_, head) => {
      const values = Object.keys(this.metrics).map(() => el("td", {class: "number"}));
      const name = el("button", {class: "head-name", title: "open in the matrix view", onclick: () => this.app.set({head})},
        swatch(head, H), `head ${head}`);
      return {row: el("tr", {}, el("td", {}, name), ...values), values};
    });
    this.body.replaceChildren(...this.rows.map(({row}) => row));
  }

  draw({layer, head, metricStep, metricAt}) {
    this.title.textContent = `Heads of layer ${layer} at step ${metricStep}`;
    this.rows.forEach(({row, values}, h) => {
      row.classList.toggle("selected", h === head);
      Object.keys(this.metrics).forEach((metric, i) => { values[i].textContent = formatValue(metricAt(metric, layer, h)); });
    });
  }
}
