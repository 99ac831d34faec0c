// Preload (`node --import ./loopback.mjs app.js`) that forces every TCP listen of
// the process onto 127.0.0.1. server-everything calls `app.listen(PORT)`, which
// would bind all interfaces; the interop tests must stay on loopback.
// Unix-socket paths and handle objects pass through untouched.
import net from 'node:net';

const HOST = '127.0.0.1';
const listen = net.Server.prototype.listen;

const isPort = (v) => typeof v === 'number' || (typeof v === 'string' && /^\d+$/.test(v));

net.Server.prototype.listen = function (...args) {
  const [first] = args;
  if (isPort(first)) {
    // listen(port[, host][, backlog][, cb])
    if (typeof args[1] === 'string') args[1] = HOST;
    else args.splice(1, 0, HOST);
  } else if (first && typeof first === 'object' && !('_handle' in first) && !('fd' in first) && !('path' in first)) {
    // listen({ port, host, ... }[, cb])
    args[0] = { ...first, host: HOST };
    delete args[0].ipv6Only;
  } else if (first === undefined || typeof first === 'function') {
    // listen() / listen(cb): an ephemeral port
    args.unshift(0, HOST);
  }
  return listen.apply(this, args);
};
