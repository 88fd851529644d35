import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RUNTIME_URL, STUB_URL, fakeBus, messagesOf, newStub, sleep, startFakeNode, until, within } from '../test-support/fake-node.js';

async function nodeFor(t, options) {
  const node = await startFakeNode(options);
  t.after(() => node.close());
  return node;
}

const msg = (id, extra = {}) => ({ id, type: 'create', from: 'hyperty://example.com/a', to: 'hyperty://example.com/b', ...extra });

test('posts created, in-progress, live, disconnected as status updates addressed to <stubURL>/status', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });
  assert.deepEqual(bus.statuses(), ['created']);

  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  await stub.disconnect();

  assert.deepEqual(bus.statuses(), ['created', 'in-progress', 'live', 'disconnected']);
  for (const status of bus.statusMessages()) {
    assert.equal(status.type, 'update');
    assert.equal(status.from, STUB_URL);
    assert.equal(status.to, `${STUB_URL}/status`);
  }
  assert.equal(bus.lastStatus().desc, 'disconnected by the runtime');
});

test('connects lazily, on the first outgoing message', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  await newStub(t, { bus, node });

  await sleep(50);
  assert.equal(node.connections.length, 0, 'no connection before a message');

  bus.send(msg(1));
  const conn = await until(() => node.connections[0], 'a connection');
  await until(() => messagesOf(conn).length === 1, 'the message');
  assert.deepEqual(messagesOf(conn), [msg(1)]);
});

test('queues messages sent before the handshake and flushes them in order after it', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });

  for (let i = 1; i <= 5; i++) bus.send(msg(i, { body: { n: i } }));
  assert.equal(stub.status, 'in-progress');
  const conn = await until(() => node.connections[0], 'a connection');
  await until(() => conn.frames.length === 6, 'connect + 5 messages');

  assert.equal(conn.frames[0].cmd, 'connect', 'the handshake goes first');
  assert.deepEqual(messagesOf(conn), [1, 2, 3, 4, 5].map((i) => msg(i, { body: { n: i } })));
  assert.equal(node.connections.length, 1, 'several early messages still open one connection');
});

test('a runtime reacting to `live` does not overtake the queued messages', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const postMessage = bus.postMessage;
  bus.postMessage = function (m) {
    postMessage.call(this, m);
    if (m.body?.value === 'live') bus.send(msg('after-live'));
  };
  await newStub(t, { bus, node });

  bus.send(msg('queued'));
  const conn = await until(() => node.connections[0], 'a connection');
  await until(() => messagesOf(conn).length === 2, 'both messages');
  assert.deepEqual(messagesOf(conn).map((m) => m.id), ['queued', 'after-live']);
});

test('disconnect() sends the disconnect command, posts disconnected and stops reconnecting', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });
  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  const conn = node.connections[0];

  await stub.disconnect();

  assert.equal((await conn.closed).code, 1000);
  assert.deepEqual(conn.frames.at(-1), { cmd: 'disconnect', data: { runtimeURL: RUNTIME_URL } });
  assert.equal(stub.status, 'disconnected');
  await sleep(100); // many back-off periods
  assert.equal(node.connections.length, 1, 'no reconnect after disconnect()');
  assert.deepEqual(bus.statuses(), ['created', 'in-progress', 'live', 'disconnected']);
});

test('disconnect() gives its socket up at once, without waiting for the node to answer', async (t) => {
  // A page cycling through hundreds of runtimes would otherwise run out of sockets (a browser
  // holds ~255) while disconnected stubs wait.
  const node = await nodeFor(t, { answerDisconnect: false });
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });
  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');

  const started = Date.now();
  await stub.disconnect();
  const elapsed = Date.now() - started;

  assert.ok(elapsed < 20, `waited ${elapsed} ms`);
  assert.equal(stub.status, 'disconnected');
  assert.equal((await within(node.connections[0].closed, 'the close', 500)).code, 1000);
  assert.deepEqual(node.connections[0].frames.at(-1).cmd, 'disconnect');
});

test('after disconnect() the next message opens a fresh session, presenting the old token as the runtime credential', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });
  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  await stub.disconnect();

  bus.send(msg(2));
  const second = await until(() => node.connections[1], 'a second connection');
  await until(() => messagesOf(second).length === 1, 'the message');

  // The token proves the runtime's credential: while anything is registered under the
  // runtimeURL, the node gives it only to that credential.
  assert.deepEqual(second.frames[0], { cmd: 'connect', data: { runtimeURL: RUNTIME_URL, token: 'tok-1' } });
  assert.deepEqual(messagesOf(second), [msg(2)]);
  assert.deepEqual(bus.statuses(), ['created', 'in-progress', 'live', 'disconnected', 'in-progress', 'live']);
});

test('a message sent while disconnect() is in flight goes out on a fresh session afterwards', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });
  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');

  const closing = stub.disconnect();
  bus.send(msg(2));
  await closing;

  await node.connections[0].closed; // everything the first connection carried has arrived
  assert.deepEqual(messagesOf(node.connections[0]), [msg(1)], 'not sent on the session being released');
  const second = await until(() => node.connections[1], 'a second connection');
  await until(() => messagesOf(second).length === 1, 'the message');
  assert.deepEqual(messagesOf(second), [msg(2)]);
});

test('connect() connects without a message and resolves with the outcome', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });

  assert.equal(await within(stub.connect(), 'connect()'), 'live');
  assert.equal(node.connections.length, 1);
  assert.equal(await within(stub.connect(), 'connect()'), 'live', 'already live');
  assert.equal(node.connections.length, 1);
});

test('disconnect() before any connection is harmless and posts nothing', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });

  await stub.disconnect();
  assert.deepEqual(bus.statuses(), ['created']);
  assert.equal(node.connections.length, 0);
});

function memoryStore() {
  const items = new Map();
  return {
    items,
    getItem: (k) => items.get(k) ?? null,
    setItem: (k, v) => items.set(k, v),
    removeItem: (k) => items.delete(k),
  };
}

test('a reloaded runtime (a new stub instance, same runtimeURL) resumes its session with its token', async (t) => {
  const node = await nodeFor(t, { acks: true });
  const sessionStore = memoryStore();
  const first = await newStub(t, { bus: fakeBus(), node, sessionStore, acknowledged: true });
  await first.connect();
  const firstConn = await until(() => node.connections[0], 'first connection');
  assert.equal(firstConn.frames[0].data.token, undefined, 'a first connection has no token');

  // The page reloads: the old instance is gone without a word, a new one starts.
  const second = await newStub(t, { bus: fakeBus(), node, sessionStore, acknowledged: true });
  await second.connect();
  const secondConn = await until(() => node.connections[1], 'second connection');
  assert.equal(secondConn.frames[0].data.token, firstConn.token, 'the kept token is presented');
  assert.equal(secondConn.frames[0].data.ack.received, 0);
  assert.notEqual(secondConn.frames[0].data.ack.stub, firstConn.frames[0].data.ack.stub);

  // A clean disconnect releases the session: the next instance starts a fresh one, nothing
  // received in it yet, and presents the token as the runtime's credential.
  await second.disconnect();
  const third = await newStub(t, { bus: fakeBus(), node, sessionStore, acknowledged: true });
  await third.connect();
  const thirdConn = await until(() => node.connections[2], 'third connection');
  assert.equal(thirdConn.frames[0].data.token, secondConn.token);
  assert.equal(thirdConn.frames[0].data.ack.received, 0);
});

/** A store whose methods answer later, as IndexedDB or a runtime's own storage do. */
function laterStore(delay = 5) {
  const items = new Map();
  const later = (fn) => new Promise((resolve) => setTimeout(() => resolve(fn()), delay));
  return {
    items,
    getItem: (k) => later(() => items.get(k) ?? null),
    setItem: (k, v) => later(() => void items.set(k, v)),
    removeItem: (k) => later(() => void items.delete(k)),
  };
}

test('a store answering with promises: the first connection waits for the kept session', async (t) => {
  const node = await nodeFor(t, { acks: true });
  const sessionStore = laterStore();
  const first = await newStub(t, { bus: fakeBus(), node, sessionStore, acknowledged: true });
  await first.connect();
  const firstConn = await until(() => node.connections[0], 'first connection');
  firstConn.deliver({ id: 1, type: 'update', from: 'hyperty://example.com/b', to: 'hyperty://example.com/a' }, 1, 'o', 1);
  // Acknowledged and recorded: a reload now resumes with nothing handed on twice.
  await until(() => first.stats.delivered === 1 && first.stats.unrecorded === 0, 'the delivery recorded');
  assert.deepEqual(JSON.parse(sessionStore.items.values().next().value), {
    token: firstConn.token,
    received: 1,
    origins: [['o', 1]],
  });

  const second = await newStub(t, { bus: fakeBus(), node, sessionStore, acknowledged: true });
  await second.connect();
  const secondConn = await until(() => node.connections[1], 'second connection');
  assert.equal(secondConn.frames[0].data.token, firstConn.token, 'the kept token is presented');
  assert.equal(secondConn.frames[0].data.ack.received, 1, 'and how far the deliveries got');

  // By the time disconnect() resolves the store holds the token as the runtime's credential,
  // with nothing received in the session the next instance starts.
  await second.disconnect();
  // The origins' numbers stay: an origin never numbers two messages alike.
  assert.deepEqual(JSON.parse(sessionStore.items.values().next().value), {
    token: secondConn.token,
    received: 0,
    origins: [['o', 1]],
  });
});

test('a reloaded runtime recognises what a crashed node delivers again: the origins are kept with the session', async (t) => {
  const node = await nodeFor(t, { acks: true });
  const sessionStore = memoryStore();
  const first = await newStub(t, { bus: fakeBus(), node, sessionStore, acknowledged: true });
  await first.connect();
  const firstConn = await until(() => node.connections[0], 'first connection');
  const update = (id) => ({ id, type: 'update', from: 'hyperty://example.com/b', to: 'hyperty://example.com/a' });
  firstConn.deliver(update(1), 7, 'alice.s1', 4);
  firstConn.deliver(update(2), 8, 'bob.s1', 9);
  await until(() => first.stats.delivered === 2 && first.stats.unrecorded === 0, 'both recorded');

  // The node is killed before its checkpoint and the page reloads: the node's next run reads
  // its lanes again and delivers both once more, under its new start's numbers.
  const bus = fakeBus();
  const second = await newStub(t, { bus, node, sessionStore, acknowledged: true });
  await second.connect();
  const secondConn = await until(() => node.connections[1], 'second connection');
  assert.equal(secondConn.frames[0].data.ack.received, 8);
  const restart = 2 ** 32;
  secondConn.deliver(update(1), restart + 1, 'alice.s1', 4);
  secondConn.deliver(update(2), restart + 2, 'bob.s1', 9);
  secondConn.deliver(update(3), restart + 3, 'alice.s1', 5);
  await until(() => second.stats.delivered + second.stats.duplicates === 3, 'all three taken');
  assert.deepEqual(bus.messages().map((m) => m.id), [3]);
  assert.equal(second.stats.duplicates, 2);
  await until(() => secondConn.frames.some((f) => f.cmd === 'ack' && f.received === restart + 3), 'acknowledged');
});

test('the origins kept are at most 256, the most recently advanced, and only well-formed ones from the store', async (t) => {
  const node = await nodeFor(t, { acks: true });
  const sessionStore = memoryStore();
  const key = `rethink-mn:session:${node.url}:runtime://example.com/origins`;
  const origins = [['x', 0], [3, 1], ['y', 1.5], ...Array.from({ length: 300 }, (_, i) => [`o${i}`, i + 1])];
  sessionStore.items.set(key, JSON.stringify({ token: 'tok-0', received: 0, origins }));
  const stub = await newStub(t, { bus: fakeBus(), node, sessionStore, acknowledged: true, runtimeURL: 'runtime://example.com/origins' });
  await stub.connect();
  const conn = await until(() => node.connections[0], 'a connection');
  // o43 fell out (the oldest kept is o44): its message is taken. o44's is recognised, and its
  // next one advances it to the newest.
  const update = (id) => ({ id, type: 'update', from: 'hyperty://example.com/b', to: 'hyperty://example.com/a' });
  conn.deliver(update('a'), 1, 'o43', 44);
  conn.deliver(update('b'), 2, 'o44', 45);
  conn.deliver(update('c'), 3, 'o44', 46);
  await until(() => stub.stats.delivered + stub.stats.duplicates === 3, 'all three taken');
  assert.equal(stub.stats.duplicates, 1);
  await until(() => JSON.parse(sessionStore.items.get(key)).received === 3, 'recorded');
  const kept = JSON.parse(sessionStore.items.get(key)).origins;
  assert.equal(kept.length, 256);
  assert.deepEqual(kept.slice(-2), [['o43', 44], ['o44', 46]]);
  assert.deepEqual(kept[0], ['o46', 47]);
});

test('a session store that fails is reported once and the stub goes on without it', async (t) => {
  const node = await nodeFor(t, { acks: true });
  const warnings = [];
  const previous = console.warn;
  console.warn = (...args) => warnings.push(args.join(' '));
  t.after(() => {
    console.warn = previous;
  });
  const broken = { getItem: async () => null, setItem: () => Promise.reject(new Error('quota')), removeItem: () => {} };
  const stub = await newStub(t, { bus: fakeBus(), node, sessionStore: broken, acknowledged: true });
  await stub.connect();
  const conn = await until(() => node.connections[0], 'a connection');
  for (let n = 1; n <= 3; n += 1) {
    conn.deliver({ id: n, type: 'update', from: 'hyperty://example.com/b', to: 'hyperty://example.com/a' }, n, 'o', n);
    await until(() => conn.frames.some((f) => f.cmd === 'ack' && f.received === n), `ack ${n}`);
  }
  assert.equal(stub.status, 'live');
  assert.equal(stub.stats.unrecorded, 3, 'nothing recorded');
  assert.equal(warnings.filter((w) => w.includes('session store failed')).length, 1);
});

test('without a store of its own, stubs of one process share the session of a runtimeURL', async (t) => {
  const node = await nodeFor(t, { acks: true });
  const runtimeURL = 'runtime://example.com/reloaded-in-node';
  const first = await newStub(t, { bus: fakeBus(), node, runtimeURL, acknowledged: true });
  await first.connect();
  const firstConn = await until(() => node.connections[0], 'first connection');
  const second = await newStub(t, { bus: fakeBus(), node, runtimeURL, acknowledged: true });
  await second.connect();
  const secondConn = await until(() => node.connections[1], 'second connection');
  assert.equal(secondConn.frames[0].data.token, firstConn.token);
  // `sessionStore: null` keeps nothing beyond the instance.
  const alone = await newStub(t, { bus: fakeBus(), node, runtimeURL, sessionStore: null, acknowledged: true });
  await alone.connect();
  const aloneConn = await until(() => node.connections[2], 'third connection');
  assert.equal(aloneConn.frames[0].data.token, undefined);
});
