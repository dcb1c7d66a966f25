// The automation page's templates, segments and dry run (docs/AUTOMATION.md). Every stored
// string (names, titles, conditions) reaches the page as text through h() (dom.js).
import {h, fmtTime, fmtNum, replace} from '../dom.js';
import {get, post, seg, isAdmin} from '../api.js';
import {panel, errorBox, table, field, status, button, busy, kv} from '../ui.js';

const TEMPLATE = {
  name: 'Thanks', appId: 'shop', title: 'Thanks {{profile.name|there}}', body: 'You spent {{event.price|a lot}}',
};
const SEGMENT = {
  name: 'Gold buyers', appKey: 'shop',
  conditions: [{property: 'profile.plan', op: 'equals', value: 'gold'}, {did: 'purchase', atLeast: 2, days: 30}],
};

// A JSON form that POSTs its definition to `path`; `done(result)` after a success.
function jsonForm(kind, example, path, st, done) {
  const text = h('textarea', {id: `${kind}-json`, name: 'definition', rows: 8, spellcheck: 'false', class: 'code'});
  text.value = JSON.stringify(example, null, 2);
  const create = h('button', {type: 'submit', id: `${kind}-create`}, `Create ${kind}`);
  const form = h('form', {class: 'composer'}, field('Definition (JSON)', text), create);
  if (!isAdmin()) for (const c of [text, create]) c.disabled = true;
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(create, st, async () => {
      const r = await post(path, parse(text.value));
      st.ok(`Created ${kind} ${r.id}.`);
      done(r);
    });
  });
  return form;
}

export function parse(text) {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new Error(`The definition is not JSON: ${e.message}`);
  }
}

export function templatesPanel() {
  const st = status();
  st.id = 'templates-status';
  const list = h('div', {id: 'automation-templates'});
  async function load() {
    let r;
    try {
      r = await get('/v1/admin/automation/templates', {limit: 500});
    } catch (e) {
      replace(list, errorBox(e));
      return;
    }
    replace(list, table([
      {label: 'Template', value: (t) => h('span', {dataset: {template: String(t.id)}}, `${t.id} · ${t.name}`)},
      {label: 'App', value: (t) => t.appId},
      {label: 'Title', value: (t) => t.title},
      {label: 'Body', value: (t) => t.body},
      {label: 'Version', value: (t) => t.version},
      {label: 'Changed', value: (t) => fmtTime(t.updatedMs)},
    ], (r && r.items) || [], {empty: 'No template yet. A send step names one as {"type": "send", "template": ID}.'}));
  }
  load();
  return panel('Templates', list, st, jsonForm('template', TEMPLATE, '/v1/admin/automation/templates', st, load));
}

export function segmentsPanel() {
  const st = status();
  st.id = 'segments-status';
  const list = h('div', {id: 'automation-segments'});
  const members = h('div', {id: 'segment-members'});
  function describe(c) {
    if (c.property) return `${c.property} ${c.op} ${JSON.stringify(c.value ?? c.values ?? [c.gt, c.gte, c.lt, c.lte].filter((x) => x !== undefined))}`;
    if (c.identity) return `${c.has === false ? 'no' : 'has'} ${c.identity}`;
    if (c.pushBinding !== undefined) return c.pushBinding ? 'push bound' : 'not push bound';
    if (c.did) return `did ${c.did} ≥ ${c.atLeast} in ${c.days} d`;
    if (c.didNot) return `did not ${c.didNot} ≥ ${c.atLeast} in ${c.days} d`;
    return JSON.stringify(c);
  }
  async function load() {
    let r;
    try {
      r = await get('/v1/admin/automation/segments', {limit: 500});
    } catch (e) {
      replace(list, errorBox(e));
      return;
    }
    replace(list, table([
      {label: 'Segment', value: (s) => `${s.id} · ${s.name}`},
      {label: 'AppKey', value: (s) => s.appKey},
      {label: 'Conditions', value: (s) => (s.conditions || []).map(describe).join(' · ') || 'every user'},
      {label: 'Size', value: (s) => sizeCell(s)},
      {label: '', value: (s) => button('Members', () => showMembers(s), {class: 'secondary small', dataset: {action: 'members', segment: String(s.id)}})},
    ], (r && r.items) || [], {empty: 'No segment yet.'}));
  }
  function sizeCell(s) {
    const out = h('span', {dataset: {size: String(s.id)}});
    const b = button('Count', () => busy(b, st, async () => {
      const r = await get(`/v1/admin/automation/segments/${seg(String(s.id))}/size`);
      replace(out, `${fmtNum(r.size)}${r.complete ? '' : '+'}`);
    }), {class: 'secondary small', dataset: {action: 'size', segment: String(s.id)}});
    return h('span', {class: 'row'}, out, b);
  }
  async function showMembers(s) {
    try {
      const r = await get(`/v1/admin/automation/segments/${seg(String(s.id))}/members`, {limit: 100});
      replace(members, h('h3', null, `Members of ${s.name}`), table([
        {label: 'User', value: (m) => h('a', {href: `#/users/${seg(s.appKey)}/${seg(m.user)}`}, m.user)},
        {label: 'User id', value: (m) => m.userId || ''},
      ], (r && r.items) || [], {empty: 'No member now.'}));
    } catch (e) {
      replace(members, errorBox(e));
    }
  }
  load();
  return panel('Segments', list, members, st, jsonForm('segment', SEGMENT, '/v1/admin/automation/segments', st, load));
}

// The dry run of a definition (`source()` answers the request body) into `out`.
export function dryRunButton(source, st) {
  const out = h('div', {id: 'dry-run-result'});
  const b = button('Dry run (last 24 h)', () => busy(b, st, async () => {
    const r = await post('/v1/admin/automation/dry-run', source());
    const reasons = Object.entries(r.suppressed || {});
    replace(out, kv([
      ['Trigger events', fmtNum(r.events)], ['Matched', fmtNum(r.matched)], ['Would trigger', fmtNum(r.triggered)],
      ['Users', fmtNum(r.users)], ['Would send', fmtNum(r.wouldSend)], ['Deferred (quiet hours)', fmtNum(r.deferred)],
      ...reasons.map(([k, v]) => [`Suppressed: ${k}`, fmtNum(v)]),
    ]), r.truncated ? h('p', {class: 'muted'}, 'Only the first 5,000 events of the window were replayed.') : null);
    st.info('Dry run: nothing was stored or sent.');
  }), {class: 'secondary', dataset: {action: 'dry-run'}});
  b.id = 'rule-dry-run';
  return h('div', null, b, out);
}
