import {h, fmtTime, replace} from '../dom.js';
import {get, post, patch, del, seg, isAdmin, currentSession} from '../api.js';
import {page, panel, errorBox, table, field, input, select, status, button, busy, confirmBox, note} from '../ui.js';

const MIN_PASSWORD = 16;

export async function render({root}) {
  const st = status();
  st.id = 'operators-status';
  const listWrap = h('div', {id: 'operators-list'});
  const confirmHost = h('div');
  async function load() {
    let items;
    try {
      const r = await get('/v1/admin/operators', {limit: 500});
      items = Array.isArray(r) ? r : (r && r.items) || [];
    } catch (e) {
      replace(listWrap, errorBox(e));
      return;
    }
    replace(listWrap, table([
      {label: 'Name', value: (o) => o.name},
      {label: 'Role', value: (o) => {
        const s = select('role', [['viewer', 'viewer'], ['admin', 'admin']], o.role);
        if (!isAdmin()) s.disabled = true;
        s.addEventListener('change', () => busy(s, st, async () => {
          await patch(`/v1/admin/operators/${seg(o.name)}`, {role: s.value});
          st.ok(`${o.name} is now ${s.value}.`);
        }));
        return s;
      }},
      {label: 'Created', value: (o) => fmtTime(o.createdMs)},
      {label: 'Last login', value: (o) => fmtTime(o.lastLoginMs)},
      {label: '', value: (o) => {
        const pw = button('New password…', null, {admin: true, class: 'secondary small'});
        pw.addEventListener('click', () => replace(confirmHost, passwordBox(o.name, st)));
        const rm = button('Delete…', null, {admin: true, class: 'danger small', dataset: {deleteOperator: o.name}});
        const me = currentSession();
        if (me && me.name === o.name) rm.disabled = true;
        rm.addEventListener('click', () => replace(confirmHost, confirmBox(`Delete operator ${o.name}? Their sessions end.`, o.name,
          (box, go) => busy(go, st, async () => {
            await del(`/v1/admin/operators/${seg(o.name)}`);
            box.remove();
            st.ok(`Deleted ${o.name}.`);
            load();
          }))));
        return h('span', {class: 'row'}, pw, rm);
      }},
    ], items, {empty: 'No operator account yet (the operator token is the bootstrap credential).'}));
  }

  const name = input('name', {id: 'op-name', pattern: '[A-Za-z0-9._-]{1,64}'});
  const role = select('role', [['viewer', 'viewer'], ['admin', 'admin']], 'viewer');
  role.id = 'op-role';
  const password = input('password', {id: 'op-password', type: 'password', autocomplete: 'new-password'});
  const create = h('button', {type: 'submit', id: 'op-create'}, 'Create operator');
  const form = h('form', {class: 'filters'}, field('Name', name), field('Role', role), field('Password', password, `${MIN_PASSWORD} or more printable characters, no spaces`), create);
  if (!isAdmin()) for (const c of [name, role, password, create]) c.disabled = true;
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    busy(create, st, async () => {
      if (password.value.length < MIN_PASSWORD) throw new Error(`The password needs at least ${MIN_PASSWORD} characters.`);
      await post('/v1/admin/operators', {name: name.value.trim(), role: role.value, password: password.value});
      st.ok(`Created ${name.value.trim()} (${role.value}).`);
      password.value = '';
      name.value = '';
      load();
    });
  });
  root.appendChild(page('Operators',
    isAdmin() ? null : note('Viewers can see the accounts; changing them needs the admin role.', 'info'),
    panel('Accounts', listWrap, confirmHost, st),
    panel('New operator', form),
    h('p', null, h('a', {href: '#/audit'}, 'Audit log →'))));
  await load();
}

function passwordBox(name, st) {
  const pw = input('password', {type: 'password', autocomplete: 'new-password', placeholder: 'new password'});
  const go = button('Set password', null, {admin: true});
  const box = h('div', {class: 'confirm'}, h('p', null, `New password for ${name}:`), h('div', {class: 'row'}, pw, go,
    button('Cancel', () => box.remove(), {class: 'secondary'})));
  go.addEventListener('click', () => busy(go, st, async () => {
    if (pw.value.length < MIN_PASSWORD) throw new Error(`The password needs at least ${MIN_PASSWORD} characters.`);
    await patch(`/v1/admin/operators/${seg(name)}`, {password: pw.value});
    box.remove();
    st.ok(`Password of ${name} changed.`);
  }));
  return box;
}
