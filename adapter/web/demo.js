// The demo's two runtimes: each has a minimal message bus and its own instance of the bundled
// stub, exactly as a reTHINK runtime would load it. Each registers its hyperty in its domain's
// registry; Alice finds Bob there by user, follows his registration's status, and pings him.
// With ?peer=<ws URL of another domain's node>&peerDomain=<its domain>, Bob is a runtime of that
// other domain: everything then crosses domains through Matrix federation.
import { activate } from '/stub/protostub.js';

const params = new URLSearchParams(location.search);
const here = `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/stub/connect`;
const domain = params.get('domain') ?? document.documentElement.dataset.domain;
const peer = params.get('peer');
const peerDomain = params.get('peerDomain') ?? domain;
const run = Math.random().toString(36).slice(2, 8);
const registryOf = (d) => `domain://registry.${d}/`;
const userOf = (name, d) => `user://${d}/${name}-${run}`;

function makeRuntime(name, runtimeDomain, nodeURL) {
  const panel = document.getElementById(name);
  panel.querySelector('.domain').textContent = runtimeDomain;
  const listeners = [];
  const waiting = new Map();
  const runtime = { name, domain: runtimeDomain, address: null };
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
  const stubURL = `hyperty-runtime://${runtimeDomain}/protostub/${name}-${run}`;
  const { instance } = activate(stubURL, bus, { runtimeURL: `runtime://${runtimeDomain}/${name}-${run}`, messagingnode: nodeURL });
  let counter = 0;
  runtime.stub = instance;
  runtime.send = (message) => { for (const listener of listeners) listener(message); };
  runtime.request = (to, type, body) => new Promise((resolve) => {
    const id = `${name}-${++counter}`;
    waiting.set(id, resolve);
    runtime.send({ id, type, from: runtime.address ?? `${stubURL}/registry/allocation`, to, body });
  });
  runtime.log = log;
  runtime.panel = panel;
  return runtime;
}

async function allocate(runtime) {
  const answer = await runtime.request(`domain://msg-node.${runtime.domain}/hyperty-address-allocation`,
    'create', { scheme: 'hyperty', value: { number: 1 } });
  if (answer.body.code !== 200) throw new Error(`allocation refused: ${answer.body.code}`);
  runtime.address = answer.body.value.allocated[0];
  runtime.panel.querySelector('.address').textContent = runtime.address;
  runtime.log(`allocated ${runtime.address}`);
}

async function register(runtime) {
  const value = {
    user: userOf(runtime.name, runtime.domain), url: runtime.address, expires: 3600,
    descriptor: `hyperty-catalogue://catalogue.${runtime.domain}/.well-known/hyperty/Demo`,
    resources: ['chat'], dataSchemes: ['comm'], runtime: `runtime://${runtime.domain}/${runtime.name}-${run}`, status: 'live',
  };
  const answer = await runtime.request(registryOf(runtime.domain), 'create', { value, policy: 'demo' });
  if (answer.body.code !== 200) throw new Error(`registration refused: ${answer.body.code}`);
  runtime.log(`registered as ${value.user}`);
}

const alice = makeRuntime('alice', domain, here);
const bob = makeRuntime('bob', peerDomain, peer ?? here);
const result = document.getElementById('result');
const follow = document.getElementById('bob-registration');
let bobAddress = null;
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
  if (message.type === 'update' && message.from === bobAddress && message.body?.attribute === 'status') {
    follow.textContent = message.body.value;
    follow.dataset.status = message.body.value;
    alice.log(`← Bob's registration is ${message.body.value}`);
    return;
  }
  alice.log(`← ${message.type} #${message.id} ${JSON.stringify(message.body?.value ?? '')}`);
  if (message.type === 'response' && message.body.value === 'pong') {
    result.textContent = `pong received (${pings} ping${pings > 1 ? 's' : ''} answered through Matrix)`;
    result.dataset.pongs = String(pings);
    document.getElementById('ping').disabled = false;
    document.getElementById('disconnect').disabled = false;
  }
};

function ping() {
  pings += 1;
  const id = `ping-${pings}`;
  alice.send({ id, type: 'ping', from: alice.address, to: bobAddress, body: { sent: Date.now() } });
  alice.log(`→ ping #${id} to ${bobAddress}`);
}

document.getElementById('ping').addEventListener('click', ping);
document.getElementById('disconnect').addEventListener('click', async () => {
  document.getElementById('disconnect').disabled = true;
  bob.log('disconnecting');
  await bob.stub.disconnect();
});

try {
  await Promise.all([allocate(alice), allocate(bob)]);
  await Promise.all([register(alice), register(bob)]);
  // Alice finds Bob by user in Bob's domain registry, then follows his registration.
  const found = await alice.request(registryOf(bob.domain), 'read', { resource: userOf('bob', bob.domain) });
  if (found.body.code !== 200) throw new Error(`Bob not found: ${found.body.code}`);
  bobAddress = Object.keys(found.body.value)[0];
  alice.log(`found Bob by user: ${bobAddress}`);
  const followed = await alice.request(`domain://msg-node.${domain}/sm`, 'subscribe',
    { resources: [`${bobAddress}/registration`] });
  follow.textContent = followed.body.code === 200 ? 'live' : `not followed (${followed.body.code})`;
  follow.dataset.status = 'live';
  result.textContent = 'pinging…';
  ping();
} catch (error) {
  result.textContent = `failed: ${error.message}`;
  result.dataset.error = 'true';
}
