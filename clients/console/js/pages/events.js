import {h, fmtTime, fromLocalInput, toLocalInput, replace} from '../dom.js';
import {get, withQuery} from '../api.js';
import {page, panel, pagedTable, field, input, rowOf, button, note} from '../ui.js';

const TAIL_MAX_ROWS = 500;
const FILTERS = ['appKey', 'stream', 'event', 'user', 'euid'];

function propsText(p) {
  if (p === null || p === undefined) return '';
  const s = typeof p === 'object' ? JSON.stringify(p) : String(p);
  return s.length > 300 ? `${s.slice(0, 300)}…` : s;
}

const COLUMNS = [
  {label: 'Time', value: (r) => fmtTime(r.timeMs)},
  {label: 'Event', value: (r) => h('span', {class: 'event-name'}, r.event === undefined ? '' : String(r.event)), class: 'event'},
  {label: 'AppKey', value: (r) => r.appKey},
  {label: 'Stream', value: (r) => r.stream},
  {label: 'User', value: (r) => r.userId || r.euid},
  {label: 'Install', value: (r) => r.installId},
  {label: 'Properties', value: (r) => h('code', {class: 'props'}, propsText(r.properties))},
];

export function render({root, query, navigate}) {
  const inputs = Object.fromEntries(FILTERS.map((k) => [k, input(k, {id: `events-${k}`, value: query[k] || ''})]));
  const from = input('from', {id: 'events-from', type: 'datetime-local', value: query.fromMs ? toLocalInput(Number(query.fromMs)) : ''});
  const to = input('to', {id: 'events-to', type: 'datetime-local', value: query.toMs ? toLocalInput(Number(query.toMs)) : ''});
  const form = h('form', {class: 'filters', id: 'events-filters'},
    field('AppKey', inputs.appKey), field('Stream', inputs.stream), field('Event', inputs.event),
    field('User id', inputs.user), field('EUID', inputs.euid), field('From', from), field('To', to),
    h('button', {type: 'submit'}, 'Filter'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    for (const k of FILTERS) if (inputs[k].value.trim()) p.set(k, inputs[k].value.trim());
    const f = fromLocalInput(from.value), t = fromLocalInput(to.value);
    if (f) p.set('fromMs', String(f));
    if (t) p.set('toMs', String(t));
    navigate(`#/events?${p}`);
  });

  const q = {};
  for (const k of [...FILTERS, 'fromMs', 'toMs']) if (query[k]) q[k] = query[k];
  // Every search is one index range: event, user and EUID filters go with an AppKey (or the
  // AppKey's stream ma.<AppKey>), as the API requires.
  const needsApp = (q.event || q.user || q.euid) && !q.appKey && !(q.stream || '').startsWith('ma.');
  const list = needsApp
    ? note('Filtering by event, user id or EUID needs an AppKey (or the stream ma.<AppKey>).', 'info')
    : pagedTable(COLUMNS, (cursor) => get('/v1/admin/events', {...q, cursor, limit: 50}), {empty: 'No event matches.', class: 'events'});
  list.id = 'events-list';

  // Live tail: Server-Sent Events, the same filters (AppKey, event, stream). The cookie goes
  // with the same-origin request; nothing is put in the URL but the filters.
  let source = null;
  const tailBody = h('tbody');
  const tailTable = h('table', {class: 'grid events', id: 'tail-table'},
    h('thead', null, h('tr', null, COLUMNS.map((c) => h('th', null, c.label)))), tailBody);
  const tailState = h('span', {class: 'badge idle', id: 'tail-state'}, 'stopped');
  const tailBtn = button('Start live tail', () => (source ? stop() : start()));
  tailBtn.id = 'tail-toggle';
  const tailMsg = h('div');
  function setState(text, cls) {
    tailState.textContent = text;
    tailState.className = `badge ${cls}`;
  }
  function start() {
    const url = withQuery('/v1/admin/events/tail', {appKey: q.appKey, event: q.event, stream: q.stream});
    source = new EventSource(url);
    tailBtn.textContent = 'Stop live tail';
    setState('connecting', 'idle');
    replace(tailBody, h('tr', {class: 'empty'}, h('td', {colspan: COLUMNS.length}, 'Waiting for events…')));
    source.addEventListener('open', () => setState('live', 'good'));
    source.addEventListener('record', (ev) => {
      let item;
      try {
        item = JSON.parse(ev.data);
      } catch (e) {
        return;
      }
      const waiting = tailBody.querySelector('tr.empty');
      if (waiting) waiting.remove();
      tailBody.prepend(rowOf(COLUMNS, item));
      while (tailBody.childElementCount > TAIL_MAX_ROWS) tailBody.lastElementChild.remove();
    });
    source.addEventListener('error', () => {
      if (source && source.readyState === EventSource.CLOSED) {
        setState('closed', 'bad');
        replace(tailMsg, note('The live tail was closed by the backend (too many clients, or the session ended).', 'error'));
      } else {
        setState('reconnecting', 'idle');
      }
    });
  }
  function stop() {
    if (source) source.close();
    source = null;
    tailBtn.textContent = 'Start live tail';
    setState('stopped', 'idle');
  }

  root.appendChild(page('Events', form,
    panel('Live tail', h('div', {class: 'toolbar'}, tailBtn, tailState,
      h('span', {class: 'muted'}, `newest first, the last ${TAIL_MAX_ROWS}; filters: AppKey, event, stream`)), tailMsg, tailTable),
    panel('Stored events', list)));
  if (query.tail === '1') start();
  return stop;
}
