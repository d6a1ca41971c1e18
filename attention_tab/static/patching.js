// Activation patching on two prompts of the same length: the corrupted one run again with one
// activation taken from the clean run, and the share of the metric (a logit difference at the
// last token) that comes back: 0 nothing, 1 all. A layers x heads grid (each head's output, at
// every position) and a layers x positions grid (the residual stream entering a layer, at one position).
// The boxes start with the run's name-swap example (the patch_example route), in words its tokenizer reads.
import {divergingColour} from "./colours.js";
import {askTool} from "./data.js";
import {el, formatValue} from "./dom.js";
import {MAX_TEXT_COLUMNS, quote, valueGrid} from "./grid.js";
import {answeredBy, Tool} from "./tools.js";


export class Patching extends Tool {
  constructor(app) {
    super(app, "patch");
    this.title = el("h2", {}, "Activation patching");
    const onEnter = (event) => { if (event.key === "Enter") this.patch(); };
    const input = (label, cls, placeholder) => el("input", {type: "text", class: cls, "aria-label": label, placeholder, onkeydown: onEnter});
    this.fields = {clean: input("clean prompt", "prompt", "a prompt whose next token is the answer"),
                   corrupted: input("corrupted prompt", "prompt", "the same, changed so that the answer changes"),
                   token: input("metric token", "token-field", "answer"), other: input("metric against token", "token-field", "other")};
    this.submitted = null;  // the fields of the last patch asked for
    this.example = null;  // the run's example, and the run's name it is for
    this.exampleFor = null;
    this.exampleNote = el("p", {class: "hint"});
    this.summary = el("p", {class: "tool-summary"});
    this.caution = el("p", {class: "hint caution", hidden: true});  // the metric barely moves: the shares say little
    this.grids = el("div", {class: "tool-grids stacked"});
    this.root = el("section", {class: "panel tool patching", "aria-label": "Activation patching", hidden: true},
      this.title,
      el("div", {class: "tool-form prompts"},
        el("label", {}, "clean ", this.fields.clean), el("label", {}, "corrupted ", this.fields.corrupted)),
      el("div", {class: "tool-form"}, el("label", {class: "inline"}, "logit of ", this.fields.token),
        el("label", {class: "inline"}, "against ", this.fields.other),
        el("button", {class: "read", onclick: () => this.patch()}, "patch")),
      el("p", {class: "hint"}, "Two prompts of as many tokens, the corrupted one changing the answer; the metric is the "
        + "logit difference at the last token. Each cell: the share of clean − corrupted that one activation, taken from "
        + "the clean run, brings back (0 nothing, 1 all)."),
      this.exampleNote, this.error, this.summary, this.caution, this.grids);
  }

  // The run's example into the boxes the user left empty or as the last example had them.
  async askExample() {
    const run = this.app.run;
    this.exampleFor = run.run;
    let example = null;
    try {
      example = await askTool("patch_example", run, null, {});
      this.exampleNote.textContent = example.why ? `No example for this run: ${example.why}` : "";
    } catch (error) {
      this.exampleNote.textContent = `No example for this run: ${error.message}`;
    }
    if (this.app.run !== run) return;
    const usable = example && !example.why ? example : null;  // none: the last run's example leaves the boxes too
    for (const [name, input] of Object.entries(this.fields)) {
      if (input.value === "" || input.value === this.example?.[name]) input.value = usable?.[name] ?? "";
    }
    this.example = usable;
  }

  patch() {
    this.submitted = Object.fromEntries(Object.entries(this.fields).map(([name, input]) => [name, input.value]));
    this.forget();  // the same prompts again: patch again (the run may have saved a new checkpoint)
    this.app.redraw();
  }

  // Asks at the checkpoint the slider is at (null: the run's best, else last), and again when it moves;
  // on the probe the slider is over logged steps, no checkpoint: the run's best, else last.
  draw({mode, checkpoint: chosen}) {
    const checkpoint = mode === "probe" ? null : chosen;
    if (this.run !== this.app.run) this.submitted = null;  // another run: no patch until asked for there
    this.followRun();
    if (this.exampleFor !== this.app.run.run) this.askExample();
    this.title.textContent = `Activation patching${this.answer ? ` · ${answeredBy(this.answer)}` : ""}`;
    this.summary.hidden = this.grids.hidden = !this.answer;
    this.caution.hidden = !this.answer?.caution;
    if (!this.submitted) return;
    this.ask(JSON.stringify([this.app.run.run, checkpoint, this.submitted]), checkpoint, this.submitted);
    if (this.answer && this.drawn !== this.answer) this.drawAnswer(this.answer);
  }

  drawAnswer(answer) {
    this.drawn = answer;
    const {labels, token, other, clean, corrupted, heads, residual} = answer;
    const metric = other ? `${quote(token.label)} − ${quote(other.label)}` : quote(token.label);
    this.summary.textContent = `logit of ${metric} at the last token: clean ${formatValue(clean, 2)}, `
      + `corrupted ${formatValue(corrupted, 2)}`;
    Object.assign(this.summary.dataset, {clean: clean ?? "", corrupted: corrupted ?? ""});
    this.caution.textContent = answer.caution ?? "";
    const colour = (value) => divergingColour(value, 1);
    const rows = heads.map((_, l) => `L${l}`);
    const T = labels.clean.length;
    const differs = (t) => labels.clean[t] !== labels.corrupted[t];
    const at = (t) => (differs(t) ? `${quote(labels.clean[t])} (corrupted ${quote(labels.corrupted[t])})` : quote(labels.clean[t]));
    this.grids.replaceChildren(
      el("div", {}, el("h3", {}, "each head's output, at every position"),
        valueGrid({className: "patch-heads", rows, columns: heads[0].map((_, h) => `h${h}`), values: heads, colour,
          text: heads[0].length <= MAX_TEXT_COLUMNS, cellData: (l, h) => ({"data-layer": l, "data-head": h}),
          onclick: (layer, head) => this.app.set({layer, head, shown: new Set([head])}),
          describe: (l, h, v) => `layer ${l} head ${h}: restores ${formatValue(v, 4)}`})),
      el("div", {}, el("h3", {}, "the residual stream entering each layer, at one position"),
        valueGrid({className: "patch-residual", rows, values: residual, colour, text: T <= MAX_TEXT_COLUMNS,
          columns: labels.clean.map((label, t) => el("span", {class: `vertical${differs(t) ? " differs" : ""}`, title: at(t)}, label)),
          cellData: (l, t) => ({"data-layer": l, "data-position": t}),
          describe: (l, t, v) => `entering layer ${l}, token ${t} ${at(t)}: restores ${formatValue(v, 4)}`})));
  }
}
