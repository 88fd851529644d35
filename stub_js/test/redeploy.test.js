// A reloaded runtime deploys its hyperties again; what the resumed session delivers for them
// meanwhile is held until the runtime has them back (docs/stub-protocol.md, "A runtime that reloads").
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RUNTIME_URL, fakeBus, newStub, startFakeNode, until } from '../test-support/fake-node.js';

const HYPERTY = 'hyperty://example.com/bob';
const OTHER = 'hyperty://example.com/carol';
const ALICE = 'hyperty://example.com/alice';
const REGISTRY = 'domain://registry.example.com';
const REGISTRY_CLIENT = `${RUNTIME_URL}/registry/`;

async function nodeFor(t) {
  const node = await startFakeNode({ acks: true });
  t.after(() => node.close());
  return node;
}

function memoryStore() {
  const items = new Map();
  return { items, getItem: (k) => items.get(k) ?? null, setItem: (k, v) => items.set(k, v) };
}

/**
 * The runtime's side as runtime-core's MessageBus behaves: a message for an address with a
 * listener reaches it; one for an address without (a hyperty not deployed yet) goes out to the
 * default route, the domain's stub, a little later (it is resolved through promises).
 */
function runtimeBus() {
  const bus = fakeBus();
  bus.listening = new Set();
  bus.got = new Map(); // address -> body.n of the pings its listener received, in order
  bus.returned = 0;
  const record = bus.postMessage.bind(bus);
  bus.postMessage = (msg) => {
    record(msg);
    if (typeof msg.to !== 'string' || !msg.to.startsWith('hyperty://')) return;
    const copy = structuredClone(msg);
    if (bus.listening.has(copy.to)) {
      if (!bus.got.has(copy.to)) bus.got.set(copy.to, []);
      bus.got.get(copy.to).push(copy.body.n);
      return;
    }
    setTimeout(() => {
      bus.returned += 1;
      bus.send(copy);
    }, 0);
  };
  return bus;
}

const ping = (n, to = HYPERTY) => ({ id: `p${n}`, type: 'ping', from: ALICE, to, body: { n } });
const registryCreate = (id) => ({ id, type: 'create', from: REGISTRY_CLIENT, to: REGISTRY, body: { value: { url: HYPERTY } } });
const registryUpdate = (id) => ({
  id,
  type: 'update',
  from: REGISTRY_CLIENT,
  to: REGISTRY,
  body: { resource: HYPERTY, value: { status: 'live' } },
});
const registryAnswer = (id) => ({ id, type: 'response', from: REGISTRY, to: REGISTRY_CLIENT, body: { code: 200 } });
const pingsOf = (bus, to = HYPERTY) => bus.messages().filter((m) => m.type === 'ping' && m.to === to).map((m) => m.body.n);
const acksOn = (conn) => conn.frames.filter((f) => f.cmd === 'ack').map((f) => f.received);

/** A runtime that registered its hyperty, then reloaded: the second instance, live, resumed. */
async function reloaded(t, node, config = {}) {
  const sessionStore = memoryStore();
  const firstBus = runtimeBus();
  firstBus.listening.add(HYPERTY);
  const first = await newStub(t, { bus: firstBus, node, sessionStore, acknowledged: true, ...config });
  firstBus.send(registryCreate(1));
  const firstConn = await until(() => node.connections[0], 'the first connection');
  await until(() => first.status === 'live', 'the first live');
  firstConn.deliver(registryAnswer(1), 1, null, 0);
  firstConn.deliver(ping(1), 2, 'alice', 1);
  await until(() => first.stats.unrecorded === 0 && first.stats.delivered === 2, 'the first life recorded');
  assert.deepEqual(JSON.parse([...sessionStore.items.values()][0]).addresses, [HYPERTY]);
  // The page goes away without a word (its old socket, left open here, carries nothing more).

  const bus = runtimeBus();
  const stub = await newStub(t, { bus, node, sessionStore, acknowledged: true, ...config });
  // What makes a reloaded runtime deploy its stub: the registration of its hyperty again.
  bus.send(registryUpdate(2));
  const conn = await until(() => node.connections[1], 'the connection after the reload');
  await until(() => stub.status === 'live', 'live');
  assert.equal(conn.frames[0].data.ack.received, 2);
  return { stub, bus, conn, sessionStore };
}

test('after a reload, messages for a hyperty the runtime had wait until the registry answered its registration again', async (t) => {
  const node = await nodeFor(t);
  const { stub, bus, conn } = await reloaded(t, node);

  conn.deliver(ping(2), 3, 'alice', 2);
  conn.deliver(ping(3), 4, 'alice', 3);
  conn.deliver(ping(4, OTHER), 5, 'alice', 4); // never known before the reload: not held
  await until(() => pingsOf(bus, OTHER).length === 1, 'the message for the other address');
  assert.deepEqual(pingsOf(bus), [], 'nothing for the hyperty before it is back');
  assert.equal(stub.stats.held, 2);

  // The registry answers: the runtime deploys the hyperty and adds its listener.
  conn.deliver(registryAnswer(2), 6, null, 0);
  bus.listening.add(HYPERTY);
  await until(() => bus.got.get(HYPERTY)?.length === 2, 'the held messages');
  assert.deepEqual(bus.got.get(HYPERTY), [2, 3]);
  const order = bus.messages().map((m) => (m.type === 'ping' ? m.body.n : m.type));
  assert.deepEqual(order, [4, 'response', 2, 3], 'the held ones right after the answer');
  await until(() => acksOn(conn).at(-1) === 6, 'everything acknowledged once handed on');
  assert.equal(stub.stats.held, 0);
});

test('held messages are not acknowledged: a reconnect meanwhile says where they start', async (t) => {
  const node = await nodeFor(t);
  const { stub, conn } = await reloaded(t, node);
  conn.deliver(ping(2, OTHER), 3, 'alice', 2);
  conn.deliver(ping(3), 4, 'alice', 3);
  conn.deliver(ping(4, OTHER), 5, 'alice', 4);
  await until(() => acksOn(conn).includes(3), 'the first message acknowledged');
  await until(() => stub.stats.delivered === 2, 'the other two handed on');
  conn.ws.terminate();
  const hello = await until(() => node.connections[2]?.frames[0], 'the reconnection');
  assert.equal(hello.data.ack.received, 3, 'not past the held message');
  assert.ok(acksOn(conn).every((received) => received < 4));
  assert.equal(stub.stats.held, 1);
});

test('a held message is not kept as received: a reload meanwhile takes it when the node delivers it again', async (t) => {
  const node = await nodeFor(t);
  const { stub, conn, sessionStore } = await reloaded(t, node);
  conn.deliver(ping(2, OTHER), 3, 'alice', 2);
  conn.deliver(ping(3), 4, 'alice', 3);
  const recorded = () => JSON.parse([...sessionStore.items.values()][0]);
  await until(() => recorded().received === 3, 'the first recorded');
  assert.equal(stub.stats.held, 1);
  assert.deepEqual(recorded().origins, [['alice', 2]]);

  // Another reload (the held message never reached the runtime), after a crash of the node:
  // delivered again under a new number, it is taken.
  const bus = runtimeBus();
  bus.listening.add(HYPERTY);
  const third = await newStub(t, { bus, node, sessionStore, acknowledged: true, holdAfterReload: false });
  await third.connect();
  const thirdConn = await until(() => node.connections[2], 'the third connection');
  assert.equal(thirdConn.frames[0].data.ack.received, 3);
  thirdConn.deliver(ping(2, OTHER), 2 ** 32 + 1, 'alice', 2);
  thirdConn.deliver(ping(3), 2 ** 32 + 2, 'alice', 3);
  await until(() => third.stats.delivered + third.stats.duplicates === 2, 'both taken');
  assert.deepEqual(bus.got.get(HYPERTY), [3]);
  assert.equal(third.stats.duplicates, 1);
});

test('a message the runtime hands back for want of a listener is offered again, in order, until its hyperty listens', async (t) => {
  const node = await nodeFor(t);
  const { stub, bus, conn } = await reloaded(t, node);
  for (let n = 2; n <= 6; n += 1) conn.deliver(ping(n), n + 1, 'alice', n);
  await until(() => stub.stats.held === 5, 'held');
  // The registry answers long before the hyperty is deployed: what is handed on comes back.
  conn.deliver(registryAnswer(2), 8, null, 0);
  await until(() => bus.returned >= 10, 'the runtime handing them back, twice');
  conn.deliver(ping(7), 9, 'alice', 7); // comes while those are held again: waits behind them
  bus.listening.add(HYPERTY);
  await until(() => bus.got.get(HYPERTY)?.length === 6, 'all of them at the listener');
  assert.deepEqual(bus.got.get(HYPERTY), [2, 3, 4, 5, 6, 7]);
  assert.equal(stub.stats.returned, bus.returned);
  assert.equal(stub.stats.delivered, 7, 'a message handed on again counts once');
  await until(() => acksOn(conn).at(-1) === 9, 'acknowledged');
});

test('the runtime speaking from its hyperty shows it is back', async (t) => {
  const node = await nodeFor(t);
  const { stub, bus, conn } = await reloaded(t, node);
  bus.listening.add(HYPERTY);
  conn.deliver(ping(2), 3, 'alice', 2);
  await until(() => stub.stats.held === 1, 'held');
  bus.send({ id: 'h1', type: 'ping', from: HYPERTY, to: ALICE, body: { n: 1 } });
  await until(() => bus.got.get(HYPERTY)?.length === 1, 'handed on');
  assert.deepEqual(bus.got.get(HYPERTY), [2]);
});

test('nothing is held past the deadline, nor beyond the byte bound', async (t) => {
  const node = await nodeFor(t);
  const { stub, bus, conn } = await reloaded(t, node, { holdAfterReload: { deadline: 50 } });
  bus.listening.add(HYPERTY);
  conn.deliver(ping(2), 3, 'alice', 2);
  await until(() => bus.got.get(HYPERTY)?.length === 1, 'handed on at the deadline');
  assert.equal(stub.stats.held, 0);

  const node2 = await nodeFor(t);
  const small = await reloaded(t, node2, { holdAfterReload: { maxBytes: 300 } });
  small.bus.listening.add(HYPERTY);
  small.conn.deliver(ping(2), 3, 'alice', 2);
  await until(() => small.stub.stats.held === 1, 'the first held');
  small.conn.deliver({ ...ping(3), body: { n: 3, pad: 'x'.repeat(300) } }, 4, 'alice', 3);
  await until(() => small.bus.got.get(HYPERTY)?.length === 2, 'both handed on');
  assert.deepEqual(small.bus.got.get(HYPERTY), [2, 3]);
});

test('a runtime that does not reload, or says holdAfterReload: false, gets everything at once', async (t) => {
  const node = await nodeFor(t);
  const bus = runtimeBus();
  const stub = await newStub(t, { bus, node, sessionStore: memoryStore(), acknowledged: true });
  bus.send(registryCreate(1));
  const conn = await until(() => node.connections[0], 'connection');
  await until(() => stub.status === 'live', 'live');
  conn.deliver(ping(1), 1, 'alice', 1);
  await until(() => stub.stats.returned === 1, 'handed on (and back: no listener)');
  assert.equal(stub.stats.held, 0, 'a message handed back outside a reload is dropped as a loop');
  assert.deepEqual(pingsOf(bus), [1]);

  const node2 = await nodeFor(t);
  const off = await reloaded(t, node2, { holdAfterReload: false });
  off.conn.deliver(ping(2), 3, 'alice', 2);
  await until(() => off.stub.stats.returned === 1, 'handed on at once');
  assert.equal(off.stub.stats.held, 0);
});

test('a disconnect leaves held messages unacknowledged, for the node to answer their senders', async (t) => {
  const node = await nodeFor(t);
  const { stub, bus, conn } = await reloaded(t, node);
  conn.deliver(ping(2), 3, 'alice', 2);
  await until(() => stub.stats.held === 1, 'held');
  await stub.disconnect();
  assert.ok(acksOn(conn).every((received) => received < 3));
  assert.deepEqual(pingsOf(bus), []);
  assert.equal(stub.stats.held, 0);
});

test('the kept addresses are only hyperty addresses from the store, and at most 64', async (t) => {
  const node = await nodeFor(t);
  const sessionStore = memoryStore();
  const key = `rethink-mn:session:${node.url}:${RUNTIME_URL}`;
  const addresses = [42, 'user://x/y', ...Array.from({ length: 70 }, (_, i) => `hyperty://example.com/${i}`)];
  sessionStore.items.set(key, JSON.stringify({ token: 'tok-0', received: 0, addresses }));
  const bus = runtimeBus();
  const stub = await newStub(t, { bus, node, sessionStore, acknowledged: true });
  await stub.connect();
  await until(() => JSON.parse(sessionStore.items.get(key)).token !== 'tok-0', 'the session recorded');
  const kept = JSON.parse(sessionStore.items.get(key)).addresses;
  assert.equal(kept.length, 64);
  assert.ok(kept.every((a) => a.startsWith('hyperty://')));
});
