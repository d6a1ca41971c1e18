// What the tab reads from the plugin's routes (attention_tab/plugin.py). A step's weights come
// as float16 bytes, (n_layer, n_head, T, T) row-major; they are fetched once per step and kept.
// Your text (the text route) and the repeated random tokens (the repeated route) come back as
// JSON, the weights as the same bytes in base64; so do the tools (lens, attribution, patch).
// Each route that runs a model takes a step: a checkpoint the run kept (null: its best, else last).

const route = (name, params = {}) => {
  const url = new URL(`../${name}`, import.meta.url);
  for (const [key, value] of Object.entries(params)) url.searchParams.set(key, value);
  return url;
};

async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url.pathname}: ${response.status} ${await response.text()}`);
  return response;
}

// What the page is told once, at load (attention_tab/page_settings.py): the colour map, the head
// metrics' labels, the token view's row height and lightest line, the repeated tokens' default n.
export async function fetchSettings() {
  return (await fetchOk(route("settings"))).json();
}

export async function fetchRuns() {
  return (await (await fetchOk(route("runs"))).json()).runs;
}

export async function fetchMetrics(run) {
  return (await fetchOk(route("metrics", {run: run.run}))).json();
}

// The run's model reads text with the heads knockedOut ([[layer, head], ...]) switched off:
// the text route's answer, its weights as StepWeights. A refusal (too long, no checkpoint yet)
// throws the route's one line as it is, for the tab to show. The reading remembers the step it
// was asked at (askedStep) and how to ask again (sourceForm).
export async function readText(run, text, knockedOut, step) {
  const form = new URLSearchParams({run: run.run, text, knocked_out: heads(knockedOut), ...stepField(step)});
  const answer = await modelAnswer(await fetch(route("text"), {method: "POST", body: form}));
  return {...answer, source: "text", text, askedStep: step, sourceForm: {source: "text", text}};
}

// The same for n random tokens, then the same n again (n null: the route's default), with seed.
export async function readRepeated(run, n, seed, knockedOut, step) {
  const params = {run: run.run, seed, knocked_out: heads(knockedOut), ...stepField(step)};
  if (n !== null) params.n = n;
  const answer = await modelAnswer(await fetch(route("repeated", params)));
  return {...answer, source: "repeated", askedStep: step, sourceForm: {source: "repeated", n: answer.n, seed: answer.seed}};
}

// A tool's answer (route lens, attribution or patch) to a POST of fields; a refusal throws its one line.
export async function askTool(name, run, step, fields) {
  const form = new URLSearchParams({run: run.run, ...stepField(step), ...fields});
  const response = await fetch(route(name), {method: "POST", body: form});
  if (!response.ok) throw new Error(await refusal(response));
  return response.json();
}

// The tokens a reading showed, for a tool to read the same: its source and its heads knocked out
// (and its askedStep, the tool's step).
export const readingFields = (reading) => ({...reading.sourceForm, knocked_out: heads(reading.knocked_out)});

const stepField = (step) => (step === null || step === undefined ? {} : {step});

const heads = (knockedOut) => knockedOut.map(([l, h]) => `${l}:${h}`).join(",");

// TensorBoard words a 400 "Invalid argument: <the route's line>": the line.
async function refusal(response) {
  return (await response.text()).trim().replace(/^Invalid argument: /, "") || `the route answered ${response.status}`;
}

async function modelAnswer(response) {
  if (!response.ok) throw new Error(await refusal(response));
  const answer = await response.json();
  const bytes = Uint8Array.from(atob(answer.weights), (c) => c.charCodeAt(0));
  return {...answer, weights: halfWeights(answer.shape, bytes.buffer, answer.window)};
}

// float16 bits -> float32, for all 65536 bit patterns at once.
let halfTable = null;
function halfToFloat() {
  if (halfTable) return halfTable;
  halfTable = new Float32Array(65536);
  for (let bits = 0; bits < 65536; bits++) {
    const sign = bits & 0x8000 ? -1 : 1;
    const exponent = (bits >> 10) & 0x1f;
    const fraction = bits & 0x3ff;
    halfTable[bits] = exponent === 0 ? sign * 2 ** -14 * (fraction / 1024)
      : exponent === 31 ? (fraction ? NaN : sign * Infinity)
      : sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
  }
  return halfTable;
}

// float16 bytes (n_layer, n_head, T, T) -> StepWeights of a model with that window (null: none).
function halfWeights(shape, buffer, windowSize) {
  const bits = new Uint16Array(buffer);
  const table = halfToFloat();
  const values = new Float32Array(bits.length);
  for (let i = 0; i < bits.length; i++) values[i] = table[bits[i]];
  return new StepWeights(shape, values, windowSize ?? null);
}

// One logged step (or your text): weights of every layer and head, and the model's window (null:
// none), which hides the keys W or more back from each query.
export class StepWeights {
  constructor(shape, values, windowSize = null) {
    [this.nLayer, this.nHead, this.T] = shape;
    this.values = values;  // Float32Array (n_layer * n_head * T * T)
    this.window = windowSize;
  }

  at(layer, head, query, key) {
    return this.values[((layer * this.nHead + head) * this.T + query) * this.T + key];
  }

  // The T x T map of one head, as a view (no copy).
  map(layer, head) {
    const size = this.T * this.T;
    const start = (layer * this.nHead + head) * size;
    return this.values.subarray(start, start + size);
  }
}

// The weights of one run, step by step: fetched on first use, kept as float16 bytes.
export class RunWeights {
  constructor(run) {
    this.run = run;
    this.bytes = new Map();  // step -> ArrayBuffer
  }

  async load(step) {
    if (!this.bytes.has(step)) {
      const url = route("weights", {run: this.run.run, tag: this.run.tag, step});
      this.bytes.set(step, await (await fetchOk(url)).arrayBuffer());
    }
    return this.bytes.get(step);
  }

  async step(step) {
    return halfWeights(this.run.shape, await this.load(step), this.run.window);
  }

  // Every step ahead of time, when all of them are small enough to keep (the step slider is then
  // instant); a 12 x 12 model's 128-token probe takes 4.7 MB a step.
  // Resolves with whether it fetched them.
  async prefetch(budgetBytes = 96e6) {
    const [L, H, T] = this.run.shape;
    if (this.run.steps.length * L * H * T * T * 2 > budgetBytes) return false;
    for (const step of this.run.steps) await this.load(step);
    return true;
  }
}
