#!/usr/bin/env python3
"""A Memizy relay protocol 1 client written from the protocol's documents
alone (the reference facts and docs/protocols/memizy-relay.md), as a third
party would: it sends what the protocol allows and what it forbids, and
checks each answer.

    python3 relay_client.py --http http://127.0.0.1:8787 \
        --ws ws://127.0.0.1:8787/ws --origin https://play.example.org

Python 3.11, the standard library and `websockets` (10.x API). Each case
prints one line; the last line is `N passed, N failed`; the exit status is
non-zero on any failure.

The relay's per-IP limits (room creations 60 an hour, lookups and
`join`/`host` frames 200 at once) are budgets that every case spends from
one address, so the script counts what it spends and the cases that hit
those limits run last, expecting them exactly where the count says with
`--frozen-clock` (a server on a manual clock). Against a server whose clock
runs, the lookup and join buckets refill while the script runs, and those
cases allow for the refill since the start.
"""

import argparse
import asyncio
import json
import re
import sys
import time
import traceback
from http.client import HTTPConnection
import urllib.error
import urllib.parse
import urllib.request

import websockets
import websockets.exceptions
import websockets.frames

# A guard against a hung server, not a wait for time to pass.
GUARD = 10.0
# Reference facts: frame limit 3 MB (the seed), bundle 8 MiB, 100 players,
# names 32, players 60 frames/s burst 120, host 3000 frames/s burst 6000,
# per-IP: rooms 60 an hour, lookups and joins 200 at once.
FRAME_MB = 3_000_000
FRAME_MIB = 3 * 1024 * 1024
BUNDLE_BYTES = 8 * 1024 * 1024
MAX_PLAYERS = 100
PLAYER_BURST = 120
HOST_BURST = 6000
ROOMS_PER_HOUR = 60
LOOKUP_BURST = 200
JOIN_BURST = 200
JOINS_PER_SECOND = 10
LOOKUPS_PER_SECOND = 10

TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{32}$")  # 24 bytes, base64url, no padding
PLAYER_ID_RE = re.compile(r"^p-[A-Za-z0-9_-]{8}$")  # p- + 6 bytes base64url
PIN_RE = re.compile(r"^[1-9][0-9]{5}$")

args = None
# What the script has spent of the per-IP budgets.
spent = {"rooms": 0, "lookups": 0, "joins": 0}
open_conns = []
started = time.monotonic()


def refill_allowance(per_second):
    """How many tokens a per-IP bucket may have regained since the script
    began: none when the server's clock is frozen (a test's manual clock),
    else the rate times the time elapsed, and one for rounding."""
    if args.frozen_clock:
        return 0
    return int(per_second * (time.monotonic() - started)) + 1


class Failed(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failed(msg)


def eq(got, want, what):
    check(got == want, f"{what}: expected {want!r}, got {got!r}")


# ---------------------------------------------------------------- HTTP


class Answer:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            raise Failed(f"answer {self.status} is not JSON: {self.body[:200]!r}")

    def header(self, name):
        return self.headers.get(name)


def http(method, path, body=None, headers=None, origin="default"):
    h = {}
    if origin == "default":
        origin = args.origin
    if origin is not None:
        h["Origin"] = origin
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    elif isinstance(body, str):
        body = body.encode()
        h["Content-Type"] = "application/json"
    h.update(headers or {})
    if method == "GET" and re.fullmatch(r"/api/rooms/[^/]+", path):
        spent["lookups"] += 1
    req = urllib.request.Request(args.http + path, data=body, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=GUARD) as r:
            return Answer(r.status, r.headers, r.read())
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.headers, e.read())


def put_early_answered(path, body, headers):
    """A PUT whose answer may come before the body is sent: a server may
    refuse an oversized body from its Content-Length and close, and urllib
    then reports only the broken pipe. http.client still reads the answer."""
    host, port = urllib.parse.urlsplit(args.http).netloc.rsplit(":", 1)
    c = HTTPConnection(host, int(port), timeout=GUARD)
    c.putrequest("PUT", path)
    for k, v in dict(headers, **{"Content-Length": str(len(body)), "Origin": args.origin}).items():
        c.putheader(k, v)
    c.endheaders()
    try:
        for i in range(0, len(body), 1 << 16):
            c.send(body[i : i + (1 << 16)])
    except OSError:
        pass  # the server stopped reading: its answer is already on the way
    r = c.getresponse()
    a = Answer(r.status, r.headers, r.read())
    c.close()
    return a


def create_room():
    a = http("POST", "/api/rooms")
    eq(a.status, 201, "POST /api/rooms status")
    spent["rooms"] += 1
    v = a.json()
    return v["pin"], v["hostToken"]


def lookup(pin):
    a = http("GET", f"/api/rooms/{pin}")
    eq(a.status, 200, f"GET /api/rooms/{pin} status")
    return a.json()


# ----------------------------------------------------------- WebSocket


class Conn:
    """One WebSocket connection to /ws."""

    def __init__(self, ws):
        self.ws = ws

    @staticmethod
    async def open(origin="default"):
        if origin == "default":
            origin = args.origin
        ws = await asyncio.wait_for(
            websockets.connect(
                args.ws,
                origin=origin,
                max_size=None,  # big frames come back whole
                max_queue=None,  # keep reading: the server must never stall on us
                ping_interval=None,
                compression=None,
                close_timeout=2,
            ),
            GUARD,
        )
        c = Conn(ws)
        open_conns.append(c)
        return c

    async def send(self, frame):
        if isinstance(frame, dict):
            # The per-IP join budget counts a `host` or `join` once its
            # protocol is 1 and its PIN six digits (a frame refused before
            # that cannot probe a room).
            if (
                frame.get("t") in ("host", "join")
                and frame.get("protocol") == 1
                and re.fullmatch(r"\d{6}", str(frame.get("pin")))
            ):
                spent["joins"] += 1
            frame = json.dumps(frame, ensure_ascii=False)
        await self.ws.send(frame)

    async def recv_text(self):
        try:
            m = await asyncio.wait_for(self.ws.recv(), GUARD)
        except asyncio.TimeoutError:
            raise Failed("no frame arrived in time")
        except websockets.exceptions.ConnectionClosed as e:
            raise Failed(f"connection closed ({e.code} {e.reason!r}) while a frame was expected")
        check(isinstance(m, str), f"server sent a binary frame: {m[:40]!r}")
        return m

    async def recv(self):
        t = await self.recv_text()
        try:
            return json.loads(t)
        except ValueError:
            raise Failed(f"server frame is not JSON: {t[:200]!r}")

    async def expect(self, t):
        v = await self.recv()
        eq(v.get("t"), t, f"frame type (frame {v})")
        return v

    async def expect_error(self, code, fatal):
        v = await self.recv()
        check(
            v.get("t") == "error" and v.get("code") == code and v.get("fatal") is fatal,
            f"expected error {code} fatal={fatal}, got {v}",
        )
        check(isinstance(v.get("message"), str) and v["message"], f"error without a message: {v}")
        return v

    async def until_pong(self):
        """Frames that arrive before the answer to a ping: proves what came
        (and that nothing else did)."""
        await self.send({"t": "ping"})
        seen = []
        while True:
            v = await self.recv()
            if v.get("t") == "pong":
                return seen
            seen.append(v)

    async def quiet(self, what):
        seen = await self.until_pong()
        eq(seen, [], f"frames before the pong ({what})")

    async def ended(self):
        """Reads until the connection ends; returns the close code (1006 if
        it was dropped without a close frame)."""
        try:
            async def drain():
                while True:
                    await self.ws.recv()

            await asyncio.wait_for(drain(), GUARD)
        except websockets.exceptions.ConnectionClosed:
            pass
        except asyncio.TimeoutError:
            raise Failed("the connection did not end")
        await self.ws.wait_closed()
        return self.ws.close_code

    async def close(self):
        await self.ws.close()


async def host(pin=None, token=None):
    if pin is None:
        pin, token = create_room()
    h = await Conn.open()
    await h.send({"t": "host", "protocol": 1, "pin": pin, "hostToken": token})
    v = await h.expect("hosting")
    return h, pin, token, v


async def join(pin, name, token=None):
    p = await Conn.open()
    f = {"t": "join", "protocol": 1, "pin": pin, "name": name}
    if token is not None:
        f["token"] = token
    await p.send(f)
    v = await p.expect("joined")
    return p, v


async def fatal(conn, code):
    await conn.expect_error(code, True)
    eq(await conn.ended(), 4000, f"close code after fatal {code}")


# --------------------------------------------------------------- cases

cases = []


def case(kind, phase="main"):
    def register(f):
        cases.append((kind, phase, f))
        return f

    return register


@case("allowed")
async def health():
    a = http("GET", "/api/health")
    eq(a.status, 200, "health status")
    v = a.json()
    eq(v.get("ok"), True, "health ok")
    for k in ("rooms", "connections", "players"):
        check(isinstance(v.get(k), int), f"health {k} is not a count: {v}")


@case("allowed")
async def create_a_room_over_http():
    a = http("POST", "/api/rooms")
    eq(a.status, 201, "status")
    spent["rooms"] += 1
    check(
        (a.header("Content-Type") or "").startswith("application/json"),
        f"Content-Type {a.header('Content-Type')!r}",
    )
    v = a.json()
    check(PIN_RE.match(v.get("pin", "")), f"pin is not 6 digits 100000-999999: {v}")
    check(TOKEN_RE.match(v.get("hostToken", "")), f"hostToken is not 24 bytes base64url: {v}")
    eq(a.header("Access-Control-Allow-Origin"), args.origin, "allowed origin echoed")
    r = lookup(v["pin"])
    eq(r, {"pin": v["pin"], "open": True, "appName": None, "players": 0}, "lookup of the new room")


@case("allowed")
async def lookup_of_an_unknown_pin_is_404():
    a = http("GET", "/api/rooms/000000")
    eq(a.status, 404, "status")
    check(isinstance(a.json().get("error"), str), f"404 without error: {a.body!r}")


@case("allowed")
async def host_attaches_and_players_join():
    h, pin, token, hosting = await host()
    eq(hosting, {"t": "hosting", "pin": pin, "players": []}, "hosting of an empty room")
    p, j = await join(pin, "Ann")
    eq(j["t"], "joined", "t")
    eq(j["pin"], pin, "joined pin")
    eq(j["name"], "Ann", "joined name")
    eq(j["hostConnected"], True, "joined hostConnected")
    check(PLAYER_ID_RE.match(j["playerId"]), f"playerId is not p- + 6 bytes base64url: {j}")
    check(TOKEN_RE.match(j["token"]), f"token is not 24 bytes base64url: {j}")
    pr = await h.expect("presence")
    eq(pr["event"], "join", "presence event")
    eq(pr["player"], {"id": j["playerId"], "name": "Ann", "connected": True}, "presence player")
    q, k = await join(pin, "Bea")
    check(k["playerId"] != j["playerId"] and k["token"] != j["token"], "two players share an id or token")
    await h.expect("presence")
    eq(lookup(pin)["players"], 2, "lookup players count")
    hz = http("GET", "/api/health").json()
    check(hz["players"] >= 2 and hz["rooms"] >= 1 and hz["connections"] >= 3, f"health counts {hz}")


@case("allowed")
async def to_one_player_and_to_all():
    h, pin, _, _ = await host()
    a, ja = await join(pin, "Ann")
    b, jb = await join(pin, "Bea")
    await h.expect("presence")
    await h.expect("presence")
    await h.send({"t": "to", "to": ja["playerId"], "data": {"k": "state", "only": "ann"}})
    eq(await a.recv(), {"t": "data", "data": {"k": "state", "only": "ann"}}, "Ann's data")
    await b.quiet("Bea must not get Ann's data")
    for pid in (ja["playerId"], jb["playerId"]):
        await h.send({"t": "to", "to": pid, "data": {"k": "state", "all": True}})
    eq(await a.recv(), {"t": "data", "data": {"k": "state", "all": True}}, "Ann's broadcast")
    eq(await b.recv(), {"t": "data", "data": {"k": "state", "all": True}}, "Bea's broadcast")
    await b.send({"t": "up", "data": {"k": "action", "n": 1}})
    eq(await h.recv(), {"t": "from", "from": jb["playerId"], "data": {"k": "action", "n": 1}}, "host's from")


@case("allowed")
async def data_is_forwarded_byte_for_byte():
    h, pin, _, _ = await host()
    p, j = await join(pin, "Ann")
    await h.expect("presence")
    # Unicode raw and escaped, odd spacing, numbers a re-serializer would change.
    raw = '{ "k" :"state",\t"s":"\u00e9\\u00e9 \U0001f600 \\ud83d\\ude00 \u4e2d", "n": 1.50e0 ,"z":-0, "a":[ ] }'
    await p.send('{"t":"to","to":"x","data":1}')  # noise a player may not send
    await p.expect_error("NOT_ALLOWED", False)
    await h.send('{"t":"to","to":"%s","data":%s}' % (j["playerId"], raw))
    got = await p.recv_text()
    check(raw in got, f"data was changed on the way to the player: {got!r}")
    eq(json.loads(got)["t"], "data", "frame type")
    await p.send('{"t":"up","data":%s}' % raw)
    got = await h.recv_text()
    check(raw in got, f"data was changed on the way to the host: {got!r}")
    eq(json.loads(got)["from"], j["playerId"], "from")


@case("allowed")
async def a_large_payload_near_the_cap_is_forwarded():
    h, pin, _, _ = await host()
    p, j = await join(pin, "Ann")
    await h.expect("presence")
    # A frame of exactly 3,000,000 bytes: within 3 MB, as the seed sets it.
    head = '{"t":"to","to":"%s","data":"' % j["playerId"]
    blob = ("0123456789abcdef\u00e9" * (FRAME_MB // 18 + 1))
    body = blob.encode()[: FRAME_MB - len(head) - 2].decode("utf-8", "ignore")
    frame = head + body + '"}'
    frame += " " * (FRAME_MB - len(frame.encode()))
    eq(len(frame.encode()), FRAME_MB, "frame size")
    await h.send(frame)
    got = await p.recv_text()
    check(('"' + body + '"') in got, f"large data changed ({len(got)} chars arrived)")
    up = '{"t":"up","data":"' + body + '"}'
    await p.send(up)
    got = await h.recv_text()
    check(('"' + body + '"') in got, f"large up changed ({len(got)} chars arrived)")


@case("allowed")
async def names_are_normalized():
    h, pin, _, _ = await host()
    _, j = await join(pin, "  Ann \t\n  Lee  ")
    eq(j["name"], "Ann Lee", "whitespace collapsed and trimmed")
    _, j = await join(pin, "   ")
    eq(j["name"], "Player", "empty name")
    _, j = await join(pin, "\u00e9" * 40)
    eq(j["name"], "\u00e9" * 32, "name cut to 32")
    for _ in range(3):
        await h.expect("presence")


@case("allowed")
async def rename_reaches_the_host():
    h, pin, _, _ = await host()
    p, j = await join(pin, "Ann")
    await h.expect("presence")
    await p.send({"t": "rename", "name": "  Ann   B "})
    v = await h.expect("presence")
    eq(v["event"], "rename", "presence event")
    eq(v["player"], {"id": j["playerId"], "name": "Ann B", "connected": True}, "renamed player")
    await p.send({"t": "rename", "name": " \t "})
    await p.quiet("an empty rename answers nothing")
    await h.quiet("an empty rename is ignored")


@case("allowed")
async def ping_is_answered_before_and_after_attaching():
    c = await Conn.open()
    await c.send({"t": "ping"})
    v = await c.expect("pong")
    check(isinstance(v.get("time"), int) and v["time"] > 0, f"pong time is not ms: {v}")
    h, _, _, _ = await host()
    await h.send({"t": "ping"})
    await h.expect("pong")


@case("allowed")
async def presence_disconnect_and_rejoin_with_token():
    h, pin, _, _ = await host()
    p, j = await join(pin, "Ann")
    await h.expect("presence")
    await p.close()
    v = await h.expect("presence")
    eq((v["event"], v["player"]), ("disconnect", {"id": j["playerId"], "name": "Ann", "connected": False}), "presence")
    p2, j2 = await join(pin, "Someone Else", token=j["token"])
    eq(j2["playerId"], j["playerId"], "rejoin keeps the player id")
    eq(j2["name"], "Ann", "rejoin keeps the name")
    eq(j2["token"], j["token"], "rejoin keeps the token")
    v = await h.expect("presence")
    eq((v["event"], v["player"]), ("connect", {"id": j["playerId"], "name": "Ann", "connected": True}), "presence")
    eq(lookup(pin)["players"], 1, "a rejoin is not a new player")
    # A newer connection of the same player replaces the older one.
    p3, j3 = await join(pin, "Ann", token=j["token"])
    eq(j3["playerId"], j["playerId"], "second rejoin id")
    eq(await p2.ended(), 4000, "close code of the replaced connection")
    await h.send({"t": "to", "to": j["playerId"], "data": 7})
    eq(await p3.recv(), {"t": "data", "data": 7}, "data goes to the newer connection")


@case("allowed")
async def host_goes_away_and_reattaches():
    h, pin, token, _ = await host()
    a, ja = await join(pin, "Ann")
    b, jb = await join(pin, "Bea")
    await h.expect("presence")
    await h.expect("presence")
    await b.close()
    await h.expect("presence")
    await h.close()
    eq(await a.recv(), {"t": "host-presence", "connected": False}, "players see the host go")
    h2, _, _, hosting = await host(pin, token)
    roster = {p["id"]: p for p in hosting["players"]}
    eq(roster.get(ja["playerId"]), {"id": ja["playerId"], "name": "Ann", "connected": True}, "Ann in roster")
    eq(roster.get(jb["playerId"]), {"id": jb["playerId"], "name": "Bea", "connected": False}, "Bea in roster")
    eq(await a.recv(), {"t": "host-presence", "connected": True}, "players see the host back")
    # A newer host connection replaces the older one.
    h3, _, _, _ = await host(pin, token)
    eq(await h2.ended(), 4000, "close code of the replaced host")
    await a.send({"t": "up", "data": 1})
    eq((await h3.recv())["from"], ja["playerId"], "up reaches the newer host")


@case("allowed")
async def kick_removes_a_player_and_refuses_its_token():
    h, pin, token, _ = await host()
    p, j = await join(pin, "Ann")
    await h.expect("presence")
    await h.send({"t": "kick", "playerId": j["playerId"]})
    eq(await p.recv(), {"t": "closed", "reason": "kicked"}, "kicked player's frame")
    eq(await p.ended(), 1000, "kicked player's close code")
    v = await h.expect("presence")
    eq((v["event"], v["player"]["id"], v["player"]["connected"]), ("leave", j["playerId"], False), "presence")
    q = await Conn.open()
    await q.send({"t": "join", "protocol": 1, "pin": pin, "name": "Ann", "token": j["token"]})
    await fatal(q, "KICKED")
    await h.quiet("a refused token is not a presence")


@case("allowed")
async def open_false_stops_new_players_only():
    h, pin, _, _ = await host()
    p, j = await join(pin, "Ann")
    await h.expect("presence")
    await p.close()
    await h.expect("presence")
    await h.send({"t": "open", "open": False})
    await h.quiet("open answers nothing")
    eq(lookup(pin)["open"], False, "lookup open after open:false")
    q = await Conn.open()
    await q.send({"t": "join", "protocol": 1, "pin": pin, "name": "Late"})
    await fatal(q, "ROOM_CLOSED")
    _, j2 = await join(pin, "Ann", token=j["token"])
    eq(j2["playerId"], j["playerId"], "a known token rejoins a closed room")
    await h.expect("presence")
    await h.send({"t": "open", "open": True})
    await h.quiet("open answers nothing")
    await join(pin, "Late")
    eq(lookup(pin)["open"], True, "lookup open after open:true")


@case("allowed")
async def host_close_closes_the_room_for_everyone():
    h, pin, _, _ = await host()
    a, _ = await join(pin, "Ann")
    b, _ = await join(pin, "Bea")
    await h.expect("presence")
    await h.expect("presence")
    await h.send({"t": "close"})
    await h.close()  # at once, as an app that leaves does
    for who, c in (("host", h), ("Ann", a), ("Bea", b)):
        if who != "host":
            eq(await c.recv(), {"t": "closed", "reason": "host"}, f"{who}'s closed frame")
            eq(await c.ended(), 1000, f"{who}'s close code")
    # A closed room is gone, its PIN unknown.
    eq(http("GET", f"/api/rooms/{pin}").status, 404, "lookup of a closed room")
    q = await Conn.open()
    await q.send({"t": "join", "protocol": 1, "pin": pin, "name": "Late"})
    await fatal(q, "ROOM_NOT_FOUND")


@case("allowed")
async def host_close_reaches_the_host_too():
    h, pin, token, _ = await host()
    a, _ = await join(pin, "Ann")
    await h.expect("presence")
    await h.send({"t": "close"})
    eq(await h.recv(), {"t": "closed", "reason": "host"}, "host's closed frame")
    eq(await h.ended(), 1000, "host's close code")
    eq(await a.recv(), {"t": "closed", "reason": "host"}, "player's closed frame")
    eq(await a.ended(), 1000, "player's close code")
    q = await Conn.open()
    await q.send({"t": "host", "protocol": 1, "pin": pin, "hostToken": token})
    await fatal(q, "ROOM_NOT_FOUND")


MANIFEST_HTML = """<!doctype html><html><head><title>x</title>
<script type="application/oqse-manifest+json">
{"version": "1.0", "id": "https://example.com/plugins/quiz-race", "appName": "Quiz Race \u00e9",
 "pluginVersion": "1.0.0", "capabilities": {"actions": ["render"], "types": ["mcq-single"]},
 "appSpecific": {"memizy": {"protocol": "1.0", "modes": {"multiplayer": {"players": {"min": 2, "max": 40}}}}}}
</script></head><body>quiz</body></html>"""


@case("allowed")
async def bundle_upload_fetch_and_app_name():
    pin, token = create_room()
    path = f"/api/rooms/{pin}/bundle"
    eq(http("GET", path).status, 404, "bundle before an upload")
    body = json.dumps({"pluginHtml": MANIFEST_HTML, "set": {"items": [{"q": "\u00e9?"}]}}, ensure_ascii=False)
    body = body.replace(", ", ",   ")  # the text is kept as is, not re-serialized
    a = http("PUT", path, body, {"Authorization": f"Bearer {token}"})
    eq(a.status, 200, f"upload status ({a.body[:200]!r})")
    eq(a.json(), {"version": 1}, "first upload")
    g = http("GET", path)
    eq(g.status, 200, "fetch status")
    eq(g.body, body.encode(), "fetched bundle bytes")
    eq(g.header("X-Bundle-Version"), "1", "X-Bundle-Version")
    eq(g.header("Cache-Control"), "no-store", "Cache-Control")
    expose = (g.header("Access-Control-Expose-Headers") or "").lower()
    check("x-bundle-version" in expose, f"X-Bundle-Version not exposed: {expose!r}")
    eq(lookup(pin)["appName"], "Quiz Race \u00e9", "appName from the manifest")
    a = http("PUT", path, body, {"Authorization": f"bearer {token}"})
    eq((a.status, a.json()), (200, {"version": 2}), "second upload, bearer in lower case")
    eq(http("GET", path).header("X-Bundle-Version"), "2", "X-Bundle-Version after the second upload")


@case("allowed")
async def cors_preflight_and_unknown_routes():
    a = http("OPTIONS", "/api/rooms", headers={
        "Access-Control-Request-Method": "PUT",
        "Access-Control-Request-Headers": "authorization, content-type",
    })
    eq(a.status, 204, "preflight status")
    eq(a.header("Access-Control-Allow-Origin"), args.origin, "preflight origin")
    methods = (a.header("Access-Control-Allow-Methods") or "").replace(" ", "").upper().split(",")
    for m in ("GET", "POST", "PUT", "OPTIONS"):
        check(m in methods, f"preflight methods lack {m}: {methods}")
    allowed = (a.header("Access-Control-Allow-Headers") or "").replace(" ", "").lower().split(",")
    for hd in ("authorization", "content-type"):
        check(hd in allowed, f"preflight headers lack {hd}: {allowed}")
    eq(a.header("Access-Control-Max-Age"), "600", "Max-Age")
    check("origin" in (a.header("Vary") or "").lower(), f"Vary lacks Origin: {a.header('Vary')!r}")
    a = http("GET", "/api/nothing-here")
    eq(a.status, 404, "unknown /api path")
    a = http("GET", "/api/rooms")
    eq(a.status, 405, "GET /api/rooms")
    a = http("DELETE", "/api/health")
    eq(a.status, 405, "DELETE /api/health")
    a = http("POST", "/ws", origin=None)
    eq(a.status, 405, "POST /ws")


# ------------------------------------------------------------ forbidden


@case("forbidden")
async def bundle_refusals():
    pin, token = create_room()
    path = f"/api/rooms/{pin}/bundle"
    good = {"pluginHtml": MANIFEST_HTML, "set": {}}
    eq(http("PUT", path, good).status, 403, "no Authorization")
    eq(http("PUT", path, good, {"Authorization": "Bearer " + "A" * 32}).status, 403, "wrong host token")
    eq(http("PUT", path, good, {"Authorization": token}).status, 403, "token without Bearer")
    auth = {"Authorization": f"Bearer {token}"}
    for bad, what in (
        ({"pluginHtml": 5, "set": {}}, "pluginHtml not a string"),
        ({"pluginHtml": MANIFEST_HTML}, "set missing"),
        ({"pluginHtml": MANIFEST_HTML, "set": []}, "set not an object"),
        ([1, 2], "body not an object"),
        ("{not json", "invalid JSON"),
    ):
        a = http("PUT", path, bad, auth)
        eq(a.status, 400, what)
        check(isinstance(a.json().get("error"), str), f"{what}: no error field: {a.body[:200]!r}")
    a = http("PUT", path, b"\xff\xfe{}", dict(auth, **{"Content-Type": "application/json"}))
    eq(a.status, 400, "a body that is not UTF-8")
    big = json.dumps({"pluginHtml": "x" * (BUNDLE_BYTES + 1), "set": {}}).encode()
    a = put_early_answered(path, big, dict(auth, **{"Content-Type": "application/json"}))
    eq(a.status, 413, "a bundle over 8 MiB")
    eq(http("GET", path).status, 404, "nothing was stored by a refused upload")
    a = http("PUT", "/api/rooms/999999/bundle", good, auth)
    eq(a.status, 404, "upload to an unknown room")


@case("forbidden")
async def a_wrong_origin_is_refused_over_http():
    a = http("POST", "/api/rooms", origin="https://evil.example")
    eq(a.status, 403, "POST /api/rooms from a wrong origin")
    # A preflight is answered 204 whatever the origin (as the reference), but
    # without CORS headers, so a browser does not send the request.
    a = http("OPTIONS", "/api/rooms", origin="https://evil.example", headers={"Access-Control-Request-Method": "POST"})
    eq(a.status, 204, "preflight from a wrong origin")
    eq(a.header("Access-Control-Allow-Origin"), None, "Allow-Origin on a preflight from a wrong origin")
    a = http("GET", "/api/health", origin="https://evil.example")
    eq(a.status, 200, "health from a wrong origin (excepted)")
    a = http("POST", "/api/rooms", origin="https://play.example.org.evil.example")
    eq(a.status, 403, "an origin that only starts like the allowed one")


@case("forbidden")
async def a_wrong_origin_is_refused_at_the_upgrade():
    for origin in ("https://evil.example", "http://" + args.origin.split("://", 1)[1]):
        try:
            c = await Conn.open(origin=origin)
        except websockets.exceptions.InvalidStatusCode as e:
            eq(e.status_code, 403, f"upgrade status from {origin}")
        else:
            await c.close()
            raise Failed(f"the upgrade from {origin} was accepted")


@case("forbidden")
async def invalid_json_and_no_t_are_bad_message():
    c = await Conn.open()
    for bad in ("{not json", "[1,2]", "{}", '{"t":5}', '"host"', ""):
        await c.send(bad)
        await c.expect_error("BAD_MESSAGE", False)
    h, _, _, _ = await host()
    await h.send("{oops")
    await h.expect_error("BAD_MESSAGE", False)
    await h.send({"t": "ping"})
    await h.expect("pong")


@case("forbidden")
async def unknown_types_are_not_allowed():
    c = await Conn.open()
    await c.send({"t": "teleport"})
    await c.expect_error("NOT_ALLOWED", False)
    h, pin, _, _ = await host()
    await h.send({"t": "broadcast", "data": 1})
    await h.expect_error("NOT_ALLOWED", False)
    p, _ = await join(pin, "Ann")
    await h.expect("presence")
    await p.send({"t": "Up", "data": 1})
    await p.expect_error("NOT_ALLOWED", False)
    await h.quiet("an unknown type forwards nothing")


@case("forbidden")
async def frames_before_attaching_are_not_allowed():
    c = await Conn.open()
    for f in ({"t": "up", "data": 1}, {"t": "to", "to": "p-AAAAAAAA", "data": 1}, {"t": "rename", "name": "x"},
              {"t": "open", "open": True}, {"t": "close"}, {"t": "kick", "playerId": "p-AAAAAAAA"}):
        await c.send(f)
        await c.expect_error("NOT_ALLOWED", False)


@case("forbidden")
async def a_player_may_not_act_as_host():
    h, pin, token, _ = await host()
    a, ja = await join(pin, "Ann")
    b, jb = await join(pin, "Bea")
    await h.expect("presence")
    await h.expect("presence")
    for f in (
        {"t": "to", "to": jb["playerId"], "data": "from Ann"},
        {"t": "kick", "playerId": jb["playerId"]},
        {"t": "open", "open": False},
        {"t": "close"},
    ):
        await a.send(f)
        await a.expect_error("NOT_ALLOWED", False)
    await b.quiet("Bea is untouched by Ann's host frames")
    await h.quiet("the host sees nothing of them")
    eq(lookup(pin)["open"], True, "the room is still open")
    eq(lookup(pin)["players"], 2, "nobody was kicked")
    # A host frame of the host's own kind.
    await h.send({"t": "up", "data": 1})
    await h.expect_error("NOT_ALLOWED", False)
    await h.send({"t": "rename", "name": "Host"})
    await h.expect_error("NOT_ALLOWED", False)
    # An attached player sends `host` with the right token: a second attach,
    # refused, and it stays a player.
    await a.send({"t": "host", "protocol": 1, "pin": pin, "hostToken": token})
    await a.expect_error("NOT_ALLOWED", False)
    await a.send({"t": "up", "data": "still a player"})
    eq(await h.recv(), {"t": "from", "from": ja["playerId"], "data": "still a player"}, "Ann's up")
    # And the host sends `join`: a second attach too.
    await h.send({"t": "join", "protocol": 1, "pin": pin, "name": "Mallory"})
    await h.expect_error("NOT_ALLOWED", False)
    eq(lookup(pin)["players"], 2, "the host did not become a player")


@case("forbidden")
async def a_wrong_host_token_is_fatal():
    pin, token = create_room()
    for wrong in ("A" * 32, token[:-1], "", token + "x"):
        c = await Conn.open()
        await c.send({"t": "host", "protocol": 1, "pin": pin, "hostToken": wrong})
        await fatal(c, "NOT_ALLOWED")
    # Another room's token.
    other_pin, other_token = create_room()
    c = await Conn.open()
    await c.send({"t": "host", "protocol": 1, "pin": pin, "hostToken": other_token})
    await fatal(c, "NOT_ALLOWED")
    # A player's token is not a host token.
    h, _, _, _ = await host(pin, token)
    _, j = await join(pin, "Ann")
    c = await Conn.open()
    await c.send({"t": "host", "protocol": 1, "pin": pin, "hostToken": j["token"]})
    await fatal(c, "NOT_ALLOWED")


@case("forbidden")
async def a_made_up_player_token_gets_a_new_player():
    h, pin, _, _ = await host()
    fake = "B" * 32
    _, j = await join(pin, "Eve", token=fake)
    check(j["token"] != fake, "the server took a token the client chose")
    await h.expect("presence")


@case("forbidden")
async def wrong_protocol_and_unknown_pin_are_fatal():
    pin, token = create_room()
    for f in (
        {"t": "join", "protocol": 2, "pin": pin, "name": "Ann"},
        {"t": "host", "protocol": 0, "pin": pin, "hostToken": token},
        {"t": "join", "pin": pin, "name": "Ann"},
    ):
        c = await Conn.open()
        await c.send(f)
        await fatal(c, "UNSUPPORTED_PROTOCOL")
    for bad in ("000000", "12345", "abcdef", "1234567"):
        c = await Conn.open()
        await c.send({"t": "join", "protocol": 1, "pin": bad, "name": "Ann"})
        await fatal(c, "ROOM_NOT_FOUND")


@case("forbidden")
async def a_second_attach_is_not_allowed():
    h, pin, token, _ = await host()
    await h.send({"t": "host", "protocol": 1, "pin": pin, "hostToken": token})
    await h.expect_error("NOT_ALLOWED", False)
    await h.send({"t": "ping"})
    await h.expect("pong")
    p, _ = await join(pin, "Ann")
    await h.expect("presence")
    await p.send({"t": "join", "protocol": 1, "pin": pin, "name": "Ann again"})
    await p.expect_error("NOT_ALLOWED", False)
    await h.quiet("a second join is not a presence")


@case("forbidden")
async def to_an_unknown_player_is_dropped():
    h, pin, _, _ = await host()
    p, j = await join(pin, "Ann")
    await h.expect("presence")
    await h.send({"t": "to", "to": "p-nobodyAA", "data": 1})
    await h.quiet("to an unknown player answers nothing")
    await p.close()
    await h.expect("presence")
    await h.send({"t": "to", "to": j["playerId"], "data": 1})
    await h.quiet("to a disconnected player answers nothing")
    p2, _ = await join(pin, "Ann", token=j["token"])
    await p2.quiet("nothing queued while away arrives on rejoin")


@case("forbidden")
async def a_frame_over_the_cap_is_too_large():
    h, pin, _, _ = await host()
    p, j = await join(pin, "Ann")
    await h.expect("presence")
    # The cap is 3 MiB of payload: exactly that is forwarded, a byte more is
    # refused, not fatal, and the connection lives.
    head = '{"t":"to","to":"%s","data":"' % j["playerId"]
    frame = head + "x" * (FRAME_MIB - len(head) - 2) + '"}'
    eq(len(frame), FRAME_MIB, "frame size")
    await h.send(frame)
    eq(len((await p.recv())["data"]), FRAME_MIB - len(head) - 2, "data of a frame of exactly 3 MiB")
    frame = head + "x" * (FRAME_MIB - len(head) - 1) + '"}'
    await h.send(frame)
    await h.expect_error("TOO_LARGE", False)
    await p.quiet("the refused frame was dropped")
    await h.send({"t": "to", "to": j["playerId"], "data": 1})
    eq(await p.recv(), {"t": "data", "data": 1}, "the host still forwards")
    # Over twice the cap: the connection is closed with 1009.
    frame = '{"t":"up","data":"%s"}' % ("y" * (2 * FRAME_MIB + 1000))
    try:
        await p.send(frame)
    except websockets.exceptions.ConnectionClosed:
        pass
    await p.expect_error("TOO_LARGE", True)
    code = await p.ended()
    eq(code, 1009, "close code of a frame over twice the cap")
    v = await h.expect("presence")
    eq(v["event"], "disconnect", "the player's connection is gone")


@case("forbidden")
async def invalid_utf8_in_a_text_frame_is_1007():
    c = await Conn.open()
    await c.ws.write_frame(True, websockets.frames.OP_TEXT, b'{"t":"ping","x":"\xff\xfe"}')
    eq(await c.ended(), 1007, "close code of invalid UTF-8")


@case("forbidden")
async def a_binary_frame_is_read_as_utf8_text():
    # The protocol's frames are JSON text frames; the reference decodes a
    # binary frame as UTF-8 text, so a client that sends one still works.
    h, pin, _, _ = await host()
    await h.send('{"t":"ping"}'.encode())
    await h.expect("pong")
    p, j = await join(pin, "Ann")
    await h.expect("presence")
    await p.send('{"t":"up","data":"\u00e9"}'.encode())
    eq(await h.recv(), {"t": "from", "from": j["playerId"], "data": "\u00e9"}, "a binary up")
    # Bytes that are not UTF-8 are not JSON text.
    await h.send(b'{"t":"ping","x":"\xff"}')
    await h.expect_error("BAD_MESSAGE", False)
    await h.send({"t": "ping"})
    await h.expect("pong")


# Pings sent at once in a flood before their answers are read, on a frozen
# clock: under the server's outbound queue bound (1,024 frames), so that a
# client slower to read than the server is to answer is never one the
# server rightly closes as too slow (1013). On a running clock the flood
# goes out whole, to outrun the bucket's refill.
FLOOD_CHUNK = 500


async def flood(conn, count):
    """Sends `count` pings, FLOOD_CHUNK at once, each chunk's answers read
    before the next; returns (pongs, RATE_LIMITED errors)."""
    pongs = limited = 0
    while pongs + limited < count:
        left = count - pongs - limited
        chunk = min(FLOOD_CHUNK, left) if args.frozen_clock else left
        await asyncio.gather(*(conn.send({"t": "ping"}) for _ in range(chunk)))
        for _ in range(chunk):
            v = await conn.recv()
            if v.get("t") == "pong":
                pongs += 1
            elif v.get("t") == "error" and v.get("code") == "RATE_LIMITED" and v.get("fatal") is False:
                limited += 1
            else:
                raise Failed(f"unexpected frame in a flood: {v}")
    return pongs, limited


@case("forbidden")
async def a_player_over_its_rate_is_rate_limited():
    h, pin, _, _ = await host()
    p, _ = await join(pin, "Ann")
    await h.expect("presence")
    sent = PLAYER_BURST + 30
    pongs, limited = await flood(p, sent)
    # The join was a frame of the bucket too.
    low, high = (PLAYER_BURST - 1, PLAYER_BURST - 1) if args.frozen_clock else (PLAYER_BURST - 1, sent - 1)
    check(low <= pongs <= high, f"player burst {PLAYER_BURST}: {pongs} pongs, {limited} RATE_LIMITED")
    check(limited >= 1, "a player over its rate was not limited")
    if args.frozen_clock:
        # Still over its rate, still open: an `up` is refused and dropped.
        await p.send({"t": "up", "data": 1})
        await p.expect_error("RATE_LIMITED", False)
    await h.quiet("dropped frames are not forwarded")


@case("forbidden")
async def the_host_over_its_rate_is_rate_limited():
    h, _, _, _ = await host()
    # On a running clock the bucket refills 3000 a second while we send:
    # three bursts' worth outruns it unless the client sends slower than that.
    sent = HOST_BURST + 100 if args.frozen_clock else 3 * HOST_BURST
    pongs, limited = await flood(h, sent)
    # The host's bucket starts full when `host` attaches it (the frame was
    # taken from the player's bucket every connection starts with).
    low, high = (HOST_BURST, HOST_BURST) if args.frozen_clock else (HOST_BURST, sent - 1)
    check(low <= pongs <= high, f"host burst {HOST_BURST}: {pongs} pongs, {limited} RATE_LIMITED")
    check(limited >= 1, "a host over its rate was not limited")


@case("forbidden")
async def a_full_room_refuses_the_101st_player():
    h, pin, _, _ = await host()
    players = []
    for i in range(MAX_PLAYERS):
        p, _ = await join(pin, f"P{i}")
        players.append(p)
    for _ in range(MAX_PLAYERS):
        await h.expect("presence")
    eq(lookup(pin)["players"], MAX_PLAYERS, "players in a full room")
    c = await Conn.open()
    await c.send({"t": "join", "protocol": 1, "pin": pin, "name": "One too many"})
    await fatal(c, "ROOM_FULL")
    for p in players:
        await p.close()


@case("forbidden")
async def joins_past_the_ip_burst_are_rate_limited_and_closed_1013():
    h, pin, _, _ = await host()
    used = spent["joins"]
    check(used < JOIN_BURST, f"the script itself sent {used} join and host frames")
    # One player rejoining with its token, so the room never fills: each
    # rejoin is a join frame of the IP all the same.
    _, j = await join(pin, "J")
    for i in range(JOIN_BURST - used - 1):
        p, _ = await join(pin, "J", token=j["token"])
        await p.close()
    # The budget is spent: the next join is refused, or (on a running
    # clock) one of the few that the refill since the start allows.
    extra = 0
    while True:
        c = await Conn.open()
        await c.send({"t": "join", "protocol": 1, "pin": pin, "name": "J", "token": j["token"]})
        v = await c.recv()
        if v.get("t") != "joined":
            break
        await c.close()
        extra += 1
        if extra > refill_allowance(JOINS_PER_SECOND):
            raise Failed(f"{spent['joins']} join and host frames from one IP, none refused")
    check(v.get("t") == "error" and v.get("code") == "RATE_LIMITED" and v.get("fatal") is False,
          f"the join beyond the IP's burst: {v}")
    check(re.search(r"\d", v["message"]), f"RATE_LIMITED does not name the seconds: {v}")
    eq(await c.ended(), 1013, "close code of a join over the IP's rate")


@case("forbidden")
async def room_creations_past_the_hourly_limit_get_429():
    made = spent["rooms"]
    check(made < ROOMS_PER_HOUR, f"the script itself made {made} rooms")
    for _ in range(ROOMS_PER_HOUR - made):
        create_room()
    a = http("POST", "/api/rooms")
    eq(a.status, 429, f"room creation number {ROOMS_PER_HOUR + 1}")
    check(isinstance(a.json().get("error"), str), f"429 without error: {a.body!r}")



@case("forbidden")
async def lookups_past_the_burst_get_429():
    used = spent["lookups"]
    check(used < LOOKUP_BURST, f"the script itself made {used} lookups")
    statuses = []
    for _ in range(LOOKUP_BURST - used):
        statuses.append(http("GET", "/api/rooms/000000").status)
    check(set(statuses) == {404}, f"lookups within the burst: {sorted(set(statuses))}")
    extra = 0
    while True:
        a = http("GET", "/api/rooms/000000")
        if a.status != 404 or extra >= refill_allowance(LOOKUPS_PER_SECOND):
            break
        extra += 1
    eq(a.status, 429, f"lookup number {spent['lookups']} (burst {LOOKUP_BURST})")
    check(isinstance(a.json().get("error"), str), f"429 without error: {a.body!r}")
    ra = a.header("Retry-After")
    check(ra is not None and ra.isdigit() and int(ra) >= 1, f"Retry-After {ra!r}")


# -------------------------------------------------------------- restart
#
# What survives a restart (docs: "What survives a restart"): the server is
# stopped between the two phases, and started again on the same database.


@case("allowed", phase="before-restart")
async def a_room_is_made_and_the_server_stops():
    pin, token = create_room()
    h, _, _, _ = await host(pin, token)
    a, ja = await join(pin, "Ann")
    b, jb = await join(pin, "Bea")
    await h.expect("presence")
    await h.expect("presence")
    await a.send({"t": "rename", "name": "Ann Lee"})
    await h.expect("presence")
    await h.send({"t": "kick", "playerId": jb["playerId"]})
    await h.expect("presence")
    await h.send({"t": "open", "open": False})
    await h.quiet("open answers nothing")
    body = json.dumps({"pluginHtml": MANIFEST_HTML, "set": {"n": 1}}, ensure_ascii=False)
    a_ = http("PUT", f"/api/rooms/{pin}/bundle", body, {"Authorization": f"Bearer {token}"})
    eq((a_.status, a_.json()), (200, {"version": 1}), "upload")
    with open(args.state, "w") as f:
        json.dump({"pin": pin, "hostToken": token, "ann": ja, "beaToken": jb["token"], "bundle": body}, f)
    print("READY", flush=True)  # the server is stopped now
    eq(await h.ended(), 1001, "the host's close code when the server shuts down")
    eq(await a.ended(), 1001, "a player's close code when the server shuts down")


@case("allowed", phase="after-restart")
async def the_room_is_found_again_after_the_restart():
    with open(args.state) as f:
        st = json.load(f)
    pin, ann = st["pin"], st["ann"]
    eq(lookup(pin), {"pin": pin, "open": False, "appName": "Quiz Race \u00e9", "players": 1}, "lookup after the restart")
    g = http("GET", f"/api/rooms/{pin}/bundle")
    eq((g.status, g.header("X-Bundle-Version"), g.body), (200, "1", st["bundle"].encode()), "bundle after the restart")
    h, _, _, hosting = await host(pin, st["hostToken"])
    eq(hosting["players"], [{"id": ann["playerId"], "name": "Ann Lee", "connected": False}], "roster after the restart")
    a, j = await join(pin, "ignored", token=ann["token"])
    eq((j["playerId"], j["name"], j["token"]), (ann["playerId"], "Ann Lee", ann["token"]), "Ann rejoins")
    v = await h.expect("presence")
    eq(v["event"], "connect", "presence")
    q = await Conn.open()
    await q.send({"t": "join", "protocol": 1, "pin": pin, "name": "Bea", "token": st["beaToken"]})
    await fatal(q, "KICKED")
    q = await Conn.open()
    await q.send({"t": "join", "protocol": 1, "pin": pin, "name": "New"})
    await fatal(q, "ROOM_CLOSED")
    await h.send({"t": "to", "to": ann["playerId"], "data": {"k": "state"}})
    eq(await a.recv(), {"t": "data", "data": {"k": "state"}}, "forwarding after the restart")


# ---------------------------------------------------------------- main


async def main():
    global args
    ap = argparse.ArgumentParser()
    ap.add_argument("--http", required=True)
    ap.add_argument("--ws", required=True)
    ap.add_argument("--origin", required=True)
    ap.add_argument("--only", help="run only the cases whose name contains this")
    ap.add_argument("--skip", action="append", default=[],
                    help="skip the cases whose name contains this (repeatable)")
    ap.add_argument("--frozen-clock", action="store_true",
                    help="the server's clock does not move: per-IP buckets do not refill, limits are exact")
    ap.add_argument("--phase", default="main", choices=["main", "before-restart", "after-restart"],
                    help="main: every case; before-restart: make a room's state, print READY, "
                    "expect close 1001 when the server stops; after-restart: find that state again")
    ap.add_argument("--state", help="the file where before-restart writes what after-restart checks")
    args = ap.parse_args()
    if args.phase != "main" and not args.state:
        ap.error("--state is needed with --phase")
    passed = failed = 0
    for kind, phase, f in cases:
        if phase != args.phase or (args.only and args.only not in f.__name__):
            continue
        if any(s in f.__name__ for s in args.skip):
            print(f"skip  {kind:9} {f.__name__}", flush=True)
            continue
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(f(), 120)
            passed += 1
            print(f"ok    {kind:9} {f.__name__} ({time.monotonic() - t0:.2f}s)", flush=True)
        except Failed as e:
            failed += 1
            print(f"FAIL  {kind:9} {f.__name__}: {e}", flush=True)
        except Exception as e:  # a crash of the case is a failure too
            failed += 1
            tb = traceback.format_exc().strip().splitlines()[-3:]
            print(f"FAIL  {kind:9} {f.__name__}: {type(e).__name__}: {e} | {' / '.join(tb)}", flush=True)
        while open_conns:
            c = open_conns.pop()
            try:
                await asyncio.wait_for(c.ws.close(), GUARD)
            except Exception:
                pass
    print(f"budget spent: {spent}", flush=True)
    print(f"{passed} passed, {failed} failed", flush=True)
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
