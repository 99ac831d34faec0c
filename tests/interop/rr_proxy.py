"""A tiny loopback round-robin HTTP/1.1 forwarder for the interop tests (stdlib only).

Every HTTP request (not every connection) goes to the next backend in turn: A, B, A, B…,
the way a round-robin load balancer in front of gateway replicas does. Request bodies
are read whole (Content-Length or chunked) and sent on; responses are streamed back as
they arrive (SSE event by event, re-chunked, flushed at once), never buffered. Hop-by-hop
headers are dropped; Host and everything else pass through. One backend connection per
request; client connections are kept alive.

    python3 rr_proxy.py --port 0 --backend 127.0.0.1:A --backend 127.0.0.1:B [--log FILE]

Prints `listening 127.0.0.1:PORT` on stdout once bound. Each request is logged (to
--log, default stderr) as one line:
    <seq> <backend> <METHOD> <path> session=<hash of Mcp-Session-Id, or -> <status|error ...> [rpc=<method>] ms=<n> [minted=<hash>]
where ms= is how long the backend took to send the answer's head (for a stream: until it
opened), rpc= is the JSON-RPC method of a request body that is one JSON-RPC request or
notification, and minted= names a session id the answer carried in its Mcp-Session-Id
header that the request did not (a session the backend opened: on initialize, or unasked).
With one --backend it is a logging pass-through (tests/interop/generations.sh uses it so).
A body that is one JSON-RPC response (a client answering a server request) is logged
with reply=1 instead of rpc=; a request whose params carry inputResponses or requestState
(an MRTR retry) with retry=1.

--modern-only makes it a 2026-only server in front of its backend (the SDK v2
everything-server, which serves both eras on one endpoint; tests/interop/legacy_modern.sh
and tests/conformance/run.sh): only a POST carrying `MCP-Protocol-Version: 2026-07-28`
that is not `initialize` is forwarded, the way a server of that revision alone answers
(docs/specification/2026-07-28 basic/transports/streamable-http.mdx, versioning.mdx):
    GET, DELETE (any verb but POST)          405, Allow: POST
    POST initialize                          400, -32022 data {supported, requested: its
                                             params.protocolVersion} (a modern-only server
                                             SHOULD list its versions in any error to initialize)
    POST with another MCP-Protocol-Version   400, -32022 data {supported, requested}
    POST without MCP-Protocol-Version        400, -32020 (header missing: Server Validation),
                                             data {supported}
with supported = ["2026-07-28"] and the request's id echoed. What it forwards loses any
Mcp-Session-Id and Last-Event-ID (a 2026-only server ignores them) and its answer any
Mcp-Session-Id (it never mints one); a server/discover answer is rewritten to list only
2026-07-28 in supportedVersions (the SDK's already does; kept so the probe sees a 2026-only
server whatever the backend lists). Log lines then also carry proto=<MCP-Protocol-Version
or -> and, for what it answered itself, backend `filter` and refused=<why>; a rewritten
discover answer adds rewrote=supportedVersions, a JSON answer handing out a requestState
asked=<hash of it>, and a request carrying one state=<hash of it> (so a retry can be matched
to the instance that asked).

--states-log FILE (any mode) writes one line per answer, JSON or SSE, that handed out a
requestState (an input_required round), once the answer has been relayed whole:
    <seq> <backend> asked=<hash>
with the seq and backend of the request's own line in --log; with the retries' state=<hash>
there, a retry can be matched to the round that asked, and so to the replica that served it
(tests/interop/stdio.sh). Answers are still streamed through unbuffered; only the first
4 MiB of each are looked at.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import itertools
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODERN = "2026-07-28"
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}
BACKEND_TIMEOUT = 600.0  # seconds a backend may stay silent (SSE streams send keep-alives)
STATES_SCAN = 4 << 20  # bytes of an answer --states-log looks at


class Proxy(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, backends: list[tuple[str, int]], log, modern_only: bool = False, states_log=None) -> None:
        super().__init__(addr, Handler)
        self.backends = backends
        self.modern_only = modern_only
        self.states_log = states_log
        self.seq = itertools.count(1)
        self.lock = threading.Lock()
        self.log = log

    def pick(self) -> tuple[int, tuple[str, int]]:
        with self.lock:
            n = next(self.seq)
        return n, self.backends[(n - 1) % len(self.backends)]

    def record(self, line: str) -> None:
        with self.lock:
            self.log.write(line + "\n")
            self.log.flush()

    def record_states(self, seq: int, backend: str, body: bytes, sse: bool) -> None:
        """--states-log: one line per requestState the answer `body` handed out."""
        if self.states_log is None:
            return
        texts = [body.decode("utf-8", "replace")]
        if sse:
            texts = ["\n".join(line[5:].lstrip(" ") for line in event.split("\n") if line.startswith("data:"))
                     for event in texts[0].replace("\r\n", "\n").split("\n\n")]
        for text in texts:
            hashed = asked_state(text.encode())
            if hashed:
                with self.lock:
                    self.states_log.write(f"{seq} {backend}{hashed}\n")
                    self.states_log.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Proxy

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass  # one line per request is written by forward()

    def do_GET(self):
        self.forward()

    do_POST = do_DELETE = do_PUT = do_PATCH = do_OPTIONS = do_HEAD = do_GET

    def read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def forward(self) -> None:
        body = self.read_body()
        modern_only = self.server.modern_only
        sid = self.headers.get("Mcp-Session-Id")
        tag = hashlib.sha256(sid.encode()).hexdigest()[:10] if sid else "-"
        rpc = rpc_method(body)
        extra = f" rpc={rpc}" if rpc else ""
        extra += describe(body)
        if modern_only:
            extra += f" proto={self.headers.get('MCP-Protocol-Version') or '-'}"
            refusal = refuse(self.command, self.headers.get("MCP-Protocol-Version"), rpc, body)
            if refusal is not None:
                status, why, answer = refusal
                seq, _ = self.server.pick()
                self.server.record(f"{seq} filter {self.command} {self.path} session={tag} {status}{extra} refused={why}")
                self.answer(status, answer)
                return
        seq, (host, port) = self.server.pick()
        where = f"{seq} {host}:{port} {self.command} {self.path} session={tag}"
        ignored = {"mcp-session-id", "last-event-id"} if modern_only else set()
        headers = {}
        for k, v in self.headers.items():
            if k.lower() not in HOP_BY_HOP and k.lower() != "content-length" and k.lower() not in ignored:
                headers.setdefault(k, []).append(v)
        conn = http.client.HTTPConnection(host, port, timeout=BACKEND_TIMEOUT)
        began = time.monotonic()
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, vs in headers.items():
                for v in vs:
                    conn.putheader(k, v)
            if body or self.command in ("POST", "PUT", "PATCH"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            resp = conn.getresponse()
        except OSError as e:
            conn.close()
            self.server.record(f"{where} error {type(e).__name__}: {e}")
            self.send_error(502, "backend unreachable")
            return
        extra += f" ms={(time.monotonic() - began) * 1000:.0f}"
        minted = resp.getheader("Mcp-Session-Id")
        if minted and minted != sid:
            extra += f" minted={hashlib.sha256(minted.encode()).hexdigest()[:10]}"
        try:
            if modern_only and rpc == "server/discover":
                text, changed = modern_discover(resp)
                self.server.record(f"{where} {resp.status}{extra}{' rewrote=supportedVersions' if changed else ''}")
                self.relay_whole(resp, text)
                return
            ctype = resp.getheader("Content-Type") or ""
            if modern_only and ctype.startswith("application/json") and resp.getheader("Content-Length"):
                # A JSON answer (small, not a stream): read whole to log the requestState
                # it hands out, so a retry can be matched to the instance that asked.
                text = resp.read()
                self.server.record(f"{where} {resp.status}{extra}{asked_state(text)}")
                self.relay_whole(resp, text)
                self.server.record_states(seq, f"{host}:{port}", text, sse=False)
                return
            self.server.record(f"{where} {resp.status}{extra}")
            seen = bytearray() if self.server.states_log is not None and self.command == "POST" else None
            self.relay(resp, drop={"mcp-session-id"} if modern_only else set(), seen=seen)
            if seen:
                self.server.record_states(seq, f"{host}:{port}", bytes(seen), sse=ctype.startswith("text/event-stream"))
        except OSError:
            self.close_connection = True  # the client went away (or the backend did)
        finally:
            conn.close()

    def answer(self, status: int, message: dict | None) -> None:
        """An answer of the filter's own: a JSON-RPC error body, or none (405)."""
        data = json.dumps(message).encode() if message is not None else b""
        self.send_response_only(status)
        if status == 405:
            self.send_header("Allow", "POST")
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()

    def relay_whole(self, resp: http.client.HTTPResponse, body: bytes) -> None:
        """An answer read whole (and maybe rewritten): sent with its own Content-Length."""
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in HOP_BY_HOP and k.lower() not in ("content-length", "mcp-session-id"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def relay(self, resp: http.client.HTTPResponse, drop: set[str] = frozenset(), seen: bytearray | None = None) -> None:
        """Streams the answer through; `seen` (when given) gets its first STATES_SCAN bytes."""
        self.send_response_only(resp.status, resp.reason)
        length = resp.getheader("Content-Length")
        for k, v in resp.getheaders():
            if k.lower() not in HOP_BY_HOP and k.lower() not in drop:
                self.send_header(k, v)
        bodyless = self.command == "HEAD" or resp.status in (204, 304) or 100 <= resp.status < 200
        chunked = length is None and not bodyless
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        if bodyless:
            return
        while True:
            data = resp.read1(65536)
            if not data:
                break
            if seen is not None and len(seen) < STATES_SCAN:
                seen += data[: STATES_SCAN - len(seen)]
            if chunked:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            else:
                self.wfile.write(data)
            self.wfile.flush()
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        if resp.will_close and length is None and not chunked:
            self.close_connection = True


def one_message(body: bytes) -> dict | None:
    """The body as one JSON-RPC message (an object), or None."""
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        msg = json.loads(body)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


def describe(body: bytes) -> str:
    """reply=1 for one JSON-RPC response; retry=1 for a request carrying MRTR answers;
    probe=1 for the gateway's own probes (their ids start with sessionless-probe)."""
    msg = one_message(body)
    if msg is None:
        return ""
    if str(msg.get("id", "")).startswith("sessionless-probe"):
        return " probe=1"
    if "method" not in msg and "id" in msg and ("result" in msg or "error" in msg):
        return " reply=1"
    params = msg.get("params")
    if isinstance(params, dict) and ("inputResponses" in params or "requestState" in params):
        state = params.get("requestState")
        return " retry=1" + (f" state={digest(state)}" if isinstance(state, str) else "")
    return ""


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def asked_state(body: bytes) -> str:
    """ asked=<hash> for a JSON answer whose result carries a requestState, else ""."""
    msg = one_message(body) or {}
    result = msg.get("result")
    state = result.get("requestState") if isinstance(result, dict) else None
    return f" asked={digest(state)}" if isinstance(state, str) else ""


def refuse(verb: str, version: str | None, rpc: str | None, body: bytes):
    """--modern-only: (status, why, JSON-RPC answer or None) for what a 2026-only server
    does not take, or None to forward."""
    if verb != "POST":
        return 405, "not-post", None
    msg = one_message(body) or {}
    rid = msg.get("id") if isinstance(msg.get("id"), (str, int)) and not isinstance(msg.get("id"), bool) else None

    def error(code: int, message: str, data: dict) -> dict:
        out = {"jsonrpc": "2.0", "error": {"code": code, "message": message, "data": data}}
        if rid is not None:
            out["id"] = rid
        return out

    supported = {"supported": [MODERN]}
    if rpc == "initialize":
        params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
        requested = params.get("protocolVersion") if isinstance(params.get("protocolVersion"), str) else version
        data = {**supported, **({"requested": requested} if requested else {})}
        return 400, "initialize", error(-32022, "Unsupported protocol version: this server speaks 2026-07-28 only", data)
    if version is None:
        return 400, "no-version-header", error(-32020, "Missing MCP-Protocol-Version header", supported)
    if version.strip() != MODERN:
        data = {**supported, "requested": version}
        return 400, "version", error(-32022, f"Unsupported protocol version: {version}", data)
    return None


def modern_discover(resp: http.client.HTTPResponse) -> tuple[bytes, bool]:
    """A server/discover answer (JSON or SSE) read whole, supportedVersions cut to 2026-07-28."""
    body = resp.read()
    sse = (resp.getheader("Content-Type") or "").startswith("text/event-stream")
    changed = False

    def fix(text: str) -> str:
        nonlocal changed
        try:
            msg = json.loads(text)
        except ValueError:
            return text
        result = msg.get("result") if isinstance(msg, dict) else None
        versions = result.get("supportedVersions") if isinstance(result, dict) else None
        if not isinstance(versions, list) or versions == [v for v in versions if v == MODERN]:
            return text
        result["supportedVersions"] = [v for v in versions if v == MODERN]
        changed = True
        return json.dumps(msg)

    if not sse:
        return fix(body.decode()).encode(), changed
    lines = [("data: " + fix(line[len("data:"):].lstrip(" ")) if line.startswith("data:") else line)
             for line in body.decode().split("\n")]
    return "\n".join(lines).encode(), changed


def rpc_method(body: bytes) -> str | None:
    """The JSON-RPC method of a body holding one request or notification (for the log)."""
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        method = json.loads(body).get("method")
    except ValueError:
        return None
    return method if isinstance(method, str) and method and not any(c.isspace() for c in method) else None


def parse_log(path: str) -> list[dict]:
    """The lines of a log this proxy wrote, as dicts: seq, backend, verb, path, session (its
    hash, or -), status, line, and each key=value that follows (rpc, minted, reply, …)."""
    rows = []
    for line in open(path):
        parts = line.split()
        if len(parts) < 6 or not parts[0].isdigit() or not parts[4].startswith("session="):
            continue
        row = {"seq": int(parts[0]), "backend": parts[1], "verb": parts[2], "path": parts[3],
               "session": parts[4].split("=", 1)[1], "status": parts[5], "line": line.strip()}
        for extra in parts[6:]:
            k, _, v = extra.partition("=")
            row[k] = v
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--backend", action="append", required=True, help="host:port; repeat, in order")
    ap.add_argument("--log", help="request log file (default stderr)")
    ap.add_argument("--states-log", help="file of the requestStates answers handed out (seq, backend, asked=hash)")
    ap.add_argument("--modern-only", action="store_true",
                    help="answer as a 2026-07-28-only server: refuse initialize, other versions, GET, DELETE")
    args = ap.parse_args()
    backends = []
    for b in args.backend:
        host, _, port = b.rpartition(":")
        backends.append((host, int(port)))
    log = open(args.log, "a", buffering=1) if args.log else sys.stderr
    states_log = open(args.states_log, "a", buffering=1) if args.states_log else None
    server = Proxy(("127.0.0.1", args.port), backends, log, modern_only=args.modern_only, states_log=states_log)
    print(f"listening 127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
