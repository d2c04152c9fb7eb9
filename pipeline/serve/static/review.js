"use strict";
// Review of a mined set: a grid of images, one decision per image by keyboard (or click + key).
const TOKEN_KEY = "cnsbench-api-token";
const KEYS = { a: "accept", r: "reject", n: "not_class", u: null };
const state = { token: sessionStorage.getItem(TOKEN_KEY) || "", set: "", items: [], focus: 0 };
const $ = (sel) => document.querySelector(sel);

async function api(path, options) {
  options = options || {};
  const headers = Object.assign({}, options.headers || {});
  if (state.token) headers["Authorization"] = "Bearer " + state.token;
  const resp = await fetch(path, Object.assign({}, options, { headers }));
  if (resp.status === 401) { $("#token-form").hidden = false; throw new Error("this server needs an API token"); }
  if (!resp.ok) {
    let detail = resp.statusText;
    try { const body = await resp.json(); detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail); } catch (e) { /* not JSON */ }
    throw new Error(`${resp.status}: ${detail}`);
  }
  return resp;
}
function showError(e) { $("#error").textContent = e ? String(e.message || e) : ""; }
function showProgress(p) {
  $("#progress").textContent = `${p.decided}/${p.total} decided · accept ${p.accept} · reject ${p.reject} · not the class ${p.not_class}`;
  $("#progress").dataset.decided = String(p.decided);
}
function cell(i) { return document.querySelectorAll("#grid .item")[i]; }
function setFocus(i) {
  if (!state.items.length) return;
  state.focus = Math.max(0, Math.min(state.items.length - 1, i));
  document.querySelectorAll("#grid .item.focus").forEach((el) => el.classList.remove("focus"));
  const el = cell(state.focus);
  el.classList.add("focus");
  el.scrollIntoView({ block: "nearest" });
}
function render() {
  const grid = $("#grid");
  grid.replaceChildren();
  state.items.forEach((item, i) => {
    const box = document.createElement("div");
    box.className = "item";
    box.tabIndex = -1;
    box.dataset.sampleId = item.sample_id;
    if (item.decision) box.dataset.decision = item.decision;
    const img = document.createElement("img");
    img.alt = item.sample_id;
    api("/api/benchmarks/image/" + item.sample_id.split("/").map(encodeURIComponent).join("/"))
      .then((r) => r.blob()).then((b) => { img.src = URL.createObjectURL(b); })
      .catch((e) => { img.alt = "failed: " + e.message; });
    const meta = document.createElement("div");
    meta.className = "meta";
    const kind = item.kind && item.kind !== item.shift ? ` (${item.kind})` : "";
    meta.append(`${item.class_name} · ${item.shift}${kind} · seed ${item.seed}`);
    const badge = document.createElement("div");
    badge.className = "badge";
    badge.textContent = item.decision || "";
    meta.append(badge);
    box.append(img, meta);
    box.addEventListener("click", () => setFocus(i));
    grid.append(box);
  });
  grid.dataset.state = state.items.length ? "ready" : "empty";
  setFocus(state.items.findIndex((it) => !it.decision) >= 0 ? state.items.findIndex((it) => !it.decision) : 0);
}
async function decide(decision) {
  const item = state.items[state.focus];
  if (!item) return;
  const body = JSON.stringify({ decisions: { [item.sample_id]: decision } });
  try {
    const resp = await api(`/api/review/${encodeURIComponent(state.set)}/decisions`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body });
    showProgress(await resp.json());
    showError(null);
    item.decision = decision;
    const el = cell(state.items.indexOf(item));
    if (decision) el.dataset.decision = decision; else delete el.dataset.decision;
    el.querySelector(".badge").textContent = decision || "";
    if (decision) setFocus(state.focus + 1);
  } catch (e) { showError(e); }
}
async function load() {
  state.set = new URLSearchParams(location.search).get("set") || "hard_set";
  $("#set-name").textContent = state.set;
  try {
    const data = await (await api(`/api/review/${encodeURIComponent(state.set)}/items`)).json();
    state.items = data.items;
    showProgress(data.progress);
    render();
  } catch (e) { showError(e); $("#grid").dataset.state = "error"; }
}
document.addEventListener("keydown", (ev) => {
  if (ev.target && ev.target.tagName === "INPUT") return;
  if (ev.key === "ArrowRight" || ev.key === "j") { setFocus(state.focus + 1); ev.preventDefault(); }
  else if (ev.key === "ArrowLeft" || ev.key === "k") { setFocus(state.focus - 1); ev.preventDefault(); }
  else if (Object.prototype.hasOwnProperty.call(KEYS, ev.key)) { decide(KEYS[ev.key]); ev.preventDefault(); }
});
$("#token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.token = $("#token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, state.token);
  $("#token-form").hidden = true;
  load();
});
load();
