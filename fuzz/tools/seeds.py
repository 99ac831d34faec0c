"""Seeds for the targets that read client requests, from what real clients sent.

    python3 fuzz/tools/seeds.py TRACE_DIR...

TRACE_DIR holds `strace -ff -xx` logs of a gateway's reads (scripts/capture-seeds
makes them while the interop and conformance tests run). Every POST a client sent
is taken, with the hostile bodies of tests/hostile_bodies.rs, and written, deduped,
to fuzz/seeds/strict_body/ (the body) and fuzz/seeds/front_request/ (a flags byte
from its headers, then the body; see fuzz_targets/front_request.rs). Bodies that
differ only in their digits (ids, counters) count once. With --hostile, only the
hostile bodies are written (scripts/capture-seeds adds them back after minimising).
"""
import hashlib
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEEDS = os.path.join(ROOT, "fuzz", "seeds")
LINE = re.compile(r'^(?:read|recvfrom)\((\d+), "((?:\\x[0-9a-f]{2})*)"')
LEGACY = ("2025-11-25", "2025-06-18")


def reads(path):
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m and m.group(2):
                yield int(m.group(1)), bytes.fromhex(m.group(2).replace("\\x", ""))


def posts(path):
    """(headers, body) of each POST read whole on one thread of the trace."""
    pending = {}
    for fd, data in reads(path):
        starts = re.match(rb"^(POST|GET|DELETE|PUT|PATCH|OPTIONS|HTTP/1\.[01]) ", data)
        buf = data if starts else pending.get(fd, b"") + data
        while buf.startswith(b"POST "):
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            headers = {}
            for line in buf[:end].decode("latin-1").split("\r\n")[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            n = headers.get("content-length")
            if n is None or len(buf) < end + 4 + int(n):
                break
            yield headers, buf[end + 4:end + 4 + int(n)]
            buf = buf[end + 4 + int(n):]
        pending[fd] = buf if buf.startswith(b"POST ") else b""


def flags(headers, body):
    """front_request's flags byte for a POST with these headers."""
    f = 0
    if "mcp-session-id" in headers:
        f |= 0x08
    v = headers.get("mcp-protocol-version")
    if v in LEGACY:
        f |= 0x10
    elif v == "2025-03-26":
        f |= 0x30
    elif v is not None:
        f |= 0x20
    if "mcp-method" in headers:
        f |= 0x40
    # Half the legacy requests go to a route that translates legacy clients.
    if f & 0x10 and hashlib.sha1(body).digest()[0] & 1:
        f |= 0x04
    return f


def hostile():
    """The bodies of tests/hostile_bodies.rs, built as `cases` and the batch test build them."""
    slot = '"slot":0'
    table = [
        '"pad":1e400', '"pad":1' + "0" * 400, '"note":"\\ud800"', '"\\ud800":1', "DEEP", "REPEAT", "REPEAT_CASE",
    ]
    calls = [("tools/call", "delete_user", "echo"), ("prompts/get", "secret_plan", "greeting"),
             ("resources/read", "file:///secret/keys", "file:///public/readme")]

    def call(i, method, target, place, meta):
        key = "uri" if method == "resources/read" else "name"
        params = {key: target, "arguments": {"x": 1}}
        if meta:
            params["_meta"] = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                               "io.modelcontextprotocol/clientCapabilities": {}}
        body = json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params},
                          sort_keys=True, separators=(",", ":"))
        if place == "arguments":
            return body.replace('"x":1', '"x":1,' + slot, 1)
        if place == "params":
            return body.replace('"arguments"', slot + ',"arguments"', 1)
        return body.replace('"jsonrpc"', slot + ',"jsonrpc"', 1)

    def fill(body, h, allowed):
        uri = '"uri"' in body
        member = {"DEEP": '"deep":' + "[" * 200 + "]" * 200,
                  "REPEAT": ('"uri":"%s"' if uri else '"name":"%s"') % allowed,
                  "REPEAT_CASE": ('"URI":"%s"' if uri else '"Name":"%s"') % allowed}.get(h, h)
        return body.replace(slot, member, 1)

    out = []
    for meta in (False, True):
        for h in table:
            for method, denied, allowed in calls:
                for place in (["params"] if h.startswith("REPEAT") else ["arguments", "params", "top"]):
                    out.append((meta, fill(call(10, method, denied, place, meta), h, allowed)))
    for h in table:
        place = "params" if h.startswith("REPEAT") else "arguments"
        item = fill(call(90, "tools/call", "delete_user", place, False), h, "echo")
        out.append((False, '[{"id":91,"jsonrpc":"2.0","method":"ping"},%s]' % item))
    return [(m, b.encode()) for m, b in out]


def hostile_flags(meta, body):
    """A 2026 client's headers (mirrored), or a legacy client's in a session, relayed or translated."""
    return 0x60 if meta else 0x18 | (hashlib.sha1(body).digest()[0] & 1) * 0x04


def write(target, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main(dirs):
    seen = set()
    taken = []
    for d in dirs:
        for name in sorted(os.listdir(d)):
            for headers, body in posts(os.path.join(d, name)):
                key = (re.sub(rb"[0-9]+", b"0", body), flags(headers, body) & ~0x04)
                if key not in seen:
                    seen.add(key)
                    taken.append((flags(headers, body), body))
    captured = len(taken)
    for meta, body in hostile():
        taken.append((hostile_flags(meta, body), body))
    bodies = set()
    for f, body in taken:
        if body not in bodies:
            bodies.add(body)
            write("strict_body", body)
        write("front_request", bytes([f]) + body)
    print(f"{captured} captured requests, {len(taken) - captured} hostile bodies, {len(bodies)} distinct bodies")


if __name__ == "__main__":
    if sys.argv[1:] == ["--hostile"]:
        # After a minimisation by coverage: every hostile body stays a seed.
        for meta, body in hostile():
            write("strict_body", body)
            write("front_request", bytes([hostile_flags(meta, body)]) + body)
    else:
        main(sys.argv[1:])
