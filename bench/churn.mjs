// Churn: many reTHINK runtimes messaging while each comes and goes as real runtimes do
// (bench/churn.py drives it; issue 17). One process, N runtimes, each with the bundled protocol
// stub (stub_js/src/index.js) and a bus of its own, as a runtime loads it:
//
// - every runtime registers a hyperty in the domain registry under its own user, then sends
//   numbered `update`s at `rate`/s to its partner's runtimeURL (runtime i and i + N/2);
// - every `minChurnS`..`maxChurnS` seconds a runtime comes and goes, by turns:
//     `disconnect`  the stub's disconnect(), then connect() again: a fresh session;
//     `drop`        its socket cut without a word: the stub reconnects and resumes;
//     `reload`      a new stub instance for the same runtimeURL (a page reload): the old one
//                   vanishes (its socket cut, the instance abandoned), the new one resumes;
// - `plain`: the stubs speak as third-party stubs do (v2 without hello, no acknowledgements).
//
//   node bench/churn.mjs '{"url":"ws://…","domain":"…","runtimes":1000,"rate":1,"seconds":120,…}'
//
// stdout, one JSON value per line: {"ev":"ready"}, then after the run {"ev":"result",…} with
// every attempt ([sender, seq, acknowledged, the error code it was refused with or null]), every
// arrival ([receiver, sender, seq]),
// reconnect latencies per kind, server errors, refused connects, and the registry read at the end.
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';

const spec = JSON.parse(process.argv[2]);
const { activate } = await import(pathToFileURL(new URL('../stub_js/src/index.js', import.meta.url).pathname).href);
const D = spec.domain;
const MN = `domain://msg-node.${D}`;
const REGISTRY = `domain://registry.${D}`;
const KINDS = spec.kinds ?? ['disconnect', 'drop', 'reload'];
const now = () => performance.timeOrigin + performance.now();
const out = (value) => process.stdout.write(JSON.stringify(value) + '\n');
const rand = (lo, hi) => lo + Math.random() * (hi - lo);

const attempts = []; // [sender, seq, acknowledged, refusal code or null]
const arrivals = []; // [receiver, sender, seq, generation of the receiving stub instance]
const reloaded = []; // [runtime, generation]: instances that vanished with a reload
const latencies = Object.fromEntries(KINDS.map((kind) => [kind, []]));
const connectAttempts = {}; // connection attempts a reconnect took -> how many reconnects
const serverErrors = []; // responses with a 5xx code
const refusedConnects = []; // a stub reporting `failed`
const unanswered = { requests: 0 };

class Bus {
  constructor(runtime) {
    this.runtime = runtime;
    this.listeners = [];
  }
  addListener(_type, listener) { this.listeners.push(listener); }
  postMessage(message) { this.runtime.onMessage(this, message); }
  send(message) { for (const listener of this.listeners) listener(message); }
}

class Runtime {
  constructor(index) {
    this.index = index;
    this.name = `churn-${index}`;
    this.runtimeURL = `runtime://${D}/${this.name}-${spec.tag}`;
    this.user = `user://${D}/${this.name}-${spec.tag}`;
    this.seq = 0;
    this.instance = null; // {bus, stub, stubURL, handedBefore, seqs: [] in the order handed}
    this.generation = 0;
    this.pending = new Map();
    this.refused = new Map(); // seq -> the error code the node answered it with
    this.waitingLive = null; // {kind, since}
    this.stopped = false;
    this.hyperty = null;
  }

  start() {
    this.generation += 1;
    const bus = new Bus(this);
    const stubURL = `hyperty-runtime://${D}/protostub/${this.name}-${spec.tag}-${this.generation}`;
    const config = {
      runtimeURL: this.runtimeURL,
      messagingnode: spec.url,
      reconnect: { initialDelay: 50, maxDelay: 1000 },
      ...(spec.plain ? { handshake: 'v2', acknowledged: false } : {}),
    };
    const { instance } = activate(stubURL, bus, config);
    this.instance = { bus, stub: instance, stubURL, handed: 0, seqs: [] };
  }

  retire() {
    // The old instance's acknowledgements, as its stub counted them (cumulative, in order).
    const inst = this.instance;
    if (!inst) return;
    const acked = spec.plain ? Infinity : inst.stub.stats.acknowledged;
    inst.seqs.forEach((seq, i) => {
      if (seq === null) return; // a request
      attempts.push([this.name, seq, i < acked && !this.refused.has(seq), this.refused.get(seq) ?? null]);
    });
    inst.seqs = [];
  }

  onMessage(bus, msg) {
    if (bus !== this.instance?.bus) return; // an abandoned instance
    if (msg.to === `${this.instance.stubURL}/status`) {
      const value = msg.body?.value;
      if (value === 'in-progress' && this.waitingLive) this.waitingLive.attempts += 1;
      if (value === 'live' && this.waitingLive) {
        latencies[this.waitingLive.kind].push(now() - this.waitingLive.since);
        const n = this.waitingLive.attempts;
        connectAttempts[n] = (connectAttempts[n] ?? 0) + 1;
        this.waitingLive = null;
      }
      if (value === 'failed') refusedConnects.push({ runtime: this.name, desc: msg.body?.desc });
      return;
    }
    if (msg.type === 'response') {
      const code = msg.body?.code;
      if (Number.isInteger(code) && code >= 500) serverErrors.push({ runtime: this.name, code, desc: msg.body?.desc });
      const waiter = this.pending.get(msg.id);
      if (waiter) {
        this.pending.delete(msg.id);
        waiter(msg);
      } else if (Number.isInteger(msg.id) && Number.isInteger(code) && code >= 400) {
        // A refusal is an answer with an error code; any other answer refuses nothing.
        this.refused.set(msg.id, code);
      }
      return;
    }
    const body = msg.body;
    if (body && typeof body.sender === 'string' && Number.isInteger(body.seq)) {
      arrivals.push([this.name, body.sender, body.seq, this.generation]);
    }
  }

  hand(message, seq) {
    this.instance.seqs.push(seq);
    this.instance.bus.send(message);
  }

  request(to, type, body) {
    const id = `q-${this.name}-${Math.random().toString(36).slice(2)}`;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        unanswered.requests += 1;
        resolve(null);
      }, 15_000);
      this.pending.set(id, (answer) => {
        clearTimeout(timer);
        resolve(answer);
      });
      this.hand({ id, type, from: `${this.runtimeURL}/registry`, to, body }, null);
    });
  }

  async register() {
    const allocated = await this.request(`${MN}/hyperty-address-allocation`, 'create', { scheme: 'hyperty', value: { number: 1 } });
    this.hyperty = allocated?.body?.value?.allocated?.[0] ?? null;
    if (!this.hyperty) return;
    await this.request(REGISTRY, 'create', {
      value: {
        user: this.user,
        url: this.hyperty,
        descriptor: 'hyperty-catalogue://catalogue.example/hyperty/Chat',
        expires: 3600,
        resources: ['chat'],
        dataSchemes: ['comm'],
        runtime: this.runtimeURL,
        status: 'live',
      },
    });
  }

  send(partner) {
    const seq = ++this.seq;
    this.hand({ id: seq, type: 'update', from: this.runtimeURL, to: partner.runtimeURL, body: { sender: this.name, seq, t: now() } }, seq);
  }

  async churn(kind) {
    const since = now();
    if (kind === 'disconnect') {
      await this.instance.stub.disconnect();
      this.retire();
      this.waitingLive = { kind, since, attempts: 0 };
      this.instance.stub.connect();
      await this.register(); // a fresh session: its hyperty is gone with the old one
    } else if (kind === 'drop') {
      this.waitingLive = { kind, since, attempts: 0 };
      cut(this.instance.stub);
    } else {
      // A reload: the page's old instance vanishes with its socket; a new one starts.
      const old = this.instance.stub;
      this.retire();
      abandon(old);
      reloaded.push([this.name, this.generation]);
      this.waitingLive = { kind, since, attempts: 0 };
      this.start();
      this.instance.stub.connect();
    }
  }
}

// The stub's socket, cut as a network would (no close frame).
function cut(stub) {
  const ws = stub._conn?.ws;
  if (ws?.terminate) ws.terminate();
  else ws?.close();
}

// A reloaded page's stub: gone without a word, never reconnecting.
function abandon(stub) {
  stub._halt();
  cut(stub);
}

const runtimes = Array.from({ length: spec.runtimes }, (_, i) => new Runtime(i));
const half = Math.floor(spec.runtimes / 2);
const partnerOf = (r) => runtimes[(r.index + half) % runtimes.length];
for (const r of runtimes) r.start();
// Set-up, a few at a time: allocate and register.
for (let i = 0; i < runtimes.length; i += 50) {
  await Promise.all(runtimes.slice(i, i + 50).map((r) => r.register()));
}
out({ ev: 'ready', t: now() });

// This process's own event-loop delay over the window: a reconnect measured here includes it.
const loopDelay = monitorEventLoopDelay({ resolution: 10 });
loopDelay.enable();
const started = now();
const endAt = started + spec.seconds * 1000;
const timers = [];
for (const r of runtimes) {
  const interval = 1000 / spec.rate;
  const first = Math.random() * interval;
  if (spec.rate > 0) {
    timers.push(setTimeout(function tick() {
      if (now() >= endAt) return;
      r.send(partnerOf(r));
      timers.push(setTimeout(tick, interval));
    }, first));
  }
  let turn = r.index % KINDS.length;
  let churns = 0;
  const schedule = () => {
    // The first churn of each runtime is spread over its interval, so they do not come in step.
    const delay = (churns++ ? rand(spec.minChurnS, spec.maxChurnS) : rand(0, spec.maxChurnS)) * 1000;
    timers.push(setTimeout(async () => {
      if (now() + 2000 >= endAt) return; // not in the last seconds: every runtime ends live
      await r.churn(KINDS[turn]);
      turn = (turn + 1) % KINDS.length;
      schedule();
    }, delay));
  };
  schedule();
}
await new Promise((resolve) => setTimeout(resolve, spec.seconds * 1000 + 500));
for (const t of timers) clearTimeout(t);
loopDelay.disable();
const ms = (ns) => Math.round(ns / 1e4) / 100;
const driverLoopDelay = { p50: ms(loopDelay.percentile(50)), p99: ms(loopDelay.percentile(99)), max: ms(loopDelay.max) };

// Drain: until nothing new arrives for a while (or a cap), so late deliveries count.
let last = -1;
let quietSince = now();
const drainUntil = now() + spec.drainS * 1000;
while (now() < drainUntil) {
  await new Promise((resolve) => setTimeout(resolve, 500));
  if (arrivals.length !== last) {
    last = arrivals.length;
    quietSince = now();
  } else if (now() - quietSince > 5000) {
    break;
  }
}
for (const r of runtimes) r.retire();

// The registry at the end: every runtime is back, so its user's hyperties answer 200 and the
// one it holds now is live.
const registry = { ok: 0, other: {}, hyperty_live: 0, hyperty_not_live: [] };
await Promise.all(runtimes.map(async (r) => {
  const answer = await r.request(REGISTRY, 'read', { resource: r.user });
  const code = answer?.body?.code ?? 'none';
  if (code === 200) registry.ok += 1;
  else registry.other[code] = (registry.other[code] ?? 0) + 1;
  const status = answer?.body?.value?.[r.hyperty]?.status;
  if (status === 'live') registry.hyperty_live += 1;
  else registry.hyperty_not_live.push({ runtime: r.name, code, status: status ?? null });
}));
registry.hyperty_not_live = registry.hyperty_not_live.slice(0, 10);

// A pipe takes a long line in several writes: exit only once all of it is out.
process.stdout.write(JSON.stringify({
  ev: 'result',
  attempts,
  arrivals,
  reloaded,
  latencies,
  server_errors: serverErrors.slice(0, 20),
  server_error_count: serverErrors.length,
  refused_connects: refusedConnects.slice(0, 20),
  refused_connect_count: refusedConnects.length,
  unanswered_requests: unanswered.requests,
  registry,
  driver_loop_delay_ms: driverLoopDelay,
  connect_attempts: connectAttempts,
}) + '\n', () => process.exit(0));
