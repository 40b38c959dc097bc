// The layer x step heatmap of viewer/charts/heatmap.py: one image (the server's raster), row
// labels, a step axis, a legend, and a tooltip read from the aggregated values sent beside the
// image.
// Every run-file string (tensor, layer, label) is set as text (textContent), never as HTML.

const LABEL_W = 320, RIGHT = 16, AXIS_H = 34;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function decode(b64, Type) {
  const raw = atob(b64), bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return new Type(bytes.buffer);
}

function fmt(v) {
  if (!isFinite(v)) return String(v);
  const a = Math.abs(v);
  return (a !== 0 && (a < 1e-3 || a >= 1e5)) ? v.toExponential(3) : String(Number(v.toPrecision(4)));
}

function niceTicks(lo, hi, n) {
  const span = hi - lo;
  if (!(span > 0)) return [lo];
  const raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) || 10 * mag;
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi; t += step) out.push(Math.round(t));
  return out;
}

function steps(first, last) {
  return first === last ? `step ${first}` : `steps ${first}–${last}`;
}

export default function ({ data, parentElement }) {
  const host = parentElement.querySelector('.tfi-heatmap');
  host.replaceChildren();
  const R = data.labels.length, P = data.first.length, H = Math.max(1, Math.round(R * data.row_px));
  const values = decode(data.values, Float32Array), state = decode(data.state, Uint8Array);
  host.setAttribute('role', 'img');
  host.setAttribute('aria-label', data.title);
  host.append(el('div', 'title', data.title));

  const body = el('div', 'body');
  body.style.height = `${H + AXIS_H}px`;
  const labels = el('div', 'labels');
  labels.style.width = `${LABEL_W - 8}px`;
  labels.style.height = `${H}px`;
  const every = Math.max(1, Math.ceil(12 / data.row_px));
  for (let i = 0; i < R; i += every) {
    const lab = el('div', 'label', data.labels[i]);
    lab.style.top = `${Math.max(0, Math.min(H - 14, (i + 0.5) * data.row_px - 7))}px`;
    labels.append(lab);
  }
  const plot = el('div', 'plot');
  plot.style.cssText = `left:${LABEL_W}px;right:${RIGHT}px;height:${H}px`;
  const img = el('img');
  img.src = data.png;
  img.alt = data.title;
  img.draggable = false;
  plot.append(img);

  const axis = el('div', 'axis');
  axis.style.cssText = `left:${LABEL_W}px;right:${RIGHT}px;top:${H}px`;
  const x0 = data.x0, x1 = data.x0 + data.step_px * P;
  const at = s => `${(100 * (s - x0)) / (x1 - x0)}%`;
  const lastCol = P - 1 - [...data.first].reverse().findIndex(f => f >= 0);
  const ends = [[data.first[0], x0 + data.step_px * 0.5], [data.last[lastCol], x0 + data.step_px * (lastCol + 0.5)]];
  const ticks = niceTicks(x0, x1, 8).filter(t => ends.every(([, x]) => Math.abs(x - t) > (x1 - x0) / 14));
  for (const [label, x, cls] of [...ticks.map(t => [t, t, 'tick']), ...ends.map(([l, x]) => [l, x, 'tick end'])]) {
    const e = el('div', cls, String(label));
    e.style.left = at(x);
    axis.append(e);
  }
  axis.append(el('div', 'axis-title', 'step'));
  const tip = el('div', 'tip');
  body.append(labels, plot, axis, tip);
  host.append(body, legend(data));

  plot.addEventListener('pointermove', e => {
    const r = plot.getBoundingClientRect();
    const j = Math.min(P - 1, Math.max(0, Math.floor(((e.clientX - r.left) / r.width) * P)));
    const i = Math.min(R - 1, Math.max(0, Math.floor(((e.clientY - r.top) / r.height) * R)));
    const s = state[i * P + j], v = values[i * P + j];
    const where = data.first[j] < 0
      ? `steps ${Math.ceil(x0 + j * data.step_px)}–${Math.floor(x0 + (j + 1) * data.step_px) - 1}`
      : steps(data.first[j], data.last[j]);
    const shown = ['', 'NaN/Inf', data.log ? '<= 0 (not on a log scale)' : '', 'no statistics'][s] || fmt(v);
    const own = data.own[i] ? `\n(own scale: ${fmt(data.domain[i][0])} to ${fmt(data.domain[i][1])})` : '';
    tip.textContent = `${data.tips[i]}\n${where}\n${data.stat}: ${shown}${own}`;
    tip.style.display = 'block';
    const b = body.getBoundingClientRect();
    const x = e.clientX - b.left + 14, y = e.clientY - b.top + 14;
    tip.style.left = `${Math.min(x, b.width - tip.offsetWidth - 4)}px`;
    tip.style.top = `${y}px`;
  });
  plot.addEventListener('pointerleave', () => { tip.style.display = 'none'; });
}

function legend(data) {
  // the colour bar: labelled ticks under it (the server's: decades on a log scale), or, where
  // every row has its own scale, words for its ends (the hover gives each cell's value)
  const box = el('div', 'legend');
  const scale = el('span', 'scale');
  const wrap = el('span', 'barwrap');
  const bar = el('div', 'bar');
  bar.style.background = `linear-gradient(to right, ${data.stops.join(', ')})`;
  wrap.append(bar);
  const ticks = data.ticks.length ? data.ticks : [[0, 'row min'], [1, 'row max']];
  for (const [x, text] of ticks) {
    const t = el('span', 'btick', text);
    t.style.left = `${100 * x}%`;
    wrap.append(t);
  }
  scale.append(wrap, el('span', 'note', `${data.stat}${data.log ? ' (log scale)' : ''}${data.scale_note ? ': ' + data.scale_note : ''}`));
  box.append(scale);
  for (const [color, text] of data.swatches) {
    const sw = el('span', 'swatch');
    const chip = el('span', 'chip');
    if (color) chip.style.background = color; else chip.classList.add('gap');
    sw.append(chip, el('span', '', text));
    box.append(sw);
  }
  return box;
}
