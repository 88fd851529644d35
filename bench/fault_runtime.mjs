// One reTHINK runtime for the fault suite (bench/faults.py): it loads the bundled protocol stub
// (stub_js/src/index.js) with a bus of its own and drives it exactly as a runtime does: messages
// for the node go to the stub's bus listener, the stub delivers on bus.postMessage.
//
//   node bench/fault_runtime.mjs '{"name":"A","role":"sender","domain":"…","url":"ws://…",…}'
//
// Roles: `receiver` allocates a hyperty and records what arrives; `sender` allocates a hyperty and,
// on `go`, streams `count` numbered messages at `rate`/s round-robin to the given targets;
// `reporter` allocates an object address and, on `go`, streams numbered `update`s to
// <object>/changes; `observer` subscribes to <object>/changes through the MN's /sm and records.
//
// stdout, one JSON value per line, read by faults.py:
//   {"ev":"ready","address":…}            allocated (and subscribed)
//   ["r",sender,seq,t,toOk,sentT]         every arrival of a numbered message, duplicates too
//   {"ev":"status","value":…,"desc":…,"t":…}  the stub's status events
//   {"ev":"progress","n":n,"t":…}          every 100 ms of the stream: messages handed so far
//   {"ev":"sent","count":n,"t":…}          the stream was handed to the stub in full
//   {"ev":"stats",…}                       the stub's instance.stats, every 500 ms, if it has them
//   {"ev":"final",…}                       on the `final` command: counts, acknowledgements,
//                                          refusals ([seq, code, t]: answers with an error code)
// stdin, one JSON command per line: {"cmd":"warmup","targets":[…]} (one seq-0 message per
// target), {"cmd":"go","targets":[…]}, {"cmd":"final"}.
import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';

const spec = JSON.parse(process.argv[2]);
// The bundled stub; `stubModule` (a path) swaps in another one (the tests' fake with stats).
const { activate } = await import(spec.stubModule ? pathToFileURL(spec.stubModule).href : '../stub_js/src/index.js');
const MN = `domain://msg-node.${spec.domain}`;
const runtimeURL = `runtime://${spec.domain}/${spec.name}-${spec.tag}`;
const stubURL = `hyperty-runtime://${spec.domain}/protostub/${spec.name}-${spec.tag}`;
const now = () => performance.timeOrigin + performance.now(); // ms since the epoch, sub-ms

function out(value) {
  process.stdout.write(JSON.stringify(value) + '\n');
}

function fail(message) {
  out({ ev: 'error', error: message });
  process.exit(1);
}

// A runtime's message bus reduced to what a stub needs: addListener('*') and postMessage.
class Bus {
  constructor() {
    this.listeners = [];
    this.handed = 0; // messages handed to the stub, in order (the stub numbers them the same way)
    this.onMessage = () => {};
  }
  addListener(_type, listener) { this.listeners.push(listener); }
  postMessage(message) { this.onMessage(message); }
  send(message) {
    this.handed += 1;
    for (const listener of this.listeners) listener(message);
  }
}

const bus = new Bus();
// `plain`: the stub speaks the protocol of a third-party stub (no numbers, no acknowledgements).
const { instance } = activate(stubURL, bus, {
  runtimeURL,
  messagingnode: spec.url,
  reconnect: spec.reconnect,
  ...(spec.plain ? { acknowledged: false } : {}),
});

const pending = new Map(); // request id -> resolve
// Answers to numbered messages. A refusal is an answer carrying an error code (an integer, 400
// or more): [seq, code, t] each. Any other answer (a 200, no code) refuses nothing, and the
// message must still arrive: answered[code] lists their seqs.
const refusals = [];
const answered = {};
const statuses = {};
let expectedTo = null; // the address numbered messages must be sent to, for receivers
let address = null;

bus.onMessage = (msg) => {
  if (msg.to === `${stubURL}/status`) {
    statuses[msg.body.value] = (statuses[msg.body.value] ?? 0) + 1;
    out({ ev: 'status', value: msg.body.value, desc: msg.body.desc, t: now() });
    return;
  }
  if (msg.type === 'response') {
    const waiter = pending.get(msg.id);
    if (waiter) {
      pending.delete(msg.id);
      waiter(msg);
    } else if (Number.isInteger(msg.id)) {
      const code = msg.body?.code;
      if (Number.isInteger(code) && code >= 400) refusals.push([msg.id, code, now()]);
      else (answered[String(code ?? 'none')] ??= []).push(msg.id);
    }
    return;
  }
  const body = msg.body;
  if (body && typeof body.sender === 'string' && Number.isInteger(body.seq)) {
    out(['r', body.sender, body.seq, now(), msg.to === expectedTo ? 1 : 0, body.t ?? null]);
  } else {
    out({ ev: 'other', message: msg });
  }
};

let nextRequest = 0;
function request(to, type, body, from) {
  const id = `req-${++nextRequest}`;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no answer to ${type} ${to} within 60 s`)), 60_000);
    pending.set(id, (answer) => {
      clearTimeout(timer);
      resolve(answer);
    });
    bus.send({ id, type, from, to, body });
  });
}

async function allocate(endpoint, scheme) {
  const answer = await request(`${MN}/${endpoint}`, 'create', { scheme, value: { number: 1 } },
    `${runtimeURL}/registry/allocation`);
  if (answer.body?.code !== 200) throw new Error(`allocation refused: ${JSON.stringify(answer.body)}`);
  return answer.body.value.allocated[0];
}

function readStats() {
  let stats = instance.stats;
  if (typeof stats === 'function') stats = stats.call(instance);
  return stats && typeof stats === 'object' ? { ...stats } : null;
}

// -- the stream ------------------------------------------------------------------------------

let handedBeforeStream = 0;
let sentCount = 0;

function stream(targets, from) {
  const count = spec.count;
  const interval = 1000 / spec.rate;
  const padding = 'x'.repeat(spec.padding ?? 64);
  handedBeforeStream = bus.handed;
  const started = performance.now();
  let reported = 0;
  const tick = () => {
    const due = Math.min(count, Math.floor((performance.now() - started) / interval) + 1);
    while (sentCount < due) {
      const seq = ++sentCount;
      const to = targets[(seq - 1) % targets.length];
      // `learnEvery`: every nth message from an address never allocated (of a domain the node
      // knows nothing about, the only kind it learns), so that taking it writes a learned route
      // to the node's database (what a database outage hits).
      const learn = spec.learnEvery && seq % spec.learnEvery === 0;
      const sentFrom = learn ? `hyperty://elsewhere.example/${spec.name}-${spec.tag}-${seq}` : from;
      bus.send({ id: seq, type: 'update', from: sentFrom, to, body: { sender: spec.name, seq, t: now(), padding } });
    }
    if (performance.now() - reported >= 100) {
      reported = performance.now();
      out({ ev: 'progress', n: sentCount, t: now() });
    }
    if (sentCount < count) setTimeout(tick, Math.min(10, interval));
    else out({ ev: 'sent', count: sentCount, t: now() });
  };
  tick();
}

function final() {
  const stats = readStats();
  let ackedThrough = sentCount;
  let ackSource = spec.plain
    ? 'plain stub: every message handed to it counts, less those the node answered with an error'
    : 'assumed: every message handed to the stub, less those the node answered with an error (the stub reports no acknowledgements yet)';
  if (!spec.plain && stats && Number.isInteger(stats.acknowledged)) {
    // Acknowledgements are cumulative in the order messages were handed to the stub, so the
    // first `acknowledged` of them are acknowledged: the numbered ones after the requests.
    ackedThrough = Math.max(0, Math.min(sentCount, stats.acknowledged - handedBeforeStream));
    ackSource = 'stub: instance.stats.acknowledged (cumulative, in the order handed), less those the node answered with an error';
  }
  out({
    ev: 'final',
    attempted: sentCount,
    acked_through: ackedThrough,
    ack_source: ackSource,
    handed: bus.handed,
    handed_before_stream: handedBeforeStream,
    stats,
    refusals,
    answered,
    statuses,
    unanswered_requests: pending.size,
  });
}

// -- main ------------------------------------------------------------------------------------

try {
  if (spec.role === 'receiver' || spec.role === 'sender') {
    address = await allocate('hyperty-address-allocation', 'hyperty');
    expectedTo = address;
  } else if (spec.role === 'reporter') {
    address = await allocate('object-address-allocation', 'comm');
  } else if (spec.role === 'observer') {
    expectedTo = `${spec.object}/changes`;
    const answer = await request(`${MN}/sm`, 'subscribe', { resources: [expectedTo] }, `${runtimeURL}/sm`);
    if (answer.body?.code !== 200) throw new Error(`subscription refused: ${JSON.stringify(answer.body)}`);
    address = runtimeURL;
  } else {
    throw new Error(`unknown role ${spec.role}`);
  }
} catch (error) {
  fail(String(error?.message ?? error));
}
out({ ev: 'ready', address, runtime: runtimeURL });

if (readStats()) {
  setInterval(() => out({ ev: 'stats', t: now(), ...readStats() }), 500).unref();
}

const commands = createInterface({ input: process.stdin });
for await (const line of commands) {
  const command = JSON.parse(line);
  if (command.cmd === 'warmup') {
    // One message (seq 0, not counted) per destination before the clock starts: a runtime's
    // first routed message provisions its room, and the faults should hit a steady stream.
    const targets = spec.role === 'reporter' ? [`${address}/changes`] : command.targets;
    targets.forEach((to, i) => bus.send({ id: `warm-${i}`, type: 'update', from: address, to, body: { sender: spec.name, seq: 0, t: now() } }));
  } else if (command.cmd === 'go') {
    if (spec.role === 'sender') stream(command.targets, address);
    else if (spec.role === 'reporter') stream([`${address}/changes`], address);
  } else if (command.cmd === 'final') {
    final();
    break;
  }
}
// Leave without `disconnect`: the stack is torn down next, and a runtime that vanishes is the
// common case anyway.
process.exit(0);
