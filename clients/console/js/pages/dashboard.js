import {h, fmtNum, fmtTime, fmtRate, replace} from '../dom.js';
import {get} from '../api.js';
import {page, panel, errorBox, table, button} from '../ui.js';
import {barChart, funnel} from '../chart.js';

const REFRESH_MS = 10000;

function card(label, value, sub, id) {
  return h('div', {class: 'card', id}, h('div', {class: 'card-label'}, label), h('div', {class: 'card-value'}, value),
    sub ? h('div', {class: 'card-sub'}, sub) : null);
}

function view(d) {
  const dev = d.devices || {}, ev = d.events || {}, push = d.push || {}, ing = d.ingest || {};
  const series = d.series || {};
  const hour = (series.lastHour || []).map((p) => {
    const t = new Date(Number(p.tMs));
    return {label: `${String(t.getHours()).padStart(2, '0')}:${String(t.getMinutes()).padStart(2, '0')}`, value: p.events};
  });
  const days = (series.last30Days || []).map((p) => ({label: String(p.day || '').slice(5), title: p.day, value: p.events}));
  const pushDays = (series.last30Days || []).map((p) => ({label: String(p.day || '').slice(5), title: p.day, value: p.pushesSent}));
  return [
    h('div', {class: 'cards'},
      card('Devices registered', fmtNum(dev.registered),
        dev.connected === null || dev.connected === undefined ? 'connections: not reported by the broker' : `${fmtNum(dev.connected)} connected now`,
        'card-devices'),
      card('Events / s', fmtNum(ev.perSecond), `${fmtNum(ev.today)} today`, 'card-events'),
      card('Pushes today', fmtNum(push.sentToday),
        `${fmtRate(push.deliveredToday, push.sentToday)} delivered · ${fmtRate(push.openedToday, push.sentToday)} opened`, 'card-push'),
      card('Ingest errors today', fmtNum(ing.errorsToday), `${fmtNum(ing.refusedBatchesToday)} refused batches`, 'card-ingest')),
    h('div', {class: 'two'},
      panel('Events, last hour (per minute)', barChart(hour, {label: 'events per minute over the last hour'})),
      panel('Push funnel today', funnel({sent: push.sentToday, delivered: push.deliveredToday, opened: push.openedToday}))),
    h('div', {class: 'two'},
      panel('Events, last 30 days', barChart(days, {label: 'events per day over 30 days'})),
      panel('Pushes sent, last 30 days', barChart(pushDays, {label: 'pushes per day over 30 days'}))),
    panel('Backend instances', table([
      {label: 'Instance', value: (r) => r.id},
      {label: 'Health', value: (r) => h('span', {class: ['badge', r.healthy ? 'good' : 'bad']}, r.healthy ? 'healthy' : 'unhealthy')},
      {label: 'Last seen', value: (r) => fmtTime(r.lastSeenMs)},
    ], d.instances || [], {empty: 'No instance reported.'})),
  ];
}

export async function render({root}) {
  const body = h('div', {id: 'dashboard-body'}, h('p', {class: 'muted'}, 'Loading…'));
  const stamp = h('span', {class: 'muted'});
  let timer = null;
  async function load() {
    try {
      const d = await get('/v1/admin/dashboard');
      replace(body, view(d || {}));
      stamp.textContent = `Updated ${fmtTime(Date.now())}`;
    } catch (e) {
      replace(body, errorBox(e));
    }
  }
  root.appendChild(page('Dashboard', h('div', {class: 'toolbar'}, button('Refresh', load, {class: 'secondary'}), stamp), body));
  await load();
  timer = setInterval(load, REFRESH_MS);
  return () => clearInterval(timer);
}
