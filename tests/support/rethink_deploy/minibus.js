// The parts of reTHINK's runtime-core that stand between a runtime and a protocol stub, as this
// project's own code written from reading theirs (reTHINK-project/dev-runtime-core, commit
// 76024860 of 2018-10-24, the one dev-runtime-browser's bin/ was built with, and 4a7264e6 of
// 2019-06-27 for the SystemJS sandbox): MiniBus (src/bus/Bus.js, src/bus/MiniBus.js `_onMessage`
// l.55) and SandboxRegistry (src/sandbox/SandboxRegistry.js `_onDeploy` l.87). A classic script,
// so that a Worker can importScripts() it as dev-runtime-browser's bundle carries them.
(function (scope) {
  'use strict';

  class MiniBus {
    constructor() {
      this._msgId = 0;
      this._subscriptions = {};
      this._responseCallbacks = {};
    }

    addListener(url, callback) {
      const list = (this._subscriptions[url] ??= []);
      const item = { callback };
      list.push(item);
      return { remove: () => list.splice(list.indexOf(item), 1) };
    }

    // Bus.postMessage: numbers the message, keeps the response callback, hands it out.
    postMessage(msg, responseCallback) {
      if (!msg.id || msg.id === 0) msg.id = ++this._msgId;
      if (responseCallback) this._responseCallbacks[msg.from + msg.id] = responseCallback;
      this._onPostMessage(msg);
      return msg.id;
    }

    // Bus._onResponse: a response to a message posted with a callback goes to that callback.
    _onResponse(msg) {
      if (msg.type !== 'response') return false;
      const key = msg.to + msg.id;
      const callback = this._responseCallbacks[key];
      if (msg.body?.code >= 200) delete this._responseCallbacks[key];
      if (!callback) return false;
      callback(msg);
      return true;
    }

    // MiniBus._onMessage: listeners of the address; the default ('*') listeners too, unless the
    // address is a hyperty one. A protocol stub listens on '*'.
    _onMessage(msg) {
      if (this._onResponse(msg)) return;
      const list = this._subscriptions[msg.to];
      if (list) {
        for (const item of list) item.callback(msg);
        if (!msg.to.startsWith('hyperty')) this._publishOnDefault(msg);
      } else {
        this._publishOnDefault(msg);
      }
    }

    _publishOnDefault(msg) {
      for (const item of this._subscriptions['*'] ?? []) item.callback(msg);
    }

    _onPostMessage(_msg) {}
  }

  const EXTERNAL = 'hyperty-runtime://sandbox/external';
  const INTERNAL = 'hyperty-runtime://sandbox/internal';

  class SandboxRegistry {
    constructor(bus) {
      this._bus = bus;
      // runtime-core's SandboxFactory gives components a Syncher and the like; stubs need none.
      this._factory = { bus };
      this.components = {};
      bus.addListener(INTERNAL, (msg) => {
        if (msg.type === 'create') this._onDeploy(msg);
      });
    }

    _onDeploy(msg) {
      const { url, sourceCode, config } = msg.body;
      let code = 200;
      let desc;
      if (Object.hasOwn(this.components, url)) {
        code = 500;
        desc = `Instance ${url} already exist!`;
      } else {
        try {
          this.components[url] = this._create(url, sourceCode, config, this._factory);
        } catch (error) {
          code = 500;
          desc = String(error);
        }
      }
      const body = desc ? { code, desc } : { code };
      this._bus.postMessage({ id: msg.id, type: 'response', from: INTERNAL, to: EXTERNAL, body });
    }

    _create(_url, _sourceCode, _config, _factory) {}
  }

  scope.MiniBus = MiniBus;
  scope.SandboxRegistry = SandboxRegistry;
  scope.SANDBOX_EXTERNAL = EXTERNAL;
  scope.SANDBOX_INTERNAL = INTERNAL;
})(self);
