// Crowd driver for bench/crowd.py: many runtimes talking at once.
//
// One process drives a shard of the crowd: for each global sender index g with
// g % shards === shard, a sender runtime and a receiver runtime on their own raw stub
// connections (v2 handshake, as bench/driver.mjs). Every runtime allocates a hyperty; the sender
// sends small messages at a fixed rate to its partner's hyperty. Send and receive times come from
// this process's monotonic clock, so every latency is measured inside one process.
//
//   node bench/crowd.mjs '{"url":"ws://…/stub/connect","senders":200,"shard":0,"shards":1,…}'
//
// With "peer": {"url", "domain"}, the receivers are runtimes of that other domain, connected to
// its node: every message crosses from one domain to the other (bench/domains.py).
//
// The orchestrator drives the timeline over stdin, so that several driver processes start
// together (times are wall-clock epoch milliseconds, converted once to this process's clock):
//   setup <epoch>   every runtime connects, allocates and each sender sends a first message;
//                   prints {"event":"setup",…} once every first message arrived (or timed out)
//   run <epoch>     sender g sends message k at epoch + (g / senders + k) × period: phases spread
//                   evenly over the period across the whole crowd; warm-up, then the measured
//                   window, then a drain; prints {"event":"result",…} and exits
// It prints {"event":"ready"} first, and {"error":…} if anything breaks.
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import WebSocket from 'ws';

const spec = JSON.parse(process.argv[2]);
const DOMAIN = spec.domain ?? 'localhost';
const RECEIVERS = spec.peer ?? { url: spec.url, domain: DOMAIN };
const N = spec.senders;
const SHARD = spec.shard ?? 0;
const SHARDS = spec.shards ?? 1;
const RATE = spec.rate;
const PERIOD = 1000 / RATE;
const SIZE = spec.size ?? 300;
const WARMUP_MS = (spec.warmupS ?? 5) * 1000;
const DURATION_MS = spec.durationS * 1000;
const DRAIN_MS = (spec.drainS ?? 30) * 1000;
const SETUP_TIMEOUT_MS = (spec.setupTimeoutS ?? 120) * 1000;
const TAG = spec.tag ?? 'x';

// Random base64, incompressible: a message's payload is a slice of this at a varying offset.
const POOL = randomBytes(48 * 1024).toString('base64');
function payload(k) {
  const offset = (k * 7919) % (POOL.length - SIZE);
  return POOL.slice(offset, offset + SIZE);
}

// Writes to a pipe are asynchronous: wait for a line to be flushed (a result line is large, and
// process.exit would cut it short).
function out(line) {
  return new Promise((resolve) => process.stdout.write(JSON.stringify(line) + '\n', resolve));
}

function epochToPerf(epochMs) {
  return performance.now() + (epochMs - Date.now());
}

function sleepUntil(perfMs) {
  const wait = perfMs - performance.now();
  return wait > 0 ? new Promise((r) => setTimeout(r, wait)) : Promise.resolve();
}

let nextId = 1;

class Runtime {
  constructor(name, domain = DOMAIN) {
    this.runtimeURL = `runtime://${domain}/${name}`;
    this.stubAddress = `hyperty-runtime://${domain}/${name}/protostub`;
    this.allocation = `domain://msg-node.${domain}/hyperty-address-allocation`;
    this.pending = new Map();
    this.onData = null; // (text) => void, for frames that are not answers to a request
  }

  open(url) {
    this.ws = new WebSocket(`${url}?runtimeURL=${encodeURIComponent(this.runtimeURL)}`, {
      perMessageDeflate: false,
      maxPayload: 64 * 1024 * 1024,
    });
    this.ws.on('message', (data) => {
      const text = data.toString();
      if (this.pending.size > 0 && text.includes('"response"')) {
        const message = JSON.parse(text);
        const waiter = message.type === 'response' ? this.pending.get(message.id) : undefined;
        if (waiter) {
          this.pending.delete(message.id);
          waiter(message, null);
          return;
        }
      }
      if (this.onData) this.onData(text);
    });
    // A request still waiting when the connection closes fails instead of hanging.
    this.ws.on('close', (code) => {
      for (const waiter of this.pending.values()) waiter(null, code);
      this.pending.clear();
    });
    return new Promise((resolve, reject) => {
      this.ws.once('open', resolve);
      this.ws.once('error', reject);
      this.ws.once('unexpected-response', (_req, res) => reject(new Error(`HTTP ${res.statusCode}`)));
    });
  }

  async allocate() {
    const id = nextId++;
    const answer = await new Promise((resolve, reject) => {
      this.pending.set(id, (message, closed) => {
        if (message) resolve(message);
        else reject(new Error(`connection closed (${closed}) before the allocation was answered`));
      });
      this.ws.send(JSON.stringify({
        id, type: 'create', from: `${this.stubAddress}/registry/allocation`,
        to: this.allocation, body: { scheme: 'hyperty', value: { number: 1 } },
      }));
    });
    if (answer.body?.code !== 200) throw new Error(`allocation failed: ${JSON.stringify(answer.body)}`);
    return answer.body.value.allocated[0];
  }
}

// -- the crowd of this shard ---------------------------------------------------------------------

const globalIndex = [];
for (let g = SHARD; g < N; g += SHARDS) globalIndex.push(g);
const n = globalIndex.length;
// Rounds k = 0 … ROUNDS-1 are sent; k < WARMUP_ROUNDS… is decided per message by its due time.
const ROUNDS = Math.ceil(((WARMUP_MS + DURATION_MS) / 1000) * RATE) + 1;
const pairs = globalIndex.map((g) => ({
  g,
  sender: new Runtime(`crowd-${TAG}-s${g}`),
  receiver: new Runtime(`crowd-${TAG}-r${g}`, RECEIVERS.domain),
  from: null,
  to: null,
  ok: false,
  firstSent: 0,
  firstArrived: 0,
  maxSeq: -1,
}));
const sentAt = new Float64Array(n * ROUNDS).fill(-1);
const arrivedAt = new Float64Array(n * ROUNDS).fill(-1);
const counters = {
  out_of_order: 0, duplicates: 0, unexpected: 0, sender_responses: {}, closed: 0,
  arrived_in_window: 0,
};
let windowStart = Infinity;
let windowEnd = Infinity;
let measuredOutstanding = 0;
let onMeasuredDone = null;

function receive(i, text) {
  const pair = pairs[i];
  let message;
  try {
    message = JSON.parse(text);
  } catch {
    counters.unexpected++;
    return;
  }
  const now = performance.now();
  const seq = message?.body?.seq;
  if (typeof seq !== 'number') {
    counters.unexpected++;
    return;
  }
  if (seq === -1) {
    if (pair.firstArrived === 0) pair.firstArrived = now;
    else counters.duplicates++;
    return;
  }
  const slot = i * ROUNDS + seq;
  if (seq < 0 || seq >= ROUNDS || sentAt[slot] < 0) {
    counters.unexpected++;
    return;
  }
  if (arrivedAt[slot] >= 0) {
    counters.duplicates++;
    return;
  }
  arrivedAt[slot] = now;
  if (seq < pair.maxSeq) counters.out_of_order++;
  else pair.maxSeq = seq;
  if (now >= windowStart && now < windowEnd) counters.arrived_in_window++;
  if (isMeasured(seq, i) && --measuredOutstanding === 0 && onMeasuredDone) onMeasuredDone();
}

function senderFrame(text) {
  // A routed message gets no answer; anything a sender receives is an error answer (404, 503…).
  let code = 'other';
  try {
    code = String(JSON.parse(text)?.body?.code ?? 'other');
  } catch { /* counted as other */ }
  counters.sender_responses[code] = (counters.sender_responses[code] ?? 0) + 1;
}

let runStart = 0;
function dueOf(i, k) {
  return runStart + (pairs[i].g / N + k) * PERIOD;
}
// A due time on a window edge is computed with other additions than the edge itself and may
// land one rounding step either side of it: the edges are moved by far less than any gap
// between two dues, so every sender has exactly DURATION / PERIOD dues in the window.
const EDGE_MS = 1e-6;
function beforeWindow(due) {
  return due < windowStart - EDGE_MS;
}
function afterWindow(due) {
  return due >= windowEnd - EDGE_MS;
}
function isMeasured(k, i) {
  const due = dueOf(i, k);
  return !beforeWindow(due) && !afterWindow(due);
}

async function setup(startPerf) {
  await sleepUntil(startPerf);
  const t0 = performance.now();
  const deadline = t0 + SETUP_TIMEOUT_MS;
  const failures = [];
  const firstArrivals = [];
  let late = 0;
  const tooLate = new Promise((resolve) => setTimeout(resolve, SETUP_TIMEOUT_MS, 'late'));
  await Promise.all(pairs.map(async (pair, i) => {
    pair.receiver.onData = (text) => receive(i, text);
    pair.sender.onData = senderFrame;
    try {
      const ready = Promise.all([
        pair.sender.open(spec.url).then(() => pair.sender.allocate()),
        pair.receiver.open(RECEIVERS.url).then(() => pair.receiver.allocate()),
      ]);
      const outcome = await Promise.race([ready, tooLate]);
      if (outcome === 'late') {
        late++;
        ready.catch(() => {});
        return;
      }
      [pair.from, pair.to] = outcome;
    } catch (error) {
      failures.push(String(error?.message ?? error));
      return;
    }
    for (const rt of [pair.sender, pair.receiver]) rt.ws.on('close', () => { counters.closed++; });
    pair.ok = true;
    pair.firstSent = performance.now();
    pair.sender.ws.send(JSON.stringify({
      id: `first-${pair.g}`, type: 'update', from: pair.from, to: pair.to,
      body: { seq: -1, payload: payload(pair.g) },
    }));
  }));
  while (performance.now() < deadline && pairs.some((p) => p.ok && p.firstArrived === 0)) {
    await new Promise((r) => setTimeout(r, 5));
  }
  const perRuntime = [];
  const firstLatency = [];
  let missing = 0;
  for (const p of pairs) {
    if (!p.ok) continue;
    if (p.firstArrived === 0) {
      missing++;
      continue;
    }
    perRuntime.push(p.firstArrived - t0);
    firstLatency.push(p.firstArrived - p.firstSent);
    firstArrivals.push(p.firstArrived);
  }
  return {
    event: 'setup',
    pairs: n,
    // Connection or allocation refused, not done within the set-up time, first message missing.
    failed: failures.length,
    failures: failures.slice(0, 5),
    late,
    missing,
    // Per sender: common start → its first message delivered; and that message's send → receive.
    start_to_first_ms: perRuntime.map((x) => Math.round(x * 100) / 100),
    first_message_ms: firstLatency.map((x) => Math.round(x * 100) / 100),
  };
}

async function run(startPerf) {
  runStart = startPerf;
  windowStart = startPerf + WARMUP_MS;
  windowEnd = windowStart + DURATION_MS;
  const live = [];
  for (let i = 0; i < n; i++) if (pairs[i].ok) live.push(i);
  // The send schedule, in due order: round k, then the senders by their global index.
  const order = live; // pairs are sorted by g already
  let measuredSent = 0;
  const lags = [];
  let m = 0;
  const total = order.length * ROUNDS;
  const texts = pairs.map((p) => [
    `{"id":`, `,"type":"update","from":${JSON.stringify(p.from)},"to":${JSON.stringify(p.to)},"body":{"seq":`,
  ]);
  await new Promise((resolveSending) => {
    const tick = () => {
      const now = performance.now();
      while (m < total) {
        const i = order[m % order.length];
        const k = Math.floor(m / order.length);
        const due = dueOf(i, k);
        if (afterWindow(due)) {
          m = total;
          break;
        }
        if (due > now) break;
        const sent = performance.now();
        const [head, mid] = texts[i];
        pairs[i].sender.ws.send(`${head}${k}${mid}${k},"payload":"${payload(k * N + pairs[i].g)}"}}`);
        sentAt[i * ROUNDS + k] = sent;
        if (!beforeWindow(due)) {
          measuredSent++;
          measuredOutstanding++;
          lags.push(sent - due);
        }
        m++;
      }
      if (m >= total) {
        resolveSending();
        return;
      }
      const i = order[m % order.length];
      setTimeout(tick, Math.max(0, dueOf(i, Math.floor(m / order.length)) - performance.now()));
    };
    if (order.length === 0) resolveSending();
    else setTimeout(tick, Math.max(0, startPerf - performance.now()));
  });
  // Arrivals of measured messages already counted down measuredOutstanding as they came.
  await sleepUntil(windowEnd);
  const drainStart = performance.now();
  if (measuredOutstanding > 0) {
    await Promise.race([
      new Promise((r) => { onMeasuredDone = r; }),
      new Promise((r) => setTimeout(r, DRAIN_MS)),
    ]);
  }
  const drainMs = performance.now() - drainStart;
  const latencies = [];
  // The slowest message sent in each quarter second of the window: when the tail happened.
  const slowest = new Array(Math.ceil(DURATION_MS / 250)).fill(0);
  let lost = 0;
  let lastArrival = 0;
  for (const i of live) {
    for (let k = 0; k < ROUNDS; k++) {
      const slot = i * ROUNDS + k;
      if (sentAt[slot] < 0 || !isMeasured(k, i)) continue;
      if (arrivedAt[slot] < 0) lost++;
      else {
        const ms = arrivedAt[slot] - sentAt[slot];
        latencies.push(Math.round(ms * 1000) / 1000);
        lastArrival = Math.max(lastArrival, arrivedAt[slot]);
        const q = Math.min(slowest.length - 1, Math.max(0, Math.floor((sentAt[slot] - windowStart) / 250)));
        slowest[q] = Math.max(slowest[q], Math.round(ms));
      }
    }
  }
  lags.sort((a, b) => a - b);
  return {
    event: 'result',
    pairs: live.length,
    measured: measuredSent,
    received: latencies.length,
    lost,
    arrived_in_window: counters.arrived_in_window,
    window_ms: DURATION_MS,
    latencies_ms: latencies,
    slowest_per_quarter_second_ms: slowest,
    // How late this process sent, against the schedule: a saturated driver shows here.
    lag_p99_ms: lags.length ? lags[Math.min(lags.length - 1, Math.floor(0.99 * lags.length))] : null,
    lag_max_ms: lags.length ? lags[lags.length - 1] : null,
    drain_ms: drainMs,
    last_arrival_after_window_ms: lastArrival > 0 ? Math.max(0, lastArrival - windowEnd) : null,
    out_of_order: counters.out_of_order,
    duplicates: counters.duplicates,
    unexpected: counters.unexpected,
    sender_responses: counters.sender_responses,
    closed_by_node: counters.closed,
  };
}

try {
  await out({ event: 'ready', pairs: n });
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    const [command, epoch] = line.trim().split(/\s+/);
    if (command === 'setup') await out(await setup(epochToPerf(Number(epoch))));
    else if (command === 'run') {
      await out(await run(epochToPerf(Number(epoch))));
      break;
    } else if (command === 'quit') break;
  }
  for (const p of pairs) {
    p.sender.ws?.terminate();
    p.receiver.ws?.terminate();
  }
  process.exit(0);
} catch (error) {
  await out({ error: String(error?.stack ?? error) });
  process.exit(1);
}
