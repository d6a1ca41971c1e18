// The header's sources: what the views show. The probe logged at the step; your text (type it,
// Enter or "read" sends it to the run's model); or repeated random tokens (n of them, then the
// same n again; Enter in a box or "show" reads them). A refusal from the server (too long, a bad
// n, no checkpoint yet) shows on a line of its own under the sources, in place of nothing.
import {el} from "./dom.js";

export class TextBox {
  constructor(app) {
    this.app = app;
    this.input = el("input", {type: "text", "aria-label": "your text", placeholder: "Type a text for the run's model to read",
      onkeydown: (event) => { if (event.key === "Enter") this.submit(); }});
    this.button = el("button", {class: "read", onclick: () => this.submit()}, "read");
    const onEnter = (event) => { if (event.key === "Enter") this.submitRepeated(); };
    const n = app.settings.repeated_n;  // the repeated route's default
    this.n = el("input", {type: "number", min: 2, step: 1, class: "count", "aria-label": "n random tokens",
      placeholder: `${n}`, title: `how many random tokens come twice (empty: ${n}, or as many as the model reads)`, onkeydown: onEnter});
    this.seed = el("input", {type: "number", min: 0, step: 1, value: 0, class: "count", "aria-label": "seed",
      title: "the same seed draws the same tokens", onkeydown: onEnter});
    this.show = el("button", {class: "read", onclick: () => this.submitRepeated()}, "show");
    this.error = el("output", {class: "source-error", role: "alert", hidden: true});
    const radio = (value, disabled) => el("input", {type: "radio", name: "shown", value, disabled,
      onchange: () => app.showMode(value)});
    this.modes = {probe: radio("probe", false), text: radio("text", true), repeated: radio("repeated", false)};
    this.probeLabel = el("span", {}, "probe");
    this.root = el("div", {class: "sources", role: "radiogroup", "aria-label": "the views show"},
      el("label", {class: "inline"}, this.modes.probe, this.probeLabel),
      el("span", {class: "source text-source"}, el("label", {class: "inline"}, this.modes.text, "your text"),
        el("span", {class: "text-field"}, this.input), this.button),
      el("span", {class: "source"}, el("label", {class: "inline"}, this.modes.repeated, "repeated random tokens"),
        el("label", {class: "inline"}, "n ", this.n), el("label", {class: "inline"}, "seed ", this.seed), this.show));
  }

  submit() {
    this.app.readText(this.input.value);
  }

  // The n and seed in the boxes (n empty: the route's default). A box holding what is no whole
  // number is refused here, in the same words whatever it holds: "1e" or letters, which the
  // browser reads as empty (the default, else), and "1e3" or "2.5", numbers the route refuses.
  submitRepeated() {
    const whole = (box) => !box.validity.badInput && /^(-?\d+)?$/.test(box.value.trim());
    const bad = [["n", this.n], ["seed", this.seed]].find(([, box]) => !whole(box));
    if (bad) {
      this.say(`${bad[0]} must be a whole number; the box holds something else`);
      this.app.redraw();  // the views, and the source chosen, stay as they were (as for the server's refusals)
      return;
    }
    this.app.readRepeated(this.n.value.trim() === "" ? null : this.n.value.trim(), this.seed.value.trim() || "0");
  }

  // The boxes hold the tokens shown (an empty n becomes the n the model read); a new run empties n.
  setRepeated(reading) {
    this.n.value = reading ? reading.n : "";
    if (reading) this.seed.value = reading.seed;
  }

  busy(source, reading) {
    const button = source === "text" ? this.button : this.show;
    button.disabled = reading;
    button.textContent = reading ? "reading…" : source === "text" ? "read" : "show";
  }

  say(message) {
    this.error.textContent = message;
    this.error.hidden = !message;
  }

  draw({mode, step, readings}) {
    this.modes[mode].checked = true;
    this.modes.text.disabled = !readings.text;  // a text read once stays a click away, its knocked-out heads with it
    this.probeLabel.textContent = `probe at step ${step}`;
  }
}
