// Small charts of the seed's monitoring signals: the value after each
// lesson of the session as a line, the last lesson's change as a number.

const history = new Map(); // signal name -> values, the first one before the first lesson

export function record(signals) {
  for (const s of signals) {
    if (!history.has(s.name)) history.set(s.name, [s.before]);
    const h = history.get(s.name);
    h[h.length - 1] = s.before; // another instance may have answered the scrape
    h.push(s.after);
  }
}

export function render(container, signals) {
  container.replaceChildren(...signals.map((s) => chart(s, history.get(s.name) || [s.before, s.after])));
}

function chart(s, values) {
  const delta = s.after - s.before;
  const div = document.createElement("div");
  div.className = "chart";
  div.dataset.signal = s.name;
  div.dataset.moved = String(delta !== 0);
  div.title = s.series;
  const name = document.createElement("div");
  name.className = "name";
  name.textContent = s.name;
  const val = document.createElement("div");
  val.className = "val";
  val.textContent = fmt(s.after);
  const d = document.createElement("span");
  d.className = "delta";
  d.textContent = delta === 0 ? "no change" : (delta > 0 ? "+" : "") + fmt(delta);
  val.append(d);
  div.append(name, val, spark(values));
  return div;
}

function fmt(v) {
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}

function spark(values) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 100 34");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("aria-hidden", "true");
  const lo = Math.min(...values), hi = Math.max(...values);
  const span = hi - lo || 1;
  const step = values.length > 1 ? 100 / (values.length - 1) : 100;
  const pts = values.map((v, i) => [i * step, 30 - ((v - lo) / span) * 26]);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", pts.map((p) => p.join(",")).join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", "#2454d6");
  line.setAttribute("stroke-width", "2");
  line.setAttribute("vector-effect", "non-scaling-stroke");
  const last = pts[pts.length - 1];
  const dot = document.createElementNS(ns, "circle");
  dot.setAttribute("cx", last[0]);
  dot.setAttribute("cy", last[1]);
  dot.setAttribute("r", "2.5");
  dot.setAttribute("fill", "#2454d6");
  svg.append(line, dot);
  return svg;
}
