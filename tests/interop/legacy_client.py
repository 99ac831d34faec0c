"""Legacy (2025-11-25 session) interop client on the official Python SDK mcp==1.30.0.

Runs on .peers/py-legacy, against an upstream directly (the fixture check in run.sh)
or through the gateway (tests/interop/legacy.sh: two replicas behind a round-robin
forwarder). Expectations per upstream come from tests/interop/profiles.json (the
upstream's entry and its "legacy" part):

  initialize   Mcp-Session-Id issued, version 2025-11-25, server name, capabilities
  ping, tools, progress, logging (logging/setLevel, exact levels), state (a counter
  kept in the upstream session), error, elicitation and sampling (server->client
  requests on the call's SSE stream, answered by callbacks), resources, templates,
  prompts,
  roots        a tool that asks roots/list (the 1.x server sends it on the standalone
               GET stream; answered by the list_roots callback)
  multi-round  a tool that asks twice, one elicitation per round (answers picked by the
               requested schema's properties from the profile's "answers")
  multiple-inputs  a tool that asks elicitation, sampling and roots/list in one round
  refused      methods the upstream side cannot carry (profile "refused": method -> the
               JSON-RPC code its refusal must carry, answered as a JSON-RPC error, not as an
               ended session), and the session works on afterwards (ping)
  subscribe    resources/subscribe, a trigger, notifications/resources/updated for the
               uri arrives (sent without a related request: only the GET stream carries
               it; with "afterResult", it is sent after the trigger has answered), then
               resources/unsubscribe (and, with "afterUnsubscribe", the upstream says so)
  list-changed notifications/tools/list_changed arrives (GET stream only)
  get-stream   the SDK opened the standalone GET stream: GET with the session id, 200
               text/event-stream (or, with the profile's getStreamStatus 405, every GET
               it sent was answered 405 and the session went on)
  wire         every request after initialize carried the session id and the version
               header, and every session id the client saw was the same one
  terminate    on exit the SDK sends DELETE (2xx); afterwards the session id is refused
               (404, or the profile's endedSessionStatus)

    .peers/py-legacy/bin/python tests/interop/legacy_client.py --url http://127.0.0.1:N/mcp \
        [--upstream py-legacy|everything] [--label NAME]

A profile with "extends": NAME starts from that profile's entries (tests/interop/
legacy_modern.sh's "modern-only": the SDK v2 server behind a 2026-only filter).

On a route with an authentication policy (tests/interop/auth.sh): `--bearer TOKEN`
(or $INTEROP_BEARER) sends `Authorization: Bearer TOKEN` on every request (the httpx
client's default headers: POSTs, the GET stream, DELETE; `wire` then checks every
request carried it); `--unauthorized` also initializes without a token and with
`--wrong-bearer` ($INTEROP_WRONG_BEARER): the SDK must raise the 401 (httpx
HTTPStatusError) and the challenge carry resource_metadata; `--denied-tool NAME` with
`--denied-bearer` ($INTEROP_DENIED_BEARER) opens a session as a caller a rule denies
NAME: absent from tools/list, NAME's call refused (a JSON-RPC -31003 error in a 200,
which the 1.x SDK raises as McpError), the echo tool still answers on the same session.

Prints `PASS|FAIL|SKIP <label>/<flow>[: reason]` (label default `legacy-client`);
exit status 1 if any flow failed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import time

import anyio
import httpx
import mcp.types as types
from mcp import ClientSession
from mcp.shared.exceptions import McpError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from pydantic import FileUrl

from auth_checks import add_options, args_for, bearer_headers, check_challenge, check_listed_without, check_options, first

FLOW_TIMEOUT = 20
ROOT_URI = "file:///tmp/sessionless-interop"
ROOT_NAME = "interop-root"
PROFILES = pathlib.Path(__file__).with_name("profiles.json")


def text_of(result) -> str:
    content = result.content if hasattr(result, "content") else result
    return "".join(c.text for c in content if isinstance(c, types.TextContent))


def check_text(got: str, spec: dict, what: str) -> None:
    if "text" in spec:
        assert got == spec["text"], f"{what}: {got!r} != {spec['text']!r}"
    if "textContains" in spec:
        assert spec["textContains"] in got, f"{what}: {spec['textContains']!r} not in {got[:300]!r}"


def load_profile(name: str) -> dict:
    """The profile NAME in profiles.json; with "extends", laid over the one it names."""
    profiles = json.loads(PROFILES.read_text())
    own = profiles[name]
    return {**profiles[own["extends"]], **own} if "extends" in own else own


def pick_answer(profile: dict, params) -> dict:
    """The elicitation answer for a question: the first of the profile's answers (its
    elicitation answer, then legacy.multiRound.answers) whose every key the requested
    schema has; the elicitation answer when none fits."""
    default = profile["elicitation"]["answer"]
    schema = getattr(params, "requestedSchema", None) or {}
    props = set((schema.get("properties") or {}).keys())
    extra = ((profile.get("legacy") or {}).get("multiRound") or {}).get("answers", [])
    for answer in [default, *extra]:
        if answer and set(answer) <= props:
            return answer
    return default


async def run(url: str, upstream: str, label: str, auth: argparse.Namespace) -> int:
    profile = load_profile(upstream)
    legacy = profile["legacy"]
    asked = {"elicitation": 0, "sampling": 0, "roots": 0}
    logs: list[types.LoggingMessageNotificationParams] = []
    progress: list[float] = []
    notes: list[tuple[float, str, object]] = []  # (arrival, method, params)
    exchanges: list[dict] = []
    failures = 0

    def report(status: str, flow: str, reason: str = "") -> None:
        nonlocal failures
        print(f"{status} {label}/{flow}{': ' + reason if reason else ''}", flush=True)
        if status == "FAIL":
            failures += 1

    def recorded_client(log: list[dict], bearer: str | None) -> httpx.AsyncClient:
        """An httpx client sending `bearer` (none: no Authorization), each exchange appended to `log`."""

        async def on_request(request: httpx.Request) -> None:
            body = request.content if request.method == "POST" else b""
            try:
                rpc = json.loads(body).get("method") if body else None
            except Exception:  # noqa: BLE001 - not a JSON-RPC object
                rpc = None
            log.append(
                {
                    "method": request.method,
                    "rpc": rpc,
                    "session": request.headers.get("mcp-session-id"),
                    "version": request.headers.get("mcp-protocol-version"),
                    "body": body[:200],
                    "authorization": "authorization" in request.headers,
                }
            )
            request.extensions["exchange"] = log[-1]

        async def on_response(response: httpx.Response) -> None:
            ex = response.request.extensions.get("exchange")
            if ex is not None:
                ex["status"] = response.status_code
                ex["type"] = response.headers.get("content-type", "")
                ex["issued"] = response.headers.get("mcp-session-id")
                ex["challenge"] = response.headers.get("www-authenticate", "")
                if response.status_code >= 400:
                    await response.aread()  # small JSON error bodies
                    ex["resp_body"] = response.text[:300]

        client = create_mcp_http_client(headers=bearer_headers(bearer))
        client.event_hooks = {"request": [on_request], "response": [on_response]}
        return client

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async def on_message(message) -> None:
        if isinstance(message, types.ServerNotification):
            notes.append((time.monotonic(), message.root.method, message.root.params))

    async def on_elicit(ctx, params: types.ElicitRequestParams):
        asked["elicitation"] += 1
        return types.ElicitResult(action="accept", content=pick_answer(profile, params))

    async def on_sample(ctx, params: types.CreateMessageRequestParams):
        asked["sampling"] += 1
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=profile["sampling"]["answer"]),
            model="interop-model",
        )

    async def on_roots(ctx) -> types.ListRootsResult:
        asked["roots"] += 1
        return types.ListRootsResult(roots=[types.Root(uri=FileUrl(ROOT_URI), name=ROOT_NAME)])

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    async def wait_note(method: str, since: float, match=lambda params: True, secs: float = 10):
        with anyio.fail_after(secs):
            while True:
                for at, m, params in notes:
                    if m == method and at >= since and match(params):
                        return at
                await anyio.sleep(0.05)

    http_client = recorded_client(exchanges, auth.bearer)
    session_id = None
    async with http_client:
        async with streamable_http_client(url, http_client=http_client) as (read, write, get_session_id):
            async with ClientSession(
                read,
                write,
                logging_callback=on_log,
                message_handler=on_message,
                elicitation_callback=on_elicit,
                sampling_callback=on_sample,
                list_roots_callback=on_roots,
            ) as s:
                init = await s.initialize()
                session_id = get_session_id()

                async def flow(name, fn, needs=None):
                    spec = None
                    if needs is not None:
                        spec = legacy.get(needs, profile.get(needs))
                        if spec is None:
                            report("SKIP", name, f"upstream has no {needs} fixture")
                            return
                    try:
                        with anyio.fail_after(FLOW_TIMEOUT):
                            await (fn(spec) if needs is not None else fn())
                        report("PASS", name)
                    except BaseException as e:  # noqa: BLE001 - report every failure the same way
                        report("FAIL", name, f"{type(e).__name__}: {e}")

                async def initialize():
                    assert session_id, "no Mcp-Session-Id issued"
                    assert init.protocolVersion == "2025-11-25", f"negotiated {init.protocolVersion}"
                    assert init.serverInfo.name == profile["serverName"], init.serverInfo
                    caps = init.capabilities
                    for cap in profile["capabilities"]:
                        assert getattr(caps, cap) is not None, f"capability {cap} not advertised"
                    if legacy.get("subscribe") is not None:
                        assert caps.resources is not None and caps.resources.subscribe, "resources.subscribe not advertised"

                async def ping():
                    await s.send_ping()

                async def tools():
                    names = {t.name for t in (await s.list_tools()).tools}
                    want = set(legacy["tools"])
                    assert want <= names, f"missing tools {sorted(want - names)}"
                    for key in ("echo", "add"):
                        spec = profile[key]
                        if spec is None:
                            continue
                        r = await s.call_tool(spec["tool"], spec["args"])
                        assert not r.isError, r
                        check_text(text_of(r), spec, key)

                async def prog(spec):
                    progress.clear()
                    r = await s.call_tool(spec["tool"], spec["args"], progress_callback=on_progress)
                    check_text(text_of(r), spec, "result")
                    assert len(progress) == spec["count"], f"{len(progress)} notifications: {progress}"
                    assert progress == sorted(progress) and len(set(progress)) == len(progress), progress

                async def logging_(spec):
                    if "subscribeUri" in spec:  # the upstream logs when a resource is subscribed to
                        has = lambda: [m for m in logs if spec["textContains"] in str(m.data)]  # noqa: E731
                        logs.clear()
                        await s.set_logging_level(spec["level"])
                        await s.subscribe_resource(spec["subscribeUri"])
                        with anyio.fail_after(10):
                            while not has():
                                await anyio.sleep(0.05)
                        await s.set_logging_level(spec["quietLevel"])
                        logs.clear()
                        await s.subscribe_resource(spec["subscribeUri"])
                        await anyio.sleep(0.5)
                        assert not has(), f"logged at {spec['level']} with the level at {spec['quietLevel']}"
                        await s.unsubscribe_resource(spec["subscribeUri"])
                        return
                    logs.clear()
                    await s.set_logging_level(spec["level"])
                    r = await s.call_tool(spec["tool"], spec["args"])
                    check_text(text_of(r), spec, "result")
                    levels = [m.level for m in logs]
                    assert levels == spec["expectLevels"], levels

                async def state(spec):
                    pattern = re.compile(spec["pattern"])
                    a = pattern.match(text_of(await s.call_tool(spec["tool"], spec["args"])))
                    b = pattern.match(text_of(await s.call_tool(spec["tool"], spec["args"])))
                    assert a and b and int(b.group(1)) == int(a.group(1)) + 1, (a, b)
                    print(f"INFO {label}/state: counter {a.group(1)} then {b.group(1)}")

                async def error(spec):
                    r = await s.call_tool(spec["tool"], spec["args"])
                    assert r.isError, r
                    check_text(text_of(r), spec, "error text")

                async def elicitation(spec):
                    r = await s.call_tool(spec["tool"], spec["args"])
                    assert not r.isError, r
                    check_text(text_of(r), spec, "result")

                async def sampling(spec):
                    r = await s.call_tool(spec["tool"], spec["args"])
                    assert not r.isError, r
                    check_text(text_of(r), spec, "result")

                async def resources(spec):
                    res = await s.list_resources()
                    assert spec["uri"] in {str(r.uri) for r in res.resources}, "resource not listed"
                    rr = await s.read_resource(spec["uri"])
                    check_text(rr.contents[0].text, spec, "contents")

                async def templates(spec):
                    tl = await s.list_resource_templates()
                    assert spec["uriTemplate"] in {t.uriTemplate for t in tl.resourceTemplates}, tl
                    rr = await s.read_resource(spec["uri"])
                    check_text(rr.contents[0].text, spec, "contents")

                async def prompts(spec):
                    pl = await s.list_prompts()
                    p = next(p for p in pl.prompts if p.name == spec["name"])
                    assert {a.name for a in p.arguments or []} == set(spec["argNames"]), p
                    g = await s.get_prompt(spec["name"], spec["args"])
                    check_text(g.messages[0].content.text, spec, "message")

                async def roots(spec):
                    r = await s.call_tool(spec["tool"], spec["args"])
                    assert not r.isError, r
                    check_text(text_of(r), spec, "result")
                    # (server-everything asks roots/list when the session starts, not in the call;
                    # with "askedOncePerProcess" the upstream session is a pooled one an earlier
                    # client may have answered already, so only the text is checked)
                    if not spec.get("askedOncePerProcess"):
                        assert asked["roots"] > 0, "the roots/list callback was never called"

                async def multi_round(spec):
                    before = asked["elicitation"]
                    r = await s.call_tool(spec["tool"], spec["args"])
                    assert not r.isError, r
                    check_text(text_of(r), spec, "result")
                    n = asked["elicitation"] - before
                    assert n == len(spec["answers"]), f"the elicitation callback ran {n} times, not {len(spec['answers'])}"

                async def multiple_inputs(spec):
                    before = dict(asked)
                    r = await s.call_tool(spec["tool"], spec["args"])
                    assert not r.isError, r
                    check_text(text_of(r), spec, "result")
                    idle = [k for k in asked if asked[k] == before[k]]
                    assert not idle, f"callbacks never called: {idle}"

                async def subscribe(spec):
                    uri = spec["uri"]
                    is_uri = lambda params: str(getattr(params, "uri", "")) == uri  # noqa: E731
                    t0 = time.monotonic()
                    await s.subscribe_resource(uri)
                    trigger = spec["trigger"]
                    r = await s.call_tool(trigger["tool"], trigger["args"])
                    answered = time.monotonic()
                    assert not r.isError, r
                    check_text(text_of(r), trigger, "trigger")
                    at = await wait_note("notifications/resources/updated", t0, is_uri)
                    if spec.get("afterResult"):
                        assert at > answered, "resources/updated arrived before the trigger's answer"
                    if "stop" in spec:
                        r = await s.call_tool(spec["stop"]["tool"], spec["stop"]["args"])
                        check_text(text_of(r), spec["stop"], "stop")
                    await s.unsubscribe_resource(uri)
                    if "afterUnsubscribe" in spec:
                        t1 = time.monotonic()
                        r = await s.call_tool(trigger["tool"], trigger["args"])
                        check_text(text_of(r), spec["afterUnsubscribe"], "after unsubscribe")
                        await anyio.sleep(0.6)
                        late = [m for at, m, p in notes if at >= t1 and m == "notifications/resources/updated"]
                        assert not late, f"resources/updated after unsubscribe: {late}"

                async def list_changed(spec):
                    t0 = time.monotonic()
                    r = await s.call_tool(spec["tool"], spec["args"])
                    answered = time.monotonic()
                    assert not r.isError, r
                    at = await wait_note("notifications/tools/list_changed", t0)
                    assert at > answered, "tools/list_changed arrived before the trigger's answer"

                async def refused(spec):
                    calls = {
                        "logging/setLevel": lambda: s.set_logging_level("info"),
                        "resources/subscribe": lambda: s.subscribe_resource(spec.get("uri", "test://static-text")),
                        "resources/unsubscribe": lambda: s.unsubscribe_resource(spec.get("uri", "test://static-text")),
                    }
                    wrong = []
                    for method, code in spec["methods"].items():
                        try:
                            await calls[method]()
                            wrong.append(f"{method} answered a result")
                        except McpError as e:
                            if e.error.code != code:
                                wrong.append(f"{method}: error {e.error.code} {e.error.message!r}, not {code}")
                    await s.send_ping()
                    assert not wrong, "; ".join(wrong)

                async def get_stream():
                    # The SDK opens its GET stream on its own; on a stdio upstream
                    # it needs a process of its own, whose start can take a second
                    # or more on a loaded machine: wait (10 s at most) for an answer.
                    until = time.monotonic() + 10
                    while time.monotonic() < until and not any(
                        e["method"] == "GET" and "status" in e for e in exchanges
                    ):
                        await anyio.sleep(0.05)
                    gets = [e for e in exchanges if e["method"] == "GET"]
                    assert gets, "the SDK opened no GET stream"
                    want = legacy.get("getStreamStatus", 200)
                    if want != 200:
                        other = [e.get("status") for e in gets if e.get("status") != want]
                        assert not other, f"GETs answered {other}, not all {want}"
                        assert all(e["session"] == session_id for e in gets), "a GET without the session id"
                        return
                    ok = [e for e in gets if e.get("status") == 200 and e["type"].startswith("text/event-stream")]
                    assert ok, f"no GET stream answered 200 text/event-stream: {gets}"
                    assert all(e["session"] == session_id for e in gets), "a GET without the session id"

                async def wire():
                    first = exchanges[0]
                    assert b'"initialize"' in first["body"] and first["session"] is None, first
                    later = exchanges[1:]
                    assert later, "nothing after initialize"
                    bad = [e for e in later if e["session"] != session_id]
                    assert not bad, f"{len(bad)} requests without this session id: {bad[:2]}"
                    bad = [e for e in later if e["version"] != init.protocolVersion]
                    assert not bad, f"{len(bad)} requests without MCP-Protocol-Version {init.protocolVersion}"
                    issued = {e["issued"] for e in exchanges if e.get("issued")}
                    assert issued == {session_id}, f"session ids seen: {issued}"
                    if auth.bearer:
                        bare = [e["method"] for e in exchanges if not e["authorization"]]
                        assert not bare, f"{len(bare)} requests without Authorization: {bare[:4]}"

                await flow("initialize", initialize)
                await flow("ping", ping)
                await flow("tools", tools)
                await flow("progress", prog, "progress")
                await flow("logging", logging_, "logging")
                await flow("state", state, "state")
                await flow("error", error, "error")
                await flow("elicitation", elicitation, "elicitation")
                await flow("sampling", sampling, "sampling")
                await flow("resources", resources, "resource")
                await flow("templates", templates, "template")
                await flow("prompts", prompts, "prompt")
                await flow("roots", roots, "roots")
                await flow("multi-round", multi_round, "multiRound")
                await flow("multiple-inputs", multiple_inputs, "multipleInputs")
                await flow("refused", refused, "refused")
                await flow("subscribe", subscribe, "subscribe")
                await flow("list-changed", list_changed, "listChanged")
                await flow("get-stream", get_stream)
                await flow("wire", wire)
        # The transport has sent DELETE on the way out.
        try:
            deletes = [e for e in exchanges if e["method"] == "DELETE"]
            assert deletes, "the SDK sent no DELETE"
            assert all(200 <= e.get("status", 0) < 300 for e in deletes), f"DELETE answered {deletes}"
            r = await http_client.post(
                url,
                headers={
                    "mcp-session-id": session_id or "",
                    "mcp-protocol-version": "2025-11-25",
                    "accept": "application/json, text/event-stream",
                    "content-type": "application/json",
                },
                json={"jsonrpc": "2.0", "id": 99, "method": "ping"},
            )
            want = legacy.get("endedSessionStatus", 404)
            assert r.status_code == want, f"a request on the ended session got {r.status_code}, not {want}: {r.text[:200]}"
            report("PASS", "terminate")
        except BaseException as e:  # noqa: BLE001
            report("FAIL", "terminate", f"{type(e).__name__}: {e}")

    # ------------------------------------------------------------ authentication, authorization

    def run_flow(name: str, check) -> None:
        try:
            check()
            report("PASS", name)
        except BaseException as e:  # noqa: BLE001 - report every failure the same way
            report("FAIL", name, f"{type(e).__name__}: {e}")

    async def other_session(bearer: str | None, seen: list[dict], steps) -> BaseException | None:
        """Initializes a session of its own sending `bearer`, runs `steps(session)`: what it raised."""
        client = recorded_client(seen, bearer)
        try:
            with anyio.fail_after(FLOW_TIMEOUT):
                async with client:
                    async with streamable_http_client(url, http_client=client) as (read, write, _):
                        async with ClientSession(read, write) as s:
                            await s.initialize()
                            await steps(s)
        except BaseException as e:  # noqa: BLE001 - what the SDK raised is for the caller to check
            return e
        return None

    if auth.denied_tool:
        tool = auth.denied_tool
        echo = profile.get("echo")
        seen: list[dict] = []
        listed: set[str] | None = None
        echoed = None

        async def as_denied(s: ClientSession) -> None:
            nonlocal listed, echoed
            listed = {t.name for t in (await s.list_tools()).tools}
            try:
                await s.call_tool(tool, args_for(profile, tool))
            finally:
                if echo:  # after the refused call: the session goes on
                    echoed = await s.call_tool(echo["tool"], echo["args"])

        error = await other_session(auth.denied_bearer, seen, as_denied)

        def denied_list() -> None:
            assert listed is not None, f"no tools/list: {type(error).__name__}: {error}"
            check_listed_without(listed, tool, echo)
            if echo:
                assert echoed is not None and not echoed.isError, f"{echo['tool']} as the denied caller: {echoed}"
                check_text(text_of(echoed), echo, echo["tool"])

        def denied_call() -> None:
            assert error is not None, f"calling the denied tool {tool!r} answered a result"
            assert not first(error, TimeoutError), f"timed out after {FLOW_TIMEOUT}s"
            calls = [e for e in seen if e["rpc"] == "tools/call"]
            assert calls, "no tools/call sent"
            # Inside a 2025 session the refusal is a JSON-RPC error in a 200
            # (an error status would end the 1.x SDK's session).
            assert calls[0].get("status") == 200, f"the call was answered {calls[0].get('status')}, want 200"
            raised = first(error, McpError)
            assert raised is not None and raised.error.code == -31003, f"the SDK raised {type(error).__name__}: {error}"
            assert (raised.error.data or {}).get("reason") == "denied", f"error data {raised.error.data}, want reason denied"

        run_flow("denied-list", denied_list)
        run_flow("denied-call", denied_call)

    async def list_tools(s: ClientSession) -> None:
        await s.list_tools()

    async def refused_401(bearer: str | None) -> None:
        seen: list[dict] = []
        error = await other_session(bearer, seen, list_tools)
        assert error is not None, "initialized and listed tools without valid credentials"
        assert not first(error, TimeoutError), f"timed out after {FLOW_TIMEOUT}s"
        raised = first(error, httpx.HTTPStatusError)
        assert raised is not None and raised.response.status_code == 401, f"the SDK raised {type(error).__name__}: {error}"
        check_challenge([e.get("status") for e in seen], seen[0].get("challenge", "") if seen else "", bearer)

    if auth.unauthorized:
        for name, bearer in (("unauthorized-missing", None), ("unauthorized-wrong", auth.wrong_bearer)):
            if name == "unauthorized-wrong" and not bearer:
                continue
            try:
                await refused_401(bearer)
                report("PASS", name)
            except BaseException as e:  # noqa: BLE001
                report("FAIL", name, f"{type(e).__name__}: {e}")
    return failures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--upstream", default="py-legacy", help="profile in tests/interop/profiles.json")
    ap.add_argument("--label", default="legacy-client")
    add_options(ap)
    args = ap.parse_args()
    check_options(ap, args)
    sys.exit(1 if anyio.run(run, args.url, args.upstream, args.label, args) else 0)


if __name__ == "__main__":
    main()
