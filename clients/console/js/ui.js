// Widgets shared by the pages: tables, cursor paging, forms, messages, the admin-only rule.
import {h, replace, fmtValue} from './dom.js';
import {isAdmin} from './api.js';

export function page(title, ...children) {
  return h('section', {class: 'page'}, h('h1', null, title), children);
}

export function panel(title, ...children) {
  return h('section', {class: 'panel'}, title ? h('h2', null, title) : null, children);
}

export function errorText(e) {
  if (!e) return '';
  if (e.code && e.message && e.message !== e.code) return `${e.code}: ${e.message}`;
  return e.code || e.message || String(e);
}

export function errorBox(e) {
  const text = e && e.status === 404 && e.code === 'http_404'
    ? 'This backend does not offer this API (404).'
    : errorText(e);
  return h('p', {class: 'msg error', role: 'alert'}, text);
}

export function note(text, kind) {
  return h('p', {class: ['msg', kind || 'info']}, text);
}

// A place a result or an error is shown in, replaced at each action.
export function status() {
  const node = h('div', {class: 'status', 'aria-live': 'polite'});
  node.ok = (text) => replace(node, note(text, 'ok'));
  node.fail = (e) => replace(node, errorBox(e));
  node.info = (text) => replace(node, note(text, 'info'));
  node.clear = () => replace(node);
  return node;
}

// A change control: for a viewer it is disabled and marked (the server refuses anyway).
export function adminOnly(control) {
  if (!isAdmin()) {
    control.disabled = true;
    control.classList.add('admin-only');
    control.setAttribute('title', 'Needs the admin role');
  }
  return control;
}

export function button(label, onClick, opts = {}) {
  const b = h('button', {type: opts.submit ? 'submit' : 'button', class: opts.class, dataset: opts.dataset}, label);
  if (onClick) b.addEventListener('click', onClick);
  return opts.admin ? adminOnly(b) : b;
}

// Runs an async action with its button disabled meanwhile; errors go to `st`.
export async function busy(btn, st, fn) {
  const was = btn ? btn.disabled : false;
  if (btn) btn.disabled = true;
  try {
    return await fn();
  } catch (e) {
    if (st) st.fail(e);
    else throw e;
  } finally {
    if (btn) btn.disabled = was;
  }
}

export function field(label, input, hint) {
  return h('label', {class: 'field'}, h('span', {class: 'label'}, label), input, hint ? h('span', {class: 'hint'}, hint) : null);
}

export function input(name, attrs = {}) {
  return h('input', {name, type: 'text', autocomplete: 'off', spellcheck: 'false', ...attrs});
}

export function select(name, options, value) {
  const s = h('select', {name});
  for (const o of options) {
    const [v, label] = Array.isArray(o) ? o : [o, o];
    s.appendChild(h('option', {value: v, selected: v === value}, label));
  }
  return s;
}

// columns: [{label, value: (row) => string|Node, class?}]
export function table(columns, rows, opts = {}) {
  const head = h('tr', null, columns.map((c) => h('th', {class: c.class}, c.label)));
  const body = h('tbody');
  for (const r of rows) body.appendChild(rowOf(columns, r, opts));
  const t = h('table', {class: ['grid', opts.class]}, h('thead', null, head), body);
  if (!rows.length && opts.empty !== null) {
    body.appendChild(h('tr', {class: 'empty'}, h('td', {colspan: columns.length}, opts.empty || 'Nothing yet.')));
  }
  return t;
}

export function rowOf(columns, r, opts = {}) {
  const tr = h('tr', {class: opts.rowClass ? opts.rowClass(r) : null});
  for (const c of columns) {
    const v = c.value(r);
    tr.appendChild(h('td', {class: c.class}, v instanceof Node ? v : fmtCell(v)));
  }
  return tr;
}

function fmtCell(v) {
  if (v === null || v === undefined || v === '') return '—';
  if (typeof v === 'object') return JSON.stringify(v);
  return String(v);
}

export function kv(pairs) {
  return h('dl', {class: 'kv'}, pairs.map(([k, v]) => [h('dt', null, k), h('dd', null, v instanceof Node ? v : fmtCell(v))]));
}

export function pre(value) {
  return h('pre', {class: 'json'}, fmtValue(value));
}

// A list read page by page with the API's cursor: load(cursor) → {items, nextCursor}.
// Returns a node with the table and a "More" button that appends the next page.
export function pagedTable(columns, load, opts = {}) {
  const wrap = h('div', {class: 'paged'});
  const st = status();
  const tbl = table(columns, [], {...opts, empty: null});
  const tbody = tbl.querySelector('tbody');
  const more = button('More', () => next(), {class: 'secondary'});
  more.hidden = true;
  let cursor = null;
  let count = 0;
  const counter = h('span', {class: 'muted count'});
  async function next() {
    await busy(more, st, async () => {
      const res = await load(cursor);
      const items = (res && res.items) || [];
      for (const r of items) tbody.appendChild(rowOf(columns, r, opts));
      count += items.length;
      cursor = res ? res.nextCursor || null : null;
      more.hidden = !cursor;
      counter.textContent = count ? `${count} shown${cursor ? ', more available' : ''}` : '';
      if (!count) tbody.appendChild(h('tr', {class: 'empty'}, h('td', {colspan: columns.length}, opts.empty || 'Nothing found.')));
      st.clear();
    });
  }
  wrap.append(tbl, h('div', {class: 'pager'}, more, counter), st);
  wrap.ready = next();
  return wrap;
}

// An in-page confirmation (no window.confirm): the operator types `word` to enable the action.
export function confirmBox(text, word, onConfirm) {
  const inp = input('confirm', {placeholder: word, 'aria-label': 'Type to confirm'});
  const go = button('Confirm', null, {class: 'danger', admin: true});
  go.disabled = true;
  inp.addEventListener('input', () => {
    go.disabled = !isAdmin() || inp.value !== word;
  });
  const box = h('div', {class: 'confirm', role: 'dialog'},
    h('p', null, text), h('p', {class: 'muted'}, 'Type ', h('code', null, word), ' to confirm.'),
    h('div', {class: 'row'}, inp, go, button('Cancel', () => box.remove(), {class: 'secondary'})));
  go.addEventListener('click', () => onConfirm(box, go));
  return box;
}

export function link(href, text) {
  return h('a', {href}, text);
}

// "#/route/a%2Fb" pieces.
export function route(...parts) {
  return '#/' + parts.map((p) => encodeURIComponent(String(p))).join('/');
}
