// The JSON delta libraries JavaScript hosts pick today, on the fixture pair
// of the criterion bench `delta` (bench/fixtures/delta: a 21 KB quiz state,
// then the same state with five scores and one answer changed). For each
// library: diff (or produce) and apply, per second, and the delta's size as
// compact JSON. Prints one JSON document.
//
// jsondiffpatch and fast-json-patch compare two states and run on two pairs:
// `full`, the two fixture files parsed separately (nothing shared: every
// member is compared), and `shared`, `after` derived from `before` by the
// edit as an immutable update makes it (mutative's `create`, outside the
// timing), so unchanged subtrees are the same objects and both libraries
// skip them by identity, as a JavaScript game host's consecutive states
// let them. Both apply in place: each iteration applies to a working copy,
// put back (unpatch / the reverse patch) outside the timed part. mutative
// has no diff of two plain objects: it replays the edit on a draft of
// `before` (the changed paths, found beforehand by fast-json-patch outside
// the timing) and records patches from the draft, so its figure is the
// cost of an edit already known, not of a comparison; it then applies
// immutably.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import * as jsondiffpatch from 'jsondiffpatch';
import fastJsonPatch from 'fast-json-patch';
import { create, apply as mutativeApply } from 'mutative';

const here = dirname(fileURLToPath(import.meta.url));
const dir = join(here, '..', 'fixtures', 'delta');
const beforeText = readFileSync(join(dir, 'before.json'), 'utf8');
const afterText = readFileSync(join(dir, 'after.json'), 'utf8');
const before = JSON.parse(beforeText);
const after = JSON.parse(afterText);
const seconds = Number(process.env.SECONDS_PER_LIB ?? 3);
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

function run(name, step, restore) {
  // Warm-up, then timed rounds of 1,000 until the time is spent. Both wall
  // time and CPU time (process.cpuUsage: on a machine shared with other
  // work, wall time also counts waiting for a core) of the step alone.
  for (let i = 0; i < 2000; i++) { step(); restore(); }
  let n = 0;
  let spent = 0n;
  let cpuMicros = 0;
  const budget = BigInt(Math.round(seconds * 1e9));
  while (spent < budget) {
    for (let i = 0; i < 1000; i++) {
      const c0 = process.cpuUsage();
      const t0 = process.hrtime.bigint();
      step();
      spent += process.hrtime.bigint() - t0;
      const c = process.cpuUsage(c0);
      cpuMicros += c.user + c.system;
      restore();
    }
    n += 1000;
  }
  const wallPer = Number(spent) / n - overhead.wallNanos;
  const cpuPer = cpuMicros / n - overhead.cpuMicros;
  return {
    name,
    iterations: n,
    perSecond: Math.round(1e9 / wallPer),
    perCpuSecond: Math.round(1e6 / cpuPer),
  };
}

// What one pair of cpuUsage/hrtime calls costs around an empty step, to
// take off each library's figure.
const overhead = (() => {
  const n = 200000;
  let cpu = 0;
  let wall = 0n;
  for (let i = 0; i < n; i++) {
    const c0 = process.cpuUsage();
    const t0 = process.hrtime.bigint();
    wall += process.hrtime.bigint() - t0;
    const c = process.cpuUsage(c0);
    cpu += c.user + c.system;
  }
  return { cpuMicros: cpu / n, wallNanos: Number(wall) / n };
})();

const results = [];

// The edit itself: the fields that differ, found once, outside the timing.
const edits = fastJsonPatch.compare(before, after).map((op) => ({
  path: op.path.split('/').slice(1),
  value: op.value,
}));
const edit = (draft) => {
  for (const { path, value } of edits) {
    let node = draft;
    for (let i = 0; i < path.length - 1; i++) node = node[path[i]];
    node[path[path.length - 1]] = value;
  }
};
// `after` as an immutable update of `before`: unchanged subtrees shared.
const derived = create(before, edit);
if (!same(derived, after) || derived.players[0] !== before.players[0]) {
  throw new Error('the derived state does not share the unchanged subtrees');
}
const pairs = [
  ['full', after, 'full comparison of two plain objects, patch in place'],
  ['shared', derived, 'a state derived by an immutable edit: shared subtrees skipped by identity, patch in place'],
];

for (const [pair, next, work] of pairs) {
  const differ = jsondiffpatch.create();
  const copy = JSON.parse(beforeText);
  let delta;
  const r = run('jsondiffpatch', () => {
    delta = differ.diff(before, next);
    differ.patch(copy, delta);
  }, () => differ.unpatch(copy, delta));
  differ.patch(copy, delta);
  if (!same(copy, after)) throw new Error('jsondiffpatch: wrong result');
  results.push({ ...r, pair, work, version: pkgVersion('jsondiffpatch'), deltaBytes: JSON.stringify(delta).length });
}

for (const [pair, next, work] of pairs) {
  const copy = JSON.parse(beforeText);
  const back = fastJsonPatch.compare(next, before);
  let ops;
  const r = run('fast-json-patch', () => {
    ops = fastJsonPatch.compare(before, next);
    fastJsonPatch.applyPatch(copy, ops, false, true);
  }, () => fastJsonPatch.applyPatch(copy, back, false, true));
  fastJsonPatch.applyPatch(copy, ops, false, true);
  if (!same(copy, after)) throw new Error('fast-json-patch: wrong result');
  results.push({ ...r, pair, work, version: pkgVersion('fast-json-patch'), deltaBytes: JSON.stringify(ops).length });
}

{
  let patches;
  let next;
  const r = run('mutative', () => {
    [, patches] = create(before, edit, { enablePatches: true });
    next = mutativeApply(before, patches);
  }, () => {});
  if (!same(next, after)) throw new Error('mutative: wrong result');
  results.push({ ...r, pair: 'edit', work: 'no comparison: replays a known edit on a draft, then applies immutably', version: pkgVersion('mutative'), deltaBytes: JSON.stringify(patches).length });
}

function pkgVersion(name) {
  return JSON.parse(readFileSync(join(here, 'node_modules', name, 'package.json'), 'utf8')).version;
}

console.log(JSON.stringify({
  fixture: { bytes: Buffer.byteLength(beforeText.trim()), secondsPerLib: seconds },
  timingOverhead: overhead,
  node: process.version,
  results,
}, null, 2));
