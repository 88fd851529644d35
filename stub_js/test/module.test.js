import assert from 'node:assert/strict';
import { copyFile, mkdtemp, readFile, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { pathToFileURL } from 'node:url';
import { WebSocket as WsWebSocket } from 'ws';
import activate, { MatrixProtoStub, activate as namedActivate } from '../src/index.js';
import { RUNTIME_URL, STUB_URL, fakeBus, startFakeNode, until, within } from '../test-support/fake-node.js';

const SRC = new URL('../src/', import.meta.url);

test('activate(url, bus, config) returns {name, instance}; it is also the default export', (t) => {
  const bus = fakeBus();
  const { name, instance } = activate(STUB_URL, bus, { runtimeURL: RUNTIME_URL, messagingnode: 'ws://127.0.0.1:1/stub/connect' });
  t.after(() => instance.disconnect());

  assert.equal(namedActivate, activate);
  assert.equal(name, 'MatrixProtoStub');
  assert.ok(instance instanceof MatrixProtoStub);
  assert.equal(instance.runtimeProtoStubURL, STUB_URL);
  assert.equal(instance.status, 'created');
  assert.deepEqual(bus.posted, [{ type: 'update', from: STUB_URL, to: `${STUB_URL}/status`, body: { value: 'created' } }]);
});

test('the constructor rejects an unusable configuration at once', () => {
  const bus = fakeBus();
  const node = 'ws://127.0.0.1:1/stub/connect';
  assert.throws(() => new MatrixProtoStub(STUB_URL, bus, { messagingnode: node }), /runtimeURL is required/);
  assert.throws(() => new MatrixProtoStub(STUB_URL, bus, { runtimeURL: RUNTIME_URL }), /messagingnode \(or url\) is required/);
  assert.throws(() => new MatrixProtoStub(STUB_URL, bus, { runtimeURL: RUNTIME_URL, messagingnode: node, handshake: 'v3' }), /handshake must be/);
  assert.throws(() => new MatrixProtoStub(STUB_URL, {}, { runtimeURL: RUNTIME_URL, messagingnode: node }), /bus must have/);
  assert.throws(() => new MatrixProtoStub('', bus, { runtimeURL: RUNTIME_URL, messagingnode: node }), /runtimeProtoStubURL is required/);
  assert.deepEqual(bus.posted, [], 'nothing posted by a stub that was never built');
});

test('the source imports nothing statically and uses no Node.js globals, so browsers load it as is', async () => {
  for (const file of await readdir(SRC)) {
    const source = await readFile(new URL(file, SRC), 'utf8');
    assert.doesNotMatch(source, /^\s*import\s[^(]/m, `${file}: static import`);
    assert.doesNotMatch(source, /\brequire\(|\bprocess\.|\bBuffer\b|\b__dirname\b/, `${file}: Node.js global`);
  }
});

test('loaded where `ws` cannot be resolved, it uses the global WebSocket', async (t) => {
  // A copy outside the package stands in for a browser fetching the module from a URL.
  const dir = await mkdtemp(join(tmpdir(), 'protostub-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await copyFile(new URL('index.js', SRC), join(dir, 'index.js'));
  const { MatrixProtoStub: Isolated } = await import(pathToFileURL(join(dir, 'index.js')).href);

  const opened = [];
  const previous = globalThis.WebSocket;
  globalThis.WebSocket = class extends WsWebSocket {
    constructor(url) {
      super(url);
      opened.push(url);
    }
  };
  t.after(() => {
    globalThis.WebSocket = previous;
  });

  const node = await startFakeNode();
  t.after(() => node.close());
  const bus = fakeBus();
  const stub = new Isolated(STUB_URL, bus, { runtimeURL: RUNTIME_URL, messagingnode: node.url });
  t.after(() => stub.disconnect());

  bus.send({ id: 1, type: 'read', from: 'a', to: 'b' });
  await until(() => stub.status === 'live', 'live');
  assert.deepEqual(opened, [node.url]);
});

test('a WebSocket constructor given in the configuration takes precedence', async (t) => {
  const opened = [];
  class Recording extends WsWebSocket {
    constructor(url) {
      super(url);
      opened.push(url);
    }
  }
  const node = await startFakeNode();
  t.after(() => node.close());
  const bus = fakeBus();
  const stub = new MatrixProtoStub(STUB_URL, bus, { runtimeURL: RUNTIME_URL, messagingnode: node.url, WebSocket: Recording });
  t.after(() => stub.disconnect());

  assert.equal(await within(stub.connect(), 'connect()'), 'live');
  assert.deepEqual(opened, [node.url]);
});

test('reTHINK runtime-core deploys it as `new result.default()` then `_start(url, bus, config, factory)`', async (t) => {
  const node = await startFakeNode();
  t.after(() => node.close());
  const stub = new MatrixProtoStub();
  assert.equal(stub.status, undefined, 'idle until started');
  const bus = fakeBus();
  const factory = {}; // the sandbox's component factory, which the stub does not need
  stub._start(STUB_URL, bus, { runtimeURL: RUNTIME_URL, messagingnode: node.url }, factory);
  t.after(() => stub.disconnect());

  assert.deepEqual(bus.statuses(), ['created']);
  bus.send({ id: 1, type: 'read', from: 'hyperty://example.com/a', to: 'hyperty://example.com/b' });
  await until(() => stub.status === 'live', 'live');
  assert.equal(node.connections[0].frames[0].data.runtimeURL, RUNTIME_URL);
  assert.throws(() => stub._start(STUB_URL, bus, { runtimeURL: RUNTIME_URL, messagingnode: node.url }), /started already/);
  assert.throws(() => new MatrixProtoStub()._start(STUB_URL, bus, { runtimeURL: RUNTIME_URL }), /messagingnode/);
});

test('every export is in the block that ends the file, which the node replaces to serve the other forms', async () => {
  const source = await readFile(new URL('index.js', SRC), 'utf8');
  const marker = source.indexOf('\n// exports:');
  assert.ok(marker > 0, 'the exports block is marked');
  assert.doesNotMatch(source.slice(0, marker), /^\s*export\b/m, 'an export above the block');
  const block = source.slice(marker).split('\n').filter((line) => line && !line.startsWith('//'));
  assert.deepEqual(block, ['export { MatrixProtoStub, activate };', 'export default activate;']);
});
