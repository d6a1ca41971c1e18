// The Attention tab: TensorBoard loads this module in the tab's frame and calls render().
// One state object (run, step, layer, head, drawn heads, the token pointed at, which source the
// views show: the probe, your text or repeated random tokens, and the model's reading of each;
// the checkpoint that reads them, the tool shown) and the parts that draw it: the sources, the
// token view with its head toggles and next tokens, the matrix view with the head metrics, and a
// column of the model view (with the repeated tokens' loss and scores) or one of the three tools.
import {Attribution} from "./attribution.js";
import {useColours} from "./colours.js";
import {fetchMetrics, fetchRuns, fetchSettings, readRepeated, readText, RunWeights} from "./data.js";
import {el, formatValue} from "./dom.js";
import {HeadMetrics, HeadToggles} from "./heads.js";
import {Lens} from "./lens.js";
import {MatrixView} from "./matrix_view.js";
import {ModelView} from "./model_view.js";
import {NextTokens} from "./next_tokens.js";
import {Patching} from "./patching.js";
import {RepeatedTokens} from "./repeated.js";
import {TextBox} from "./text_box.js";
import {TokenView} from "./token_view.js";
import {SidePanel} from "./tools.js";

const RELOAD_SECONDS = 30;  // a run still training: new steps appear without reloading the page

class AttentionTab {
  // settings: the settings route's answer (attention_tab/page_settings.py), which every part reads.
  constructor(settings) {
    this.settings = settings;
    this.state = {layer: 0, head: 0, shown: new Set(), token: {side: "query", index: 0}, pinned: false,
                  mode: "probe", readings: {text: null, repeated: null}, checkpoint: null, tool: "model"};
    this.reads = 0;  // readings asked for so far: an answer to an older one is dropped
    this.runSelect = el("select", {"aria-label": "run", onchange: () => this.openRun(this.runs[this.runSelect.value])});
    this.slider = el("input", {type: "range", min: 0, value: 0, "aria-label": "logged step",
      oninput: () => this.moveSlider(Number(this.slider.value))});
    this.sliderOver = "steps";  // or "checkpoints"
    this.stepsAsked = 0;  // probe steps asked for so far: an older one arriving late is dropped
    this.stepLabel = el("output", {class: "step-label"});
    this.status = el("p", {class: "status", role: "status"});
    this.toggles = new HeadToggles(this);
    this.headMetrics = new HeadMetrics(this);
    this.textBox = new TextBox(this);
    this.tokens = new TokenView(this, this.toggles, new NextTokens());
    this.matrix = new MatrixView(this, this.headMetrics);
    this.model = new ModelView(this, Object.fromEntries(Object.entries(settings.metrics).map(([name, [label]]) => [name, label])),
                               new RepeatedTokens(this));
    this.side = new SidePanel(this, {model: ["model view", this.model], lens: ["logit lens", new Lens(this)],
                                     attribution: ["attribution", new Attribution(this)], patching: ["patching", new Patching(this)]});
    this.sliderName = el("span", {}, "step");
    document.body.append(
      el("header", {}, el("div", {class: "header-row"}, el("label", {class: "inline"}, "run ", this.runSelect),
        el("label", {class: "inline step"}, this.sliderName, " ", this.slider, this.stepLabel), this.status),
        this.textBox.root, this.textBox.error),
      el("main", {}, this.tokens.root, this.matrix.root, this.side.root));
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
    // The newest run that trained (the server says which: model_io/run_files.py's is_trained), else
    // the newest; newest by name, for runs named by date and time.
    else if (!this.run) await this.openRun(runs.findLast((run) => run.trained) ?? runs.at(-1));
    else this.runSelect.value = runs.findIndex((r) => r.run === this.run.run && r.tag === this.run.tag);
  }

  async openRun(run) {
    this.runSelect.value = this.runs.indexOf(run);
    this.run = run;
    this.weights = new RunWeights(run);
    this.metrics = await fetchMetrics(run);
    const [, H, T] = run.shape;
    this.reads++;  // an answer still on its way was for the run before
    this.textBox.busy("text", false);
    this.textBox.busy("repeated", false);
    this.textBox.say("");
    this.textBox.setRepeated(null);
    Object.assign(this.state, {run, layer: 0, head: 0, shown: new Set(Array.from({length: H}, (_, h) => h)),
                               token: {side: "query", index: T - 1, reveal: true}, pinned: false, mode: "probe",
                               readings: {text: null, repeated: null}, checkpoint: null});
    this.toggles.setRun(run);
    this.headMetrics.setRun(run);
    this.model.setRun(run, this.metrics);
    this.sliderOver = "steps";
    this.sliderName.textContent = "step";
    this.slider.setAttribute("aria-label", "logged step");
    this.slider.max = run.steps.length - 1;
    await this.showStep(run.steps.length - 1);
    this.weights.prefetch().then((all) => { document.body.dataset.prefetched = all; })
      .catch((error) => this.say(error.message));
  }

  async showStep(index) {
    const step = this.run.steps[index];
    const asked = ++this.stepsAsked;
    if (this.sliderOver === "steps") {  // else the slider is over the checkpoints, and stays
      this.slider.value = index;
      this.stepLabel.textContent = `${step}  (${index + 1} of ${this.run.steps.length})`;
    }
    const runWeights = this.weights;
    try {
      const weights = await runWeights.step(step);
      if (runWeights !== this.weights || asked !== this.stepsAsked) return;  // moved on meanwhile
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
    if (fresh && String(fresh.kept) !== String(this.run.kept)) {
      this.run.kept = fresh.kept;  // a checkpoint kept since: the slider over checkpoints grows
      this.drawSlider();
    }
    if (!fresh || fresh.steps.length === this.run.steps.length) return;
    const shown = this.run.steps.indexOf(this.state.step);
    const atEnd = shown === this.run.steps.length - 1;
    this.run.steps = fresh.steps;
    this.metrics = await fetchMetrics(this.run);
    if (this.sliderOver === "steps") this.slider.max = fresh.steps.length - 1;
    await this.showStep(atEnd ? fresh.steps.length - 1 : shown);
  }

  // While the run's model reads (your text, the repeated tokens) and the run kept checkpoints along
  // the way (train.keep_checkpoints), the slider moves over them and then over the run's best
  // (else last) checkpoint, null; else over the probe's logged steps.
  checkpointStops() {
    return this.state.mode !== "probe" && this.run.kept?.length ? [...this.run.kept, null] : null;
  }

  moveSlider(index) {
    const stops = this.checkpointStops();
    if (!stops) {
      this.state.mode = "probe";
      return this.showStep(index);
    }
    this.state.checkpoint = stops[index];
    this.drawSlider();
    this.readAgain();  // the text or the tokens shown, by that checkpoint; the views and the tools follow
  }

  // The slider and its label: the header says which checkpoint answered the reading shown.
  drawSlider() {
    const stops = this.checkpointStops();
    if (stops) {
      const found = stops.indexOf(this.state.checkpoint);
      const reading = this.state.readings[this.state.mode];
      Object.assign(this.slider, {max: stops.length - 1, value: found < 0 ? stops.length - 1 : found});
      this.slider.setAttribute("aria-label", "checkpoint");
      this.sliderName.textContent = "checkpoint";
      this.stepLabel.textContent = `${reading ? `${reading.checkpoint}, step ${reading.step}` : "…"}  (${Number(this.slider.value) + 1} of ${stops.length})`;
      this.sliderOver = "checkpoints";
    } else if (this.sliderOver === "checkpoints") {
      const index = Math.max(0, this.run.steps.indexOf(this.state.step));
      Object.assign(this.slider, {max: this.run.steps.length - 1, value: index});
      this.slider.setAttribute("aria-label", "logged step");
      this.sliderName.textContent = "step";
      this.stepLabel.textContent = `${this.run.steps[index]}  (${index + 1} of ${this.run.steps.length})`;
      this.sliderOver = "steps";
    }
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

  // The run's model reads your text, or the repeated tokens, with the heads knocked out so far
  // on that source; the views then show it.
  readText(text, knockedOut = this.state.readings.text?.knocked_out ?? []) {
    const {checkpoint} = this.state;
    return this.read("text", () => readText(this.run, text, knockedOut, checkpoint));
  }

  readRepeated(n, seed, knockedOut = this.state.readings.repeated?.knocked_out ?? []) {
    const {checkpoint} = this.state;
    return this.read("repeated", () => readRepeated(this.run, n, seed, knockedOut, checkpoint));
  }

  // The source shown, read again (by the checkpoint now chosen).
  readAgain() {
    const reading = this.state.readings[this.state.mode];
    if (reading?.source === "text") this.readText(reading.text, reading.knocked_out);
    else if (reading) this.readRepeated(reading.n, reading.seed, reading.knocked_out);
  }

  async read(source, request) {
    const read = ++this.reads;
    this.textBox.busy(source, true);
    try {
      const reading = await request();
      if (read !== this.reads) return;  // another reading, or another run, since
      const T = reading.labels.length;
      const token = this.state.mode === source ? {...this.state.token, index: Math.min(this.state.token.index, T - 1)}
        : {side: "query", index: T - 1, reveal: true};
      this.textBox.say("");
      if (source === "repeated") this.textBox.setRepeated(reading);
      this.set({mode: source, readings: {...this.state.readings, [source]: reading}, token});
    } catch (error) {
      if (read !== this.reads) return;
      this.textBox.say(error.message);
      this.redraw();  // the views, and the source chosen, stay as they were
    } finally {
      if (read === this.reads) this.textBox.busy(source, false);
    }
  }

  // Knocks a head out of the source shown, or brings it back: the model reads it again.
  toggleKnockedOut(layer, head) {
    const reading = this.state.readings[this.state.mode];
    const out = reading.knocked_out;
    const others = out.filter(([l, h]) => l !== layer || h !== head);
    const knockedOut = others.length < out.length ? others : [...out, [layer, head]];
    if (reading.source === "text") this.readText(reading.text, knockedOut);
    else this.readRepeated(reading.n, reading.seed, knockedOut);
  }

  showMode(mode) {
    this.textBox.say("");  // a refusal of what was typed goes with the source it was typed for
    if (mode === "repeated" && !this.state.readings.repeated) return this.textBox.submitRepeated();  // read them first
    this.set({mode: mode !== "probe" && this.state.readings[mode] ? mode : "probe"});
    const reading = this.state.readings[this.state.mode];
    if (reading && (reading.askedStep ?? null) !== this.state.checkpoint) this.readAgain();  // read by another checkpoint
  }

  toggleHead(head) {
    const shown = new Set(this.state.shown);
    if (shown.has(head)) shown.delete(head); else shown.add(head);
    this.set({shown});
  }

  // What the views show: the probe's weights at the step, or your text's.
  redraw() {
    if (!this.state.weights) return;
    const reading = this.state.mode === "probe" ? null : this.state.readings[this.state.mode];
    const shown = reading ? {weights: reading.weights, labels: reading.labels} : {weights: this.state.weights, labels: this.run.labels};
    this.state.token.index = Math.min(this.state.token.index, shown.labels.length - 1);
    const source = {text: "your text", repeated: "repeated tokens"}[reading?.source] ?? null;
    // The head metrics of the step the maps are from: the checkpoint's that read the text, else the slider's.
    const metricStep = reading ? reading.step : this.state.step;
    const state = {...this.state, ...shown, reading, source, metricStep, metricAt: this.metricAt(metricStep)};
    for (const part of [this.textBox, this.toggles, this.headMetrics, this.tokens, this.matrix, this.side]) part.draw(state);
    this.drawSlider();
    Object.assign(document.body.dataset, {drawnRun: this.run.run, drawnStep: state.step, drawnMode: this.state.mode,
      drawnTokens: shown.labels.length, drawnCheckpoint: reading?.checkpoint ?? "", drawnCheckpointStep: reading?.step ?? "",
      drawnKnockedOut: reading ? reading.knocked_out.map(([l, h]) => `${l}:${h}`).join(" ") : ""});
    document.body.dataset.firstDrawnAt ??= performance.timeOrigin + performance.now();
    this.say("");
  }

  // (metric, layer, head) -> the value logged at step, or null.
  metricAt(step) {
    const at = (metric, layer, head) => {
      const series = this.metrics[metric];
      const i = series ? series.steps.indexOf(step) : -1;
      return i < 0 ? null : series.values[i][layer]?.[head] ?? null;
    };
    at.describe = (layer, head) => Object.entries(this.settings.metrics)
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
  const settings = await fetchSettings();
  useColours(settings);
  document.documentElement.style.setProperty("--row", `${settings.token_row_px}px`);  // style.css's token rows
  await new AttentionTab(settings).start();
}
