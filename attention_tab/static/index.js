// The Attention tab: TensorBoard loads this module in the tab's frame and calls render().
// One state object (run, step, layer, head, drawn heads, the token pointed at) and the parts
// that draw it: the token view with its head toggles, the matrix view with the head metrics, the model view.
import {fetchMetrics, fetchRuns, RunWeights} from "./data.js";
import {el, formatValue} from "./dom.js";
import {HeadMetrics, HeadToggles, METRICS} from "./heads.js";
import {MatrixView} from "./matrix_view.js";
import {ModelView} from "./model_view.js";
import {TokenView} from "./token_view.js";

const RELOAD_SECONDS = 30;  // a run still training: new steps appear without reloading the page

class AttentionTab {
  constructor() {
    this.state = {layer: 0, head: 0, shown: new Set(), token: {side: "query", index: 0}, pinned: false};
    this.runSelect = el("select", {"aria-label": "run", onchange: () => this.openRun(this.runs[this.runSelect.value])});
    this.slider = el("input", {type: "range", min: 0, value: 0, "aria-label": "logged step",
      oninput: () => this.showStep(Number(this.slider.value))});
    this.stepLabel = el("output", {class: "step-label"});
    this.status = el("p", {class: "status", role: "status"});
    this.toggles = new HeadToggles(this);
    this.headMetrics = new HeadMetrics(this);
    this.tokens = new TokenView(this, this.toggles);
    this.matrix = new MatrixView(this, this.headMetrics);
    this.model = new ModelView(this, Object.fromEntries(Object.entries(METRICS).map(([name, [label]]) => [name, label])));
    document.body.append(
      el("header", {}, el("label", {class: "inline"}, "run ", this.runSelect),
        el("label", {class: "inline step"}, "step ", this.slider, this.stepLabel), this.status),
      el("main", {}, this.tokens.root, this.matrix.root, this.model.root));
  }

  async start() {
    await this.listRuns(await fetchRuns());
    setInterval(() => this.reload().catch((error) => this.say(error.message)), RELOAD_SECONDS * 1000);
  }

  async listRuns(runs) {
    const names = runs.map((run) => runs.some((other) => other !== run && other.run === run.run) ? `${run.run} · ${run.tag}` : run.run);
    // Rebuilt only when the runs change, so that a menu left open stays open.
    if (names.join("\n") !== [...this.runSelect.options].map((option) => option.text).join("\n")) {
      this.runSelect.replaceChildren(...names.map((name, i) => el("option", {value: i}, name)));
    }
    this.runs = runs;
    if (!runs.length) this.say("No run has attention data yet. Train one (make train); it shows up here within a minute.");
    else if (!this.run) await this.openRun(runs.at(-1));  // the newest, for runs named by date and time
    else this.runSelect.value = runs.findIndex((r) => r.run === this.run.run && r.tag === this.run.tag);
  }

  async openRun(run) {
    this.runSelect.value = this.runs.indexOf(run);
    this.run = run;
    this.weights = new RunWeights(run);
    this.metrics = await fetchMetrics(run);
    const [, H, T] = run.shape;
    Object.assign(this.state, {run, layer: 0, head: 0, shown: new Set(Array.from({length: H}, (_, h) => h)),
                               token: {side: "query", index: T - 1, reveal: true}, pinned: false});
    this.toggles.setRun(run);
    this.headMetrics.setRun(run);
    this.tokens.setRun(run);
    this.model.setRun(run, this.metrics);
    this.slider.max = run.steps.length - 1;
    await this.showStep(run.steps.length - 1);
    this.weights.prefetch().then((all) => { document.body.dataset.prefetched = all; })
      .catch((error) => this.say(error.message));
  }

  async showStep(index) {
    const step = this.run.steps[index];
    this.slider.value = index;
    this.stepLabel.textContent = `${step}  (${index + 1} of ${this.run.steps.length})`;
    const runWeights = this.weights;
    try {
      const weights = await runWeights.step(step);
      if (runWeights !== this.weights || this.run.steps[Number(this.slider.value)] !== step) return;  // moved on meanwhile
      Object.assign(this.state, {step, weights});
      this.redraw();
    } catch (error) {
      this.say(error.message);
    }
  }

  // New runs join the menu; new steps of the run shown join the slider, which follows them
  // if it was at the last one.
  async reload() {
    const runs = await fetchRuns();
    const fresh = this.run && runs.find((r) => r.run === this.run.run && r.tag === this.run.tag);
    await this.listRuns(runs);
    if (!fresh || fresh.steps.length === this.run.steps.length) return;
    const atEnd = Number(this.slider.value) === this.run.steps.length - 1;
    this.run.steps = fresh.steps;
    this.metrics = await fetchMetrics(this.run);
    this.slider.max = fresh.steps.length - 1;
    await this.showStep(atEnd ? fresh.steps.length - 1 : Number(this.slider.value));
  }

  set(changes) {
    Object.assign(this.state, changes);
    this.redraw();
  }

  point(token) {
    if (!this.state.pinned) this.set({token});
  }

  pin(token) {
    this.set(token ? {token, pinned: true} : {pinned: false});
  }

  toggleHead(head) {
    const shown = new Set(this.state.shown);
    if (shown.has(head)) shown.delete(head); else shown.add(head);
    this.set({shown});
  }

  redraw() {
    if (!this.state.weights) return;
    const state = {...this.state, metricAt: this.metricAt()};
    for (const part of [this.toggles, this.headMetrics, this.tokens, this.matrix, this.model]) part.draw(state);
    Object.assign(document.body.dataset, {drawnRun: this.run.run, drawnStep: state.step});
    document.body.dataset.firstDrawnAt ??= performance.timeOrigin + performance.now();
    this.say("");
  }

  // (metric, layer, head) -> the value logged at the step shown, or null.
  metricAt() {
    const {step} = this.state;
    const at = (metric, layer, head) => {
      const series = this.metrics[metric];
      const i = series ? series.steps.indexOf(step) : -1;
      return i < 0 ? null : series.values[i][layer]?.[head] ?? null;
    };
    at.describe = (layer, head) => Object.entries(METRICS)
      .map(([metric, [label]]) => `${label} ${formatValue(at(metric, layer, head))}`).join(" · ");
    return at;
  }

  say(message) {
    this.status.textContent = message;
  }
}

export async function render() {
  document.head.append(el("link", {rel: "stylesheet", href: new URL("./style.css", import.meta.url)}));
  document.title = "Attention";
  await new AttentionTab().start();
}
