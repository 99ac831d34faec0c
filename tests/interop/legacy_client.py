"""Sanity check of tests/interop/legacy_server.py with the legacy client it was built for.

Runs on mcp==1.30.0 (.peers/py-legacy) straight against the upstream, no gateway:
initialize + Mcp-Session-Id, every fixture tool (elicitation and sampling answered
by callbacks on the session), resources, templates, prompts, logging/setLevel.
A failure here means the fixture (or the peer install) is broken, not the gateway.

    .peers/py-legacy/bin/python tests/interop/legacy_client.py --url http://127.0.0.1:N/mcp
"""

from __future__ import annotations

import argparse
import sys

import anyio
import mcp.types as types
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

FLOW_TIMEOUT = 20


def text_of(result: types.CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def run(url: str) -> int:
    logs: list[types.LoggingMessageNotificationParams] = []
    progress: list[float] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async def on_elicit(ctx, params: types.ElicitRequestParams):
        return types.ElicitResult(action="accept", content={"user_name": "Ada"})

    async def on_sample(ctx, params: types.CreateMessageRequestParams):
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="hi there"), model="fixture-model"
        )

    async def on_progress(p: float, total: float | None, message: str | None) -> None:
        progress.append(p)

    failures = 0

    async with streamablehttp_client(url) as (read, write, get_session_id):
        async with ClientSession(
            read, write, logging_callback=on_log, elicitation_callback=on_elicit, sampling_callback=on_sample
        ) as s:
            init = await s.initialize()

            async def check(name, fn):
                nonlocal failures
                try:
                    with anyio.fail_after(FLOW_TIMEOUT):
                        await fn()
                    print(f"PASS legacy-client/{name}")
                except BaseException as e:  # noqa: BLE001 - report every failure the same way
                    failures += 1
                    print(f"FAIL legacy-client/{name}: {type(e).__name__}: {e}")

            async def initialize():
                assert get_session_id(), "no Mcp-Session-Id issued"
                assert init.capabilities.logging is not None, "logging capability not advertised"
                assert init.serverInfo.name == "sessionless-interop-legacy", init.serverInfo

            async def tools():
                names = {t.name for t in (await s.list_tools()).tools}
                want = {"echo", "add", "progress", "log", "counter", "fail", "elicit_name", "sample"}
                assert want <= names, f"missing tools {want - names}"
                r = await s.call_tool("echo", {"message": "hello"})
                assert text_of(r) == "echo: hello" and not r.isError, r
                r = await s.call_tool("add", {"a": 2, "b": 3})
                assert text_of(r) == "5", r

            async def prog():
                progress.clear()
                r = await s.call_tool("progress", {"steps": 3}, progress_callback=on_progress)
                assert text_of(r) == "progress done: 3 steps", r
                assert progress == [1, 2, 3], progress

            async def logging_():
                logs.clear()
                await s.set_logging_level("info")
                r = await s.call_tool("log", {"message": "m"})
                assert text_of(r) == "logged: m", r
                levels = [m.level for m in logs]
                assert levels == ["info", "warning", "error"], levels

            async def state():
                a = text_of(await s.call_tool("counter", {}))
                b = text_of(await s.call_tool("counter", {}))
                assert (a, b) == ("count: 1", "count: 2"), (a, b)

            async def fail():
                r = await s.call_tool("fail", {})
                assert r.isError and "tool failed" in text_of(r), r

            async def elicit():
                r = await s.call_tool("elicit_name", {})
                assert text_of(r) == "hello, Ada", r

            async def sample():
                r = await s.call_tool("sample", {"prompt": "greet"})
                assert text_of(r) == "sampled: hi there", r

            async def resources():
                res = await s.list_resources()
                assert "legacy://static/hello" in {str(r.uri) for r in res.resources}, res
                rr = await s.read_resource("legacy://static/hello")
                assert rr.contents[0].text == "Hello from the legacy upstream.", rr
                tl = await s.list_resource_templates()
                assert "legacy://items/{item_id}" in {t.uriTemplate for t in tl.resourceTemplates}, tl
                rr = await s.read_resource("legacy://items/42")
                assert rr.contents[0].text == "item 42", rr

            async def prompts():
                pl = await s.list_prompts()
                greet = next(p for p in pl.prompts if p.name == "greet")
                assert {a.name for a in greet.arguments or []} == {"name", "style"}, greet
                g = await s.get_prompt("greet", {"name": "Ada"})
                assert g.messages[0].content.text == "Write a friendly greeting for Ada.", g

            for name, fn in [
                ("initialize", initialize),
                ("tools", tools),
                ("progress", prog),
                ("logging", logging_),
                ("state", state),
                ("error", fail),
                ("elicitation", elicit),
                ("sampling", sample),
                ("resources", resources),
                ("prompts", prompts),
            ]:
                await check(name, fn)
    return failures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    args = ap.parse_args()
    sys.exit(1 if anyio.run(run, args.url) else 0)


if __name__ == "__main__":
    main()
