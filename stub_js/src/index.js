/**
 * reTHINK protocol stub for the Matrix-backed Message Node.
 *
 * A plain ES module with no build step: it loads unbundled in browsers (native WebSocket) and in
 * Node.js (a global WebSocket, or the `ws` package imported lazily). The wire protocol it speaks is
 * docs/stub-protocol.md in the node's repository.
 *
 * The node also serves this file in the other forms reTHINK runtimes deploy (a classic script
 * defining a global `activate`, a System.register module): it wraps the text above the exports
 * block at the end, which therefore holds every export and nothing else (adapter/stub_files.py).
 */

const STUB_NAME = 'MatrixProtoStub';
const OPEN = 1; // WebSocket.OPEN in every implementation, usable before the constructor is loaded
const CLOSE_NORMAL = 1000;
const CLOSE_REPLACED = 4409;
const CLOSE_UNAUTHORIZED = 4401;
const ACK_VERSION = 1;
// Deliveries are acknowledged at most this often, or at once after this many.
const ACK_DELAY = 20;
const ACK_EVERY = 256;

const DEFAULT_RECONNECT = { initialDelay: 500, maxDelay: 30_000, maxAttempts: Infinity };
// A fresh credential is asked for this long before the current one's `exp` (at most half its
// remaining life), when `credentials` is a function.
const DEFAULT_REFRESH_BEFORE = 60_000;
const MAX_TIMER = 2 ** 31 - 1; // setTimeout's longest delay

// After a reload, messages for the hyperties the runtime had are held until it has deployed them
// again (see `Redeploys`): at most this long from the resumed session's start, and at most this
// many bytes; then they are handed on anyway.
const DEFAULT_HOLD = { deadline: 15_000, maxBytes: 4 * 1024 * 1024 };
// The hyperty addresses kept with the session, most recently used last.
const MAX_KNOWN = 64;
const MAX_ADDRESS = 1024;
// A message the runtime handed back (no listener yet) is offered again after this, doubling.
const RETRY_FIRST = 50;
const RETRY_MAX = 1000;
// Messages handed on for held addresses, remembered to recognise them when the runtime returns them.
const MAX_HANDED = 4096;
// Origins whose highest number is kept with the session, most recently advanced last: after a
// crash the node delivers again what its lanes held since their last checkpoint, under new
// delivery numbers, and a new stub instance recognises it by these (an origin that fell out, a
// sender quiet since the last MAX_ORIGINS others spoke, could reach a reloaded runtime twice).
const MAX_ORIGINS = 256;

let wsImport; // the `ws` package, imported at most once

// Where a stub keeps its runtime's session (token, delivery position) when the runtime gives it
// no store and there is no IndexedDB (Node.js): the process, so that a new stub instance for the
// same runtimeURL (a reloaded runtime) resumes the session.
const processSessions = new Map();
const processStore = {
  getItem: (key) => processSessions.get(key) ?? null,
  setItem: (key, value) => processSessions.set(key, String(value)),
};

class MatrixProtoStub {
  /**
   * Builds a stub and starts it. Without arguments it builds an idle instance that `_start`
   * starts: reTHINK's runtime-core (since it loads components with SystemJS) makes
   * `new result.default()` and its sandbox then calls `_start(url, bus, config, factory)`.
   * @param {string} runtimeProtoStubURL this stub's address, e.g. hyperty-runtime://example.com/protostub/1
   * @param {{postMessage(msg: object): void, addListener(type: string, cb: (msg: object) => void): void}} bus
   * @param {object} configuration see README.md
   */
  constructor(runtimeProtoStubURL, bus, configuration) {
    if (arguments.length > 0) this._start(runtimeProtoStubURL, bus, configuration);
  }

  /** Starts an idle instance; the runtime's fourth argument (its component factory) is not needed. */
  _start(runtimeProtoStubURL, bus, configuration) {
    if (this._bus) throw new Error('this stub is started already');
    const config = configuration ?? {};
    const nodeURL = config.messagingnode ?? config.url;
    const handshake = config.handshake ?? 'v1';
    if (!runtimeProtoStubURL) throw new TypeError('runtimeProtoStubURL is required');
    if (typeof bus?.postMessage !== 'function' || typeof bus?.addListener !== 'function') {
      throw new TypeError('bus must have postMessage() and addListener()');
    }
    if (!config.runtimeURL) throw new TypeError('configuration.runtimeURL is required');
    if (!nodeURL) throw new TypeError('configuration.messagingnode (or url) is required');
    if (handshake !== 'v1' && handshake !== 'v2') {
      throw new TypeError(`configuration.handshake must be 'v1' or 'v2', not ${JSON.stringify(handshake)}`);
    }

    this.runtimeProtoStubURL = runtimeProtoStubURL;
    this.runtimeURL = config.runtimeURL;
    this.nodeURL = nodeURL;
    this._bus = bus;
    this._handshake = handshake;
    this._hello = handshake === 'v2' && Boolean(config.hello);
    this._handshakeTimeout = config.handshakeTimeout ?? 10_000;
    this._reconnect = { ...DEFAULT_RECONNECT, ...config.reconnect };
    this._WebSocket = config.WebSocket;
    this._onError = config.onError ?? ((frame) => warn('the node reported an error', frame));
    // Offer the acknowledged protocol (numbered messages, resent until the node has them). By
    // default only with a handshake the node answers, which is where it says whether it agrees.
    this._offerAcks = config.acknowledged ?? (handshake === 'v1' || this._hello);
    this._stubId = randomId();
    // How the runtime proves who it is: {type: 'matrix' | 'oidc', token}, or a function
    // returning one (or a promise of one), asked again at every connection attempt and, before
    // an ID token's `exp`, for a fresh one sent on the open socket ({cmd: 'auth'}).
    this._credentials = config.credentials;
    this._refreshBefore = config.refreshBefore ?? DEFAULT_REFRESH_BEFORE;
    // `holdAfterReload: false` hands everything on at once, as before a runtime redeploys.
    this._holdOptions = config.holdAfterReload === false ? null : { ...DEFAULT_HOLD, ...config.holdAfterReload };
    // Hyperty addresses this runtime speaks from or registers, kept with its session so that the
    // instance after a reload knows which ones it will deploy again.
    this._known = new Set();
    this._hold = null; // a Redeploys while the addresses kept before a reload are being deployed again
    this._back = new Set(); // addresses this instance's runtime has shown it has (again)
    // Registry requests naming a hyperty (`<from>\n<id>` -> its address): their answer is a sign
    // that the runtime is deploying it.
    this._registrations = new Map();
    this._holdDone = false; // a stub instance holds for the first session it resumes only
    this._refreshTimer = null;

    this._status = undefined;
    this._conn = null; // the socket being set up or live, with its handshake state
    // The runtime's messages, numbered, as JSON text: until the node acknowledges them when it
    // speaks the acknowledged protocol, else until they are written to a live socket.
    this._queue = [];
    this._nextSeq = 1;
    this._received = 0; // highest delivery number of this session handed on (or skipped)
    this._acked = 0; // highest delivery number acknowledged to the node
    this._ackTimer = null;
    this._origins = new Map(); // origin -> highest number handed to the runtime from it
    // The same as of the delivery number acknowledged (`_acked`), which is what is kept with the
    // session: a held delivery is not acknowledged, so its number must not be kept either (the
    // node delivers it again to a reloaded runtime, which must take it).
    this._ackedOrigins = new Map();
    this._originLog = []; // [dseq, origin, oseq] handed on or held, above `_acked`, in order
    this._stats = { sent: 0, acknowledged: 0, delivered: 0, duplicates: 0, returned: 0 };
    this._token = null; // session token from the node, presented again when reconnecting
    // The session outlives this stub instance: kept where the runtime keeps its runtimeURL.
    this._memory = sessionMemory(config.sessionStore, nodeURL, config.runtimeURL);
    this._sessionEpoch = 0; // counts sessions, so that a late store answer about an old one is ignored
    this._recorded = 0; // highest delivery number the store holds (with the token) for this session
    // The store may answer later (IndexedDB): the first connection attempt waits for it.
    this._restored = this._memory.load().then((kept) => {
      if (!kept || this._sessionEpoch !== 0 || this._token !== null) return;
      this._token = kept.token;
      this._received = this._acked = this._recorded = kept.received;
      for (const address of kept.addresses ?? []) this._known.add(address);
      for (const [origin, oseq] of kept.origins ?? []) {
        this._origins.set(origin, oseq);
        this._ackedOrigins.set(origin, oseq);
      }
    });
    this._active = false; // a connection is wanted: set on demand, cleared by disconnect or giving up
    this._replaced = false; // closed with 4409: stay down until connect() is called explicitly
    this._failures = 0; // consecutive failed attempts; drives the back-off and maxAttempts
    this._retryTimer = null;
    this._generation = 0; // lets an attempt that is still awaiting the `ws` import notice it was cancelled
    this._waiters = []; // connect() callers
    this._disconnecting = null;

    this._postStatus('created');
    bus.addListener('*', (msg) => this._onRuntimeMessage(msg));
  }

  /** The last status posted: created, in-progress, live, disconnected or failed. */
  get status() {
    return this._status;
  }

  /**
   * Counters for tools: messages the runtime handed the stub, of those acknowledged by the node
   * (durable there), still waiting for an acknowledgement, messages handed to the runtime, and
   * duplicates dropped.
   */
  get stats() {
    return {
      ...this._stats,
      unacknowledged: this._queue.length,
      unrecorded: this._received - this._recorded,
      held: this._hold?.count ?? 0,
    };
  }

  /**
   * Connects now rather than on the first message. Never rejects: resolves with the status the
   * attempt ended in ('live', 'failed' or 'disconnected').
   */
  async connect() {
    if (this._disconnecting) await this._disconnecting;
    if (this._conn?.live) return 'live';
    this._replaced = false;
    const outcome = new Promise((resolve) => this._waiters.push(resolve));
    this._startConnecting();
    return outcome;
  }

  /**
   * Hands the stub a fresh credential ({type, token}, or a function returning one or a promise
   * of one, which then replaces `configuration.credentials`). On a live connection it is sent at
   * once ({cmd: 'auth'}): the node then vouches for the identity until the new token's `exp`.
   * Every later connection presents it. Never rejects: resolves with the node's answer
   * ({cmd: 'auth', response: 200, data: {expires}}, or response 401/403/503 with desc), or
   * with response null when there is no live connection to send it on (it goes with the next).
   */
  async setCredential(credential) {
    this._credentials = credential;
    const conn = this._conn;
    if (!conn?.live) return notSent('not connected: the credential goes with the next connection');
    let auth;
    try {
      auth = await this._credential();
    } catch (err) {
      return notSent(`no credentials: ${err.message}`);
    }
    return this._sendAuth(conn, auth);
  }

  /**
   * Tells the node to release this runtime's session, closes the socket and stops reconnecting.
   * Never rejects. A message the runtime sends afterwards opens a fresh session.
   */
  disconnect() {
    this._disconnecting ??= this._disconnect().finally(() => {
      this._disconnecting = null;
      if (this._queue.length) this._startConnecting(); // the runtime kept talking while we were closing
    });
    return this._disconnecting;
  }

  async _disconnect() {
    const wasUp = this._active;
    const conn = this._conn;
    // What it received is acknowledged before it leaves: the node answers the senders of what
    // it had sent and this stub never took (404), and must not for what it did take.
    if (conn?.live && conn.ws.readyState === OPEN) this._sendAck(conn);
    // What is still held was never acknowledged: the node answers its senders (404).
    this._endHold(false);
    this._halt();
    this._replaced = false;
    // The session is released, but its token still proves this runtime's credential: while
    // anything is registered under the runtimeURL, the node gives it only to that credential.
    this._resetSession();
    const kept = this._remember();
    if (conn?.live && conn.ws.readyState === OPEN) {
      // The socket gives the frame to the node before its close; nothing to wait for, and a
      // page cycling through many runtimes must not hold their sockets open meanwhile.
      conn.closing = () => {};
      this._sendControl(conn, { cmd: 'disconnect', data: { runtimeURL: this.runtimeURL } });
    }
    if (conn) this._abandon(conn);
    if (wasUp) this._postStatus('disconnected', 'disconnected by the runtime');
    this._settleWaiters('disconnected');
    // A runtime that starts a new stub instance once this resolves finds the token, with nothing
    // received in the session it starts.
    await kept;
  }

  _onRuntimeMessage(msg) {
    if (msg === null || typeof msg !== 'object') return;
    // It came from the node through this stub; sending it back would make a loop. reTHINK's
    // runtimes route a message here when they have no listener for its address (a hyperty not
    // deployed again yet after a reload): held again then, and offered again shortly.
    if (hasVia(msg, this.runtimeProtoStubURL)) {
      this._stats.returned += 1;
      this._hold?.takeBack(msg);
      return;
    }
    this._learn(msg);
    if (this._replaced && !this._disconnecting) {
      warn("dropping a message: this runtime's session moved to a newer connection");
      return;
    }
    let text;
    try {
      text = JSON.stringify(msg);
    } catch (err) {
      warn(`dropping a message that cannot be serialised: ${err.message}`);
      return;
    }
    this._queue.push({ seq: this._nextSeq++, text });
    this._stats.sent += 1;
    if (this._disconnecting) return; // goes out on a fresh session once the old one is released
    const conn = this._conn;
    if (conn?.live) this._flush(conn);
    else this._startConnecting();
  }

  /** Sends what the connection has not carried yet, in order; stops at a socket that closed. */
  _flush(conn) {
    const queue = this._queue;
    while (conn.sent < queue.length) {
      const entry = queue[conn.sent];
      const frame = conn.acks ? `[${entry.seq},${entry.text}]` : entry.text;
      if (!this._write(conn, frame)) return;
      conn.sent += 1;
    }
    // A node that does not acknowledge has them once its socket took them.
    if (!conn.acks) {
      queue.splice(0, conn.sent);
      conn.sent = 0;
    }
  }

  _onAck(conn, seq) {
    if (!Number.isSafeInteger(seq)) return;
    let done = 0;
    while (done < this._queue.length && this._queue[done].seq <= seq) done += 1;
    if (!done) return;
    this._queue.splice(0, done);
    conn.sent = Math.max(0, conn.sent - done);
    this._stats.acknowledged += done;
  }

  /**
   * Notes the hyperty addresses the runtime speaks from and registers with the domain registry
   * (kept with the session), and what shows that one it had before a reload is back.
   */
  _learn(msg) {
    const type = typeof msg.type === 'string' ? msg.type.toLowerCase() : '';
    let learnt = false;
    if (isHypertyAddress(msg.from)) {
      learnt = this._know(msg.from);
      this._isBack(msg.from);
    }
    if (typeof msg.to === 'string' && msg.to.startsWith('domain://registry.')) {
      const named = type === 'create' ? msg.body?.value?.url : msg.body?.resource;
      if (isHypertyAddress(named)) {
        if (type === 'delete') {
          learnt = this._known.delete(named) || learnt;
          this._isBack(named); // gone for good: nothing to wait for
        } else if (type === 'create' || type === 'update') {
          learnt = this._know(named) || learnt;
          // runtime-core deploys the hyperty and adds its listener once the registry answered.
          if (msg.id != null && typeof msg.from === 'string') {
            this._registrations.set(`${msg.from}\n${msg.id}`, named);
            if (this._registrations.size > MAX_KNOWN) this._registrations.delete(this._registrations.keys().next().value);
          }
        }
      }
    }
    if (learnt && this._token) this._remember();
  }

  _isBack(address) {
    this._back.add(address);
    if (this._back.size > MAX_KNOWN) this._back.delete(this._back.values().next().value);
    this._hold?.ready(address);
  }

  /** True when the address is new to the kept list. */
  _know(address) {
    const fresh = !this._known.has(address);
    this._known.delete(address);
    this._known.add(address);
    if (this._known.size > MAX_KNOWN) this._known.delete(this._known.values().next().value);
    return fresh;
  }

  /** The highest delivery number below everything held: what may be acknowledged (never less than before). */
  _ackable() {
    const held = this._hold?.lowest();
    return held == null ? this._received : Math.max(this._acked, Math.min(this._received, held - 1));
  }

  _startHold() {
    this._holdDone = true;
    const addresses = [...this._known];
    if (!this._holdOptions || !addresses.length) return;
    this._hold = new Redeploys(addresses, this._back, this._holdOptions, {
      // Handed on again after the runtime handed it back: counted once in `delivered`.
      hand: (msg, again) => (again ? this._deliver(msg) : this._handOn(msg)),
      released: () => {
        if (this._conn?.live && this._conn.acks) this._ackLater(this._conn);
      },
      expired: () => this._endHold(true),
    });
  }

  /** Ends the hold: what it still has is handed on in order (`deliver`) or left to the node. */
  _endHold(deliver) {
    const hold = this._hold;
    if (!hold) return;
    this._hold = null;
    hold.close(deliver);
    if (deliver && this._conn?.live && this._conn.acks) this._ackLater(this._conn);
  }

  /** A new session numbers its deliveries from the start again; its messages too. */
  _resetSession() {
    // What is held belongs to the session that ended; the runtime is deploying again, so it gets it.
    this._endHold(true);
    this._sessionEpoch += 1;
    // Every origin's number goes on being kept: an origin never numbers two messages alike, and
    // what the ended session had and held (handed on just above, or answered 404 to its senders
    // by the node after a `disconnect`) is not delivered again.
    this._foldOrigins(Infinity);
    this._received = 0;
    this._acked = 0;
    this._recorded = 0;
    clearTimeout(this._ackTimer);
    this._ackTimer = null;
  }

  _startConnecting() {
    if (this._active) return;
    this._active = true;
    this._failures = 0;
    this._attempt();
  }

  _attempt() {
    this._retryTimer = null;
    this._open().catch((err) => warn('unexpected error while connecting', err));
  }

  async _open() {
    const generation = ++this._generation;
    this._postStatus('in-progress');
    await this._restored;
    if (generation !== this._generation || !this._active) return;
    let WebSocketImpl;
    try {
      WebSocketImpl = await this._webSocketClass();
    } catch (err) {
      if (generation === this._generation) this._stop('failed', `no WebSocket implementation: ${err.message}`);
      return;
    }
    if (generation !== this._generation || !this._active) return;

    let auth;
    try {
      auth = await this._credential();
    } catch (err) {
      if (generation === this._generation) this._stop('failed', `no credentials: ${err.message}`);
      return;
    }
    if (generation !== this._generation || !this._active) return;

    const conn = {
      ws: null,
      token: this._token,
      auth,
      opened: false,
      live: false,
      acks: false, // both sides speak the acknowledged protocol on this connection
      sent: 0, // queued messages this connection has carried
      error: null,
      timer: null,
      closing: null,
      authWaiters: [], // callers waiting for the node's answers to {cmd: 'auth'}, in order
    };
    try {
      conn.ws = new WebSocketImpl(this._endpoint(conn.token, conn.auth));
    } catch (err) {
      this._stop('failed', `cannot open ${this.nodeURL}: ${err.message}`);
      return;
    }
    this._conn = conn;
    conn.timer = setTimeout(() => {
      if (conn !== this._conn) return;
      this._abandon(conn);
      this._attemptFailed(`no handshake within ${this._handshakeTimeout} ms`);
    }, this._handshakeTimeout);
    conn.ws.onopen = () => this._onOpen(conn);
    conn.ws.onmessage = (event) => {
      if (conn === this._conn) this._onFrame(conn, event.data);
    };
    conn.ws.onerror = (event) => {
      conn.error = event;
    };
    conn.ws.onclose = (event) => this._onClose(conn, event);
  }

  /** The credential to present now: the configured one, or what the function gives. */
  async _credential() {
    return typeof this._credentials === 'function' ? await this._credentials() : this._credentials;
  }

  /** Sends a fresh credential on the live connection; resolves with the node's answer. */
  async _sendAuth(conn, auth) {
    if (!auth?.type || !auth?.token) return notSent('no credential to present');
    if (conn !== this._conn || !conn.live) return notSent('the connection closed: the credential goes with the next one');
    const answered = new Promise((resolve) => conn.authWaiters.push(resolve));
    if (!this._write(conn, JSON.stringify({ cmd: 'auth', data: { type: auth.type, token: auth.token } }))) {
      conn.authWaiters.pop();
      return notSent('the connection closed: the credential goes with the next one');
    }
    const answer = await answered;
    if (answer.response === 200) {
      const previous = tokenExpiry(conn.auth?.token);
      conn.auth = auth;
      this._scheduleRefresh(conn, answer.data?.expires, previous);
    }
    return answer;
  }

  /**
   * When the credentials are a function, asks it for a fresh one before the current token's
   * `exp` (as the node said, or as the token says) and sends it on the open socket.
   */
  _scheduleRefresh(conn, expires, previous) {
    clearTimeout(this._refreshTimer);
    this._refreshTimer = null;
    if (typeof this._credentials !== 'function') return;
    const exp = Number.isFinite(expires) ? expires : tokenExpiry(conn.auth?.token);
    if (!Number.isFinite(exp)) return; // no known end
    if (Number.isFinite(previous) && exp <= previous) {
      // The function gave no fresher token: asking again would only loop.
      warn('the credentials function gave no fresher token; the node stops vouching at its exp');
      return;
    }
    const dueAt = exp * 1000 - Math.min(this._refreshBefore, Math.max(0, exp * 1000 - Date.now()) / 2);
    const wait = () => {
      const delay = dueAt - Date.now();
      if (delay > 0) {
        this._refreshTimer = setTimeout(wait, Math.min(delay, MAX_TIMER));
        return;
      }
      this._refreshTimer = null;
      this._refresh(conn, exp).catch((err) => warn('unexpected error while refreshing the credential', err));
    };
    wait();
  }

  async _refresh(conn, exp) {
    if (conn !== this._conn || !conn.live) return;
    let auth;
    try {
      auth = await this._credential();
    } catch (err) {
      warn(`no fresh credential: ${err.message}`);
      return;
    }
    const fresh = tokenExpiry(auth?.token);
    if (Number.isFinite(fresh) && fresh <= exp) {
      warn('the credentials function gave no fresher token; the node stops vouching at its exp');
      return;
    }
    const answer = await this._sendAuth(conn, auth);
    if (answer.response !== 200 && answer.response !== null) this._onError(answer);
  }

  _settleAuth(conn, desc) {
    const waiters = conn.authWaiters;
    conn.authWaiters = [];
    for (const resolve of waiters) resolve(notSent(desc));
  }

  async _webSocketClass() {
    if (this._WebSocket) return this._WebSocket;
    if (typeof globalThis.WebSocket === 'function') return globalThis.WebSocket;
    // Node.js without a global WebSocket (before v22). Imported dynamically so that browsers,
    // which have nothing called `ws` to resolve, can load this module as it is.
    wsImport ??= import('ws').catch((err) => {
      wsImport = undefined;
      throw err;
    });
    const ws = await wsImport;
    return ws.WebSocket ?? ws.default;
  }

  _endpoint(token, auth) {
    if (this._handshake === 'v1') return this.nodeURL;
    let query = `runtimeURL=${encodeURIComponent(this.runtimeURL)}`;
    if (token) query += `&token=${encodeURIComponent(token)}`;
    if (auth) query += `&auth_type=${encodeURIComponent(auth.type)}&auth_token=${encodeURIComponent(auth.token)}`;
    if (this._hello) query += '&hello=1';
    if (this._offerAcks) query += `&ack=1&stub=${this._stubId}&received=${this._ackable()}`;
    return `${this.nodeURL}${this.nodeURL.includes('?') ? '&' : '?'}${query}`;
  }

  _onOpen(conn) {
    if (conn !== this._conn) return;
    conn.opened = true;
    if (this._handshake === 'v1') this._sendConnect(conn);
    else if (!this._hello && !this._offerAcks) this._goLive(conn);
    // Otherwise the node's connect answer completes the handshake.
  }

  _sendConnect(conn) {
    const data = { runtimeURL: this.runtimeURL };
    if (conn.token) data.token = conn.token;
    if (conn.auth) data.auth = { type: conn.auth.type, token: conn.auth.token };
    // Held messages are not acknowledged: the node keeps them until the runtime has them.
    if (this._offerAcks) data.ack = { v: ACK_VERSION, stub: this._stubId, received: this._ackable() };
    this._sendControl(conn, { cmd: 'connect', data });
  }

  _onFrame(conn, data) {
    if (typeof data !== 'string') return warn('ignoring a binary frame');
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      return warn('ignoring a frame that is not JSON');
    }
    if (Array.isArray(frame) && conn.acks) return this._onNumbered(conn, frame, data.length);
    if (frame === null || typeof frame !== 'object' || Array.isArray(frame)) {
      return warn('ignoring a frame that is not a JSON object');
    }
    if (isControlFrame(frame)) return this._onControl(conn, frame);
    this._take(frame, null, data.length);
  }

  /** `[dseq, origin, oseq, message]`: handed on unless the runtime already has it. */
  _onNumbered(conn, [dseq, origin, oseq, msg], size) {
    if (!Number.isSafeInteger(dseq) || msg === null || typeof msg !== 'object') {
      return warn('ignoring a malformed numbered frame');
    }
    let fresh = dseq > this._received;
    if (fresh) this._received = dseq;
    if (fresh && origin !== null) {
      // A message carried twice (the node sent it again after a crash) keeps its origin's number.
      if (oseq <= (this._origins.get(origin) ?? 0)) fresh = false;
      else {
        this._origins.set(origin, oseq);
        this._originLog.push([dseq, origin, oseq]);
      }
    }
    if (fresh) this._take(msg, dseq, size);
    else this._stats.duplicates += 1;
    this._ackLater(conn);
  }

  /** A message from the node for the runtime: handed on, or held while its hyperty is redeployed. */
  _take(msg, dseq, size) {
    if (this._hold?.offer(msg, dseq, size)) return;
    this._handOn(msg);
    if (this._registrations.size && typeof msg.type === 'string' && msg.type.toLowerCase() === 'response') {
      const key = `${msg.to}\n${msg.id}`;
      const address = this._registrations.get(key);
      if (address !== undefined) {
        this._registrations.delete(key);
        this._isBack(address);
      }
    }
  }

  _handOn(msg) {
    this._stats.delivered += 1;
    this._deliver(stampVia(msg, this.runtimeProtoStubURL));
  }

  _ackLater(conn) {
    if (this._ackable() - this._acked >= ACK_EVERY) return this._sendAck(conn);
    this._ackTimer ??= setTimeout(() => {
      this._ackTimer = null;
      if (conn === this._conn) this._sendAck(conn);
    }, ACK_DELAY);
  }

  _sendAck(conn) {
    const received = this._ackable();
    if (received <= this._acked) return;
    if (this._write(conn, JSON.stringify({ cmd: 'ack', received }))) {
      this._acked = received;
      this._foldOrigins(received);
      this._remember();
    }
  }

  /** The origins' numbers of what is acknowledged up to `through` join what is kept. */
  _foldOrigins(through) {
    const log = this._originLog;
    let i = 0;
    for (; i < log.length && log[i][0] <= through; i += 1) {
      const [, origin, oseq] = log[i];
      this._ackedOrigins.delete(origin);
      this._ackedOrigins.set(origin, oseq);
    }
    if (i) log.splice(0, i);
    while (this._ackedOrigins.size > MAX_ORIGINS) this._ackedOrigins.delete(this._ackedOrigins.keys().next().value);
  }

  _remember() {
    if (!this._token) return Promise.resolve();
    const epoch = this._sessionEpoch;
    const received = this._acked;
    const kept = { token: this._token, received };
    if (this._known.size) kept.addresses = [...this._known];
    if (this._ackedOrigins.size) kept.origins = [...this._ackedOrigins];
    return this._memory.save(kept).then((saved) => {
      if (saved && epoch === this._sessionEpoch) this._recorded = Math.max(this._recorded, received);
    });
  }

  _onControl(conn, frame) {
    if (frame.cmd === 'connect') {
      if (conn.live) return; // a repeated answer changes nothing
      if (frame.response === 200) return this._goLive(conn, frame.data);
      if (frame.response === 401 && conn.token) {
        // A stale token: the node resumes by runtimeURL alone, so ask once more without one.
        this._token = conn.token = null;
        return this._sendConnect(conn);
      }
      this._abandon(conn);
      if (frame.response === 503) {
        // Passing (the node's identity provider away, or the session held by another process
        // of the domain): the next attempt may succeed.
        return this._attemptFailed(`handshake refused for now: ${describeAnswer(frame)}`);
      }
      return this._stop('failed', `handshake refused: ${describeAnswer(frame)}`);
    }
    if (frame.cmd === 'disconnect') return conn.closing?.();
    if (frame.cmd === 'auth') {
      const resolve = conn.authWaiters.shift();
      if (resolve) return resolve(frame);
    }
    if (frame.cmd === 'ack' && conn.acks) return this._onAck(conn, frame.seq);
    this._onError(frame); // cmd:'error', or the answer to a command the node does not know
  }

  _goLive(conn, answer) {
    conn.live = true;
    clearTimeout(conn.timer);
    this._failures = 0;
    if (answer?.token) this._token = answer.token;
    conn.acks = this._offerAcks && answer?.ack?.v === ACK_VERSION;
    if (answer?.session === 'new') this._resetSession();
    // The first session this instance resumes is a reloaded runtime's, which deploys its
    // hyperties again: hold what comes for them meanwhile.
    if (answer?.session === 'resumed' && !this._holdDone) this._startHold();
    this._holdDone = true;
    this._remember();
    if (conn.acks) this._onAck(conn, answer.ack.seq);
    // Everything not acknowledged goes (again) on this connection, in order.
    conn.sent = 0;
    this._flush(conn);
    this._scheduleRefresh(conn);
    this._postStatus('live', answer?.session ? `session ${answer.session}` : undefined);
    this._settleWaiters('live');
  }

  _onClose(conn, event) {
    clearTimeout(conn.timer);
    this._settleAuth(conn, 'the connection closed: the credential goes with the next one');
    if (conn.closing) return conn.closing(); // disconnect() is waiting for exactly this
    if (conn !== this._conn) return;
    this._conn = null;
    clearTimeout(this._refreshTimer);
    this._refreshTimer = null;
    const how = describeClose(event);
    if (conn.live) return this._onLost(event.code, how);
    if (event.code === CLOSE_UNAUTHORIZED) {
      return this._stop('failed', `the node refused this runtime's session (${how})`);
    }

    const httpStatus = refusedWith(conn.error);
    if (!conn.opened && this._handshake === 'v2' && conn.token) {
      // Browsers hide the status of a refused upgrade, so an unexplained failure may be a 401 too;
      // dropping the token costs nothing but the check it allows, since the node resumes without it.
      if (httpStatus === 401 || !conn.error?.message) this._token = null;
      if (httpStatus === 401) return this._attempt();
    }
    if (httpStatus >= 400 && httpStatus < 500 && httpStatus !== 408 && httpStatus !== 429) {
      return this._stop('failed', `handshake refused: HTTP ${httpStatus}`);
    }
    this._attemptFailed(`could not connect to ${this.nodeURL} (${how})`);
  }

  _onLost(code, how) {
    if (code === CLOSE_REPLACED) {
      // Reconnecting would take the session back from the newer connection, and the two would
      // alternate forever.
      this._replaced = true;
      return this._stop('disconnected', `replaced by a newer connection for this runtime (${how})`);
    }
    if (code === CLOSE_UNAUTHORIZED) {
      return this._stop('failed', `the node refused this runtime's session (${how})`);
    }
    if (code === CLOSE_NORMAL) {
      // The node closes normally only once it has released the session; the token is kept as
      // the credential of the runtimeURL (see _disconnect).
      this._resetSession();
      this._remember();
      return this._stop('disconnected', `closed by the node (${how})`);
    }
    this._postStatus('disconnected', `connection lost (${how}); reconnecting`);
    this._scheduleRetry();
  }

  _attemptFailed(reason) {
    this._failures += 1;
    const limit = this._reconnect.maxAttempts; // 0, null or Infinity: no limit (JSON has no Infinity)
    if (limit > 0 && this._failures >= limit) {
      return this._stop('failed', `${reason}; gave up after ${this._failures} attempt(s)`);
    }
    this._scheduleRetry();
  }

  _scheduleRetry() {
    const { initialDelay, maxDelay } = this._reconnect;
    const ceiling = Math.min(maxDelay, initialDelay * 2 ** Math.max(0, this._failures - 1));
    // Jitter spreads out the runtimes that all lost the same node at the same moment.
    const delay = ceiling / 2 + (Math.random() * ceiling) / 2;
    this._retryTimer = setTimeout(() => this._attempt(), delay);
  }

  /** Ends the connection cycle for good (until the next message or connect()) and says why. */
  _stop(status, reason) {
    if (this._conn) this._abandon(this._conn);
    if (this._queue.length) warn(`dropping ${this._queue.length} unsent message(s): ${reason}`);
    this._halt();
    this._postStatus(status, reason);
    this._settleWaiters(status);
  }

  _halt() {
    this._active = false;
    this._generation += 1;
    clearTimeout(this._retryTimer);
    this._retryTimer = null;
    clearTimeout(this._refreshTimer);
    this._refreshTimer = null;
    this._queue = [];
    clearTimeout(this._ackTimer);
    this._ackTimer = null;
  }

  _abandon(conn) {
    clearTimeout(conn.timer);
    this._settleAuth(conn, 'the connection closed: the credential goes with the next one');
    if (this._conn === conn) {
      this._conn = null;
      clearTimeout(this._refreshTimer);
      this._refreshTimer = null;
    }
    try {
      conn.ws.close(CLOSE_NORMAL);
    } catch {
      // already closing; nothing left to release
    }
  }

  /** False when the socket can no longer take the frame, so the caller keeps it queued. */
  _write(conn, text) {
    if (conn.ws.readyState !== OPEN) return false;
    try {
      conn.ws.send(text);
      return true;
    } catch {
      return false;
    }
  }

  _sendControl(conn, frame) {
    try {
      conn.ws.send(JSON.stringify(frame));
    } catch {
      // the close handler deals with a dead socket
    }
  }

  _postStatus(value, desc) {
    this._status = value;
    const body = desc === undefined ? { value } : { value, desc };
    this._deliver({ type: 'update', from: this.runtimeProtoStubURL, to: `${this.runtimeProtoStubURL}/status`, body });
  }

  _deliver(msg) {
    try {
      this._bus.postMessage(msg);
    } catch (err) {
      warn('the runtime bus threw while taking a message', err);
    }
  }

  _settleWaiters(status) {
    const waiters = this._waiters;
    this._waiters = [];
    for (const resolve of waiters) resolve(status);
  }
}

/**
 * Messages for the hyperties of a reloaded runtime while it deploys them again.
 *
 * A reTHINK runtime that reloads keeps its runtimeURL and its hyperties' addresses, and deploys
 * the hyperties again, each at its old address; until one is deployed, the runtime's message bus
 * has no listener for its address. runtime-core's MessageBus then routes a message for it to its
 * default route, the domain's stub (Registry.resolve), i.e. back here with this stub's `via`
 * mark, where it would be dropped as a loop: the messages routed to the runtime while it was away,
 * which the resumed session delivers at once, would be lost.
 *
 * So the first session a new stub instance resumes holds what comes for the addresses kept with
 * the session (hyperties the runtime spoke from or registered before the reload) until the
 * runtime shows that the address is back: it speaks from it, or the domain registry answers its
 * registration of it (runtime-core adds the listener right after that answer, once the hyperty is
 * deployed). A message handed on meanwhile that the runtime hands back (still no listener) is held
 * again and offered again a little later (50 ms, doubling up to 1 s), in its place. Everything for
 * an address goes to the runtime in the order it came, each message once: nothing for it passes
 * while something before it is held. Nothing is held past `deadline` ms from the session's
 * start, nor beyond `maxBytes`: then it is handed on anyway. Addresses the runtime never had
 * before the reload are never held.
 */
class Redeploys {
  constructor(addresses, back, { deadline, maxBytes }, { hand, released, expired }) {
    this._entries = new Map();
    for (const address of addresses) {
      this._entries.set(address, { waiting: !back.has(address), queue: [], delay: RETRY_FIRST, timer: null });
    }
    this._maxBytes = maxBytes;
    this._bytes = 0;
    this._count = 0;
    this._order = 0; // arrival order of what is offered
    this._handed = new Map(); // messages handed on for these addresses, to recognise them coming back
    this._hand = hand;
    this._released = released;
    this._timer = setTimeout(expired, Math.min(deadline, MAX_TIMER));
    this._timer.unref?.(); // a Node.js runtime may exit meanwhile
  }

  /** How many messages are held. */
  get count() {
    return this._count;
  }

  /** The lowest delivery number held that was never handed on (so never acknowledged), or undefined. */
  lowest() {
    let lowest;
    for (const entry of this._entries.values()) {
      for (const item of entry.queue) {
        if (item.dseq != null && !item.again && !(item.dseq >= lowest)) lowest = item.dseq;
      }
    }
    return lowest;
  }

  /** True when the message is held: its address is not back yet, or something before it is held. */
  offer(msg, dseq, size) {
    const entry = this._entryFor(msg.to);
    if (!entry) return false;
    const item = { entry, msg, dseq, size, order: this._order++ };
    if (entry.waiting || entry.queue.length) {
      this._enqueue(item);
      return true;
    }
    this._remember(item);
    return false;
  }

  /** The runtime has shown that the address is back: what is held for it goes now. */
  ready(address) {
    const entry = this._entries.get(address);
    if (entry && (entry.waiting || entry.timer)) this._release(entry);
  }

  /** A message the runtime handed back: true when it is one of ours, now held again. */
  takeBack(msg) {
    const key = returnKey(msg);
    const item = key && this._handed.get(key);
    if (!item) return false;
    this._handed.delete(key);
    const { entry } = item;
    item.msg = msg;
    item.again = true;
    this._enqueue(item);
    if (!entry.waiting && !entry.timer && entry.queue.length) {
      entry.timer = setTimeout(() => {
        entry.timer = null;
        this._release(entry);
      }, entry.delay);
      entry.delay = Math.min(entry.delay * 2, RETRY_MAX);
    }
    return true;
  }

  /** Stops holding: what is held is handed on in order (`deliver`) or let go. */
  close(deliver) {
    clearTimeout(this._timer);
    const items = [];
    for (const entry of this._entries.values()) {
      clearTimeout(entry.timer);
      entry.timer = null;
      items.push(...entry.queue);
      entry.queue = [];
    }
    this._handed.clear();
    this._bytes = this._count = 0;
    if (deliver) for (const item of items.sort((a, b) => a.order - b.order)) this._hand(item.msg, item.again);
  }

  _entryFor(to) {
    if (typeof to !== 'string') return undefined;
    const exact = this._entries.get(to);
    if (exact) return exact;
    // A hyperty's own sub-addresses (`<hyperty>/...`) wait with it.
    for (const [address, entry] of this._entries) if (to.startsWith(`${address}/`)) return entry;
    return undefined;
  }

  _enqueue(item) {
    const { queue } = item.entry;
    let at = queue.length;
    while (at > 0 && queue[at - 1].order > item.order) at -= 1;
    queue.splice(at, 0, item);
    this._bytes += item.size;
    this._count += 1;
    if (this._bytes > this._maxBytes) this._release(item.entry);
  }

  _release(entry) {
    clearTimeout(entry.timer);
    entry.timer = null;
    entry.waiting = false;
    const queue = entry.queue;
    entry.queue = [];
    for (const item of queue) {
      this._bytes -= item.size;
      this._count -= 1;
    }
    for (const item of queue) {
      this._remember(item);
      this._hand(item.msg, item.again);
    }
    if (queue.length) this._released();
  }

  _remember(item) {
    const key = returnKey(item.msg);
    if (!key) return;
    this._handed.set(key, item);
    if (this._handed.size > MAX_HANDED) this._handed.delete(this._handed.keys().next().value);
  }
}

/** What identifies a message the runtime hands back: it keeps from, to and id. */
function returnKey(msg) {
  if (msg.id == null || typeof msg.from !== 'string' || typeof msg.to !== 'string') return undefined;
  return `${msg.from}\n${msg.to}\n${msg.id}`;
}

/** The reTHINK runtime's entry point for loading a protocol stub. */
function activate(url, bus, config) {
  return { name: STUB_NAME, instance: new MatrixProtoStub(url, bus, config) };
}

/**
 * The runtime's session as kept between stub instances: `store` is a Web Storage-like object
 * (getItem, setItem) whose methods may also return promises; by default IndexedDB
 * where there is one (browser pages and Workers), else this module (shared by the stubs of one
 * process); `null` keeps nothing. Every method returns a promise that never rejects: `load` of
 * the kept session or null, `save` of whether it was stored. The operations reach the store one
 * after another, in the order they were asked for.
 */
function sessionMemory(store, nodeURL, runtimeURL) {
  if (store === undefined) store = indexedDBStore() ?? processStore;
  if (!store) return { load: async () => null, save: async () => false };
  const key = `rethink-mn:session:${nodeURL}:${runtimeURL}`;
  let last = Promise.resolve();
  let warned = false;
  const inTurn = (operation, failed) => {
    last = last.then(operation).catch((err) => {
      // Once per stub: a store that fails (a private window, a full disk) fails on every ack.
      if (!warned) warn('the session store failed; the session is kept in this stub only', err);
      warned = true;
      return failed;
    });
    return last;
  };
  return {
    load: () =>
      inTurn(async () => {
        const kept = JSON.parse((await store.getItem(key)) ?? 'null');
        const ok = typeof kept?.token === 'string' && Number.isSafeInteger(kept?.received);
        if (!ok || kept.received < 0) return null;
        const addresses = Array.isArray(kept.addresses) ? kept.addresses.filter(isHypertyAddress) : [];
        const origins = Array.isArray(kept.origins) ? kept.origins.filter(isOriginMark) : [];
        return {
          token: kept.token,
          received: kept.received,
          addresses: addresses.slice(-MAX_KNOWN),
          origins: origins.slice(-MAX_ORIGINS),
        };
      }, null),
    save: (kept) =>
      inTurn(async () => {
        await store.setItem(key, JSON.stringify(kept));
        return true;
      }, false),
  };
}

const IDB_NAME = 'rethink-mn-protostub';
const IDB_STORE = 'sessions';

/**
 * A store on IndexedDB, which browsers offer to pages and to Workers alike (a Worker has no
 * localStorage, and reTHINK's browser runtime runs stubs in one), or null where there is none.
 */
function indexedDBStore() {
  let idb;
  try {
    idb = globalThis.indexedDB; // an opaque-origin page may refuse even to say
  } catch {
    return null;
  }
  if (!idb) return null;
  let opened;
  const database = () => {
    opened ??= new Promise((resolve, reject) => {
      const request = idb.open(IDB_NAME, 1);
      request.onupgradeneeded = () => request.result.createObjectStore(IDB_STORE);
      request.onsuccess = () => {
        const db = request.result;
        // Another context upgrading or deleting the database must not wait for this one; the
        // next operation opens it again.
        db.onversionchange = () => {
          db.close();
          opened = undefined;
        };
        db.onclose = () => (opened = undefined); // closed by the browser (storage cleared)
        resolve(db);
      };
      request.onerror = () => reject(request.error);
    }).catch((err) => {
      opened = undefined; // the next operation tries again
      throw err;
    });
    return opened;
  };
  const run = async (mode, operation) => {
    const db = await database();
    return new Promise((resolve, reject) => {
      const tx = db.transaction(IDB_STORE, mode);
      const request = operation(tx.objectStore(IDB_STORE));
      // Resolved once the transaction committed: a reload after that finds what it wrote.
      tx.oncomplete = () => resolve(request.result);
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error ?? new Error('IndexedDB transaction aborted'));
    });
  };
  return {
    getItem: async (key) => (await run('readonly', (s) => s.get(key))) ?? null,
    setItem: (key, value) => run('readwrite', (s) => s.put(String(value), key)),
  };
}

function isHypertyAddress(value) {
  return typeof value === 'string' && value.length <= MAX_ADDRESS && value.startsWith('hyperty://');
}

function isOriginMark(value) {
  return (
    Array.isArray(value) &&
    value.length === 2 &&
    typeof value[0] === 'string' &&
    value[0].length <= MAX_ADDRESS &&
    Number.isSafeInteger(value[1]) &&
    value[1] > 0
  );
}

function randomId() {
  const bytes = new Uint8Array(12);
  globalThis.crypto.getRandomValues(bytes);
  let id = '';
  for (const b of bytes) id += 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'[b & 63];
  return id;
}

function warn(...args) {
  console.warn(`${STUB_NAME}:`, ...args);
}

// reTHINK messages have a `type`; control frames of the stub protocol never do.
function isControlFrame(frame) {
  return typeof frame.cmd === 'string' && frame.type === undefined;
}

function hasVia(msg, stubURL) {
  const via = msg.body?.via;
  return Array.isArray(via) ? via.includes(stubURL) : via === stubURL;
}

function stampVia(msg, stubURL) {
  msg.body ??= {};
  // A body that is not an object has nowhere to carry `via`; replacing it would corrupt the message.
  if (typeof msg.body !== 'object' || Array.isArray(msg.body)) return msg;
  const via = msg.body.via == null ? [] : [].concat(msg.body.via);
  if (!via.includes(stubURL)) via.push(stubURL);
  msg.body.via = via;
  return msg;
}

// `ws` reports a refused upgrade as "Unexpected server response: 401"; browsers report no status.
function refusedWith(errorEvent) {
  const match = /Unexpected server response: (\d{3})/.exec(String(errorEvent?.message ?? ''));
  return match ? Number(match[1]) : undefined;
}

function describeClose(event) {
  return `code ${event.code}${event.reason ? `: ${event.reason}` : ''}`;
}

function notSent(desc) {
  return { cmd: 'auth', response: null, desc };
}

/** An ID token's `exp` (seconds since the epoch), read without checking it; undefined if none. */
function tokenExpiry(token) {
  const payload = typeof token === 'string' ? token.split('.') : [];
  if (payload.length !== 3) return undefined;
  try {
    const base64 = payload[1].replace(/-/g, '+').replace(/_/g, '/');
    const exp = JSON.parse(atob(base64.padEnd(Math.ceil(base64.length / 4) * 4, '='))).exp;
    return Number.isFinite(exp) ? exp : undefined;
  } catch {
    return undefined;
  }
}

function describeAnswer(frame) {
  return `${frame.response}${frame.desc ? ` ${frame.desc}` : ''}`;
}

// exports: every export of the module is in this block, the last of the file (see the top).
export { MatrixProtoStub, activate };
export default activate;
