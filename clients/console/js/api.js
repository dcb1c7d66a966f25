// The console talks to the same JSON API scripts use. The session lives in an HttpOnly cookie
// the page cannot read; the CSRF token is kept in this module's memory only (never in
// localStorage, sessionStorage or a URL) and sent as X-CSRF-Token on every change.

let csrfToken = null;
let session = null;
const lostListeners = [];

export class ApiError extends Error {
  constructor(status, code, message, body) {
    super(message || code || `HTTP ${status}`);
    this.status = status;
    this.code = code || `http_${status}`;
    this.body = body;
  }
}

export function currentSession() {
  return session;
}

export function isAdmin() {
  return !!session && session.role === 'admin';
}

export function onSessionLost(fn) {
  lostListeners.push(fn);
}

function setSession(s) {
  session = s ? {name: s.name, role: s.role, idleTimeoutMs: s.idleTimeoutMs} : null;
  csrfToken = s ? s.csrfToken : null;
}

// "/v1/x" + {a: 1, b: ''} → "/v1/x?a=1" (empty values left out).
export function withQuery(path, query) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== null && v !== undefined && v !== '') q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

export function seg(s) {
  return encodeURIComponent(String(s));
}

export async function request(method, path, body) {
  const headers = {Accept: 'application/json'};
  const init = {method, credentials: 'same-origin', headers, cache: 'no-store', redirect: 'error'};
  if (method !== 'GET' && method !== 'HEAD') {
    if (csrfToken) headers['X-CSRF-Token'] = csrfToken;
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, 'network', `The backend did not answer (${e.message})`);
  }
  const text = await res.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch (e) {
      data = {raw: text};
    }
  }
  if (!res.ok) {
    // The backend's error shape: {"error": "<human message>", "code": "<machine code>"}.
    const code = data && (data.code || data.error) ? String(data.code || data.error) : null;
    const msg = data && data.code && data.error ? String(data.error) : data && data.message ? String(data.message) : null;
    const err = new ApiError(res.status, code, msg || code || `HTTP ${res.status}`, data);
    if (res.status === 401 && session && !path.startsWith('/v1/session')) {
      setSession(null);
      for (const fn of lostListeners) fn(err);
    }
    throw err;
  }
  return data;
}

export const get = (path, query) => request('GET', withQuery(path, query));
export const post = (path, body) => request('POST', path, body === undefined ? {} : body);
export const put = (path, body) => request('PUT', path, body);
export const patch = (path, body) => request('PATCH', path, body);
export const del = (path) => request('DELETE', path);

// ---- Session ----------------------------------------------------------------------------------

export async function loadSession() {
  try {
    setSession(await request('GET', '/v1/session'));
  } catch (e) {
    if (e.status !== 401) throw e;
    setSession(null);
  }
  return session;
}

export async function login(name, password) {
  setSession(await request('POST', '/v1/session/login', {name, password}));
  return session;
}

// The bootstrap credential: logs in as the admin "operator" (the token itself is not kept).
export async function loginWithToken(token) {
  setSession(await request('POST', '/v1/session/login', {token}));
  return session;
}

export async function logout() {
  try {
    await request('POST', '/v1/session/logout');
  } finally {
    setSession(null);
  }
}
