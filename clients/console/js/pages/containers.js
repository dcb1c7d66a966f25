import {h, add, fmtTime, fmtNum, replace} from '../dom.js';
import {get, post, seg, isAdmin} from '../api.js';
import {page, panel, errorBox, table, pagedTable, field, input, select, status, button, busy, link, route, note} from '../ui.js';
import {diffLines, hunks, canonicalText} from '../diff.js';

function fetchesText(f) {
  if (f === null || f === undefined) return '—';
  if (typeof f !== 'object') return fmtNum(f);
  return Object.entries(f).map(([k, v]) => `${k} ${fmtNum(v)}`).join(' · ');
}

function listView({root}) {
  const id = input('id', {id: 'containers-new-id', placeholder: 'GTM-XXXX', pattern: '[A-Za-z0-9._-]{1,128}'});
  const form = h('form', {class: 'filters'}, field('Open or create a container', id), h('button', {type: 'submit'}, 'Open'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    if (id.value.trim()) location.hash = route('containers', id.value.trim());
  });
  const list = pagedTable([
    {label: 'Container', value: (r) => link(route('containers', r.id), r.id)},
    {label: 'Published', value: (r) => (r.publishedVersion === null || r.publishedVersion === undefined ? '—' : `v${r.publishedVersion}`)},
    {label: 'Versions', value: (r) => (Array.isArray(r.versions) ? r.versions.length : r.versions), class: 'num'},
    {label: 'Fetches', value: (r) => fetchesText(r.fetchesByOutcome || r.fetches)},
  ], (cursor) => get('/v1/admin/gtm/containers', {cursor, limit: 50}), {empty: 'No container yet.', class: 'containers'});
  list.id = 'containers-list';
  root.appendChild(page('Containers', list, form));
}

function diffView(aText, bText, aLabel, bLabel) {
  const lines = diffLines(aText, bText);
  if (lines === null) return note('The versions differ in too many lines to show a diff.', 'info');
  const changed = lines.filter((l) => l.op !== ' ').length;
  if (!changed) return note(`${aLabel} and ${bLabel} have the same content.`, 'info');
  return h('div', {class: 'diff-wrap'},
    h('p', {class: 'muted'}, `${aLabel} → ${bLabel}: ${lines.filter((l) => l.op === '-').length} lines removed, ${lines.filter((l) => l.op === '+').length} added`),
    h('pre', {class: 'diff', id: 'container-diff'}, hunks(lines).map((l) => (l.op === '…'
      ? h('span', {class: 'skip'}, `… ${l.skipped} unchanged lines\n`)
      : h('span', {class: l.op === '+' ? 'add' : l.op === '-' ? 'del' : 'ctx'}, `${l.op} ${l.text}\n`)))));
}

async function detailView({root, params, query, navigate}) {
  const id = params[0];
  const body = h('div', {id: 'container-detail', dataset: {container: id}});
  root.appendChild(page(`Container ${id}`, h('p', null, link('#/containers', '← all containers')), body));
  let versions = [], info = null;
  try {
    versions = ((await get(`/v1/admin/gtm/containers/${seg(id)}/versions`, {limit: 500})) || {}).items || [];
  } catch (e) {
    if (e.status !== 404) body.appendChild(errorBox(e));
  }
  try {
    info = await get(`/v1/inspect/gtm/containers/${seg(id)}`);
  } catch (e) {
    /* fetch counts are optional */
  }
  const st = status();
  st.id = 'container-status';
  const reload = () => navigate(route('containers', id) + (query.v ? `?v=${encodeURIComponent(query.v)}` : ''));
  const byNum = [...versions].sort((x, y) => Number(y.version) - Number(x.version));
  const flagged = byNum.find((v) => v.published === true);
  const published = flagged ? flagged.version : info ? info.published : null;

  const versionTable = table([
    {label: 'Version', value: (r) => link(`${route('containers', id)}?v=${encodeURIComponent(r.version)}`, `v${r.version}`)},
    {label: 'Created', value: (r) => fmtTime(r.createdMs)},
    {label: 'By', value: (r) => r.actor},
    {label: 'Bytes', value: (r) => fmtNum(r.bytes), class: 'num'},
    {label: '', value: (r) => (String(r.version) === String(published) ? h('span', {class: 'badge good'}, 'published') : null)},
    {label: '', value: (r) => {
      if (String(r.version) === String(published)) return null;
      const b = button(`Roll back to v${r.version}`, null, {admin: true, class: 'secondary small', dataset: {rollback: r.version}});
      b.addEventListener('click', () => busy(b, st, async () => {
        const res = await post(`/v1/admin/gtm/containers/${seg(id)}/rollback`, {version: r.version});
        st.ok(`Published v${r.version}'s content as v${res.version}.`);
        navigate(route('containers', id));
      }));
      return b;
    }},
  ], byNum, {empty: 'No version yet: publish the first below.'});

  const fetches = info && info.fetches ? fetchesText(info.fetches) : '—';
  add(body,
    panel('Versions', h('p', {class: 'muted', id: 'container-summary'},
      `Published: ${published === null || published === undefined ? 'none' : `v${published}`} · draft: ${info && info.draft ? `v${info.draft}` : 'none'} · fetches: ${fetches}`),
    versionTable, st));

  // One version's content, and its diff against another.
  let content = null;
  const chosen = query.v || (byNum[0] && String(byNum[0].version));
  if (chosen) {
    const other = select('against', byNum.map((v) => [String(v.version), `v${v.version}`]),
      String((byNum.find((v) => String(v.version) !== chosen) || {}).version || chosen));
    other.id = 'diff-against';
    const diffOut = h('div');
    const contentOut = h('div');
    const showDiff = async () => {
      try {
        const [a, b] = await Promise.all([
          get(`/v1/admin/gtm/containers/${seg(id)}/versions/${seg(other.value)}`),
          get(`/v1/admin/gtm/containers/${seg(id)}/versions/${seg(chosen)}`)]);
        replace(diffOut, diffView(canonicalText(a.content), canonicalText(b.content), `v${other.value}`, `v${chosen}`));
      } catch (e) {
        replace(diffOut, errorBox(e));
      }
    };
    const diffBtn = button('Compare', showDiff, {class: 'secondary'});
    diffBtn.id = 'diff-show';
    try {
      content = (await get(`/v1/admin/gtm/containers/${seg(id)}/versions/${seg(chosen)}`)).content;
      contentOut.appendChild(h('pre', {class: 'json', id: 'container-content'}, canonicalText(content)));
    } catch (e) {
      contentOut.appendChild(errorBox(e));
    }
    add(body,
      panel(`Version ${chosen}`, contentOut),
      panel(`Diff against v${chosen}`, h('div', {class: 'filters'}, field('Compare with', other), diffBtn), diffOut));
  }
  body.appendChild(publishPanel(id, content, st, navigate));
}

function publishPanel(id, content, st, navigate) {
  const text = h('textarea', {id: 'publish-content', rows: 14, spellcheck: 'false', class: 'code'});
  text.value = content ? JSON.stringify(content, null, 2) : JSON.stringify({resource: {version: '1', macros: [], predicates: [], tags: [], rules: []}}, null, 2);
  const parse = () => {
    try {
      const c = JSON.parse(text.value);
      if (!c || typeof c !== 'object' || Array.isArray(c)) throw new Error('a JSON object');
      return c;
    } catch (e) {
      throw new Error(`The container must be a JSON object: ${e.message}`);
    }
  };
  const publish = button('Publish as a new version', null, {admin: true});
  publish.id = 'publish';
  const preview = button('Save as draft and get a preview link', null, {admin: true, class: 'secondary'});
  preview.id = 'preview';
  const app = input('app', {id: 'preview-app', placeholder: 'app id for the link', value: 'com.example.app'});
  const linkOut = h('div', {id: 'preview-link'});
  publish.addEventListener('click', () => busy(publish, st, async () => {
    const res = await post(`/v1/admin/gtm/containers/${seg(id)}/versions`, {container: parse()});
    st.ok(`Published v${res.version}.`);
    navigate(route('containers', id));
  }));
  preview.addEventListener('click', () => busy(preview, st, async () => {
    const res = await post(`/v1/admin/gtm/containers/${seg(id)}/versions`, {container: parse(), draft: true});
    const url = `tagmanager.c.${app.value.trim()}://preview/p?id=${encodeURIComponent(id)}&gtm_auth=${encodeURIComponent(res.gtmAuth || '')}&gtm_preview=${encodeURIComponent(res.version)}`;
    replace(linkOut, h('p', null, 'Open on a device (gtm.preview): ', h('code', {class: 'select-all'}, url)));
  }));
  return panel('Publish', isAdmin() ? null : note('Publishing needs the admin role.', 'info'),
    field('Container (JSON)', text), h('div', {class: 'row actions'}, publish, h('span', {class: 'sep'}), field('App id', app), preview), linkOut);
}

export function render(ctx) {
  return ctx.params.length ? detailView(ctx) : listView(ctx);
}
