// A hyperty (a classic script defining the global `activate`, as reTHINK's runtime of 2018 deploys
// hyperties): it records the numbers of the pings that reach it, and sends numbered pings.
var activate = function (hypertyURL, bus, configuration) {
  var received = [];
  bus.addListener(hypertyURL, function (msg) {
    if (msg.type === 'ping') received.push(msg.body.n);
  });
  return {
    name: 'Pinger',
    instance: {
      hypertyURL: hypertyURL,
      received: received,
      ping: function (to, first, count) {
        for (var n = first; n < first + count; n += 1) {
          bus.postMessage({ type: 'ping', from: hypertyURL, to: to, body: { n: n } });
        }
      },
    },
  };
};
