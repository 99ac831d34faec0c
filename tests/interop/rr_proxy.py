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
    <seq> <backend> <METHOD> <path> session=<hash of Mcp-Session-Id, or -> <status|error ...> [rpc=<method>] [minted=<hash>]
where rpc= is the JSON-RPC method of a request body that is one JSON-RPC request or
notification, and minted= names a session id the answer carried in its Mcp-Session-Id
header that the request did not (a session the backend opened: on initialize, or unasked).
With one --backend it is a logging pass-through (tests/interop/generations.sh uses it so).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import itertools
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


class Proxy(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, backends: list[tuple[str, int]], log) -> None:
        super().__init__(addr, Handler)
        self.backends = backends
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
        seq, (host, port) = self.server.pick()
        sid = self.headers.get("Mcp-Session-Id")
        tag = hashlib.sha256(sid.encode()).hexdigest()[:10] if sid else "-"
        where = f"{seq} {host}:{port} {self.command} {self.path} session={tag}"
        headers = {}
        for k, v in self.headers.items():
            if k.lower() not in HOP_BY_HOP and k.lower() != "content-length":
                headers.setdefault(k, []).append(v)
        conn = http.client.HTTPConnection(host, port, timeout=BACKEND_TIMEOUT)
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
        extra = f" rpc={rpc}" if (rpc := rpc_method(body)) else ""
        minted = resp.getheader("Mcp-Session-Id")
        if minted and minted != sid:
            extra += f" minted={hashlib.sha256(minted.encode()).hexdigest()[:10]}"
        self.server.record(f"{where} {resp.status}{extra}")
        try:
            self.relay(resp)
        except OSError:
            self.close_connection = True  # the client went away (or the backend did)
        finally:
            conn.close()

    def relay(self, resp: http.client.HTTPResponse) -> None:
        self.send_response_only(resp.status, resp.reason)
        length = resp.getheader("Content-Length")
        for k, v in resp.getheaders():
            if k.lower() not in HOP_BY_HOP:
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


def rpc_method(body: bytes) -> str | None:
    """The JSON-RPC method of a body holding one request or notification (for the log)."""
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        method = json.loads(body).get("method")
    except ValueError:
        return None
    return method if isinstance(method, str) and method and not any(c.isspace() for c in method) else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--backend", action="append", required=True, help="host:port; repeat, in order")
    ap.add_argument("--log", help="request log file (default stderr)")
    args = ap.parse_args()
    backends = []
    for b in args.backend:
        host, _, port = b.rpartition(":")
        backends.append((host, int(port)))
    log = open(args.log, "a", buffering=1) if args.log else sys.stderr
    server = Proxy(("127.0.0.1", args.port), backends, log)
    print(f"listening 127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
