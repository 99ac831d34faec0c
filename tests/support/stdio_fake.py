#!/usr/bin/env python3
"""A tiny legacy (2025-11-25) MCP server over stdio, for tests/stdio.rs.

One JSON-RPC message per line on stdin and stdout, stdlib only. Every
`tools/call` runs on a thread of its own, so the server answers several
requests at once (as a shared process must). Each tool's text is a JSON
object that names the process (`pid`), so a test knows which process served it.

Flags (the gateway passes argv as it is, no shell):
  --exit-at-once     exit 1 at once (a command that keeps failing)
  --no-init          never answer `initialize` (a start that never completes)
  --ignore-term      ignore SIGTERM, and stdin closing too (only KILL stops it)
  --init-delay-ms N  wait N ms before answering `initialize`
  --count-file PATH  append this process's PID to PATH at start (count spawns)

Tools: echo, slow, pid, env, ask, sample, roots, progress, log, crash, huge,
garbage, stderr_flood, spawn_grandchild (see TOOLS below).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")

out_lock = threading.Lock()
state = {"initialized": False, "client_caps": {}, "log_level": None}
pending = {}  # server-minted request id -> [threading.Event, response]
pending_lock = threading.Lock()
next_id = [0]


def send(msg):
    line = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
    write_raw(line)


def write_raw(data):
    with out_lock:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def result(rid, res):
    send({"jsonrpc": "2.0", "id": rid, "result": res})


def error(rid, code, message):
    send({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}})


def text_result(obj, is_error=False):
    obj = dict(obj, pid=os.getpid())
    res = {"content": [{"type": "text", "text": json.dumps(obj)}], "structuredContent": obj}
    if is_error:
        res["isError"] = True
    return res


def ask_client(method, params, timeout=120):
    """Sends a request to the client with an id of our own; waits for its answer."""
    with pending_lock:
        next_id[0] += 1
        rid = "fake-%d-%d" % (os.getpid(), next_id[0])
        slot = [threading.Event(), None]
        pending[rid] = slot
    send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    slot[0].wait(timeout)
    with pending_lock:
        pending.pop(rid, None)
    return slot[1]


def declared(cap):
    return isinstance(state["client_caps"].get(cap), dict)


# ------------------------------------------------------------------ tools


def tool_echo(args, meta):
    return text_result({"text": args.get("text", "")})


def tool_slow(args, meta):
    started = time.time()
    time.sleep(args.get("ms", 1000) / 1000.0)
    return text_result({"started": started, "ended": time.time(), "tag": args.get("tag")})


def tool_pid(args, meta):
    return text_result({"pgid": os.getpgid(0), "ppid": os.getppid()})


def tool_env(args, meta):
    with open("/proc/self/environ", "rb") as f:
        raw = f.read()
    initial = dict(kv.decode(errors="replace").split("=", 1) for kv in raw.split(b"\0") if b"=" in kv)
    # `environ` is os.environ (Python may add LC_CTYPE when LANG is unset or C,
    # PEP 538); `initial` is the environment exactly as the process was given it.
    return text_result({"environ": dict(os.environ), "initial": initial})


def asking(cap, method, params):
    if not declared(cap):
        return text_result({"error": "the client did not declare %s" % cap}, is_error=True)
    answer = ask_client(method, params)
    return text_result({"answer": answer})


def tool_ask(args, meta):
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    message = args.get("message", "What is your name?")
    return asking("elicitation", "elicitation/create", {"message": message, "requestedSchema": schema})


def tool_sample(args, meta):
    prompt = args.get("prompt", "Say hello")
    params = {"messages": [{"role": "user", "content": {"type": "text", "text": prompt}}], "maxTokens": 20}
    return asking("sampling", "sampling/createMessage", params)


def tool_roots(args, meta):
    return asking("roots", "roots/list", {})


def tool_progress(args, meta):
    token = meta.get("progressToken")
    for i in range(1, 4):
        if token is not None:
            send({"jsonrpc": "2.0", "method": "notifications/progress",
                  "params": {"progressToken": token, "progress": i, "total": 3,
                             "message": "%s step %d" % (args.get("tag"), i)}})
        time.sleep(args.get("ms", 50) / 1000.0)
    return text_result({"tag": args.get("tag"), "token": token})


def tool_log(args, meta):
    tag = args.get("tag")
    for level in ("info", "warning"):
        wanted = state["log_level"]
        if wanted is None or LEVELS.index(level) >= LEVELS.index(wanted):
            send({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": level, "logger": "stdio-fake", "data": "%s %s line" % (tag, level)}})
    time.sleep(args.get("ms", 50) / 1000.0)
    return text_result({"tag": tag})


def tool_crash(args, meta):
    os._exit(3)


def tool_crash_leaving_grandchild(args, meta):
    # A grandchild that inherits stdin/stdout/stderr, then the server dies.
    subprocess.Popen(["sleep", "1000"])
    os._exit(3)


def tool_huge(args, meta, rid):
    size = int(args.get("bytes", 1 << 20))
    head = json.dumps({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": ""}]}},
                      separators=(",", ":"))
    cut = head.index('"text":""') + len('"text":"')
    pad = max(0, size - len(head))
    write_raw((head[:cut] + "x" * pad + head[cut:] + "\n").encode())


def tool_garbage(args, meta):
    write_raw(b"this line is not JSON-RPC {{{\n")
    write_raw(b'{"not": "a jsonrpc message"}\n')
    return text_result({"text": args.get("text", "after garbage")})


def tool_stderr_flood(args, meta):
    total = int(float(args.get("mb", 10)) * (1 << 20))
    line = ("stderr flood " + "e" * int(args.get("line_bytes", 1000)) + "\n").encode()
    chunk = line * max(1, 65536 // len(line))
    written = 0
    while written < total:
        os.write(2, chunk)
        written += len(chunk)
    if args.get("long_line_bytes"):
        os.write(2, b"L" * int(args["long_line_bytes"]) + b"\n")
    return text_result({"written": written})


def tool_spawn_grandchild(args, meta):
    child = subprocess.Popen(["sleep", "1000"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    return text_result({"grandchild": child.pid, "pgid": os.getpgid(0)})


TOOLS = {
    "echo": (tool_echo, "returns arguments.text"),
    "slow": (tool_slow, "sleeps arguments.ms, then answers with when it started and ended"),
    "pid": (tool_pid, "its PID, PGID and parent PID"),
    "env": (tool_env, "its environment"),
    "ask": (tool_ask, "asks the client (elicitation/create) and returns the answer"),
    "sample": (tool_sample, "asks the client (sampling/createMessage) and returns the answer"),
    "roots": (tool_roots, "asks the client (roots/list) and returns the answer"),
    "progress": (tool_progress, "three notifications/progress, then the answer"),
    "log": (tool_log, "notifications/message at info and warning, then the answer"),
    "crash": (tool_crash, "exits 3 without answering"),
    "crash_leaving_grandchild": (tool_crash_leaving_grandchild, "starts `sleep 1000` holding its stdio, exits 3"),
    "huge": (tool_huge, "answers with one stdout line of arguments.bytes bytes"),
    "garbage": (tool_garbage, "writes lines that are not JSON-RPC, then answers"),
    "stderr_flood": (tool_stderr_flood, "writes arguments.mb MiB to stderr, then answers"),
    "spawn_grandchild": (tool_spawn_grandchild, "starts `sleep 1000` in its process group"),
}


def call_tool(rid, params):
    name = params.get("name")
    args = params.get("arguments") or {}
    meta = params.get("_meta") or {}
    if name not in TOOLS:
        error(rid, -32602, "unknown tool %r" % name)
        return
    try:
        if name == "huge":
            tool_huge(args, meta, rid)
            return
        result(rid, TOOLS[name][0](args, meta))
    except Exception as e:  # a bug in the fake: say so rather than hang the call
        error(rid, -32603, "%s failed: %r" % (name, e))


# ------------------------------------------------------------------ dispatch


def handle(msg, flags):
    method = msg.get("method")
    rid = msg.get("id")
    if method is None:
        # A response to one of our requests.
        with pending_lock:
            slot = pending.get(rid)
        if slot is not None:
            slot[1] = msg.get("result", {"error": msg.get("error")})
            slot[0].set()
        return
    is_request = "id" in msg
    params = msg.get("params") or {}
    if method == "initialize":
        if flags["no_init"]:
            return
        if flags["init_delay_ms"]:
            time.sleep(flags["init_delay_ms"] / 1000.0)
        asked = params.get("protocolVersion")
        state["client_caps"] = params.get("capabilities") or {}
        state["initialized"] = True
        result(rid, {"protocolVersion": asked if asked in VERSIONS else VERSIONS[0],
                     "capabilities": {"tools": {}, "logging": {}},
                     "serverInfo": {"name": "stdio-fake", "version": "1.0.0"}})
        return
    if not state["initialized"]:
        if is_request:
            error(rid, -32600, "Received request before initialization was complete")
        return
    if not is_request:
        return  # notifications/initialized, notifications/cancelled, ...
    if method == "ping":
        result(rid, {})
    elif method == "logging/setLevel":
        state["log_level"] = params.get("level")
        result(rid, {})
    elif method == "tools/list":
        result(rid, {"tools": [{"name": n, "description": d, "inputSchema": {"type": "object"}}
                               for n, (_, d) in TOOLS.items()]})
    elif method == "tools/call" and params.get("name") in ("block_stdin", "flood_requests"):
        # On the reading thread: stdin is not read meanwhile.
        args = params.get("arguments") or {}
        if params.get("name") == "flood_requests":
            n = int(args.get("n", 100000))
            write_raw(b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"x/y"}\n' % i for i in range(n)))
        time.sleep(args.get("ms", 1000) / 1000.0)
        result(rid, text_result({"blocked_ms": args.get("ms", 1000)}))
    elif method == "tools/call":
        threading.Thread(target=call_tool, args=(rid, params), daemon=True).start()
    else:
        error(rid, -32601, "Method not found: %s" % method)


def parse_flags(argv):
    flags = {"exit_at_once": False, "no_init": False, "ignore_term": False, "init_delay_ms": 0,
             "count_file": None}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--exit-at-once", "--no-init", "--ignore-term"):
            flags[a[2:].replace("-", "_")] = True
        elif a in ("--init-delay-ms", "--count-file"):
            i += 1
            flags[a[2:].replace("-", "_")] = int(argv[i]) if a == "--init-delay-ms" else argv[i]
        else:
            sys.exit("stdio_fake: unknown argument %r" % a)
        i += 1
    return flags


def main():
    flags = parse_flags(sys.argv[1:])
    if flags["count_file"]:
        with open(flags["count_file"], "a") as f:
            f.write("%d\n" % os.getpid())
    if flags["exit_at_once"]:
        sys.exit(1)
    if flags["ignore_term"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for line in sys.stdin.buffer:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            error(None, -32700, "Parse error")
            continue
        if isinstance(msg, dict):
            handle(msg, flags)
    # stdin closed: the gateway is gone or done with us.
    while flags["ignore_term"]:
        time.sleep(3600)
    os._exit(0)


if __name__ == "__main__":
    main()
