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

test('loads in a browser from <script type="module"> and works on the native WebSocket', { skip: !CHROMIUM && 'no Chromium here', timeout: 30_000 }, async (t) => {
  const node = await startFakeNode({ acks: true });
  t.after(() => node.close());

  let resolveResult;
  const result = new Promise((resolve) => (resolveResult = resolve));
  const server = http.createServer(async (req, res) => {
    if (req.url === '/') return res.writeHead(200, { 'content-type': 'text/html' }).end(page(node.url));
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
    res.writeHead(404).end();
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
    await rm(profile, { recursive: true, force: true });
  });

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
