"""Modern (2026-07-28) interop client on the official Python SDK mcp==2.3.0.

Talks to URL (normally a sessionless gateway in front of a legacy upstream) and
asserts the results the upstream named by --upstream serves (tests/interop/profiles.json).

    .peers/py-modern/bin/python tests/interop/py_client.py --url http://127.0.0.1:Q/mcp --upstream py-legacy

It never accepts the legacy handshake: the `negotiate` flow connects with mode="auto"
and fails if the SDK fell back to `initialize`; every other flow runs on a client
pinned to mode="2026-07-28", which never sends `initialize`; the `wire` flow checks
every HTTP exchange (no initialize, no Mcp-Session-Id either way, 2026 headers).
`--allow-legacy` (self-test of the expectations straight against a legacy upstream)
lifts those three checks and lets every flow run on the negotiated legacy session.

On a route with an authentication policy (tests/interop/auth.sh): `--bearer TOKEN`
(or $INTEROP_BEARER) sends `Authorization: Bearer TOKEN` on every request (httpx
default headers); `--unauthorized` also connects without a token and with
`--wrong-bearer` ($INTEROP_WRONG_BEARER): both must end in an MCPError -31001 from a
401 whose WWW-Authenticate carries resource_metadata; `--denied-tool NAME` with
`--denied-bearer` ($INTEROP_DENIED_BEARER) connects as a caller a rule denies NAME:
absent from tools/list, refused on call (403, -31003), other tools still answer.

Prints one line per flow: `PASS|FAIL|SKIP py/<upstream>/<flow>[: reason]`.
Exit status 1 if any flow failed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import traceback
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import auth_checks

MODERN = "2026-07-28"
FLOW_TIMEOUT = 20.0
PROFILES = Path(__file__).with_name("profiles.json")
LOG_META = "io.modelcontextprotocol/logLevel"


class Wire:
    """Records every HTTP exchange the SDK makes (request headers + body, response status + headers)."""

    def __init__(self) -> None:
        self.exchanges: list[dict[str, Any]] = []

    async def on_request(self, request: httpx2.Request) -> None:
        try:
            body = json.loads(request.content) if request.content else None
        except Exception:  # noqa: BLE001 - a streamed or non-JSON body is recorded as None
            body = None
        request.extensions["interop_index"] = len(self.exchanges)
        self.exchanges.append({"method": request.method, "headers": dict(request.headers), "body": body})

    async def on_response(self, response: httpx2.Response) -> None:
        ex = self.exchanges[response.request.extensions["interop_index"]]
        ex["status"] = response.status_code
        ex["resp_headers"] = dict(response.headers)
        if response.status_code >= 400:
            await response.aread()  # small JSON error bodies: keep them for the report
            ex["resp_body"] = response.text[:500]

    def client(self, bearer: str | None = None) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(
            timeout=httpx2.Timeout(30, read=60),
            headers=auth_checks.bearer_headers(bearer),
            event_hooks={"request": [self.on_request], "response": [self.on_response]},
        )

    def last_error(self, since: int = 0) -> str:
        for ex in reversed(self.exchanges[since:]):
            if ex.get("status", 0) >= 400:
                m = ex["body"].get("method") if isinstance(ex.get("body"), dict) else ex["method"]
                return f" [last HTTP error: {m} -> {ex['status']} {ex.get('resp_body', '')}]"
        return ""


def text_of(result: types.CallToolResult | types.GetPromptResult) -> str:
    if isinstance(result, types.GetPromptResult):
        blocks = [m.content for m in result.messages]
    else:
        blocks = result.content
    return "".join(b.text for b in blocks if isinstance(b, types.TextContent))


def check_text(got: str, spec: dict[str, Any], what: str) -> None:
    if "text" in spec:
        assert got == spec["text"], f"{what}: expected {spec['text']!r}, got {got!r}"
    if "textContains" in spec:
        assert spec["textContains"] in got, f"{what}: expected to contain {spec['textContains']!r}, got {got!r}"


def describe(e: BaseException) -> str:
    if isinstance(e, MCPError):
        data = f" data={json.dumps(e.data)[:300]}" if e.data is not None else ""
        return f"MCPError {e.code}: {e.message}{data}"
    if isinstance(e, AssertionError):
        return f"assertion: {e}"
    if isinstance(e, TimeoutError):
        return f"timed out after {FLOW_TIMEOUT}s"
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(describe(x) for x in e.exceptions)
    return f"{type(e).__name__}: {e}"


class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.url: str = args.url
        self.upstream: str = args.upstream
        self.allow_legacy: bool = args.allow_legacy
        self.mrtr: bool = args.mrtr
        self.verbose: bool = args.verbose
        self.bearer: str | None = args.bearer or None
        self.wrong_bearer: str | None = args.wrong_bearer or None
        self.unauthorized: bool = args.unauthorized
        self.denied_tool: str | None = args.denied_tool
        self.denied_bearer: str | None = args.denied_bearer or None
        self.profile: dict[str, Any] = json.loads(PROFILES.read_text())[args.upstream]
        self.failures = 0
        self.wire = Wire()
        self.discover: types.DiscoverResult | None = None
        self.logs: list[types.LoggingMessageNotificationParams] = []

    def report(self, status: str, flow: str, reason: str = "") -> None:
        print(f"{status} py/{self.upstream}/{flow}{': ' + reason if reason else ''}", flush=True)
        if status == "FAIL":
            self.failures += 1

    async def flow(self, name: str, fn, *, needs: str | None = None) -> None:
        spec = self.profile.get(needs) if needs else True
        if needs and spec is None:
            self.report("SKIP", name, f"upstream has no {needs} fixture")
            return
        since = len(self.wire.exchanges)
        try:
            with anyio.fail_after(FLOW_TIMEOUT):
                await (fn(spec) if needs else fn())
            self.report("PASS", name)
        except BaseException as e:  # noqa: BLE001 - every failure is reported the same way
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            if self.verbose:
                traceback.print_exc()
            self.report("FAIL", name, describe(e) + self.wire.last_error(since))

    def client(self, mode: str, *, bearer: str | None | bool = True, **kw: Any) -> Client:
        """A client of the URL sending `bearer` (default: --bearer; None: no Authorization)."""
        token = self.bearer if bearer is True else bearer
        transport = streamable_http_client(self.url, http_client=self.wire.client(token or None))
        return Client(transport, mode=mode, cache=None, client_info=types.Implementation(name="interop-py", version="1"), **kw)

    async def on_log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params)

    # ------------------------------------------------------------ flows

    async def negotiate(self) -> None:
        async with self.client("auto") as c:
            s = c.session
            if not self.allow_legacy:
                assert s.initialize_result is None, (
                    f"SDK fell back to initialize (negotiated {c.protocol_version}); server/discover was not accepted"
                )
                assert c.protocol_version == MODERN, f"negotiated {c.protocol_version}, want {MODERN}"
                assert s.discover_result is not None
                self.discover = s.discover_result
            info = c.server_info
            assert info is not None, "no serverInfo (discover result _meta io.modelcontextprotocol/serverInfo)"
            assert info.name == self.profile["serverName"], f"serverInfo.name {info.name!r}"
            caps = c.server_capabilities.model_dump(exclude_none=True)
            missing = [k for k in self.profile["capabilities"] if k not in caps]
            assert not missing, f"capabilities {sorted(caps)} lack {missing}"

    async def discover_flow(self, c: Client) -> None:
        raw = await c.session.send_discover(MODERN)
        result = types.DiscoverResult.model_validate(raw)
        assert MODERN in result.supported_versions, f"supportedVersions {result.supported_versions}"
        assert raw.get("resultType", "complete") == "complete", raw.get("resultType")
        for key in ("ttlMs", "cacheScope"):
            assert key in raw, f"discover result lacks {key}: {sorted(raw)}"

    async def tools(self, c: Client) -> None:
        names = {t.name for t in (await c.list_tools()).tools}
        want = {self.profile[k]["tool"] for k in ("echo", "add", "progress", "logging", "error", "state") if self.profile.get(k)}
        assert want <= names, f"tools/list lacks {sorted(want - names)} (has {sorted(names)})"

    async def call(self, c: Client, spec: dict[str, Any]) -> None:
        r = await c.call_tool(spec["tool"], spec["args"])
        assert not r.is_error, f"isError result: {text_of(r)!r}"
        check_text(text_of(r), spec, spec["tool"])

    async def progress(self, c: Client, spec: dict[str, Any]) -> None:
        seen: list[tuple[float, float | None, str | None]] = []

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            seen.append((p, total, message))

        r = await c.call_tool(spec["tool"], spec["args"], progress_callback=on_progress)
        assert not r.is_error, f"isError result: {text_of(r)!r}"
        check_text(text_of(r), spec, spec["tool"])
        values = [p for p, _, _ in seen]
        assert len(values) >= spec["count"], f"{len(values)} progress notifications arrived, want {spec['count']}: {seen}"
        assert values == sorted(values) and len(set(values)) == len(values), f"progress not increasing: {values}"

    async def concurrent(self, c: Client, spec: dict[str, Any]) -> None:
        """Three progress calls and three echo calls at once on one client: no cross-talk."""
        echo = self.profile.get("echo")
        seen: dict[int, list[float]] = {i: [] for i in range(3)}
        results: dict[str, Any] = {}

        async def one_progress(i: int) -> None:
            async def on_progress(p: float, total: float | None, message: str | None) -> None:
                seen[i].append(p)

            results[f"progress{i}"] = await c.call_tool(spec["tool"], spec["args"], progress_callback=on_progress)

        async def one_echo(i: int) -> None:
            results[f"echo{i}"] = await c.call_tool(echo["tool"], echo["args"])

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(one_progress, i)
                if echo:
                    tg.start_soon(one_echo, i)
        for key, r in sorted(results.items()):
            assert not r.is_error, f"{key}: isError result: {text_of(r)!r}"
            check_text(text_of(r), spec if key.startswith("progress") else echo, key)
        counts = {i: len(v) for i, v in seen.items()}
        assert all(n == spec["count"] for n in counts.values()), f"progress notifications per call {counts}, want {spec['count']} each: {seen}"

    async def logging(self, c: Client, spec: dict[str, Any]) -> None:
        self.logs.clear()
        r = await c.call_tool(spec["tool"], spec["args"], meta={LOG_META: spec["level"]})
        assert not r.is_error, f"isError result: {text_of(r)!r}"
        check_text(text_of(r), spec, spec["tool"])
        await anyio.sleep(0.1)  # notifications precede the result on the stream; allow the dispatcher to drain
        levels = [m.level for m in self.logs]
        assert levels == spec["expectLevels"], f"log levels {levels}, want {spec['expectLevels']}"
        bad = [lvl for lvl in levels if lvl in spec["forbidLevels"]]
        assert not bad, f"received messages below the requested level {spec['level']!r}: {bad}"

    async def no_logs_without_opt_in(self, c: Client, spec: dict[str, Any]) -> None:
        self.logs.clear()
        r = await c.call_tool(spec["tool"], spec["args"])
        assert not r.is_error, f"isError result: {text_of(r)!r}"
        await anyio.sleep(0.1)
        assert not self.logs, f"log messages arrived without a logLevel opt-in: {[m.level for m in self.logs]}"

    async def error(self, c: Client, spec: dict[str, Any]) -> None:
        r = await c.call_tool(spec["tool"], spec["args"])
        assert r.is_error, f"expected isError: true, got {r.model_dump(exclude_none=True)}"
        check_text(text_of(r), spec, spec["tool"])

    async def state(self, c: Client, spec: dict[str, Any]) -> None:
        values = []
        for _ in range(2):
            r = await c.call_tool(spec["tool"], spec["args"])
            m = re.match(spec["pattern"], text_of(r))
            assert m, f"unexpected counter text {text_of(r)!r}"
            values.append(int(m.group(1)))
        assert all(v >= 1 for v in values), values
        # Informational: whether two calls from one client landed on the same upstream session.
        print(f"INFO py/{self.upstream}/state: counter values {values}", flush=True)

    async def resources(self, c: Client, spec: dict[str, Any]) -> None:
        listed = {str(r.uri) for r in (await c.list_resources()).resources}
        assert spec["uri"] in listed, f"resources/list lacks {spec['uri']} (has {sorted(listed)[:8]})"
        rr = await c.read_resource(spec["uri"])
        assert rr.contents, "resources/read returned no contents"
        got = "".join(getattr(x, "text", "") for x in rr.contents)
        check_text(got, spec, spec["uri"])

    async def templates(self, c: Client, spec: dict[str, Any]) -> None:
        listed = {t.uri_template for t in (await c.list_resource_templates()).resource_templates}
        assert spec["uriTemplate"] in listed, f"resources/templates/list lacks {spec['uriTemplate']} (has {sorted(listed)})"
        rr = await c.read_resource(spec["uri"])
        got = "".join(getattr(x, "text", "") for x in rr.contents)
        check_text(got, spec, spec["uri"])

    async def prompts(self, c: Client, spec: dict[str, Any]) -> None:
        listed = {p.name: p for p in (await c.list_prompts()).prompts}
        assert spec["name"] in listed, f"prompts/list lacks {spec['name']} (has {sorted(listed)})"
        args = sorted(a.name for a in listed[spec["name"]].arguments or [])
        assert args == sorted(spec["argNames"]), f"prompt arguments {args}"
        g = await c.get_prompt(spec["name"], spec["args"])
        check_text(text_of(g), spec, spec["name"])

    async def elicitation(self, spec: dict[str, Any]) -> None:
        asked: list[Any] = []

        async def on_elicit(ctx: Any, params: Any) -> types.ElicitResult:
            asked.append(params)
            return types.ElicitResult(action="accept", content=spec["answer"])

        async with self.mrtr_client(elicitation_callback=on_elicit) as c:
            r = await c.call_tool(spec["tool"], spec["args"])
            assert asked, f"the elicitation callback was never called; result isError={r.is_error} text={text_of(r)!r}"
            assert not r.is_error, f"isError result: {text_of(r)!r}"
            check_text(text_of(r), spec, spec["tool"])

    async def sampling(self, spec: dict[str, Any]) -> None:
        asked: list[Any] = []

        async def on_sample(ctx: Any, params: Any) -> types.CreateMessageResult:
            asked.append(params)
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text=spec["answer"]), model="interop-model"
            )

        async with self.mrtr_client(sampling_callback=on_sample) as c:
            r = await c.call_tool(spec["tool"], spec["args"])
            assert asked, f"the sampling callback was never called; result isError={r.is_error} text={text_of(r)!r}"
            assert not r.is_error, f"isError result: {text_of(r)!r}"
            check_text(text_of(r), spec, spec["tool"])

    def mrtr_client(self, **callbacks: Any) -> Client:
        if self.allow_legacy:
            return self.client("auto", **callbacks)
        return self.client(MODERN, prior_discover=self.discover, **callbacks)

    def wire_flow(self) -> None:
        problems: list[str] = []
        posts = 0
        for ex in self.wire.exchanges:
            h = {k.lower(): v for k, v in ex["headers"].items()}
            rh = {k.lower(): v for k, v in ex.get("resp_headers", {}).items()}
            body = ex.get("body") if isinstance(ex.get("body"), dict) else {}
            method = body.get("method")
            if ex["method"] != "POST":
                problems.append(f"{ex['method']} request sent (2026 clients only POST)")
                continue
            posts += 1
            if method in ("initialize", "notifications/initialized"):
                problems.append(f"legacy handshake on the wire: {method}")
            if "mcp-session-id" in h:
                problems.append(f"request {method} carried Mcp-Session-Id")
            if "mcp-session-id" in rh:
                problems.append(f"response to {method} carried Mcp-Session-Id {rh['mcp-session-id']!r}")
            if h.get("mcp-protocol-version") != MODERN:
                problems.append(f"request {method} MCP-Protocol-Version {h.get('mcp-protocol-version')!r}")
            if method and "id" in body and h.get("mcp-method") != method:
                problems.append(f"request {method} Mcp-Method {h.get('mcp-method')!r}")
            if method and "id" in body:
                pv = ((body.get("params") or {}).get("_meta") or {}).get("io.modelcontextprotocol/protocolVersion")
                if pv != MODERN:
                    problems.append(f"request {method} _meta protocolVersion {pv!r}")
        assert posts, "no POST recorded"
        assert not problems, "; ".join(sorted(set(problems))[:8])

    # ------------------------------------------------------------ authentication, authorization

    async def refused_401(self, bearer: str | None) -> None:
        """Connecting with this bearer (None: none) ends in a 401 challenge with resource_metadata."""
        since = len(self.wire.exchanges)
        error: MCPError | None = None
        try:
            async with self.client(MODERN, bearer=bearer) as c:
                await c.list_tools()
        except BaseException as e:  # noqa: BLE001 - the SDK may raise it inside an exception group
            error = auth_checks.first(e, MCPError)
            if error is None:
                raise
        assert error is not None, "connected and listed tools without valid credentials"
        assert error.code == -31001, f"MCPError {error.code} {error.message!r}, want -31001 (unauthorized)"
        seen = self.wire.exchanges[since:]
        challenge = seen[0].get("resp_headers", {}).get("www-authenticate", "") if seen else ""
        auth_checks.check_challenge([ex.get("status") for ex in seen], challenge, bearer)

    async def denied_list(self, c: Client, tool: str) -> None:
        """As the denied caller: `tool` is not listed, the profile's echo tool is."""
        names = {t.name for t in (await c.list_tools()).tools}
        auth_checks.check_listed_without(names, tool, self.profile.get("echo"))

    async def denied_call(self, c: Client, tool: str) -> None:
        """As the denied caller: calling `tool` is refused (403, -31003 denied); echo still answers."""
        since = len(self.wire.exchanges)
        try:
            await c.call_tool(tool, auth_checks.args_for(self.profile, tool))
            raise AssertionError(f"calling the denied tool {tool!r} answered a result")
        except MCPError as e:
            assert e.code == -31003, f"MCPError {e.code} {e.message!r}, want -31003 (forbidden)"
            reason = e.data.get("reason") if isinstance(e.data, dict) else None
            assert reason == "denied", f"data.reason {reason!r}, want 'denied'"
        statuses = [ex.get("status") for ex in self.wire.exchanges[since:]]
        assert statuses == [403], f"HTTP statuses of the call {statuses}, want [403]"
        echo = self.profile.get("echo")
        if echo:
            r = await c.call_tool(echo["tool"], echo["args"])
            assert not r.is_error, f"{echo['tool']} as the denied caller: isError {text_of(r)!r}"
            check_text(text_of(r), echo, echo["tool"])

    # ------------------------------------------------------------ driver

    async def run(self) -> int:
        await self.flow("negotiate", self.negotiate)
        mode = "auto" if self.allow_legacy else MODERN
        extra: dict[str, Any] = {} if self.allow_legacy else {"prior_discover": self.discover}
        try:
            async with AsyncExitStack() as stack:
                c = await stack.enter_async_context(self.client(mode, logging_callback=self.on_log, **extra))
                if not self.allow_legacy:
                    await self.flow("discover", lambda: self.discover_flow(c))
                await self.flow("tools-list", lambda: self.tools(c))
                await self.flow("call-echo", lambda s: self.call(c, s), needs="echo")
                await self.flow("call-add", lambda s: self.call(c, s), needs="add")
                await self.flow("progress", lambda s: self.progress(c, s), needs="progress")
                await self.flow("concurrent", lambda s: self.concurrent(c, s), needs="progress")
                if not self.allow_legacy:
                    await self.flow("logging", lambda s: self.logging(c, s), needs="logging")
                    await self.flow("logging-no-opt-in", lambda s: self.no_logs_without_opt_in(c, s), needs="logging")
                await self.flow("tool-error", lambda s: self.error(c, s), needs="error")
                await self.flow("session-state", lambda s: self.state(c, s), needs="state")
                await self.flow("resources", lambda s: self.resources(c, s), needs="resource")
                await self.flow("resource-templates", lambda s: self.templates(c, s), needs="template")
                await self.flow("prompts", lambda s: self.prompts(c, s), needs="prompt")
        except BaseException as e:  # noqa: BLE001 - a client that cannot even open is one failure
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            self.report("FAIL", "client", describe(e) + self.wire.last_error())
        if self.mrtr:
            await self.flow("elicitation", self.elicitation, needs="elicitation")
            await self.flow("sampling", self.sampling, needs="sampling")
        if self.denied_tool:
            tool = self.denied_tool
            try:
                async with self.client(MODERN, bearer=self.denied_bearer, prior_discover=self.discover) as d:
                    await self.flow("denied-list", lambda: self.denied_list(d, tool))
                    await self.flow("denied-call", lambda: self.denied_call(d, tool))
            except BaseException as e:  # noqa: BLE001 - a denied caller that cannot even open is one failure
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                self.report("FAIL", "denied-client", describe(e) + self.wire.last_error())
        if self.unauthorized:
            await self.flow("unauthorized-missing", lambda: self.refused_401(None))
            if self.wrong_bearer:
                await self.flow("unauthorized-wrong", lambda: self.refused_401(self.wrong_bearer))
        if not self.allow_legacy:
            await self.flow("wire", self._wire)
        return self.failures

    async def _wire(self) -> None:
        self.wire_flow()


def main() -> None:
    ap = argparse.ArgumentParser(description="2026-07-28 interop client (mcp==2.3.0)")
    ap.add_argument("--url", required=True)
    ap.add_argument("--upstream", required=True, help="profile name in profiles.json")
    ap.add_argument("--mrtr", action="store_true", help="also run the elicitation and sampling (MRTR) flows")
    ap.add_argument("--allow-legacy", action="store_true", help="self-test only: accept a legacy handshake")
    ap.add_argument("--verbose", action="store_true")
    auth_checks.add_options(ap)
    args = ap.parse_args()
    auth_checks.check_options(ap, args)
    failures = anyio.run(Runner(args).run)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
