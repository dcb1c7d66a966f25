import {h, add, fmtTime, replace} from '../dom.js';
import {get, post, seg} from '../api.js';
import {page, panel, errorBox, table, pagedTable, field, input, kv, link, route, pre, button, status, confirmBox, note, busy} from '../ui.js';

// {"email": ["a@x"], "phone": [...]} → "email a@x · phone …".
function contactsText(c) {
  if (!c || typeof c !== 'object') return c ? String(c) : '—';
  const parts = Object.entries(c).map(([k, v]) => `${k} ${Array.isArray(v) ? v.join(', ') : typeof v === 'object' ? JSON.stringify(v) : v}`);
  return parts.length ? parts.join(' · ') : '—';
}

const ERASURE_POLLS = 60;
const ERASURE_POLL_MS = 1000;

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
      {label: 'Contacts', value: (r) => contactsText(r.contacts)},
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
        let r = await post('/v1/admin/erasures', {appKey, euid});
        box.remove();
        const show = () => replace(body, panel(r.status === 'done' ? 'Erased' : 'Erasure', kv([
          ['Request', r.id], ['Status', h('span', {class: 'erasure-status'}, r.status)], ['Requested', fmtTime(r.requestedMs)],
          ['Finished', fmtTime(r.finishedMs)],
          ['Deleted', Object.entries(r.deleted || {}).filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(', ') || '—'],
        ]), h('p', null, link('#/privacy', 'All erasure requests →'))));
        show();
        // 202 "pending": the backend finishes it in the background; follow it for a while.
        for (let i = 0; i < ERASURE_POLLS && r.status === 'pending'; i++) {
          await new Promise((resolve) => setTimeout(resolve, ERASURE_POLL_MS));
          r = await get(`/v1/admin/erasures/${seg(r.id)}`);
          show();
        }
      })));
  });
  const optOut = u.optOut;
  add(body,
    optOut ? note(`Opted out (${optOut.switch || ''}) at ${fmtTime(optOut.timeMs)}.`, 'warn') : null,
    panel('Identities', table([
      {label: 'Kind', value: (r) => r[0]},
      {label: 'Value', value: (r) => (Array.isArray(r[1]) ? r[1].join(', ') : r[1])},
    ], Object.entries(u.identities || {}), {empty: 'No identity.'})),
    panel('Contacts', table([
      {label: 'Kind', value: (r) => r[0]},
      {label: 'Value', value: (r) => (Array.isArray(r[1]) ? r[1].join(', ') : r[1])},
    ], Object.entries(u.contacts && typeof u.contacts === 'object' ? u.contacts : {}), {empty: 'No contact.'})),
    panel('Properties', u.properties && Object.keys(u.properties).length ? pre(u.properties) : h('p', {class: 'muted'}, 'No property.')),
    panel('Push bindings', table([
      {label: 'User id', value: (b) => b.userId},
      {label: 'Device', value: (b) => (b.installId ? link(route('devices', b.installId), b.installId) : '—')},
      {label: 'Token', value: (b) => b.token},
      {label: 'Bound', value: (b) => fmtTime(b.boundMs)},
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
