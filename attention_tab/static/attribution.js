// Direct logit attribution at the pinned query: the logit of the token that came next (or of a
// token typed, less another's) split into one share per head, MLP and embedding, as the final
// norm passes each part on to the LM head; beside it, what knocking out each head alone costs
// that logit, through every path (a head that only feeds later heads shows there, not in its share).
import {divergingColour} from "./colours.js";
import {readingFields} from "./data.js";
import {el, formatValue} from "./dom.js";
import {MAX_TEXT_COLUMNS, quote, valueGrid} from "./grid.js";
import {answeredBy, Tool} from "./tools.js";

export class Attribution extends Tool {
  constructor(app) {
    super(app, "attribution");
    this.title = el("h2", {}, "Direct logit attribution");
    const onEnter = (event) => { if (event.key === "Enter") this.score(); };
    this.token = el("input", {type: "text", class: "token-field", "aria-label": "token to score",
      placeholder: "came next", title: "empty: the token that came next", onkeydown: onEnter});
    this.other = el("input", {type: "text", class: "token-field", "aria-label": "score against token",
      placeholder: "none", title: "empty: the logit itself, not a difference", onkeydown: onEnter});
    this.typed = {token: "", other: ""};
    this.hint = el("p", {class: "hint"});
    this.summary = el("p", {class: "tool-summary"});
    this.grids = el("div", {class: "tool-grids"});
    this.parts = el("p", {class: "tool-parts"});
    this.root = el("section", {class: "panel tool attribution", "aria-label": "Direct logit attribution", hidden: true},
      this.title,
      el("div", {class: "tool-form"}, el("label", {class: "inline"}, "logit of ", this.token),
        el("label", {class: "inline"}, "against ", this.other),
        el("button", {class: "read", onclick: () => this.score()}, "score")),
      el("p", {class: "hint"}, "Type a token, the space before a word included (“ Lily”); against another: the difference of the two logits."),
      this.hint, this.error, this.summary, this.grids, this.parts);
  }

  score() {
    this.typed = {token: this.token.value, other: this.other.value};
    this.app.redraw();
  }

  draw({reading, source, token, pinned}) {
    this.followRun();
    this.title.textContent = `Direct logit attribution · ${answeredBy(this.answer, source)}`;
    const position = pinned && token.side === "query" ? token.index : null;
    this.hint.textContent = !reading ? "It reads your text or the repeated tokens: show one of them above."
      : position === null ? "Pin a query (click a token on the left, or a cell of the logit lens): its logit splits "
        + "into one share per head, MLP and embedding." : "";
    const shown = reading && position !== null;
    for (const part of [this.summary, this.grids, this.parts]) part.hidden = !shown || !this.answer;
    if (!shown) return;
    const fields = {...readingFields(reading), position, token: this.typed.token, other: this.typed.other};
    this.ask(JSON.stringify([this.app.run.run, reading.askedStep, reading.checkpoint, reading.step, fields]),
             reading.askedStep, fields);
    if (this.answer && this.drawn !== this.answer) this.drawAnswer(this.answer);
  }

  drawAnswer(answer) {
    this.drawn = answer;
    const {labels, position, token, other, logit, heads, mlp, parts, knock_out: knockOut} = answer;
    const what = other ? `${quote(token.label)} − ${quote(other.label)}` : quote(token.label);
    this.summary.textContent = `after ${quote(labels[position])} (token ${position}): the logit of ${what} is `
      + `${formatValue(logit, 2)}; the shares below add up to it.`;
    Object.assign(this.summary.dataset, {position, logit: logit ?? ""});
    const scale = Math.max(1e-6, ...[heads, knockOut].flat(2).concat(mlp, parts.map(([, share]) => share))
      .filter((v) => v !== null).map(Math.abs));
    const H = heads[0].length, text = H + 1 <= MAX_TEXT_COLUMNS;
    const columns = [...heads[0].map((_, h) => `h${h}`)];
    const rows = heads.map((_, l) => `L${l}`);
    const colour = (value) => divergingColour(value, scale);
    const open = (layer, head) => this.app.set({layer, head, shown: new Set([head])});
    this.grids.replaceChildren(
      el("div", {}, el("h3", {title: "what each head (and MLP) writes straight into the logit, through the final norm"},
        "each part's share"),
      valueGrid({className: "shares", rows, columns: [...columns, "MLP"], values: heads.map((row, l) => [...row, mlp[l]]),
        colour, text, onclick: (l, h) => h < H && open(l, h),
        cellData: (l, h) => (h < H ? {"data-layer": l, "data-head": h} : {"data-layer": l, "data-part": "mlp"}),
        describe: (l, h, v) => `${h < H ? `layer ${l} head ${h}` : `layer ${l}'s MLP`}: share ${formatValue(v, 4)} of the logit`})),
      el("div", {}, el("h3", {title: "the logit intact, less the logit with that head's output zeroed"}, "knocked out alone: it falls by"),
        valueGrid({className: "knock-out", rows, columns, values: knockOut, colour, text, onclick: open,
          cellData: (l, h) => ({"data-layer": l, "data-head": h}),
          describe: (l, h, v) => `without layer ${l} head ${h} the logit falls by ${formatValue(v, 4)}`})));
    this.parts.replaceChildren("and ", ...parts.flatMap(([label, share], i) => [i ? " · " : "",
      el("span", {"data-part": label, "data-value": share ?? "", title: `${label}: share ${formatValue(share, 4)}`},
        `${label} ${formatValue(share, 2)}`)]));
  }
}
