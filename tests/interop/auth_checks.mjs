// What the TypeScript interop clients share on a protected route (tests/interop/auth.sh).
//
// The options (--bearer, --unauthorized, --wrong-bearer, --denied-tool, --denied-bearer, the
// tokens also from the environment), the transport's requestInit with the Authorization
// header, and the checks that do not depend on the SDK: a 401 challenge and a tool list
// without the denied tool. No SDK import: ts_client.mjs uses it with
// @modelcontextprotocol/client 2.4.0, legacy_ts_client.mjs with @modelcontextprotocol/sdk 1.32.2.
// The checks take the client's own `assert`, so that failures read like its others.

export const AUTH_OPTIONS = {
  bearer: { type: 'string', default: process.env.INTEROP_BEARER },
  unauthorized: { type: 'boolean', default: false },
  'wrong-bearer': { type: 'string', default: process.env.INTEROP_WRONG_BEARER },
  'denied-tool': { type: 'string' },
  'denied-bearer': { type: 'string', default: process.env.INTEROP_DENIED_BEARER },
};
export const AUTH_USAGE = '[--bearer TOKEN] [--unauthorized [--wrong-bearer TOKEN]] [--denied-tool NAME --denied-bearer TOKEN]';

export function checkAuthOptions(opts) {
  if (opts['denied-tool'] && !opts['denied-bearer']) {
    console.error('--denied-tool needs --denied-bearer (or INTEROP_DENIED_BEARER)');
    process.exit(2);
  }
}

// The transport's requestInit for `bearer` (none without a token).
export const bearerInit = (bearer) => (bearer ? { headers: { Authorization: `Bearer ${bearer}` } } : undefined);

// The arguments the profile calls `tool` with (none when it names no such call).
export const argsFor = (profile, tool) =>
  Object.values(profile).find((s) => s && typeof s === 'object' && s.tool === tool)?.args ?? {};

// The denied caller's tools/list: not empty, without `tool`, with the profile's echo tool.
export function checkListedWithout(assert, names, tool, echo) {
  assert(names.size > 0, 'tools/list is empty');
  assert(!names.has(tool), `tools/list shows the denied tool ${tool}: ${[...names].sort()}`);
  if (echo) assert(names.has(echo.tool), `tools/list lacks ${echo.tool} (has ${[...names].sort()})`);
}

// Every exchange answered 401, the first with a Bearer challenge naming the metadata (and,
// for a token that came, error="invalid_token").
export function checkChallenge(assert, statuses, challenge, bearer) {
  assert(statuses.length > 0 && statuses.every((s) => s === 401), `HTTP statuses ${JSON.stringify(statuses)}, want only 401`);
  assert(challenge.startsWith('Bearer'), `WWW-Authenticate ${JSON.stringify(challenge)}`);
  assert(challenge.includes('resource_metadata="'), `WWW-Authenticate without resource_metadata: ${JSON.stringify(challenge)}`);
  if (bearer) assert(challenge.includes('error="invalid_token"'), `WWW-Authenticate ${JSON.stringify(challenge)}`);
}

// A denied call's 403 body: JSON-RPC -31003 with data.reason "denied".
export function checkDeniedBody(assert, body) {
  const compact = body.replace(/\s/g, '');
  assert(compact.includes('"code":-31003') && compact.includes('"reason":"denied"'), `403 body ${JSON.stringify(body)}, want -31003 denied`);
}
