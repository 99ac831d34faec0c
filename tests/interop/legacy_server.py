"""A small stateful legacy MCP server for the sessionless interop tests.

Runs on the official Python SDK mcp==1.30.0 (FastMCP), Streamable HTTP, stateful
sessions (Mcp-Session-Id issued on initialize, SSE responses), bound to 127.0.0.1.

    .peers/py-legacy/bin/python tests/interop/legacy_server.py --port N
    # endpoint: http://127.0.0.1:N/mcp
    .peers/py-legacy/bin/python tests/interop/legacy_server.py --stdio
    # the same server over stdio (one session per process; tests/interop/stdio.sh)

With --stdio the same tools run over stdin/stdout, one JSON-RPC message per line: stdout
carries the protocol only (logs go to stderr), and what HTTP sends on the POST's or the
GET stream (progress, log messages, questions, updates, list changes) is written to
stdout in the same order.

Everything here is what a 2025-era server does on its own: per-session state,
a per-session log level (logging/setLevel), progress on the request's SSE stream,
server->client requests (elicitation, sampling) on the request's SSE stream, and
what only the session's standalone GET stream carries: roots/list (plain
`list_roots()`), resources/updated for subscribed resources and tools/list_changed,
the last two sent a moment *after* the tool that triggers them has answered.
Names and texts are asserted by the clients through tests/interop/profiles.json.
"""

from __future__ import annotations

import argparse
import asyncio
import weakref
from typing import Any

import mcp.types as types
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.lowlevel.server import NotificationOptions
from pydantic import AnyUrl, BaseModel, Field

mcp = FastMCP(
    name="sessionless-interop-legacy",
    instructions="Legacy interop fixture for sessionless (mcp==1.30.0, stateful).",
    host="127.0.0.1",
    log_level="WARNING",
)

# Per-session state, keyed by the ServerSession object (one per Mcp-Session-Id).
_counters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_log_levels: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_subscriptions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_background: set[asyncio.Task] = set()
_LEVELS = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


@mcp._mcp_server.set_logging_level()  # advertises the `logging` capability
async def _set_level(level: types.LoggingLevel) -> None:
    ctx = mcp.get_context()
    _log_levels[ctx.session] = level


_plain_initialization_options = mcp._mcp_server.create_initialization_options


def _initialization_options(
    notification_options: NotificationOptions | None = None,
    experimental_capabilities: dict[str, dict[str, Any]] | None = None,
):
    """Declares what this server really does: tools/list_changed and resource subscriptions."""
    options = _plain_initialization_options(
        NotificationOptions(tools_changed=True, prompts_changed=False, resources_changed=False),
        experimental_capabilities,
    )
    if options.capabilities.resources is not None:
        options.capabilities.resources.subscribe = True
    return options


mcp._mcp_server.create_initialization_options = _initialization_options  # type: ignore[method-assign]


def _later(coro) -> None:
    """Runs `coro` shortly after the current request has been answered."""

    async def run() -> None:
        await asyncio.sleep(0.2)
        await coro

    task = asyncio.get_running_loop().create_task(run())
    _background.add(task)
    task.add_done_callback(_background.discard)


def _enabled(ctx: Context, level: str) -> bool:
    threshold = _log_levels.get(ctx.session)
    return threshold is None or _LEVELS.index(level) >= _LEVELS.index(threshold)


# ---------------------------------------------------------------- tools


@mcp.tool()
def echo(message: str) -> str:
    """Echo the message back."""
    return f"echo: {message}"


@mcp.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool()
async def progress(ctx: Context, steps: int = 3) -> str:
    """Report `steps` progress notifications (legacy progressToken), then finish."""
    for i in range(1, steps + 1):
        await asyncio.sleep(0.05)
        await ctx.report_progress(progress=i, total=steps, message=f"step {i} of {steps}")
    return f"progress done: {steps} steps"


@mcp.tool()
async def log(ctx: Context, message: str = "hello") -> str:
    """Emit one log notification at each of debug, info, warning and error."""
    for level in ("debug", "info", "warning", "error"):
        if _enabled(ctx, level):
            await ctx.log(level, f"{level}: {message}", logger_name="interop")  # type: ignore[arg-type]
    return f"logged: {message}"


@mcp.tool()
def counter(ctx: Context) -> str:
    """Increment and return a counter kept in this upstream session."""
    n = _counters.get(ctx.session, 0) + 1
    _counters[ctx.session] = n
    return f"count: {n}"


@mcp.tool()
def fail(reason: str = "requested failure") -> str:
    """Always fails; the result carries isError: true."""
    raise ToolError(f"tool failed: {reason}")


class NameForm(BaseModel):
    user_name: str = Field(description="Your name")


@mcp.tool()
async def elicit_name(ctx: Context) -> str:
    """Ask the client for a name via elicitation/create (on the POST's SSE stream)."""
    result = await ctx.elicit(message="What is your name?", schema=NameForm)
    if result.action == "accept" and result.data is not None:
        return f"hello, {result.data.user_name}"
    return f"elicitation {result.action}"


@mcp.tool()
async def sample(ctx: Context, prompt: str = "Say hi") -> str:
    """Ask the client for an LLM completion via sampling/createMessage."""
    result = await ctx.session.create_message(
        messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=prompt))],
        max_tokens=50,
        related_request_id=ctx.request_id,
    )
    text = result.content.text if isinstance(result.content, types.TextContent) else str(result.content)
    return f"sampled: {text}"


@mcp.tool()
async def roots(ctx: Context) -> str:
    """Asks the client for its roots with the plain 1.x API (roots/list on the GET stream)."""
    result = await ctx.session.list_roots()
    return "roots: " + ", ".join(f"{r.uri} ({r.name})" for r in result.roots)


@mcp.tool()
async def touch(ctx: Context, uri: str) -> str:
    """Sends notifications/resources/updated for `uri` shortly after answering, if this
    session subscribed to it (the notification can only travel on the GET stream)."""
    subscribed = uri in _subscriptions.get(ctx.session, set())
    if subscribed:
        _later(ctx.session.send_resource_updated(AnyUrl(uri)))
    return f"touched {uri} (subscribed: {'yes' if subscribed else 'no'})"


@mcp.tool()
async def change_tools(ctx: Context) -> str:
    """Sends notifications/tools/list_changed shortly after answering (GET stream only)."""
    _later(ctx.session.send_tool_list_changed())
    return "tools list changed"


# ---------------------------------------------------------------- resources


@mcp._mcp_server.subscribe_resource()
async def _subscribe(uri: AnyUrl) -> None:
    _subscriptions.setdefault(mcp._mcp_server.request_context.session, set()).add(str(uri))


@mcp._mcp_server.unsubscribe_resource()
async def _unsubscribe(uri: AnyUrl) -> None:
    _subscriptions.get(mcp._mcp_server.request_context.session, set()).discard(str(uri))



@mcp.resource("legacy://static/hello", name="hello", mime_type="text/plain")
def hello_resource() -> str:
    """A static text resource."""
    return "Hello from the legacy upstream."


@mcp.resource("legacy://items/{item_id}", name="item", mime_type="text/plain")
def item_resource(item_id: str) -> str:
    """A resource template."""
    return f"item {item_id}"


# ---------------------------------------------------------------- prompts


@mcp.prompt()
def greet(name: str, style: str = "friendly") -> str:
    """A prompt with a required and an optional argument."""
    return f"Write a {style} greeting for {name}."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=int, help="serve Streamable HTTP on 127.0.0.1:PORT (/mcp)")
    where.add_argument("--stdio", action="store_true", help="serve over stdin/stdout (one session)")
    args = parser.parse_args()
    if args.stdio:
        mcp.run(transport="stdio")
        return
    mcp.settings.port = args.port
    mcp.run(transport="streamable-http")


if __name__ == "__main__":
    main()
