// A JavaScript host driving hostwire-echo-worker (path in argv[2]) over
// stdio: calls, cancel, progress, streams both ways, every malformed case
// of docs/protocols/worker-rpc.md, version mismatches and the limits.
// Prints one line per case and "N passed, N failed"; exits 1 on a failure.

import { spawn } from "node:child_process";
import { Peer, MAX_ID } from "./wire.mjs";

const WORKER = process.argv[2];
const only = process.argv[3] ? new RegExp(process.argv[3]) : null;
let passed = 0;
let failed = 0;

function assert(cond, message) {
  if (!cond) throw new Error(message);
}

async function rejects(promise, code, mention) {
  try {
    const v = await promise;
    throw new Error(`expected ${code}, got ${JSON.stringify(v)}`);
  } catch (e) {
    assert(e.code === code, `expected ${code}, got ${e.code}: ${e.message}`);
    if (mention) assert(e.message.includes(mention), `"${e.message}" should mention ${mention}`);
    return e;
  }
}

async function test(name, fn) {
  if (only && !only.test(name)) return;
  let timer;
  const deadline = new Promise((_, rej) => {
    timer = setTimeout(() => rej(new Error("no answer within 20 s: a call hung")), 20000);
  });
  try {
    await Promise.race([fn(), deadline]);
    passed += 1;
    console.log(`ok ${name}`);
  } catch (e) {
    failed += 1;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  } finally {
    clearTimeout(timer);
  }
}

function start(env = {}, options = {}) {
  const child = spawn(WORKER, [], { env: { ...process.env, ...env }, stdio: ["pipe", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  child.stdin.on("error", () => {}); // the worker may exit first
  const exited = new Promise((r) => child.on("exit", (code) => r(code)));
  const peer = new Peer(child.stdout, child.stdin, { agent: "js-host", ...options });
  return { child, peer, exited, stderr: () => stderr };
}

async function stop(w) {
  if (!w.peer.closed) await w.peer.goodbye("done");
  const code = await w.exited;
  assert(code === 0, `the worker exited with ${code}`);
}

// The first line received (or to come) that matches.
function line(peer, pred) {
  return new Promise((resolve) => {
    const hit = (l) => {
      try {
        return pred(JSON.parse(l), l);
      } catch {
        return false;
      }
    };
    const seen = peer.lines.find(hit);
    if (seen !== undefined) return resolve(JSON.parse(seen));
    const prev = peer.onLine;
    peer.onLine = (l, f) => {
      if (hit(l)) {
        peer.onLine = prev;
        resolve(f);
      }
      return prev ? prev(l, f) : false;
    };
  });
}

const errorFor = (peer, id) => line(peer, (f) => f.kind === "response" && f.id === id && f.ok === false);
const frame = (o) => JSON.stringify({ v: "1.0.0", ...o });

await test("1,000 calls with 50 in flight, ids 1, 2, 3, ...", async () => {
  const w = start();
  await w.peer.ready;
  let next = 0;
  const lane = async () => {
    while (next < 1000) {
      const i = next++;
      const r = await w.peer.call("echo", { i });
      assert(r.i === i, `call ${i} got ${JSON.stringify(r)}`);
    }
  };
  await Promise.all(Array.from({ length: 50 }, lane));
  assert((await w.peer.call("add", { a: 2, b: 40 })) === 42, "add");
  await stop(w);
});

await test("progress, then cancel", async () => {
  const w = start();
  let progressed;
  const gotProgress = new Promise((r) => (progressed = r));
  const call = w.peer.call("wait", null, { onProgress: progressed });
  const p = await gotProgress;
  assert(p.stage === "waiting", JSON.stringify(p));
  call.cancel("enough");
  await rejects(call, "CANCELLED");
  await stop(w);
});

await test("a stream to the worker, within its credit", async () => {
  const w = start();
  const tx = w.peer.openStream("sum");
  for (let i = 1; i <= 100; i++) await tx.send(i);
  assert((await tx.end()) === 5050, "sum");
  await stop(w);
});

await test("a stream from the worker, and a call back", async () => {
  const w = start();
  w.peer.registerStream("collect", async (_p, rx) => {
    const all = [];
    for await (const v of rx) all.push(v);
    return all;
  });
  w.peer.register("ping", async (p) => ({ pong: p }));
  const got = await w.peer.call("produce", { n: 40, method: "collect" });
  assert(JSON.stringify(got) === JSON.stringify([...Array(40).keys()]), JSON.stringify(got));
  const back = await w.peer.call("call_back", { method: "ping", params: 7 });
  assert(back.pong === 7, JSON.stringify(back));
  await stop(w);
});

await test("a response whose error has no code fails the worker's call", async () => {
  const w = start();
  w.peer.onLine = (l, f) => {
    if (f.kind === "request" && f.method === "js_broken") {
      // The usual JavaScript error shape, not an envelope.
      w.peer.sendRaw(frame({ kind: "response", id: f.id, ok: false, error: { name: "TypeError", message: "x is undefined" } }));
      return true;
    }
    return false;
  };
  await rejects(w.peer.call("call_back", { method: "js_broken" }), "PROTOCOL_ERROR", "error.code");
  await stop(w);
});

await test("a stream-end whose error has no code fails the stream", async () => {
  const w = start();
  const tx = w.peer.openStream("sum");
  await tx.send(1);
  w.peer.sendRaw(frame({ kind: "stream-end", id: tx.id, ok: false, error: { name: "Error", message: "disk" } }));
  await rejects(tx.result, "PROTOCOL_ERROR", "error.code");
  await stop(w);
});

for (const seq of ['"2"', "0"]) {
  await test(`a stream-chunk with seq ${seq} fails the stream (not 12 instead of 112)`, async () => {
    const w = start();
    const tx = w.peer.openStream("sum");
    await tx.send(100);
    w.peer.sendRaw(`{"v":"1.0.0","kind":"stream-chunk","id":${tx.id},"seq":${seq},"data":10}`);
    await rejects(tx.result, "PROTOCOL_ERROR", "seq");
    await stop(w);
  });
}

await test("a malformed cancel ends the call it names", async () => {
  const w = start();
  let progressed;
  const started = new Promise((r) => (progressed = r));
  const call = w.peer.call("wait", null, { onProgress: progressed });
  await started;
  w.peer.sendRaw(`{"v":"1.0.0","kind":"cancel","id":${call.id},"reason":5}`);
  await rejects(call, "PROTOCOL_ERROR", "reason");
  await stop(w);
});

await test("a malformed request gets an error response under its id", async () => {
  const w = start();
  await w.peer.ready;
  w.peer.sendRaw(frame({ kind: "request", id: 77, params: 1 }));
  const r = await errorFor(w.peer, 77);
  assert(r.error.code === "PROTOCOL_ERROR" && r.error.message.includes("method"), JSON.stringify(r));
  await stop(w);
});

await test("a goodbye whose reason is a number still ends the worker", async () => {
  const w = start();
  await w.peer.ready;
  w.peer.sendRaw(frame({ kind: "goodbye", reason: 42 }));
  assert((await w.exited) === 0, "exit code");
  assert(w.stderr().includes("PROTOCOL_ERROR") && w.stderr().includes("reason"), w.stderr());
});

await test("a malformed hello is answered with a goodbye that says why", async () => {
  const w = start({}, { hello: { v: "1.0.0", kind: "hello", features: "all" } });
  const bye = await line(w.peer, (f) => f.kind === "goodbye");
  assert(bye.error.code === "PROTOCOL_ERROR" && bye.error.message.includes("features"), JSON.stringify(bye));
  assert((await w.exited) === 0, "exit code");
});

await test("nesting: 128 levels in all is accepted, 129 refused and answered", async () => {
  const w = start();
  await w.peer.ready;
  const nest = (n) => "[".repeat(n) + "]".repeat(n);
  w.peer.sendRaw(`{"v":"1.0.0","kind":"request","id":1,"method":"echo","params":${nest(127)}}`);
  const ok = await line(w.peer, (f) => f.kind === "response" && f.id === 1);
  assert(ok.ok === true, JSON.stringify(ok).slice(0, 200));
  w.peer.sendRaw(`{"v":"1.0.0","kind":"request","id":2,"method":"echo","params":${nest(128)}}`);
  const r = await errorFor(w.peer, 2);
  assert(r.error.code === "PROTOCOL_ERROR" && r.error.message.includes("128"), JSON.stringify(r));
  await stop(w);
});

await test("lone surrogates and 1e400 in params pass through", async () => {
  const w = start();
  const s = "a\ud800b";
  assert(JSON.stringify(s) === '"a\\ud800b"', "JSON.stringify escapes a lone surrogate");
  assert((await w.peer.call("echo", { s, t: "\udc00" })).s === s, "surrogate");
  w.peer.sendRaw(`{"v":"1.0.0","kind":"request","id":100000,"method":"echo","params":1e400}`);
  const r = await line(w.peer, (f, l) => f.id === 100000 && l.includes('"result":1e400'));
  assert(r.ok === true, "1e400");
  w.peer.sendRaw(`{"v":"1.0.0","kind":"request","id":100001,"method":"a\\ud800b"}`);
  const e = await errorFor(w.peer, 100001);
  assert(e.error.message.includes("method"), JSON.stringify(e));
  await stop(w);
});

await test("ids written 5.0 and 1e3 are answered as 5 and 1000", async () => {
  const w = start();
  await w.peer.ready;
  w.peer.sendRaw(`{"v":"1.0.0","kind":"request","id":5.0,"method":"echo","params":"five"}`);
  w.peer.sendRaw(`{"v":"1.0.0","kind":"request","id":1e3,"method":"echo","params":"thousand"}`);
  assert((await line(w.peer, (f) => f.id === 5)).result === "five", "5.0");
  assert((await line(w.peer, (f) => f.id === 1000)).result === "thousand", "1e3");
  await stop(w);
});

await test("ids: 2^53-1, then going backwards, all answered", async () => {
  const w = start();
  await w.peer.ready;
  for (const id of [MAX_ID, 151, 150, 0]) {
    w.peer.sendRaw(frame({ kind: "request", id, method: "echo", params: id }));
    const r = await line(w.peer, (f) => f.kind === "response" && f.id === id);
    assert(r.ok === true && r.result === id, JSON.stringify(r));
  }
  assert((await w.peer.call("echo", "after")) === "after", "later calls");
  await stop(w);
});

await test("a duplicate in-flight id leaves the original call alone", async () => {
  const w = start();
  let progressed;
  const started = new Promise((r) => (progressed = r));
  const call = w.peer.call("wait", null, { onProgress: progressed, id: 500 });
  await started;
  w.peer.sendRaw(frame({ kind: "request", id: 500, method: "echo", params: "dup" }));
  // A round trip: the worker has read the duplicate by the time this returns.
  assert((await w.peer.call("echo", "sync", { id: 501 })) === "sync", "sync");
  call.cancel();
  await rejects(call, "CANCELLED");
  assert((await w.peer.call("echo", "sync", { id: 502 })) === "sync", "sync");
  const answers = w.peer.lines.filter((l) => JSON.parse(l).id === 500 && JSON.parse(l).kind === "response");
  assert(answers.length === 1, `id 500 was answered ${answers.length} times: ${answers}`);
  await stop(w);
});

await test("a bad byte fails one frame, not the connection", async () => {
  const w = start();
  await w.peer.ready;
  w.peer.sendRaw(Buffer.concat([Buffer.from('{"v":"1.0.0","kind":"request","id":900,"method":"echo","params":"'), Buffer.from([0xff]), Buffer.from('"}')]));
  const r = await errorFor(w.peer, 900);
  assert(r.error.message.includes("UTF-8"), JSON.stringify(r));
  assert((await w.peer.call("echo", "still here")) === "still here", "after");
  await stop(w);
});

await test("version: a request of major 2 gets VERSION_MISMATCH, the connection stays", async () => {
  const w = start();
  await w.peer.ready;
  w.peer.sendRaw(JSON.stringify({ v: "2.0.0", kind: "request", id: 31, method: "echo" }));
  assert((await errorFor(w.peer, 31)).error.code === "VERSION_MISMATCH", "code");
  assert((await w.peer.call("echo", 1)) === 1, "after");
  await stop(w);
});

for (const kind of ["progress", "response", "goodbye", "stream-ack"]) {
  await test(`version: a ${kind} of major 2 gets a VERSION_MISMATCH goodbye`, async () => {
    const w = start();
    await w.peer.ready;
    const pending = w.peer.call("wait");
    w.peer.sendRaw(JSON.stringify({ v: "2.0.0", kind, id: 1, progress: 1, ok: true, ack: 0, credit: 1 }));
    const bye = await line(w.peer, (f) => f.kind === "goodbye");
    assert(bye.error && bye.error.code === "VERSION_MISMATCH", JSON.stringify(bye));
    const e = await rejects(pending, "PEER_GOODBYE");
    assert(e.goodbye.error.code === "VERSION_MISMATCH", "the goodbye's error");
    assert((await w.exited) === 0, "exit code");
  });
}

await test("version: a hello of major 2 gets its goodbye before the worker exits, 20 of 20", async () => {
  for (let run = 0; run < 20; run++) {
    const w = start({}, { version: "2.0.0" });
    await w.exited;
    // The worker has exited: everything it wrote is in the pipe already.
    const e = await w.peer.closedPromise;
    assert(e.goodbye && e.goodbye.error.code === "VERSION_MISMATCH", `run ${run}: ${e.code} ${e.message}`);
  }
});

await test("limit: calls in flight in the worker", async () => {
  const w = start({ WORKER_RPC_MAX_INBOUND_CALLS: "4" });
  const calls = [];
  for (let i = 0; i < 4; i++) calls.push(w.peer.call("wait"));
  await rejects(w.peer.call("wait"), "TOO_MANY_CALLS");
  for (const c of calls) c.cancel();
  for (const c of calls) await rejects(c, "CANCELLED");
  await stop(w);
});

await test("limit: frames held before hello", async () => {
  const w = start({ WORKER_RPC_MAX_HELD_FRAMES: "8" }, { hello: null });
  for (let id = 1; id <= 20; id++) w.peer.sendRaw(frame({ kind: "request", id, method: "echo", params: id }));
  const bye = await line(w.peer, (f) => f.kind === "goodbye");
  assert(bye.error.code === "PROTOCOL_ERROR" && bye.error.message.includes("held back"), JSON.stringify(bye));
  assert((await w.exited) === 0, "exit code");
});

await test("limit: frame size, both ways, fails one call", async () => {
  const w = start({ WORKER_RPC_MAX_FRAME_BYTES: "4096" });
  await rejects(w.peer.call("emit", { bytes: 10000 }), "FRAME_TOO_LARGE");
  await rejects(w.peer.call("echo", "x".repeat(5000)), "PROTOCOL_ERROR", "the limit is 4096");
  assert((await w.peer.call("emit", { bytes: 10 })) === "x".repeat(10), "after");
  await stop(w);
});

await test("limit: a host that stops reading gets a WRITE_TIMEOUT end", async () => {
  const w = start({ WORKER_RPC_WRITE_TIMEOUT_MS: "300" });
  await w.peer.ready;
  w.child.stdout.pause();
  const big = "y".repeat(64 * 1024);
  for (let i = 0; i < 64; i++) w.peer.call("echo", big).catch(() => {});
  assert((await w.exited) === 0, "exit code");
  assert(w.stderr().includes("WRITE_TIMEOUT"), w.stderr());
  w.child.stdout.resume();
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
