// A Worker sandbox as dev-runtime-browser makes one (reTHINK-project/dev-runtime-browser commit
// f1076335, src/ContextServiceProvider.js l.26-53): a MiniBus to the page, a SandboxRegistry whose
// `_create` evaluates the component's source in the Worker's global scope and calls the global
// `activate` (or `activate.default`) with (url, miniBus, config, factory).
importScripts('minibus.js');

self._miniBus = new MiniBus();
self._miniBus._onPostMessage = function (msg) {
  self.postMessage(msg);
};
self.addEventListener('message', function (event) {
  self._miniBus._onMessage(event.data);
});

self._registry = new SandboxRegistry(self._miniBus);
self._registry._create = function (url, sourceCode, config, factory) {
  eval.apply(self, [sourceCode]);
  if (typeof activate === 'function') {
    return activate(url, self._miniBus, config, factory);
  }
  if (typeof activate.default === 'function') {
    return activate.default(url, self._miniBus, config, factory);
  }
};

// Not the runtime's: how the test reads the stub's counters. A hyperty-runtime:// address, which
// the MiniBus does not hand to the stub's default listener.
self._miniBus.addListener('hyperty-runtime://harness/stats', function (msg) {
  const [component] = Object.values(self._registry.components);
  self._miniBus.postMessage({
    id: msg.id, type: 'response', from: msg.to, to: msg.from, body: { code: 200, value: component.instance.stats },
  });
});
