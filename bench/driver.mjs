// Load driver for bench/run.py: opens real WebSocket stub connections (v2 handshake) to a
// Message Node (ours, or the baseline relay) and runs one scenario, printing one JSON result.
//
//   node bench/driver.mjs '{"scenario":"messaging","url":"ws://127.0.0.1:9090/stub/connect",...}'
//
// It speaks the stub protocol directly, as reTHINK's own measurements did, so the figures are the
// node's and not a runtime's.
//
// Between domains (bench/domains.py): `peer: {url, domain}` puts the other end on another node,
// of another domain: the receiver of messaging and latency, the reporter of publication. Every
// timestamp is still taken in this one process.
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import WebSocket from 'ws';

const spec = JSON.parse(process.argv[2]);
const DOMAIN = spec.domain ?? 'localhost';
const MN = `domain://msg-node.${DOMAIN}`;
const HERE = { url: spec.url, domain: DOMAIN };
const PEER = spec.peer ?? HERE;
let nextId = 1;

function payload(size) {
  // Random base64: incompressible, so no layer can flatter a figure by compressing it.
  return randomBytes(Math.ceil((size * 3) / 4) + 3).toString('base64').slice(0, size);
}

class Client {
  constructor(url, runtimeURL, domain = DOMAIN) {
    this.runtimeURL = runtimeURL;
    this.mn = `domain://msg-node.${domain}`;
    this.stubAddress = runtimeURL.replace('runtime://', 'hyperty-runtime://') + '/protostub';
    this.pending = new Map();
    this.onMessage = null;
    this.ws = new WebSocket(`${url}?runtimeURL=${encodeURIComponent(runtimeURL)}`, {
      perMessageDeflate: false,
      maxPayload: 64 * 1024 * 1024,
    });
    this.ws.on('message', (data) => this.#dispatch(data.toString()));
    this.opened = new Promise((resolve, reject) => {
      this.ws.once('open', resolve);
      this.ws.once('error', reject);
    });
  }

  #dispatch(text) {
    if (this.pending.size > 0) {
      const message = JSON.parse(text);
      const waiter = message.type === 'response' ? this.pending.get(message.id) : undefined;
      if (waiter) {
        this.pending.delete(message.id);
        waiter(message);
        return;
      }
    }
    if (this.onMessage) this.onMessage(text);
  }

  request(to, type, body, from) {
    const id = nextId++;
    const message = { id, type, from: from ?? `${this.stubAddress}/registry/allocation`, to, body };
    return new Promise((resolve) => {
      this.pending.set(id, resolve);
      this.ws.send(JSON.stringify(message));
    });
  }

  async allocate(endpoint = 'hyperty-address-allocation', scheme = 'hyperty', number = 1, key) {
    const value = { number };
    if (key) value.allocationKey = key;
    const answer = await this.request(`${this.mn}/${endpoint}`, 'create', { scheme, value });
    if (answer.body.code !== 200) throw new Error(`allocation failed: ${JSON.stringify(answer)}`);
    return answer.body.value.allocated;
  }

  close() {
    this.ws.close();
  }
}

async function connect(count, prefix, where = HERE) {
  const clients = [];
  for (let i = 0; i < count; i++) {
    clients.push(new Client(where.url, `runtime://${where.domain}/${prefix}-${i}`, where.domain));
  }
  await Promise.all(clients.map((c) => c.opened));
  return clients;
}

// A percentile that falls on a message that never arrived (Infinity) is null: "never".
function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  const value = sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
  return Number.isFinite(value) ? value : null;
}

async function allocation() {
  const [client] = await connect(1, `alloc-${spec.tag ?? 'x'}`);
  const endpoint = spec.kind === 'object' ? 'object-address-allocation' : 'hyperty-address-allocation';
  const scheme = spec.kind === 'object' ? 'comm' : 'hyperty';
  const blocks = [];
  let started = performance.now();
  for (let i = 0; i < spec.count; i++) {
    const key = spec.withKey ? `${client.stubAddress}/key-${i}` : undefined;
    const allocated = await client.allocate(endpoint, scheme, spec.number, key);
    blocks.push(key ?? allocated);
  }
  const createMs = performance.now() - started;
  started = performance.now();
  for (const block of blocks) {
    const body = typeof block === 'string' ? { resource: block } : { childrenResources: block };
    const answer = await client.request(`${MN}/${endpoint}`, 'delete', body);
    if (answer.body.code !== 200) throw new Error(`delete failed: ${JSON.stringify(answer)}`);
  }
  const deleteMs = performance.now() - started;
  client.close();
  return { create_ms: createMs, delete_ms: deleteMs };
}

// One message before the clock starts: the sender's first routed message provisions its room
// in Matrix once per runtime lifetime, which is not what these figures are about.
async function warmUp(sender, receiver, from, to) {
  const arrived = new Promise((resolve) => { receiver.onMessage = resolve; });
  sender.ws.send(JSON.stringify({ id: 'warm-up', type: 'update', from, to, body: {} }));
  const ms = spec.warmUpTimeoutMs ?? 120000;
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`warm-up message not delivered within ${ms} ms`)), ms);
  });
  await Promise.race([arrived, late]);
  clearTimeout(timer);
}

// Across domains a subscription reaches the reporter's node through Matrix some time after the
// subscriber's node answered it: until then an update does not go to the subscribers' domain.
// Updates are sent, one a second, until one reaches every subscriber.
async function untilAllSubscribed(reporter, subscribers, object, changes) {
  const deadline = performance.now() + (spec.warmUpTimeoutMs ?? 120000);
  for (let attempt = 0; performance.now() < deadline; attempt++) {
    const id = `ready-${attempt}`;
    let got = 0;
    const all = new Promise((resolve) => {
      for (const s of subscribers) {
        s.onMessage = (text) => {
          if (text.startsWith(`{"id":"${id}",`) && ++got === subscribers.length) resolve(true);
        };
      }
    });
    reporter.ws.send(JSON.stringify({ id, type: 'update', from: object, to: changes, body: {} }));
    if (await Promise.race([all, new Promise((r) => setTimeout(() => r(false), 1000))])) {
      return attempt + 1;
    }
  }
  throw new Error('the subscriptions did not take effect at the reporter\'s node in time');
}

async function messaging() {
  const [a] = await connect(1, `msg-${spec.tag ?? 'x'}-a`);
  const [b] = await connect(1, `msg-${spec.tag ?? 'x'}-b`, PEER);
  const [from] = await a.allocate();
  const [to] = await b.allocate();
  await warmUp(a, b, from, to);
  const body = payload(spec.size);
  const texts = [];
  for (let i = 0; i < spec.count; i++) {
    texts.push(JSON.stringify({ id: i, type: 'update', from, to, body: { seq: i, payload: body } }));
  }
  // A message arriving twice is counted as a duplicate, never as a second arrival: it would
  // otherwise hide a lost one.
  const seen = new Set();
  let duplicates = 0;
  let outOfOrder = 0;
  let expected = 0;
  let started = 0;
  const done = new Promise((resolve) => {
    b.onMessage = (text) => {
      const message = JSON.parse(text);
      const seq = message.body.seq;
      if (seen.has(seq)) {
        duplicates++;
        return;
      }
      seen.add(seq);
      if (seq !== expected) outOfOrder++;
      expected = seq + 1;
      if (seen.size === spec.count) resolve(performance.now());
    };
  });
  const timeout = new Promise((resolve) => setTimeout(() => resolve(null), spec.timeoutMs ?? 120000));
  started = performance.now();
  for (const text of texts) a.ws.send(text);
  const ended = await Promise.race([done, timeout]);
  a.close();
  b.close();
  return {
    ms: ended === null ? null : ended - started,
    received: seen.size,
    lost: spec.count - seen.size,
    out_of_order: outOfOrder,
    duplicates,
  };
}

async function publication() {
  const [reporter] = await connect(1, `pub-${spec.tag ?? 'x'}`, PEER);
  // Set-up (all subscribers connecting at once, then all subscribing at once) is timed too: it
  // is what a crowd of runtimes joining costs, sessions and subscriptions written durably.
  const setupStarted = performance.now();
  const subscribers = await connect(spec.subscribers, `sub-${spec.tag ?? 'x'}`);
  const connected = performance.now();
  const [object] = await reporter.allocate(spec.objectEndpoint ?? 'object-address-allocation', 'comm');
  const changes = `${object}/changes`;
  const subscribing = performance.now();
  const answers = await Promise.all(subscribers.map((s) =>
    s.request(`${s.mn}/sm`, 'subscribe', { resources: [changes] }, `${s.stubAddress}/sm`)));
  const subscribed = performance.now();
  const refused = answers.filter((a) => a.body.code !== 200).length;
  if (refused) throw new Error(`${refused} subscriptions refused: ${JSON.stringify(answers[0])}`);
  const setup = {
    connect_ms: connected - setupStarted,
    subscribe_ms: subscribed - subscribing,
    setup_ms: connected - setupStarted + (subscribed - subscribing),
  };
  const readyAfter = await untilAllSubscribed(reporter, subscribers, object, changes);
  await new Promise((r) => setTimeout(r, 300));
  const rounds = [];
  // The first rounds run while V8 is still compiling this driver's receive path (1,000 sockets
  // at once): two unmeasured rounds, so the figures are the node's, not the instrument's.
  const warmUpRounds = spec.warmUpRounds ?? 2;
  for (let round = -warmUpRounds; round < (spec.rounds ?? 3); round++) {
    const got = new Set(); // the subscribers that have this round's update
    let duplicates = 0;
    const prefix = `{"id":"u${round}",`;
    const done = new Promise((resolve) => {
      subscribers.forEach((s, k) => {
        s.onMessage = (text) => {
          // The frame is the reporter's text unmodified, so its start identifies the round.
          if (!text.startsWith(prefix)) return;
          if (got.has(k)) duplicates++;
          got.add(k);
          if (got.size === subscribers.length) resolve(performance.now());
        };
      });
    });
    const timeout = new Promise((resolve) => setTimeout(() => resolve(null), spec.timeoutMs ?? 60000));
    const started = performance.now();
    reporter.ws.send(JSON.stringify({
      id: `u${round}`, type: 'update', from: object, to: changes, body: { value: payload(spec.size) },
    }));
    const ended = await Promise.race([done, timeout]);
    await new Promise((r) => setTimeout(r, 200)); // a late second copy is still counted
    if (round >= 0) rounds.push({ ms: ended === null ? null : ended - started, received: got.size, duplicates });
  }
  reporter.close();
  for (const s of subscribers) s.close();
  return { rounds, ready_after_updates: readyAfter, ...setup };
}

async function latency() {
  const [a] = await connect(1, `lat-${spec.tag ?? 'x'}-a`);
  const [b] = await connect(1, `lat-${spec.tag ?? 'x'}-b`, PEER);
  const [from] = await a.allocate();
  const [to] = await b.allocate();
  await warmUp(a, b, from, to);
  const latencies = [];
  const seen = new Set();
  let duplicates = 0;
  const done = new Promise((resolve) => {
    b.onMessage = (text) => {
      const message = JSON.parse(text);
      if (seen.has(message.id)) {
        duplicates++; // a second copy is no second sample
        return;
      }
      seen.add(message.id);
      latencies.push(performance.now() - message.body.sent);
      if (latencies.length === spec.count) resolve();
    };
  });
  const interval = 1000 / spec.rate;
  const body = payload(spec.size ?? 100);
  const started = performance.now();
  for (let i = 0; i < spec.count; i++) {
    const due = started + i * interval;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    a.ws.send(JSON.stringify({ id: i, type: 'update', from, to, body: { sent: performance.now(), payload: body } }));
  }
  await Promise.race([done, new Promise((r) => setTimeout(r, 30000))]);
  a.close();
  b.close();
  const received = latencies.length;
  // What never arrived counts as infinitely late: percentiles over arrivals alone would flatter.
  while (latencies.length < spec.count) latencies.push(Infinity);
  latencies.sort((x, y) => x - y);
  return {
    received,
    duplicates,
    p50_ms: percentile(latencies, 50),
    p99_ms: percentile(latencies, 99),
    max_ms: percentile(latencies, 100),
  };
}

async function idle() {
  const clients = [];
  for (let i = 0; i < spec.count; i += 200) {
    clients.push(...(await connect(Math.min(200, spec.count - i), `idle-${spec.tag ?? 'x'}-${i}`)));
  }
  process.stdout.write(JSON.stringify({ open: clients.length }) + '\n');
  // Hold the connections until the orchestrator has measured, then close them.
  const lines = createInterface({ input: process.stdin });
  for await (const _ of lines) break;
  for (const c of clients) c.close();
  return { closed: clients.length };
}

const scenarios = { allocation, messaging, publication, latency, idle };
try {
  const result = await scenarios[spec.scenario]();
  process.stdout.write(JSON.stringify(result) + '\n');
  process.exit(0);
} catch (error) {
  process.stdout.write(JSON.stringify({ error: String(error?.stack ?? error) }) + '\n');
  process.exit(1);
}
