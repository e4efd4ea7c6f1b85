// The console's one script: follows changes live (EventSource), calls /v1 for actions, fills the
// submit form from /v1/ceilings. Hand-written, no build step; the pages work as plain HTML without it
// (they do not update themselves then).
const BASE = "/console";
const UPDATE_MS = 250; // at most 4 page updates a second, however many events arrive
const TERMINAL = new Set(["done", "failed", "cancelled"]);
const EVENT_TYPES = ["submitted", "admitted", "running", "resumed", "detached", "progress", "attempt_failed",
  "cancel_requested", "recovered", "done", "failed", "cancelled"];

// Run `work` at most once per `ms`, trailing: triggers that come meanwhile make one more run.
export function throttle(work, ms = UPDATE_MS) {
  let last = 0, timer = null, running = false, again = false;
  const trigger = () => {
    if (running) { again = true; return; }
    if (timer) return;
    timer = setTimeout(async () => {
      timer = null; running = true; last = Date.now();
      try { await work(); } catch (err) { console.warn("update failed", err); }
      finally { running = false; if (again) { again = false; trigger(); } }
    }, Math.max(0, last + ms - Date.now()));
  };
  return trigger;
}

async function api(path, options = {}) {
  const init = { credentials: "same-origin", ...options, headers: { Accept: "application/json", ...(options.headers || {}) } };
  const response = await fetch(path, init);
  let body = null;
  try { body = await response.json(); } catch { body = null; }
  return { ok: response.ok, status: response.status, body };
}

const post = (path, data) => api(path, data === undefined
  ? { method: "POST" }
  : { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(data) });

function say(el, text, bad = false) {
  if (!el) return;
  el.textContent = text;
  el.classList.toggle("error", bad);
}

function problem(r) {
  const b = r.body || {};
  let text = b.detail || `HTTP ${r.status}`;
  if (b.ceiling) text += ` (ceiling: ${b.ceiling.max_frames} frames at ${b.ceiling.width}x${b.ceiling.height} for ${b.ceiling.mode}, ${b.ceiling.reason})`;
  return text;
}

async function cancelJob(id) {
  const r = await post(`/v1/jobs/${encodeURIComponent(id)}/cancel`);
  return r.ok || r.status === 409 ? null : problem(r);
}

// A new job with the parameters of `id` (its stored request; the new job gets its own id).
async function retryJob(id) {
  const got = await api(`/v1/jobs/${encodeURIComponent(id)}`);
  if (!got.ok) return { error: problem(got) };
  const r = await post("/v1/jobs", got.body.request);
  return r.ok ? { id: r.body.id } : { error: problem(r) };
}

function showLive(on) {
  const el = document.getElementById("live");
  if (el) { el.hidden = false; el.textContent = on ? "live" : "reconnecting…"; el.classList.toggle("off", !on); }
}

// `keep` runs just before the swap and returns what to restore after it: state read any earlier
// (before the fetch) would lose a box ticked while the fragment was on its way.
async function swap(container, url, keep = () => () => {}) {
  const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
  if (!response.ok) return false;
  const html = await response.text();
  const restore = keep();
  container.innerHTML = html;
  restore();
  container.dispatchEvent(new CustomEvent("swapped", { bubbles: true }));
  return true;
}

function fragmentUrl(path) {
  const params = new URLSearchParams(location.search);
  params.set("fragment", "1");
  return `${path}?${params}`;
}

// -- the queue ---------------------------------------------------------------------------------
function queuePage() {
  const body = document.getElementById("queue-body");
  const note = () => document.getElementById("bulk-note");
  const picked = () => [...body.querySelectorAll("input.pick:checked")].map((i) => i.value);
  const syncBulk = () => {
    const n = picked().length;
    document.getElementById("cancel-selected").disabled = n === 0;
    document.getElementById("retry-selected").disabled = n === 0;
  };
  const keepPicks = () => {
    const keep = new Set(picked());
    // The focused control, found again in the new rows by its job (a box) or its id.
    const active = document.activeElement && body.contains(document.activeElement) ? document.activeElement : null;
    const again = active?.matches("input.pick") ? `input.pick[value="${active.value}"]`
      : active?.matches("button[data-job]") ? `button.${active.classList[0]}[data-job="${active.dataset.job}"]`
      : active?.id ? `#${CSS.escape(active.id)}` : null;
    return () => {
      body.querySelectorAll("input.pick").forEach((i) => { i.checked = keep.has(i.value); });
      if (again) body.querySelector(again)?.focus();
    };
  };
  const refresh = throttle(async () => {
    if (await swap(body, fragmentUrl(BASE), keepPicks)) syncBulk();
    body.dataset.updates = String(Number(body.dataset.updates || 0) + 1);
  });
  body.addEventListener("change", (e) => { if (e.target.matches("input.pick")) syncBulk(); });
  body.addEventListener("click", async (e) => {
    const button = e.target.closest("button");
    if (!button) return;
    if (button.matches(".cancel")) {
      button.disabled = true;
      const error = await cancelJob(button.dataset.job);
      say(note(), error || `cancel asked for ${button.dataset.job}`, !!error);
      refresh();
    } else if (button.matches(".retry")) {
      button.disabled = true;
      const r = await retryJob(button.dataset.job);
      say(note(), r.error || `retried as ${r.id}`, !!r.error);
      refresh();
    }
  });
  // The selection's buttons sit outside the part of the page that live updates replace.
  for (const id of ["cancel-selected", "retry-selected"]) {
    document.getElementById(id).addEventListener("click", async () => {
      const ids = picked();
      const cancel = id === "cancel-selected";
      const results = await Promise.all(ids.map((job) => cancel ? cancelJob(job) : retryJob(job).then((r) => r.error || null)));
      const failed = results.filter(Boolean);
      say(note(), failed.length ? failed.join("; ") : `${cancel ? "cancel asked for" : "retried"} ${ids.length} job(s)`, failed.length > 0);
      refresh();
    });
  }
  follow(`${BASE}/stream`, ["changed"], refresh);
}

// An EventSource on `url` calling `onEvent` for each of `types`; the live mark shows its state.
function follow(url, types, onEvent, onEnd) {
  const source = new EventSource(url, { withCredentials: true });
  source.addEventListener("open", () => showLive(true));
  for (const type of types) source.addEventListener(type, (e) => onEvent(e, type));
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CLOSED) { if (onEnd) onEnd(); }
    else showLive(false);
  });
  return source;
}

// -- a job ----------------------------------------------------------------------------------------
function jobPage() {
  const body = document.getElementById("job-body");
  const id = body.dataset.job;
  const note = () => document.getElementById("action-note");
  // What an action said stays through the live updates that replace the part it sits in.
  const keepNote = () => {
    const { textContent: text, className } = note() || {};
    return () => { const n = note(); if (n && text) { n.textContent = text; n.className = className; } };
  };
  body.addEventListener("click", async (e) => {
    const button = e.target.closest("button");
    if (!button) return;
    button.disabled = true;
    if (button.matches(".cancel")) {
      say(note(), "cancelling…"); // at once: the answer waits until the executor has stopped
      const error = await cancelJob(id);
      say(note(), error || "cancel asked", !!error);
    } else if (button.matches(".retry")) {
      const r = await retryJob(id);
      if (r.id) location.assign(`${BASE}/jobs/${encodeURIComponent(r.id)}`);
      else say(note(), r.error, true);
    }
  });
  if (body.dataset.terminal === "yes") return;
  let ended = false;
  const refresh = throttle(async () => {
    if (ended) { location.reload(); return; } // the whole page: its video, once there is one
    await swap(body, fragmentUrl(body.dataset.fragment), keepNote);
  });
  const source = follow(`/v1/jobs/${encodeURIComponent(id)}/stream`, EVENT_TYPES, (_, type) => {
    if (TERMINAL.has(type)) { ended = true; source.close(); }
    refresh();
  }, () => { ended = true; refresh(); });
}

// -- submit ---------------------------------------------------------------------------------------
const FPS = 24;

// The frame counts to offer for a ceiling row: its least, each whole second, and its most; nothing over it.
export function frameChoices(row) {
  const out = new Set([row.min_frames]);
  for (let f = FPS; f <= row.max_frames; f += FPS) if (f >= row.min_frames) out.add(f);
  out.add(row.max_frames);
  return [...out].filter((f) => f >= row.min_frames && f <= row.max_frames).sort((a, b) => a - b);
}

async function submitPage() {
  const form = document.getElementById("submit-form");
  const $ = (id) => document.getElementById(id);
  const result = $("submit-result");
  const got = await api("/v1/ceilings");
  if (!got.ok) { say(result, `cannot read /v1/ceilings: ${problem(got)}`, true); return; }
  const rows = got.body.ceilings.filter((r) => r.max_frames >= r.min_frames && r.reason !== "mode_unavailable");
  const modes = [...new Set(rows.map((r) => r.mode))];
  $("mode").replaceChildren(...modes.map((m) => new Option(m, m)));
  const sizeKey = (r) => `${r.width}x${r.height}`;
  const counts = () => ({
    keyframes: ["first", "last"].filter((n) => $(n).files.length).length,
    refs: $("ref-images").files.length,
  });
  // The row admission will judge by: this mode and size with the keyframes or references given
  // (when none match that count, the strictest row of the size).
  const row = () => {
    const mode = $("mode").value, size = $("size").value, c = counts();
    const same = rows.filter((r) => r.mode === mode && sizeKey(r) === size);
    const exact = same.find((r) => (mode !== "fl2va" || r.keyframes === c.keyframes) && (mode !== "ref2va" || r.reference_images === c.refs));
    return exact || same.reduce((a, b) => (b.max_frames < a.max_frames ? b : a), same[0]);
  };
  const fillFrames = () => {
    const r = row();
    if (!r) { $("frames").replaceChildren(); return; }
    const before = Number($("frames").value) || 5 * FPS + 1;
    const choices = frameChoices(r);
    $("frames").replaceChildren(...choices.map((f) => new Option(`${f} frames (${(f / FPS).toFixed(2)} s)`, String(f))));
    const pick = choices.reduce((a, b) => (Math.abs(b - before) < Math.abs(a - before) ? b : a), choices[0]);
    $("frames").value = String(pick);
    $("ceiling-note").textContent = `At most ${r.max_frames} frames (${r.max_seconds} s) at ${r.width}x${r.height} for ${r.mode}: ${r.reason}${r.verified ? "" : ", unverified"}.`;
  };
  const fillSizes = () => {
    const mode = $("mode").value;
    const sizes = [...new Set(rows.filter((r) => r.mode === mode).map(sizeKey))];
    const before = $("size").value;
    $("size").replaceChildren(...sizes.map((s) => new Option(s.replace("x", " × "), s)));
    if (sizes.includes(before)) $("size").value = before;
    $("keyframes").hidden = mode !== "fl2va";
    $("references").hidden = mode !== "ref2va";
    fillFrames();
  };
  $("mode").addEventListener("change", fillSizes);
  $("size").addEventListener("change", fillFrames);
  for (const id of ["first", "last", "ref-images"]) $(id).addEventListener("change", fillFrames);
  fillSizes();

  const upload = async (file) => {
    const r = await api("/v1/uploads", { method: "POST", headers: { "Content-Type": file.type || "application/octet-stream" }, body: file });
    if (!r.ok) throw new Error(`${file.name}: ${problem(r)}`);
    return r.body.id;
  };
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const button = $("submit-button");
    button.disabled = true;
    say(result, "submitting…");
    try {
      const [width, height] = $("size").value.split("x").map(Number);
      const body = {
        mode: $("mode").value, prompt: $("prompt").value, width, height,
        frames: Number($("frames").value), steps: Number($("steps").value),
        seed: Number($("seed").value || 0), priority: Number($("priority").value || 0), quality: $("quality").value,
      };
      if ($("negative_prompt").value.trim()) body.negative_prompt = $("negative_prompt").value;
      if (body.mode === "fl2va") {
        body.keyframes = {};
        for (const n of ["first", "last"]) if ($(n).files.length) body.keyframes[n] = await upload($(n).files[0]);
      }
      if (body.mode === "ref2va") body.references = { images: await Promise.all([...$("ref-images").files].map(upload)) };
      const r = await post("/v1/jobs", body);
      if (r.ok) { location.assign(`${BASE}/jobs/${encodeURIComponent(r.body.id)}`); return; }
      say(result, `refused: ${problem(r)}`, true);
    } catch (err) {
      say(result, `refused: ${err.message}`, true);
    } finally {
      button.disabled = false;
    }
  });
}

const pages = { queue: queuePage, job: jobPage, submit: submitPage };
pages[document.body.dataset.page]?.();
