import {h, fmtTime, replace} from '../dom.js';
import {get, post, seg} from '../api.js';
import {page, panel, errorBox, table, pagedTable, field, input, kv, link, route, pre, button, status, confirmBox, note, busy} from '../ui.js';

function searchView({root, query, navigate}) {
  const appKey = input('appKey', {id: 'users-appkey', value: query.appKey || '', placeholder: 'AppKey'});
  const q = input('q', {id: 'users-q', value: query.q || '', placeholder: 'user id, EUID or contact'});
  const form = h('form', {class: 'filters'}, field('AppKey', appKey), field('Find', q), h('button', {type: 'submit'}, 'Look up'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    navigate(`#/users?${new URLSearchParams({appKey: appKey.value.trim(), q: q.value.trim()})}`);
  });
  const content = [form];
  if (query.q || query.appKey) {
    const list = pagedTable([
      {label: 'AppKey', value: (r) => r.appKey},
      {label: 'EUID', value: (r) => link(route('users', r.appKey, r.euid), r.euid)},
      {label: 'User id', value: (r) => r.userId},
      {label: 'Contacts', value: (r) => (Array.isArray(r.contacts) ? r.contacts.map((c) => (typeof c === 'object' ? c.value || JSON.stringify(c) : c)).join(', ') : r.contacts)},
      {label: 'Last seen', value: (r) => fmtTime(r.lastSeenMs)},
      {label: 'Opted out', value: (r) => (r.optedOut ? h('span', {class: 'badge bad'}, 'opted out') : 'no')},
    ], (cursor) => get('/v1/admin/users', {appKey: query.appKey, q: query.q, cursor, limit: 50}), {empty: 'No user matches.', class: 'users'});
    list.id = 'users-list';
    content.push(list);
  }
  root.appendChild(page('Users', content));
}

async function detailView({root, params}) {
  const [appKey, euid] = params;
  const body = h('div', {id: 'user-detail'});
  root.appendChild(page(`User ${euid}`, h('p', null, link(`#/users?${new URLSearchParams({appKey})}`, '← users'), ` · AppKey ${appKey}`), body));
  let u;
  try {
    u = await get(`/v1/admin/users/${seg(appKey)}/${seg(euid)}`);
  } catch (e) {
    body.appendChild(e.status === 404 ? note('No such user (never seen, or erased).', 'info') : errorBox(e));
    return;
  }
  const st = status();
  const eraseBtn = button('Erase this user…', null, {admin: true, class: 'danger', dataset: {action: 'erase'}});
  eraseBtn.id = 'user-erase';
  const confirmHost = h('div');
  eraseBtn.addEventListener('click', () => {
    replace(confirmHost, confirmBox(
      `Erase ${euid} of ${appKey}: profile, identities, contacts, push bindings and every stored event are deleted. This cannot be undone.`,
      euid, (box, go) => busy(go, st, async () => {
        const r = await post('/v1/admin/erasures', {appKey, euid});
        box.remove();
        replace(body, panel('Erased', kv([
          ['Request', r.id], ['Status', r.status], ['Requested', fmtTime(r.requestedMs)], ['Finished', fmtTime(r.finishedMs)],
          ['Deleted', JSON.stringify(r.deleted || {})],
        ]), h('p', null, link('#/privacy', 'All erasure requests →'))));
      })));
  });
  const optOut = u.optOut;
  body.append(
    optOut ? note(`Opted out (${optOut.switch || ''}) at ${fmtTime(optOut.timeMs)}.`, 'warn') : null,
    panel('Identities', table([
      {label: 'Kind', value: (r) => r.kind || r.type || r.identityType || r.name},
      {label: 'Value', value: (r) => r.value || r.id || JSON.stringify(r)},
    ], (u.identities || []).map((x) => (typeof x === 'object' ? x : {value: String(x)})), {empty: 'No identity.'})),
    panel('Properties', u.properties && Object.keys(u.properties).length ? pre(u.properties) : h('p', {class: 'muted'}, 'No property.')),
    panel('Push bindings', table([
      {label: 'App', value: (b) => b.appId || b.appKey},
      {label: 'Token', value: (b) => b.token},
      {label: 'Install', value: (b) => b.installId},
    ], u.bindings || [], {empty: 'No binding.'})),
    panel('Recent events', table([
      {label: 'Time', value: (e) => fmtTime(e.timeMs)},
      {label: 'Event', value: (e) => h('span', {class: 'event-name'}, String(e.event))},
      {label: 'Properties', value: (e) => h('code', {class: 'props'}, JSON.stringify(e.properties || {}))},
    ], u.recentEvents || [], {empty: 'No event.'})),
    panel('Erasure', h('p', {class: 'muted'}, 'Deletes everything stored about this user; the request itself is kept (without the data).'),
      eraseBtn, confirmHost, st));
}

export function render(ctx) {
  return ctx.params.length >= 2 ? detailView(ctx) : searchView(ctx);
}
