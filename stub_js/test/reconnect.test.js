import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RUNTIME_URL, deadPort, fakeBus, messagesOf, newStub, sleep, startFakeNode, until, within } from '../test-support/fake-node.js';

const msg = (id) => ({ id, type: 'update', from: 'hyperty://example.com/a', to: 'hyperty://example.com/b' });

async function liveStub(t, { nodeOptions, ...config } = {}) {
  const node = await startFakeNode(nodeOptions);
  t.after(() => node.close());
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node, ...config });
  bus.send(msg('first'));
  await until(() => stub.status === 'live', 'live');
  return { node, bus, stub, conn: node.connections[0] };
}

test('reconnects after the node drops the socket and resumes with the same runtimeURL and token', async (t) => {
  const { node, bus, stub, conn } = await liveStub(t);

  conn.ws.terminate();
  // The status moves on to in-progress within a few ms, so look for it in the history.
  const lost = await until(() => bus.statusMessages().find((m) => m.body.value === 'disconnected'), 'disconnected');
  assert.equal(lost.body.desc, 'connection lost (code 1006); reconnecting');
  assert.doesNotThrow(() => bus.send(msg('while-down')), 'a closed socket never throws into the runtime');

  const second = await until(() => node.connections[1], 'a reconnection');
  await until(() => messagesOf(second).length === 1, 'the queued message');

  assert.deepEqual(second.frames[0], { cmd: 'connect', data: { runtimeURL: RUNTIME_URL, token: conn.token } });
  assert.deepEqual(messagesOf(second), [msg('while-down')]);
  assert.deepEqual(bus.statuses(), ['created', 'in-progress', 'live', 'disconnected', 'in-progress', 'live']);
  assert.equal(bus.lastStatus().desc, 'session resumed');
});

test('v2 resume: the reconnection carries the runtimeURL and the token in the query', async (t) => {
  const { node, stub, conn } = await liveStub(t, { handshake: 'v2', hello: true, nodeOptions: { hello: true } });

  conn.ws.terminate();
  const second = await until(() => node.connections[1], 'a reconnection');
  await until(() => stub.status === 'live', 'live again');

  assert.equal(second.query.get('runtimeURL'), RUNTIME_URL);
  assert.equal(second.query.get('token'), conn.token);
});

for (const [code, meaning] of [
  [1001, 'node shutting down'],
  [1008, 'policy violation'],
  [4000, 'an unknown code'],
]) {
  test(`close code ${code} (${meaning}) leads to a reconnect`, async (t) => {
    const { node, bus, stub, conn } = await liveStub(t);

    conn.ws.close(code, meaning);
    await until(() => node.connections[1], 'a reconnection');
    await until(() => stub.status === 'live', 'live again');

    const lost = bus.statusMessages().find((m) => m.body.value === 'disconnected');
    assert.equal(lost.body.desc, `connection lost (code ${code}: ${meaning}); reconnecting`);
  });
}

test('close code 4409 (replaced by a newer connection): disconnected with the reason, no reconnect', async (t) => {
  const { node, bus, stub, conn } = await liveStub(t);
  t.mock.method(console, 'warn', () => {});

  conn.ws.close(4409, 'replaced by a newer connection');
  await until(() => stub.status === 'disconnected', 'disconnected');
  assert.match(bus.lastStatus().desc, /replaced by a newer connection/);

  bus.send(msg('after-replaced'));
  await sleep(100); // many back-off periods
  assert.equal(node.connections.length, 1, 'neither a timer nor a new message reconnects');
  assert.deepEqual(bus.statuses(), ['created', 'in-progress', 'live', 'disconnected']);

  assert.equal(await within(stub.connect(), 'connect()'), 'live', 'an explicit connect() is allowed');
  assert.equal(node.connections.length, 2);
});

test('an unsolicited close 1000 is final until the runtime sends again, then a fresh session starts', async (t) => {
  const { node, bus, stub, conn } = await liveStub(t);

  conn.ws.close(1000);
  await until(() => stub.status === 'disconnected', 'disconnected');
  await sleep(100);
  assert.equal(node.connections.length, 1, 'no automatic reconnect');

  bus.send(msg('later'));
  const second = await until(() => node.connections[1], 'a new connection');
  await until(() => messagesOf(second).length === 1, 'the message');
  assert.deepEqual(
    second.frames[0],
    { cmd: 'connect', data: { runtimeURL: RUNTIME_URL, token: 'tok-1' } },
    'the token is kept as the runtime credential',
  );
});

test('keeps retrying with back-off while the node is unreachable and resumes when it is back', async (t) => {
  const { node, bus, stub, conn } = await liveStub(t, { reconnect: { initialDelay: 5, maxDelay: 10 } });

  node.dropNext = 3;
  conn.ws.terminate();
  await until(() => node.connections.length === 5 && stub.status === 'live', 'live after three failed attempts');

  assert.deepEqual(bus.statuses().slice(2), ['live', 'disconnected', 'in-progress', 'in-progress', 'in-progress', 'in-progress', 'live']);
  assert.deepEqual(node.connections[4].frames[0], { cmd: 'connect', data: { runtimeURL: RUNTIME_URL, token: conn.token } });
});

test('ends in failed after maxAttempts against a port nobody listens on', async (t) => {
  const bus = fakeBus();
  const node = { url: `ws://127.0.0.1:${await deadPort()}/stub/connect` };
  const stub = await newStub(t, { bus, node, reconnect: { initialDelay: 5, maxDelay: 10, maxAttempts: 3 } });
  t.mock.method(console, 'warn', () => {});

  bus.send(msg(1));
  await until(() => stub.status === 'failed', 'failed');

  assert.deepEqual(bus.statuses(), ['created', 'in-progress', 'in-progress', 'in-progress', 'failed']);
  assert.match(bus.lastStatus().desc, /could not connect to .* gave up after 3 attempt\(s\)/);
  await sleep(50);
  assert.equal(bus.statuses().length, 5, 'nothing scheduled after failing');
  assert.equal(console.warn.mock.callCount(), 1, 'the dropped message is reported');
});

test('a handshake the node never answers times out and is retried', async (t) => {
  const node = await startFakeNode();
  t.after(() => node.close());
  node.silent = true;
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node, handshakeTimeout: 30, reconnect: { initialDelay: 5, maxDelay: 5, maxAttempts: 2 } });
  t.mock.method(console, 'warn', () => {});

  bus.send(msg(1));
  await until(() => stub.status === 'failed', 'failed');

  assert.match(bus.lastStatus().desc, /no handshake within 30 ms; gave up after 2 attempt\(s\)/);
  assert.equal(node.connections.length, 2);
  assert.deepEqual(node.connections.map((c) => c.frames.map((f) => f.cmd)), [['connect'], ['connect']]);
});
