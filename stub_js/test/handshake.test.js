import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RUNTIME_URL, fakeBus, messagesOf, newStub, startFakeNode, until } from '../test-support/fake-node.js';

async function nodeFor(t, options) {
  const node = await startFakeNode(options);
  t.after(() => node.close());
  return node;
}

const msg = (id) => ({ id, type: 'read', from: 'hyperty://example.com/a', to: 'hyperty://example.com/b' });

test('v1 (default): plain endpoint URL, connect command first, live on the 200 answer', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });

  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  const conn = node.connections[0];

  assert.equal(conn.url, '/stub/connect');
  assert.deepEqual(conn.frames[0], { cmd: 'connect', data: { runtimeURL: RUNTIME_URL } });
  assert.equal(bus.lastStatus().desc, 'session new');
});

test('v2: the runtimeURL travels encoded in the query, no connect command is sent', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const runtimeURL = 'runtime://example.com/a b&c=d/é?x#y';
  const stub = await newStub(t, { bus, node, handshake: 'v2', runtimeURL });

  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  const conn = node.connections[0];
  await until(() => conn.frames.length === 1, 'the message');

  assert.equal(conn.url, `/stub/connect?runtimeURL=${encodeURIComponent(runtimeURL)}`);
  assert.equal(conn.runtimeURL, runtimeURL, 'the node decodes the same runtimeURL');
  assert.deepEqual(conn.frames, [msg(1)], 'the first frame is the message itself');
});

test('v2 with hello: waits for the connect answer and keeps its token', async (t) => {
  const node = await nodeFor(t, { hello: true });
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node, handshake: 'v2', hello: true });

  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  const conn = node.connections[0];

  assert.equal(conn.url, `/stub/connect?runtimeURL=${encodeURIComponent(RUNTIME_URL)}&hello=1`);
  assert.equal(bus.lastStatus().desc, 'session new');
  conn.ws.terminate();
  const second = await until(() => node.connections[1], 'a reconnection');
  assert.equal(second.query.get('token'), conn.token, 'the token from the hello answer is presented');
});

test('the messagingnode URL may be given as `url`', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node, messagingnode: undefined, url: node.url });

  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  assert.equal(node.connections.length, 1);
});

test('a refused v1 handshake ends in failed with the reason and is not retried', async (t) => {
  const node = await nodeFor(t, { refuseConnect: 403 });
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });
  t.mock.method(console, 'warn', () => {}); // the dropped message is reported

  bus.send(msg(1));
  await until(() => stub.status === 'failed', 'failed');

  assert.deepEqual(bus.statuses(), ['created', 'in-progress', 'failed']);
  assert.match(bus.lastStatus().desc, /handshake refused: 403 refused by the test/);
  await node.connections[0].closed;
  assert.equal(node.connections.length, 1);
  assert.deepEqual(messagesOf(node.connections[0]), [], 'nothing sent past a refused handshake');
  assert.match(console.warn.mock.calls[0].arguments.join(' '), /dropping 1 unsent message/);
});

test('a v2 upgrade refused with an HTTP error other than 401 ends in failed', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node, handshake: 'v2', messagingnode: node.url.replace('/stub/connect', '/wrong') });
  t.mock.method(console, 'warn', () => {}); // the dropped message is reported

  bus.send(msg(1));
  await until(() => stub.status === 'failed', 'failed');
  assert.equal(bus.lastStatus().desc, 'handshake refused: HTTP 404');
  assert.equal(node.upgrades.length, 1);
});

test('v1: a 401 for the presented token drops it and asks once more without one', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });
  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  const first = node.connections[0];

  node.rejectedTokens.add(first.token);
  first.ws.terminate();
  const second = await until(() => node.connections[1], 'a reconnection');
  await until(() => second.token, 'a new session token');

  assert.deepEqual(second.frames.slice(0, 2), [
    { cmd: 'connect', data: { runtimeURL: RUNTIME_URL, token: first.token } },
    { cmd: 'connect', data: { runtimeURL: RUNTIME_URL } },
  ]);
  await until(() => stub.status === 'live', 'live again');
  assert.equal(bus.lastStatus().desc, 'session resumed');

  // The new token is the one presented next time.
  second.ws.terminate();
  const third = await until(() => node.connections[2], 'another reconnection');
  await until(() => third.frames.length, 'its connect');
  assert.equal(third.frames[0].data.token, second.token);
});

test('v1: a 401 without a token ends in failed rather than looping', async (t) => {
  const node = await nodeFor(t, { refuseConnect: 401 });
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });
  t.mock.method(console, 'warn', () => {}); // the dropped message is reported

  bus.send(msg(1));
  await until(() => stub.status === 'failed', 'failed');
  assert.equal(node.connections[0].frames.length, 1, 'one connect, no retry without a token to drop');
  assert.equal(node.connections.length, 1);
});

test('v2: an upgrade refused with HTTP 401 for the token is retried at once without it', async (t) => {
  const node = await nodeFor(t, { hello: true });
  const bus = fakeBus();
  // A back-off long enough to tell an immediate retry from a scheduled one.
  const stub = await newStub(t, { bus, node, handshake: 'v2', hello: true, reconnect: { initialDelay: 300, maxDelay: 300 } });
  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  const first = node.connections[0];

  node.rejectedTokens.add(first.token);
  first.ws.close(1001, 'going away');
  const second = await until(() => node.connections[1], 'a reconnection');
  await until(() => stub.status === 'live', 'live again');

  const base = `/stub/connect?runtimeURL=${encodeURIComponent(RUNTIME_URL)}`;
  assert.deepEqual(node.upgrades.map((u) => u.url), [`${base}&hello=1`, `${base}&token=${first.token}&hello=1`, `${base}&hello=1`]);
  const retryGap = node.upgrades[2].at - node.upgrades[1].at;
  assert.ok(retryGap < 100, `retried after ${retryGap} ms, not after the back-off`);
  assert.equal(second.query.get('token'), null);
  assert.equal(bus.lastStatus().desc, 'session resumed');
});

test('credentials go with every handshake: v1 in data.auth, v2 in the query; a function is asked each time', async (t) => {
  const node = await startFakeNode({ hello: true });
  t.after(() => node.close());
  const bus = fakeBus();
  let asked = 0;
  const stub = await newStub(t, {
    bus,
    node,
    credentials: async () => ({ type: 'matrix', token: `syt_${++asked}` }),
  });
  bus.send({ id: 1, type: 'ping', from: 'hyperty://example.com/a', to: 'hyperty://example.com/b' });
  await until(() => stub.status === 'live', 'live');
  assert.deepEqual(node.connections[0].frames[0].data.auth, { type: 'matrix', token: 'syt_1' });

  node.connections[0].ws.terminate();
  await until(() => node.connections[1]?.frames[0], 'a second handshake');
  assert.deepEqual(node.connections[1].frames[0].data.auth, { type: 'matrix', token: 'syt_2' });

  const v2bus = fakeBus();
  const v2 = await newStub(t, { bus: v2bus, node, handshake: 'v2', hello: true, credentials: { type: 'oidc', token: 'eyJ.x.y' } });
  v2bus.send({ id: 2, type: 'ping', from: 'hyperty://example.com/a', to: 'hyperty://example.com/b' });
  await until(() => v2.status === 'live', 'v2 live');
  const query = node.connections.at(-1).query;
  assert.equal(query.get('auth_type'), 'oidc');
  assert.equal(query.get('auth_token'), 'eyJ.x.y');
});
