// The console's only way to build the page. Every string that reaches the DOM goes through
// createTextNode / textContent: stored data (event names, properties, user ids, container
// content) is hostile and is never parsed as HTML. No innerHTML, outerHTML, insertAdjacentHTML
// or document.write anywhere in the console.

const SVG_NS = 'http://www.w3.org/2000/svg';

// Attributes that could run code or load something are refused whatever the value.
function safeAttr(name) {
  const n = String(name).toLowerCase();
  return /^[a-z][a-z0-9-]*$/.test(n) && !n.startsWith('on') && n !== 'style' && n !== 'srcdoc';
}

// Links the console makes: its own hash routes only (no javascript:, no data:, no other origin).
function safeHref(v) {
  return typeof v === 'string' && v.startsWith('#');
}

function append(node, child) {
  if (child === null || child === undefined || child === false) return;
  if (Array.isArray(child)) {
    for (const c of child) append(node, c);
  } else if (child instanceof Node) {
    node.appendChild(child);
  } else {
    node.appendChild(document.createTextNode(String(child)));
  }
}

function applyAttrs(node, attrs) {
  if (!attrs) return;
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'on') {
      for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn);
    } else if (k === 'class') {
      node.setAttribute('class', Array.isArray(v) ? v.filter(Boolean).join(' ') : String(v));
    } else if (k === 'dataset') {
      for (const [dk, dv] of Object.entries(v)) node.dataset[dk] = String(dv);
    } else if (k === 'value' || k === 'checked' || k === 'disabled' || k === 'selected') {
      node[k] = v;
    } else if (k === 'href') {
      if (safeHref(v)) node.setAttribute('href', v);
    } else if (safeAttr(k)) {
      node.setAttribute(k, v === true ? '' : String(v));
    }
  }
}

// h('div', {class: 'x', on: {click: fn}}, 'text', child, [more]).
export function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  applyAttrs(node, attrs);
  append(node, children);
  return node;
}

export function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v !== null && v !== undefined && safeAttr(k)) node.setAttribute(k, String(v));
    }
  }
  append(node, children);
  return node;
}

// Appends children as h() does (null, undefined and false are skipped; Node.append would
// write them as text).
export function add(node, ...children) {
  append(node, children);
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export function replace(node, ...children) {
  clear(node);
  append(node, children);
  return node;
}

// ---- Formatting (all return plain strings) ------------------------------------------------------

export function fmtTime(ms) {
  if (ms === null || ms === undefined || ms === '') return '—';
  const d = new Date(Number(ms));
  if (Number.isNaN(d.getTime())) return String(ms);
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

export function fmtNum(n) {
  if (n === null || n === undefined || n === '') return '—';
  const x = Number(n);
  if (!Number.isFinite(x)) return String(n);
  return Number.isInteger(x) ? x.toLocaleString('en-US') : x.toLocaleString('en-US', {maximumFractionDigits: 2});
}

export function fmtRate(num, den) {
  const a = Number(num), b = Number(den);
  if (!b || !Number.isFinite(a) || !Number.isFinite(b)) return '—';
  return `${((100 * a) / b).toFixed(1)}%`;
}

// Any value as readable text (objects as indented JSON).
export function fmtValue(v) {
  if (v === null || v === undefined) return '—';
  if (typeof v === 'object') return JSON.stringify(v, null, 2);
  return String(v);
}

// Local "YYYY-MM-DDTHH:MM" for <input type=datetime-local>, and back to epoch milliseconds.
export function toLocalInput(ms) {
  const d = new Date(ms);
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}`;
}

export function fromLocalInput(s) {
  if (!s) return null;
  const t = new Date(s).getTime();
  return Number.isNaN(t) ? null : t;
}
