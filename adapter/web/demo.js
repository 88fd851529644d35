// The demo's two runtimes: each has a minimal message bus and its own instance of the bundled
// stub, exactly as a reTHINK runtime would load it.
import { activate } from '/stub/protostub.js';

const nodeURL = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/stub/connect`;
const domain = new URLSearchParams(location.search).get('domain') ?? document.documentElement.dataset.domain;
const run = Math.random().toString(36).slice(2, 8);

function makeRuntime(name) {
  const panel = document.getElementById(name);
  const listeners = [];
  const waiting = new Map();
  const runtime = { name, address: null };
  const log = (text) => {
    const item = document.createElement('li');
    item.textContent = text;
    panel.querySelector('.log').append(item);
  };
  const bus = {
    addListener: (_address, listener) => listeners.push(listener),
    postMessage: (message) => {
      if (message.type === 'update' && message.to.endsWith('/status')) {
        panel.querySelector('.status').textContent = message.body.value;
        return;
      }
      const reply = waiting.get(message.id);
      if (reply && message.type === 'response') {
        waiting.delete(message.id);
        reply(message);
        return;
      }
      runtime.onMessage?.(message);
    },
  };
  const stubURL = `hyperty-runtime://${domain}/protostub/${name}-${run}`;
  activate(stubURL, bus, { runtimeURL: `runtime://${domain}/${name}-${run}`, messagingnode: nodeURL });
  let counter = 0;
  runtime.send = (message) => { for (const listener of listeners) listener(message); };
  runtime.request = (to, type, body) => new Promise((resolve) => {
    const id = `${name}-${++counter}`;
    waiting.set(id, resolve);
    runtime.send({ id, type, from: `${stubURL}/registry/allocation`, to, body });
  });
  runtime.log = log;
  runtime.panel = panel;
  return runtime;
}

async function allocate(runtime) {
  const answer = await runtime.request(`domain://msg-node.${domain}/hyperty-address-allocation`,
    'create', { scheme: 'hyperty', value: { number: 1 } });
  if (answer.body.code !== 200) throw new Error(`allocation refused: ${answer.body.code}`);
  runtime.address = answer.body.value.allocated[0];
  runtime.panel.querySelector('.address').textContent = runtime.address;
  runtime.log(`allocated ${runtime.address}`);
}

const alice = makeRuntime('alice');
const bob = makeRuntime('bob');
const result = document.getElementById('result');
let pings = 0;

bob.onMessage = (message) => {
  bob.log(`← ${message.type} #${message.id} from ${message.from}`);
  if (message.type.toLowerCase() === 'ping') {
    bob.send({ id: message.id, type: 'response', from: bob.address, to: message.from,
      body: { code: 200, value: 'pong' } });
    bob.log(`→ response "pong" to #${message.id}`);
  }
};

alice.onMessage = (message) => {
  alice.log(`← ${message.type} #${message.id} ${JSON.stringify(message.body.value ?? '')}`);
  if (message.type === 'response' && message.body.value === 'pong') {
    result.textContent = `pong received (${pings} ping${pings > 1 ? 's' : ''} answered through Matrix)`;
    result.dataset.pongs = String(pings);
    document.getElementById('ping').disabled = false;
  }
};

function ping() {
  pings += 1;
  const id = `ping-${pings}`;
  alice.send({ id, type: 'ping', from: alice.address, to: bob.address, body: { sent: Date.now() } });
  alice.log(`→ ping #${id} to ${bob.address}`);
}

document.getElementById('ping').addEventListener('click', ping);

try {
  await Promise.all([allocate(alice), allocate(bob)]);
  result.textContent = 'pinging…';
  ping();
} catch (error) {
  result.textContent = `failed: ${error.message}`;
  result.dataset.error = 'true';
}
