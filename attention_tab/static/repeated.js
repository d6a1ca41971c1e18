// The repeated random tokens, beside the maps: the loss of each token (high over the first copy,
// where the model can only guess; low over the second for a model with induction heads), with
// heads knocked out against the intact model's; and each head's induction score, layers x heads.
import {weightColour} from "./colours.js";
import {el, formatValue} from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const [WIDTH, HEIGHT] = [380, 150];
const MARGIN = {left: 40, right: 8, top: 18, bottom: 28};

export class RepeatedTokens {
  constructor(app) {
    this.app = app;
    this.plot = document.createElementNS(SVG, "svg");
    Object.entries({class: "loss-plot", width: WIDTH, height: HEIGHT, viewBox: `0 0 ${WIDTH} ${HEIGHT}`, role: "img"})
      .forEach(([name, value]) => this.plot.setAttribute(name, value));
    this.means = el("p", {class: "copy-means"});
    this.grid = el("table", {class: "induction-grid"});
    this.root = el("div", {class: "repeated", hidden: true},
      el("h3", {}, "Loss of each token"), this.plot, this.means,
      el("h3", {title: "on the second copy: each query's weight on the token after its token's earlier occurrence"},
        "Induction score on these tokens"), this.grid);
  }

  draw({reading, layer, head}) {
    this.root.hidden = reading?.source !== "repeated";
    if (this.root.hidden) return;
    this.drawPlot(reading);
    this.drawMeans(reading);
    this.drawGrid(reading, layer, head);
  }

  // Token p (1 to 2n) at x, its loss (nats) at y; a dashed line where the second copy starts.
  drawPlot({n, next, intact, knocked_out: out}) {
    const losses = next.loss, intactLosses = intact?.loss;
    const top = Math.max(1, Math.ceil(Math.max(...losses, ...(intactLosses ?? []).filter((v) => v !== null))));
    const x = (p) => MARGIN.left + ((p - 1) / (2 * n - 1)) * (WIDTH - MARGIN.left - MARGIN.right);
    const y = (loss) => HEIGHT - MARGIN.bottom - (Math.min(loss ?? top, top) / top) * (HEIGHT - MARGIN.top - MARGIN.bottom);
    const svg = (tag, attributes, text) => {
      const node = document.createElementNS(SVG, tag);
      for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
      if (text !== undefined) node.textContent = text;
      return node;
    };
    const curve = (values, name) => svg("polyline", {class: `curve ${name}`, "data-curve": name, fill: "none",
      points: values.map((loss, i) => `${x(i + 1).toFixed(1)},${y(loss).toFixed(1)}`).join(" ")});
    const boundary = x(n + 0.5);
    this.plot.replaceChildren(
      svg("line", {class: "axis", x1: MARGIN.left, x2: WIDTH - MARGIN.right, y1: y(0), y2: y(0)}),
      svg("line", {class: "axis", x1: MARGIN.left, x2: MARGIN.left, y1: y(0), y2: y(top)}),
      ...[0, top / 2, top].map((loss) => svg("text", {class: "tick", x: MARGIN.left - 4, y: y(loss) + 4, "text-anchor": "end"},
        formatValue(loss, loss === Math.round(loss) ? 0 : 1))),
      ...[1, n, 2 * n].map((p) => svg("text", {class: "tick", x: x(p), y: HEIGHT - MARGIN.bottom + 13, "text-anchor": "middle"}, p)),
      svg("text", {class: "tick", x: (MARGIN.left + WIDTH) / 2, y: HEIGHT - 2, "text-anchor": "middle"}, "token (<eot> is 0)"),
      svg("text", {class: "tick", x: 0, y: 0, "text-anchor": "middle",
                   transform: `translate(10 ${(MARGIN.top + HEIGHT - MARGIN.bottom) / 2}) rotate(-90)`}, "loss, nats"),
      svg("line", {class: "boundary", x1: boundary, x2: boundary, y1: y(0), y2: y(top) - 6}),
      svg("text", {class: "tick", x: (MARGIN.left + boundary) / 2, y: 12, "text-anchor": "middle"}, "first copy"),
      svg("text", {class: "tick", x: (boundary + WIDTH - MARGIN.right) / 2, y: 12, "text-anchor": "middle"}, "second copy"),
      ...(intactLosses ? [curve(intactLosses, "intact")] : []),
      curve(losses, out.length ? "knocked-out" : "loss"));
    this.plot.setAttribute("aria-label", `loss of each of ${2 * n} tokens, ${out.length ? "knocked out against intact" : "intact"}`);
  }

  drawMeans({copy_loss: loss, intact_copy_loss: intact, knocked_out: out}) {
    const pair = ({first, second}) => `first copy ${formatValue(first, 2)}, second ${formatValue(second, 2)}`;
    const heads = out.map(([l, h]) => `L${l}H${h}`).join(", ");
    this.means.replaceChildren(
      out.length ? el("span", {class: "knocked-out"}, `without ${heads}: ${pair(loss)}`) : `mean loss: ${pair(loss)} nats`,
      intact ? el("span", {class: "intact"}, ` · intact: ${pair(intact)} nats`) : []);
    Object.assign(this.means.dataset, {first: loss.first ?? "", second: loss.second ?? "",
      intactFirst: intact?.first ?? "", intactSecond: intact?.second ?? ""});
  }

  // Layers down, heads across; a click opens the head, as in the model view.
  drawGrid({induction, knocked_out: out}, layer, head) {
    const knocked = new Set(out.map(([l, h]) => `${l}:${h}`));
    this.grid.replaceChildren(
      el("tr", {}, el("th"), ...induction[0].map((_, h) => el("th", {}, `h${h}`))),
      ...induction.map((scores, l) => el("tr", {}, el("th", {}, `L${l}`), ...scores.map((score, h) => el("td", {},
        el("button", {class: `score${l === layer && h === head ? " selected" : ""}${knocked.has(`${l}:${h}`) ? " knocked" : ""}`,
          style: `background:${weightColour(score)};color:${(score ?? 0) > 0.5 ? "#202124" : "#fff"}`,
          "data-layer": l, "data-head": h, "data-score": score ?? "",
          title: `layer ${l} head ${h}: induction ${formatValue(score)}; click to open it`,
          onclick: () => this.app.set({layer: l, head: h, shown: new Set([h])})}, formatValue(score, 2)))))));
  }
}
