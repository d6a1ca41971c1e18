// The right-hand column: the model view, or one of the three tools a strip of tabs above it
// chooses (the logit lens and direct logit attribution on the tokens the views show, activation
// patching on two prompts of your own; attention_tab/tools.py answers them). Tool: what the
// three share: one request at a time to their route, a refusal on a line of its own.
import {askTool} from "./data.js";
import {el} from "./dom.js";

export class SidePanel {
  // parts: {name: [tab label, a view with root and draw(state)]}, the first shown first.
  constructor(app, parts) {
    this.parts = parts;
    this.tabs = Object.fromEntries(Object.entries(parts).map(([name, [label]]) => [name, el("button", {
      role: "tab", class: "tool-tab", "data-tool": name, onclick: () => app.set({tool: name})}, label)]));
    this.root = el("div", {class: "side"},
      el("div", {class: "tool-tabs", role: "tablist", "aria-label": "this column shows"}, ...Object.values(this.tabs)),
      ...Object.values(parts).map(([, view]) => view.root));
  }

  draw(state) {
    for (const [name, [, view]] of Object.entries(this.parts)) {
      const shown = name === state.tool;
      view.root.hidden = !shown;
      this.tabs[name].setAttribute("aria-selected", shown);
      if (shown) view.draw(state);  // a hidden view is drawn when it is shown again
    }
  }
}

export class Tool {
  // route: the plugin's route (lens, attribution, patch); the subclass sets this.root, with this.error in it.
  constructor(app, route) {
    this.app = app;
    this.route = route;
    this.error = el("output", {class: "tool-error", role: "alert", hidden: true});
    this.asked = null;  // what was asked last, as a string
    this.answer = null;  // its answer, once it came; null while it is on its way or was refused
    this.requests = 0;
  }

  // Asks the route, once for each distinct question (key); the answer or the refusal redraws the tab.
  // The tool's root says where it stands in data-state (busy, ready, refused), for the tests.
  async ask(key, step, fields) {
    if (key === this.asked) return;
    const request = ++this.requests;
    [this.asked, this.answer] = [key, null];
    this.root.dataset.state = "busy";
    try {
      const answer = await askTool(this.route, this.app.run, step, fields);
      if (request !== this.requests) return;  // asked something else since
      [this.answer, this.root.dataset.state] = [answer, "ready"];
      this.say("");
    } catch (error) {
      if (request !== this.requests) return;
      this.root.dataset.state = "refused";
      this.say(error.message);
    }
    this.app.redraw();
  }

  // Called first by each draw: an answer or a refusal of another run is not shown under this one.
  followRun() {
    if (this.run === this.app.run) return;
    this.run = this.app.run;
    this.forget();
  }

  // Forgets the question, so that the same one is asked again (a new run, a new reading).
  forget() {
    this.requests++;
    [this.asked, this.answer] = [null, null];
    this.say("");
    this.root.dataset.state = "";  // nothing asked: neither busy, ready nor refused
  }

  say(message) {
    this.error.textContent = message;
    this.error.hidden = !message;
  }
}

// "your text · ckpt_best.pt (step 800)": which tokens and which checkpoint answered.
export function answeredBy(answer, source) {
  return [source, answer && `${answer.checkpoint} (step ${answer.step})`].filter(Boolean).join(" · ");
}
