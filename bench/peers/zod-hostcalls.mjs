// The pipeline a JavaScript host runs on a host call it receives as bytes:
// parse the JSON text, validate the arguments with Zod 4, check that the
// payload is plain JSON and within its size limit. Same fixtures as the
// criterion bench `decode_host_call`. Prints one JSON document.
import { readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { z } from 'zod';

const here = dirname(fileURLToPath(import.meta.url));
const fixtures = join(here, '..', 'fixtures', 'memizy');

const text = (min, max) => z.string().min(min).max(max);
const address = text(1, 128);
const handshake = z.looseObject({
  protocol: z.string().regex(/^\d+\.\d+$/),
  sdk: z.looseObject({ name: text(1, 200), version: text(1, 100) }),
  plugin: z.looseObject({ id: text(1, 500), version: text(1, 100) }),
  features: z.array(text(1, 100)).max(100),
});
const outgoing = z.looseObject({
  to: z.union([z.literal('authority'), z.literal('all'), z.array(address).min(1).max(500)]),
  data: z.unknown(),
});
const answer = z
  .looseObject({
    playerId: address.optional(),
    itemId: text(1, 128),
    isCorrect: z.boolean(),
    confidence: z.union([z.literal(1), z.literal(2), z.literal(3), z.literal(4)]).optional(),
    timeSpentMs: z.number().int().nonnegative().optional(),
    hintsUsed: z.number().int().nonnegative().optional(),
    isSkipped: z.boolean().optional(),
    answer: z.unknown().optional(),
    item: z.looseObject({ id: text(1, 128), type: text(1, 64) }).optional(),
  })
  .refine((r) => !r.item || r.item.id === r.itemId);
const args = {
  hello: z.tuple([handshake]),
  send: z.tuple([outgoing]),
  recordAnswer: z.tuple([answer]),
};

function nonJson(value, depth = 0, seen = new Set()) {
  if (value === null || typeof value === 'string' || typeof value === 'boolean') return null;
  if (typeof value === 'number') return Number.isFinite(value) ? null : 'not finite';
  if (typeof value !== 'object') return typeof value;
  if (depth >= 64) return 'too deep';
  if (seen.has(value)) return 'circular';
  seen.add(value);
  const children = Array.isArray(value) ? value : Object.values(value);
  for (const c of children) {
    const p = nonJson(c, depth + 1, seen);
    if (p) return p;
  }
  seen.delete(value);
  return null;
}
const encoder = new TextEncoder();
function within(value, max) {
  if (nonJson(value)) throw new Error('INVALID_ARGUMENT');
  const size = encoder.encode(JSON.stringify(value)).length;
  if (size > max) throw new Error('TOO_LARGE');
}

function decode(method, argsText) {
  const parsed = JSON.parse(argsText);
  const r = args[method].safeParse(parsed);
  if (!r.success) throw new Error('INVALID_ARGUMENT');
  if (method === 'send') within(r.data[0].data, 64 * 1024);
  if (method === 'recordAnswer' && r.data[0].answer !== undefined) within(r.data[0].answer, 4 * 1024);
  return r.data;
}

const seconds = Number(process.env.SECONDS_PER_FIXTURE ?? 3);
const out = { runtime: `node ${process.version}`, zod: '4', results: {} };
for (const file of readdirSync(fixtures).filter((f) => f.endsWith('.json')).sort()) {
  const { method, args: argsText } = JSON.parse(readFileSync(join(fixtures, file), 'utf8'));
  for (let i = 0; i < 20000; i++) decode(method, argsText); // warm-up
  // Batches of 1,000 calls; the median batch, as criterion reports the
  // median on the Rust side (a noisy neighbour moves a mean more).
  const batches = [];
  const start = process.hrtime.bigint();
  const end = start + BigInt(Math.round(seconds * 1e9));
  let now = start;
  while (now < end) {
    const t0 = now;
    for (let i = 0; i < 1000; i++) decode(method, argsText);
    now = process.hrtime.bigint();
    batches.push(Number(now - t0) / 1e3 / 1000);
  }
  batches.sort((a, b) => a - b);
  const median = batches[Math.floor(batches.length / 2)];
  const mean = Number(now - start) / 1e3 / (batches.length * 1000);
  out.results[file.replace(/\.json$/, '')] = {
    method,
    callsPerSecond: 1e6 / median,
    microsPerCall: median,
    meanMicrosPerCall: mean,
    statistic: 'median of 1,000-call batches',
  };
}
console.log(JSON.stringify(out, null, 2));
