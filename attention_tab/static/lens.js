// The logit lens on the tokens the views show: what the model would predict if it stopped after
// each layer. For the query pointed at (or pinned), each layer's rank and probability of the
// token that really came next and its top 5; over all queries, a layers x positions picture of
// that token's log-probability. A click on the picture pins that query.
import {viridis} from "./colours.js";
import {readingFields} from "./data.js";
import {el, formatValue} from "./dom.js";
import {quote} from "./grid.js";
import {answeredBy, Tool} from "./tools.js";

const WIDTH = 360;  // px for the picture's cells
const CELL_HEIGHT = 14;

export class Lens extends Tool {
  constructor(app) {
    super(app, "lens");
    this.title = el("h2", {}, "Logit lens");
    this.hint = el("p", {class: "hint"});
    this.query = el("p", {class: "lens-query"});
    this.table = el("table", {class: "lens-table"});
    this.pictureTitle = el("h3", {});
    this.picture = el("div", {class: "lens-picture", onclick: (event) => this.pin(event)});
    this.column = el("div", {class: "lens-column", "aria-hidden": "true"});
    this.scale = el("p", {class: "hint"});
    this.body = el("div", {}, this.query, this.table, this.pictureTitle,
      el("div", {class: "lens-frame"}, this.picture, this.column), this.scale);
    this.root = el("section", {class: "panel tool lens", "aria-label": "Logit lens", hidden: true},
      this.title, this.hint, this.error, this.body);
  }

  draw({reading, source, token}) {
    this.followRun();
    this.title.textContent = `Logit lens · ${answeredBy(this.answer, source)}`;
    if (!reading) {
      this.hint.textContent = "The lens reads your text or the repeated tokens: show one of them above.";
      this.body.hidden = true;
      return;
    }
    const fields = readingFields(reading);
    this.ask(JSON.stringify([this.app.run.run, reading.askedStep, reading.checkpoint, reading.step, fields]),
             reading.askedStep, fields);
    this.hint.textContent = "What the model would predict if it stopped after each layer: the stream through the "
      + "final norm and the LM head. After the last layer it is the model's own answer.";
    this.body.hidden = !this.answer;
    if (!this.answer) return;
    if (this.drawn !== this.answer) this.drawPicture(this.answer);
    this.drawQuery(this.answer, Math.min(token.index, this.answer.labels.length - 1));
  }

  // The table for one query: each layer's rank and p of the token that came next, and its top k (the server's TOP_K).
  drawQuery({labels, next_log_prob: logProbs, next_rank: ranks, top}, index) {
    const last = index === labels.length - 1;
    this.query.textContent = `after ${quote(labels[index])} (token ${index})`
      + (last ? ": the text ends here, no next token to score" : `, the token that came next: ${quote(labels[index + 1])}`);
    this.table.replaceChildren(
      el("tr", {}, el("th", {}, "after"), el("th", {title: "its rank among all tokens, 1 for the likeliest"}, "rank"),
        el("th", {}, "p"), el("th", {class: "top"}, `top ${top.tokens[0][0].length}`)),
      ...top.tokens.map((tokens, layer) => el("tr", {"data-layer": layer},
        el("th", {}, `L${layer}`),
        el("td", {class: "number", "data-rank": last ? "" : ranks[layer][index]}, last ? "" : `${ranks[layer][index]}`),
        el("td", {class: "number", "data-log-prob": last ? "" : logProbs[layer][index] ?? ""},
          last ? "" : formatValue(Math.exp(logProbs[layer][index] ?? NaN))),
        el("td", {class: "top"}, ...tokens[index].map((label, k) => el("span", {class: "top-token", title: `p ${top.probs[layer][index][k]}`},
          el("span", {class: "token-text"}, label), ` ${formatValue(top.probs[layer][index][k], 2)}`))))));
    this.column.hidden = last;
    if (!last) Object.assign(this.column.style, {left: `${this.left + index * this.cell}px`, width: `${this.cell}px`});
  }

  // Layers down, queries across (each query's token that came next); viridis from log p = -ln V,
  // a uniform guess over the vocabulary, or less (dark) to 0, certain (yellow).
  drawPicture({labels, next_log_prob: logProbs, next_rank: ranks, vocab_size: V}) {
    this.drawn = this.answer;
    const T = labels.length;
    this.cell = Math.max(2, Math.min(16, Math.floor(WIDTH / (T - 1))));
    this.picture.style.gridTemplateColumns = `28px repeat(${T - 1}, ${this.cell}px)`;
    this.picture.style.gridAutoRows = `${CELL_HEIGHT}px`;
    this.left = 28;
    this.pictureTitle.textContent = `log p of the token that came next, after each layer (rows) at each query (columns)`;
    this.picture.replaceChildren(...logProbs.flatMap((row, layer) => [el("span", {class: "axis"}, `L${layer}`),
      ...row.map((logProb, query) => el("i", {class: "cell", "data-layer": layer, "data-query": query,
        "data-log-prob": logProb ?? "", style: `background:${viridis(1 + (logProb ?? -Infinity) / Math.log(V))}`,
        title: `after layer ${layer}, query ${query} ${quote(labels[query])} → ${quote(labels[query + 1])}: `
          + `log p ${formatValue(logProb, 4)} (p ${formatValue(Math.exp(logProb ?? NaN), 4)}), rank ${ranks[layer][query]}`}))]));
    this.scale.textContent = `Colour: log p from −ln ${V} = ${formatValue(-Math.log(V), 2)} (a uniform guess) or less, dark, `
      + "to 0 (certain), yellow. Hover a cell for its value; click one to pin that query.";
  }

  pin(event) {
    const query = event.target.dataset?.query;
    if (query !== undefined) this.app.pin({side: "query", index: Number(query), reveal: true});
  }
}
