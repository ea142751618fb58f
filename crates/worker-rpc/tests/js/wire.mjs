// A worker RPC 1.0.0 peer in plain JavaScript (Node, no packages), written
// from the seed and docs/protocols/worker-rpc.md alone: NDJSON frames over
// a readable and a writable stream, hello first, ids of our own (1, 2, 3,
// ...), progress, cancel, credit-based streams, goodbye.

export const PROTOCOL_VERSION = "1.0.0";
export const MAX_ID = 2 ** 53 - 1;
const V = PROTOCOL_VERSION;

export class RpcError extends Error {
  constructor(code, message, data, cause) {
    super(message);
    this.code = code;
    this.data = data;
    this.envelopeCause = cause;
  }
}

export function toEnvelope(e) {
  const env = { code: e.code || "INTERNAL_ERROR", message: String(e.message ?? e) };
  if (e.data !== undefined) env.data = e.data;
  return env;
}

function fromEnvelope(env) {
  return new RpcError(env.code, env.message, env.data, env.cause);
}

function major(v) {
  const m = /^(\d+)\./.exec(typeof v === "string" ? v : "");
  return m ? Number(m[1]) : null;
}

export class Peer {
  // `hello`: the hello frame to send instead of ours, or null for none
  // (for tests of peers that get it wrong).
  constructor(input, output, { agent = "js-peer", window = 16, version = V, hello } = {}) {
    this.output = output;
    this.window = window;
    this.version = version;
    this.nextId = 1;
    this.calls = new Map(); // our calls: id -> {resolve, reject, onProgress}
    this.outStreams = new Map(); // our streams: id -> {granted, sent, wake}
    this.serving = new Map(); // the peer's calls: id -> AbortController
    this.inStreams = new Map(); // the peer's streams: id -> receiver state
    this.handlers = new Map();
    this.streamHandlers = new Map();
    this.helloSeen = false;
    this.held = [];
    this.closed = null;
    this.lines = []; // every line received, for tests
    this.onLine = null; // test hook: (line, frame) => boolean (true: handled)
    this.closedPromise = new Promise((r) => (this._closedResolve = r));
    this.ready = new Promise((res, rej) => {
      this._readyResolve = res;
      this._readyReject = rej;
    });
    this.ready.catch(() => {});
    const hi = hello === undefined ? { v: this.version, kind: "hello", features: [], agent } : hello;
    if (hi) this.sendRaw(JSON.stringify(hi));
    let pending = [];
    input.on("data", (chunk) => {
      let start = 0;
      for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10, start)) {
        pending.push(chunk.subarray(start, i));
        const line = Buffer.concat(pending).toString("utf8");
        pending = [];
        start = i + 1;
        if (line.trim() !== "") this._receive(line);
      }
      if (start < chunk.length) pending.push(chunk.subarray(start));
    });
    input.on("end", () =>
      this._close(new RpcError("TRANSPORT_CLOSED", "the transport closed without goodbye")),
    );
    input.on("error", (e) => this._close(new RpcError("TRANSPORT_CLOSED", String(e))));
  }

  // Frames wait for the peer's hello, except hello and goodbye.
  send(frame) {
    if (this.closed) return;
    if (!this.helloSeen && frame.kind !== "hello" && frame.kind !== "goodbye") {
      this.held.push(frame);
      return;
    }
    this.output.write(JSON.stringify(frame) + "\n");
  }

  // Bytes as they are, for frames a well-behaved peer would never send.
  sendRaw(text) {
    this.output.write(typeof text === "string" ? text + "\n" : Buffer.concat([text, Buffer.from("\n")]));
  }

  register(method, fn) {
    this.handlers.set(method, fn);
  }

  registerStream(method, fn) {
    this.streamHandlers.set(method, fn);
  }

  allocId() {
    return this.nextId++;
  }

  call(method, params = null, { onProgress, id = this.allocId() } = {}) {
    if (this.closed) return Object.assign(Promise.reject(this.closed), { id });
    const p = new Promise((resolve, reject) => {
      this.calls.set(id, { resolve, reject, onProgress });
    });
    this.send({ v: V, kind: "request", id, method, params });
    p.id = id;
    p.cancel = (reason = "cancelled") => this.send({ v: V, kind: "cancel", id, reason });
    return p;
  }

  openStream(method, params = null) {
    const id = this.allocId();
    const result = new Promise((resolve, reject) => this.calls.set(id, { resolve, reject }));
    const st = { granted: 0, sent: 0, wake: null };
    this.outStreams.set(id, st);
    this.send({ v: V, kind: "stream-open", id, method, params });
    const self = this;
    return {
      id,
      result,
      async send(data) {
        while (st.sent >= st.granted) {
          if (self.closed) throw self.closed;
          if (!self.outStreams.has(id)) throw new RpcError("CANCELLED", "the receiver ended the stream");
          await new Promise((r) => (st.wake = r));
        }
        st.sent += 1;
        self.send({ v: V, kind: "stream-chunk", id, seq: st.sent, data });
      },
      end() {
        self.send({ v: V, kind: "stream-end", id, ok: true });
        return result;
      },
      abort(err) {
        self.send({ v: V, kind: "stream-end", id, ok: false, error: toEnvelope(err) });
        return result;
      },
    };
  }

  goodbye(reason, error) {
    const frame = { v: V, kind: "goodbye", reason };
    if (error) frame.error = error;
    this.send(frame);
    this._close(new RpcError("GOODBYE", `this side said goodbye: ${reason}`));
    return new Promise((r) => this.output.end(r));
  }

  _respond(id, ok, value) {
    if (!this.serving.has(id)) return;
    this.serving.delete(id);
    this.inStreams.delete(id);
    const frame = { v: V, kind: "response", id, ok };
    if (ok) frame.result = value === undefined ? null : value;
    else frame.error = toEnvelope(value);
    this.send(frame);
  }

  _serve(id, run) {
    const abort = new AbortController();
    this.serving.set(id, abort);
    const ctx = {
      id,
      signal: abort.signal,
      peer: this,
      progress: (p) => this.send({ v: V, kind: "progress", id, progress: p }),
    };
    Promise.resolve()
      .then(() => run(ctx))
      .then(
        (r) => this._respond(id, !abort.signal.aborted, abort.signal.aborted ? new RpcError("CANCELLED", "cancelled") : r),
        (e) => this._respond(id, false, abort.signal.aborted ? new RpcError("CANCELLED", "cancelled") : e),
      );
  }

  _receive(line) {
    this.lines.push(line);
    let f;
    try {
      f = JSON.parse(line);
    } catch {
      return;
    }
    if (this.onLine && this.onLine(line, f)) return;
    if (f === null || typeof f !== "object") return;
    if (major(f.v) !== 1) {
      const err = { code: "VERSION_MISMATCH", message: `the peer speaks ${f.v}; this side speaks ${V}` };
      if ((f.kind === "request" || f.kind === "stream-open") && Number.isSafeInteger(f.id)) {
        this.serving.set(f.id, null);
        this._respond(f.id, false, err);
      } else {
        this.send({ v: V, kind: "goodbye", reason: "version mismatch", error: err });
        this._close(fromEnvelope(err));
        this.output.end();
      }
      return;
    }
    const id = f.id;
    switch (f.kind) {
      case "hello":
        if (!this.helloSeen) {
          this.helloSeen = true;
          const held = this.held;
          this.held = [];
          for (const h of held) this.send(h);
          this._readyResolve();
        }
        break;
      case "goodbye": {
        const e = new RpcError("PEER_GOODBYE", `the peer said goodbye: ${f.reason ?? "no reason given"}`);
        e.goodbye = f;
        this._close(e);
        break;
      }
      case "request": {
        if (this.serving.has(id)) return; // a duplicate in-flight id
        const h = this.handlers.get(f.method);
        if (!h) {
          this.serving.set(id, null);
          this._respond(id, false, new RpcError("UNKNOWN_METHOD", `no method ${f.method}`));
          return;
        }
        this._serve(id, (ctx) => h(f.params ?? null, ctx));
        break;
      }
      case "response": {
        const c = this.calls.get(id);
        if (!c) return;
        this.calls.delete(id);
        const st = this.outStreams.get(id);
        this.outStreams.delete(id);
        if (st && st.wake) st.wake();
        if (f.ok) c.resolve(f.result ?? null);
        else c.reject(fromEnvelope(f.error));
        break;
      }
      case "progress": {
        const c = this.calls.get(id);
        if (c && c.onProgress) c.onProgress(f.progress);
        break;
      }
      case "cancel": {
        const a = this.serving.get(id);
        if (a) a.abort();
        const s = this.inStreams.get(id);
        if (s) s.push({ error: new RpcError("CANCELLED", "the sender cancelled the stream") });
        break;
      }
      case "stream-open": {
        if (this.serving.has(id)) return;
        const h = this.streamHandlers.get(f.method);
        if (!h) {
          this.serving.set(id, null);
          this._respond(id, false, new RpcError("UNKNOWN_METHOD", `no stream method ${f.method}`));
          return;
        }
        const rx = this._receiver(id);
        this.inStreams.set(id, rx);
        this.send({ v: V, kind: "stream-ack", id, ack: 0, credit: this.window });
        this._serve(id, (ctx) => h(f.params ?? null, rx.reader, ctx));
        break;
      }
      case "stream-chunk": {
        const s = this.inStreams.get(id);
        if (!s) return;
        if (f.seq !== s.received + 1) {
          this._failStream(id, "PROTOCOL_ERROR", `chunk ${f.seq} out of order`);
        } else if (f.seq > s.granted) {
          this._failStream(id, "STREAM_CREDIT_EXCEEDED", `chunk ${f.seq} beyond the credit`);
        } else {
          s.received = f.seq;
          s.push({ data: f.data, seq: f.seq });
        }
        break;
      }
      case "stream-end": {
        const s = this.inStreams.get(id);
        if (s) s.push(f.ok ? { end: true } : { error: fromEnvelope(f.error) });
        break;
      }
      case "stream-ack": {
        const st = this.outStreams.get(id);
        if (st) {
          st.granted += f.credit;
          if (st.wake) st.wake();
        }
        break;
      }
    }
  }

  _failStream(id, code, message) {
    const s = this.inStreams.get(id);
    const a = this.serving.get(id);
    if (a) a.abort();
    if (s) s.push({ error: new RpcError(code, message) });
    this._respond(id, false, new RpcError(code, message));
  }

  _receiver(id) {
    const queue = [];
    let waiter = null;
    let consumed = 0;
    const self = this;
    const state = {
      received: 0,
      granted: this.window,
      push(item) {
        queue.push(item);
        if (waiter) {
          const w = waiter;
          waiter = null;
          w();
        }
      },
      reader: {
        async next() {
          while (queue.length === 0) await new Promise((r) => (waiter = r));
          const item = queue.shift();
          if (item.error) throw item.error;
          if (item.end) return { done: true };
          consumed += 1;
          if (consumed >= Math.max(1, self.window / 2)) {
            state.granted += consumed;
            self.send({ v: V, kind: "stream-ack", id, ack: item.seq, credit: consumed });
            consumed = 0;
          }
          return { done: false, value: item.data };
        },
        [Symbol.asyncIterator]() {
          return this;
        },
      },
    };
    return state;
  }

  _close(err) {
    if (this.closed) return;
    this.closed = err;
    for (const [, c] of this.calls) c.reject(err);
    this.calls.clear();
    for (const [, a] of this.serving) if (a) a.abort();
    for (const [, s] of this.inStreams) s.push({ error: err });
    for (const [, st] of this.outStreams) if (st.wake) st.wake();
    this._readyReject(err);
    this._closedResolve(err);
  }
}
