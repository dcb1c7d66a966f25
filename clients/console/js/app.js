// Hash routing, the navigation and the session check. Each page module exports
// render(ctx) → optional cleanup function; ctx = {root, params, query, navigate}.
import {h, replace} from './dom.js';
import {currentSession, isAdmin, loadSession, logout, onSessionLost} from './api.js';
import {errorBox} from './ui.js';

const PAGES = [
  {path: 'dashboard', label: 'Dashboard', module: './pages/dashboard.js'},
  {path: 'devices', label: 'Devices', module: './pages/devices.js'},
  {path: 'push', label: 'Push', module: './pages/push.js'},
  {path: 'automation', label: 'Automation', module: './pages/automation.js'},
  {path: 'events', label: 'Events', module: './pages/events.js'},
  {path: 'analytics', label: 'Analytics', module: './pages/analytics.js'},
  {path: 'users', label: 'Users', module: './pages/users.js'},
  {path: 'containers', label: 'Containers', module: './pages/containers.js'},
  {path: 'privacy', label: 'Privacy', module: './pages/privacy.js'},
  {path: 'operators', label: 'Operators', module: './pages/operators.js'},
  {path: 'audit', label: 'Audit log', module: './pages/audit.js'},
];
const LOGIN = {path: 'login', module: './pages/login.js'};

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
let cleanup = null;
let generation = 0;

function parseHash() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [pathPart, queryPart] = raw.split('?');
  const parts = pathPart.split('/').filter((p) => p !== '').map((p) => {
    try {
      return decodeURIComponent(p);
    } catch (e) {
      return p;
    }
  });
  const query = Object.fromEntries(new URLSearchParams(queryPart || ''));
  return {name: parts[0] || 'dashboard', params: parts.slice(1), query};
}

export function navigate(hash) {
  if (location.hash === hash) render();
  else location.hash = hash;
}

function drawChrome() {
  const s = currentSession();
  document.body.classList.toggle('role-viewer', !!s && s.role !== 'admin');
  document.body.classList.toggle('signed-out', !s);
  const current = parseHash().name;
  replace(nav, s ? PAGES.map((p) => h('a', {href: `#/${p.path}`, class: p.path === current ? 'active' : null,
    'aria-current': p.path === current ? 'page' : null, dataset: {page: p.path}}, p.label)) : null);
  replace(who, s ? [
    h('span', {class: 'name', id: 'who-name'}, s.name),
    h('span', {class: ['role', `role-${s.role}`], id: 'who-role'}, s.role),
    h('button', {type: 'button', class: 'secondary small', id: 'logout', on: {click: onLogout}}, 'Log out'),
  ] : null);
}

async function onLogout() {
  try {
    await logout();
  } finally {
    navigate('#/login');
  }
}

async function render() {
  const gen = ++generation;
  if (cleanup) {
    try {
      cleanup();
    } catch (e) {
      /* a page's cleanup must not stop the next page */
    }
    cleanup = null;
  }
  const route = parseHash();
  const s = currentSession();
  if (!s && route.name !== 'login') {
    location.replace('#/login');
    return;
  }
  if (s && route.name === 'login') {
    location.replace('#/dashboard');
    return;
  }
  drawChrome();
  const def = route.name === 'login' ? LOGIN : PAGES.find((p) => p.path === route.name);
  const root = h('div', {class: 'page-root', dataset: {page: route.name}});
  replace(main, root);
  if (!def) {
    replace(root, errorBox({message: 'No such page.'}));
    return;
  }
  try {
    const mod = await import(def.module);
    if (gen !== generation) return;
    const c = await mod.render({root, params: route.params, query: route.query, navigate, admin: isAdmin()});
    if (gen !== generation) {
      if (typeof c === 'function') c();
      return;
    }
    cleanup = typeof c === 'function' ? c : null;
  } catch (e) {
    if (gen === generation) root.appendChild(errorBox(e));
  }
}

onSessionLost(() => {
  drawChrome();
  location.replace('#/login');
});

window.addEventListener('hashchange', render);

(async () => {
  try {
    await loadSession();
  } catch (e) {
    replace(main, errorBox(e));
    return;
  }
  render();
})();
