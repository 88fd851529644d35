import assert from 'node:assert/strict';
import { test } from 'node:test';
import { STUB_URL, fakeBus, messagesOf, newStub, startFakeNode, until } from '../test-support/fake-node.js';

const OTHER_STUB = 'hyperty-runtime://other.example/protostub/7';

/** A live stub and the node-side connection it uses. */
async function liveStub(t, config = {}) {
  const node = await startFakeNode();
  t.after(() => node.close());
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node, ...config });
  bus.send({ id: 'hello', type: 'read', from: 'hyperty://example.com/a', to: 'domain://msg-node.example.com/x' });
  await until(() => stub.status === 'live', 'live');
  const conn = node.connections[0];
  await until(() => messagesOf(conn).length === 1, 'the first message');
  return { node, bus, stub, conn };
}

test('outgoing messages are sent unmodified, one JSON text frame each', async (t) => {
  const { bus, conn } = await liveStub(t);
  const message = {
    id: 42,
    type: 'UPDATE',
    from: 'hyperty://example.com/a',
    to: ['hyperty://example.com/b', 'hyperty://example.com/c'],
    body: { value: { big: 2 ** 60, float: 1.5, text: 'ü 🚀', nothing: null }, via: [OTHER_STUB] },
  };
  const raw = [];
  conn.ws.on('message', (data, isBinary) => raw.push({ text: String(data), isBinary }));

  bus.send(message);
  await until(() => raw.length === 1, 'the frame');

  assert.deepEqual(raw, [{ text: JSON.stringify(message), isBinary: false }]);
  assert.deepEqual(message.body.via, [OTHER_STUB], "the runtime's object is left alone");
});

test('messages delivered to the bus get the stub URL appended to body.via', async (t) => {
  const { bus, conn } = await liveStub(t);
  const base = { type: 'update', from: 'hyperty://example.com/b', to: 'hyperty://example.com/a' };

  conn.send({ id: 1, ...base });
  conn.send({ id: 2, ...base, body: { value: 'x' } });
  conn.send({ id: 3, ...base, body: { value: 'y', via: [OTHER_STUB] } });
  conn.send({ id: 4, ...base, body: { via: [OTHER_STUB, STUB_URL] } });
  conn.send({ id: 5, ...base, body: null });
  await until(() => bus.messages().length === 5, 'five deliveries');

  assert.deepEqual(bus.messages(), [
    { id: 1, ...base, body: { via: [STUB_URL] } },
    { id: 2, ...base, body: { value: 'x', via: [STUB_URL] } },
    { id: 3, ...base, body: { value: 'y', via: [OTHER_STUB, STUB_URL] } },
    { id: 4, ...base, body: { via: [OTHER_STUB, STUB_URL] } },
    { id: 5, ...base, body: { via: [STUB_URL] } },
  ]);
});

test('messages already carrying the stub URL in body.via are not sent back to the node', async (t) => {
  const { bus, conn } = await liveStub(t);
  const base = { type: 'update', from: 'hyperty://example.com/a', to: 'hyperty://example.com/b' };

  bus.send({ id: 'loop', ...base, body: { via: [OTHER_STUB, STUB_URL] } });
  bus.send({ id: 'loop-string', ...base, body: { via: STUB_URL } });
  bus.send({ id: 'other', ...base, body: { via: [OTHER_STUB] } });
  await until(() => messagesOf(conn).length === 2, 'the marker');

  assert.deepEqual(messagesOf(conn).map((m) => m.id), ['hello', 'other']);
});

test('messages carrying the stub URL are not queued either', async (t) => {
  const node = await startFakeNode();
  t.after(() => node.close());
  const bus = fakeBus();
  await newStub(t, { bus, node });

  bus.send({ id: 'loop', type: 'read', from: 'a', to: 'b', body: { via: [STUB_URL] } });
  bus.send({ id: 'ok', type: 'read', from: 'a', to: 'b' });
  const conn = await until(() => node.connections[0], 'a connection');
  await until(() => messagesOf(conn).length === 1, 'the message');
  assert.deepEqual(messagesOf(conn).map((m) => m.id), ['ok']);
});

test('control frames from the node never reach the bus; cmd:error goes to onError', async (t) => {
  const errors = [];
  const { bus, conn } = await liveStub(t, { onError: (frame) => errors.push(frame) });
  const postedBefore = bus.posted.length;

  conn.send({ cmd: 'error', response: 413, desc: 'frame too large' });
  conn.send({ cmd: 'bogus', response: 400, desc: 'unknown command' });
  conn.send({ cmd: 'connect', response: 200, data: { token: 'late' } });
  conn.send({ cmd: 'disconnect', response: 200 });
  conn.send({ id: 'marker', type: 'response', from: 'x', to: 'y', body: { code: 200 } });
  await until(() => bus.posted.length > postedBefore, 'the marker');

  assert.deepEqual(bus.posted.slice(postedBefore).map((m) => m.id), ['marker']);
  assert.deepEqual(errors, [
    { cmd: 'error', response: 413, desc: 'frame too large' },
    { cmd: 'bogus', response: 400, desc: 'unknown command' },
  ]);
});

test('frames that are not JSON objects are dropped and the connection stays usable', async (t) => {
  const { bus, conn, stub } = await liveStub(t);
  t.mock.method(console, 'warn', () => {});
  const postedBefore = bus.posted.length;

  conn.ws.send('not json');
  conn.ws.send('[1, 2]');
  conn.ws.send('null');
  conn.ws.send(Buffer.from('{"binary": true}'));
  conn.send({ id: 'marker', type: 'update', from: 'x', to: 'y' });
  await until(() => bus.posted.length > postedBefore, 'the marker');

  assert.deepEqual(bus.posted.slice(postedBefore).map((m) => m.id), ['marker']);
  assert.equal(console.warn.mock.callCount(), 4);
  assert.equal(stub.status, 'live');
});

test('a message that cannot be serialised is dropped without breaking the stub', async (t) => {
  const { bus, conn } = await liveStub(t);
  t.mock.method(console, 'warn', () => {});
  const circular = { id: 'bad', type: 'update', from: 'a', to: 'b', body: {} };
  circular.body.self = circular;

  assert.doesNotThrow(() => bus.send(circular));
  bus.send({ id: 'after', type: 'update', from: 'a', to: 'b' });
  await until(() => messagesOf(conn).length === 2, 'the next message');
  assert.deepEqual(messagesOf(conn).map((m) => m.id), ['hello', 'after']);
});
