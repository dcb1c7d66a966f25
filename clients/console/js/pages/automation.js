// Marketing automation (docs/AUTOMATION.md): the rules (create, pause, resume, archive), and for
// one rule (#/automation/{id}) its funnel, suppression reasons and decisions.
import {h, fmtTime, fmtNum, replace} from '../dom.js';
import {get, post, seg, isAdmin} from '../api.js';
import {page, panel, errorBox, table, field, input, select, status, button, busy, note, kv, pagedTable, pre} from '../ui.js';
import {templatesPanel, segmentsPanel, dryRunButton, parse} from './automation-objects.js';

const EXAMPLE = {
  name: 'Thanks for a big purchase',
  appKey: 'shop',
  trigger: {event: 'purchase', conditions: [{property: 'price', op: 'range', gt: 100}]},
  reentry: {mode: 'perDays', days: 1},
  steps: [{type: 'send', push: {appId: 'shop', title: 'Thanks {{profile.name|there}}', body: 'You spent {{event.price}}'}}],
  guards: {capPerDay: 2},
};

export async function render({root, params, query, navigate}) {
  if (params[0]) return ruleView({root, id: params[0], query, navigate});
  const st = status();
  st.id = 'automation-status';
  const listWrap = h('div', {id: 'automation-rules'});
  async function load() {
    let r;
    try {
      r = await get('/v1/admin/automation/rules', {limit: 500});
    } catch (e) {
      replace(listWrap, errorBox(e));
      return;
    }
    const items = (r && r.items) || [];
    replace(listWrap, table([
      {label: 'Rule', value: (x) => h('a', {href: `#/automation/${seg(String(x.id))}`, dataset: {rule: String(x.id)}}, `${x.id} · ${x.name}`)},
      {label: 'AppKey', value: (x) => x.appKey},
      {label: 'Trigger', value: (x) => (x.definition && x.definition.trigger && x.definition.trigger.event) || ''},
      {label: 'Status', value: (x) => h('span', {class: ['badge', `status-${x.status}`], dataset: {status: x.status}}, x.status)},
      {label: 'Version', value: (x) => x.version},
      {label: 'Changed', value: (x) => fmtTime(x.updatedMs)},
      {label: '', value: (x) => actions(x, st, load)},
    ], items, {empty: 'No rule yet.'}));
  }

  const text = h('textarea', {id: 'rule-json', name: 'definition', rows: 16, spellcheck: 'false', class: 'code'});
  text.value = JSON.stringify(EXAMPLE, null, 2);
  const paused = h('input', {type: 'checkbox', id: 'rule-paused', name: 'paused'});
  const create = h('button', {type: 'submit', id: 'rule-create'}, 'Create rule');
  const form = h('form', {class: 'composer'},
    field('Definition (JSON)', text, 'trigger, reentry, audience, steps (wait, branch, send, exit), exit, guards — see docs/AUTOMATION.md'),
    h('label', {class: 'check'}, paused, ' Create paused'), create, dryRunButton(() => parse(text.value), st));
  if (!isAdmin()) for (const c of [text, paused, create]) c.disabled = true;
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(create, st, async () => {
      let body;
      try {
        body = JSON.parse(text.value);
      } catch (e) {
        throw new Error(`The definition is not JSON: ${e.message}`);
      }
      if (paused.checked) body.status = 'paused';
      const r = await post('/v1/admin/automation/rules', body);
      st.ok(`Created rule ${r.id} (${r.status}).`);
      load();
    });
  });
  root.appendChild(page('Automation',
    h('p', {class: 'muted'}, 'Rules send a push when a user records an event: trigger, steps (waits, branches, the send), and its guards (caps, quiet hours, consent).'),
    isAdmin() ? null : note('Viewers can see the rules; changing them needs the admin role.', 'info'),
    panel('Rules', listWrap, st),
    panel('New rule', form),
    templatesPanel(),
    segmentsPanel(),
    h('p', null, h('a', {href: '#/automation/decisions'}, 'All decisions →'))));
  await load();
}

function actions(rule, st, reload) {
  if (rule.status === 'archived') return '';
  const toggle = rule.status === 'active' ? 'pause' : 'resume';
  const b = button(toggle === 'pause' ? 'Pause' : 'Resume', null, {admin: true, class: 'secondary small', dataset: {action: toggle, rule: String(rule.id)}});
  b.addEventListener('click', () => busy(b, st, async () => {
    await post(`/v1/admin/automation/rules/${seg(String(rule.id))}/${toggle}`);
    st.ok(`Rule ${rule.id} ${toggle === 'pause' ? 'paused' : 'resumed'}.`);
    reload();
  }));
  const a = button('Archive', null, {admin: true, class: 'danger small', dataset: {action: 'archive', rule: String(rule.id)}});
  a.addEventListener('click', () => busy(a, st, async () => {
    await post(`/v1/admin/automation/rules/${seg(String(rule.id))}/archive`);
    st.ok(`Rule ${rule.id} archived.`);
    reload();
  }));
  return h('span', {class: 'row'}, b, a);
}

async function ruleView({root, id, query, navigate}) {
  const all = id === 'decisions';
  const user = input('user', {id: 'decisions-user', value: query.user || '', placeholder: 'EUID'});
  const form = h('form', {class: 'filters'}, field('User', user), h('button', {type: 'submit'}, 'Filter'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    if (user.value.trim()) p.set('user', user.value.trim());
    navigate(`#/automation/${seg(id)}?${p}`);
  });
  const decisions = pagedTable([
    {label: 'Time', value: (d) => fmtTime(d.timeMs)},
    {label: 'Rule', value: (d) => `${d.ruleId} v${d.version}`},
    {label: 'User', value: (d) => h('a', {href: `#/users/${seg(d.appKey)}/${seg(d.user)}`}, d.user)},
    {label: 'Decision', value: (d) => h('span', {class: ['badge', `decision-${d.decision}`], dataset: {decision: d.decision}}, d.decision)},
    {label: 'Reason', value: (d) => d.reason},
    {label: 'Message', value: (d) => (d.msgId ? h('a', {href: `#/push/${seg(d.msgId)}`}, d.msgId) : '')},
  ], (cursor) => get('/v1/admin/automation/decisions', {rule: all ? undefined : id, user: query.user, cursor, limit: 50}),
  {empty: 'No decision yet.', class: 'decisions'});
  decisions.id = 'automation-decisions';
  if (all) {
    root.appendChild(page('Automation decisions', h('p', null, h('a', {href: '#/automation'}, '← Rules')), form, decisions));
    return;
  }
  let rule;
  let funnel;
  try {
    [rule, funnel] = await Promise.all([
      get(`/v1/admin/automation/rules/${seg(id)}`),
      get(`/v1/admin/automation/rules/${seg(id)}/funnel`),
    ]);
  } catch (e) {
    root.appendChild(page(`Rule ${id}`, errorBox(e)));
    return;
  }
  const f = funnel || {};
  const push = f.push || {};
  const reasons = Object.entries(f.reasons || {});
  const stats = h('div', {id: 'automation-funnel'}, kv([
    ['Triggered', fmtNum(f.triggered)], ['Waiting', fmtNum(f.waiting)], ['Branches taken', fmtNum(f.branch)], ['Sent', fmtNum(f.sent)],
    ['Suppressed', fmtNum(f.suppressed)], ['Exited', fmtNum(f.exited)], ['Push: devices sent', fmtNum(push.sent)], ['Push: delivered', fmtNum(push.delivered)],
    ['Push: opened', fmtNum(push.opened)],
  ]), reasons.length ? table([
    {label: 'Reason', value: ([k]) => k}, {label: 'Count', value: ([, v]) => fmtNum(v)},
  ], reasons, {class: 'reasons'}) : note('No suppression yet.', 'info'));
  const dryStatus = status();
  dryStatus.id = 'dry-run-status';
  const versions = table([
    {label: 'Version', value: (v) => v.version}, {label: 'Created', value: (v) => fmtTime(v.createdMs)}, {label: 'By', value: (v) => v.actor},
  ], rule.versions || []);
  root.appendChild(page(`Rule ${rule.id} · ${rule.name}`,
    h('p', null, h('a', {href: '#/automation'}, '← Rules'), ' ', h('span', {class: ['badge', `status-${rule.status}`]}, rule.status)),
    panel('Funnel', stats),
    panel('Dry run', dryRunButton(() => ({rule: rule.id}), dryStatus), dryStatus),
    panel('Decisions', form, decisions),
    panel(`Definition (version ${rule.version})`, pre(rule.definition), versions)));
}
