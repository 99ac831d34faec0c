"""A short, bounded load on a gateway started by tests/ops/prometheus.sh, so that
every query of dashboards/sessionless.json has data: modern calls (JSON, SSE,
MRTR rounds answered, abandoned and over the cap), a forged requestState, a
client that leaves mid-call, a listen stream, a stale session header, legacy
sessions (relayed, and translated with a pushed question answered), a bogus
legacy session id, an auth failure, rate-limited and busy calls, a slow request
head, an unsigned request to the internal listener.

Usage: load.py PHASE GATEWAY INTERNAL   (PHASE: main or after_restart; both host:port)
Standard library only. Exits non-zero, naming the step, when an answer is not
the one expected."""

import http.client
import json
import socket
import sys
import threading
import time

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


def fail(step, why):
    print(f"load: {step}: {why}", file=sys.stderr)
    sys.exit(1)


def post(addr, path, body, headers, timeout=15):
    """POSTs body; returns (status, headers, text) read to the end."""
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Host": "127.0.0.1", **headers})
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    return resp.status, dict(resp.getheaders()), text


def message(text, want_id):
    """The JSON-RPC message with id `want_id` in a JSON or SSE answer."""
    if text.lstrip().startswith("{"):
        return json.loads(text)
    for line in text.splitlines():
        if line.startswith("data:"):
            try:
                msg = json.loads(line[5:])
            except ValueError:
                continue
            if msg.get("id") == want_id and ("result" in msg or "error" in msg):
                return msg
    return None


def modern(addr, path, method, params=None, name=None, caps=None, meta=None, headers=None, rid=1, timeout=15):
    params = dict(params or {})
    params["_meta"] = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": caps or {},
        **(meta or {}),
    }
    h = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    if name:
        h["Mcp-Name"] = name
    h.update(headers or {})
    status, _, text = post(addr, path, {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}, h, timeout)
    return status, message(text, rid), text


def call(addr, path, tool, args=None, expect=200, **kw):
    status, msg, text = modern(addr, path, "tools/call", {"name": tool, "arguments": args or {}}, name=tool, **kw)
    if status != expect:
        fail(f"{path} tools/call {tool}", f"HTTP {status}, wanted {expect}: {text[:300]}")
    return msg


def ask(addr, path="/mcp", headers=None, expect=200):
    """An ask_user call: its input_required round (key, requestState)."""
    msg = call(addr, path, "ask_user", {"question": "name?"}, caps={"elicitation": {}}, headers=headers, expect=expect)
    if expect != 200:
        return None
    result = msg.get("result", {})
    if result.get("resultType") != "input_required":
        fail("ask_user", f"no input_required round: {msg}")
    return next(iter(result["inputRequests"])), result["requestState"]


def mrtr(addr):
    key, state = ask(addr)
    params = {
        "name": "ask_user",
        "arguments": {"question": "name?"},
        "inputResponses": {key: {"action": "accept", "content": {"answer": "load"}}},
        "requestState": state,
    }
    status, msg, text = modern(addr, "/mcp", "tools/call", params, name="ask_user", caps={"elicitation": {}}, rid=2)
    if status != 200 or "you answered: load" not in text:
        fail("MRTR retry", f"HTTP {status}: {text[:300]}")


def forged_state(addr):
    params = {"name": "ask_user", "arguments": {}, "inputResponses": {}, "requestState": "AAAAforged"}
    status, _, _ = modern(addr, "/mcp", "tools/call", params, name="ask_user", caps={"elicitation": {}})
    if status != 400:
        fail("forged requestState", f"HTTP {status}, wanted 400")


def leave_mid_call(addr):
    """A slow call whose client hangs up: notifications/cancelled upstream."""
    try:
        # No progress token: nothing comes back before the client gives up.
        modern(addr, "/mcp", "tools/call", {"name": "slow", "arguments": {"steps": 20, "delay_ms": 100}}, name="slow",
               timeout=0.5)
    except (socket.timeout, TimeoutError):
        return
    fail("client leaving", "the slow call answered within 0.5 s")


def listen(addr):
    """A subscriptions/listen stream held for a second, then closed."""
    try:
        modern(addr, "/mcp", "subscriptions/listen", {"notifications": {"toolsListChanged": True}}, timeout=1)
    except (socket.timeout, TimeoutError):
        return


def legacy_session(addr, path, caps=None):
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": LEGACY, "capabilities": caps or {}, "clientInfo": {"name": "load", "version": "0"}}}
    status, headers, text = post(addr, path, body, {"Content-Type": "application/json", "Accept": ACCEPT})
    sid = {k.lower(): v for k, v in headers.items()}.get("mcp-session-id")
    if status != 200 or not sid:
        fail(f"legacy initialize on {path}", f"HTTP {status}: {text[:300]}")
    h = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": LEGACY, "Mcp-Session-Id": sid}
    post(addr, path, {"jsonrpc": "2.0", "method": "notifications/initialized"}, h)
    return h


def legacy_calls(addr):
    h = legacy_session(addr, "/mcp")
    status, _, text = post(addr, "/mcp", {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                          "params": {"name": "echo", "arguments": {"text": "hi"}}}, h)
    if status != 200 or "hi" not in text:
        fail("legacy tools/call", f"HTTP {status}: {text[:300]}")
    bogus = dict(h, **{"Mcp-Session-Id": "not-a-session"})
    status, _, _ = post(addr, "/mcp", {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, bogus)
    if status != 404:
        fail("legacy bogus session id", f"HTTP {status}, wanted 404")
    return h


def legacy_question(addr):
    """A legacy client of the 2026-only upstream: its question is pushed on the
    SSE answer and answered on another POST."""
    h = legacy_session(addr, "/modern", caps={"elicitation": {}})
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=15)
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "ask_user", "arguments": {"question": "name?"}}}
    conn.request("POST", "/modern", body=json.dumps(body), headers={"Host": "127.0.0.1", **h})
    resp = conn.getresponse()
    if resp.status != 200:
        fail("translated ask_user", f"HTTP {resp.status}: {resp.read()[:300]}")
    answered = False
    while True:
        line = resp.readline().decode()
        if not line:
            fail("translated ask_user", "the stream ended without a result")
        if not line.startswith("data:"):
            continue
        msg = json.loads(line[5:])
        if msg.get("method") == "elicitation/create" and not answered:
            answer = {"jsonrpc": "2.0", "id": msg["id"], "result": {"action": "accept", "content": {"answer": "load"}}}
            status, _, text = post(addr, "/modern", answer, h)
            if status != 202:
                fail("translated answer", f"HTTP {status}: {text[:300]}")
            answered = True
        elif msg.get("id") == 2:
            if "you answered: load" not in json.dumps(msg):
                fail("translated ask_user", f"unexpected result {msg}")
            break
    conn.close()


def federated(addr):
    """A federated route: the merged list, and a call to each member's tool."""
    status, msg, text = modern(addr, "/all", "tools/list")
    names = [t.get("name") for t in (msg or {}).get("result", {}).get("tools", [])]
    if status != 200 or "legacy__echo" not in names or "modern__echo" not in names:
        fail("/all tools/list", f"HTTP {status}: {text[:300]}")
    for member in ("legacy", "modern"):
        msg = call(addr, "/all", f"{member}__echo", {"text": member})
        if msg.get("result", {}).get("content", [{}])[0].get("text") != member:
            fail(f"/all {member}__echo", f"unexpected answer: {msg}")


def stdio(addr):
    """A stdio upstream: its process started by the call, which it answers."""
    msg = call(addr, "/stdio", "echo", {"text": "over stdio"})
    text = msg.get("result", {}).get("content", [{}])[0].get("text", "")
    if "over stdio" not in text:
        fail("/stdio echo", f"unexpected answer: {msg}")


def stale_header(addr):
    status, _, text = modern(addr, "/mcp", "tools/list", headers={"Mcp-Session-Id": "stale"})
    if status != 200:
        fail("stale session header", f"HTTP {status}: {text[:300]}")


def unauthenticated(addr):
    status, _, _ = modern(addr, "/private", "tools/list")
    if status != 401:
        fail("auth failure", f"HTTP {status}, wanted 401")


def rate_limited(addr):
    call(addr, "/mcp", "add", {"a": 1, "b": 2})
    call(addr, "/mcp", "add", {"a": 1, "b": 2}, expect=429)


def busy(addr):
    """Two slow calls on the upstream that takes one at a time: one is 503."""
    statuses = []

    def one():
        statuses.append(modern(addr, "/busy", "tools/call", {"name": "slow", "arguments": {"steps": 5, "delay_ms": 100}},
                               name="slow")[0])

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join()
    if sorted(statuses) != [200, 503]:
        fail("upstream busy", f"statuses {statuses}, wanted one 200 and one 503")


def quota(addr):
    """Over the per-principal cap of paused calls: 429; the paused ones expire."""
    who = {"Authorization": "Bearer quota-principal"}
    ask(addr, headers=who)
    ask(addr, headers=who)
    ask(addr, headers=who, expect=429)


def roots_call(addr):
    """A call declaring roots runs on an exclusive session, closed after."""
    call(addr, "/mcp", "echo", {"text": "r"}, caps={"roots": {}})


def slow_head(addr):
    """A request head never finished: the gateway ends the connection."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    s.settimeout(10)
    try:
        while s.recv(1024):
            pass
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()


def unsigned_internal(internal):
    status, _, _ = post(internal, "/internal/v1/retry", {"jsonrpc": "2.0", "id": 1, "method": "tools/call"},
                        {"Content-Type": "application/json"})
    if status < 400:
        fail("unsigned internal request", f"HTTP {status}, wanted a refusal")


def main():
    phase, addr, internal = sys.argv[1:4]
    if phase == "main":
        for _ in range(5):
            call(addr, "/mcp", "echo", {"text": "hello"})
            call(addr, "/modern", "echo", {"text": "hello"})
        call(addr, "/mcp", "slow", {"steps": 3, "delay_ms": 10}, meta={"progressToken": "p", "io.modelcontextprotocol/logLevel": "info"})
        mrtr(addr)
        forged_state(addr)
        leave_mid_call(addr)
        listen(addr)
        federated(addr)
        stdio(addr)
        stale_header(addr)
        legacy_calls(addr)
        legacy_question(addr)
        unauthenticated(addr)
        rate_limited(addr)
        busy(addr)
        quota(addr)
        roots_call(addr)
        slow_head(addr)
        unsigned_internal(internal)
    elif phase == "after_restart":
        # The upstream restarted: the pooled session is gone (404), the call
        # is sent again on a fresh one.
        call(addr, "/mcp", "echo", {"text": "again"})
    else:
        fail("arguments", f"unknown phase {phase}")
    print(f"load: {phase}: done")


if __name__ == "__main__":
    main()
