// The bare forwarder again, in Bun (uWebSockets underneath), as a relay
// written for Bun would run: the same few frames of relay protocol 1 that
// the load generator speaks (create a room, attach, `to`, `up`, `ping`),
// no validation, no limits, no store. Measured beside hostwire and the Rust
// forwarder so that the page compares against the runtime users pick.
//
//   bun bun-forwarder.mjs --listen 127.0.0.1:8787

const args = process.argv.slice(2);
const at = args.indexOf("--listen");
const [hostname, port] = (at >= 0 ? args[at + 1] : "127.0.0.1:8787").split(":");

const rooms = new Map(); // pin -> { host, players: Map<id, ws> }
let next = 0;

const server = Bun.serve({
  hostname,
  port: Number(port),
  fetch(req, server) {
    const url = new URL(req.url);
    if (req.method === "POST" && url.pathname === "/api/rooms") {
      const pin = String(100000 + (next++ % 900000));
      rooms.set(pin, { host: null, players: new Map() });
      return Response.json({ pin, hostToken: "bare" }, { status: 201 });
    }
    if (url.pathname === "/ws" && server.upgrade(req, { data: { room: null, me: "" } })) {
      return undefined;
    }
    return new Response("not found", { status: 404 });
  },
  websocket: {
    // The generator's idle connections send nothing for longer than the
    // default two minutes would allow.
    idleTimeout: 0,
    perMessageDeflate: false,
    message(ws, text) {
      let f;
      try {
        f = JSON.parse(text);
      } catch {
        return;
      }
      const c = ws.data;
      switch (f.t) {
        case "host":
        case "join": {
          const room = rooms.get(f.pin);
          if (!room) return;
          c.room = room;
          if (f.t === "host") {
            room.host = ws;
            ws.send('{"t":"hosting","players":[]}');
          } else {
            c.me = `p-${next++}`;
            room.players.set(c.me, ws);
            ws.send(JSON.stringify({ t: "joined", playerId: c.me, token: "bare" }));
            room.host?.send(JSON.stringify({ t: "presence", player: { id: c.me }, event: "join" }));
          }
          return;
        }
        case "to":
          c.room?.players.get(f.to)?.send(JSON.stringify({ t: "data", data: f.data }));
          return;
        case "up":
          c.room?.host?.send(JSON.stringify({ t: "from", from: c.me, data: f.data }));
          return;
        case "ping":
          ws.send('{"t":"pong","time":0}');
          return;
      }
    },
    close(ws) {
      const c = ws.data;
      c.room?.players.delete(c.me);
    },
  },
});

console.log(`listening on ${server.hostname}:${server.port}`);
