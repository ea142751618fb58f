// A JavaScript worker on stdin / stdout, for a Rust host `Peer` to drive.
// Well-behaved methods: echo, add, wait, fail, produce, call_back, and the
// stream method sum. Methods whose names start with bad_ (and a few more)
// send what a buggy or hostile worker sends, so the host's rules can be
// checked. JS_WORKER_VERSION sets the version of its hello;
// JS_WORKER_HELLO=bad sends a malformed hello.

import { Peer, RpcError } from "./wire.mjs";

const version = process.env.JS_WORKER_VERSION || "1.0.0";
const options = { agent: "js-worker", version };
if (process.env.JS_WORKER_HELLO === "bad") options.hello = { v: "1.0.0", kind: "hello", features: "all" };
const peer = new Peer(process.stdin, process.stdout, options);
const raw = (o) => peer.sendRaw(JSON.stringify({ v: "1.0.0", ...o }));
// Take over the answer of a call: the handler's own return is not sent.
const takeOver = (ctx) => peer.serving.delete(ctx.id);
const never = () => new Promise(() => {});
const lineFor = (pred) =>
  new Promise((resolve) => {
    const prev = peer.onLine;
    peer.onLine = (l, f) => {
      if (pred(f)) {
        peer.onLine = prev;
        resolve(f);
        return true;
      }
      return prev ? prev(l, f) : false;
    };
  });

peer.register("echo", async (p) => p);
peer.register("add", async (p) => p.a + p.b);
peer.register("wait", async (_p, ctx) => {
  ctx.progress({ stage: "waiting" });
  await new Promise((r) => ctx.signal.addEventListener("abort", r));
  throw new RpcError("CANCELLED", "cancelled");
});
peer.register("fail", async () => {
  throw new RpcError("OUTER", "it failed", { line: 3 });
});
peer.register("produce", async (p) => {
  const tx = peer.openStream(p.method, null);
  for (let i = 0; i < p.n; i++) await tx.send(i);
  return tx.end();
});
peer.register("call_back", async (p) => peer.call(p.method, p.params ?? null));
peer.registerStream("sum", async (_p, rx) => {
  let total = 0;
  for await (const v of rx) total += v;
  return total;
});

// What a buggy worker sends.
peer.register("bad_error", async (_p, ctx) => {
  takeOver(ctx);
  raw({ kind: "response", id: ctx.id, ok: false, error: { name: "TypeError", message: "x is undefined" } });
});
peer.register("bad_progress", async (_p, ctx) => {
  raw({ kind: "progress", id: ctx.id, done: 1 });
  await new Promise((r) => ctx.signal.addEventListener("abort", r));
});
peer.register("id_as_float", async (_p, ctx) => {
  takeOver(ctx);
  peer.sendRaw(`{"v":"1.0.0","kind":"response","id":${ctx.id}.0,"ok":true,"result":"float id"}`);
});
peer.register("surrogate", async () => "a\ud800b");
peer.register("deep", async (p) => {
  let v = [];
  for (let i = 1; i < p.levels; i++) v = [v];
  return v;
});
peer.register("bad_byte", async (_p, ctx) => {
  takeOver(ctx);
  peer.sendRaw(
    Buffer.concat([
      Buffer.from(`{"v":"1.0.0","kind":"response","id":${ctx.id},"ok":true,"result":"`),
      Buffer.from([0xff]),
      Buffer.from('"}'),
    ]),
  );
});
peer.register("bad_chunk", async (p) => {
  const tx = peer.openStream(p.method, null);
  await tx.send(100);
  peer.sendRaw(`{"v":"1.0.0","kind":"stream-chunk","id":${tx.id},"seq":"2","data":10}`);
  try {
    return { ok: await tx.result };
  } catch (e) {
    return { code: e.code, message: e.message };
  }
});
peer.register("dup", async (p) => {
  const id = 9000;
  raw({ kind: "request", id, method: p.method });
  raw({ kind: "request", id, method: p.method });
  // A round trip: the host has read both by the time this returns.
  await peer.call("ping", null);
  const answer = lineFor((f) => f.kind === "response" && f.id === id);
  await peer.call(p.release, null);
  const f = await answer;
  await peer.call("ping", null);
  const answers = peer.lines.filter((l) => {
    const g = JSON.parse(l);
    return g.kind === "response" && g.id === id;
  }).length;
  return { answers, result: f.result ?? null };
});
peer.register("flood", async (p) => {
  const ids = [];
  for (let i = 0; i < p.n; i++) ids.push(9100 + i);
  const last = lineFor((f) => f.kind === "response" && f.id === ids[ids.length - 1]);
  for (const id of ids) raw({ kind: "request", id, method: p.method });
  const f = await last;
  for (const id of ids) raw({ kind: "cancel", id });
  return f.error ? f.error.code : "answered";
});
peer.register("bad_goodbye", async () => {
  raw({ kind: "goodbye", reason: 42 });
  return never();
});
peer.register("other_major", async (_p, ctx) => {
  peer.sendRaw(JSON.stringify({ v: "2.0.0", kind: "progress", id: ctx.id, progress: 1 }));
  return never();
});

const closed = await peer.closedPromise;
process.stderr.write(`js worker: closed: ${closed.code} ${closed.message}\n`);
process.stdout.end(() => process.exit(0));
