// Loads the module in headless Chromium from a plain <script type="module">, no bundler, and lets
// it talk to the fake node over the browser's own WebSocket. Skipped where no Chromium is installed.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { RUNTIME_URL, STUB_URL, messagesOf, startFakeNode, until } from '../test-support/fake-node.js';

const CHROMIUM = ['chromium', 'chromium-browser', 'google-chrome'].find(
  (name) => spawnSync(name, ['--version'], { stdio: 'ignore' }).status === 0,
);

function page(nodeURL) {
  return `<!doctype html>
<script type="module">
  import activate from '/src/index.js';
  const posted = [];
  const listeners = [];
  const bus = { postMessage: (m) => posted.push(m), addListener: (type, cb) => listeners.push(cb) };
  const { name, instance } = activate(${JSON.stringify(STUB_URL)}, bus, {
    runtimeURL: ${JSON.stringify(RUNTIME_URL)},
    messagingnode: ${JSON.stringify(nodeURL)},
  });
  for (const cb of listeners) cb({ id: 1, type: 'create', from: 'hyperty://example.com/a', to: 'hyperty://example.com/b' });
  const deadline = Date.now() + 5000;
  while (!posted.some((m) => m.body?.value === 'echo') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  await instance.disconnect();
  await fetch('/result', { method: 'POST', body: JSON.stringify({ name, posted, hasGlobalWebSocket: typeof WebSocket }) });
</script>`;
}

/**
 * Serves `pages` (path -> HTML or script text) and the stub's source at /src/index.js on
 * 127.0.0.1, opens `/` in headless Chromium and resolves `result` with what the page POSTs to
 * /result. Everything is stopped when the test ends.
 */
async function browse(t, pages) {
  let resolveResult;
  const result = new Promise((resolve) => (resolveResult = resolve));
  const server = http.createServer(async (req, res) => {
    if (req.url === '/src/index.js') {
      const source = await readFile(new URL('../src/index.js', import.meta.url));
      return res.writeHead(200, { 'content-type': 'text/javascript' }).end(source);
    }
    if (req.url === '/result') {
      let body = '';
      for await (const chunk of req) body += chunk;
      res.writeHead(204).end();
      return resolveResult(JSON.parse(body));
    }
    const page = pages[req.url];
    if (page === undefined) return res.writeHead(404).end();
    const type = req.url === '/' ? 'text/html' : 'text/javascript';
    res.writeHead(200, { 'content-type': type }).end(page);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));

  const profile = await mkdtemp(join(tmpdir(), 'protostub-chromium-'));
  const browser = spawn(
    CHROMIUM,
    ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', `--user-data-dir=${profile}`, `http://127.0.0.1:${server.address().port}/`],
    { stdio: 'ignore' },
  );
  t.after(async () => {
    browser.kill();
    await new Promise((resolve) => (browser.exitCode === null ? browser.once('exit', resolve) : resolve()));
    server.closeAllConnections(); // the browser's keep-alive connections would hold close() open
    await new Promise((resolve) => server.close(resolve));
    // Chromium's helper processes may still be writing the profile after the main one exits.
    await rm(profile, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
  });
  return result;
}

test('loads in a browser from <script type="module"> and works on the native WebSocket', { skip: !CHROMIUM && 'no Chromium here', timeout: 30_000 }, async (t) => {
  const node = await startFakeNode({ acks: true });
  t.after(() => node.close());
  const result = browse(t, { '/': page(node.url) });

  const conn = await until(() => node.connections[0], 'the browser to connect', 20_000);
  await until(() => messagesOf(conn).length === 1, 'the message');
  const echo = { id: 2, type: 'update', from: 'hyperty://example.com/b', to: 'hyperty://example.com/a', body: { value: 'echo' } };
  conn.deliver(echo, 7, 'peer.x', 3);
  conn.deliver(echo, 8, 'peer.x', 3); // the same message carried twice: not handed on again
  const { name, posted, hasGlobalWebSocket } = await result;

  assert.equal(hasGlobalWebSocket, 'function');
  assert.equal(name, 'MatrixProtoStub');
  // The acknowledged protocol, spoken on the browser's own WebSocket.
  assert.equal(conn.frames[0].cmd, 'connect');
  assert.equal(conn.frames[0].data.runtimeURL, RUNTIME_URL);
  assert.equal(conn.frames[0].data.ack.v, 1);
  assert.deepEqual(conn.seqs, [1]);
  assert.equal(posted.filter((m) => m.id === 2).length, 1);
  assert.deepEqual(
    posted.filter((m) => m.to === `${STUB_URL}/status`).map((m) => m.body.value),
    ['created', 'in-progress', 'live', 'disconnected'],
  );
  assert.deepEqual(posted.find((m) => m.id === 2).body, { value: 'echo', via: [STUB_URL] });
  assert.equal(conn.frames.at(-1).cmd, 'disconnect');
});

// A Worker has no localStorage: the session goes to IndexedDB, where the next Worker of the same
// runtime (reTHINK's browser runtime runs stubs in one, and a reload makes a new one) finds it.
function workerPage(nodeURL) {
  return `<!doctype html>
<script type="module">
  const said = (worker) => new Promise((resolve) => (worker.onmessage = (event) => resolve(event.data)));
  const first = new Worker('/worker.js', { type: 'module' });
  first.postMessage(${JSON.stringify(nodeURL)});
  const before = await said(first);
  first.terminate(); // gone without a word, as in a reload
  const second = new Worker('/worker.js', { type: 'module' });
  second.postMessage(${JSON.stringify(nodeURL)});
  const after = await said(second);
  await fetch('/result', { method: 'POST', body: JSON.stringify({ before, after, hasLocalStorage: typeof localStorage }) });
</script>`;
}

const WORKER = `
import activate from '/src/index.js';
onmessage = async ({ data: nodeURL }) => {
  const posted = [];
  const listeners = [];
  const bus = { postMessage: (m) => posted.push(m), addListener: (type, cb) => listeners.push(cb) };
  const { instance } = activate(${JSON.stringify(STUB_URL)}, bus, { runtimeURL: ${JSON.stringify(RUNTIME_URL)}, messagingnode: nodeURL });
  for (const cb of listeners) cb({ id: 1, type: 'create', from: 'hyperty://example.com/a', to: 'hyperty://example.com/b' });
  // Settled once what was delivered is acknowledged and the session store holds it.
  while (!(instance.stats.delivered > 0 && instance.stats.unrecorded === 0)) await new Promise((r) => setTimeout(r, 10));
  postMessage({ stats: instance.stats, inWorker: typeof WorkerGlobalScope === 'function' && self instanceof WorkerGlobalScope, localStorage: typeof localStorage });
};
`;

test('in a Web Worker the session is kept in IndexedDB: the next Worker of the runtime resumes it', { skip: !CHROMIUM && 'no Chromium here', timeout: 30_000 }, async (t) => {
  const node = await startFakeNode({ acks: true });
  t.after(() => node.close());
  const result = browse(t, { '/': workerPage(node.url), '/worker.js': WORKER });

  const echo = (n) => ({ id: n, type: 'update', from: 'hyperty://example.com/b', to: 'hyperty://example.com/a', body: { n } });
  const first = await until(() => node.connections[0], 'the first Worker to connect', 20_000);
  await until(() => messagesOf(first).length === 1, 'its message'); // live
  first.deliver(echo(1), 1, 'peer.x', 1);
  first.deliver(echo(2), 2, 'peer.x', 2);
  const second = await until(() => node.connections[1], 'the second Worker to connect', 20_000);
  await until(() => messagesOf(second).length === 1, 'its message');
  second.deliver(echo(3), 3, 'peer.x', 3);
  const { before, after } = await result;

  assert.equal(before.inWorker, true);
  assert.equal(before.localStorage, 'undefined');
  assert.equal(before.stats.delivered, 2);
  assert.ok(first.token, 'the node gave the first Worker a token');
  assert.equal(second.frames[0].data.token, first.token, 'the second Worker presents it');
  assert.equal(second.frames[0].data.ack.received, 2, 'and says how far the deliveries got');
  assert.equal(after.stats.delivered, 1);
  assert.equal(after.stats.duplicates, 0);
});
