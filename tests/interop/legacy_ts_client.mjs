// Legacy (2025-11-25 session) interop client on the official TypeScript SDK v1,
// @modelcontextprotocol/sdk@1.32.2 (pinned in scripts/setup-peers), run with Node 22.
//
//   node tests/interop/legacy_ts_client.mjs --url http://127.0.0.1:Q/mcp --upstream py-legacy|everything [--label NAME]
//
// One Client with StreamableHTTPClientTransport: initialize (Mcp-Session-Id), then the
// standalone GET stream the SDK opens after notifications/initialized. Handlers for
// elicitation/create, sampling/createMessage and roots/list; logging (logging/setLevel),
// progress, resources/subscribe with notifications/resources/updated (sent by the
// upstream without a related request: only the GET stream carries it), and at the end
// DELETE (terminateSession) after which the session id is refused. Same flows and the
// same expectations (tests/interop/profiles.json, its "legacy" part) as legacy_client.py.
// A profile with "extends": NAME starts from that profile's entries. multi-round (two
// elicitation rounds, answers picked by the requested schema) and multiple-inputs
// (elicitation, sampling and roots/list in one round) run where the profile has them;
// getStreamStatus 405 in a profile means every GET must be answered 405.
// On a route with an authentication policy (tests/interop/auth.sh): `--bearer TOKEN` (or
// $INTEROP_BEARER) sends `Authorization: Bearer TOKEN` on every request (the transport's
// `requestInit.headers`: POSTs, the GET stream, DELETE; `wire` then checks every request
// carried it); `--unauthorized` also connects without a token and with `--wrong-bearer`
// ($INTEROP_WRONG_BEARER): the SDK must throw its StreamableHTTPError with code 401 and the
// challenge carry resource_metadata; `--denied-tool NAME` with `--denied-bearer`
// ($INTEROP_DENIED_BEARER) opens a session as a caller a rule denies NAME: absent from
// tools/list, refused on call (-31003 in a 200), other tools still answer.
// Prints `PASS|FAIL|SKIP <label>/<flow>[: reason]` (label default `legacy-ts/<upstream>`);
// exit status 1 if any flow failed.
//
// The SDK is loaded from $SESSIONLESS_PEERS/node/node_modules (default: <repo>/.peers).
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { AUTH_OPTIONS, AUTH_USAGE, argsFor, bearerInit, checkAuthOptions, checkChallenge, checkListedWithout } from './auth_checks.mjs';

const LEGACY = '2025-11-25';
const FLOW_TIMEOUT_MS = 20_000;
const ROOT_URI = 'file:///tmp/sessionless-interop';
const ROOT_NAME = 'interop-root';
const here = path.dirname(fileURLToPath(import.meta.url));
const peers = process.env.SESSIONLESS_PEERS ?? path.resolve(here, '../../.peers');
const sdkDir = path.join(peers, 'node/node_modules/@modelcontextprotocol/sdk');
const sdkVersion = JSON.parse(readFileSync(path.join(sdkDir, 'package.json'), 'utf8')).version;
const sdk = (p) => import(pathToFileURL(path.join(sdkDir, 'dist/esm', p)).href);

const { Client } = await sdk('client/index.js');
const { StreamableHTTPClientTransport } = await sdk('client/streamableHttp.js');
const {
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  ListRootsRequestSchema,
  LoggingMessageNotificationSchema,
  ResourceUpdatedNotificationSchema,
  ToolListChangedNotificationSchema,
} = await sdk('types.js');

const { values: opts } = parseArgs({
  options: {
    url: { type: 'string' },
    upstream: { type: 'string' },
    label: { type: 'string' },
    verbose: { type: 'boolean', default: false },
    ...AUTH_OPTIONS,
  },
});
if (!opts.url || !opts.upstream) {
  console.error(`usage: legacy_ts_client.mjs --url URL --upstream NAME [--label NAME] [--verbose] ${AUTH_USAGE}`);
  process.exit(2);
}
checkAuthOptions(opts);
const label = opts.label ?? `legacy-ts/${opts.upstream}`;
const profiles = JSON.parse(readFileSync(path.join(here, 'profiles.json'), 'utf8'));
const own = profiles[opts.upstream];
const profile = own?.extends ? { ...profiles[own.extends], ...own } : own;
if (!profile?.legacy) {
  console.error(`no legacy profile for upstream ${opts.upstream}`);
  process.exit(2);
}
const legacy = profile.legacy;

// ------------------------------------------------------------------ wire recorder

const exchanges = [];
async function recordingFetch(input, init = {}) {
  const method = init.method ?? 'GET';
  const headers = Object.fromEntries(new Headers(init.headers ?? {}).entries());
  const ex = {
    method,
    session: headers['mcp-session-id'],
    version: headers['mcp-protocol-version'],
    authorization: 'authorization' in headers,
    body: typeof init.body === 'string' ? init.body.slice(0, 200) : '',
  };
  exchanges.push(ex);
  const res = await fetch(input, init);
  ex.status = res.status;
  ex.type = res.headers.get('content-type') ?? '';
  ex.issued = res.headers.get('mcp-session-id') ?? undefined;
  ex.challenge = res.headers.get('www-authenticate') ?? '';
  if (res.status >= 400) ex.respBody = (await res.clone().text().catch(() => '')).slice(0, 300);
  return res;
}

// ------------------------------------------------------------------ helpers

let failures = 0;
function report(status, flow, reason = '') {
  console.log(`${status} ${label}/${flow}${reason ? ': ' + reason : ''}`);
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

function lastError(since) {
  for (const ex of exchanges.slice(since).reverse()) {
    if (ex.status >= 400) return ` [last HTTP error: ${ex.method} -> ${ex.status} ${ex.respBody ?? ''}]`;
  }
  return '';
}

async function flow(name, fn, needs) {
  let spec;
  if (needs) {
    spec = needs in legacy ? legacy[needs] : profile[needs];
    if (spec == null) {
      report('SKIP', name, `upstream has no ${needs} fixture`);
      return;
    }
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
const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

function checkText(got, spec, what) {
  if ('text' in spec) assert(got === spec.text, `${what}: expected ${JSON.stringify(spec.text)}, got ${JSON.stringify(got)}`);
  if ('textContains' in spec)
    assert(got.includes(spec.textContains), `${what}: expected to contain ${JSON.stringify(spec.textContains)}, got ${JSON.stringify(got.slice(0, 300))}`);
}

// ------------------------------------------------------------------ client

const logs = [];
const notes = []; // { at, method, params }
const asked = { elicitation: 0, sampling: 0, roots: 0 };
const client = new Client(
  { name: 'interop-legacy-ts', version: sdkVersion },
  { capabilities: { elicitation: { form: {} }, sampling: {}, roots: { listChanged: true } } },
);
client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
  logs.push(n.params);
});
for (const schema of [ResourceUpdatedNotificationSchema, ToolListChangedNotificationSchema]) {
  client.setNotificationHandler(schema, (n) => {
    notes.push({ at: performance.now(), method: n.method, params: n.params });
  });
}
// The first of the profile's answers (its elicitation answer, then legacy.multiRound.answers)
// whose every key the requested schema has; the elicitation answer when none fits.
function pickAnswer(params) {
  const props = new Set(Object.keys(params?.requestedSchema?.properties ?? {}));
  const answers = [profile.elicitation.answer, ...(legacy.multiRound?.answers ?? [])];
  return answers.find((a) => a && Object.keys(a).every((k) => props.has(k))) ?? profile.elicitation.answer;
}
client.setRequestHandler(ElicitRequestSchema, async (req) => {
  asked.elicitation++;
  return { action: 'accept', content: pickAnswer(req.params) };
});
client.setRequestHandler(CreateMessageRequestSchema, async () => {
  asked.sampling++;
  return { role: 'assistant', content: { type: 'text', text: profile.sampling.answer }, model: 'interop-model' };
});
client.setRequestHandler(ListRootsRequestSchema, async () => {
  asked.roots++;
  return { roots: [{ uri: ROOT_URI, name: ROOT_NAME }] };
});
const transport = new StreamableHTTPClientTransport(new URL(opts.url), { fetch: recordingFetch, requestInit: bearerInit(opts.bearer) });
transport.onerror = (e) => opts.verbose && console.error('transport error:', e);

async function waitNote(method, since, match = () => true, ms = 10_000) {
  const deadline = performance.now() + ms;
  while (performance.now() < deadline) {
    const hit = notes.find((n) => n.method === method && n.at >= since && match(n.params));
    if (hit) return hit.at;
    await sleep(50);
  }
  throw new Assertion(`no ${method} within ${ms} ms (got ${JSON.stringify(notes.map((n) => n.method))})`);
}

// ------------------------------------------------------------------ flows

let connected = false;
let sessionId;
await flow('initialize', async () => {
  await client.connect(transport);
  connected = true;
  sessionId = transport.sessionId;
  assert(sessionId, 'no Mcp-Session-Id issued');
  assert(transport.protocolVersion === LEGACY, `negotiated ${transport.protocolVersion}, want ${LEGACY}`);
  const info = client.getServerVersion();
  assert(info?.name === profile.serverName, `serverInfo.name ${JSON.stringify(info?.name)}`);
  const caps = client.getServerCapabilities() ?? {};
  const missing = profile.capabilities.filter((k) => !(k in caps));
  assert(missing.length === 0, `capabilities ${JSON.stringify(Object.keys(caps))} lack ${missing}`);
  if (legacy.subscribe != null) assert(caps.resources?.subscribe, 'resources.subscribe not advertised');
});

const FLOWS = ['ping', 'tools', 'progress', 'logging', 'state', 'error', 'elicitation', 'sampling', 'resources', 'templates', 'prompts',
  'roots', 'multi-round', 'multiple-inputs', 'refused', 'subscribe', 'list-changed', 'get-stream', 'wire', 'terminate'];
if (!connected) {
  for (const f of FLOWS) report('FAIL', f, 'not run: initialize failed');
  process.exit(1);
}

await flow('ping', async () => {
  await client.ping();
});

const call = async (spec, what = spec.tool) => {
  const r = await client.callTool({ name: spec.tool, arguments: spec.args });
  assert(!r.isError, `${what}: isError result: ${JSON.stringify(textOf(r.content))}`);
  checkText(textOf(r.content), spec, what);
  return r;
};

await flow('tools', async () => {
  const names = new Set((await client.listTools()).tools.map((t) => t.name));
  const missing = legacy.tools.filter((n) => !names.has(n));
  assert(missing.length === 0, `tools/list lacks ${missing} (has ${[...names].sort()})`);
  if (profile.echo) await call(profile.echo, 'echo');
  if (profile.add) await call(profile.add, 'add');
});

await flow(
  'progress',
  async (spec) => {
    const seen = [];
    const r = await client.callTool({ name: spec.tool, arguments: spec.args }, undefined, { onprogress: (p) => seen.push(p.progress) });
    assert(!r.isError, `isError result: ${JSON.stringify(textOf(r.content))}`);
    checkText(textOf(r.content), spec, spec.tool);
    assert(seen.length === spec.count, `${seen.length} progress notifications, want ${spec.count}: ${seen}`);
    assert(seen.every((v, i) => i === 0 || v > seen[i - 1]), `progress not increasing: ${seen}`);
  },
  'progress',
);

await flow(
  'logging',
  async (spec) => {
    if (spec.subscribeUri) {
      // The upstream logs (on the GET stream) when a resource is subscribed to.
      const has = () => logs.filter((m) => String(m.data).includes(spec.textContains));
      logs.length = 0;
      await client.setLoggingLevel(spec.level);
      await client.subscribeResource({ uri: spec.subscribeUri });
      const deadline = performance.now() + 10_000;
      while (has().length === 0 && performance.now() < deadline) await sleep(50);
      assert(has().length > 0, `no log containing ${JSON.stringify(spec.textContains)} at ${spec.level}`);
      await client.setLoggingLevel(spec.quietLevel);
      logs.length = 0;
      await client.subscribeResource({ uri: spec.subscribeUri });
      await sleep(500);
      assert(has().length === 0, `logged at ${spec.level} with the level at ${spec.quietLevel}`);
      await client.unsubscribeResource({ uri: spec.subscribeUri });
      return;
    }
    logs.length = 0;
    await client.setLoggingLevel(spec.level);
    await call(spec);
    await sleep(100);
    const levels = logs.map((m) => m.level);
    assert(JSON.stringify(levels) === JSON.stringify(spec.expectLevels), `log levels ${JSON.stringify(levels)}, want ${JSON.stringify(spec.expectLevels)}`);
  },
  'logging',
);

await flow(
  'state',
  async (spec) => {
    const values = [];
    for (let i = 0; i < 2; i++) {
      const r = await client.callTool({ name: spec.tool, arguments: spec.args });
      const m = new RegExp(spec.pattern).exec(textOf(r.content));
      assert(m, `unexpected counter text ${JSON.stringify(textOf(r.content))}`);
      values.push(Number(m[1]));
    }
    assert(values[1] === values[0] + 1, `counter ${values}: not one upstream session`);
    console.log(`INFO ${label}/state: counter ${values[0]} then ${values[1]}`);
  },
  'state',
);

await flow(
  'error',
  async (spec) => {
    const r = await client.callTool({ name: spec.tool, arguments: spec.args });
    assert(r.isError === true, `expected isError: true, got ${JSON.stringify(r).slice(0, 300)}`);
    checkText(textOf(r.content), spec, spec.tool);
  },
  'error',
);

await flow(
  'elicitation',
  async (spec) => {
    const before = asked.elicitation;
    await call(spec);
    assert(asked.elicitation > before, 'the elicitation handler was never called');
  },
  'elicitation',
);

await flow(
  'sampling',
  async (spec) => {
    const before = asked.sampling;
    await call(spec);
    assert(asked.sampling > before, 'the sampling handler was never called');
  },
  'sampling',
);

const contentsText = (rr) => rr.contents.map((c) => c.text ?? '').join('');
await flow(
  'resources',
  async (spec) => {
    const listed = (await client.listResources()).resources.map((r) => r.uri);
    assert(listed.includes(spec.uri), `resources/list lacks ${spec.uri}`);
    checkText(contentsText(await client.readResource({ uri: spec.uri })), spec, spec.uri);
  },
  'resource',
);

await flow(
  'templates',
  async (spec) => {
    const listed = (await client.listResourceTemplates()).resourceTemplates.map((t) => t.uriTemplate);
    assert(listed.includes(spec.uriTemplate), `resources/templates/list lacks ${spec.uriTemplate} (has ${listed})`);
    checkText(contentsText(await client.readResource({ uri: spec.uri })), spec, spec.uri);
  },
  'template',
);

await flow(
  'prompts',
  async (spec) => {
    const p = (await client.listPrompts()).prompts.find((x) => x.name === spec.name);
    assert(p, `prompts/list lacks ${spec.name}`);
    const args = (p.arguments ?? []).map((a) => a.name).sort();
    assert(JSON.stringify(args) === JSON.stringify([...spec.argNames].sort()), `prompt arguments ${args}`);
    const g = await client.getPrompt({ name: spec.name, arguments: spec.args });
    checkText(textOf(g.messages.map((m) => m.content)), spec, spec.name);
  },
  'prompt',
);

await flow(
  'roots',
  async (spec) => {
    await call(spec);
    // askedOncePerProcess: the upstream session is a pooled one an earlier client may have
    // answered already (see profiles.json), so only the text is checked.
    if (!spec.askedOncePerProcess) assert(asked.roots > 0, 'the roots/list handler was never called');
  },
  'roots',
);

await flow(
  'multi-round',
  async (spec) => {
    const before = asked.elicitation;
    await call(spec);
    const n = asked.elicitation - before;
    assert(n === spec.answers.length, `the elicitation handler ran ${n} times, not ${spec.answers.length}`);
  },
  'multiRound',
);

await flow(
  'multiple-inputs',
  async (spec) => {
    const before = { ...asked };
    await call(spec);
    const idle = Object.keys(asked).filter((k) => asked[k] === before[k]);
    assert(idle.length === 0, `handlers never called: ${idle}`);
  },
  'multipleInputs',
);

// Methods the upstream side cannot carry: each refused with the profile's JSON-RPC code
// (a JSON-RPC error, not an HTTP status the SDK takes for an ended session), then a ping.
await flow(
  'refused',
  async (spec) => {
    const uri = spec.uri ?? 'test://static-text';
    const calls = {
      'logging/setLevel': () => client.setLoggingLevel('info'),
      'resources/subscribe': () => client.subscribeResource({ uri }),
      'resources/unsubscribe': () => client.unsubscribeResource({ uri }),
    };
    const wrong = [];
    for (const [method, code] of Object.entries(spec.methods)) {
      try {
        await calls[method]();
        wrong.push(`${method} answered a result`);
      } catch (e) {
        if (e?.code !== code) wrong.push(`${method}: ${describe(e)}, not ${code}`);
      }
    }
    await client.ping();
    assert(wrong.length === 0, wrong.join('; '));
  },
  'refused',
);

await flow(
  'subscribe',
  async (spec) => {
    const t0 = performance.now();
    await client.subscribeResource({ uri: spec.uri });
    await call(spec.trigger, 'trigger');
    const answered = performance.now();
    const at = await waitNote('notifications/resources/updated', t0, (p) => p?.uri === spec.uri);
    if (spec.afterResult) assert(at > answered, 'resources/updated arrived before the trigger answered');
    if (spec.stop) await call(spec.stop, 'stop');
    await client.unsubscribeResource({ uri: spec.uri });
    if (spec.afterUnsubscribe) {
      const t1 = performance.now();
      const r = await client.callTool({ name: spec.trigger.tool, arguments: spec.trigger.args });
      checkText(textOf(r.content), spec.afterUnsubscribe, 'after unsubscribe');
      await sleep(600);
      const late = notes.filter((n) => n.at >= t1 && n.method === 'notifications/resources/updated');
      assert(late.length === 0, `resources/updated after unsubscribe: ${JSON.stringify(late)}`);
    }
  },
  'subscribe',
);

await flow(
  'list-changed',
  async (spec) => {
    const t0 = performance.now();
    await client.callTool({ name: spec.tool, arguments: spec.args });
    const answered = performance.now();
    const at = await waitNote('notifications/tools/list_changed', t0);
    assert(at > answered, 'tools/list_changed arrived before the trigger answered');
  },
  'listChanged',
);

await flow('get-stream', async () => {
  // The SDK opens its GET stream on its own after initialize; on a stdio
  // upstream the stream needs a process of its own, whose start can take a
  // second or more on a loaded machine: wait (10 s at most) for an answer.
  const answered = () => exchanges.some((e) => e.method === 'GET' && e.status !== undefined);
  for (const until = performance.now() + 10_000; !answered() && performance.now() < until; ) await sleep(50);
  const gets = exchanges.filter((e) => e.method === 'GET');
  assert(gets.length > 0, 'the SDK opened no GET stream');
  const want = legacy.getStreamStatus ?? 200;
  if (want !== 200) {
    const other = gets.filter((e) => e.status !== want);
    assert(other.length === 0, `GETs answered ${JSON.stringify(other.map((e) => e.status))}, not all ${want}`);
    assert(gets.every((e) => e.session === sessionId), 'a GET without the session id');
    return;
  }
  assert(gets.some((e) => e.status === 200 && e.type.startsWith('text/event-stream')), `no GET answered 200 text/event-stream: ${JSON.stringify(gets)}`);
  assert(gets.every((e) => e.session === sessionId), 'a GET without the session id');
});

await flow('wire', async () => {
  const [first, ...later] = exchanges;
  assert(first.body.includes('"initialize"') && !first.session, `first exchange ${JSON.stringify(first)}`);
  const noSession = later.filter((e) => e.session !== sessionId);
  assert(noSession.length === 0, `${noSession.length} requests without this session id: ${JSON.stringify(noSession.slice(0, 2))}`);
  const noVersion = later.filter((e) => e.version !== LEGACY);
  assert(noVersion.length === 0, `${noVersion.length} requests without MCP-Protocol-Version ${LEGACY}: ${JSON.stringify(noVersion.slice(0, 2))}`);
  const issued = new Set(exchanges.map((e) => e.issued).filter(Boolean));
  assert(issued.size === 1 && issued.has(sessionId), `session ids seen: ${[...issued]}`);
  if (opts.bearer) {
    const bare = exchanges.filter((e) => !e.authorization);
    assert(bare.length === 0, `${bare.length} requests without Authorization: ${JSON.stringify(bare.slice(0, 2))}`);
  }
});

await flow('terminate', async () => {
  await transport.terminateSession();
  const del = exchanges.filter((e) => e.method === 'DELETE');
  assert(del.length === 1 && del[0].status >= 200 && del[0].status < 300, `DELETE: ${JSON.stringify(del)}`);
  await client.close();
  const r = await fetch(opts.url, {
    method: 'POST',
    headers: {
      'mcp-session-id': sessionId,
      'mcp-protocol-version': LEGACY,
      ...(opts.bearer ? { authorization: `Bearer ${opts.bearer}` } : {}),
      accept: 'application/json, text/event-stream',
      'content-type': 'application/json',
    },
    body: JSON.stringify({ jsonrpc: '2.0', id: 99, method: 'ping' }),
  });
  const want = legacy.endedSessionStatus ?? 404;
  const text = await r.text();
  assert(r.status === want, `a request on the ended session got ${r.status}, not ${want}: ${text.slice(0, 200)}`);
});

// ------------------------------------------------------------------ authentication, authorization

// A client and transport sending `bearer` (null: no Authorization header), recorded like the main one.
function clientWith(bearer) {
  const c = new Client({ name: 'interop-legacy-ts', version: sdkVersion }, { capabilities: {} });
  const t = new StreamableHTTPClientTransport(new URL(opts.url), { fetch: recordingFetch, requestInit: bearerInit(bearer) });
  return { c, t };
}

if (opts['denied-tool']) {
  const tool = opts['denied-tool'];
  const echo = profile.echo;
  const { c, t } = clientWith(opts['denied-bearer']);
  let open = false;
  await flow('denied-list', async () => {
    await c.connect(t);
    open = true;
    checkListedWithout(assert, new Set((await c.listTools()).tools.map((x) => x.name)), tool, echo);
  });
  await flow('denied-call', async () => {
    assert(open, 'not connected');
    const since = exchanges.length;
    let error;
    try {
      await c.callTool({ name: tool, arguments: argsFor(profile, tool) });
    } catch (e) {
      error = e;
    }
    assert(error, `calling the denied tool ${tool} answered a result`);
    assert(error.code === -31003, `error ${describe(error)}, want code -31003`);
    const calls = exchanges.slice(since).filter((ex) => ex.method === 'POST');
    // Inside a 2025 session the refusal is a JSON-RPC error in a 200.
    assert(calls.length === 1 && calls[0].status === 200, `the call was answered ${JSON.stringify(calls.map((ex) => ex.status))}, want [200]`);
    assert(error.data?.reason === 'denied', `error data ${JSON.stringify(error.data)}, want reason denied`);
    if (echo) {
      const r = await c.callTool({ name: echo.tool, arguments: echo.args });
      assert(!r.isError, `${echo.tool} as the denied caller: isError ${JSON.stringify(textOf(r.content))}`);
      checkText(textOf(r.content), echo, echo.tool);
    }
  });
  if (open) {
    await t.terminateSession().catch(() => {});
    await c.close().catch(() => {});
  }
}

// Connecting with this bearer (null: none) fails with a 401 whose challenge names the metadata.
async function refused401(bearer) {
  const { c, t } = clientWith(bearer);
  const since = exchanges.length;
  let error;
  try {
    await c.connect(t);
    await c.listTools();
  } catch (e) {
    error = e;
  } finally {
    await c.close().catch(() => {});
  }
  assert(error, 'initialized and listed tools without valid credentials');
  assert(error.code === 401, `error ${describe(error)}, want code 401`);
  const seen = exchanges.slice(since);
  checkChallenge(assert, seen.map((ex) => ex.status), seen[0]?.challenge ?? '', bearer);
}

if (opts.unauthorized) {
  await flow('unauthorized-missing', () => refused401(null));
  if (opts['wrong-bearer']) await flow('unauthorized-wrong', () => refused401(opts['wrong-bearer']));
}

process.exit(failures ? 1 : 0);
