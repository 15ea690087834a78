// The swimlane timeline: one row per event of the lesson on screen, placed
// in the lane it happened in (client, instance, record, order, channel,
// broker).

const rows = () => document.getElementById("rows");
const story = () => document.getElementById("story");

let startedAt = 0;

// The story (the timeline, then the lesson's checks and metrics) reads
// from the top: new rows are followed only when the learner already sees
// the timeline's end, else "↓ 3 new rows below" says they came. A request
// the learner sends from this page (↻, or their own) lands at the
// timeline's end wherever they were reading: its rows are brought into
// view, highlighted and announced.
const view = { follow: false, unseen: 0, below: "" };

// ours is where the page itself last scrolled the story. Its scroll event
// comes a frame later, when more rows may have come below the end it
// scrolled to: landing there is the page following, not the learner
// scrolling away, and must not stop the following (a busy machine sends
// many rows a frame).
let ours = -1;

function scrollStory(s, top) {
  s.scrollTop = top;
  ours = s.scrollTop;
}

// mine counts the requests this page has asked the lab to send and not yet
// seen; fresh are the ids of those seen, whose answers are shown too.
let mine = 0;
const fresh = new Set();

// sending is called before the page asks the lab to send a request (a
// re-send, the learner's own), refused when the lab did not send it.
export function sending() { mine++; }
export function refused() { mine = Math.max(0, mine - 1); }

// shown is the story's visible band, below the sticky lane headers.
function shown(s) {
  const b = s.getBoundingClientRect();
  const top = b.top + s.clientTop;
  return { top: Math.max(top, s.querySelector(".lanes").getBoundingClientRect().bottom), bottom: top + s.clientHeight };
}

// atTimelineEnd: the timeline's last row is in sight (or scrolled past).
function atTimelineEnd(s) {
  const last = rows().lastElementChild;
  return !last || last.getBoundingClientRect().bottom <= shown(s).bottom + 4;
}

function atStoryEnd(s) {
  return s.scrollHeight - s.clientHeight - s.scrollTop <= 4;
}

// bring scrolls the story (and only it) to show el; its top first.
function bring(s, el) {
  const r = el.getBoundingClientRect(), band = shown(s);
  if (r.bottom > band.bottom) scrollStory(s, s.scrollTop + Math.min(r.bottom - band.bottom + 8, r.top - band.top));
  else if (r.top < band.top) scrollStory(s, s.scrollTop - (band.top - r.top + 8));
}

// watch wires the story's scrolling; call it once.
export function watch() {
  const s = story();
  s.addEventListener("scroll", () => {
    if (Math.abs(s.scrollTop - ours) < 1) return; // the page's own
    ours = -1;
    view.follow = s.scrollHeight > s.clientHeight && atTimelineEnd(s);
    if (view.below ? atStoryEnd(s) : atTimelineEnd(s)) seen();
  }, { passive: true });
  // A row brought into view by focus (Tab to its buttons) lands below the
  // sticky lane headers: the browser's own scrolling leaves it under them.
  s.addEventListener("focusin", (ev) => {
    const li = ev.target.closest && ev.target.closest("#rows > li");
    if (li) {
      bring(s, li);
      view.follow = s.scrollHeight > s.clientHeight && atTimelineEnd(s);
    }
  });
  document.getElementById("jump").addEventListener("click", () => {
    if (view.below) scrollStory(s, s.scrollHeight);
    else bring(s, rows().lastElementChild);
    view.follow = true;
    seen();
    s.focus({ preventScroll: true });
  });
}

function seen() {
  view.unseen = 0;
  view.below = "";
  document.getElementById("jump").hidden = true;
}

// grew is called after the story got something new (a row at the
// timeline's end; the checks or the metrics below it): followed when the
// learner sees the timeline's end, else announced by the jump button when
// it is out of sight.
export function grew(what = "row") {
  const s = story();
  const el = what === "row" ? rows().lastElementChild : document.getElementById(what === "checks" ? "outcome" : "metrics-section");
  if (view.follow) {
    if (what === "row") bring(s, el);
    else scrollStory(s, s.scrollHeight);
    return;
  }
  if (el.getBoundingClientRect().top < shown(s).bottom - 12) return; // in sight, or above
  if (what === "row") view.unseen++;
  else if (view.below !== "checks") view.below = what; // the checks first
  const text = view.below === "checks" ? "the lesson's checks below" : view.below === "metrics" ? "the metrics below"
    : view.unseen === 1 ? "1 new row below" : `${view.unseen} new rows below`;
  document.getElementById("jump-text").textContent = text;
  document.getElementById("jump").hidden = false;
}

// reveal brings a row of the learner's own request into view, wherever
// they were reading, and follows the timeline from there.
function reveal(li) {
  const s = story();
  bring(s, li);
  view.follow = atTimelineEnd(s);
  if (view.follow && !view.below) seen();
}

function announce(text) {
  document.getElementById("announce").textContent = text;
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

// nw is a name that must not break across lines (a state: FAILED_RETRYABLE).
function nw(text) {
  return el("span", { class: "nw" }, text);
}

function badge(text, cls = "") {
  return el("span", { class: "badge " + cls }, text);
}

// short abbreviates the ids in a path or a key: a UUIDv7's tail tells
// orders apart, the run id prefix is the same on every key.
function short(s) {
  return s.replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}([0-9a-f]{8})/g, "…$1");
}
function shortKey(k) {
  return k.replace(/^demo-[0-9a-f]{8}-/, "");
}

function row(kind, e, ...cells) {
  const secs = startedAt ? ((Date.parse(e.at) - startedAt) / 1000).toFixed(2) : "0.00";
  const li = el("li", { class: kind, "data-kind": kind.split(" ")[0], "data-seq": String(e.seq) },
    el("span", { class: "t" }, "+" + secs + "s"), ...cells);
  rows().append(li);
  grew();
  return li;
}

// orders holds each order's last status the order lane showed.
const orders = new Map();

// storedNow says, on a replayed answer, that it is the stored first answer
// and, when the order has moved on since, where it is now.
function storedNow(li) {
  const then = li.dataset.orderStatus, now = orders.get(li.dataset.order);
  let text = "the first answer under this key, as stored" + (then ? ` (the order was ${then} then)` : "");
  if (then && now && now !== then) text += ` · the order is ${now} now`;
  li.dataset.orderNow = now || "";
  li.querySelector(".stored").textContent = text;
}

// clear empties the timeline for a new lesson, which reads from its top.
export function clear(e) {
  startedAt = e ? Date.parse(e.at) : 0;
  rows().replaceChildren();
  scrollStory(story(), 0);
  view.follow = false;
  fresh.clear();
  orders.clear();
  seen();
}

export function empty(text) {
  rows().replaceChildren(el("li", {}, el("span", { class: "t" }), el("span", { class: "empty" }, text)));
}

// draw adds the rows an event stands for; resend(id, newKey) is called by
// the buttons on a request.
export function draw(e, resend) {
  switch (e.kind) {
    case "request": {
      const r = e.request;
      document.querySelector(`li.wait[data-request="${r.id}"]`)?.remove();
      // A request without a key (a GET, the channel's webhook) is sent
      // again as it was: a key would make it another request.
      const buttons = r.key ? el("span", { class: "resend" },
        el("button", { type: "button", title: "send this request again with the same Idempotency-Key", onclick: () => resend(r.id, false) }, "↻ same key"),
        el("button", { type: "button", title: "send it again under a new key: a new intent", onclick: () => resend(r.id, true) }, "↻ new key"))
        : el("span", { class: "resend" },
          el("button", { type: "button", title: "send this request again as it was, without an Idempotency-Key", onclick: () => resend(r.id, false) }, "↻ send again"));
      const li = row("req", e, el("div", { class: "pill" },
        el("div", { class: "head" },
          el("b", { class: "arrow" }, `#${r.id} ${r.method} ${short(r.path)}`),
          r.naive ? badge("naive: " + r.naive, "naive") : null,
          r.resend > 0 ? badge(`re-send of #${r.resend}`) : r.resend < 0 ? badge("your request") : null,
          r.trace_url ? el("a", { class: "trace", href: r.trace_url, target: "_blank", rel: "noopener",
            title: "this request's trace, " + r.trace_id }, "trace ↗") : null,
          buttons),
        r.key ? el("span", { class: "sub mono" }, "Idempotency-Key: " + shortKey(r.key)) : null));
      li.dataset.request = String(r.id);
      li.dataset.resend = String(r.resend || 0);
      li.dataset.key = r.key || "";
      li.dataset.operation = r.operation || "";
      li.dataset.naive = r.naive || "";
      li.dataset.traceId = r.trace_id || "";
      if (r.resend && mine > 0) {
        mine--;
        fresh.add(r.id);
        li.classList.add("fresh");
        reveal(li);
        announce(`#${r.id} ${r.resend > 0 ? "sent again (re-send of #" + r.resend + ")" : "your request"}: its rows are at the end of the timeline`);
      }
      break;
    }
    case "answer": {
      const a = e.answer;
      const cls = a.error ? "none" : a.status === 409 ? "s409" : "s" + String(a.status)[0];
      const head = a.error ? `✕ #${a.request_id} ${a.error}` : `← #${a.request_id} ${a.status} ${statusText(a.status)}`;
      const parts = [];
      if (a.code) parts.push(a.code);
      if (a.order_id) parts.push(`order ${short(a.order_id)} ${a.order_status}`);
      if (a.location) parts.push("Location: " + short(a.location));
      parts.push(`${a.ms} ms`);
      // A replay is the first answer as it was stored, its order status
      // that moment's: said so, with the order's status now once known.
      const stored = a.replayed ? el("span", { class: "sub stored" }) : null;
      const li = row("ans " + cls, e, el("div", { class: "pill" },
        el("b", {}, head),
        a.replayed ? badge("Idempotent-Replayed: true", "replayed") : null,
        a.retry_after ? badge("Retry-After: " + a.retry_after, "retry") : null,
        a.instance ? badge("instance " + a.instance) : null,
        el("span", { class: "sub" }, parts.join(" · ")),
        stored));
      li.dataset.request = String(a.request_id);
      li.dataset.status = String(a.status || 0);
      li.dataset.replayed = String(!!a.replayed);
      li.dataset.order = a.order_id || "";
      li.dataset.orderStatus = a.order_status || "";
      if (stored) storedNow(li);
      if (fresh.has(a.request_id)) {
        li.classList.add("fresh");
        reveal(li);
        announce(`#${a.request_id} answered ${a.error || a.status + (a.replayed ? ", replayed" : "")}`);
      }
      break;
    }
    case "record": {
      const r = e.record;
      const li = row("rec", e, el("div", { class: "pill" },
        el("b", {}, r.operation + " ", nw(r.state)),
        el("span", { class: "sub" }, `${shortKey(r.key)} · attempts ${r.attempts} · lease_token ${r.lease_token}` +
          (r.state === "PROCESSING" || r.state === "FAILED_RETRYABLE" ? ` · lease ${r.lease}` : ""))));
      li.dataset.state = r.state;
      li.dataset.leaseToken = String(r.lease_token);
      break;
    }
    case "order":
      orders.set(e.order.id, e.order.status);
      row("ord", e, el("div", { class: "pill" }, el("b", {}, short(e.order.id)), " ", nw(e.order.status)))
        .dataset.order = e.order.id;
      for (const li of document.querySelectorAll('#rows li[data-kind="ans"][data-replayed="true"]')) {
        if (li.dataset.order === e.order.id) storedNow(li);
      }
      break;
    case "charge": {
      const c = e.charge;
      const absorbed = c.requests > 1 ? ` (${c.requests - 1} absorbed)` : "";
      const li = row("chg", e, el("div", { class: "pill" },
        el("b", {}, short(c.id) + " ", nw(c.status)),
        el("span", { class: "sub" }, `${(c.amount / 100).toFixed(2)} · ${c.requests} request${c.requests === 1 ? "" : "s"}${absorbed}`)));
      li.dataset.charge = c.id;
      li.dataset.requests = String(c.requests);
      break;
    }
    case "message": {
      const m = e.message;
      if (["command", "replay", "republish"].includes(m.kind)) document.querySelector('li.wait[data-request="0"]')?.remove();
      const name = m.subject.split(".").slice(-1)[0];
      let head, sub = [];
      switch (m.kind) {
        case "command":
          head = `⇢ command ${name}`;
          if (m.seq) sub.push(`ORDER_COMMANDS #${m.seq}`);
          break;
        case "result":
          head = `⇠ result ${name} · Status ${m.status}`;
          if (m.code) sub.push(m.code);
          if (m.order_id) sub.push(`order ${short(m.order_id)} ${m.order_status}`);
          break;
        case "event":
          head = `✉ event ${m.event}`;
          sub.push("Nats-Msg-Id " + short(m.msg_id));
          break;
        case "dead_letter":
          head = `☠ dead letter ${name}`;
          sub.push(`ORDER_COMMANDS_DLQ #${m.seq} · ${m.deliveries} deliveries`, m.reason);
          break;
        case "replay":
          head = `↺ dlq replay #${m.seq}`;
          sub.push("to " + m.subject);
          break;
        case "republish":
          head = `↺ event ${m.event} published again`;
          sub.push("Nats-Msg-Id " + short(m.msg_id) + ` · ORDER_EVENTS #${m.seq}`);
          break;
        default:
          head = m.kind;
      }
      if (m.key) sub.push("key " + shortKey(m.key));
      const li = row("msg " + m.kind, e, el("div", { class: "pill", title: m.subject },
        el("b", {}, head),
        m.replayed ? badge("Idempotent-Replayed: true", "replayed") : null,
        m.duplicate ? badge("duplicate: dropped", "retry") : null,
        el("span", { class: "sub" }, sub.join(" · "))));
      Object.assign(li.dataset, { msgKind: m.kind, subject: m.subject, key: m.key || "", status: String(m.status || 0),
        replayed: String(!!m.replayed), duplicate: String(!!m.duplicate), msgId: m.msg_id || "",
        deliveries: String(m.deliveries || 0), order: m.order_id || "" });
      break;
    }
    case "say":
      if (e.text) row("say " + e.style, e, el("span", { class: "line" }, short(e.text)));
      break;
    case "table": {
      const [head, ...body] = e.rows;
      const table = el("table", {},
        el("thead", {}, el("tr", {}, ...head.map((h) => el("th", {}, h)))),
        el("tbody", {}, ...body.map((r) => el("tr", {}, ...r.map((c) => el("td", {}, c))))));
      row("tbl", e, el("div", { class: "wrap" }, table));
      break;
    }
    case "waiting": {
      const r = e.request;
      const li = row("wait", e, el("div", { class: "pill" },
        el("b", {}, `▷ next: ${r.method} ${short(r.path)}`),
        el("span", { class: "sub" }, "press n (Next request) to send it" + (r.key ? " · key " + shortKey(r.key) : ""))));
      li.dataset.request = String(r.id);
      break;
    }
  }
}

const texts = { 200: "OK", 201: "Created", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 402: "Payment Required", 404: "Not Found",
  409: "Conflict", 422: "Unprocessable Entity", 500: "Internal Server Error", 503: "Service Unavailable" };
function statusText(s) { return texts[s] || ""; }
