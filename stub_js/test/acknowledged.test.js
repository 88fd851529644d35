import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fakeBus, messagesOf, newStub, sleep, startFakeNode, until } from '../test-support/fake-node.js';

const msg = (id) => ({ id, type: 'update', from: 'hyperty://example.com/a', to: 'hyperty://example.com/b', body: { n: id } });

async function ackingStub(t, config = {}, nodeOptions = {}) {
  const node = await startFakeNode({ acks: true, hello: true, ...nodeOptions });
  t.after(() => node.close());
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node, acknowledged: true, ...config });
  return { node, bus, stub };
}

test('messages are numbered and kept until the node acknowledges them', async (t) => {
  const { node, bus, stub } = await ackingStub(t);
  node.holdAcks = true;
  for (let i = 1; i <= 3; i += 1) bus.send(msg(i));
  const conn = await until(() => node.connections[0], 'a connection');
  await until(() => conn.seqs.length === 3, 'three numbered messages');

  assert.deepEqual(conn.seqs, [1, 2, 3]);
  assert.deepEqual(messagesOf(conn), [msg(1), msg(2), msg(3)]);
  assert.deepEqual(stub.stats, { sent: 3, acknowledged: 0, delivered: 0, duplicates: 0, returned: 0, unacknowledged: 3, unrecorded: 0, held: 0 });

  conn.send({ cmd: 'ack', seq: 2 });
  await until(() => stub.stats.acknowledged === 2, 'two acknowledged');
  assert.equal(stub.stats.unacknowledged, 1);
});

test('what was not acknowledged is sent again, in order, after a reconnect, and taken once', async (t) => {
  const { node, bus, stub } = await ackingStub(t);
  node.holdAcks = true;
  for (let i = 1; i <= 4; i += 1) bus.send(msg(i));
  const first = await until(() => node.connections[0], 'a connection');
  await until(() => first.seqs.length === 4, 'four messages');
  first.send({ cmd: 'ack', seq: 1 }); // only the first is durable
  await until(() => stub.stats.acknowledged === 1, 'the first acknowledged');

  first.ws.terminate(); // a network drop
  bus.send(msg(5)); // while down
  const second = await until(() => node.connections[1], 'a reconnection');
  await until(() => second.seqs.length === 1 && node.duplicates === 3, 'the resend');

  // The node took 2, 3 and 4 on the first connection; the resend carries them again (the node
  // recognises them), then 5: each message taken once, in order.
  assert.equal(second.offer.stub, first.offer.stub, 'the same stub instance');
  assert.deepEqual([...first.seqs, ...second.seqs], [1, 2, 3, 4, 5]);
  second.send({ cmd: 'ack', seq: 5 });
  await until(() => stub.stats.unacknowledged === 0, 'everything acknowledged');
  assert.equal(stub.stats.acknowledged, 5);
});

test('the connect answer says what is durable already: that is not sent again', async (t) => {
  const { node, bus, stub } = await ackingStub(t);
  node.holdAcks = true;
  for (let i = 1; i <= 3; i += 1) bus.send(msg(i));
  const first = await until(() => node.connections[0], 'a connection');
  await until(() => first.seqs.length === 3, 'three messages');

  node.holdAcks = false; // the answer to the reconnect carries seq 3
  first.ws.terminate();
  const second = await until(() => node.connections[1], 'a reconnection');
  await until(() => stub.stats.unacknowledged === 0, 'acknowledged by the answer');
  await sleep(30);
  assert.equal(node.duplicates, 0);
  assert.deepEqual(second.seqs, []);
});

test('deliveries are handed on once: a repeated number, or the same origin message again, is dropped', async (t) => {
  const { node, bus, stub } = await ackingStub(t);
  bus.send(msg('hello'));
  const conn = await until(() => node.connections[0], 'a connection');
  await until(() => stub.status === 'live', 'live');

  conn.deliver(msg('a'), 10, 'peer.1', 1);
  conn.deliver(msg('b'), 11, 'peer.1', 2);
  conn.deliver(msg('b'), 11, 'peer.1', 2); // the same delivery again (a resend)
  conn.deliver(msg('b'), 12, 'peer.1', 2); // carried twice by the node: new number, same origin message
  conn.deliver(msg('c'), 13, 'peer.2', 1); // another origin numbers from 1 too
  conn.deliver({ id: 'answer', type: 'response', from: 'x', to: 'y', body: { code: 200 } }, 14); // the node's own
  await until(() => stub.stats.delivered === 4, 'four handed on');
  await sleep(40);

  assert.deepEqual(bus.messages().map((m) => m.id), ['a', 'b', 'c', 'answer']);
  assert.equal(stub.stats.duplicates, 2);
  // Acknowledged cumulatively, in one or two frames rather than one per delivery.
  const acks = conn.frames.filter((f) => f.cmd === 'ack');
  assert.ok(acks.length >= 1 && acks.length <= 2, `${acks.length} ack frames`);
  assert.equal(acks.at(-1).received, 14);
});

test('a reconnect says how far the deliveries got; a new session starts the numbering again', async (t) => {
  const { node, bus, stub } = await ackingStub(t);
  bus.send(msg(1));
  const first = await until(() => node.connections[0], 'a connection');
  await until(() => stub.status === 'live', 'live');
  first.deliver(msg('x'), 41, 'peer.1', 1);
  await until(() => stub.stats.delivered === 1, 'delivered');

  first.ws.terminate();
  const second = await until(() => node.connections[1], 'a reconnection');
  await until(() => second.offer, 'the resume offer');
  assert.equal(second.offer.received, 41);

  await stub.disconnect();
  bus.send(msg(2)); // a fresh session
  const third = await until(() => node.connections[2], 'a new session');
  await until(() => third.offer, 'its offer');
  assert.equal(third.offer.received, 0);
});

test('a node that does not speak the protocol gets plain frames', async (t) => {
  const node = await startFakeNode(); // answers connect, without data.ack
  t.after(() => node.close());
  const bus = fakeBus();
  const stub = await newStub(t, { bus, node, acknowledged: true });
  bus.send(msg(1));
  bus.send(msg(2));
  const conn = await until(() => node.connections[0], 'a connection');
  await until(() => messagesOf(conn).length === 2, 'both');

  assert.equal(conn.frames[0].data.ack.v, 1, 'offered');
  assert.deepEqual(conn.seqs, []);
  assert.deepEqual(messagesOf(conn), [msg(1), msg(2)]);
  assert.equal(stub.stats.unacknowledged, 0, 'a plain node has them once written');
});

test('v2 with the acknowledged protocol: the offer is in the query and the node answers first', async (t) => {
  const { node, bus, stub } = await ackingStub(t, { handshake: 'v2' });
  bus.send(msg(1));
  const conn = await until(() => node.connections[0], 'a connection');
  await until(() => stub.stats.acknowledged === 1, 'acknowledged');

  assert.equal(conn.query.get('ack'), '1');
  assert.match(conn.query.get('stub'), /^[A-Za-z0-9_-]{8,32}$/);
  assert.deepEqual(conn.seqs, [1]);
});
