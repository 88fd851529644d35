// Evaluated in the runtime's Worker sandbox: notes the numbers of the pings the sandbox hands to
// the runtime (the stub's deliveries on their way out), without changing what happens to them.
// dev-runtime-browser src/ContextServiceProvider.js sends them out through self._miniBus._onPostMessage.
() => {
  const bus = self._miniBus;
  if (!bus || !bus._onPostMessage) return false;
  if (self.__pingsHandedOn) return true;
  self.__pingsHandedOn = [];
  const out = bus._onPostMessage;
  bus._onPostMessage = function (msg) {
    if (msg && msg.type === 'ping') self.__pingsHandedOn.push(msg.body.n);
    return out.call(this, msg);
  };
  return true;
}
