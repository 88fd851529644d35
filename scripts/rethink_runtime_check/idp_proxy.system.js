// The stand-in identity provider of idp_proxy.js, as runtime-core since 2019 loads IdP proxies:
// a System.register module whose default export is a class it makes with `new` and starts with
// `_start(url, bus, config)`.
System.register([], function (_export) {
  'use strict';
  return {
    execute: function () {
      %(activate)s
      function StandInIdp() {}
      StandInIdp.prototype._start = function (url, bus, config) {
        activate(url, bus, config);
      };
      _export('default', StandInIdp);
    },
  };
});
