import {h, fmtTime, fmtNum, fmtRate, replace, fromLocalInput, toLocalInput} from '../dom.js';
import {get, post, del, seg, isAdmin} from '../api.js';
import {page, panel, errorBox, table, pagedTable, field, input, select, status, button, busy, link, route, note} from '../ui.js';
import {funnel} from '../chart.js';

const MAX_USERS = 1000;
const DETAIL_REFRESH_MS = 2000;

// {type, value} (history) or a send body {targetType, target} (scheduled) → "user: ann".
function targetText(t) {
  if (!t || typeof t !== 'object') return t === undefined || t === null ? '—' : String(t);
  const type = t.type || t.targetType || 'device';
  const value = t.value !== undefined ? t.value : t.target;
  if (type === 'broadcast') return 'everyone';
  if (Array.isArray(t.targets)) return `${type}: ${t.targets.length} (${t.targets.slice(0, 3).join(', ')}${t.targets.length > 3 ? ', …' : ''})`;
  return value !== undefined && value !== '' ? `${type}: ${value}` : type;
}

// The backend's reasons carry times as epoch milliseconds ("reported at 1796207251104"): shown
// as local times.
function reasonText(r) {
  if (r === null || r === undefined) return '';
  return String(r).replace(/\b1\d{12}\b/g, (ms) => fmtTime(Number(ms)));
}

function funnelText(c) {
  c = c || {};
  return `${fmtNum(c.sent)} → ${fmtNum(c.delivered)} (${fmtRate(c.delivered, c.sent)}) → ${fmtNum(c.opened)} (${fmtRate(c.opened, c.sent)})`;
}

// The composer's fields → the send body of POST /v1/admin/push/send (docs/backend-openapi.yaml).
function readComposer(f) {
  const body = {appId: f.appId.value.trim(), title: f.title.value, content: f.body.value};
  const type = f.targetType.value;
  if (type === 'broadcast') {
    body.targetType = 'broadcast';
  } else if (type === 'users') {
    const ids = f.target.value.split(/[\s,]+/).filter(Boolean);
    if (!ids.length) throw new Error('Give at least one user id.');
    if (ids.length > MAX_USERS) throw new Error(`At most ${MAX_USERS} user ids in one send.`);
    body.targetType = 'users';
    body.targets = ids;
  } else {
    if (!f.target.value.trim()) throw new Error('Give the target.');
    body.targetType = type;
    body.target = f.target.value.trim();
  }
  if (f.data.value.trim()) {
    let data;
    try {
      data = JSON.parse(f.data.value);
    } catch (e) {
      throw new Error(`Data is not JSON: ${e.message}`);
    }
    if (!data || typeof data !== 'object' || Array.isArray(data)) throw new Error('Data must be a JSON object.');
    for (const [k, v] of Object.entries(data)) {
      if (typeof v !== 'string') throw new Error(`Data value of "${k}" must be a string.`);
    }
    body.extendedParams = data;
  }
  if (f.deepLink.value.trim()) body.uri = f.deepLink.value.trim();
  if (f.expiry.value) body.expiredSeconds = Number(f.expiry.value);
  if (f.msgKey.value.trim()) body.msgKey = f.msgKey.value.trim();
  if (!body.appId && type !== 'device') throw new Error('Give the app id.');
  if (!body.appId) delete body.appId;
  return body;
}

function composer(onSent) {
  const f = {
    appId: input('appId', {id: 'push-appid', placeholder: 'the app (appId)'}),
    targetType: select('targetType', [['device', 'a device (token)'], ['user', 'a user'], ['users', 'a list of users'], ['broadcast', 'everyone']], 'user'),
    target: h('textarea', {name: 'target', id: 'push-target', rows: 1, placeholder: 'user id', spellcheck: 'false'}),
    title: input('title', {id: 'push-title', maxlength: 1024}),
    body: h('textarea', {name: 'body', id: 'push-body', rows: 3, maxlength: 4096}),
    data: h('textarea', {name: 'data', id: 'push-data', rows: 2, placeholder: '{"key": "value"}', spellcheck: 'false'}),
    deepLink: input('deepLink', {id: 'push-deeplink', placeholder: 'myapp://screen'}),
    expiry: input('expiry', {id: 'push-expiry', type: 'number', min: 1, max: 2592000, placeholder: '259200 (3 days)'}),
    msgKey: input('msgKey', {id: 'push-msgkey', placeholder: 'optional dedup key'}),
    at: input('at', {id: 'push-at', type: 'datetime-local', value: toLocalInput(Date.now() + 10 * 60000)}),
    testToken: input('testToken', {id: 'push-test-token', placeholder: 'device token'}),
  };
  f.targetType.id = 'push-target-type';
  const hints = {device: 'device token', user: 'user id', users: 'user ids, one per line or comma-separated', broadcast: ''};
  f.targetType.addEventListener('change', () => {
    f.target.placeholder = hints[f.targetType.value];
    f.target.disabled = f.targetType.value === 'broadcast';
    f.target.rows = f.targetType.value === 'users' ? 4 : 1;
  });
  const st = status();
  st.id = 'push-status';
  const send = button('Send now', null, {admin: true, dataset: {action: 'send'}});
  send.id = 'push-send';
  const schedule = button('Schedule', null, {admin: true, class: 'secondary', dataset: {action: 'schedule'}});
  schedule.id = 'push-schedule';
  const test = button('Test send', null, {admin: true, class: 'secondary', dataset: {action: 'test'}});
  test.id = 'push-test';

  send.addEventListener('click', () => busy(send, st, async () => {
    const body = readComposer(f);
    let res;
    if (body.targetType === 'users') {
      res = await sendToUsers(body);
    } else {
      res = await post('/v1/admin/push/send', body);
    }
    st.ok(`Sent: message ${res.msgId || res.id || ''} to ${fmtNum(res.devices)} device(s)${res.duplicate ? ' (duplicate msgKey: the first send stands)' : ''}.`);
    onSent(res.msgId || res.id);
  }));
  schedule.addEventListener('click', () => busy(schedule, st, async () => {
    const body = readComposer(f);
    const atMs = fromLocalInput(f.at.value);
    if (!atMs || atMs <= Date.now()) throw new Error('Choose a time in the future.');
    const res = await post('/v1/admin/push/schedule', {...body, atMs});
    st.ok(`Scheduled ${res.id} for ${fmtTime(atMs)}.`);
    onSent(null);
  }));
  test.addEventListener('click', () => busy(test, st, async () => {
    const body = readComposer({...f, targetType: {value: 'device'}, target: f.testToken});
    const res = await post('/v1/admin/push/send', body);
    st.ok(`Test sent: message ${res.msgId || ''} to ${fmtNum(res.devices)} device.`);
    onSent(res.msgId);
  }));

  const form = h('form', {class: 'composer', id: 'push-composer'},
    h('div', {class: 'grid2'},
      field('App id', f.appId), field('Target', f.targetType),
      field('Recipients', f.target), field('Deep link', f.deepLink),
      field('Title', f.title), field('Expiry (seconds)', f.expiry),
      field('Body', f.body), field('Data (JSON object of strings)', f.data),
      field('Message key', f.msgKey, 'a repeat with the same key is not sent again')),
    h('div', {class: 'row actions'}, send,
      h('span', {class: 'sep'}), field('At', f.at), schedule,
      h('span', {class: 'sep'}), field('Test device', f.testToken), test),
    st);
  form.addEventListener('submit', (ev) => ev.preventDefault());
  if (!isAdmin()) {
    for (const c of form.querySelectorAll('input, textarea, select')) c.disabled = true;
    form.prepend(note('Viewers can read the history; sending needs the admin role.', 'info'));
  }
  return form;
}

// A list of users: one message for all of them when the backend takes `users`, otherwise
// one send per user (each its own message in the history).
async function sendToUsers(body) {
  try {
    return await post('/v1/admin/push/send', body);
  } catch (e) {
    if (e.status !== 400) throw e;
  }
  let devices = 0;
  const ids = [];
  for (const u of body.targets) {
    const one = {...body, targetType: 'user', target: u};
    delete one.targets;
    const r = await post('/v1/admin/push/send', one);
    devices += Number(r.devices) || 0;
    ids.push(r.msgId);
  }
  return {msgId: ids.join(', '), devices};
}

function scheduledPanel() {
  const st = status();
  const wrap = h('div');
  async function load() {
    replace(wrap, pagedTable([
      {label: 'Id', value: (r) => r.id},
      {label: 'At', value: (r) => fmtTime(r.atMs)},
      {label: 'Target', value: (r) => targetText(r.send || r)},
      {label: 'Title', value: (r) => (r.send ? r.send.title : r.title)},
      {label: 'By', value: (r) => r.actor},
      {label: 'Status', value: (r) => (r.msgId ? `${r.status} (${r.msgId})` : r.error ? `${r.status}: ${r.error}` : r.status)},
      {label: '', value: (r) => {
        if (r.status !== 'pending') return null;
        const b = button('Cancel', null, {admin: true, class: 'danger small', dataset: {cancel: r.id}});
        b.addEventListener('click', () => busy(b, st, async () => {
          await del(`/v1/admin/push/scheduled/${seg(r.id)}`);
          st.ok(`Cancelled ${r.id}.`);
          load();
        }));
        return b;
      }},
    ], (cursor) => get('/v1/admin/push/scheduled', {cursor, limit: 50}), {empty: 'No scheduled send.'}));
  }
  load();
  const p = panel('Scheduled', wrap, st);
  p.reload = load;
  return p;
}

function historyPanel() {
  const wrap = h('div', {id: 'push-history'});
  function load() {
    replace(wrap, pagedTable([
      {label: 'Message', value: (r) => link(route('push', r.id), r.id)},
      {label: 'Created', value: (r) => fmtTime(r.createdMs)},
      {label: 'By', value: (r) => r.actor},
      {label: 'Target', value: (r) => targetText(r.target)},
      {label: 'Title', value: (r) => r.title},
      {label: 'Status', value: (r) => r.status},
      {label: 'Sent → delivered → opened', value: (r) => funnelText(r.counts), class: 'num'},
    ], (cursor) => get('/v1/admin/push/messages', {cursor, limit: 50}), {empty: 'No message sent yet.'}));
  }
  load();
  const p = panel('History', h('div', {class: 'toolbar'}, button('Refresh', load, {class: 'secondary'})), wrap);
  p.reload = load;
  return p;
}

function detailPanel(id) {
  const body = h('div', {id: 'push-detail', dataset: {msg: id}}, h('p', {class: 'muted'}, 'Loading…'));
  let timer = null;
  async function load() {
    try {
      const m = await get(`/v1/admin/push/messages/${seg(id)}`);
      replace(body,
        h('p', null, h('strong', null, m.title || '(no title)'), ' — ', m.body || m.content || ''),
        h('p', {class: 'muted'}, `${targetText(m.target)} · by ${m.actor || '—'} · ${fmtTime(m.createdMs)} · ${m.status || ''}`),
        funnel(m.counts || {}),
        table([
          {label: 'Install id', value: (r) => link(route('devices', r.installId), r.installId)},
          {label: 'State', value: (r) => h('span', {class: ['badge', `state-${r.state}`]}, r.state)},
          {label: 'Reason', value: (r) => reasonText(r.reason)},
          {label: 'Delivered', value: (r) => fmtTime(r.deliveredMs)},
          {label: 'Opened', value: (r) => fmtTime(r.openedMs)},
        ], m.devices || m.rows || [], {empty: 'No device row.'}),
        m.nextCursor ? note(`The first ${(m.devices || []).length} devices are shown.`, 'info') : null);
    } catch (e) {
      replace(body, errorBox(e));
    }
  }
  load();
  timer = setInterval(load, DETAIL_REFRESH_MS);
  const p = panel(`Message ${id}`, h('p', null, link('#/push', '× close')), body);
  p.stop = () => clearInterval(timer);
  return p;
}

function whyPanel(prefill) {
  const msg = input('messageId', {id: 'why-msg', value: prefill || '', placeholder: 'message id'});
  const inst = input('installId', {id: 'why-install', placeholder: 'install id'});
  const out = h('div', {id: 'why-result'});
  const st = status();
  const form = h('form', {class: 'filters'}, field('Message', msg), field('Device (install id)', inst), h('button', {type: 'submit'}, 'Why?'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(null, st, async () => {
      const r = await get('/v1/admin/push/why', {messageId: msg.value.trim(), installId: inst.value.trim()});
      replace(out, h('p', null, h('span', {class: ['badge', `state-${r.state}`]}, r.state), ' ', reasonText(r.reason)));
      st.clear();
    });
  });
  return panel('Why did it not arrive?', form, out, st);
}

export function render({root, params, navigate}) {
  const id = params[0];
  let detail = null;
  let sched = null, hist = null;
  const comp = composer((msgId) => {
    if (hist) hist.reload();
    if (sched) sched.reload();
    if (msgId && !String(msgId).includes(',')) navigate(route('push', msgId));
  });
  hist = historyPanel();
  sched = scheduledPanel();
  if (id) detail = detailPanel(id);
  root.appendChild(page('Push', detail, panel('Compose', comp), hist, sched, whyPanel(id)));
  return () => {
    if (detail) detail.stop();
  };
}
