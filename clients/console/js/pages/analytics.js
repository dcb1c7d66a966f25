import {h, add, fmtNum, fmtRate, replace} from '../dom.js';
import {get, seg} from '../api.js';
import {page, panel, errorBox, table, field, input, select, status, busy} from '../ui.js';
import {barChart} from '../chart.js';

const DAY = 86400000;
const RANGES = [['1', 'last 24 hours'], ['7', 'last 7 days'], ['30', 'last 30 days'], ['90', 'last 90 days']];

function bucketLabel(tMs, bucket) {
  const d = new Date(Number(tMs));
  const p = (n) => String(n).padStart(2, '0');
  return bucket === 'hour' ? `${p(d.getDate())} ${p(d.getHours())}h` : `${p(d.getMonth() + 1)}-${p(d.getDate())}`;
}

// The API answers only buckets that have events: the chart shows every bucket of the range.
function fillBuckets(items, fromMs, toMs, bucket) {
  const size = bucket === 'hour' ? 3600000 : DAY;
  const byKey = new Map(items.map((p) => [Math.floor(Number(p.tMs) / size), Number(p.events) || 0]));
  const out = [];
  for (let k = Math.floor(fromMs / size); k <= Math.floor(toMs / size); k++) {
    out.push({label: bucketLabel(k * size, bucket), value: byKey.get(k) || 0});
  }
  return out;
}

export async function render({root, query, navigate}) {
  let apps = [];
  try {
    apps = ((await get('/v1/admin/apps', {limit: 500})) || {}).items || [];
  } catch (e) {
    /* the AppKey can still be typed */
  }
  const appKey = input('appKey', {id: 'analytics-appkey', value: query.appKey || (apps[0] && apps[0].appKey) || '', list: 'analytics-apps'});
  const datalist = h('datalist', {id: 'analytics-apps'}, apps.map((a) => h('option', {value: a.appKey})));
  const range = select('range', RANGES, query.days || '7');
  range.id = 'analytics-range';
  const form = h('form', {class: 'filters'}, field('AppKey', appKey), datalist, field('Range', range), h('button', {type: 'submit'}, 'Show'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    navigate(`#/analytics?${new URLSearchParams({appKey: appKey.value.trim(), days: range.value})}`);
  });
  const out = h('div', {id: 'analytics-body'});
  root.appendChild(page('Analytics', form, out));
  const key = appKey.value.trim();
  if (!key) {
    out.appendChild(h('p', {class: 'muted'}, 'Choose an AppKey.'));
    return;
  }
  const days = Number(query.days || range.value);
  const toMs = Date.now(), fromMs = toMs - days * DAY;
  const bucket = days <= 2 ? 'hour' : 'day';
  const base = `/v1/admin/analytics/${seg(key)}`;

  const countsP = panel(`Events per ${bucket}`);
  const topP = panel('Top events');
  const uniqP = panel('Unique users per day');
  add(out, countsP, h('div', {class: 'two'}, topP, uniqP), funnelPanel(base, fromMs, toMs));
  const load = async (p, fn) => {
    try {
      p.appendChild(await fn());
    } catch (e) {
      p.appendChild(errorBox(e));
    }
  };
  await Promise.all([
    load(countsP, async () => {
      const r = await get(`${base}/counts`, {fromMs, toMs, bucket});
      return barChart(fillBuckets(r.items || [], fromMs, toMs, bucket), {label: 'event counts'});
    }),
    load(topP, async () => {
      const r = await get(`${base}/top-events`, {fromMs, toMs, limit: 20});
      return table([
        {label: 'Event', value: (r) => h('span', {class: 'event-name'}, String(r.event))},
        {label: 'Count', value: (r) => fmtNum(r.count), class: 'num'},
      ], r.items || [], {empty: 'No event in this range.', class: 'top-events'});
    }),
    load(uniqP, async () => {
      const r = await get(`${base}/uniques`, {fromMs, toMs});
      const byDay = new Map((r.items || []).map((p) => [String(p.day), Number(p.users) || 0]));
      const days = [];
      for (let t = Math.floor(fromMs / DAY) * DAY; t <= toMs; t += DAY) days.push(new Date(t).toISOString().slice(0, 10));
      return barChart(days.map((d) => ({label: d.slice(5), title: d, value: byDay.get(d) || 0})), {label: 'unique users per day'});
    }),
  ]);
}

function funnelPanel(base, fromMs, toMs) {
  const a = input('a', {id: 'funnel-a', placeholder: 'first event'});
  const b = input('b', {id: 'funnel-b', placeholder: 'then this event'});
  const days = input('days', {id: 'funnel-days', type: 'number', min: 1, max: 90, value: '7'});
  const out = h('div', {id: 'funnel-result'});
  const st = status();
  const form = h('form', {class: 'filters'}, field('Event A', a), field('Event B', b), field('Within (days)', days), h('button', {type: 'submit'}, 'Compute'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(null, st, async () => {
      const r = await get(`${base}/funnel`, {a: a.value, b: b.value, days: days.value, fromMs, toMs});
      replace(out, h('div', {class: 'cards'},
        h('div', {class: 'card'}, h('div', {class: 'card-label'}, 'Did A'), h('div', {class: 'card-value'}, fmtNum(r.a))),
        h('div', {class: 'card'}, h('div', {class: 'card-label'}, 'Then B'), h('div', {class: 'card-value'}, fmtNum(r.ab))),
        h('div', {class: 'card'}, h('div', {class: 'card-label'}, 'Conversion'), h('div', {class: 'card-value'}, fmtRate(r.ab, r.a)))));
      st.clear();
    });
  });
  return panel('Two-step funnel', form, out, st);
}
