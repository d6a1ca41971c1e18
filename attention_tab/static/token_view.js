// Token view: the probe's tokens (or your text's) in two columns, queries on the left and keys on
// the right. Pointing at a query draws its attention to the earlier tokens, one colour per head
// and the line as strong as the weight; pointing at a key draws the later queries that look at
// it. A dot beside a token marks it as the top weight of that head's row (or column). Click pins
// the token; the arrow keys move between tokens and columns. On your text, each query also shows
// the loss of the token that came after it, and the next-token box its top 5 guesses.
import {headColour} from "./colours.js";
import {el, formatChange, formatValue} from "./dom.js";

export class TokenView {
  constructor(app, toggles, nextTokens) {
    this.app = app;
    // px per token, and the lightest weight drawn as a line (attention_tab/page_settings.py)
    [this.row, this.minWeight] = [app.settings.token_row_px, app.settings.min_line_weight];
    this.title = el("h2", {}, "Token view");
    this.columns = {query: el("div", {class: "tokens queries", role: "listbox", "aria-label": "queries"}),
                    key: el("div", {class: "tokens keys", role: "listbox", "aria-label": "keys"})};
    this.lines = el("svg", {class: "lines", "aria-hidden": "true"});
    this.nextTokens = nextTokens;
    this.root = el("section", {class: "panel token-view", "aria-label": "Token view"},
      this.title, toggles.root,
      el("p", {class: "hint"}, "Point at a query (left) to see the earlier tokens it looks at, or at a key (right) to see "
        + "which later tokens look at it. Click pins it; arrow keys move."), nextTokens.root,
      el("div", {class: "token-scroll"}, el("div", {class: "column-heads"}, this.queriesHead = el("span", {}, "queries"), el("span", {}, "keys")),
        el("div", {class: "token-columns"}, this.columns.query, this.lines, this.columns.key)));
  }

  setTokens(labels) {
    this.labels = labels;
    const T = labels.length;
    for (const side of ["query", "key"]) {
      this.columns[side].replaceChildren(...labels.map((label, index) => el("button", {
        class: "token", "data-index": index, "data-side": side, tabindex: -1, role: "option",
        title: `${side} ${index}`, onmouseenter: () => this.app.point({side, index}),
        onfocus: () => this.app.point({side, index}), onclick: () => this.app.pin({side, index}),
        onkeydown: (event) => this.move(event, side, index, T),
      }, side === "query" ? el("span", {class: "loss"}) : [], el("span", {class: "label"}, label), el("span", {class: "dots"}))));
    }
    this.lines.setAttribute("height", T * this.row);
  }

  move(event, side, index, T) {
    const steps = {ArrowUp: [side, index - 1], ArrowDown: [side, index + 1],
                   ArrowLeft: ["query", index], ArrowRight: ["key", index], Home: [side, 0], End: [side, T - 1]};
    if (event.key === "Escape") return this.app.pin(null);
    if (!(event.key in steps)) return;
    event.preventDefault();
    const [nextSide, next] = steps[event.key];
    const target = Math.max(0, Math.min(T - 1, next));
    if (this.app.state.pinned) this.app.pin({side: nextSide, index: target});  // a pinned token moves, pinned
    this.columns[nextSide].children[target]?.focus();
  }

  draw({weights, labels, reading, source, layer, shown, token, pinned}) {
    if (labels !== this.labels) this.setTokens(labels);
    this.title.textContent = `Token view · layer ${layer}${source ? ` · ${source}` : ""}`;
    this.nextTokens.draw(reading, token.index);
    this.drawLosses(reading);
    const {nHead, T} = weights;
    const width = this.lines.getBoundingClientRect().width || 160;
    const others = token.side === "query" ? "key" : "query";
    const lines = [];
    const tops = new Map();  // index on the other side -> heads whose top weight it is
    for (const head of shown) {
      let top = -1, topWeight = -1;
      const range = token.side === "query" ? [0, token.index] : [token.index, T - 1];
      for (let other = range[0]; other <= range[1]; other++) {
        const [query, key] = token.side === "query" ? [token.index, other] : [other, token.index];
        const weight = weights.at(layer, head, query, key);
        if (weight > topWeight) [top, topWeight] = [other, weight];
        if (weight >= this.minWeight) lines.push(line(query, key, weight, headColour(head, nHead), width, head, this.row));
      }
      if (top >= 0) tops.set(top, [...(tops.get(top) ?? []), head]);
    }
    this.lines.replaceChildren(...lines);
    for (const side of ["query", "key"]) {
      for (const button of this.columns[side].children) {
        const index = Number(button.dataset.index);
        const active = side === token.side && index === token.index;
        const heads = side === others ? tops.get(index) ?? [] : [];
        button.classList.toggle("active", active);
        button.classList.toggle("pinned", active && pinned);
        button.classList.toggle("top", heads.length > 0);
        button.tabIndex = active ? 0 : -1;
        button.setAttribute("aria-selected", active);
        button.dataset.topHeads = heads.join(" ");
        if (active && token.reveal) this.reveal(button, token);
        button.lastChild.replaceChildren(...heads.map((head) => el("i", {style: `background:${headColour(head, nHead)}`})));
      }
    }
  }

  // Beside each query of your text: the loss of the token after it (with heads knocked out, the
  // change from the intact model's).
  drawLosses(reading) {
    this.queriesHead.textContent = !reading ? "queries"
      : reading.intact ? "Δ loss vs intact · queries" : "next-token loss · queries";
    for (const button of this.columns.query.children) {
      const index = Number(button.dataset.index), span = button.firstChild;
      const loss = reading?.next.loss[index], intactLoss = reading?.intact?.loss[index];
      span.className = "loss";
      span.textContent = span.title = "";
      if (loss === undefined) continue;  // the probe, or the text's last token
      span.title = `loss of the next token “${this.labels[index + 1]}”`;
      if (intactLoss === undefined) {
        span.textContent = formatValue(loss, 2);
        continue;
      }
      const change = loss - intactLoss;
      span.textContent = formatChange(change);
      if (Number(formatValue(Math.abs(change), 2)) > 0) span.classList.add(change > 0 ? "worse" : "better");
      span.title += `: ${formatValue(loss, 2)}, intact ${formatValue(intactLoss, 2)}`;
    }
  }

  // Scrolls a token chosen elsewhere (the matrix view, a new run) into the middle of the list, once.
  reveal(button, token) {
    const scroller = this.root.querySelector(".token-scroll");
    scroller.scrollTop += button.getBoundingClientRect().top - scroller.getBoundingClientRect().top - scroller.clientHeight / 2;
    token.reveal = false;
  }
}

function line(query, key, weight, colour, width, head, row) {
  return el("line", {x1: 0, y1: (query + 0.5) * row, x2: width, y2: (key + 0.5) * row, stroke: colour,
                     "stroke-width": 0.5 + 4 * weight, "stroke-opacity": Math.min(1, 0.15 + weight),
                     "data-query": query, "data-key": key, "data-head": head, "data-weight": weight});
}
