// A small stand-in for the Message Node's /stub/connect endpoint (docs/stub-protocol.md), with
// knobs to refuse tokens, refuse handshakes and drop sockets, and a bus double for the runtime side.
import http from 'node:http';
import { WebSocketServer } from 'ws';
import { MatrixProtoStub } from '../src/index.js';

export const STUB_URL = 'hyperty-runtime://example.com/protostub/1';
export const RUNTIME_URL = 'runtime://example.com/runtime-1';

/** Polls until `predicate()` is truthy; fails the test with `what` after `timeout` ms. */
export async function until(predicate, what, timeout = 2000) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

/** Resolves like `promise`, or fails the test with `what` after `timeout` ms instead of hanging. */
export function within(promise, what, timeout = 2000) {
  let timer;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), timeout);
  });
  return Promise.race([promise, expired]).finally(() => clearTimeout(timer));
}

export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** The runtime's side of the bus: records what the stub posts and lets a test send to the stub. */
export function fakeBus() {
  const listeners = [];
  return {
    posted: [],
    addListener(type, callback) {
      listeners.push({ type, callback });
    },
    postMessage(msg) {
      this.posted.push(structuredClone(msg));
    },
    send(msg) {
      for (const { type, callback } of listeners) if (type === '*') callback(msg);
    },
    statusMessages() {
      return this.posted.filter((m) => m.to === `${STUB_URL}/status`);
    },
    statuses() {
      return this.statusMessages().map((m) => m.body.value);
    },
    lastStatus() {
      return this.statusMessages().at(-1)?.body;
    },
    messages() {
      return this.posted.filter((m) => m.to !== `${STUB_URL}/status`);
    },
  };
}

/**
 * Starts a fake node on 127.0.0.1 at a free port.
 * Options: `hello` honoured for v2; `refuseConnect` (a v1 answer code other than 200 for every
 * connect); `answerDisconnect` (default true); `acks` (speak the acknowledged protocol when the
 * stub offers it: numbered messages are recorded, deduplicated by stub instance and acknowledged
 * unless `holdAcks` is set; `conn.deliver(msg, dseq, origin, oseq)` sends a numbered delivery).
 * Mutable knobs: `rejectedTokens` (a Set; v1 answers 401, v2 upgrade gets HTTP 401); `dropNext`
 * (that many next sockets are cut right after the upgrade); `silent` (v1 connects go unanswered);
 * `holdAcks` (numbered messages are taken but not acknowledged); `answerAuth` (a function from a
 * `{cmd: 'auth'}` frame to the answer; by default 200 with the token's `exp` as `data.expires`).
 */
export async function startFakeNode(options = {}) {
  const server = http.createServer((req, res) => res.writeHead(404).end());
  const wss = new WebSocketServer({ noServer: true });
  const node = {
    connections: [],
    upgrades: [], // {url, at} of every upgrade request, refused ones included
    rejectedTokens: new Set(),
    dropNext: 0,
    silent: false,
    holdAcks: false,
    answerAuth: (frame) => ({ cmd: 'auth', response: 200, data: { expires: jwtExp(frame.data?.token) ?? null } }),
    url: '',
    tokensIssued: 0,
    accepted: new Map(), // stub instance -> highest message number taken
    duplicates: 0, // numbered messages sent again that had been taken before
    async close() {
      for (const conn of node.connections) conn.ws.terminate();
      await new Promise((resolve) => wss.close(resolve));
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
  const seenRuntimes = new Set();

  function answerConnect(conn, runtimeURL, offer) {
    const session = seenRuntimes.has(runtimeURL) ? 'resumed' : 'new';
    seenRuntimes.add(runtimeURL);
    conn.runtimeURL = runtimeURL;
    conn.token = `tok-${++node.tokensIssued}`;
    const data = { runtimeURL, session, token: conn.token, domain: 'example.com' };
    if (options.acks && offer?.v === 1) {
      conn.stub = offer.stub;
      conn.offer = offer;
      data.ack = { v: 1, seq: node.holdAcks ? 0 : node.accepted.get(offer.stub) ?? 0 };
    }
    conn.send({ cmd: 'connect', response: 200, data });
  }

  function takeNumbered(conn, [seq, msg]) {
    const accepted = node.accepted.get(conn.stub) ?? 0;
    if (seq <= accepted) {
      node.duplicates += 1;
    } else {
      node.accepted.set(conn.stub, seq);
      conn.frames.push(msg);
      conn.seqs.push(seq);
    }
    if (!node.holdAcks) conn.send({ cmd: 'ack', seq: node.accepted.get(conn.stub) });
  }

  server.on('upgrade', (req, socket, head) => {
    const url = new URL(req.url, 'http://127.0.0.1');
    node.upgrades.push({ url: req.url, at: Date.now() });
    const token = url.searchParams.get('token');
    if (url.pathname !== '/stub/connect' || (token && node.rejectedTokens.has(token))) {
      const status = url.pathname !== '/stub/connect' ? '404 Not Found' : '401 Unauthorized';
      socket.end(`HTTP/1.1 ${status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`);
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      const conn = {
        ws,
        url: req.url,
        query: url.searchParams,
        frames: [],
        runtimeURL: url.searchParams.get('runtimeURL'),
        token: null,
        stub: null,
        seqs: [], // the numbers of the numbered messages taken on this connection
        closed: new Promise((resolve) => ws.on('close', (code, reason) => resolve({ code, reason: String(reason) }))),
        send: (obj) => ws.send(JSON.stringify(obj)),
        deliver: (msg, dseq, origin = null, oseq = 0) => ws.send(JSON.stringify([dseq, origin, oseq, msg])),
      };
      node.connections.push(conn);
      if (node.dropNext > 0) {
        node.dropNext -= 1;
        ws.terminate();
        return;
      }
      const query = url.searchParams;
      if (conn.runtimeURL && options.hello && (query.get('hello') === '1' || query.get('ack') === '1')) {
        const offer = query.get('ack') === '1' ? { v: 1, stub: query.get('stub'), received: Number(query.get('received')) } : undefined;
        answerConnect(conn, conn.runtimeURL, offer);
      }
      ws.on('message', (data, isBinary) => {
        const frame = isBinary ? { binary: true } : JSON.parse(String(data));
        if (Array.isArray(frame) && conn.stub) return takeNumbered(conn, frame);
        conn.frames.push(frame);
        if (frame.cmd === 'connect' && !conn.runtimeURL) {
          const presented = frame.data?.token;
          if (node.silent) {
            // leave the stub waiting
          } else if (options.refuseConnect) {
            conn.send({ cmd: 'connect', response: options.refuseConnect, desc: 'refused by the test' });
          } else if (presented && node.rejectedTokens.has(presented)) {
            conn.send({ cmd: 'connect', response: 401, desc: 'invalid token' });
          } else {
            answerConnect(conn, frame.data.runtimeURL, frame.data.ack);
          }
        } else if (frame.cmd === 'auth') {
          const answer = node.answerAuth(frame);
          if (answer) conn.send(answer);
        } else if (frame.cmd === 'disconnect' && options.answerDisconnect !== false) {
          conn.send({ cmd: 'disconnect', response: 200 });
          ws.close(1000);
        }
      });
    });
  });

  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  node.url = `ws://127.0.0.1:${server.address().port}/stub/connect`;
  return node;
}

/** An unsigned JWT with these claims (the fake node reads it, nobody checks it). */
export function fakeJwt(claims) {
  const part = (obj) => Buffer.from(JSON.stringify(obj)).toString('base64url');
  return `${part({ alg: 'RS256', typ: 'JWT' })}.${part(claims)}.c2ln`;
}

function jwtExp(token) {
  try {
    return JSON.parse(Buffer.from(String(token).split('.')[1], 'base64url').toString()).exp;
  } catch {
    return undefined;
  }
}

/** A port nothing listens on. */
export async function deadPort() {
  const server = http.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** ReTHINK frames a connection received, without the control frames. */
export function messagesOf(conn) {
  return conn.frames.filter((f) => f.cmd === undefined);
}

/**
 * Builds a stub wired to `bus` and `node` with fast back-off, and disconnects it when the test ends.
 * `WebSocket` is left out on purpose unless a test passes one: the stub then imports `ws` itself.
 */
export async function newStub(t, { bus, node, ...config }) {
  const stub = new MatrixProtoStub(STUB_URL, bus, {
    runtimeURL: RUNTIME_URL,
    messagingnode: node.url,
    reconnect: { initialDelay: 5, maxDelay: 20 },
    handshakeTimeout: 1000,
    disconnectTimeout: 200,
    // The plain protocol unless a test asks for the acknowledged one (test/acknowledged.test.js).
    acknowledged: false,
    ...config,
  });
  t.after(() => stub.disconnect());
  return stub;
}
