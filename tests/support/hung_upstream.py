#!/usr/bin/env python3
"""A legacy (2025-06-18) MCP server over HTTP that asks a question and then
never answers again: `tools/call` gets an SSE stream carrying one
`elicitation/create` request, held open; the answer to it (the gateway's
decline) and `DELETE` are read and never answered. What a shutdown meets in
front of a hung upstream (tests/cli.rs). stdlib only; binds 127.0.0.1 on the
port given (0: a free one) and prints `listening on http://ADDR/mcp`.
"""

import http.server
import json
import sys
import threading
import time

HOLD_SECONDS = 120  # longer than any test waits; the test kills the process


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"null")

    def json_reply(self, msg):
        data = json.dumps(msg).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Mcp-Session-Id", "hung-1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def do_POST(self):
        msg = self.body()
        method = msg.get("method") if isinstance(msg, dict) else None
        if method == "initialize":
            return self.json_reply({
                "jsonrpc": "2.0",
                "id": msg["id"],
                "result": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hung", "version": "1"},
                },
            })
        if method is None or method.startswith("notifications/"):
            if method is None:
                # An answer to the question (the decline): never acknowledged.
                time.sleep(HOLD_SECONDS)
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if method == "tools/call":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            ask = {
                "jsonrpc": "2.0",
                "id": "q1",
                "method": "elicitation/create",
                "params": {
                    "message": "your name?",
                    "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
                },
            }
            self.chunk(b"event: message\ndata: " + json.dumps(ask).encode() + b"\n\n")
            time.sleep(HOLD_SECONDS)
            return
        self.json_reply({"jsonrpc": "2.0", "id": msg.get("id"), "result": {"tools": []}})

    def do_DELETE(self):
        time.sleep(HOLD_SECONDS)

    def do_GET(self):
        self.send_response(405)
        self.send_header("Content-Length", "0")
        self.end_headers()


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    host, port = server.server_address
    print(f"listening on http://{host}:{port}/mcp", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        time.sleep(HOLD_SECONDS * 10)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
