// The swimlane timeline: one row per event of the lesson on screen, placed
// in the lane it happened in (client, instance, record, order, channel,
// broker).

const rows = () => document.getElementById("rows");

let startedAt = 0;

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
  const list = rows();
  const atBottom = list.scrollTop + list.clientHeight >= list.scrollHeight - 30;
  list.append(li);
  if (atBottom) list.scrollTop = list.scrollHeight;
  return li;
}

// clear empties the timeline for a new lesson.
export function clear(e) {
  startedAt = e ? Date.parse(e.at) : 0;
  rows().replaceChildren();
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
      const buttons = el("span", { class: "resend" },
        el("button", { type: "button", title: "send this request again with the same Idempotency-Key", onclick: () => resend(r.id, false) }, "↻ same key"),
        el("button", { type: "button", title: "send it again under a new key: a new intent", onclick: () => resend(r.id, true) }, "↻ new key"));
      const li = row("req", e, el("div", { class: "pill" },
        el("div", { class: "head" },
          el("b", { class: "arrow" }, `#${r.id} ${r.method} ${short(r.path)}`),
          r.resend > 0 ? badge(`re-send of #${r.resend}`) : r.resend < 0 ? badge("your request") : null,
          buttons),
        r.key ? el("span", { class: "sub mono" }, "Idempotency-Key: " + shortKey(r.key)) : null));
      li.dataset.request = String(r.id);
      li.dataset.resend = String(r.resend || 0);
      li.dataset.key = r.key || "";
      li.dataset.operation = r.operation || "";
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
      const li = row("ans " + cls, e, el("div", { class: "pill" },
        el("b", {}, head),
        a.replayed ? badge("Idempotent-Replayed: true", "replayed") : null,
        a.retry_after ? badge("Retry-After: " + a.retry_after, "retry") : null,
        a.instance ? badge("instance " + a.instance) : null,
        el("span", { class: "sub" }, parts.join(" · "))));
      li.dataset.request = String(a.request_id);
      li.dataset.status = String(a.status || 0);
      li.dataset.replayed = String(!!a.replayed);
      break;
    }
    case "record": {
      const r = e.record;
      const li = row("rec", e, el("div", { class: "pill" },
        el("b", {}, `${r.operation} ${r.state}`),
        el("span", { class: "sub" }, `${shortKey(r.key)} · attempts ${r.attempts} · lease_token ${r.lease_token}` +
          (r.state === "PROCESSING" || r.state === "FAILED_RETRYABLE" ? ` · lease ${r.lease}` : ""))));
      li.dataset.state = r.state;
      li.dataset.leaseToken = String(r.lease_token);
      break;
    }
    case "order":
      row("ord", e, el("div", { class: "pill" }, el("b", {}, short(e.order.id)), " " + e.order.status))
        .dataset.order = e.order.id;
      break;
    case "charge": {
      const c = e.charge;
      const absorbed = c.requests > 1 ? ` (${c.requests - 1} absorbed)` : "";
      const li = row("chg", e, el("div", { class: "pill" },
        el("b", {}, `${short(c.id)} ${c.status}`),
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

const texts = { 200: "OK", 201: "Created", 400: "Bad Request", 402: "Payment Required", 404: "Not Found",
  409: "Conflict", 422: "Unprocessable Entity", 500: "Internal Server Error", 503: "Service Unavailable" };
function statusText(s) { return texts[s] || ""; }
