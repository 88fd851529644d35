// The Pinger hyperty of pinger.js, as runtime-core since 2019 loads hyperties: a System.register
// module whose default export is a class it makes with `new` and starts with `_start`.
System.register([], function (_export) {
  'use strict';
  return {
    execute: function () {
      %(activate)s
      function Pinger() {}
      Pinger.prototype._start = function (hypertyURL, bus, configuration) {
        var instance = activate(hypertyURL, bus, configuration).instance;
        this.hypertyURL = instance.hypertyURL;
        this.received = instance.received;
        this.ping = instance.ping;
      };
      _export('default', Pinger);
    },
  };
});
