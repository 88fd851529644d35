// The page side of a reTHINK runtime, reduced to deploying its domain's protocol stub the way
// reTHINK's runtimes do and carrying one hyperty's messages through it. Each step names what it
// mirrors in reTHINK's repositories (this project's own code, written from reading theirs):
//   runtime-core 4a7264e6 (2019, SystemJS): src/runtime/Loader.js `_load` l.480-540 and
//     `loadStub` l.416-447, src/runtime/Descriptors.js `getDescriptor` l.21,
//     src/runtime/runtimeConfiguration.js `catalogueURLs.protocolstub` l.74-77,
//     src/sandbox/SandboxBrowser.js l.28-30, src/rethink/runtimeFactory.js `createSandbox` l.44;
//   runtime-core 76024860 (2018, the catalogue): src/runtime/Loader.js `loadStub` l.399-515,
//     src/runtime/Descriptors.js `getStubDescriptor` l.27-82, runtimeConfiguration.js l.74-77,
//     src/registry/Registry.js l.896 (the stub's URL), src/sandbox/Sandbox.js
//     `deployComponent` l.53;
//   dev-runtime-browser f1076335: src/Sandboxes.js `SandboxWorker` l.30-69, src/Request.js
//     `_makeLocalRequest` l.52 and `_mapProtocol` l.83;
//   dev-service-framework 7cd08d57: src/runtime-catalogue/RuntimeCatalogue.js `getDescriptor`
//     l.35-113, `attachRawSourcePackage` l.118, `createSourcePackage` l.406.
'use strict';

// Sandbox: the runtime's side of a sandbox is a MiniBus; `deployComponent` posts the component
// to the SandboxRegistry inside and waits for its answer.
class Sandbox extends MiniBus {
  deployComponent(component, url, config) {
    return new Promise((resolve, reject) => {
      const msg = { type: 'create', from: SANDBOX_EXTERNAL, to: SANDBOX_INTERNAL, body: { url, sourceCode: component, config } };
      this.postMessage(msg, (reply) => (reply.body.code === 200 ? resolve('deployed') : reject(reply.body.desc)));
    });
  }
}

// runtime-core's SandboxBrowser: the "sandbox" is a second MiniBus in the same page, and its
// registry starts the component instance with _start(url, bus, config, factory).
class SandboxBrowser extends Sandbox {
  constructor() {
    super();
    this._bus = new MiniBus();
    this._bus._onPostMessage = (msg) => this._onMessage(msg);
    this._sbr = new SandboxRegistry(this._bus);
    this._sbr._create = (url, instance, config, factory) => {
      instance._start(url, this._bus, config, factory);
    };
  }

  _onPostMessage(msg) {
    this._bus._onMessage(msg);
  }
}

// dev-runtime-browser's SandboxWorker: a Web Worker running the context service script.
class SandboxWorker extends Sandbox {
  constructor(script) {
    super();
    this._worker = new Worker(script);
    this._worker.addEventListener('message', (e) => this._onMessage(e.data));
  }

  _onPostMessage(msg) {
    this._worker.postMessage(msg);
  }
}

// dev-runtime-browser's Request: XMLHttpRequest, after mapping the catalogue's scheme to https.
function request(method, url, body) {
  const protocols = { 'localhost://': 'https://', 'undefined://': 'https://', 'hyperty-catalogue://': 'https://', 'https://': 'https://', 'http://': 'http://' };
  const prefix = Object.keys(protocols).find((p) => url.startsWith(p));
  if (!prefix) throw new Error(`Invalid protocol of url: ${url}`);
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open(method, protocols[prefix] + url.slice(prefix.length), true);
    xhr.onload = () => resolve(xhr.responseText);
    xhr.onerror = () => reject(new Error(`${method} ${url} failed`));
    xhr.send(body ?? null);
  });
}

function guid() {
  return crypto.randomUUID();
}

class Runtime {
  constructor(domain, runtimeURL) {
    this.domain = domain;
    this.runtimeURL = runtimeURL;
    this.registryURL = `${runtimeURL}/registry/`;
    this.hyperty = null;
    this.received = []; // body.n of every ping that reached the hyperty, in arrival order
    this.listening = true; // the hyperty's listener is on the runtime's bus
    this.returned = 0; // pings handed back to the stub for want of a listener
    this.statuses = []; // the stub's status updates
    this._pending = new Map();
    this._count = 0;
  }

  // runtime-core 2019: SystemJS imports https://<domain>/.well-known/protocolstub/default.ps.js,
  // `new result.default()`, the descriptor from default.ps.json, a SandboxBrowser, and _start.
  async deploySystemJS() {
    const base = `https://${this.domain}/.well-known/protocolstub/`;
    const loader = new System.constructor();
    const result = await loader.import(`${base}default.ps.js`);
    const instance = new result.default();
    const descriptor = await fetch(`${base}default.ps.json`).then((r) => r.json());
    const sandbox = new SandboxBrowser();
    this._stats = async () => instance.stats;
    return this._deploy(sandbox, instance, descriptor);
  }

  // runtime-core 2018 in dev-runtime-browser: the catalogue's descriptor (version and cguid
  // first, all posted with the runtime's constraints), its source package, a SandboxWorker,
  // and the source code deployed into it.
  async deployInWorker(workerScript) {
    const url = `hyperty-catalogue://catalogue.${this.domain}/.well-known/protocolstub/default`;
    const constraints = JSON.stringify({ constraints: {} });
    await Promise.all([request('POST', `${url}/version`, constraints), request('POST', `${url}/cguid`, constraints)]);
    const descriptor = JSON.parse(await request('POST', url, constraints));
    if (!descriptor.sourcePackage) {
      descriptor.sourcePackage = JSON.parse(await request('POST', descriptor.sourcePackageURL, constraints));
    }
    let sourcePackage = descriptor.sourcePackage;
    if (descriptor.sourcePackageURL !== '/sourcePackage') {
      sourcePackage = JSON.parse(await request('GET', descriptor.sourcePackageURL));
    }
    if (sourcePackage.encoding === 'base64') sourcePackage.sourceCode = atob(sourcePackage.sourceCode);
    const sandbox = new SandboxWorker(workerScript);
    this._stats = async () => {
      const reply = await new Promise((resolve) =>
        sandbox.postMessage({ type: 'read', from: `${this.runtimeURL}/harness`, to: 'hyperty-runtime://harness/stats' }, resolve),
      );
      return reply.body.value;
    };
    return this._deploy(sandbox, sourcePackage.sourceCode, descriptor);
  }

  async _deploy(sandbox, component, descriptor) {
    // Loader.loadStub: the sandbox's messages go to the runtime's bus; the stub gets a URL of
    // its own and the descriptor's configuration with the runtime's URL.
    sandbox.addListener('*', (msg) => this._fromStub(msg));
    this.stubURL = `runtime://${this.domain}/protostub/${guid()}`;
    let configuration = {};
    try {
      configuration = Object.assign({}, JSON.parse(descriptor.configuration));
    } catch {
      configuration = descriptor.configuration;
    }
    configuration.runtimeURL = this.runtimeURL;
    this._sandbox = sandbox;
    return sandbox.deployComponent(component, this.stubURL, configuration);
  }

  stats() {
    return this._stats();
  }

  _send(msg) {
    this._sandbox.postMessage(msg);
  }

  _fromStub(msg) {
    if (msg.to === `${this.stubURL}/status`) {
      this.statuses.push(msg.body);
    } else if (msg.type === 'response' && this._pending.has(msg.id)) {
      this._pending.get(msg.id)(msg);
      this._pending.delete(msg.id);
    } else if (msg.type === 'ping' && msg.to === this.hyperty) {
      if (this.listening) {
        this.received.push(msg.body.n);
      } else {
        // runtime-core's MessageBus with no listener for the address: out to its default
        // route, the domain's stub (MessageBus.postMessage l.92, Registry.resolve l.1433).
        this.returned += 1;
        this._send(msg);
      }
    }
  }

  _ask(to, type, body) {
    const id = `${this.runtimeURL}#${++this._count}`;
    const answered = new Promise((resolve) => this._pending.set(id, resolve));
    this._send({ id, type, from: this.registryURL, to, body });
    return answered;
  }

  // The runtime's registry asks the node for a hyperty address.
  async allocate() {
    const to = `domain://msg-node.${this.domain}/hyperty-address-allocation`;
    const answer = await this._ask(to, 'create', { scheme: 'hyperty', value: { number: 1 } });
    if (answer.body.code !== 200) throw new Error(`allocation refused: ${JSON.stringify(answer.body)}`);
    [this.hyperty] = answer.body.value.allocated;
    return this.hyperty;
  }

  // A reloaded runtime keeps its hyperty's address (runtime-core stores it with the runtimeURL).
  adopt(hyperty) {
    this.hyperty = hyperty;
  }

  // runtime-core registers a hyperty with the domain registry (DomainRegistration.registerHyperty:
  // `create` naming its URL, `update` with it as resource when it deploys it again after a reload).
  register(again) {
    const to = `domain://registry.${this.domain}`;
    const value = {
      url: this.hyperty, user: `user://${this.domain}/harness`, descriptor: 'hyperty-catalogue://harness/Pinger',
      resources: ['chat'], dataSchemes: ['comm'], status: 'live', runtime: this.runtimeURL, expires: 3600,
    };
    const body = again ? { resource: this.hyperty, value: { status: 'live' } } : { value, policy: 'policy' };
    return this._ask(to, again ? 'update' : 'create', body).then((answer) => answer.body.code);
  }

  // runtime-core after a reload (Loader.loadHyperty l.165-216): the address comes back from its
  // storage, the registry is told again, and the listener is added only once the hyperty is
  // deployed, after the registry answered; meanwhile messages for it find no listener.
  redeploy(hyperty) {
    this.hyperty = hyperty;
    this.listening = false;
    return this.register(true);
  }

  listen() {
    this.listening = true;
  }

  ping(to, first, count) {
    for (let n = first; n < first + count; n += 1) {
      this._send({ id: `${this.hyperty}#${n}`, type: 'ping', from: this.hyperty, to, body: { n } });
    }
  }
}

self.Runtime = Runtime;
