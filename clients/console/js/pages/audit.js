import {h, fmtTime} from '../dom.js';
import {get} from '../api.js';
import {page, pagedTable, field, input} from '../ui.js';

export function render({root, query, navigate}) {
  const actor = input('actor', {id: 'audit-actor', value: query.actor || ''});
  const action = input('action', {id: 'audit-action', value: query.action || '', placeholder: 'e.g. push.send'});
  const form = h('form', {class: 'filters'}, field('Actor', actor), field('Action', action), h('button', {type: 'submit'}, 'Filter'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const p = new URLSearchParams();
    if (actor.value.trim()) p.set('actor', actor.value.trim());
    if (action.value.trim()) p.set('action', action.value.trim());
    navigate(`#/audit?${p}`);
  });
  const list = pagedTable([
    {label: 'Time', value: (r) => fmtTime(r.timeMs)},
    {label: 'Actor', value: (r) => r.actor},
    {label: 'Action', value: (r) => r.action},
    {label: 'Target', value: (r) => r.target, class: 'wrap'},
    {label: 'Detail', value: (r) => h('code', {class: 'props'}, typeof r.detail === 'object' ? JSON.stringify(r.detail) : String(r.detail ?? ''))},
  ], (cursor) => get('/v1/admin/audit', {actor: query.actor, action: query.action, cursor, limit: 50}), {empty: 'No entry.', class: 'audit'});
  list.id = 'audit-list';
  root.appendChild(page('Audit log', h('p', {class: 'muted'}, 'Every change (send, schedule, publish, rollback, erase, settings, accounts), who made it and when.'), form, list));
}
