// The service's own explorer: plain DOM and SVG, no libraries, no network beyond this server.
// Everything is driven by the service's own descriptions (GET /v2/models, /v2/explainers and
// /openapi.json), so a new explainer or model shows up here without a change to this file.
"use strict";

const COMMON_FIELDS = new Set(["inputs", "target", "seed", "budget", "background", "id", "parameters", "timeout_ms", "return_inputs"]);
const SVGNS = "http://www.w3.org/2000/svg";
const MAX_BARS = 20;
const state = { models: [], catalog: {}, openapi: null, model: null, last: null, lastRequest: null };

// ------------------------------------------------------------------ helpers

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) node.setAttribute(k, v);
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function title(text) { return svg("title", {}, text); }

// 4 significant digits, no exponent between 1e-3 and 1e5 (10140, not 1.014e+4)
function fmt(x) {
  if (typeof x !== "number" || !isFinite(x)) return String(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return x.toExponential(2);
  if (a < 1) return x.toPrecision(3).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "");
  const text = x.toFixed(Math.max(0, 3 - Math.floor(Math.log10(a))));
  return text.includes(".") ? text.replace(/\.?0+$/, "") : text;
}

// a duration in milliseconds as people say it: 38 ms, 10.1 s, 2 min 5 s
function duration(ms) {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

// value in [-limit, limit] -> red (raises the output) or blue (lowers it), alpha by size
function colour(value, limit, alpha = 1) {
  const t = limit > 0 ? Math.max(-1, Math.min(1, value / limit)) : 0;
  const rgb = t >= 0 ? "214,39,40" : "31,119,180";
  return `rgba(${rgb},${(Math.abs(t) * alpha).toFixed(3)})`;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = localStorage.getItem("apiKey");
  if (key) h["X-API-Key"] = key;
  return h;
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { ...headers(), ...(options.headers || {}) } });
  const type = response.headers.get("content-type") || "";
  const body = type.includes("json") ? await response.json() : await response.blob();
  if (!response.ok) {
    const message = body && body.error ? `${body.error} (${body.code})` : `HTTP ${response.status}`;
    throw new Error(message);
  }
  return body;
}

function setStatus(text, isError = false) {
  const s = $("status");
  s.textContent = text;
  s.className = isError ? "error" : "muted";
}

// a $ref is looked up in `root`: the OpenAPI document, or an options schema with its own $defs
function resolveRef(schema, root = state.openapi) {
  let s = schema || {};
  while (s && s.$ref) s = s.$ref.split("/").slice(1).reduce((o, k) => (o ? o[k] : undefined), root);
  return s || {};
}

// the non-null branch of anyOf [X, null]
function mainType(schema, root = state.openapi) {
  const s = resolveRef(schema, root);
  if (s.anyOf) {
    const branch = s.anyOf.find((b) => resolveRef(b, root).type !== "null") || {};
    return { ...resolveRef(branch, root), description: s.description, default: s.default, title: s.title, nullable: true };
  }
  return s;
}

// ------------------------------------------------------------------ start-up

async function init() {
  const keyInput = $("api-key");
  keyInput.value = localStorage.getItem("apiKey") || "";
  keyInput.addEventListener("change", () => { localStorage.setItem("apiKey", keyInput.value); init(); });
  try {
    const [models, explainers, openapi] = await Promise.all([api("/v2/models"), api("/v2/explainers"), api("/openapi.json")]);
    state.models = models;
    state.catalog = Object.fromEntries(explainers.map((e) => [e.name, e]));
    state.openapi = openapi;
  } catch (err) {
    setStatus(`could not reach the service: ${err.message}`, true);
    return;
  }
  const select = $("model");
  select.replaceChildren(...state.models.map((m) =>
    el("option", { value: m.name, disabled: m.state !== "ready" ? "" : null, text: `${m.name} (${m.modality})` })));
  const ready = state.models.filter((m) => m.state === "ready");
  const first = ready.find((m) => m.name === "diabetes-mlp") || ready.find((m) => m.modality === "tabular") || ready[0];
  const wanted = new URLSearchParams(location.search).get("model");
  select.value = (state.models.find((m) => m.name === wanted) || first || {}).name || "";
  select.onchange = () => loadModel(select.value);
  $("explainer").onchange = () => loadExplainer($("explainer").value);
  $("explain").onclick = explain;
  $("submit-job").onclick = submitJob;
  $("compare").onclick = compare;
  for (const b of $("downloads").querySelectorAll("button")) b.onclick = () => download(b.dataset.format);
  if (select.value) await loadModel(select.value);
  pollJobs();
}

async function loadModel(name) {
  const meta = await api(`/v2/models/${encodeURIComponent(name)}`);
  const n = meta.inputs[0].shape.length >= 3 ? 4 : 10; // images: a few
  const examples = await api(`/v2/models/${encodeURIComponent(name)}/examples?n=${n}`).catch(() => ({ instances: [] }));
  state.model = meta;
  state.examples = examples;
  const outputs = meta.output_names.length > 12 ? `${meta.output_names.slice(0, 12).join(", ")}, … (${meta.output_names.length})` : meta.output_names.join(", ");
  $("model-info").textContent = `${meta.task}, ${meta.modality}; outputs: ${outputs}`;
  const target = $("target");
  target.replaceChildren(el("option", { value: "", text: "default" }),
    ...meta.output_names.map((n, i) => el("option", { value: String(i), text: `${i}: ${n}` })));
  const names = meta.explainers.filter((e) => state.catalog[e]);
  const ex = $("explainer");
  ex.replaceChildren(...names.map((n) => el("option", { value: n, text: n })));
  $("compare-explainer").replaceChildren(el("option", { value: "", text: "same" }),
    ...names.filter((n) => requestSchema(n).required?.includes("inputs")).map((n) => el("option", { value: n, text: n })));
  $("compare-target").replaceChildren(el("option", { value: "", text: "same" }),
    ...meta.output_names.map((n, i) => el("option", { value: String(i), text: `${i}: ${n}` })));
  const wanted = new URLSearchParams(location.search).get("explainer");
  ex.value = names.includes(wanted) ? wanted : names[0] || "";
  if (ex.value) loadExplainer(ex.value);
}

function requestSchema(explainer) {
  const path = state.openapi.paths[`/v2/models/{model}/explain/${explainer}`];
  const body = path && path.post.requestBody;
  return body ? resolveRef(body.content["application/json"].schema) : { properties: {}, required: ["inputs"] };
}

function loadExplainer(name) {
  const spec = state.catalog[name];
  $("explainer-info").textContent = `${spec.description}. ${spec.reference}`;
  const schema = requestSchema(name);
  const usesInputs = (schema.required || []).includes("inputs");
  $("input-box").hidden = !usesInputs;
  if (usesInputs) renderInput(state.model);
  const own = Object.entries(schema.properties || {}).filter(([k]) => !COMMON_FIELDS.has(k));
  $("fields-box").hidden = own.length === 0;
  $("fields").replaceChildren(...own.map(([k, s]) => fieldInput(k, mainType(s), (schema.required || []).includes(k), "field")));
  renderOptions(spec.options_schema);
}

// ------------------------------------------------------------------ inputs

function renderInput(meta) {
  const box = $("input");
  box.replaceChildren();
  const shape = meta.inputs[0].shape.slice(1);
  const ex = state.examples || { instances: [] };
  let next = 0;
  const exampleButton = (apply) => ex.instances.length
    ? el("button", { type: "button", class: "secondary", id: "next-example",
        onclick: () => { apply(ex.instances[next % ex.instances.length]); next += 1; } }, "Load an example")
    : null;
  const tensor = meta.inputs[0];
  if (tensor.datatype === "BYTES") {
    box.append(el("textarea", { id: "text-input", rows: "4", text: ex.instances.length ? String(ex.instances[0])
      : "A great movie with a terrible ending, but the actors are wonderful." }));
  } else if (shape.length === 1 && meta.feature_names.length === shape[0]) {
    const inputs = meta.feature_names.map((f) => el("input", { type: "number", step: "any", "data-feature": f, required: "" }));
    const apply = (row) => inputs.forEach((input, i) => { input.value = fmt(row[i]); });
    box.append(el("div", { class: "table-form" }, ...meta.feature_names.map((f, i) => el("label", {}, f, inputs[i]))), exampleButton(apply));
    if (ex.instances.length) { apply(ex.instances[0]); next = 1; }
  } else if (shape.length === 3 && shape[0] === 3) { // RGB, channels first
    const range = meta.capabilities.input_range || [0, typeof ex.max === "number" && ex.max > 1 ? ex.max : 1];
    const pad = colourPad(shape, range);
    const canvas = pad.querySelector("canvas");
    box.append(...[pad, exampleButton((x) => canvas.setValue(x))].filter(Boolean));
    if (ex.instances.length) { canvas.setValue(ex.instances[0]); next = 1; }
  } else if (shape.length >= 2) {
    const top = typeof ex.max === "number" ? ex.max : Array.isArray(ex.max) ? Math.max(...ex.max.flat(3)) : 1;
    const pad = drawingPad(shape, top);
    const plane = (x) => (shape.length === 3 ? x[0] : x);
    box.append(...[pad, exampleButton((x) => pad.querySelector("canvas").setValue(plane(x)))].filter(Boolean));
    if (ex.instances.length) { pad.querySelector("canvas").setValue(plane(ex.instances[0])); next = 1; }
  } else {
    box.append(el("label", {}, "inputs (JSON list of instances)",
      el("textarea", { id: "json-input", rows: "4", text: JSON.stringify(ex.instances.slice(0, 1)) })));
  }
}

// A drawing pad of H x W cells (the model's input size) with pen, eraser, clear and upload.
function drawingPad(shape, top) {
  const [h, w] = shape.slice(-2);
  const channels = shape.length === 3 ? shape[0] : 1;
  const cell = Math.max(4, Math.floor(240 / Math.max(h, w)));
  const canvas = el("canvas", { class: "pad", width: String(w * cell), height: String(h * cell), "data-testid": "pad" });
  const grid = Array.from({ length: h }, () => new Array(w).fill(0));
  const ctx = canvas.getContext("2d");
  const paint = () => {
    for (let r = 0; r < h; r++) for (let c = 0; c < w; c++) {
      const g = Math.round(255 * grid[r][c] / top);
      ctx.fillStyle = `rgb(${g},${g},${g})`;
      ctx.fillRect(c * cell, r * cell, cell, cell);
    }
  };
  let drawing = false;
  const stroke = (event) => {
    const rect = canvas.getBoundingClientRect();
    const c = Math.floor((event.clientX - rect.left) / cell), r = Math.floor((event.clientY - rect.top) / cell);
    const erase = $("pad-eraser").checked;
    for (let dr = -1; dr <= 1; dr++) for (let dc = -1; dc <= 1; dc++) {
      const rr = r + dr, cc = c + dc;
      if (rr < 0 || cc < 0 || rr >= h || cc >= w) continue;
      const amount = dr === 0 && dc === 0 ? top : top * 0.35;
      grid[rr][cc] = erase ? 0 : Math.min(top, grid[rr][cc] + amount);
    }
    paint();
  };
  canvas.addEventListener("pointerdown", (e) => { drawing = true; canvas.setPointerCapture(e.pointerId); stroke(e); });
  canvas.addEventListener("pointermove", (e) => { if (drawing) stroke(e); });
  canvas.addEventListener("pointerup", () => { drawing = false; });
  const upload = el("input", { type: "file", accept: "image/*" });
  upload.addEventListener("change", () => {
    const file = upload.files[0];
    if (!file) return;
    const img = new Image();
    img.onload = () => {
      const off = document.createElement("canvas");
      off.width = w; off.height = h;
      const octx = off.getContext("2d");
      octx.drawImage(img, 0, 0, w, h);
      const px = octx.getImageData(0, 0, w, h).data;
      const lum = [];
      for (let i = 0; i < w * h; i++) lum.push((px[4 * i] + px[4 * i + 1] + px[4 * i + 2]) / 765);
      const invert = lum.reduce((a, b) => a + b, 0) / lum.length > 0.5; // dark ink on light paper
      for (let i = 0; i < w * h; i++) grid[Math.floor(i / w)][i % w] = top * (invert ? 1 - lum[i] : lum[i]);
      paint();
      URL.revokeObjectURL(img.src);
    };
    img.src = URL.createObjectURL(file);
  });
  paint();
  canvas.readValue = () => {
    const plane = grid.map((row) => row.map((v) => Math.round(v * 1000) / 1000));
    return shape.length === 3 ? Array.from({ length: channels }, () => plane) : plane;
  };
  canvas.setValue = (values) => { for (let r = 0; r < h; r++) for (let c = 0; c < w; c++) grid[r][c] = values[r][c]; paint(); };
  return el("div", {}, canvas,
    el("div", { class: "pad-tools" },
      el("label", { class: "inline" }, el("input", { type: "checkbox", id: "pad-eraser" }), "eraser"),
      el("button", { type: "button", class: "secondary", onclick: () => { grid.forEach((row) => row.fill(0)); paint(); } }, "Clear"),
      el("label", {}, "or upload an image", upload)),
    el("p", { class: "muted", text: `${h}×${w} pixels, values 0 to ${fmt(top)}` }));
}

// An RGB image of the model's H x W (channels first, values in its input_range): shown in
// colour, painted with a colour pen, or read from an uploaded PNG/JPEG scaled to H x W.
function colourPad(shape, range) {
  const [, h, w] = shape;
  const [lo, hi] = range;
  const cell = Math.max(1, Math.floor(240 / Math.max(h, w)));
  const canvas = el("canvas", { class: "pad colour", width: String(w * cell), height: String(h * cell), "data-testid": "pad" });
  const planes = [0, 1, 2].map(() => new Float32Array(h * w).fill(hi)); // white paper
  const ctx = canvas.getContext("2d");
  const off = document.createElement("canvas");
  off.width = w; off.height = h;
  const octx = off.getContext("2d");
  const level = (v) => Math.round(255 * Math.max(0, Math.min(1, hi > lo ? (v - lo) / (hi - lo) : 0)));
  const paint = () => {
    const img = octx.createImageData(w, h);
    for (let i = 0; i < h * w; i++) {
      for (let k = 0; k < 3; k++) img.data[4 * i + k] = level(planes[k][i]);
      img.data[4 * i + 3] = 255;
    }
    octx.putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, 0, 0, w * cell, h * cell);
  };
  const pen = el("input", { type: "color", value: "#d62728", id: "pad-colour" });
  let drawing = false;
  const stroke = (event) => {
    const rect = canvas.getBoundingClientRect();
    const c = Math.floor(((event.clientX - rect.left) / rect.width) * w), r = Math.floor(((event.clientY - rect.top) / rect.height) * h);
    const hex = pen.value, radius = Math.max(1, Math.round(Math.max(h, w) / 32));
    const rgb = [1, 3, 5].map((i) => lo + ((hi - lo) * parseInt(hex.slice(i, i + 2), 16)) / 255);
    for (let rr = r - radius; rr <= r + radius; rr++) for (let cc = c - radius; cc <= c + radius; cc++) {
      if (rr < 0 || cc < 0 || rr >= h || cc >= w) continue;
      for (let k = 0; k < 3; k++) planes[k][rr * w + cc] = rgb[k];
    }
    paint();
  };
  canvas.addEventListener("pointerdown", (e) => { drawing = true; canvas.setPointerCapture(e.pointerId); stroke(e); });
  canvas.addEventListener("pointermove", (e) => { if (drawing) stroke(e); });
  canvas.addEventListener("pointerup", () => { drawing = false; });
  const upload = el("input", { type: "file", accept: "image/png,image/jpeg", "data-testid": "upload" });
  upload.addEventListener("change", () => {
    const file = upload.files[0];
    if (!file) return;
    const img = new Image();
    img.onload = () => {
      octx.clearRect(0, 0, w, h);
      octx.drawImage(img, 0, 0, w, h); // scaled to the model's size
      const px = octx.getImageData(0, 0, w, h).data;
      for (let i = 0; i < h * w; i++) for (let k = 0; k < 3; k++) planes[k][i] = lo + ((hi - lo) * px[4 * i + k]) / 255;
      paint();
      canvas.dataset.loaded = file.name;
      URL.revokeObjectURL(img.src);
    };
    img.onerror = () => setStatus(`${file.name} is not an image the browser can read (PNG or JPEG)`, true);
    img.src = URL.createObjectURL(file);
  });
  paint();
  canvas.readValue = () => planes.map((p) => Array.from({ length: h }, (_, r) =>
    Array.from(p.subarray(r * w, (r + 1) * w), (v) => Math.round(v * 1e4) / 1e4)));
  canvas.setValue = (x) => { for (let k = 0; k < 3; k++) for (let r = 0; r < h; r++) for (let c = 0; c < w; c++) planes[k][r * w + c] = x[k][r][c]; paint(); };
  return el("div", {}, canvas,
    el("div", { class: "pad-tools" },
      el("label", { class: "inline" }, "pen", pen),
      el("button", { type: "button", class: "secondary", onclick: () => { planes.forEach((p) => p.fill(hi)); paint(); } }, "Clear"),
      el("label", {}, "or upload a PNG/JPEG (scaled to the model's size)", upload)),
    el("p", { class: "muted", text: `${h}×${w} pixels in colour (3 channels), values ${fmt(lo)} to ${fmt(hi)}` }));
}

// a blank or invalid number is refused here, never sent as 0
function numberOf(input, name) {
  const raw = input.value.trim();
  const ok = !input.validity.badInput && raw !== "" && Number.isFinite(Number(raw));
  input.classList.toggle("invalid", !ok);
  if (!ok) throw new Error(`${name} needs a number${input.validity.badInput || raw !== "" ? " (not valid)" : " (it is empty)"}`);
  return Number(raw);
}

function readInstance() {
  const row = [...document.querySelectorAll("[data-feature]")];
  if (row.length) {
    const bad = row.filter((i) => i.validity.badInput || i.value.trim() === "" || !Number.isFinite(Number(i.value)));
    row.forEach((i) => i.classList.toggle("invalid", bad.includes(i)));
    if (bad.length) throw new Error(`fill in ${bad.map((i) => i.dataset.feature).join(", ")} with numbers`);
    return row.map((i) => Number(i.value));
  }
  const pad = document.querySelector("[data-testid=pad]");
  if (pad) return pad.readValue();
  const text = $("text-input");
  if (text) return text.value;
  return null;
}

// ------------------------------------------------------------------ schema-driven forms

function fieldInput(name, s, required, role, root = state.openapi) {
  const label = `${s.title || name}${required ? " *" : ""}`;
  const attrs = { "data-name": name, "data-role": role, title: s.description || "" };
  let input;
  if (s.enum) {
    input = el("select", attrs, ...(required ? [] : [el("option", { value: "", text: s.default != null ? `default (${s.default})` : "default" })]),
      ...s.enum.map((v) => el("option", { value: JSON.stringify(v), text: String(v) })));
    input.dataset.kind = "json";
  } else if (s.type === "boolean") {
    input = el("select", attrs, el("option", { value: "", text: s.default != null ? `default (${s.default})` : "default" }),
      el("option", { value: "true", text: "true" }), el("option", { value: "false", text: "false" }));
    input.dataset.kind = "json";
  } else if (s.type === "integer" || s.type === "number") {
    input = el("input", { ...attrs, type: "number", step: s.type === "integer" ? "1" : "any",
      min: s.minimum ?? s.exclusiveMinimum, max: s.maximum ?? s.exclusiveMaximum, placeholder: s.default != null ? String(s.default) : "" });
    input.dataset.kind = "number";
  } else if (s.type === "string") {
    input = el("textarea", { ...attrs, rows: name.length > 0 && (s.maxLength || 1000) > 200 ? "3" : "1", placeholder: s.description || "" });
    input.dataset.kind = "string";
  } else if (s.type === "array" && resolveRef(s.items || {}, root).type === "string") {
    input = el("textarea", { ...attrs, rows: "4", placeholder: "one per line" });
    input.dataset.kind = "lines";
  } else {
    input = el("textarea", { ...attrs, rows: "2", placeholder: "JSON" });
    input.dataset.kind = "json";
  }
  return el("label", { class: "field" }, label, input, s.description ? el("span", { class: "muted", text: s.description }) : null);
}

// Options that only apply to another modality ("image models: ...", "text models: ...") are
// hidden; evaluate (faithfulness figures) is one checkbox per metric.
const ONLY = [[/^(image models|images)\b/i, "image"], [/^text models\b/i, "text"]];
const IMAGE_OPTIONS = new Set(["patch_size", "blur_sigma"]);

function modalityOf(name, s) {
  if (IMAGE_OPTIONS.has(name)) return "image";
  const hit = ONLY.find(([re]) => re.test(s.description || ""));
  return hit ? hit[1] : null;
}

function renderOptions(schema) {
  state.optionsSchema = schema;
  const modality = state.model ? state.model.modality : null;
  const props = Object.entries(schema.properties || {});
  const fields = props.map(([k, s]) => {
    const main = mainType(s, schema);
    const node = fieldInput(k, main, false, "option", schema);
    const only = modalityOf(k, main);
    if (only && only !== modality) node.hidden = true;
    node.dataset.only = only || "";
    return node;
  });
  const metrics = ["deletion", "insertion", "mufidelity", "sensitivity"];
  const evaluate = el("fieldset", { class: "evaluate", "data-testid": "evaluate" }, el("legend", { text: "Evaluate (faithfulness)" }),
    ...metrics.map((m) => el("label", { class: "inline" }, el("input", { type: "checkbox", "data-metric": m }), m)),
    el("span", { class: "muted", text: "each explanation gets details.evaluation: deletion/insertion AUC, MuFidelity, sensitivity" }));
  $("options").replaceChildren(...fields, evaluate);
}

function readFields(role) {
  const out = {};
  for (const input of document.querySelectorAll(`[data-role=${role}]`)) {
    const raw = input.value.trim();
    if (input.closest("[hidden]")) continue; // controls for another modality
    if (raw === "" && !(input.validity && input.validity.badInput)) continue;
    const kind = input.dataset.kind;
    if (kind === "number") out[input.dataset.name] = numberOf(input, input.dataset.name);
    else if (kind === "string") out[input.dataset.name] = input.value;
    else if (kind === "lines") out[input.dataset.name] = raw.split("\n").map((x) => x.trim()).filter(Boolean);
    else {
      try { out[input.dataset.name] = JSON.parse(raw); } catch { throw new Error(`${input.dataset.name} is not valid JSON`); }
    }
  }
  return out;
}

function buildRequest() {
  const explainer = $("explainer").value;
  const schema = requestSchema(explainer);
  const body = { seed: $("seed").value.trim() === "" ? 0 : numberOf($("seed"), "seed"), parameters: readFields("option"), ...readFields("field") };
  const metrics = [...document.querySelectorAll("[data-metric]:checked")].map((c) => c.dataset.metric);
  if (metrics.length) body.parameters.evaluate = metrics;
  if ((schema.required || []).includes("inputs")) {
    const json = $("json-input");
    body.inputs = json ? JSON.parse(json.value) : [readInstance()];
  }
  if ($("target").value !== "") body.target = Number($("target").value);
  if ($("budget").value.trim() !== "" || $("budget").validity.badInput) body.budget = numberOf($("budget"), "budget");
  return { explainer, body };
}

// ------------------------------------------------------------------ explain

async function explain() {
  let request;
  try { request = buildRequest(); } catch (err) { setStatus(`bad input: ${err.message}`, true); return; }
  const model = state.model.name;
  setStatus("explaining…");
  $("result").dataset.state = "loading";
  const started = performance.now();
  try {
    const body = await api(`/v2/models/${encodeURIComponent(model)}/explain/${request.explainer}`,
      { method: "POST", body: JSON.stringify(request.body) });
    withInputs(body, request);
    state.last = body;
    state.lastRequest = request;
    renderResult(body, request);
    setStatus(`done in ${duration(performance.now() - started)} (cache ${body.meta.cache})`);
    $("result").dataset.state = "done";
  } catch (err) {
    setStatus(err.message, true);
    $("result").dataset.state = "error";
  }
}

// A large image comes back as its digest (data null, data_digest): the page has the instances it
// sent, so each explanation gets its own back (explanations are instance-major, k per instance).
function withInputs(body, request) {
  const inputs = request.body.inputs, all = body.data.explanations;
  if (!Array.isArray(inputs) || !inputs.length) return body;
  const k = Math.max(1, Math.round(all.length / inputs.length));
  all.forEach((e, i) => { if (e.data === null && e.data_digest) e.data = inputs[Math.floor(i / k)]; });
  return body;
}

async function download(format) {
  if (!state.last) return;
  const body = await api(`/v2/plots?format=${format}`, { method: "POST", body: JSON.stringify(state.last) });
  const blob = body instanceof Blob ? body : new Blob([JSON.stringify(body, null, 2)], { type: "application/json" });
  const ext = { png: "png", svg: "svg", "vega-lite": "vl.json", shap: "shap.json" }[format];
  const a = el("a", { href: URL.createObjectURL(blob), download: `${state.last.model_name}-${state.last.meta.explainer}.${ext}` });
  document.body.append(a);
  a.click();
  a.remove();
}

// ------------------------------------------------------------------ rendering

function renderResult(body, request) {
  const m = body.meta;
  $("summary").replaceChildren(
    el("h2", { text: `${body.model_name} · ${m.explainer} v${m.explainer_version}` }),
    el("p", { class: "muted", text: `request ${body.id} · ${m.exact ? "exact" : "estimated"} · ${m.n_model_evals.toLocaleString("en")} model evaluations · ${duration(m.compute_ms)} · cache ${m.cache}${m.additive === false ? " · not additive" : ""}` }),
    el("details", {}, el("summary", { text: "meta" }), el("pre", { text: JSON.stringify(m, null, 2) })));
  $("downloads").hidden = false;
  const names = body.data.feature_names;
  $("explanations").replaceChildren(...body.data.explanations.map((e, i) => renderExplanation(e, i, names, m, request)));
}

function playerNames(e, names) {
  if (e.players) return e.players.map((p) => p.text);
  return names.length === e.values.length ? names : e.values.map((_, i) => `player ${i}`);
}

function renderExplanation(e, index, featureNames, meta, request) {
  const names = playerNames(e, featureNames);
  const how = e.exact && e.estimator !== "exact" ? `${e.estimator}, exact` : e.estimator;
  const head = el("h3", { text: `#${index} · ${e.output_name} · f(x) = ${fmt(e.instance_output_value)} · E[f(x)] = ${fmt(e.base_value)} · ${how}` });
  const charts = el("div", { class: "charts" });
  const box = el("div", { class: "explanation", "data-index": String(index) }, head);
  // Reasons to trust these numbers less, next to them (noisy_estimate, flat_game, ...).
  if (e.warnings && e.warnings.length) {
    box.append(el("ul", { class: "warnings", "data-testid": "warnings" },
      ...e.warnings.map((w) => el("li", { class: "warning", "data-code": w.code },
        el("strong", { text: w.code.replaceAll("_", " ") }), `: ${w.message}`))));
  }
  box.append(charts);
  const image = imageOf(e.data);
  const grid = image ? pixelMap(e, names, image, meta.parameters || {}) : null;
  const rgb = grid ? rgbOf(e.data) : null;
  if (e.players) charts.append(chart("Highlighted text", highlight(e, request)));
  if (grid && rgb) {
    const classes = el("p", { class: "top-classes muted", "data-testid": "top-classes" });
    charts.append(chart("Input", el("div", {}, colourCanvas(rgb, null), classes)),
      chart(`Attributions to ${e.output_name}`, colourAttributions(e, names, rgb, meta.parameters || {})));
    topClasses(e.data).then((text) => { classes.textContent = text; }).catch(() => {});
  } else if (grid) {
    const classes = el("p", { class: "top-classes muted", "data-testid": "top-classes" });
    charts.append(chart("Input", el("div", {}, heatmap(image, null, false), classes)),
      chart(`Attributions to ${e.output_name}`, heatmap(image, grid)));
    topClasses(e.data).then((text) => { classes.textContent = text; }).catch(() => {});
  }
  // shap's labels for a table row: "31.2 = bmi"
  const tabular = Array.isArray(e.data) && e.data.length === names.length && e.data.every((x) => typeof x === "number");
  const shown = tabular ? names.map((n, i) => `${fmt(e.data[i])} = ${n}`) : names;
  if (!grid || names.length <= 64) charts.append(chart("Attributions", barChart(shown, e.values, e.error_std)));
  if (meta.additive !== false && names.length > 1 && !e.players && !grid) charts.append(chart("Waterfall", waterfall(shown, e)));
  if (e.interactions) charts.append(chart(`Interactions (${e.interactions.index})`, interactionMatrix(names, e.interactions)));
  if (e.details) box.append(renderDetails(e.details, names, request, image, typeof e.data === "string" ? e.data : null));
  return box;
}

function chart(caption, node) { return el("div", { class: "chart" }, el("h4", { text: caption }), node); }

function imageOf(data) {
  if (!Array.isArray(data) || !Array.isArray(data[0])) return null;
  let plane = data;
  if (Array.isArray(data[0][0])) { // [C, H, W]: average the channels
    plane = data[0].map((row, r) => row.map((_, c) => data.reduce((s, ch) => s + ch[r][c], 0) / data.length));
  }
  return plane.every((row) => Array.isArray(row) && row.every((v) => typeof v === "number")) ? plane : null;
}

// attributions per pixel: one value per pixel (channels summed) or per patch_<r>_<c>
function pixelMap(e, names, image, parameters) {
  const h = image.length, w = image[0].length, n = e.values.length;
  if (n >= h * w && n % (h * w) === 0) {
    const grid = Array.from({ length: h }, () => new Array(w).fill(0));
    e.values.forEach((v, i) => { const p = i % (h * w); grid[Math.floor(p / w)][p % w] += v; });
    return grid;
  }
  const labels = segmentLabels(e, h, w);
  if (labels) return Array.from({ length: h }, (_, r) => Array.from({ length: w }, (_, c) => e.values[labels[r * w + c]] ?? 0));
  const patches = names.map((name) => /^patch_(\d+)_(\d+)$/.exec(name));
  if (patches.length && patches.every(Boolean)) { // patch_size, else the size the grid of names covers
    const rows = Math.max(...patches.map((m) => +m[1])) + 1, cols = Math.max(...patches.map((m) => +m[2])) + 1;
    const sr = parameters.patch_size || Math.ceil(h / rows), sc = parameters.patch_size || Math.ceil(w / cols);
    const grid = Array.from({ length: h }, () => new Array(w).fill(0));
    patches.forEach((m, i) => {
      for (let r = +m[1] * sr; r < Math.min(h, (+m[1] + 1) * sr); r++)
        for (let c = +m[2] * sc; c < Math.min(w, (+m[2] + 1) * sc); c++) grid[r][c] = e.values[i];
    });
    return grid;
  }
  return null;
}

// superpixels: details.segments {shape: [H, W], rle: [player, count, ...]} row-major -> player per pixel
function segmentLabels(e, h, w) {
  const seg = e.details && e.details.segments;
  if (!seg || !Array.isArray(seg.rle) || !Array.isArray(seg.shape) || seg.shape[0] !== h || seg.shape[1] !== w) return null;
  const labels = new Int32Array(h * w);
  let at = 0;
  for (let i = 0; i + 1 < seg.rle.length; i += 2) { labels.fill(seg.rle[i], at, Math.min(h * w, at + seg.rle[i + 1])); at += seg.rle[i + 1]; }
  return at === h * w ? labels : null;
}

// pixels on a segment's edge (a neighbour right or below belongs to another segment)
function segmentEdges(labels, h, w) {
  const edge = new Uint8Array(h * w);
  for (let r = 0; r < h; r++) for (let c = 0; c < w; c++) {
    const i = r * w + c;
    if ((c + 1 < w && labels[i + 1] !== labels[i]) || (r + 1 < h && labels[i + w] !== labels[i])) edge[i] = 1;
  }
  return edge;
}

// an RGB instance [3][H][W] as {h, w, px: RGBA bytes}, scaled by the model's input_range
function rgbOf(data) {
  if (!Array.isArray(data) || data.length !== 3 || !Array.isArray(data[0]) || !Array.isArray(data[0][0])) return null;
  const h = data[0].length, w = data[0][0].length;
  const caps = (state.model && state.model.capabilities) || {};
  let [lo, hi] = caps.input_range || [Infinity, -Infinity];
  if (!caps.input_range) for (const plane of data) for (const row of plane) for (const v of row) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  if (!caps.input_range && lo >= 0 && hi <= 1) [lo, hi] = [0, 1];
  const px = new Uint8ClampedArray(4 * h * w);
  for (let r = 0; r < h; r++) for (let c = 0; c < w; c++) {
    const i = r * w + c;
    for (let k = 0; k < 3; k++) px[4 * i + k] = Math.round((255 * (data[k][r][c] - lo)) / (hi - lo || 1));
    px[4 * i + 3] = 255;
  }
  return { h, w, px };
}

// the image in colour on a canvas; with a grid [H][W], the attributions over a paler copy
// (red raises, blue lowers, opaque in proportion to |value| / limit) and segment edges in yellow
function colourCanvas(rgb, grid, limit = 1, edges = null, channel = "sum") {
  const { h, w, px } = rgb;
  const cell = Math.max(1, Math.floor(240 / Math.max(h, w)));
  const off = document.createElement("canvas");
  off.width = w; off.height = h;
  const octx = off.getContext("2d");
  const img = octx.createImageData(w, h);
  for (let i = 0; i < h * w; i++) {
    let [r, g, b] = [px[4 * i], px[4 * i + 1], px[4 * i + 2]];
    if (grid) {
      const v = grid[Math.floor(i / w)][i % w], t = Math.max(-1, Math.min(1, v / limit)), a = 0.9 * Math.abs(t);
      const [cr, cg, cb] = t >= 0 ? [214, 39, 40] : [31, 119, 180];
      [r, g, b] = [r, g, b].map((x, k) => (0.5 * x + 127.5) * (1 - a) + [cr, cg, cb][k] * a);
    }
    if (edges && edges[i]) [r, g, b] = [255, 214, 0];
    img.data.set([r, g, b, 255], 4 * i);
  }
  octx.putImageData(img, 0, 0);
  const canvas = el("canvas", { width: String(w * cell), height: String(h * cell), class: "image",
    "data-testid": grid ? "heatmap" : "original", "data-channel": grid ? channel : null, "data-limit": grid ? String(limit) : null });
  const ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(off, 0, 0, w * cell, h * cell);
  if (grid) {
    canvas.addEventListener("mousemove", (event) => {
      const rect = canvas.getBoundingClientRect();
      const c = Math.floor(((event.clientX - rect.left) / rect.width) * w), r = Math.floor(((event.clientY - rect.top) / rect.height) * h);
      if (r >= 0 && c >= 0 && r < h && c < w) canvas.title = `(${r}, ${c}) attribution ${fmt(grid[r][c])}`;
    });
  }
  return canvas;
}

// the attributions over the colour image; pixel attributions (3 x H x W values) summed over the
// channels or one channel's (r, g, b), or each in its own panel
function colourAttributions(e, names, rgb, parameters) {
  const { h, w } = rgb, n = e.values.length, perPixel = n === 3 * h * w;
  const labels = segmentLabels(e, h, w);
  const edges = labels ? segmentEdges(labels, h, w) : null;
  const plane = (k) => Array.from({ length: h }, (_, r) => Array.from({ length: w }, (_, c) => e.values[k * h * w + r * w + c]));
  const maps = (channels) => {
    if (!perPixel) return [["sum", pixelMap(e, names, Array.from({ length: h }, () => new Array(w).fill(0)), parameters)]];
    if (channels === "each") return [0, 1, 2].map((k) => ["rgb"[k], plane(k)]);
    if (channels !== "sum") return [[channels, plane("rgb".indexOf(channels))]];
    const [r, g, b] = [0, 1, 2].map(plane);
    return [["sum", r.map((row, i) => row.map((v, j) => v + g[i][j] + b[i][j]))]];
  };
  const panels = el("div", { class: "panels", "data-testid": "heatmaps" });
  const draw = (channels) => {
    const shown = maps(channels);
    const limit = Math.max(...shown.map(([, g]) => Math.max(...g.flat().map(Math.abs)))) || 1;
    panels.replaceChildren(...shown.map(([name, g]) => el("figure", {}, colourCanvas(rgb, g, limit, edges, name),
      el("figcaption", { class: "muted", text: name === "sum" ? (perPixel ? "summed over channels" : "") : `${name} channel` }))));
    panels.append(el("p", { class: "legend" }, el("span", { class: "pos", text: "red raises" }), " the output, ",
      el("span", { class: "neg", text: "blue lowers" }), ` it (±${fmt(limit)} opaque)`));
  };
  draw("sum");
  if (!perPixel) return panels;
  const select = el("select", { "data-testid": "channels" }, ...[["sum", "sum of channels"], ["r", "red"], ["g", "green"], ["b", "blue"], ["each", "each channel"]]
    .map(([v, t]) => el("option", { value: v, text: t })));
  select.onchange = () => draw(select.value);
  return el("div", {}, el("label", { class: "inline" }, "channels", select), panels);
}

// the three most probable classes of an image (OIP infer on the model that explained it)
async function topClasses(data) {
  const meta = state.model;
  if (!meta || meta.task !== "classification" || meta.modality !== "image") return "";
  const tensor = meta.inputs[0];
  const body = { inputs: [{ name: tensor.name, shape: [1, ...tensor.shape.slice(1)], datatype: tensor.datatype, data: data.flat(3) }] };
  const answer = await api(`/v2/models/${encodeURIComponent(meta.name)}/infer`, { method: "POST", body: JSON.stringify(body) });
  const p = answer.outputs[0].data.flat(3);
  const best = p.map((_, i) => i).sort((a, b) => p[b] - p[a]).slice(0, 3);
  return best.map((i) => `${meta.output_names[i]}: ${(100 * p[i]).toFixed(1)}%`).join(" · ");
}

// grid null: the image alone (dark ink on white); else the attributions over a faint copy
function heatmap(image, grid, legend = true) {
  const h = image.length, w = image[0].length;
  const cell = Math.max(4, Math.floor(240 / Math.max(h, w)));
  const flat = image.flat();
  const lo = Math.min(...flat), hi = Math.max(...flat);
  const width = w * cell + (legend ? 70 : 0);
  const root = svg("svg", { width, height: h * cell, viewBox: `0 0 ${width} ${h * cell}`, "data-testid": grid ? "heatmap" : "original" });
  for (let r = 0; r < h; r++) for (let c = 0; c < w; c++) {
    const g = Math.round(255 * (1 - (hi > lo ? (image[r][c] - lo) / (hi - lo) : 0)));
    root.append(svg("rect", { x: c * cell, y: r * cell, width: cell, height: cell, fill: `rgb(${g},${g},${g})`, opacity: grid ? 0.25 : 1 }));
  }
  if (!grid) return root;
  const limit = Math.max(...grid.flat().map(Math.abs)) || 1;
  for (let r = 0; r < h; r++) for (let c = 0; c < w; c++) {
    root.append(svg("rect", { class: "heat-cell", x: c * cell, y: r * cell, width: cell, height: cell,
      fill: colour(grid[r][c], limit, 0.9), "data-value": grid[r][c] }, title(`(${r}, ${c}) pixel ${fmt(image[r][c])}, attribution ${fmt(grid[r][c])}`)));
  }
  const x0 = w * cell + 12;
  if (!legend) return root;
  for (let i = 0; i <= 20; i++) {
    const v = limit * (1 - i / 10);
    root.append(svg("rect", { x: x0, y: (i * h * cell) / 21, width: 12, height: (h * cell) / 21 + 1, fill: colour(v, limit) }));
  }
  root.append(svg("text", { x: x0 + 16, y: 10 }, `+${fmt(limit)}`), svg("text", { x: x0 + 16, y: h * cell - 2 }, `-${fmt(limit)}`));
  return root;
}

function topPlayers(names, values, errors) {
  const order = values.map((_, i) => i).sort((a, b) => Math.abs(values[b]) - Math.abs(values[a]));
  const rows = order.slice(0, MAX_BARS).map((i) => ({ name: names[i], value: values[i], error: errors ? errors[i] : null }));
  if (order.length > MAX_BARS) {
    rows.push({ name: `${order.length - MAX_BARS} other players`, value: order.slice(MAX_BARS).reduce((s, i) => s + values[i], 0), error: null });
  }
  return rows;
}

function barChart(names, values, errors) {
  const rows = topPlayers(names, values, errors);
  const rowH = 18, labelW = 150, plotW = 320, margin = 60, width = labelW + plotW + 2 * margin;
  const limit = Math.max(...rows.map((r) => Math.abs(r.value) + (r.error || 0))) || 1;
  const x = (v) => labelW + margin + plotW / 2 + (v / limit) * (plotW / 2);
  const root = svg("svg", { width, height: rows.length * rowH + 10, viewBox: `0 0 ${width} ${rows.length * rowH + 10}`, "data-testid": "bars" });
  rows.forEach((row, i) => {
    const y = i * rowH + 4;
    root.append(svg("text", { x: labelW - 6, y: y + 12, "text-anchor": "end" }, row.name.length > 22 ? `${row.name.slice(0, 21)}…` : row.name));
    root.append(svg("rect", { class: "bar", x: Math.min(x(0), x(row.value)), y, width: Math.max(1, Math.abs(x(row.value) - x(0))), height: rowH - 4,
      fill: row.value >= 0 ? "var(--pos)" : "var(--neg)", "data-player": row.name, "data-value": row.value }, title(`${row.name}: ${fmt(row.value)}${row.error ? ` ± ${fmt(row.error)}` : ""}`)));
    if (row.error) root.append(svg("line", { x1: x(row.value - row.error), x2: x(row.value + row.error), y1: y + 7, y2: y + 7, stroke: "#333" }));
    root.append(svg("text", { x: row.value >= 0 ? x(row.value) + 4 : x(row.value) - 4, y: y + 12, "text-anchor": row.value >= 0 ? "start" : "end" }, fmt(row.value)));
  });
  root.append(svg("line", { x1: x(0), x2: x(0), y1: 0, y2: rows.length * rowH + 6, stroke: "#333" }));
  return root;
}

// shap's waterfall: the base value at the bottom, the largest contribution on top, f(x) at the end
function waterfall(names, e) {
  const rows = topPlayers(names, e.values, null);
  let level = e.base_value;
  const steps = rows.slice().reverse().map((r) => { const s = { ...r, start: level, end: level + r.value }; level += r.value; return s; }).reverse();
  const all = steps.flatMap((s) => [s.start, s.end]).concat([e.base_value, e.instance_output_value]);
  const lo = Math.min(...all), hi = Math.max(...all);
  const rowH = 18, labelW = 150, plotW = 320;
  const x = (v) => labelW + ((v - lo) / (hi - lo || 1)) * plotW;
  const height = (steps.length + 2) * rowH + 10;
  const root = svg("svg", { width: labelW + plotW + 70, height, viewBox: `0 0 ${labelW + plotW + 70} ${height}`, "data-testid": "waterfall" });
  root.append(svg("text", { x: labelW - 6, y: 14, "text-anchor": "end" }, `f(x) = ${fmt(e.instance_output_value)}`));
  root.append(svg("line", { x1: x(e.instance_output_value), x2: x(e.instance_output_value), y1: 2, y2: height, stroke: "#999", "stroke-dasharray": "3 3" }));
  steps.forEach((s, i) => {
    const y = (i + 1) * rowH + 4;
    root.append(svg("text", { x: labelW - 6, y: y + 12, "text-anchor": "end" }, s.name.length > 22 ? `${s.name.slice(0, 21)}…` : s.name));
    root.append(svg("rect", { class: "step", x: Math.min(x(s.start), x(s.end)), y, width: Math.max(1, Math.abs(x(s.end) - x(s.start))), height: rowH - 4,
      fill: s.value >= 0 ? "var(--pos)" : "var(--neg)" }, title(`${s.name}: ${fmt(s.value)} (${fmt(s.start)} → ${fmt(s.end)})`)));
    root.append(svg("text", { x: Math.max(x(s.start), x(s.end)) + 4, y: y + 12 }, `${s.value >= 0 ? "+" : ""}${fmt(s.value)}`));
  });
  root.append(svg("text", { x: labelW - 6, y: (steps.length + 1) * rowH + 16, "text-anchor": "end" }, `E[f(x)] = ${fmt(e.base_value)}`));
  root.append(svg("line", { x1: x(e.base_value), x2: x(e.base_value), y1: rowH, y2: height, stroke: "#999", "stroke-dasharray": "3 3" }));
  return root;
}

// the text that spans' offsets point into: the instance itself, or one of the request's own
// string fields (an LM's context, a query)
function sourceText(spans, candidates) {
  return candidates.find((t) => typeof t === "string" && spans.every((p) =>
    typeof p.start === "number" && typeof p.end === "number" && (p.text === undefined || t.slice(p.start, p.end) === p.text))) ?? null;
}

function requestStrings(request) {
  const body = (request && request.body) || {};
  return Object.values(body).filter((v) => typeof v === "string");
}

function highlightSpans(text, spans, values) {
  const limit = Math.max(...values.map(Math.abs)) || 1;
  const box = el("div", { class: "highlight", "data-testid": "highlight" });
  const word = (p, i) => el("span", { class: "word", "data-value": values[i], style: `background:${colour(values[i], limit, 0.8)}`,
    title: fmt(values[i]), text: text === null ? p.text : text.slice(p.start, p.end) });
  if (text === null) {
    spans.forEach((p, i) => box.append(word(p, i), " "));
  } else {
    const order = spans.map((_, i) => i).sort((a, b) => spans[a].start - spans[b].start);
    let at = 0;
    for (const i of order) {
      const p = spans[i];
      if (p.start < at) continue; // overlapping spans: the first one wins
      if (p.start > at) box.append(text.slice(at, p.start));
      box.append(word(p, i));
      at = p.end;
    }
    if (at < text.length) box.append(text.slice(at));
  }
  return el("div", {}, box, el("p", { class: "legend" }, el("span", { class: "pos", text: "red raises" }), " the output, ", el("span", { class: "neg", text: "blue lowers" }), " it"));
}

function highlight(e, request) {
  const text = sourceText(e.players, [e.data, ...requestStrings(request)]);
  return highlightSpans(text, e.players, e.values);
}

function interactionMatrix(names, inter) {
  const n = names.length;
  const m = Array.from({ length: n }, () => new Array(n).fill(0));
  for (const [key, v] of Object.entries(inter.values)) {
    const idx = key.split(",").filter((s) => s !== "").map(Number);
    if (idx.length === 1) m[idx[0]][idx[0]] = v;
    else if (idx.length === 2) { m[idx[0]][idx[1]] = v; m[idx[1]][idx[0]] = v; }
  }
  const cell = Math.max(10, Math.min(28, Math.floor(360 / n))), labelW = 110;
  const limit = Math.max(...m.flat().map(Math.abs)) || 1;
  const root = svg("svg", { width: labelW + n * cell + 10, height: labelW + n * cell + 10, "data-testid": "interactions" });
  names.forEach((name, i) => {
    root.append(svg("text", { x: labelW - 4, y: labelW + i * cell + cell * 0.7, "text-anchor": "end" }, name.slice(0, 16)));
    root.append(svg("text", { transform: `translate(${labelW + i * cell + cell * 0.7},${labelW - 4}) rotate(-60)` }, name.slice(0, 16)));
  });
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
    root.append(svg("rect", { class: "cell", x: labelW + j * cell, y: labelW + i * cell, width: cell - 1, height: cell - 1, fill: colour(m[i][j], limit) },
      title(`${names[i]} × ${names[j]}: ${fmt(m[i][j])}`)));
  }
  return root;
}

// explainer-specific outputs: matrices as images, per-player lists as bars, records as tables
function renderDetails(details, names, request, instanceImage, instanceText) {
  const box = el("div", { class: "details" }, el("h4", { text: "Details" }));
  const documents = request && request.body && Array.isArray(request.body.documents) ? request.body.documents : null;
  for (const [key, value] of Object.entries(details)) {
    if (key === "segments" && instanceImage) continue; // drawn on the heatmap
    let image = imageOf(value);
    if (!image && instanceImage && Array.isArray(value) && value.length && value.every((v) => typeof v === "number")) {
      const h = instanceImage.length, w = instanceImage[0].length; // a flat image, e.g. UNI's baseline
      if (value.length % (h * w) === 0) {
        const planes = value.length / (h * w);
        image = Array.from({ length: h }, (_, r) => Array.from({ length: w }, (_, c) => {
          let sum = 0;
          for (let k = 0; k < planes; k++) sum += value[k * h * w + r * w + c];
          return sum / planes;
        }));
      }
    }
    if (image) {
      box.append(chart(`${key} (image)`, heatmap(image, null, false)));
    } else if (key === "ranking" && documents && Array.isArray(value) && value.every(Number.isInteger)) {
      box.append(chart("Ranking", rankingTable(value, documents, details.scores)));
    } else if (Array.isArray(value) && value.length && value.every((v) => typeof v === "string")) {
      box.append(el("div", {}, el("strong", { text: `${key}: ` }), value.join(" · ")));
    } else if (Array.isArray(value) && value.length && value.every((v) => typeof v === "number")) {
      const labels = value.length === names.length ? names : value.map((_, i) => String(i));
      box.append(chart(key, barChart(labels, value, null)));
    } else if (Array.isArray(value) && value.length && value.every((v) => v && typeof v === "object" && !Array.isArray(v))) {
      const valueKey = ["value", "attribution", "score", "importance"].find((k) => value.every((v) => typeof v[k] === "number"));
      const text = valueKey ? sourceText(value, [instanceText, ...requestStrings(request)]) : null;
      if (text !== null) box.append(chart(`${key} (highlighted)`, highlightSpans(text, value, value.map((v) => v[valueKey]))));
      box.append(chart(key, recordTable(value, request)));
    } else {
      box.append(el("div", {}, el("strong", { text: `${key}: ` }), typeof value === "object" ? el("pre", { text: JSON.stringify(value, null, 2) }) : String(value)));
    }
  }
  return box;
}

// ranking[i]: the document at position i (0 = top); scores: one per document, in input order
function rankingTable(ranking, documents, scores) {
  const rows = ranking.map((doc, pos) => el("tr", {}, el("td", { text: String(pos + 1) }),
    el("td", { text: documents[doc] ?? `document ${doc}` }),
    el("td", { text: Array.isArray(scores) && typeof scores[doc] === "number" ? fmt(scores[doc]) : "" })));
  return el("table", { class: "records", "data-testid": "ranking" },
    el("thead", {}, el("tr", {}, el("th", { text: "rank" }), el("th", { text: "document" }), el("th", { text: "score" }))),
    el("tbody", {}, ...rows));
}

function recordTable(records, request) {
  const columns = [...new Set(records.flatMap((r) => Object.keys(r)))];
  const numeric = columns.filter((c) => records.every((r) => typeof r[c] === "number" || r[c] === undefined));
  const limits = Object.fromEntries(numeric.map((c) => [c, Math.max(...records.map((r) => Math.abs(r[c] || 0))) || 1]));
  const table = el("table", { class: "records" }, el("thead", {}, el("tr", {}, ...columns.map((c) => el("th", { text: c })))));
  const body = el("tbody");
  for (const r of records.slice(0, 100)) {
    body.append(el("tr", {}, ...columns.map((c) => {
      const v = r[c];
      const cellText = typeof v === "number" ? fmt(v) : typeof v === "object" ? JSON.stringify(v) : String(v ?? "");
      const shade = /value|score|attribution|delta|change/i.test(c) && typeof v === "number" ? `background:${colour(v, limits[c], 0.6)}` : null;
      return el("td", { style: shade, text: cellText });
    })));
  }
  table.append(body);
  return table;
}


// ------------------------------------------------------------------ compare

// Spearman's rank correlation (average ranks for ties)
function spearman(a, b) {
  const rank = (x) => {
    const order = x.map((_, i) => i).sort((i, j) => x[i] - x[j]);
    const r = new Array(x.length);
    for (let k = 0; k < order.length;) {
      let e = k;
      while (e + 1 < order.length && x[order[e + 1]] === x[order[k]]) e++;
      for (let t = k; t <= e; t++) r[order[t]] = (k + e) / 2;
      k = e + 1;
    }
    return r;
  };
  const ra = rank(a), rb = rank(b), mean = (a.length - 1) / 2;
  let num = 0, da = 0, db = 0;
  for (let i = 0; i < a.length; i++) {
    num += (ra[i] - mean) * (rb[i] - mean); da += (ra[i] - mean) ** 2; db += (rb[i] - mean) ** 2;
  }
  return da > 0 && db > 0 ? num / Math.sqrt(da * db) : NaN;
}

function topK(names, values, k) {
  return new Set(values.map((_, i) => i).sort((i, j) => Math.abs(values[j]) - Math.abs(values[i])).slice(0, k).map((i) => names[i]));
}

// the two explanations' values on their common players, by name (in A's order)
function agreement(namesA, valuesA, namesB, valuesB) {
  const at = new Map(namesB.map((n, i) => [n, i]));
  const common = namesA.map((n, i) => [n, i, at.get(n)]).filter(([, , j]) => j !== undefined);
  const a = common.map(([, i]) => valuesA[i]), b = common.map(([, , j]) => valuesB[j]);
  const names = common.map(([n]) => n);
  const k = Math.min(5, names.length);
  const ta = topK(names, a, k), tb = topK(names, b, k);
  const overlap = [...ta].filter((n) => tb.has(n)).length;
  const signs = a.filter((v, i) => Math.sign(v) === Math.sign(b[i])).length;
  return { n: names.length, rho: spearman(a, b), k, overlap, signs, onlyA: [...ta].filter((n) => !tb.has(n)), onlyB: [...tb].filter((n) => !ta.has(n)) };
}

function describe(body) {
  const e = body.data.explanations[0];
  return `${body.meta.explainer} · ${e.output_name} · budget ${body.meta.budget.toLocaleString("en")}`;
}

async function compare() {
  let a, b;
  try {
    a = buildRequest();
    b = { explainer: $("compare-explainer").value || a.explainer, body: { ...a.body, parameters: { ...a.body.parameters } } };
    if (b.explainer !== a.explainer) { // options and fields belong to A's explainer
      b.body = { inputs: a.body.inputs, seed: a.body.seed, parameters: {} };
      for (const k of ["target", "budget"]) if (k in a.body) b.body[k] = a.body[k];
      if (a.body.parameters.evaluate) b.body.parameters.evaluate = a.body.parameters.evaluate;
    }
    if ($("compare-target").value !== "") b.body.target = Number($("compare-target").value);
    if ($("compare-budget").value.trim() !== "" || $("compare-budget").validity.badInput) b.body.budget = numberOf($("compare-budget"), "budget of B");
  } catch (err) { setStatus(`bad input: ${err.message}`, true); return; }
  if (JSON.stringify(a) === JSON.stringify(b)) { setStatus("choose another explainer, target or budget for B", true); return; }
  const model = encodeURIComponent(state.model.name);
  const run = (r) => api(`/v2/models/${model}/explain/${r.explainer}`, { method: "POST", body: JSON.stringify(r.body) });
  setStatus("comparing…");
  $("result").dataset.state = "loading";
  const started = performance.now();
  try {
    const A = withInputs(await run(a), a);
    const B = withInputs(await run(b), b);
    state.last = A;
    state.lastRequest = a;
    renderComparison(A, a, B, b);
    setStatus(`compared in ${duration(performance.now() - started)}`);
    $("result").dataset.state = "done";
  } catch (err) {
    setStatus(err.message, true);
    $("result").dataset.state = "error";
  }
}

function renderComparison(A, a, B, b) {
  const [ea, eb] = [A.data.explanations[0], B.data.explanations[0]];
  const g = agreement(playerNames(ea, A.data.feature_names), ea.values, playerNames(eb, B.data.feature_names), eb.values);
  const facts = g.n < 2 ? el("p", { class: "muted", text: "fewer than two common players: nothing to rank" })
    : el("p", {}, el("strong", { text: `Spearman ρ = ${fmt(g.rho)}` }), ` · top-${g.k} overlap ${g.overlap}/${g.k} · same sign on ${g.signs}/${g.n} players`,
      g.onlyA.length ? ` · only in A's top ${g.k}: ${g.onlyA.join(", ")}; only in B's: ${g.onlyB.join(", ")}` : "");
  $("summary").replaceChildren(el("h2", { text: `${A.model_name} · A vs B` }),
    el("div", { class: "agreement", "data-testid": "agreement", "data-spearman": String(g.rho), "data-overlap": String(g.overlap), "data-k": String(g.k) }, facts));
  $("downloads").hidden = true;
  const side = (label, body, request) => el("div", { class: "side", "data-side": label },
    el("h3", { text: `${label}: ${describe(body)}` }),
    el("p", { class: "muted", text: `${body.meta.exact ? "exact" : "estimated"} · ${body.meta.n_model_evals.toLocaleString("en")} model evaluations · ${duration(body.meta.compute_ms)}` }),
    renderExplanation(body.data.explanations[0], 0, body.data.feature_names, body.meta, request));
  $("explanations").replaceChildren(el("div", { class: "compare", "data-testid": "compare" }, side("A", A, a), side("B", B, b)));
}

// ------------------------------------------------------------------ job view

async function fetchBlob(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body.error ? `${body.error} (${body.code})` : `HTTP ${response.status}`);
  }
  return response.blob();
}

async function saveAs(path, name) {
  try {
    const a = el("a", { href: URL.createObjectURL(await fetchBlob(path)), download: name });
    document.body.append(a);
    a.click();
    a.remove();
  } catch (err) { setStatus(err.message, true); }
}

function plotImage(path, alt) {
  const img = el("img", { alt, class: "global-plot" });
  const box = el("div", { class: "chart" }, img);
  img.load = (url) => { img.dataset.loaded = "false"; return fetchBlob(url).then((blob) => { img.src = URL.createObjectURL(blob); img.dataset.loaded = "true"; })
    .catch((err) => box.replaceChildren(el("p", { class: "error", text: err.message }))); };
  img.load(path);
  return box;
}

function percent(x) { return `${Math.round(100 * x)}%`; }

// a job's final statuses (GET /v2/jobs/{id}): succeeded_with_errors finished with some rows failed
const FINISHED = ["succeeded", "succeeded_with_errors", "failed", "cancelled"];
const STATUS_CLASS = { failed: "error", succeeded_with_errors: "warning" };

// why a finished audit has no global plot: every row failed (the job's message), it was
// cancelled or failed as a whole, or its players differ per instance (text)
function noPlotReason(job, s) {
  const explained = typeof s.instances === "number" ? s.instances - (s.errors || 0) : 0;
  if (!explained) {
    const first = (s.first_errors || [])[0];
    const reason = job.error || (first ? `row ${first.index}: ${first.error} (${first.code})`
      : job.status === "cancelled" ? "the job was cancelled" : "no instance was explained");
    return `no global plot: no instance was explained: ${reason}`;
  }
  const model = state.models.find((m) => m.name === job.model);
  if ((model && model.modality === "text") || (s.per_class && !s.feature_names)) {
    return "no global plot: the players of a text audit differ per instance";
  }
  return "no global plot: the summary names no features";
}

async function showJob(id) {
  const box = $("job-view");
  box.hidden = false;
  box.dataset.job = id;
  box.dataset.state = "loading";
  delete box.dataset.status;
  for (const tr of $("jobs").tBodies[0].rows) tr.classList.toggle("selected", tr.dataset.job === id);
  let job;
  try { job = await api(`/v2/jobs/${id}`); } catch (err) { box.replaceChildren(el("p", { class: "error", text: err.message })); return; }
  const base = `/v2/jobs/${encodeURIComponent(id)}`;
  const s = job.summary || {};
  const took = job.finished_at && job.started_at ? ` · ${duration(1000 * (job.finished_at - job.started_at))}` : "";
  const parts = [el("h3", { text: `Job ${id.slice(0, 12)} · ${job.kind} · ${job.model} · ${job.status}${took}` })];
  if (job.error) parts.push(el("p", { class: "error", "data-testid": "job-error", text: job.error }));
  const finished = FINISHED.includes(job.status);
  box.dataset.status = job.status;
  if (job.kind !== "audit" || !finished) {
    parts.push(el("p", { class: "muted", text: finished ? "" : "the results show here when the job has finished" }));
    if (job.summary) parts.push(el("pre", { text: JSON.stringify(job.summary, null, 2) }));
    box.replaceChildren(...parts);
    box.dataset.state = "done";
    return;
  }
  if (typeof s.instances === "number") {
    const failed = s.errors || 0;
    parts.push(el("p", { "data-testid": "job-counts", "data-errors": String(failed), "data-instances": String(s.instances) },
      `${s.instances} instances · `, el("span", { class: failed ? "error" : null, text: `${failed} failed` }),
      ` · ${s.cache_hits ?? 0} from the cache`));
  }
  if (s.first_errors && s.first_errors.length) {
    parts.push(el("ul", { class: "warnings", "data-testid": "job-errors" }, ...s.first_errors.map((e) =>
      el("li", { class: "error", "data-index": String(e.index), "data-code": e.code || "" },
        el("strong", { text: `row ${e.index}` }), `: ${e.error} (${e.code})`)),
      s.errors > s.first_errors.length ? el("li", { class: "muted", text: `and ${s.errors - s.first_errors.length} more (the results' error column)` }) : null));
  }
  const warnings = Object.entries(s.warnings || {});
  const explained = (s.instances || 0) - (s.errors || 0);
  if (explained > 0) parts.push(warnings.length
    ? el("ul", { class: "warnings", "data-testid": "job-warnings" }, ...warnings.map(([code, n]) =>
      el("li", { class: "warning", "data-code": code, "data-count": String(n) }, el("strong", { text: code.replaceAll("_", " ") }), `: ${n} of ${s.instances} instances`)))
    : el("p", { class: "muted", "data-testid": "job-warnings", text: "no warnings on any instance" }));
  if (s.top_features) {
    const boot = s.top_features_bootstrap;
    parts.push(el("p", { "data-testid": "stability" },
      el("strong", { text: `Top features: ${s.top_features.join(", ")}` }),
      ` · the instance's top feature is the audit's in ${percent(s.top1_agreement)} of instances · top-${s.top_features.length} Jaccard ${fmt(s.topk_jaccard)}`,
      boot ? ` · the same top ${s.top_features.length} in ${percent(boot.same_top_k)} of ${boot.resamples} bootstrap resamples (${Object.entries(boot.in_top_k).slice(0, 6).map(([n, p]) => `${n} ${percent(p)}`).join(", ")})` : ""));
  }
  const perClass = Object.entries(s.per_class || {});
  if (perClass.length === 1) {
    parts.push(el("p", { "data-testid": "per-class" }, `Every instance explains ${perClass[0][0]}.`));
  } else if (perClass.length) {
    const cells = perClass.map(([name, c]) => el("div", { class: "chart", "data-class": name },
      el("h4", { text: `${name}: ${c.instances} instances` }),
      c.mean_abs_value && s.feature_names ? barChart(s.feature_names, c.mean_abs_value, null) : null));
    parts.push(el("h4", { text: "Per explained class (mean |value|)" }), el("div", { class: "charts", "data-testid": "per-class" }, ...cells));
  }
  if (s.feature_names) {
    const feature = el("select", { id: "dependence-feature" }, ...s.feature_names.map((n) => el("option", { value: n, text: n })));
    feature.value = s.top_features ? s.top_features[0] : s.feature_names[0];
    const dependence = plotImage(`${base}/plot?kind=dependence&format=svg&feature=${encodeURIComponent(feature.value)}`, "dependence plot");
    feature.onchange = () => dependence.querySelector("img").load(`${base}/plot?kind=dependence&format=svg&feature=${encodeURIComponent(feature.value)}`);
    parts.push(el("div", { class: "charts", "data-testid": "global-plots" },
      plotImage(`${base}/plot?kind=summary&format=svg`, "summary plot"),
      plotImage(`${base}/plot?kind=beeswarm&format=svg`, "beeswarm plot"),
      el("div", {}, el("label", {}, "Dependence on", feature), dependence)));
  } else {
    parts.push(el("p", { class: "muted", "data-testid": "no-global-plot", text: noPlotReason(job, s) }));
  }
  const name = `${job.model}-${id.slice(0, 12)}`;
  parts.push(el("div", { class: "downloads", "data-testid": "job-downloads" }, "Download results: ",
    el("button", { type: "button", onclick: () => saveAs(`${base}/results?format=csv`, `${name}.csv`) }, "CSV"),
    el("button", { type: "button", onclick: () => saveAs(`${base}/results?format=parquet`, `${name}.parquet`) }, "Parquet"),
    el("button", { type: "button", onclick: () => saveAs(`${base}/results`, `${name}.jsonl`) }, "JSON lines")));
  box.replaceChildren(...parts);
  box.dataset.state = "done";
}

// ------------------------------------------------------------------ jobs

async function submitJob() {
  let request;
  try { request = buildRequest(); } catch (err) { setStatus(`bad input: ${err.message}`, true); return; }
  const body = { ...request.body, model: state.model.name, explainer: request.explainer };
  if (!body.inputs) { // explainers whose own fields describe the instance: one dict per instance
    const fields = readFields("field");
    for (const k of Object.keys(fields)) delete body[k];
    body.inputs = [fields];
  }
  try {
    const job = await api("/v2/jobs", { method: "POST", body: JSON.stringify(body) });
    setStatus(`job ${job.id} submitted`);
    pollJobs(true);
  } catch (err) {
    setStatus(err.message, true);
  }
}

let pollTimer = null;
async function pollJobs(once = false) {
  if (pollTimer && !once) return;
  try {
    const jobs = await api("/v2/jobs?limit=20");
    $("jobs").tBodies[0].replaceChildren(...jobs.map((j) => el("tr", { "data-job": j.id, "data-status": j.status,
      class: j.id === $("job-view").dataset.job ? "selected" : null, title: "show this job", onclick: () => showJob(j.id) },
      el("td", { text: j.id.slice(0, 12) }), el("td", { text: j.kind }), el("td", { text: j.model }),
      el("td", { text: j.status, class: STATUS_CLASS[j.status] || null, title: j.error || "" }),
      el("td", {}, el("progress", { max: String(Math.max(1, j.progress.total)), value: String(j.progress.done) }),
        ` ${j.progress.done}/${j.progress.total}${j.progress.eta_s ? ` · ${Math.round(j.progress.eta_s)} s left` : ""}`),
      el("td", { text: new Date(j.created_at * 1000).toLocaleTimeString() }))));
    // the job on view was unfinished and has finished since: show its results
    const view = $("job-view");
    const shown = jobs.find((j) => j.id === view.dataset.job);
    if (shown && view.dataset.state === "done" && view.dataset.status && !FINISHED.includes(view.dataset.status)
        && FINISHED.includes(shown.status)) showJob(shown.id);
  } catch (err) {
    $("jobs").tBodies[0].replaceChildren(el("tr", {}, el("td", { colspan: "6", class: "muted", text: `jobs: ${err.message}` })));
  }
  if (!once) pollTimer = setInterval(() => { if (!document.hidden) pollJobs(true); }, 2000);
}

init();
