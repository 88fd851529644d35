import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fakeBus, fakeJwt, newStub, sleep, startFakeNode, until } from '../test-support/fake-node.js';

async function nodeFor(t, options) {
  const node = await startFakeNode(options);
  t.after(() => node.close());
  return node;
}

const msg = (id) => ({ id, type: 'ping', from: 'hyperty://example.com/a', to: 'hyperty://example.com/b' });
const now = () => Math.floor(Date.now() / 1000);
const authFrames = (conn) => conn.frames.filter((f) => f.cmd === 'auth');

test('setCredential sends {cmd: auth} on the live socket, resolves with the answer, and later connections present it', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const first = fakeJwt({ sub: 'alice', exp: now() + 600 });
  const stub = await newStub(t, { bus, node, credentials: { type: 'oidc', token: first } });
  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  const conn = node.connections[0];
  assert.deepEqual(conn.frames[0].data.auth, { type: 'oidc', token: first });

  const fresh = fakeJwt({ sub: 'alice', exp: now() + 3600 });
  const answer = await stub.setCredential({ type: 'oidc', token: fresh });
  assert.equal(answer.response, 200);
  assert.equal(answer.data.expires, now() + 3600);
  assert.deepEqual(authFrames(conn), [{ cmd: 'auth', data: { type: 'oidc', token: fresh } }]);
  assert.equal(stub.status, 'live');

  conn.ws.terminate();
  const second = await until(() => node.connections[1]?.frames[0], 'a reconnection');
  assert.deepEqual(second.data.auth, { type: 'oidc', token: fresh }, 'the fresh credential goes with the reconnect');
});

test('a refused credential resolves with the refusal and leaves the connection alone', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node, credentials: { type: 'oidc', token: fakeJwt({ sub: 'alice', exp: now() + 600 }) } });
  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  node.answerAuth = () => ({ cmd: 'auth', response: 403, desc: 'the credential is for another identity' });

  const answer = await stub.setCredential({ type: 'oidc', token: fakeJwt({ sub: 'mallory', exp: now() + 600 }) });
  assert.equal(answer.response, 403);
  assert.match(answer.desc, /another identity/);
  assert.equal(stub.status, 'live');
  bus.send(msg(2));
  await until(() => node.connections[0].frames.some((f) => f.id === 2), 'the next message on the same socket');
  assert.equal(node.connections.length, 1);
});

test('setCredential without a live connection keeps it for the next one', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node });
  const token = fakeJwt({ sub: 'alice', exp: now() + 600 });
  const answer = await stub.setCredential(async () => ({ type: 'oidc', token }));
  assert.equal(answer.response, null);
  assert.equal(node.connections.length, 0);

  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  assert.deepEqual(node.connections[0].frames[0].data.auth, { type: 'oidc', token });
  assert.equal(authFrames(node.connections[0]).length, 0);
});

test('a credentials function is asked for a fresh token before exp, which is sent on the open socket', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const issued = [];
  const credentials = () => {
    // Short-lived tokens: the first ends in about a second.
    const token = fakeJwt({ sub: 'alice', exp: now() + (issued.length ? 3600 : 1), n: issued.length });
    issued.push(token);
    return { type: 'oidc', token };
  };
  const stub = await newStub(t, { bus, node, credentials, refreshBefore: 60_000 });
  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  const conn = node.connections[0];
  assert.equal(conn.frames[0].data.auth.token, issued[0]);

  await until(() => authFrames(conn).length === 1, 'an auth frame before exp', 3000);
  assert.deepEqual(authFrames(conn)[0], { cmd: 'auth', data: { type: 'oidc', token: issued[1] } });
  // The fresh token lives an hour: nothing more is asked for now.
  await sleep(300);
  assert.equal(authFrames(conn).length, 1);
  assert.equal(issued.length, 2);
});

test('a credentials function that gives no fresher token is not asked in a loop', async (t) => {
  const node = await nodeFor(t);
  const bus = fakeBus();
  const token = fakeJwt({ sub: 'alice', exp: now() + 1 });
  let asked = 0;
  const stub = await newStub(t, { bus, node, credentials: () => ((asked += 1), { type: 'oidc', token }) });
  t.mock.method(console, 'warn', () => {});
  bus.send(msg(1));
  await until(() => stub.status === 'live', 'live');
  await sleep(1500);
  assert.equal(authFrames(node.connections[0]).length, 0, 'the same token is not sent again');
  assert.equal(asked, 2, 'asked once to connect, once before exp');
  assert.match(console.warn.mock.calls[0].arguments.join(' '), /no fresher token/);
});
