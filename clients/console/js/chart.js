// Hand-drawn SVG charts (no library): bars over time and a sent → delivered → opened funnel.
import {h, svg, fmtNum} from './dom.js';

// points: [{label, value, title?}]; opts: {height, label}
export function barChart(points, opts = {}) {
  const W = 640, H = opts.height || 160, padL = 44, padB = 22, padT = 8, padR = 8;
  // At least 4, so the three grid labels (0, half, max) are distinct integers.
  const max = Math.max(4, ...points.map((p) => Number(p.value) || 0));
  const innerW = W - padL - padR, innerH = H - padT - padB;
  const bw = points.length ? innerW / points.length : innerW;
  const root = svg('svg', {viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': opts.label || 'chart',
    preserveAspectRatio: 'none'});
  // Grid: 0, half, max.
  for (const f of [0, 0.5, 1]) {
    const y = padT + innerH * (1 - f);
    root.appendChild(svg('line', {x1: padL, x2: W - padR, y1: y, y2: y, class: 'grid-line'}));
    root.appendChild(svg('text', {x: padL - 4, y: y + 4, class: 'axis', 'text-anchor': 'end'}, fmtNum(Math.round(max * f))));
  }
  const labelEvery = Math.max(1, Math.ceil(points.length / 8));
  points.forEach((p, i) => {
    const v = Number(p.value) || 0;
    const bh = (innerH * v) / max;
    const x = padL + i * bw;
    const bar = svg('rect', {x: x + bw * 0.1, y: padT + innerH - bh, width: Math.max(1, bw * 0.8), height: bh, class: 'bar'},
      svg('title', null, `${p.title || p.label}: ${fmtNum(v)}`));
    root.appendChild(bar);
    if (i % labelEvery === 0) {
      root.appendChild(svg('text', {x: x + bw / 2, y: H - 6, class: 'axis', 'text-anchor': 'middle'}, p.label));
    }
  });
  return h('figure', {class: 'chart-wrap'}, root, opts.caption ? h('figcaption', null, opts.caption) : null);
}

// counts: {sent, delivered, opened} → three bars with counts and rates against `sent`.
export function funnel(counts) {
  const sent = Number(counts && counts.sent) || 0;
  const steps = [['sent', 'Sent'], ['delivered', 'Delivered'], ['opened', 'Opened']];
  return h('div', {class: 'funnel'}, steps.map(([k, label]) => {
    const n = Number(counts && counts[k]) || 0;
    const pct = sent ? Math.min(100, (100 * n) / sent) : 0;
    const bar = svg('svg', {viewBox: '0 0 100 8', class: 'funnel-bar', preserveAspectRatio: 'none', 'aria-hidden': 'true'},
      svg('rect', {x: 0, y: 0, width: 100, height: 8, class: 'track'}),
      svg('rect', {x: 0, y: 0, width: pct, height: 8, class: `fill fill-${k}`}));
    return h('div', {class: 'funnel-step', dataset: {step: k, count: n}},
      h('span', {class: 'funnel-label'}, label), bar,
      h('span', {class: 'funnel-count'}, fmtNum(n)),
      h('span', {class: 'funnel-rate'}, sent ? `${pct.toFixed(1)}%` : '—'));
  }));
}
