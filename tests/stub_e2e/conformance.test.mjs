// The reTHINK conformance scenarios driven the way runtimes drive the node: through the bundled
// stub (stub_js) on Node.js, against the real node and Synapse that the Python test session
// started (tests/integration/test_stub_js.py passes their address in MN_STUB_URL / MN_DOMAIN).
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { activate } from '../../stub_js/src/index.js';

const NODE_URL = process.env.MN_STUB_URL;
const DOMAIN = process.env.MN_DOMAIN ?? 'mn.test';
const MN = `domain://msg-node.${DOMAIN}`;
const RUN = process.env.MN_RUN ?? `${Date.now()}`;
assert.ok(NODE_URL, 'MN_STUB_URL must name the node under test');

// A runtime's message bus, reduced to what a stub needs: addListener('*') and postMessage.
// Every message handed to it is kept as JSON: one handed twice is counted (`twice`), never
// dropped unseen (the stub's status updates repeat by design and are not counted).
class Bus {
  constructor() {
    this.listeners = [];
    this.received = [];
    this.waiters = [];
    this.handed = new Set();
    this.twice = [];
  }
  addListener(_address, listener) { this.listeners.push(listener); }
  postMessage(message) {
    if (!String(message.to).endsWith('/status')) {
      const text = JSON.stringify(message);
      if (this.handed.has(text)) this.twice.push(message);
      this.handed.add(text);
    }
    this.received.push(message);
    this.waiters = this.waiters.filter(({ match, resolve }) => {
      if (!match(message)) return true;
      resolve(message);
      return false;
    });
  }
  send(message) { for (const listener of this.listeners) listener(message); }
  next(match, timeoutMs = 15000) {
    const seen = this.received.find(match);
    if (seen) {
      this.received.splice(this.received.indexOf(seen), 1);
      return Promise.resolve(seen);
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('timed out waiting for a message')), timeoutMs);
      this.waiters.push({ match, resolve: (m) => { clearTimeout(timer); this.received.splice(this.received.indexOf(m), 1); resolve(m); } });
    });
  }
  statuses(stubURL) {
    return this.received.filter((m) => m.to === `${stubURL}/status`).map((m) => m.body.value);
  }
}

let counter = 0;
const opened = [];
const buses = [];

function runtime(name, handshake = 'v1') {
  const runtimeURL = `runtime://${DOMAIN}/${name}-${RUN}`;
  const stubURL = `hyperty-runtime://${DOMAIN}/protostub/${name}-${RUN}`;
  const bus = new Bus();
  buses.push(bus);
  const { instance } = activate(stubURL, bus, {
    runtimeURL, messagingnode: NODE_URL, handshake, reconnect: { initialDelay: 50, maxDelay: 500 },
  });
  opened.push(instance);
  const request = async (to, type, body, from = `${stubURL}/registry/allocation`) => {
    const id = `${name}-${++counter}`;
    bus.send({ id, type, from, to, body });
    return bus.next((m) => m.id === id && m.type === 'response');
  };
  const allocate = async (endpoint = 'hyperty-address-allocation', scheme = 'hyperty', number = 1, key) => {
    const value = { number };
    if (key) value.allocationKey = key;
    const answer = await request(`${MN}/${endpoint}`, 'create', { scheme, value });
    assert.equal(answer.body.code, 200);
    return answer.body.value.allocated;
  };
  return { runtimeURL, stubURL, bus, stub: instance, request, allocate };
}

after(async () => { await Promise.all(opened.map((s) => s.disconnect())); });

describe('connection', () => {
  test('status sequence created → in-progress → live → disconnected', async () => {
    const rt = runtime('status');
    await rt.allocate(); // the first outgoing message connects
    await rt.stub.disconnect();
    assert.deepEqual(rt.bus.statuses(rt.stubURL), ['created', 'in-progress', 'live', 'disconnected']);
  });

  test('both handshakes reach the node', async () => {
    for (const handshake of ['v1', 'v2']) {
      const rt = runtime(`hs-${handshake}`, handshake);
      const [address] = await rt.allocate();
      assert.match(address, new RegExp(`^hyperty://${DOMAIN}/`));
      await rt.stub.disconnect();
    }
  });
});

describe('hyperty allocation', () => {
  test('single, block and keyed blocks; a wrong scheme still yields hyperty://', async () => {
    const rt = runtime('alloc');
    assert.equal((await rt.allocate()).length, 1);
    assert.equal((await rt.allocate('hyperty-address-allocation', 'hyperty', 3)).length, 3);
    const keyed = await rt.allocate('hyperty-address-allocation', 'hyperty', 4, `${rt.stubURL}/hypertyAllocationKey`);
    assert.equal(keyed.length, 4);
    const [odd] = await rt.allocate('hyperty-address-allocation', 'comm');
    assert.ok(odd.startsWith('hyperty://'));
  });

  test('deletes by children, by nested list and by key', async () => {
    const rt = runtime('dealloc');
    const ep = `${MN}/hyperty-address-allocation`;
    const [one] = await rt.allocate();
    const block = await rt.allocate('hyperty-address-allocation', 'hyperty', 3);
    await rt.allocate('hyperty-address-allocation', 'hyperty', 2, 'the-key');
    assert.equal((await rt.request(ep, 'delete', { childrenResources: [one] })).body.code, 200);
    assert.equal((await rt.request(ep, 'delete', { childrenResources: [block] })).body.code, 200);
    assert.equal((await rt.request(ep, 'delete', { resource: 'the-key' })).body.code, 200);
    assert.equal((await rt.request(ep, 'delete', {})).body.code, 400);
  });
});

describe('object allocation', () => {
  test('uses the requested scheme', async () => {
    const rt = runtime('objects');
    const [connection] = await rt.allocate('object-address-allocation', 'connection');
    assert.ok(connection.startsWith(`connection://${DOMAIN}/`));
    const comms = await rt.allocate('address-allocation', 'comm', 3);
    assert.ok(comms.every((a) => a.startsWith('comm://')));
  });
});

describe('subscription and publication', () => {
  test('with and without source; updates reach both subscribers unchanged; unsubscribe stops them', async () => {
    const reporter = runtime('Reporter');
    const sub1 = runtime('Subscriber');
    const sub2 = runtime('Subscriber2');
    const [object] = await reporter.allocate('address-allocation', 'connection');
    const resources = [`${object}/changes`, `${object}/children/name1`];
    const sm = `${MN}/sm`;
    assert.equal((await sub1.request(sm, 'subscribe', { resources, source: sub1.stubURL }, `${sub1.stubURL}/sm`)).body.code, 200);
    assert.equal((await sub2.request(sm, 'subscribe', { resources }, `${sub2.stubURL}/sm`)).body.code, 200);

    const update = { id: 'upd1', type: 'update', from: object, to: `${object}/changes`, body: { attribute: 'changedAttribute', value: 'new Value' } };
    reporter.bus.send(update);
    for (const sub of [sub1, sub2]) {
      const got = await sub.bus.next((m) => m.id === 'upd1');
      // Unchanged, except for the receiving stub's own `via` mark (loop prevention).
      assert.deepEqual({ ...got, body: { ...got.body, via: undefined } }, { ...update, body: { ...update.body, via: undefined } });
      assert.deepEqual(got.body.via, [sub.stubURL]);
    }

    for (const sub of [sub1, sub2]) {
      assert.equal((await sub.request(sm, 'unsubscribe', { resources }, `${sub.stubURL}/sm`)).body.code, 200);
    }
    reporter.bus.send({ id: 'upd2', type: 'update', from: object, to: `${object}/changes`, body: { value: 'a second new Value' } });
    await new Promise((r) => setTimeout(r, 1500));
    for (const sub of [sub1, sub2]) assert.equal(sub.bus.received.filter((m) => m.id === 'upd2').length, 0);
  });
});

describe('messaging', () => {
  test('ping and pong between two runtimes', async () => {
    const alice = runtime('alice');
    const bob = runtime('bob');
    const [a] = await alice.allocate();
    const [b] = await bob.allocate();
    alice.bus.send({ id: 'ping1', type: 'PING', from: a, to: b, body: { n: 1.5 } });
    const ping = await bob.bus.next((m) => m.id === 'ping1');
    assert.equal(ping.body.n, 1.5);
    bob.bus.send({ id: 'ping1', type: 'response', from: b, to: a, body: { code: 200 } });
    const pong = await alice.bus.next((m) => m.id === 'ping1' && m.type === 'response');
    assert.equal(pong.body.code, 200);
  });

  test('an address this node never allocated gets its reply', async () => {
    const local = runtime('local');
    const gateway = runtime('gateway');
    const [h] = await local.allocate();
    const external = `hyperty://other.example/visitor-${RUN}`;
    gateway.bus.send({ id: 'ext1', type: 'create', from: external, to: h, body: {} });
    await local.bus.next((m) => m.id === 'ext1');
    local.bus.send({ id: 'ext1', type: 'response', from: h, to: external, body: { code: 200 } });
    const reply = await gateway.bus.next((m) => m.id === 'ext1' && m.type === 'response');
    assert.equal(reply.to, external);
  });

  test('an unknown destination is answered 404', async () => {
    const rt = runtime('lost');
    const [h] = await rt.allocate();
    rt.bus.send({ id: 'nowhere', type: 'read', from: h, to: `hyperty://${DOMAIN}/nobody-${RUN}` });
    const answer = await rt.bus.next((m) => m.id === 'nowhere' && m.type === 'response');
    assert.equal(answer.body.code, 404);
  });
});

// Last: every message of every scenario above reached its runtime once.
test('no runtime was handed a message twice', () => {
  assert.deepEqual(buses.flatMap((bus) => bus.twice), []);
});
