"use strict";
const PALETTE = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42a5a5", "#f032e6", "#9a6324", "#808000", "#000075"];
const TOKEN_KEY = "cnsbench-api-token";
const MAX_CLASSES_ALL = 10;
const state = { token: sessionStorage.getItem(TOKEN_KEY) || "", info: null, colors: new Map(), blobs: new Map(), seq: 0 };
const $ = (sel) => document.querySelector(sel);

function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : String(c));  // text nodes: data never becomes markup
  }
  return e;
}
function setStatus(msg, isError) { const s = $("#status"); s.textContent = msg || ""; s.className = isError ? "error" : ""; }
function fmt(x) { return x === null || x === undefined ? "–" : (Math.round(x * 1000) / 1000).toString(); }
function color(name) {
  if (!state.colors.has(name)) state.colors.set(name, PALETTE[state.colors.size % PALETTE.length]);
  return state.colors.get(name);
}
function abbrev(name) { return name.length <= 10 ? name : name.slice(0, 9) + "…"; }
function choiceLabel(c) { return typeof c === "object" && c ? (c.class_name ? `${c.class_name} (${c.class_id})` : JSON.stringify(c)) : String(c); }

async function api(path, options) {
  options = options || {};
  const headers = Object.assign({}, options.headers || {});
  if (state.token) headers["Authorization"] = "Bearer " + state.token;
  const resp = await fetch(path, Object.assign({}, options, { headers }));
  if (resp.status === 401) { $("#token-form").hidden = false; throw new Error("this server needs an API token (top right)"); }
  if (!resp.ok) {
    let detail = resp.statusText;
    try {
      const body = await resp.json();
      detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
      if (body.choices && body.choices.length) detail += "; choices: " + body.choices.map(choiceLabel).join(", ");
    } catch (e) { /* not JSON */ }
    throw new Error(`${resp.status}: ${detail}`);
  }
  return resp;
}
async function getJSON(path) { return (await api(path)).json(); }
function blobURL(path) {
  // Images go through fetch (not <img src>) so that the bearer token is sent with them.
  if (!state.blobs.has(path)) state.blobs.set(path, api(path).then((r) => r.blob()).then((b) => URL.createObjectURL(b)));
  return state.blobs.get(path);
}
function loadInto(img, path) {
  blobURL(path).then((u) => { img.src = u; }).catch((e) => { img.alt = "failed: " + e.message; img.classList.add("broken"); });
}

function legend(box, names) {
  box.replaceChildren(
    h("span", {}, "failure point (first wrong scale) of:"),
    ...names.map((n) => h("span", { class: "key" }, h("span", { class: "swatch", style: "background:" + color(n) }), n)),
    h("span", { class: "key" }, h("span", { class: "swatch", style: "background:#ccc" }), "greyed = removed by the OOC filter"),
  );
}

function tooltip(s, names) {
  const lines = [`${s.sample_id}`, `scale ${fmt(s.scale)} · ${s.kept ? "kept" : "filtered out"}`];
  if (s.scores) {
    lines.push("filter: " + Object.entries(s.scores).map(([k, v]) => `${k}=${fmt(v)}`).join(" ") + (s.n_pass !== null && s.n_pass !== undefined ? ` (pass ${s.n_pass}/4)` : ""));
  }
  for (const n of names) {
    const p = (s.predictions || {})[n];
    if (p) lines.push(`${n}: ${p.top1_name} (${p.top1}) ${p.correct ? "✓" : "✗"} p_true=${fmt(p.p_true)}`);
  }
  return lines.join("\n");
}

// t: {id, title, subtitle, complete, failure_points, samples: [{sample_id, scale, kept, n_pass, scores, predictions, image | src}]}
function renderTrajectory(t, names, showScores) {
  const fps = t.failure_points || {};
  const row = h("div", { class: "traj" + (t.complete ? "" : " incomplete"), "data-trajectory": t.id },
    h("div", { class: "traj-head" }, h("strong", {}, t.title), h("span", { class: "muted" }, t.subtitle),
      t.complete ? h("span", { class: "tag ok" }, "complete") : h("span", { class: "tag" }, t.incompleteNote || "incomplete: not in the metrics")));
  const cells = h("div", { class: "cells" });
  for (const s of t.samples) {
    const failing = names.filter((n) => fps[n] !== null && fps[n] !== undefined && Math.abs(fps[n] - s.scale) < 1e-6);
    const img = h("img", { class: "sample", alt: s.sample_id, "data-sample": s.sample_id, width: 116, height: 116 });
    if (s.src) img.src = s.src; else loadInto(img, s.image);
    const ring = failing.map((n, i) => `0 0 0 ${3 * (i + 1)}px ${color(n)}`).join(", ");
    const dots = names.filter((n) => (s.predictions || {})[n]).map((n) => {
      const p = s.predictions[n];
      return h("span", { class: "dot " + (p.correct ? "right" : "wrong"), style: "border-color:" + color(n), title: `${n}: ${p.top1_name} ${p.correct ? "✓" : "✗"}` });
    });
    cells.append(h("figure", {
      class: "cell" + (s.kept ? "" : " filtered") + (failing.length ? " fails" : ""),
      "data-scale": s.scale, "data-kept": s.kept ? "1" : "0", "data-failing": failing.join(","), title: tooltip(s, names),
    },
      h("div", { class: "frame", style: ring ? "box-shadow:" + ring : "" }, img),
      h("div", { class: "badges" }, failing.map((n) => h("span", { class: "badge", "data-classifier": n, style: "background:" + color(n), title: `${n} fails first at scale ${fmt(s.scale)}` }, abbrev(n)))),
      h("div", { class: "dots" }, dots),
      h("figcaption", {}, `scale ${fmt(s.scale)}` + (s.kept ? "" : " · filtered")),
      showScores && s.scores ? h("div", { class: "scores" }, `pass ${s.n_pass}/4`) : null));
  }
  row.append(cells);
  return row;
}

// ------------------------------------------------------------------ benchmark browser
async function initBrowse(bench) {
  legend($("#legend"), bench.classifiers);
  const data = await getJSON("api/benchmarks/shifts");
  $("#shift").replaceChildren(...data.shifts.map((s) => h("option", { value: s.shift }, `${s.shift} (${s.n_complete}/${s.n_trajectories} complete)`)));
  $("#shift").addEventListener("change", () => onShift().catch((e) => setStatus(e.message, true)));
  $("#class").addEventListener("change", () => loadTrajectories().catch((e) => setStatus(e.message, true)));
  if (data.shifts.length) await onShift();
  else $("#trajectories").replaceChildren(h("p", { class: "note" }, "no committed shards yet"));
}
async function onShift() {
  const shift = $("#shift").value;
  const data = await getJSON("api/benchmarks/classes?shift=" + encodeURIComponent(shift));
  const keep = $("#class").value;
  $("#class").replaceChildren(h("option", { value: "" }, "all classes"),
    ...data.classes.map((c) => h("option", { value: c.class_id }, `${c.class_name} (${c.class_id})`)));
  if ([...$("#class").options].some((o) => o.value === keep)) $("#class").value = keep;
  await loadTrajectories();
}
async function loadTrajectories() {
  const seq = ++state.seq;
  const shift = $("#shift").value, chosen = $("#class").value;
  let classes = chosen ? [chosen] : [...$("#class").options].map((o) => o.value).filter((v) => v !== "");
  const box = $("#trajectories");
  box.dataset.state = "loading";
  const rows = [];
  if (classes.length > MAX_CLASSES_ALL) {
    rows.push(h("p", { class: "note" }, `showing the first ${MAX_CLASSES_ALL} of ${classes.length} classes; pick a class for the others`));
    classes = classes.slice(0, MAX_CLASSES_ALL);
  }
  for (const c of classes) {
    const data = await getJSON(`api/benchmarks/trajectories?shift=${encodeURIComponent(shift)}&class_id=${encodeURIComponent(c)}`);
    if (seq !== state.seq) return;  // a newer selection won
    for (const t of data.trajectories) {
      rows.push(renderTrajectory({
        id: t.trajectory_id, title: `${data.class_name} (${data.class_id})`, subtitle: `seed ${t.seed} · ${t.trajectory_id}`,
        complete: t.complete, failure_points: t.failure_points, samples: t.samples,
      }, data.classifiers, false));
    }
  }
  box.replaceChildren(...rows);
  box.dataset.shift = shift;
  box.dataset.state = "ready";
}

// ------------------------------------------------------------------ report
async function initReport(bench) {
  if (!bench.report) { $("#summary").replaceChildren(h("p", { class: "note" }, "no report yet (cnsbench aggregate)")); return; }
  const m = await getJSON("api/report");
  const cols = ["accuracy_scale0", "fp_avg", "fp_std", "margin_fp_avg", "n_failed", "n_trajectories"];
  $("#summary").replaceChildren(h("table", {},
    h("tr", {}, h("th", {}, "classifier"), cols.map((c) => h("th", {}, c))),
    (m.summary || []).map((r) => h("tr", {}, h("td", {}, h("span", { class: "swatch", style: "background:" + color(r.classifier) }), " ", r.classifier), cols.map((c) => h("td", {}, fmt(r[c])))))));
  $("#plots").replaceChildren(...bench.report_files.filter((f) => f.endsWith(".png")).map((f) => {
    const img = h("img", { class: "plot", alt: f, "data-file": f });
    loadInto(img, "report/" + encodeURIComponent(f));
    return img;
  }));
}

// ------------------------------------------------------------------ live preview
function initPreview(p) {
  $("#pv-class").replaceChildren(...p.classes.map((c) => h("option", { value: c.class_id }, `${c.class_name} (${c.class_id})`)));
  $("#pv-shift").replaceChildren(...p.shifts.map((s) => h("option", { value: s }, s)));
  $("#pv-seed").value = p.seeds.length ? p.seeds[0] : 0;
  $("#pv-seed").max = p.seed_bounds[1];
  $("#pv-scales").value = p.scales.join(", ");
  $("#pv-bounds").textContent = `scales in [${fmt(p.scale_bounds[0])}, ${fmt(p.scale_bounds[1])}], at most ${p.max_scales} (0 is always added: the filter's reference)`;
  legend($("#preview-legend"), p.classifiers);
  $("#preview-form").addEventListener("submit", (ev) => { ev.preventDefault(); runPreview(p).catch((e) => { setStatus(e.message, true); $("#preview-out").dataset.state = "error"; }); });
}
async function runPreview(p) {
  const out = $("#preview-out");
  const scales = $("#pv-scales").value.split(/[\s,]+/).filter((s) => s !== "").map(Number);
  const body = { class: Number($("#pv-class").value), shift: $("#pv-shift").value, seed: Number($("#pv-seed").value), scales };
  out.dataset.state = "loading";
  out.replaceChildren(h("p", { class: "note" }, "generating…"));
  const r = await (await api("api/preview", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) })).json();
  const samples = r.images.map((e) => ({ sample_id: e.sample_id, scale: e.scale, kept: e.filter.kept, n_pass: e.filter.n_pass,
    scores: { clip_text: e.filter.clip_text, clip_shift_text: e.filter.clip_shift_text, clip_image: e.filter.clip_image, dino_image: e.filter.dino_image },
    predictions: e.predictions, src: e.image }));
  out.replaceChildren(
    renderTrajectory({ id: r.trajectory_id, title: `${r.class_name} (${r.class_id})`, subtitle: `${r.shift} · seed ${r.seed}`,
      complete: r.complete, incompleteNote: "some images filtered out", failure_points: r.failure_points, samples }, r.classifiers, true),
    h("p", { class: "note" }, `generated + filtered in ${r.timing.generate_s} s, classified in ${r.timing.classify_s} s`));
  out.dataset.state = "ready";
  setStatus("");
}

// ------------------------------------------------------------------ start
async function init() {
  setStatus("loading…");
  let info;
  try { info = await getJSON("api/info"); } catch (e) { setStatus(e.message, true); return; }
  state.info = info;
  const name = (info.benchmark && info.benchmark.name) || (info.preview && info.preview.name) || "cnsbench";
  $("#title").textContent = "cnsbench · " + name;
  document.title = "cnsbench · " + name;
  if (info.same_config === false) setStatus("note: --config differs from the build's config; previews may not match the benchmark");
  else setStatus("");
  const work = [];
  if (info.benchmark) {
    $("#browse").hidden = false; $("#report").hidden = false;
    work.push(initBrowse(info.benchmark), initReport(info.benchmark));
  }
  if (info.preview) { $("#preview").hidden = false; initPreview(info.preview); }
  if (!info.benchmark && !info.preview) setStatus("nothing loaded", true);
  try { await Promise.all(work); } catch (e) { setStatus(e.message, true); }
  document.body.dataset.ready = "1";
}
$("#token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.token = $("#token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, state.token);
  state.blobs.clear();
  $("#token-form").hidden = true;
  init();
});
init();
