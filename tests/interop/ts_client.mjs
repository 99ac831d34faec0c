// Modern (2026-07-28) interop client on the official TypeScript SDK
// @modelcontextprotocol/client@2.4.0 (with @modelcontextprotocol/core@2.4.0).
//
//   node tests/interop/ts_client.mjs --url http://127.0.0.1:Q/mcp --upstream py-legacy [--mrtr]
//
// The client is pinned with `versionNegotiation: { mode: { pin: '2026-07-28' } }`:
// connect() sends server/discover and fails loudly (no fallback to `initialize`) if
// the server does not offer 2026-07-28. The `connect` flow also asserts the
// negotiated version and era; the `wire` flow checks every HTTP exchange (POST only,
// no initialize, no Mcp-Session-Id either way, 2026 headers on every request).
// Expectations per upstream come from tests/interop/profiles.json.
// `--allow-legacy` (self-test of the expectations straight against a legacy upstream)
// connects with mode 'auto' instead and drops the era, logging and wire checks.
// On a route with an authentication policy (tests/interop/auth.sh): `--bearer TOKEN` (or
// $INTEROP_BEARER) sends `Authorization: Bearer TOKEN` on every request (the transport's
// `requestInit.headers`); `--unauthorized` also connects without a token and with
// `--wrong-bearer` ($INTEROP_WRONG_BEARER): both must fail with the SDK's HTTP error, status
// 401, whose WWW-Authenticate carries resource_metadata; `--denied-tool NAME` with
// `--denied-bearer` ($INTEROP_DENIED_BEARER) connects as a caller a rule denies NAME: absent
// from tools/list, refused on call (403, -31003), other tools still answer.
// Prints `PASS|FAIL|SKIP ts/<upstream>/<flow>[: reason]`; exit status 1 if any flow failed.
//
// The SDK is loaded from $SESSIONLESS_PEERS/node/node_modules (default: <repo>/.peers).
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { AUTH_OPTIONS, AUTH_USAGE, argsFor, bearerInit, checkAuthOptions, checkChallenge, checkDeniedBody, checkListedWithout } from './auth_checks.mjs';

const MODERN = '2026-07-28';
let allowLegacy = false;
const FLOW_TIMEOUT_MS = 20_000;
const here = path.dirname(fileURLToPath(import.meta.url));
const peers = process.env.SESSIONLESS_PEERS ?? path.resolve(here, '../../.peers');

async function importPeer(name) {
  const dir = path.join(peers, 'node/node_modules', name);
  const pkg = JSON.parse(readFileSync(path.join(dir, 'package.json'), 'utf8'));
  const entry = pkg.exports['.'].import.default ?? pkg.exports['.'].import;
  return import(pathToFileURL(path.join(dir, entry)).href);
}

const { Client, StreamableHTTPClientTransport, LOG_LEVEL_META_KEY } = await importPeer('@modelcontextprotocol/client');

const { values: opts } = parseArgs({
  options: {
    url: { type: 'string' },
    upstream: { type: 'string' },
    mrtr: { type: 'boolean', default: false },
    'allow-legacy': { type: 'boolean', default: false },
    verbose: { type: 'boolean', default: false },
    ...AUTH_OPTIONS,
  },
});
if (!opts.url || !opts.upstream) {
  console.error(`usage: ts_client.mjs --url URL --upstream NAME [--mrtr] [--allow-legacy] [--verbose] ${AUTH_USAGE}`);
  process.exit(2);
}
checkAuthOptions(opts);
allowLegacy = opts['allow-legacy'];
const profile = JSON.parse(readFileSync(path.join(here, 'profiles.json'), 'utf8'))[opts.upstream];
if (!profile) {
  console.error(`unknown upstream profile ${opts.upstream}`);
  process.exit(2);
}

// ------------------------------------------------------------------ wire recorder

const exchanges = [];
async function recordingFetch(input, init = {}) {
  const req = input instanceof Request ? input : undefined;
  const method = init.method ?? req?.method ?? 'GET';
  const headers = Object.fromEntries(new Headers(init.headers ?? req?.headers ?? {}).entries());
  let body;
  try {
    body = typeof init.body === 'string' ? JSON.parse(init.body) : undefined;
  } catch {
    body = undefined;
  }
  const ex = { method, headers, body };
  exchanges.push(ex);
  const res = await fetch(input, init);
  ex.status = res.status;
  ex.respHeaders = Object.fromEntries(res.headers.entries());
  if (res.status >= 400) {
    try {
      ex.respBody = (await res.clone().text()).slice(0, 500);
    } catch {
      /* ignore */
    }
  }
  return res;
}

function lastError(since) {
  for (const ex of exchanges.slice(since).reverse()) {
    if (ex.status >= 400) return ` [last HTTP error: ${ex.body?.method ?? ex.method} -> ${ex.status} ${ex.respBody ?? ''}]`;
  }
  return '';
}

// ------------------------------------------------------------------ helpers

let failures = 0;
function report(status, flow, reason = '') {
  console.log(`${status} ts/${opts.upstream}/${flow}${reason ? ': ' + reason : ''}`);
  if (status === 'FAIL') failures++;
}

class Assertion extends Error {}
function assert(cond, msg) {
  if (!cond) throw new Assertion(msg);
}

function describe(e) {
  if (e instanceof Assertion) return `assertion: ${e.message}`;
  if (e && typeof e === 'object' && 'code' in e && e.code !== undefined) {
    const data = e.data !== undefined ? ` data=${JSON.stringify(e.data).slice(0, 300)}` : '';
    return `${e.constructor?.name ?? 'Error'} ${e.code}: ${e.message}${data}`;
  }
  return `${e?.constructor?.name ?? 'Error'}: ${e?.message ?? e}`;
}

async function flow(name, fn, needs) {
  const spec = needs ? profile[needs] : undefined;
  if (needs && spec == null) {
    report('SKIP', name, `upstream has no ${needs} fixture`);
    return;
  }
  const since = exchanges.length;
  let timer;
  try {
    await Promise.race([
      fn(spec),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out after ${FLOW_TIMEOUT_MS} ms`)), FLOW_TIMEOUT_MS);
      }),
    ]);
    report('PASS', name);
  } catch (e) {
    if (opts.verbose) console.error(e);
    report('FAIL', name, describe(e) + lastError(since));
  } finally {
    clearTimeout(timer);
  }
}

const textOf = (blocks) => blocks.filter((b) => b.type === 'text').map((b) => b.text).join('');

function checkText(got, spec, what) {
  if ('text' in spec) assert(got === spec.text, `${what}: expected ${JSON.stringify(spec.text)}, got ${JSON.stringify(got)}`);
  if ('textContains' in spec)
    assert(got.includes(spec.textContains), `${what}: expected to contain ${JSON.stringify(spec.textContains)}, got ${JSON.stringify(got)}`);
}

// A client of the URL sending `bearer` (default --bearer; null: no Authorization header).
function makeClient(capabilities = {}, bearer = opts.bearer) {
  const client = new Client(
    { name: 'interop-ts', version: '1' },
    { capabilities, versionNegotiation: { mode: allowLegacy ? 'auto' : { pin: MODERN } } },
  );
  const transport = new StreamableHTTPClientTransport(new URL(opts.url), { fetch: recordingFetch, requestInit: bearerInit(bearer) });
  return { client, transport };
}

const BYPASS = { cacheMode: 'bypass' };
const logs = [];

// ------------------------------------------------------------------ flows

const { client, transport } = makeClient();
client.setNotificationHandler('notifications/message', (n) => {
  logs.push(n.params);
});
let connected = false;

await flow('connect', async () => {
  await client.connect(transport);
  connected = true;
  if (allowLegacy) return;
  assert(client.getNegotiatedProtocolVersion() === MODERN, `negotiated ${client.getNegotiatedProtocolVersion()}, want ${MODERN}`);
  assert(client.getProtocolEra() === 'modern', `era ${client.getProtocolEra()}`);
});

await flow('server-info', async () => {
  assert(connected, 'not connected');
  const info = client.getServerVersion();
  assert(info, 'no serverInfo (discover result _meta io.modelcontextprotocol/serverInfo)');
  assert(info.name === profile.serverName, `serverInfo.name ${JSON.stringify(info.name)}`);
  const caps = client.getServerCapabilities() ?? {};
  const missing = profile.capabilities.filter((k) => !(k in caps));
  assert(missing.length === 0, `capabilities ${JSON.stringify(Object.keys(caps))} lack ${missing}`);
});

const FLOWS = ['discover', 'tools-list', 'call-echo', 'call-add', 'progress', 'concurrent', 'logging', 'logging-no-opt-in', 'tool-error',
  'session-state', 'resources', 'resource-templates', 'prompts'];
if (!connected) {
  for (const f of FLOWS) report('FAIL', f, 'not run: connect failed');
} else {
  if (!allowLegacy) await flow('discover', async () => {
    const d = await client.discover();
    assert(d.supportedVersions.includes(MODERN), `supportedVersions ${JSON.stringify(d.supportedVersions)}`);
    assert((d.resultType ?? 'complete') === 'complete', `resultType ${d.resultType}`);
    assert('ttlMs' in d && 'cacheScope' in d, `discover result lacks ttlMs/cacheScope: ${JSON.stringify(Object.keys(d))}`);
  });

  await flow('tools-list', async () => {
    const names = new Set((await client.listTools(undefined, BYPASS)).tools.map((t) => t.name));
    const want = ['echo', 'add', 'progress', 'logging', 'error', 'state'].filter((k) => profile[k]).map((k) => profile[k].tool);
    const missing = want.filter((n) => !names.has(n));
    assert(missing.length === 0, `tools/list lacks ${missing} (has ${[...names].sort()})`);
  });

  const call = async (spec) => {
    const r = await client.callTool({ name: spec.tool, arguments: spec.args });
    assert(!r.isError, `isError result: ${JSON.stringify(textOf(r.content))}`);
    checkText(textOf(r.content), spec, spec.tool);
  };
  await flow('call-echo', call, 'echo');
  await flow('call-add', call, 'add');

  await flow(
    'progress',
    async (spec) => {
      const seen = [];
      const r = await client.callTool({ name: spec.tool, arguments: spec.args }, { onprogress: (p) => seen.push(p) });
      assert(!r.isError, `isError result: ${JSON.stringify(textOf(r.content))}`);
      checkText(textOf(r.content), spec, spec.tool);
      const values = seen.map((p) => p.progress);
      assert(values.length >= spec.count, `${values.length} progress notifications arrived, want ${spec.count}: ${JSON.stringify(seen)}`);
      assert(values.every((v, i) => i === 0 || v > values[i - 1]), `progress not increasing: ${values}`);
    },
    'progress',
  );

  await flow(
    'concurrent',
    async (spec) => {
      // Three progress calls and three echo calls at once on one client: no cross-talk.
      const echo = profile.echo;
      const seen = [[], [], []];
      const calls = [0, 1, 2].flatMap((i) => [
        client.callTool({ name: spec.tool, arguments: spec.args }, { onprogress: (p) => seen[i].push(p.progress) }).then((r) => ['progress' + i, r, spec]),
        ...(echo ? [client.callTool({ name: echo.tool, arguments: echo.args }).then((r) => ['echo' + i, r, echo])] : []),
      ]);
      for (const [key, r, s] of await Promise.all(calls)) {
        assert(!r.isError, `${key}: isError result: ${JSON.stringify(textOf(r.content))}`);
        checkText(textOf(r.content), s, key);
      }
      const counts = seen.map((v) => v.length);
      assert(counts.every((n) => n === spec.count), `progress notifications per call ${JSON.stringify(counts)}, want ${spec.count} each: ${JSON.stringify(seen)}`);
    },
    'progress',
  );

  if (!allowLegacy) await flow(
    'logging',
    async (spec) => {
      logs.length = 0;
      const r = await client.callTool({ name: spec.tool, arguments: spec.args, _meta: { [LOG_LEVEL_META_KEY]: spec.level } });
      assert(!r.isError, `isError result: ${JSON.stringify(textOf(r.content))}`);
      checkText(textOf(r.content), spec, spec.tool);
      await new Promise((res) => setTimeout(res, 100));
      const levels = logs.map((m) => m.level);
      assert(JSON.stringify(levels) === JSON.stringify(spec.expectLevels), `log levels ${JSON.stringify(levels)}, want ${JSON.stringify(spec.expectLevels)}`);
      const bad = levels.filter((l) => spec.forbidLevels.includes(l));
      assert(bad.length === 0, `received messages below the requested level ${spec.level}: ${bad}`);
    },
    'logging',
  );

  if (!allowLegacy) await flow(
    'logging-no-opt-in',
    async (spec) => {
      logs.length = 0;
      const r = await client.callTool({ name: spec.tool, arguments: spec.args });
      assert(!r.isError, `isError result: ${JSON.stringify(textOf(r.content))}`);
      await new Promise((res) => setTimeout(res, 100));
      assert(logs.length === 0, `log messages arrived without a logLevel opt-in: ${JSON.stringify(logs.map((m) => m.level))}`);
    },
    'logging',
  );

  await flow(
    'tool-error',
    async (spec) => {
      const r = await client.callTool({ name: spec.tool, arguments: spec.args });
      assert(r.isError === true, `expected isError: true, got ${JSON.stringify(r)}`);
      checkText(textOf(r.content), spec, spec.tool);
    },
    'error',
  );

  await flow(
    'session-state',
    async (spec) => {
      const values = [];
      for (let i = 0; i < 2; i++) {
        const r = await client.callTool({ name: spec.tool, arguments: spec.args });
        const m = new RegExp(spec.pattern).exec(textOf(r.content));
        assert(m, `unexpected counter text ${JSON.stringify(textOf(r.content))}`);
        values.push(Number(m[1]));
      }
      assert(values.every((v) => v >= 1), JSON.stringify(values));
      console.log(`INFO ts/${opts.upstream}/state: counter values ${JSON.stringify(values)}`);
    },
    'state',
  );

  const contentsText = (rr) => rr.contents.map((c) => c.text ?? '').join('');
  await flow(
    'resources',
    async (spec) => {
      const listed = (await client.listResources(undefined, BYPASS)).resources.map((r) => r.uri);
      assert(listed.includes(spec.uri), `resources/list lacks ${spec.uri} (has ${listed.slice(0, 8)})`);
      const rr = await client.readResource({ uri: spec.uri }, BYPASS);
      assert(rr.contents.length > 0, 'resources/read returned no contents');
      checkText(contentsText(rr), spec, spec.uri);
    },
    'resource',
  );

  await flow(
    'resource-templates',
    async (spec) => {
      const listed = (await client.listResourceTemplates(undefined, BYPASS)).resourceTemplates.map((t) => t.uriTemplate);
      assert(listed.includes(spec.uriTemplate), `resources/templates/list lacks ${spec.uriTemplate} (has ${listed})`);
      const rr = await client.readResource({ uri: spec.uri }, BYPASS);
      checkText(contentsText(rr), spec, spec.uri);
    },
    'template',
  );

  await flow(
    'prompts',
    async (spec) => {
      const listed = (await client.listPrompts(undefined, BYPASS)).prompts;
      const p = listed.find((x) => x.name === spec.name);
      assert(p, `prompts/list lacks ${spec.name} (has ${listed.map((x) => x.name)})`);
      const args = (p.arguments ?? []).map((a) => a.name).sort();
      assert(JSON.stringify(args) === JSON.stringify([...spec.argNames].sort()), `prompt arguments ${args}`);
      const g = await client.getPrompt({ name: spec.name, arguments: spec.args });
      checkText(textOf(g.messages.map((m) => m.content)), spec, spec.name);
    },
    'prompt',
  );
}

// ------------------------------------------------------------------ MRTR (opt-in)

if (opts.mrtr) {
  await flow(
    'elicitation',
    async (spec) => {
      const { client: c, transport: t } = makeClient({ elicitation: { form: {} } });
      const asked = [];
      c.setRequestHandler('elicitation/create', async (req) => {
        asked.push(req.params);
        return { action: 'accept', content: spec.answer };
      });
      await c.connect(t);
      try {
        const r = await c.callTool({ name: spec.tool, arguments: spec.args });
        assert(asked.length > 0, `the elicitation handler was never called; result isError=${r.isError} text=${JSON.stringify(textOf(r.content))}`);
        assert(!r.isError, `isError result: ${JSON.stringify(textOf(r.content))}`);
        checkText(textOf(r.content), spec, spec.tool);
      } finally {
        await c.close();
      }
    },
    'elicitation',
  );

  await flow(
    'sampling',
    async (spec) => {
      const { client: c, transport: t } = makeClient({ sampling: {} });
      const asked = [];
      c.setRequestHandler('sampling/createMessage', async (req) => {
        asked.push(req.params);
        return { role: 'assistant', content: { type: 'text', text: spec.answer }, model: 'interop-model' };
      });
      await c.connect(t);
      try {
        const r = await c.callTool({ name: spec.tool, arguments: spec.args });
        assert(asked.length > 0, `the sampling handler was never called; result isError=${r.isError} text=${JSON.stringify(textOf(r.content))}`);
        assert(!r.isError, `isError result: ${JSON.stringify(textOf(r.content))}`);
        checkText(textOf(r.content), spec, spec.tool);
      } finally {
        await c.close();
      }
    },
    'sampling',
  );
}

// ------------------------------------------------------------------ authentication, authorization

if (opts['denied-tool']) {
  const tool = opts['denied-tool'];
  const echo = profile.echo;
  const { client: d, transport: t } = makeClient({}, opts['denied-bearer']);
  let open = false;
  await flow('denied-list', async () => {
    await d.connect(t);
    open = true;
    checkListedWithout(assert, new Set((await d.listTools(undefined, BYPASS)).tools.map((x) => x.name)), tool, echo);
  });
  await flow('denied-call', async () => {
    assert(open, 'not connected');
    const since = exchanges.length;
    let error;
    try {
      await d.callTool({ name: tool, arguments: argsFor(profile, tool) });
    } catch (e) {
      error = e;
    }
    assert(error, `calling the denied tool ${tool} answered a result`);
    assert(error.status === 403, `error ${describe(error)}: status ${error.status}, want 403`);
    checkDeniedBody(assert, exchanges.slice(since).map((ex) => ex.respBody ?? '').join(''));
    const statuses = exchanges.slice(since).map((ex) => ex.status);
    assert(JSON.stringify(statuses) === '[403]', `HTTP statuses of the call ${JSON.stringify(statuses)}, want [403]`);
    if (echo) {
      const r = await d.callTool({ name: echo.tool, arguments: echo.args });
      assert(!r.isError, `${echo.tool} as the denied caller: isError ${JSON.stringify(textOf(r.content))}`);
      checkText(textOf(r.content), echo, echo.tool);
    }
  });
  if (open) await d.close().catch(() => {});
}

// Connecting with this bearer (null: none) fails with a 401 whose challenge names the metadata.
async function refused401(bearer) {
  const { client: c, transport: t } = makeClient({}, bearer);
  const since = exchanges.length;
  let error;
  try {
    await c.connect(t);
    await c.listTools(undefined, BYPASS);
  } catch (e) {
    error = e;
  } finally {
    await c.close().catch(() => {});
  }
  assert(error, 'connected and listed tools without valid credentials');
  assert(error.status === 401, `error ${describe(error)}: status ${error.status}, want 401`);
  const seen = exchanges.slice(since);
  checkChallenge(assert, seen.map((ex) => ex.status), seen[0]?.respHeaders?.['www-authenticate'] ?? '', bearer);
}

if (opts.unauthorized) {
  await flow('unauthorized-missing', () => refused401(null));
  if (opts['wrong-bearer']) await flow('unauthorized-wrong', () => refused401(opts['wrong-bearer']));
}

// ------------------------------------------------------------------ wire

if (!allowLegacy) await flow('wire', async () => {
  const problems = new Set();
  let posts = 0;
  for (const ex of exchanges) {
    const h = ex.headers;
    const rh = ex.respHeaders ?? {};
    const method = ex.body?.method;
    if (ex.method !== 'POST') {
      problems.add(`${ex.method} request sent (2026 clients only POST)`);
      continue;
    }
    posts++;
    if (method === 'initialize' || method === 'notifications/initialized') problems.add(`legacy handshake on the wire: ${method}`);
    if ('mcp-session-id' in h) problems.add(`request ${method} carried Mcp-Session-Id`);
    if ('mcp-session-id' in rh) problems.add(`response to ${method} carried Mcp-Session-Id ${JSON.stringify(rh['mcp-session-id'])}`);
    if (h['mcp-protocol-version'] !== MODERN) problems.add(`request ${method} MCP-Protocol-Version ${JSON.stringify(h['mcp-protocol-version'])}`);
    if (method && 'id' in ex.body) {
      if (h['mcp-method'] !== method) problems.add(`request ${method} Mcp-Method ${JSON.stringify(h['mcp-method'])}`);
      const pv = ex.body.params?._meta?.['io.modelcontextprotocol/protocolVersion'];
      if (pv !== MODERN) problems.add(`request ${method} _meta protocolVersion ${JSON.stringify(pv)}`);
    }
  }
  assert(posts > 0, 'no POST recorded');
  assert(problems.size === 0, [...problems].sort().slice(0, 8).join('; '));
});

if (connected) await client.close().catch(() => {});
process.exit(failures ? 1 : 0);
