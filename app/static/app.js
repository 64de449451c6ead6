// The service's own explorer: plain DOM and SVG, no libraries, no network beyond this server.
// Everything is driven by the service's own descriptions (GET /v2/models, /v2/explainers and
// /openapi.json), so a new explainer or model shows up here without a change to this file.
"use strict";

const COMMON_FIELDS = new Set(["inputs", "target", "seed", "budget", "background", "id", "parameters"]);
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

function fmt(x) {
  if (typeof x !== "number" || !isFinite(x)) return String(x);
  const a = Math.abs(x);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? x.toExponential(2) : x.toPrecision(4).replace(/\.?0+$/, "");
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
  const first = state.models.find((m) => m.state === "ready");
  const wanted = new URLSearchParams(location.search).get("model");
  select.value = (state.models.find((m) => m.name === wanted) || first || {}).name || "";
  select.onchange = () => loadModel(select.value);
  $("explainer").onchange = () => loadExplainer($("explainer").value);
  $("explain").onclick = explain;
  $("submit-job").onclick = submitJob;
  for (const b of $("downloads").querySelectorAll("button")) b.onclick = () => download(b.dataset.format);
  if (select.value) await loadModel(select.value);
  pollJobs();
}

async function loadModel(name) {
  const [meta, examples] = await Promise.all([
    api(`/v2/models/${encodeURIComponent(name)}`),
    api(`/v2/models/${encodeURIComponent(name)}/examples?n=10`).catch(() => ({ instances: [] })),
  ]);
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
    const inputs = meta.feature_names.map((f) => el("input", { type: "number", step: "any", "data-feature": f, value: "0" }));
    const apply = (row) => inputs.forEach((input, i) => { input.value = fmt(row[i]); });
    box.append(el("div", { class: "table-form" }, ...meta.feature_names.map((f, i) => el("label", {}, f, inputs[i]))), exampleButton(apply));
    if (ex.instances.length) { apply(ex.instances[0]); next = 1; }
  } else if (shape.length >= 2) {
    const top = Array.isArray(ex.max) ? Math.max(...ex.max.flat(3)) : 1;
    const pad = drawingPad(shape, top);
    const plane = (x) => (shape.length === 3 ? x[0] : x);
    box.append(pad, exampleButton((x) => pad.querySelector("canvas").setValue(plane(x))));
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

function readInstance() {
  const row = [...document.querySelectorAll("[data-feature]")];
  if (row.length) return row.map((i) => Number(i.value));
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
    input = el("select", attrs, ...(required ? [] : [el("option", { value: "", text: s.default !== undefined ? `default (${s.default})` : "default" })]),
      ...s.enum.map((v) => el("option", { value: JSON.stringify(v), text: String(v) })));
    input.dataset.kind = "json";
  } else if (s.type === "boolean") {
    input = el("select", attrs, el("option", { value: "", text: `default (${s.default})` }),
      el("option", { value: "true", text: "true" }), el("option", { value: "false", text: "false" }));
    input.dataset.kind = "json";
  } else if (s.type === "integer" || s.type === "number") {
    input = el("input", { ...attrs, type: "number", step: s.type === "integer" ? "1" : "any",
      min: s.minimum ?? s.exclusiveMinimum, max: s.maximum ?? s.exclusiveMaximum, placeholder: s.default !== undefined ? String(s.default) : "" });
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

function renderOptions(schema) {
  state.optionsSchema = schema;
  const props = Object.entries(schema.properties || {});
  $("options").replaceChildren(...props.map(([k, s]) => fieldInput(k, mainType(s, schema), false, "option", schema)));
}

function readFields(role) {
  const out = {};
  for (const input of document.querySelectorAll(`[data-role=${role}]`)) {
    const raw = input.value.trim();
    if (raw === "") continue;
    const kind = input.dataset.kind;
    if (kind === "number") out[input.dataset.name] = Number(raw);
    else if (kind === "string") out[input.dataset.name] = input.value;
    else if (kind === "lines") out[input.dataset.name] = raw.split("\n").map((x) => x.trim()).filter(Boolean);
    else out[input.dataset.name] = JSON.parse(raw);
  }
  return out;
}

function buildRequest() {
  const explainer = $("explainer").value;
  const schema = requestSchema(explainer);
  const body = { seed: Number($("seed").value || 0), parameters: readFields("option"), ...readFields("field") };
  if ((schema.required || []).includes("inputs")) {
    const json = $("json-input");
    body.inputs = json ? JSON.parse(json.value) : [readInstance()];
  }
  if ($("target").value !== "") body.target = Number($("target").value);
  if ($("budget").value !== "") body.budget = Number($("budget").value);
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
    state.last = body;
    state.lastRequest = request;
    renderResult(body, request);
    setStatus(`done in ${Math.round(performance.now() - started)} ms (cache ${body.meta.cache})`);
    $("result").dataset.state = "done";
  } catch (err) {
    setStatus(err.message, true);
    $("result").dataset.state = "error";
  }
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
    el("p", { class: "muted", text: `request ${body.id} · ${m.exact ? "exact" : "estimated"} · ${m.n_model_evals} model evaluations · ${fmt(m.compute_ms)} ms · cache ${m.cache}${m.additive === false ? " · not additive" : ""}` }),
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
  const head = el("h3", { text: `#${index} · ${e.output_name}: ${fmt(e.instance_output_value)} (base ${fmt(e.base_value)}, ${how})` });
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
  if (e.players) charts.append(chart("Highlighted text", highlight(e, request)));
  if (grid) charts.append(chart("Heatmap on the image", heatmap(image, grid)));
  if (!grid || names.length <= 64) charts.append(chart("Attributions", barChart(names, e.values, e.error_std)));
  if (meta.additive !== false && names.length > 1 && !e.players && !grid) charts.append(chart("Waterfall", waterfall(names, e)));
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
  const size = parameters.patch_size;
  const patches = names.map((name) => /^patch_(\d+)_(\d+)$/.exec(name));
  if (size && patches.every(Boolean)) {
    const grid = Array.from({ length: h }, () => new Array(w).fill(0));
    patches.forEach((m, i) => {
      for (let r = +m[1] * size; r < Math.min(h, (+m[1] + 1) * size); r++)
        for (let c = +m[2] * size; c < Math.min(w, (+m[2] + 1) * size); c++) grid[r][c] = e.values[i];
    });
    return grid;
  }
  return null;
}

function heatmap(image, grid, legend = true) {
  const h = image.length, w = image[0].length;
  const cell = Math.max(4, Math.floor(280 / Math.max(h, w)));
  const flat = image.flat();
  const lo = Math.min(...flat), hi = Math.max(...flat);
  const limit = Math.max(...grid.flat().map(Math.abs)) || 1;
  const root = svg("svg", { width: w * cell + 70, height: h * cell, "data-testid": "heatmap" });
  for (let r = 0; r < h; r++) for (let c = 0; c < w; c++) {
    const g = Math.round(255 * (1 - (hi > lo ? (image[r][c] - lo) / (hi - lo) : 0)));
    root.append(svg("rect", { x: c * cell, y: r * cell, width: cell, height: cell, fill: `rgb(${g},${g},${g})` }));
  }
  for (let r = 0; r < h; r++) for (let c = 0; c < w; c++) {
    root.append(svg("rect", { class: "heat-cell", x: c * cell, y: r * cell, width: cell, height: cell,
      fill: colour(grid[r][c], limit, 0.75), "data-value": grid[r][c] }, title(`(${r}, ${c}) pixel ${fmt(image[r][c])}, attribution ${fmt(grid[r][c])}`)));
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
  const root = svg("svg", { width, height: rows.length * rowH + 10, "data-testid": "bars" });
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
  const root = svg("svg", { width: labelW + plotW + 70, height, "data-testid": "waterfall" });
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
      box.append(chart(`${key} (image)`, heatmap(image, image.map((row) => row.map(() => 0)), false)));
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
    $("jobs").tBodies[0].replaceChildren(...jobs.map((j) => el("tr", { "data-job": j.id, "data-status": j.status },
      el("td", { text: j.id.slice(0, 12) }), el("td", { text: j.kind }), el("td", { text: j.model }),
      el("td", { text: j.status, class: j.status === "failed" ? "error" : null, title: j.error || "" }),
      el("td", {}, el("progress", { max: String(Math.max(1, j.progress.total)), value: String(j.progress.done) }),
        ` ${j.progress.done}/${j.progress.total}${j.progress.eta_s ? ` · ${Math.round(j.progress.eta_s)} s left` : ""}`),
      el("td", { text: new Date(j.created_at * 1000).toLocaleTimeString() }))));
  } catch (err) {
    $("jobs").tBodies[0].replaceChildren(el("tr", {}, el("td", { colspan: "6", class: "muted", text: `jobs: ${err.message}` })));
  }
  if (!once) pollTimer = setInterval(() => { if (!document.hidden) pollJobs(true); }, 2000);
}

init();
