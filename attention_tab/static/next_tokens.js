// Your text's predictions at the token pointed at: the model's top 5 next tokens with their
// probabilities, and the loss of the token that really came next. With heads knocked out, the
// intact model's numbers beside them: its probability of the same tokens, its loss, and the change.
import {el, formatChange, formatValue} from "./dom.js";

export class NextTokens {
  constructor() {
    this.title = el("p", {class: "next-title"});
    this.body = el("tbody");
    this.intactHead = el("th", {title: "the intact model's probability of the same token"}, "intact");
    this.loss = el("p", {class: "next-loss"});
    this.root = el("div", {class: "next-tokens", "aria-live": "polite", hidden: true}, this.title,
      el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "next token"), el("th", {}, "p"), this.intactHead)),
        this.body), this.loss);
  }

  draw(reading, index) {
    this.root.hidden = !reading;
    if (!reading) return;
    const {labels, next, intact} = reading;
    this.title.textContent = `after “${labels[index]}” (token ${index}), the model expects:`;
    this.intactHead.hidden = !intact;
    this.body.replaceChildren(...next.tokens[index].map((token, rank) => el("tr", {},
      el("td", {class: "token-text"}, token), el("td", {class: "number"}, formatValue(next.probs[index][rank])),
      intact ? el("td", {class: "number intact"}, formatValue(intact.probs_of_top[index][rank])) : [])));
    const loss = next.loss[index];
    Object.assign(this.loss.dataset, {loss: loss ?? "", intactLoss: intact?.loss[index] ?? ""});
    if (index === labels.length - 1) {
      this.loss.textContent = "the text ends here: no next token to score";
      return;
    }
    const came = `came next: “${labels[index + 1]}”, loss ${formatValue(loss, 2)} nats`;
    this.loss.replaceChildren(came, intact ? lossChange(loss, intact.loss[index]) : []);
  }
}

// " (intact 1.20, +1.11)", red where knocking out made the model more surprised, green where less.
function lossChange(loss, intactLoss) {
  const change = loss - intactLoss;
  return el("span", {class: change > 0 ? "worse" : "better"},
    ` (intact ${formatValue(intactLoss, 2)}, ${formatChange(change)})`);
}
