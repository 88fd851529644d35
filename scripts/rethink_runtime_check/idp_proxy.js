// A stand-in identity provider, deployed by reTHINK's runtime as an IdP proxy (a classic script
// defining the global `activate`, like the stub): it vouches for a user named after the runtime,
// with no login. reTHINK's IdP proxies answer `generateAssertion` and `validateAssertion` sent to
// domain-idp://<idp> (dev-protostubs src/idpproxy/AbstractIdpProxyStub.js); the runtime registers
// no hyperty without an identity, and its own proxies log in at Google and the like.
var activate = function (url, bus, config) {
  var domain = '%(idp)s';
  var name = String(config.runtimeURL || 'someone').split('/').pop();
  var b64 = function (o) {
    return btoa(JSON.stringify(o)).replace(/=+$/, '').replace(/\+/g, '-').replace(/\//g, '_');
  };
  var expires = Math.floor(Date.now() / 1000) + 86400;
  var email = name + '@' + domain;
  var profile = {
    userURL: 'user://' + domain + '/' + name, username: email, email: email, cn: name, name: name, picture: '',
  };
  var claims = { iss: domain, sub: name, email: email, exp: expires };
  var token = b64({ alg: 'none', typ: 'JWT' }) + '.' + b64(claims) + '.stand-in';
  bus.addListener('*', function (msg) {
    if (msg.to !== 'domain-idp://' + domain) return;
    var value = {};
    if (msg.body.method === 'generateAssertion') {
      value = {
        assertion: token, idp: { domain: domain, protocol: 'OIDC' }, userProfile: profile,
        expires: expires, info: { expires: expires },
      };
    } else if (msg.body.method === 'validateAssertion') {
      value = { identity: email, contents: msg.body.params && msg.body.params.assertion };
    }
    var body = { code: 200, value: value };
    bus.postMessage({ id: msg.id, type: 'response', to: msg.from, from: msg.to, body: body });
  });
  bus.postMessage({ type: 'update', from: url, to: url + '/status', body: { value: 'live' } });
  return { name: 'StandInIdp', instance: {} };
};
