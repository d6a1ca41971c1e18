// The heads of the chosen layer. HeadToggles: which heads the token view draws, each in its own
// colour. HeadMetrics: the head metrics logged at the step shown (inspection/head_metrics.py,
// inspection/recall_probe.py, inspection/ablation.py), one row per head; a row's name opens that
// head in the matrix view.
import {headColour} from "./colours.js";
import {el, formatValue} from "./dom.js";

export const METRICS = {
  entropy: ["entropy", "how spread out a query's weights are, in nats (0: all on one key)"],
  distance: ["distance", "how many tokens back the weight lies, on average"],
  previous_token: ["prev-token", "weight on the token just before"],
  induction: ["induction", "on a random sequence seen twice: weight on the token after the earlier copy"],
  recall: ["recall", "weight on the earlier mention of a name or item that comes back (stories)"],
  ablation: ["without it: name recall", "the recall probe's name recall with this head knocked out alone (with every head: recall/accuracy_name)"],
};

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

export class HeadMetrics {
  constructor(app) {
    this.app = app;
    this.title = el("h3", {});
    this.body = el("tbody");
    this.root = el("div", {class: "head-metrics"}, this.title, el("table", {},
      el("thead", {}, el("tr", {}, el("th", {}, "head"),
        ...Object.values(METRICS).map(([label, meaning]) => el("th", {title: meaning}, label)))), this.body));
  }

  setRun(run) {
    const H = run.shape[1];
    this.rows = Array.from({length: H}, (_, head) => {
      const values = Object.keys(METRICS).map(() => el("td", {class: "number"}));
      const name = el("button", {class: "head-name", title: "open in the matrix view", onclick: () => this.app.set({head})},
        swatch(head, H), `head ${head}`);
      return {row: el("tr", {}, el("td", {}, name), ...values), values};
    });
    this.body.replaceChildren(...this.rows.map(({row}) => row));
  }

  draw({layer, head, step, metricAt}) {
    this.title.textContent = `Heads of layer ${layer} at step ${step}`;
    this.rows.forEach(({row, values}, h) => {
      row.classList.toggle("selected", h === head);
      Object.keys(METRICS).forEach((metric, i) => { values[i].textContent = formatValue(metricAt(metric, layer, h)); });
    });
  }
}
