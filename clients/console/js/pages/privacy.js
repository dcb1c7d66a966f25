import {h, fmtTime, replace} from '../dom.js';
import {get, put, seg, isAdmin} from '../api.js';
import {page, panel, errorBox, pagedTable, table, field, input, status, button, busy, note} from '../ui.js';

function retentionPanel() {
  const body = h('div', {id: 'retention'}, h('p', {class: 'muted'}, 'Loading…'));
  const st = status();
  async function load() {
    let r;
    try {
      r = (await get('/v1/admin/retention')) || {};
    } catch (e) {
      replace(body, errorBox(e));
      return;
    }
    const rows = [];
    for (const [k, v] of Object.entries(r.apps || {})) rows.push({kind: 'apps', name: k, days: v && v.maxAgeDays});
    for (const [k, v] of Object.entries(r.streams || {})) rows.push({kind: 'streams', name: k, days: v && v.maxAgeDays});
    const edits = [];
    const t = table([
      {label: 'Kind', value: (x) => (x.kind === 'apps' ? 'AppKey' : 'stream')},
      {label: 'Name', value: (x) => x.name},
      {label: 'Max age (days)', value: (x) => {
        const i = input('days', {type: 'number', min: 1, value: x.days === undefined || x.days === null ? '' : String(x.days), class: 'narrow'});
        if (!isAdmin()) i.disabled = true;
        edits.push([x, i]);
        return i;
      }},
    ], rows, {empty: 'No limit set: records are kept until erased.'});
    const kind = h('select', null, h('option', {value: 'apps'}, 'AppKey'), h('option', {value: 'streams'}, 'stream'));
    const name = input('name', {placeholder: 'AppKey or stream'});
    const days = input('days', {type: 'number', min: 1, placeholder: 'days', class: 'narrow'});
    const save = button('Save retention', null, {admin: true});
    save.id = 'retention-save';
    save.addEventListener('click', () => busy(save, st, async () => {
      const next = {apps: {}, streams: {}};
      // An emptied field removes that rule (null); the rules not named stay as they are.
      for (const [x, i] of edits) next[x.kind][x.name] = {maxAgeDays: i.value ? Number(i.value) : null};
      if (name.value.trim() && days.value) next[kind.value][name.value.trim()] = {maxAgeDays: Number(days.value)};
      await put('/v1/admin/retention', next);
      st.ok('Saved.');
      load();
    }));
    const nats = r.natsMaxAgeS !== undefined ? h('p', {class: 'muted'}, `JetStream ingest stream max_age: ${r.natsMaxAgeS ? `${Math.round(r.natsMaxAgeS / 86400)} days` : 'none'}.`) : null;
    replace(body, t, nats, isAdmin() ? h('div', {class: 'row'}, kind, name, days) : null, h('div', {class: 'row actions'}, save));
  }
  load();
  return panel('Retention', h('p', {class: 'muted'}, 'The maximum age of stored events per AppKey and per stream; older ones are deleted in bounded batches (with --nats: the stream\'s max_age). An empty field removes the limit.'), body, st);
}

// The per-AppKey setting that makes an opt-out also erase the user.
function optOutSettingPanel() {
  const appKey = input('appKey', {id: 'settings-appkey', placeholder: 'AppKey'});
  const erase = h('input', {type: 'checkbox', id: 'settings-erase', disabled: true});
  const save = button('Save', null, {admin: true});
  save.id = 'settings-save';
  save.disabled = true;
  const st = status();
  const load = h('button', {type: 'submit'}, 'Load');
  const form = h('form', {class: 'filters'}, field('AppKey', appKey), load,
    h('label', {class: 'check'}, erase, ' An opt-out also erases the user'), save);
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(load, st, async () => {
      const s = await get(`/v1/admin/apps/${seg(appKey.value.trim())}/settings`);
      erase.checked = !!s.eraseOnOptOut;
      erase.disabled = !isAdmin();
      save.disabled = !isAdmin();
      st.info(`${appKey.value.trim()}: ${s.eraseOnOptOut ? 'opt-outs erase' : 'opt-outs only mark the user'}.`);
    });
  });
  save.addEventListener('click', () => busy(save, st, async () => {
    const s = await put(`/v1/admin/apps/${seg(appKey.value.trim())}/settings`, {eraseOnOptOut: erase.checked});
    st.ok(`Saved: ${s.eraseOnOptOut ? 'opt-outs erase' : 'opt-outs only mark the user'}.`);
  }));
  return panel('Opt-out setting per AppKey', form, st);
}

export function render({root}) {
  const optouts = pagedTable([
    {label: 'Time', value: (r) => fmtTime(r.timeMs)},
    {label: 'AppKey', value: (r) => r.appKey},
    {label: 'EUID', value: (r) => r.euid},
    {label: 'Install', value: (r) => r.installId},
    {label: 'Switch', value: (r) => r.switch},
  ], (cursor) => get('/v1/admin/optouts', {cursor, limit: 50}), {empty: 'No opt-out reported.'});
  optouts.id = 'optouts';
  const erasures = pagedTable([
    {label: 'Request', value: (r) => r.id},
    {label: 'Requested', value: (r) => fmtTime(r.requestedMs), class: 'nowrap'},
    {label: 'By', value: (r) => r.actor},
    {label: 'AppKey', value: (r) => r.appKey},
    {label: 'Subject', value: (r) => r.euid || r.userId || r.subject, class: 'wrap'},
    {label: 'Status', value: (r) => h('span', {class: ['badge', r.status === 'done' ? 'good' : r.status === 'failed' ? 'bad' : 'idle']}, String(r.status))},
    {label: 'Finished', value: (r) => fmtTime(r.finishedMs), class: 'nowrap'},
    {label: 'Deleted', value: (r) => (r.deleted ? Object.entries(r.deleted).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(', ') || 'nothing' : '—')},
  ], (cursor) => get('/v1/admin/erasures', {cursor, limit: 50}), {empty: 'No erasure requested.'});
  erasures.id = 'erasures';
  root.appendChild(page('Privacy',
    panel('Opt-outs reported by devices', optouts),
    panel('Erasure requests', note('Erase a user from the Users page (or pylon-backend --erase-user APPKEY:EUID).', 'info'), erasures),
    optOutSettingPanel(),
    retentionPanel()));
}
