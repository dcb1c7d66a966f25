import {h, add, fmtTime} from '../dom.js';
import {get, seg} from '../api.js';
import {page, panel, errorBox, table, pagedTable, field, input, kv, link, route, pre} from '../ui.js';

function searchView({root, query, navigate}) {
  const q = input('q', {id: 'devices-q', value: query.q || '', placeholder: 'install id, device id or user id'});
  const appKey = input('appKey', {id: 'devices-appkey', value: query.appKey || '', placeholder: 'any'});
  const form = h('form', {class: 'filters'}, field('Search', q), field('AppKey', appKey), h('button', {type: 'submit'}, 'Search'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    if (q.value) p.set('q', q.value);
    if (appKey.value) p.set('appKey', appKey.value);
    navigate(`#/devices?${p}`);
  });
  const list = pagedTable([
    {label: 'Install id', value: (r) => link(route('devices', r.installId), r.installId)},
    {label: 'Device id', value: (r) => r.deviceId},
    {label: 'AppKeys', value: (r) => (r.appKeys || []).join(', ')},
    {label: 'Last seen', value: (r) => fmtTime(r.lastSeenMs)},
    {label: 'Broker', value: (r) => connection(r.connected)},
    {label: 'Bound users', value: (r) => (Array.isArray(r.bindings) ? r.bindings.map((b) => (typeof b === 'object' ? b.userId : b)).join(', ') : r.bindings)},
  ], (cursor) => get('/v1/admin/devices', {q: query.q, appKey: query.appKey, cursor, limit: 50}), {empty: 'No device matches.', class: 'devices'});
  root.appendChild(page('Devices', form, list));
}

async function detailView({root, params}) {
  const id = params[0];
  const body = h('div');
  root.appendChild(page(`Device ${id}`, h('p', null, link('#/devices', '← all devices')), body));
  let d;
  try {
    d = await get(`/v1/admin/devices/${seg(id)}`);
  } catch (e) {
    body.appendChild(errorBox(e));
    return;
  }
  add(body,
    panel('Device', kv([
      ['Install id', d.installId], ['Device id', d.deviceId], ['AppKeys', (d.appKeys || []).join(', ')],
      ['Last seen', fmtTime(d.lastSeenMs)], ['Broker', connection(d.connected)],
    ])),
    panel('Bindings', table([
      {label: 'User', value: (b) => (typeof b === 'object' ? b.userId : b)},
      {label: 'App', value: (b) => (typeof b === 'object' ? b.appId || b.appKey : '')},
      {label: 'Token', value: (b) => (typeof b === 'object' ? b.token : '')},
    ], d.bindings || [], {empty: 'No binding.'})),
    panel('Consent the device reported', d.consent && Object.keys(d.consent).length
      ? table([
        {label: 'Switch', value: (r) => r[0]},
        {label: 'State', value: (r) => consentState(r[1])},
        {label: 'Reported', value: (r) => fmtTime(r[1] && r[1].timeMs)},
      ], Object.entries(d.consent))
      : h('p', {class: 'muted'}, 'Nothing reported.')),
    panel('Recent pushes', table([
      {label: 'Message', value: (p) => link(route('push', p.msgId || p.id), p.msgId || p.id)},
      {label: 'App', value: (p) => p.appId},
      {label: 'Published', value: (p) => fmtTime(p.publishedMs)},
      {label: 'Broker ack', value: (p) => fmtTime(p.brokerAckMs)},
      {label: 'Delivered to the app', value: (p) => fmtTime(p.deliveredMs)},
    ], d.recentPushes || [], {empty: 'No push.'})),
    panel('Recent events', table([
      {label: 'Time', value: (e) => fmtTime(e.timeMs)},
      {label: 'Event', value: (e) => e.event},
      {label: 'AppKey', value: (e) => e.appKey},
      {label: 'Properties', value: (e) => pre(e.properties)},
    ], d.recentEvents || [], {empty: 'No event.'})),
  );
}

// The backend cannot always tell (the broker does not report presence): null shows as unknown.
function connection(c) {
  if (c === null || c === undefined) return h('span', {class: 'badge idle'}, 'unknown');
  return h('span', {class: ['badge', c ? 'good' : 'idle']}, c ? 'connected' : 'offline');
}

function consentState(v) {
  const granted = v && typeof v === 'object' ? v.granted : v;
  if (granted === true) return h('span', {class: 'badge good'}, 'granted');
  if (granted === false) return h('span', {class: 'badge bad'}, 'denied');
  return String(granted ?? '—');
}

export function render(ctx) {
  return ctx.params.length ? detailView(ctx) : searchView(ctx);
}
