// The lab's page: the lesson list and controls, fed by the lab's
// Server-Sent Events. Every request the page shows was really sent to the
// order service; the page only asks the lab to send it.

import * as timeline from "./timeline.js";
import * as charts from "./charts.js";

const $ = (id) => document.getElementById(id);
const state = { lessons: [], selected: 1, running: false, stepping: false, waiting: 0, lastSeq: 0, lastOrder: "" };

async function api(path, body) {
  const res = await fetch(path, body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  const text = await res.text();
  const data = text ? JSON.parse(text) : {};
  if (!res.ok) throw new Error(data.error || res.statusText);
  return data;
}

// Lessons.

// renderLessons lists the seed's lessons, then the pitfalls under a heading
// of their own: each makes one mistake in a naive service, then takes the
// same steps against the real one.
function renderLessons() {
  const item = (l) => {
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.lesson = String(l.number);
    b.dataset.status = l.status || "";
    b.setAttribute("aria-current", String(l.number === state.selected));
    b.innerHTML = `<span class="n">${l.number}.</span><span class="title"></span><span class="mark" aria-hidden="true"></span>`;
    b.querySelector(".title").textContent = l.title;
    b.querySelector(".mark").textContent = { passed: "✓", failed: "✗", running: "●" }[l.status] || "";
    b.title = (l.status ? l.status + " · " : "") + "Enter runs it";
    b.addEventListener("click", () => { select(l.number); run(false); });
    b.addEventListener("focus", () => select(l.number, false));
    const li = document.createElement("li");
    li.append(b);
    return li;
  };
  const seed = document.createElement("ol");
  seed.append(...state.lessons.filter((l) => !l.pitfall).map(item));
  const parts = [seed];
  const pitfalls = state.lessons.filter((l) => l.pitfall);
  if (pitfalls.length) {
    const head = document.createElement("h3");
    head.id = "pitfalls-heading";
    head.className = "section";
    head.textContent = "Pitfalls, shown failing";
    head.title = "each lesson makes one common mistake in a naive service (lab/naiveorders), then takes the same steps against the service";
    const ol = document.createElement("ol");
    ol.setAttribute("aria-labelledby", head.id);
    ol.append(...pitfalls.map(item));
    parts.push(head, ol);
  }
  $("lessons").replaceChildren(...parts);
}

// pickByNumber selects a lesson by its number as it is typed: "1" picks
// lesson 1, and "1" then "4" within a moment picks lesson 14.
const typed = { digits: "", timer: 0 };
function pickByNumber(digit) {
  clearTimeout(typed.timer);
  typed.digits = Number(typed.digits + digit) <= state.lessons.length ? typed.digits + digit : digit;
  typed.timer = setTimeout(() => { typed.digits = ""; }, 800);
  select(Number(typed.digits));
}

function select(n, focus = true) {
  if (!state.lessons.some((l) => l.number === n)) return;
  state.selected = n;
  for (const b of document.querySelectorAll("#lessons button")) {
    const on = Number(b.dataset.lesson) === n;
    b.setAttribute("aria-current", String(on));
    if (on && focus && document.activeElement !== b) b.focus();
    else if (on) keepInView($("lessons"), b);
  }
  if (!state.running && state.shown !== n) showIntro(n);
}

// keepInView scrolls list (and only it) so that item is in sight.
function keepInView(list, item) {
  const box = list.getBoundingClientRect(), r = item.getBoundingClientRect();
  if (r.top < box.top) list.scrollTop -= box.top - r.top;
  else if (r.bottom > box.bottom) list.scrollTop += r.bottom - box.bottom;
}

function showIntro(n) {
  const l = state.lessons.find((x) => x.number === n);
  $("title").textContent = `${l.number}. ${l.title}`;
  $("intro").textContent = (l.pitfall ? `A pitfall: a naive service making the mistake "${l.pitfall}" first (its requests are marked naive), ` +
    "then the same steps against the service. " : "") + "Click it in the list (or press r) to run it, or press s to step through it one request at a time.";
}

function setStatus(n, status) {
  const l = state.lessons.find((x) => x.number === n);
  if (l) l.status = status;
  const b = document.querySelector(`#lessons button[data-lesson="${n}"]`);
  if (b) {
    b.dataset.status = status;
    b.querySelector(".mark").textContent = { passed: "✓", failed: "✗", running: "●" }[status] || "";
  }
}

// Running.

async function run(step, lesson = state.selected) {
  try {
    await api("/api/run", { lesson, step });
  } catch (err) {
    flash($("state"), err.message);
  }
}

async function next(all = false) {
  try { await api("/api/step", { all }); } catch (err) { flash($("state"), err.message); }
}

async function resend(id, newKey) {
  timeline.sending();
  try { await api("/api/resend", { request: id, new_key: newKey }); } catch (err) { timeline.refused(); flash($("state"), err.message); }
}

function flash(where, text) {
  where.textContent = text;
  where.dataset.flash = "true";
}

function renderState() {
  const s = $("state");
  s.dataset.state = state.running ? "running" : "idle";
  s.dataset.flash = "false";
  s.textContent = !state.running ? "idle" : state.stepping ? (state.waiting ? "stepping: a request is waiting (n)" : "stepping…") : "running…";
  $("run").disabled = $("step").disabled = $("all").disabled = state.running;
  $("next").disabled = !(state.running && state.stepping && state.waiting);
  $("rest").disabled = !(state.running && state.stepping);
}

// Events.

function onEvent(e) {
  if (e.seq && e.seq <= state.lastSeq && e.kind !== "state") return;
  if (e.seq) state.lastSeq = e.seq;
  switch (e.kind) {
    case "state":
      state.running = e.text === "running";
      state.stepping = state.running && !!e.ok;
      if (!state.running) state.waiting = 0;
      renderState();
      return;
    case "lesson_start":
      state.shown = e.lesson;
      delete $("main").dataset.lessonDone; // it marks the lesson shown as finished
      timeline.clear(e);
      select(e.lesson, false);
      setStatus(e.lesson, "running");
      $("title").textContent = `${e.lesson}. ${e.text}`;
      $("intro").textContent = "Running: every row below is a real request, answer or change, as it happens.";
      $("outcome").hidden = true;
      $("checks").replaceChildren();
      $("why").textContent = "";
      $("metrics-section").hidden = true; // the cards are the lesson's own, shown at its end
      return;
    case "waiting":
      state.waiting++;
      renderState();
      break;
    case "request":
      if (document.querySelector(`li.wait[data-request="${e.request.id}"]`)) state.waiting = Math.max(0, state.waiting - 1);
      renderState();
      break;
    case "answer":
      if (e.answer.order_id) state.lastOrder = e.answer.order_id;
      break;
    case "message":
      if (e.message.order_id) state.lastOrder = e.message.order_id;
      // A command, a replay or a republish that waited for its step (the
      // broker's steps have no request id) has now gone.
      if (["command", "replay", "republish"].includes(e.message.kind) && document.querySelector('li.wait[data-request="0"]')) {
        state.waiting = Math.max(0, state.waiting - 1);
        renderState();
      }
      break;
    case "why":
      $("why").textContent = e.text;
      $("outcome").hidden = false;
      timeline.grew("checks");
      return;
    case "check": {
      const li = document.createElement("li");
      li.dataset.ok = String(e.ok);
      li.textContent = e.text;
      $("checks").append(li);
      $("outcome").hidden = false;
      timeline.grew("checks");
      return;
    }
    case "metrics":
      charts.record(e.signals);
      charts.render($("metrics"), e.signals);
      $("metrics-section").hidden = false;
      timeline.grew("metrics");
      return;
    case "lesson_end":
      if (e.text) {
        const li = document.createElement("li");
        li.className = "stopped";
        li.dataset.ok = "false";
        li.textContent = "could not finish: " + e.text;
        $("checks").append(li);
        $("outcome").hidden = false;
        timeline.grew("checks");
      }
      setStatus(e.lesson, e.ok ? "passed" : "failed");
      $("intro").textContent = e.ok ? "Every check passed. Send any request again with ↻ to see the replay or the refusal."
        : "A check failed or the lesson stopped: see below.";
      $("main").dataset.lessonDone = String(e.lesson);
      return;
  }
  timeline.draw(e, resend);
}

function connect() {
  const es = new EventSource("/api/events");
  es.onopen = () => { $("live").dataset.live = "true"; $("live").textContent = "live"; };
  es.onerror = () => { $("live").dataset.live = "false"; $("live").textContent = "reconnecting…"; };
  es.onmessage = (m) => onEvent(JSON.parse(m.data));
}

// Faults at the channel, and the learner's own requests.

function faultsFromForm() {
  return {
    lost_response_rate: Number($("lost").value) / 100,
    unavailable_rate: Number($("unavail").value) / 100,
    latency_ms: Number($("latency").value),
    latency_jitter_ms: 0,
  };
}

function showFaults(f) {
  $("lost").value = Math.round(f.lost_response_rate * 100);
  $("unavail").value = Math.round(f.unavailable_rate * 100);
  $("latency").value = f.latency_ms;
  updateOutputs();
  const on = f.lost_response_rate > 0 || f.unavailable_rate > 0 || f.latency_ms > 0;
  $("faults-status").textContent = on ? "faults on" : "no faults";
  $("faults-status").dataset.on = String(on);
}

function updateOutputs() {
  $("lost-out").textContent = $("lost").value + "%";
  $("unavail-out").textContent = $("unavail").value + "%";
  $("latency-out").textContent = $("latency").value + " ms";
}

async function setFaults(f) {
  try { showFaults(await api("/api/faults", f)); } catch (err) { $("faults-status").textContent = err.message; }
}

function wireForms() {
  for (const id of ["lost", "unavail", "latency"]) $(id).addEventListener("input", updateOutputs);
  $("faults").addEventListener("submit", (ev) => { ev.preventDefault(); setFaults(faultsFromForm()); });
  $("faults-clear").addEventListener("click", () => setFaults({ lost_response_rate: 0, unavailable_rate: 0, latency_ms: 0, latency_jitter_ms: 0 }));
  $("own").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const op = $("own-op").value;
    const body = { operation: op, order_id: $("own-order").value.trim() || state.lastOrder,
      payment_method: $("own-method").value, key: $("own-key").value.trim() };
    timeline.sending();
    try {
      const a = await api("/api/send", body);
      $("own-status").textContent = `${a.status}${a.replayed ? " replayed" : ""}${a.code ? " " + a.code : ""}`;
      $("own-status").dataset.status = String(a.status);
      $("own-status").dataset.replayed = String(!!a.replayed);
    } catch (err) { timeline.refused(); $("own-status").textContent = err.message; }
  });
  $("run").addEventListener("click", () => run(false));
  $("step").addEventListener("click", () => run(true));
  $("next").addEventListener("click", () => next(false));
  $("rest").addEventListener("click", () => next(true));
  $("all").addEventListener("click", () => run(false, 0));
}

function wireKeys() {
  document.addEventListener("keydown", (ev) => {
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const t = ev.target;
    if (t.closest && t.closest("input, select, textarea")) return;
    const k = ev.key;
    if (k === "ArrowDown" || k === "ArrowUp") {
      if (!t.closest || !t.closest("#lessons")) return;
      ev.preventDefault();
      const n = state.selected + (k === "ArrowDown" ? 1 : -1);
      select(Math.min(Math.max(n, 1), state.lessons.length));
      return;
    }
    if (/^[0-9]$/.test(k)) { pickByNumber(k); return; }
    const act = { r: () => run(false), s: () => run(true), n: () => next(false), c: () => next(true), a: () => run(false, 0) }[k];
    if (act) { ev.preventDefault(); act(); }
  });
}

async function main() {
  const info = await api("/api/lessons");
  $("service").textContent = info.service;
  $("channel").textContent = info.channel;
  $("broker").textContent = info.broker;
  $("tenant").textContent = info.tenant;
  $("run-id").textContent = info.run_id;
  state.lessons = info.lessons.map((l) => ({ ...l, status: l.passed === undefined ? "" : l.passed ? "passed" : "failed" }));
  state.running = !!info.running;
  state.stepping = !!info.stepping;
  renderLessons();
  showIntro(state.selected);
  timeline.watch();
  timeline.empty("No lesson yet: click one on the left to run it, or pick one with its number and Step through it (s). " +
    "In the titles, R1, R2, R3 name a lesson's Idempotency-Keys, one per intent; O9 is the order it creates under R1, " +
    "and O10 a second order for the same intent, which a retry must never make.");
  wireForms();
  wireKeys();
  renderState();
  connect();
  try { showFaults(await api("/api/faults")); } catch (err) { $("faults-status").textContent = err.message; }
}

main();
