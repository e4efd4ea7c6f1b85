// The console's one script: follows changes live (EventSource), calls /v1 for actions, fills the
// submit form from /v1/ceilings. Hand-written, no build step; the pages work as plain HTML without it
// (they do not update themselves then).
const BASE = "/console";
const UPDATE_MS = 250; // at most 4 page updates a second, however many events arrive
const TERMINAL = new Set(["done", "failed", "cancelled"]);
const EVENT_TYPES = ["submitted", "admitted", "planned", "running", "resumed", "detached", "progress", "attempt_failed",
  "cancel_requested", "reprioritized", "segment_done", "recovered", "done", "failed", "cancelled"];

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

// A call to /v1: its status and JSON body; status 0 when the service did not answer at all.
async function api(path, options = {}) {
  const init = { credentials: "same-origin", ...options, headers: { Accept: "application/json", ...(options.headers || {}) } };
  let response;
  try { response = await fetch(path, init); } catch { return { ok: false, status: 0, body: null }; }
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

// What a refusal says: its detail, each field's message where it names others, and the ceiling.
export function problem(r) {
  if (r.status === 0) return "the service did not answer (is it running?)";
  if (r.status === 401) return "signed out: sign in again";
  const b = r.body || {};
  let text = b.detail || `HTTP ${r.status}`;
  const more = (b.errors || []).map((e) => (e.field ? `${e.field}: ${e.message}` : e.message)).filter((m) => m && !text.includes(m));
  if (more.length) text += ` (${more.join("; ")})`;
  if (b.ceiling) text += ` (ceiling: ${b.ceiling.max_frames} frames at ${b.ceiling.width}x${b.ceiling.height} for ${b.ceiling.mode}, ${b.ceiling.reason})`;
  return text;
}

// Ask to cancel `id`; what happened, truthfully: cancelled, asked (a running job stops at its next
// step), already ended, or not asked at all (and why).
async function cancelJob(id) {
  const r = await post(`/v1/jobs/${encodeURIComponent(id)}/cancel`);
  if (r.ok && r.body?.status === "cancelled") return { text: `${id} cancelled`, bad: false };
  if (r.ok) return { text: `cancel asked for ${id}: it stops at its next step`, bad: false };
  if (r.status === 409) return { text: `${id} had already ended: nothing to cancel`, bad: false };
  return { text: `${id} not cancelled: ${problem(r)}`, bad: true };
}

// A new job with the parameters and priority of `id`, linked to it in its log (the new job gets its
// own id).
async function retryJob(id) {
  const r = await post(`/v1/jobs/${encodeURIComponent(id)}/retry`);
  if (r.ok) return { id: r.body.id, text: `retried ${id} as ${r.body.id}`, bad: false };
  return { text: `${id} not retried: ${problem(r)}`, bad: true };
}

// Bring `target`'s children in line with `source`'s (parsed, not in the page), keeping every node
// that stays: focus, a text selection, scroll positions and ticked boxes live in those nodes, so an
// update that changed one row leaves the rest of the page as the reader had it.
export function morph(target, source) {
  const keyOf = (n) => (n.nodeType !== 1 ? null : n.id ? `#${n.id}` : n.dataset.job && n.tagName === "TR" ? `row:${n.dataset.job}` : null);
  const keyed = new Map();
  for (const child of target.childNodes) { const k = keyOf(child); if (k) keyed.set(k, child); }
  let cursor = target.firstChild;
  for (const incoming of [...source.childNodes]) {
    const k = keyOf(incoming);
    let match = k ? keyed.get(k) : null;
    if (match) keyed.delete(k);
    else if (!k && cursor && !keyOf(cursor) && cursor.nodeName === incoming.nodeName) match = cursor;
    if (!match) { target.insertBefore(incoming, cursor); continue; }
    if (match === cursor) cursor = cursor.nextSibling;
    else target.insertBefore(match, cursor);
    morphNode(match, incoming);
  }
  while (cursor) { const next = cursor.nextSibling; cursor.remove(); cursor = next; }
}

function morphNode(node, incoming) {
  if (node.nodeType !== 1) {
    if (node.nodeValue !== incoming.nodeValue) node.nodeValue = incoming.nodeValue;
    return;
  }
  for (const { name } of [...node.attributes]) if (!incoming.hasAttribute(name)) node.removeAttribute(name);
  for (const { name, value } of incoming.attributes) if (node.getAttribute(name) !== value) node.setAttribute(name, value);
  if (node.tagName === "VIDEO") return; // a playing video keeps playing
  if (node.tagName === "TIME" && node.dateTime === incoming.getAttribute("datetime")) return; // shown in local time
  morph(node, incoming);
}

const parse = (html) => {
  const t = document.createElement("template");
  t.innerHTML = html;
  return t.content;
};

// What a fetch of a page part gave: the part, or why not: "signed-out" (the session has gone: the
// service sent its sign-in page or a 401), "down" (no answer) or "failed" (another status).
async function fetchPart(url) {
  let response;
  try {
    response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
  } catch {
    return { why: "down" };
  }
  const signin = `${BASE}/signin`;
  if (response.status === 401 || (response.redirected && new URL(response.url).pathname === signin)) return { why: "signed-out" };
  if (!response.ok) return { why: response.status >= 502 ? "down" : "failed" };
  return { part: parse(await response.text()) };
}

// The state of the page's connection, in the header: live, reconnecting, or signed out (with a link).
function showLive(state) {
  const el = document.getElementById("live");
  if (!el) return;
  el.hidden = false;
  el.classList.toggle("off", state !== "live");
  if (state === "signed-out") {
    const here = location.pathname + location.search;
    el.replaceChildren("signed out: ", Object.assign(document.createElement("a"), { href: `${BASE}/signin?next=${encodeURIComponent(here)}`, textContent: "sign in again" }));
  } else el.textContent = state === "live" ? "live" : "service unreachable, reconnecting…";
}

// Times as the reader's clock shows them (the page says UTC, for a reader without the script).
function localTimes(root) {
  for (const el of root.querySelectorAll("time[datetime]")) {
    const local = new Date(el.dateTime).toLocaleString();
    if (el.textContent !== local) { el.textContent = local; el.title = el.dateTime; }
  }
}

// Replace `container`'s content by the part at `url`, morphed in; false (the page left as it was,
// the header saying why) when it could not be read.
async function update(container, url) {
  const got = await fetchPart(url);
  if (!got.part) { if (got.why !== "failed") showLive(got.why); return false; }
  morph(container, got.part);
  localTimes(container);
  container.dispatchEvent(new CustomEvent("swapped", { bubbles: true }));
  return true;
}

function fragmentUrl(path) {
  const params = new URLSearchParams(location.search);
  params.set("fragment", "1");
  params.delete("said");
  return `${path}?${params}`;
}

// -- the queue ---------------------------------------------------------------------------------
const MAX_ROWS = 50; // more jobs changed at once than this: the whole part is read again

function queuePage() {
  const body = document.getElementById("queue-body");
  const note = () => document.getElementById("bulk-note");
  const picked = () => [...body.querySelectorAll("input.pick:checked")].map((i) => i.closest("tr"));
  const syncBulk = () => {
    const rows = picked();
    document.getElementById("cancel-selected").disabled = !rows.some((r) => r.dataset.cancellable === "yes");
    document.getElementById("retry-selected").disabled = !rows.some((r) => r.dataset.ended === "yes");
  };
  const changed = new Set();
  let everything = true;
  const rowOf = (id) => body.querySelector(`tr[data-job="${CSS.escape(id)}"]`);
  // Only the rows that changed, where each is on the page and stays in its table (same status);
  // else the whole part, morphed: a moved or new row. `only`: the statuses this page lists (its
  // `status` filter; null for any): a changed job of another status cannot appear here, so its
  // change costs the counts alone.
  const status = new URLSearchParams(location.search).get("status");
  const only = status === "ended" ? ["done", "failed", "cancelled"] : status ? [status] : null;
  const refresh = throttle(async () => {
    const ids = [...changed];
    const whole = everything || ids.length > MAX_ROWS || (!only && !ids.every(rowOf));
    changed.clear();
    everything = false;
    let done = false;
    if (!whole && ids.length) {
      const got = await fetchPart(`${BASE}/rows?${new URLSearchParams(ids.map((id) => ["id", id]))}`);
      if (!got.part) { everything = true; if (got.why !== "failed") showLive(got.why); return; }
      const fresh = [...got.part.querySelectorAll("tr[data-job]")];
      // Each row in place with the same status (it stays in its table), or absent and of a status
      // this page does not list; anything else (a row that moves, one that now belongs here): the whole part.
      done = fresh.every((tr) => (rowOf(tr.dataset.job) ? rowOf(tr.dataset.job).dataset.status === tr.dataset.status
        : only && !only.includes(tr.dataset.status)));
      if (done) {
        for (const tr of fresh.filter((t) => rowOf(t.dataset.job))) { morphNode(rowOf(tr.dataset.job), tr); localTimes(rowOf(tr.dataset.job)); }
        const counts = got.part.querySelector("#counts");
        if (counts) morphNode(document.getElementById("counts"), counts);
      }
    }
    if (!done && !(await update(body, fragmentUrl(BASE)))) { everything = true; return; }
    syncBulk();
    body.dataset.updates = String(Number(body.dataset.updates || 0) + 1);
  });
  body.addEventListener("change", (e) => { if (e.target.matches("input.pick")) syncBulk(); });
  body.addEventListener("click", async (e) => {
    const button = e.target.closest("button[data-job]");
    if (!button) return;
    e.preventDefault();
    const id = button.dataset.job;
    if (button.matches(".cancel")) {
      if (!confirmCancel([id])) return;
      button.disabled = true;
      const r = await cancelJob(id);
      say(note(), r.text, r.bad);
      if (r.bad) button.disabled = false;
    } else if (button.matches(".retry")) {
      button.disabled = true;
      const r = await retryJob(id);
      say(note(), r.text, r.bad);
      button.disabled = false;
    }
    refresh();
  });
  // The selection's buttons sit outside the part of the page that live updates replace. Each acts
  // on the picked jobs it applies to (a cancel on those still queued or running, a retry on those
  // that ended) and says what it did to each; the boxes are cleared after.
  for (const [id, cancel] of [["cancel-selected", true], ["retry-selected", false]]) {
    document.getElementById(id).addEventListener("click", async (e) => {
      e.preventDefault();
      const rows = picked();
      const apply = rows.filter((r) => (cancel ? r.dataset.cancellable : r.dataset.ended) === "yes").map((r) => r.dataset.job);
      const skipped = rows.length - apply.length;
      if (!apply.length || (cancel && !confirmCancel(apply))) return;
      const results = await Promise.all(apply.map((job) => (cancel ? cancelJob(job) : retryJob(job))));
      const bad = results.filter((r) => r.bad);
      const verb = cancel ? "cancel asked for" : "retried";
      let text = `${verb} ${apply.length - bad.length} of ${apply.length} job(s)`;
      if (skipped) text += `; ${skipped} skipped (${cancel ? "already ended" : "not ended yet"})`;
      if (bad.length) text += `; ${bad.map((r) => r.text).join("; ")}`;
      say(note(), text, bad.length > 0);
      for (const r of rows) r.querySelector("input.pick").checked = false;
      syncBulk();
      refresh();
    });
  }
  follow(`${BASE}/stream`, ["changed"], (e) => {
    const ids = JSON.parse(e.data).jobs;
    if (ids.includes("*")) everything = true;
    else for (const id of ids) changed.add(id);
    refresh();
  }, () => { everything = true; refresh(); });
  syncBulk();
}

function confirmCancel(ids) {
  const what = ids.length === 1 ? `job ${ids[0]}` : `${ids.length} jobs`;
  return window.confirm(`Cancel ${what}? The work done so far is lost.`);
}

// An EventSource on `url` calling `onEvent` for each of `types`; the header shows its state. When
// the browser gives up on it (the service answered an error), `onEnd` runs and the page follows by
// reading itself again until the service answers (`recover`).
function follow(url, types, onEvent, onEnd) {
  const source = new EventSource(url, { withCredentials: true });
  source.addEventListener("open", () => showLive("live"));
  for (const type of types) source.addEventListener(type, (e) => onEvent(e, type));
  source.addEventListener("error", () => {
    if (source.readyState === EventSource.CLOSED) { if (onEnd) onEnd(); }
    else showLive("down");
  });
  return source;
}

// -- a job ----------------------------------------------------------------------------------------
function jobPage() {
  const body = document.getElementById("job-body");
  const id = body.dataset.job;
  const note = () => document.getElementById("action-note");
  // What an action said stays through the live updates that replace the part it sits in.
  let said = null;
  body.addEventListener("swapped", () => { if (said) say(note(), said.text, said.bad); });
  // A queued job's priority: PATCH /v1/jobs/{id}, and what became of it said beside the form.
  body.addEventListener("submit", async (e) => {
    const form = e.target.closest("form.prio-form");
    if (!form) return;
    e.preventDefault();
    const priority = Number(form.elements.priority.value);
    const r = await api(`/v1/jobs/${encodeURIComponent(id)}`, {
      method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ priority }),
    });
    said = r.ok ? { text: `priority set to ${r.body.priority}`, bad: false } : { text: `priority not set: ${problem(r)}`, bad: true };
    say(note(), said.text, said.bad);
  });
  body.addEventListener("click", async (e) => {
    const button = e.target.closest("button[data-job]");
    if (!button) return;
    e.preventDefault();
    if (button.matches(".cancel")) {
      if (!confirmCancel([id])) return;
      button.disabled = true;
      said = { text: "cancelling…", bad: false };
      say(note(), said.text); // at once: the answer waits until the executor has stopped
      said = await cancelJob(id);
      say(note(), said.text, said.bad);
      if (said.bad) button.disabled = false;
    } else if (button.matches(".retry")) {
      button.disabled = true;
      const r = await retryJob(id);
      if (r.id) location.assign(`${BASE}/jobs/${encodeURIComponent(r.id)}`);
      else { said = r; say(note(), r.text, true); button.disabled = false; }
    }
  });
  if (body.dataset.terminal === "yes") return;
  const url = fragmentUrl(body.dataset.fragment);
  // Until the page shows the job ended: each update reads the part again (its video too, once there
  // is one); an update the service could not answer is tried again a second later.
  let source = null;
  const refresh = throttle(async () => {
    if (!(await update(body, url))) { setTimeout(refresh, 1000); return; }
    if (body.querySelector("[data-terminal='yes']")) { source?.close(); showLive("live"); return; }
    if (!source || source.readyState === EventSource.CLOSED) listen();
  });
  const listen = () => {
    source = follow(`/v1/jobs/${encodeURIComponent(id)}/stream`, EVENT_TYPES, (_, type) => {
      if (TERMINAL.has(type)) source.close();
      refresh();
    }, refresh);
  };
  listen();
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
  // The page came with its options: what was chosen while /v1/ceilings was read stays chosen.
  const chosen = $("mode").value;
  $("mode").replaceChildren(...modes.map((m) => new Option(m, m)));
  if (modes.includes(chosen)) $("mode").value = chosen;
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
    $("ceiling-note").textContent = `At most ${r.max_frames} frames (${r.max_seconds} s) at ${r.width}x${r.height} for ${r.mode}: ${r.reason}${r.verified || r.reason === "unverified" ? "" : ", unverified"}.`;
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
      result.focus();
    } catch (err) {
      say(result, `refused: ${err.message}`, true);
      result.focus();
    } finally {
      button.disabled = false;
    }
  });
}

// -- the box ------------------------------------------------------------------------------------
const BOX_EVERY_MS = 3000;

// The box's figures (load, nodes, groups, readiness) read again every few seconds while the page is
// in view; a reading the service could not answer is said in the header and tried again.
function boxPage() {
  const body = document.getElementById("box-body");
  const url = fragmentUrl(body.dataset.fragment);
  const tick = async () => {
    if (!document.hidden && (await update(body, url))) showLive("live");
    body.dataset.updates = String(Number(body.dataset.updates || 0) + 1);
    setTimeout(tick, BOX_EVERY_MS);
  };
  setTimeout(tick, BOX_EVERY_MS);
  // Drain asks first; the form then posts as it does without the script, and the page says the result.
  body.addEventListener("submit", (e) => {
    const button = e.target.querySelector("button.drain");
    if (!button) return;
    const running = Number(button.dataset.running);
    const what = running ? `; the ${running} job(s) it runs go on to their end` : "";
    if (!window.confirm(`Drain node ${button.dataset.node}? It takes no new jobs until its drain is cleared${what}.`)) {
      e.preventDefault();
    }
  });
}

localTimes(document);
const pages = { queue: queuePage, job: jobPage, submit: submitPage, box: boxPage };
pages[document.body.dataset.page]?.();
