// A line diff (Myers' O(ND) algorithm) between two texts, for comparing container versions.
// Pure: no DOM. diffLines(a, b) → [{op: ' '|'-'|'+', text}], or null when the texts differ by
// more than MAX_EDITS lines (the caller says so instead of freezing the page).

export const MAX_EDITS = 4000;

export function diffLines(aText, bText, maxEdits = MAX_EDITS) {
  const a = splitLines(aText), b = splitLines(bText);
  // Common prefix and suffix are cheap and usually most of a container.
  let pre = 0;
  while (pre < a.length && pre < b.length && a[pre] === b[pre]) pre++;
  let suf = 0;
  while (suf < a.length - pre && suf < b.length - pre && a[a.length - 1 - suf] === b[b.length - 1 - suf]) suf++;
  const ma = a.slice(pre, a.length - suf), mb = b.slice(pre, b.length - suf);
  const middle = myers(ma, mb, maxEdits);
  if (middle === null) return null;
  const out = [];
  for (let i = 0; i < pre; i++) out.push({op: ' ', text: a[i]});
  out.push(...middle);
  for (let i = a.length - suf; i < a.length; i++) out.push({op: ' ', text: a[i]});
  return out;
}

export function splitLines(text) {
  if (text === '') return [];
  const lines = String(text).split('\n');
  if (lines[lines.length - 1] === '') lines.pop();
  return lines;
}

function myers(a, b, maxEdits) {
  const n = a.length, m = b.length, max = n + m;
  if (max === 0) return [];
  const limit = Math.min(max, maxEdits);
  const offset = limit + 1;
  let v = new Int32Array(2 * limit + 3);
  const trace = [];
  for (let d = 0; d <= limit; d++) {
    trace.push(v.slice());
    for (let k = -d; k <= d; k += 2) {
      let x;
      if (k === -d || (k !== d && v[offset + k - 1] < v[offset + k + 1])) x = v[offset + k + 1];
      else x = v[offset + k - 1] + 1;
      let y = x - k;
      while (x < n && y < m && a[x] === b[y]) {
        x++;
        y++;
      }
      v[offset + k] = x;
      if (x >= n && y >= m) return backtrack(trace, a, b, offset, d);
    }
  }
  return null;
}

function backtrack(trace, a, b, offset, dEnd) {
  const ops = [];
  let x = a.length, y = b.length;
  for (let d = dEnd; d > 0; d--) {
    const v = trace[d];
    const k = x - y;
    const prevK = k === -d || (k !== d && v[offset + k - 1] < v[offset + k + 1]) ? k + 1 : k - 1;
    const prevX = v[offset + prevK], prevY = prevX - prevK;
    while (x > prevX && y > prevY) {
      ops.push({op: ' ', text: a[x - 1]});
      x--;
      y--;
    }
    if (x === prevX) ops.push({op: '+', text: b[y - 1]});
    else ops.push({op: '-', text: a[x - 1]});
    x = prevX;
    y = prevY;
  }
  while (x > 0 && y > 0) {
    ops.push({op: ' ', text: a[x - 1]});
    x--;
    y--;
  }
  return ops.reverse();
}

// Keeps `context` unchanged lines around each change and folds the rest:
// [{op, text}] → [{op, text} | {op: '…', skipped: n}].
export function hunks(lines, context = 3) {
  const keep = new Uint8Array(lines.length);
  lines.forEach((l, i) => {
    if (l.op !== ' ') for (let j = Math.max(0, i - context); j <= Math.min(lines.length - 1, i + context); j++) keep[j] = 1;
  });
  const out = [];
  let skipped = 0;
  lines.forEach((l, i) => {
    if (keep[i]) {
      if (skipped) out.push({op: '…', skipped});
      skipped = 0;
      out.push(l);
    } else {
      skipped++;
    }
  });
  if (skipped) out.push({op: '…', skipped});
  return out;
}

// A stable text form of a JSON value (keys sorted) so a diff shows content, not key order.
export function canonicalText(value) {
  return JSON.stringify(sortKeys(value), null, 2) + '\n';
}

function sortKeys(v) {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === 'object') {
    const o = {};
    for (const k of Object.keys(v).sort()) o[k] = sortKeys(v[k]);
    return o;
  }
  return v;
}
