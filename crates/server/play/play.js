// The device page of a hosted Memizy session (SPEC 1.0): it joins the
// session as the board, a controller or the settings screen, embeds the
// plugin in a sandboxed iframe and bridges the plugin to the session.
//
//   plugin --(Penpal 7.0.6, postMessage)--> this page --(worker RPC frames,
//   WebSocket /memizy/session/ws)--> the session on the server
//
// Host API calls of the plugin go out as worker RPC `request`s; the
// server's `request`s are Plugin API calls into the iframe. The page holds
// no secret and trusts nothing the plugin says: every call still goes
// through the session's rules on the server. Both directions are bounded.

import { connect, WindowMessenger } from '/memizy/play/vendor/penpal-7.0.6.mjs';

/** Host API calls sent to the server and not yet answered; past it a call is refused RATE_LIMITED. */
const MAX_PENDING_HOST_CALLS = 256;
/** Plugin API calls waiting for the plugin (not connected yet, or not answering); past it they are dropped. */
const MAX_QUEUED_PLUGIN_CALLS = 1024;
/** How long a Host API call waits for the server before it fails INTERNAL_ERROR. */
const HOST_CALL_TIMEOUT_MS = 60_000;
/** The roster and phase are read this often (lobby, host's page). */
const POLL_MS = 1000;
/** A player's page with its game running reads them this often (the plugin API says the rest). */
const POLL_LIVE_MS = 5000;
/** Reconnect backoff after a dropped network. */
const RECONNECT_MIN_MS = 500;
const RECONNECT_MAX_MS = 8000;
/** The worker RPC version the session socket speaks. */
const RPC = '1.0.0';
/** The Host API methods a plugin may call (SPEC 5); others are UNKNOWN_METHOD. */
const HOST_METHODS = ['hello', 'ready', 'send', 'saveSnapshot', 'recordAnswer', 'saveData',
  'updateSettings', 'getAsset', 'end', 'reportError', 'service'];

const $ = (id) => document.getElementById(id);
const hashParams = new URLSearchParams(location.hash.slice(1));
const queryParams = new URLSearchParams(location.search.slice(1));
const param = (k) => hashParams.get(k) ?? queryParams.get(k);

const page = {
  session: param('session'),
  token: param('token'),
  wantView: param('view'),
  info: null,
  /** server clock − device clock, from the sample with the shortest round trip. */
  skew: 0,
  bestRtt: Infinity,
  instance: null,
  /** Set once the page must not attach again (kicked, replaced, bad token, ended). */
  stopped: false,
  backoff: RECONNECT_MIN_MS,
  players: [],
};
window.hostwirePage = page;

/** A ProtocolError as the plugin sees it: the SPEC's `[CODE] message`. */
function protocolError(code, message) {
  const e = new Error(`[${code}] ${message}`);
  e.name = 'ProtocolError';
  e.code = code;
  return e;
}

function setState(name, value) {
  document.body.dataset[name] = value;
}

function showMessage(text, kind = 'info') {
  const m = $('message');
  m.textContent = text;
  m.dataset.kind = kind;
  m.hidden = !text;
}

function overlay(text) {
  $('overlay-text').textContent = text || '';
  $('overlay').hidden = !text;
  setState('overlay', text ? 'shown' : 'hidden');
  if (text) setState('overlaySeen', 'true');
}

async function api(path, init = {}) {
  const headers = { Authorization: `Bearer ${page.token}`, ...(init.headers || {}) };
  if (init.body !== undefined) headers['Content-Type'] = 'application/json';
  const r = await fetch(path, { ...init, headers, cache: 'no-store' });
  let body = null;
  try { body = await r.json(); } catch { body = null; }
  return { status: r.status, body };
}

/** Reads the session as this token sees it; corrects the clock offset. */
async function readSession() {
  const t0 = Date.now();
  const r = await api(`/memizy/play/api/${encodeURIComponent(page.session)}`);
  const t1 = Date.now();
  if (r.status === 200 && typeof r.body?.serverTime === 'number') {
    const rtt = t1 - t0;
    if (rtt <= page.bestRtt) {
      page.bestRtt = rtt;
      page.skew = r.body.serverTime - (t0 + t1) / 2;
    }
  }
  return r;
}

function refuse(status, body) {
  page.stopped = true;
  setState('failure', String(status));
  if (status === 401) {
    showMessage('This link does not open this game: its token is wrong or has expired, or the host removed this player. Ask the host for a new link.', 'error');
  } else if (status === 404) {
    showMessage('There is no such game on this server (it ended long ago, or the link is incomplete).', 'error');
  } else if (status === 429) {
    showMessage('Too many wrong links from this network: wait a minute and try again.', 'error');
  } else {
    showMessage(`The server could not open this game: ${body?.error ?? status}`, 'error');
  }
}

/** Which instance this device is: its view and address. */
function whoAmI(info) {
  const hostPlayer = (info.players || []).find((p) => p.isHost);
  if (info.mode === 'solo') return { view: 'solo', address: info.player ?? hostPlayer?.id };
  if (info.role === 'host') {
    if (page.wantView === 'settings') return { view: 'settings', address: 'settings' };
    if (info.hostAs === 'player') return { view: 'controller', address: hostPlayer?.id };
    return { view: 'board', address: 'board' };
  }
  return { view: 'controller', address: info.player };
}

function renderRoster(players) {
  page.players = players || [];
  const ul = $('players');
  ul.replaceChildren();
  const me = page.info?.player;
  for (const p of page.players) {
    const li = document.createElement('li');
    li.dataset.player = p.id;
    li.dataset.connected = String(!!p.connected);
    li.textContent = p.name + (p.id === me ? ' (you)' : '') + (p.isHost ? ' (host)' : '');
    if (page.info?.role === 'host' && !p.isHost) {
      const b = document.createElement('button');
      b.textContent = 'Kick';
      b.dataset.kick = p.id;
      b.addEventListener('click', () => hostOp('DELETE', `/players/${encodeURIComponent(p.id)}`));
      li.append(b);
    }
    ul.append(li);
  }
  setState('players', String(page.players.length));
}

function renderResults(result) {
  if (!result) return;
  $('results').hidden = false;
  $('summary').textContent = result.summary ?? '';
  const ol = $('scores');
  ol.replaceChildren();
  const names = Object.fromEntries(page.players.map((p) => [p.id, p.name]));
  const scores = Object.entries(result.scores ?? {}).sort((a, b) => b[1] - a[1]);
  for (const [id, score] of scores) {
    const li = document.createElement('li');
    li.dataset.player = id;
    li.dataset.score = String(score);
    li.textContent = `${names[id] ?? id}: ${score}`;
    ol.append(li);
  }
  setState('results', 'shown');
}

function renderPhase(info) {
  const phase = info.phase ?? 'unknown';
  $('phase').textContent = phase;
  $('phase').dataset.phase = phase;
  setState('phase', phase);
  renderRoster(info.players);
  const lobby = phase === 'lobby';
  $('lobby').hidden = !lobby;
  if (lobby) {
    $('lobby-note').textContent = info.role === 'host'
      ? 'Players who joined are listed here. Start when everyone is in.'
      : 'You are in. Waiting for the host to start the game…';
  }
  $('controls').hidden = info.role !== 'host';
  const paused = info.clock?.pausedAt != null;
  $('btn-start').disabled = !lobby || info.settingsValid === false;
  $('btn-pause').disabled = lobby || paused || phase === 'finished';
  $('btn-resume').disabled = !paused;
  $('btn-end').disabled = phase === 'finished' || phase === 'closed';
  if (phase === 'finished') renderResults(info.result);
  if (phase === 'stopped') showMessage('The game stopped: the host was away too long. The host can continue it.', 'info');
  if (phase === 'closed') showMessage('The game is over.', 'info');
}

async function hostOp(method, path, body) {
  $('control-error').textContent = '';
  const r = await api(`/memizy/sessions/${encodeURIComponent(page.session)}${path}`, {
    method,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (r.status !== 200) $('control-error').textContent = r.body?.error ?? `HTTP ${r.status}`;
  await tick();
  return r;
}

function wireControls() {
  for (const b of document.querySelectorAll('#controls button[data-op]')) {
    b.addEventListener('click', () => hostOp('POST', `/${b.dataset.op}`));
  }
  $('add-player').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const name = ev.target.name.value.trim() || 'Player';
    const id = `p-${crypto.getRandomValues(new Uint32Array(1))[0].toString(16)}`;
    const r = await hostOp('POST', '/players', { id, name });
    if (r.status === 200 && r.body?.playerToken) {
      const link = `${location.origin}/memizy/play#session=${encodeURIComponent(page.session)}&token=${encodeURIComponent(r.body.playerToken)}`;
      const li = document.createElement('li');
      const a = document.createElement('a');
      a.href = link;
      a.target = '_blank';
      a.rel = 'noopener';
      a.textContent = `${name}: ${link}`;
      a.dataset.invite = id;
      li.append(a);
      $('invites').append(li);
      ev.target.name.value = '';
    }
  });
  $('join-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const f = ev.target;
    location.hash = `session=${encodeURIComponent(f.session.value.trim())}&token=${encodeURIComponent(f.token.value.trim())}`;
    location.reload();
  });
}

/** One plugin instance: its iframe, its Penpal connection, its socket. */
class Instance {
  constructor(info, view, address) {
    this.info = info;
    this.view = view;
    this.address = address;
    this.pending = new Map();
    this.nextId = 1;
    this.outbox = [];
    this.pluginQueue = [];
    this.pluginInFlight = 0;
    this.droppedPluginCalls = 0;
    this.remote = null;
    this.closed = false;
    this.goodbye = null;
  }

  start() {
    const iframe = document.createElement('iframe');
    // The sandbox and `allow` the server produced with the code `hostwire check` prints them with.
    iframe.setAttribute('sandbox', this.info.sandbox);
    if (this.info.allow) iframe.setAttribute('allow', this.info.allow);
    iframe.setAttribute('referrerpolicy', 'no-referrer');
    iframe.title = 'game';
    iframe.src = this.info.pluginDocument;
    $('stage').append(iframe);
    this.iframe = iframe;
    const methods = {};
    for (const m of HOST_METHODS) methods[m] = (...args) => this.hostCall(m, args);
    // The plugin's origin is `null` (no allow-same-origin): Penpal still
    // checks that messages come from this iframe's window.
    this.connection = connect({
      messenger: new WindowMessenger({ remoteWindow: iframe.contentWindow, allowedOrigins: ['*'] }),
      methods,
    });
    this.connection.promise.then((remote) => {
      this.remote = remote;
      this.flushPlugin();
    }).catch((e) => console.warn('plugin connection failed', e));

    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const q = new URLSearchParams({ session: page.session, view: this.view, address: this.address, token: page.token });
    this.ws = new WebSocket(`${proto}//${location.host}/memizy/session/ws?${q}`);
    this.ws.onopen = () => {
      $('link-state').dataset.state = 'online';
      $('link-state').textContent = 'online';
      setState('link', 'online');
      page.backoff = RECONNECT_MIN_MS;
      for (const text of this.outbox.splice(0)) this.ws.send(text);
    };
    this.ws.onmessage = (ev) => this.onFrame(ev.data);
    this.ws.onclose = (ev) => this.onClose(ev.code);
    // A page left for another (or kept in the back-forward cache) is not
    // this instance any more: the session must see it leave.
    this.onPageHide = () => {
      page.stopped = true;
      try { this.ws.close(1001, 'page left'); } catch { /* closed */ }
    };
    window.addEventListener('pagehide', this.onPageHide);
  }

  /** A Host API call of the plugin, forwarded as a worker RPC request. */
  hostCall(method, args) {
    if (this.closed) return Promise.reject(protocolError('SESSION_ENDED', 'this instance was closed'));
    if (this.pending.size >= MAX_PENDING_HOST_CALLS) {
      return Promise.reject(protocolError('RATE_LIMITED',
        `calls: at most ${MAX_PENDING_HOST_CALLS} unanswered calls per instance`));
    }
    const id = this.nextId++;
    let params;
    try {
      params = JSON.parse(JSON.stringify(args ?? []));
    } catch (e) {
      return Promise.reject(protocolError('INVALID_ARGUMENT', `params: not JSON (${e.message})`));
    }
    const text = JSON.stringify({ v: RPC, kind: 'request', id, method, params });
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(protocolError('INTERNAL_ERROR', `${method}: no answer from the server within ${HOST_CALL_TIMEOUT_MS} ms`));
      }, HOST_CALL_TIMEOUT_MS);
      this.pending.set(id, { method, resolve, reject, timer });
      if (this.ws.readyState === WebSocket.OPEN) this.ws.send(text);
      else this.outbox.push(text);
    });
  }

  onFrame(data) {
    let f;
    try { f = JSON.parse(data); } catch { return; }
    if (f.kind === 'response') {
      const p = this.pending.get(f.id);
      if (!p) return;
      this.pending.delete(f.id);
      clearTimeout(p.timer);
      if (f.ok) p.resolve(this.adjustResult(p.method, f.result));
      else p.reject(protocolError(f.error?.code ?? 'INTERNAL_ERROR', f.error?.message ?? 'failed'));
    } else if (f.kind === 'request') {
      this.ws.send(JSON.stringify({ v: RPC, kind: 'response', id: f.id, ok: true, result: null }));
      this.pluginCall(f.method, Array.isArray(f.params) ? f.params : []);
    } else if (f.kind === 'goodbye') {
      this.goodbye = f.reason ?? f.error?.code ?? 'closed';
      setState('goodbye', this.goodbye);
    }
  }

  /** What the server answers, as the plugin must see it on this device. */
  adjustResult(method, result) {
    if (method === 'hello' && result && result.clock) {
      result.clock = correctClock(result.clock);
      return result;
    }
    if (method === 'getAsset' && result && typeof result.base64 === 'string') {
      const bin = atob(result.base64);
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      return new Blob([bytes], { type: result.mimeType || 'application/octet-stream' });
    }
    return result ?? undefined;
  }

  /** A Plugin API call from the session, into the iframe (in order). */
  pluginCall(method, args) {
    if (method === 'clockChanged' && args[0]) args[0] = correctClock(args[0]);
    if (method === 'authorityChanged') {
      overlay(args[0]?.connected ? '' : 'Waiting for the host…');
    }
    if (method === 'playersChanged' && Array.isArray(args[0])) renderRoster(args[0]);
    if (method === 'sessionEnded') this.ended(args[0]);
    if (this.pluginQueue.length + this.pluginInFlight >= MAX_QUEUED_PLUGIN_CALLS) {
      this.droppedPluginCalls++;
      setState('droppedPluginCalls', String(this.droppedPluginCalls));
      return;
    }
    this.pluginQueue.push([method, args]);
    this.flushPlugin();
  }

  flushPlugin() {
    if (!this.remote) return;
    for (const [method, args] of this.pluginQueue.splice(0)) {
      const fn = this.remote[method];
      this.pluginInFlight++;
      Promise.resolve()
        .then(() => fn(...args))
        .catch((e) => console.warn(`plugin ${method} failed`, e))
        .finally(() => { this.pluginInFlight--; });
    }
  }

  ended(reason) {
    setState('ended', String(reason));
    if (reason === 'kicked') {
      page.stopped = true;
      showMessage('The host removed you from this game.', 'info');
    } else if (reason === 'finished') {
      page.stopped = true;
    }
  }

  onClose(code) {
    this.closed = true;
    $('link-state').dataset.state = 'offline';
    $('link-state').textContent = 'offline';
    setState('link', 'offline');
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(protocolError('INTERNAL_ERROR', 'the connection to the server was lost'));
    }
    this.pending.clear();
    if (page.instance === this) page.instance = null;
    const g = this.goodbye;
    if (code === 4001 || g === 'unauthorized') {
      this.teardown();
      refuse(401);
      return;
    }
    if (g === 'replaced') {
      this.teardown();
      page.stopped = true;
      showMessage('This game was opened again in another tab or device: this page is no longer in it.', 'info');
      return;
    }
    if (g === 'kicked') { this.teardown(); page.stopped = true; return; }
    if (g === 'hello-timeout') {
      this.teardown();
      page.stopped = true;
      showMessage('The game did not start on this device: the plugin did not connect within 10 seconds. Reload the page to try again.', 'error');
      return;
    }
    if (g === 'finished') { page.stopped = true; return; }
    // A dropped network or a refused attach: a new instance (a new iframe
    // and InitPayload, SPEC 6) once the session takes it.
    this.teardown();
    if (page.stopped) return;
    const wait = page.backoff;
    page.backoff = Math.min(page.backoff * 2, RECONNECT_MAX_MS);
    showMessage(g === 'attach refused' ? '' : 'Connection lost: reconnecting…', 'info');
    setTimeout(tick, wait);
  }

  teardown() {
    window.removeEventListener('pagehide', this.onPageHide);
    try { this.connection?.destroy(); } catch { /* already gone */ }
    this.iframe?.remove();
    this.remote = null;
    this.pluginQueue = [];
  }
}

/** A SessionClock as this device must read it: `Date.now() + offsetMs` is session time. */
function correctClock(clock) {
  if (typeof clock.offsetMs !== 'number') return clock;
  return { ...clock, offsetMs: clock.offsetMs + page.skew };
}

let ticking = false;
/** Reads the session and does what its phase asks: lobby, attach, results. */
async function tick() {
  if (ticking) return;
  ticking = true;
  try {
    let r;
    try {
      r = await readSession();
    } catch {
      $('link-state').dataset.state = 'offline';
      $('link-state').textContent = 'offline';
      return;
    }
    if (r.status !== 200) { refuse(r.status, r.body); return; }
    const info = r.body;
    page.info = info;
    const me = whoAmI(info);
    const name = info.role === 'host'
      ? (me.view === 'board' ? 'Board (host)' : me.view === 'settings' ? 'Settings (host)' : 'Host')
      : `Player ${(info.players || []).find((p) => p.id === info.player)?.name ?? info.player}`;
    $('who').textContent = name;
    setState('view', me.view);
    renderPhase(info);
    const live = ['loading', 'countdown', 'running', 'finished'].includes(info.phase)
      || (info.phase === 'lobby' && me.view === 'settings');
    if (live && !page.instance && !page.stopped && me.address) {
      if (info.phase !== 'lobby') $('lobby').hidden = true;
      showMessage('');
      page.instance = new Instance(info, me.view, me.address);
      page.instance.start();
    }
  } finally {
    ticking = false;
  }
}

function main() {
  wireControls();
  // Back from the back-forward cache: its instance was closed, start anew.
  window.addEventListener('pageshow', (ev) => { if (ev.persisted) location.reload(); });
  if (!page.session || !page.token) {
    $('join').hidden = false;
    return;
  }
  tick();
  let last = 0;
  setInterval(() => {
    // The host's page keeps the roster and phase fresh; a player's page
    // reads them seldom once its instance is there (the plugin API says
    // what changes in between).
    if (page.stopped && page.info?.role !== 'host') return;
    const every = page.info?.role === 'host' || !page.instance ? POLL_MS : POLL_LIVE_MS;
    if (Date.now() - last < every) return;
    last = Date.now();
    tick();
  }, POLL_MS);
}

main();
