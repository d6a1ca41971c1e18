// The header's text box: type a text, Enter (or "read") sends it to the run's model; a switch
// chooses what the views show, the probe logged at the step or your text. A refusal from the
// server (too long, no checkpoint yet) shows under the box, in place of nothing.
import {el} from "./dom.js";

export class TextBox {
  constructor(app) {
    this.app = app;
    this.input = el("input", {type: "text", "aria-label": "your text", placeholder: "Type a text for the run's model to read",
      onkeydown: (event) => { if (event.key === "Enter") this.submit(); }});
    this.button = el("button", {class: "read", onclick: () => this.submit()}, "read");
    this.error = el("output", {class: "text-error", role: "alert", hidden: true});
    this.modes = {
      probe: el("input", {type: "radio", name: "shown", value: "probe", onchange: () => app.showMode("probe")}),
      text: el("input", {type: "radio", name: "shown", value: "text", disabled: true, onchange: () => app.showMode("text")}),
    };
    this.probeLabel = el("span", {}, "probe");
    this.root = el("div", {class: "text-box"},
      el("span", {class: "modes", role: "radiogroup", "aria-label": "the views show"},
        el("label", {class: "inline"}, this.modes.probe, this.probeLabel),
        el("label", {class: "inline"}, this.modes.text, "your text")),
      el("span", {class: "text-field"}, this.input, this.error), this.button);
  }

  submit() {
    this.app.readText(this.input.value);
  }

  busy(reading) {
    this.button.disabled = reading;
    this.button.textContent = reading ? "reading…" : "read";
  }

  say(message) {
    this.error.textContent = message;
    this.error.hidden = !message;
  }

  draw({mode, step, hasReading}) {
    this.modes[mode].checked = true;
    this.modes.text.disabled = !hasReading;  // a text read once stays a click away, its knocked-out heads with it
    this.probeLabel.textContent = `probe at step ${step}`;
  }
}
