#!/usr/bin/env python3
"""Checks for tests/interop/legacy_modern.sh (Python stdlib only, plain HTTP on loopback).

    legacy_modern.py filter --url http://127.0.0.1:F/mcp
    legacy_modern.py wire --log WIRE_LOG [--log WIRE_LOG ...] [--expect-retries]
    legacy_modern.py rr --log RR_LOG --replica 127.0.0.1:A --replica 127.0.0.1:B

filter  the 2026-only filter (tests/interop/rr_proxy.py --modern-only in front of the SDK v2
        everything-server) is what the test needs, straight, without the gateway: a legacy
        `initialize` gets 400 -32022 with data.supported ["2026-07-28"]; a request with a
        2025-11-25 MCP-Protocol-Version and a session id gets 400 -32022 too; GET and DELETE
        405; server/discover (2026-07-28) lists only 2026-07-28 in supportedVersions; a
        2026-07-28 tools/call of test_input_required_result_elicitation answers input_required.
wire    from the filters' wire logs (one per upstream instance; what the gateway sent
        upstream): no `initialize`, no Mcp-Session-Id, no session minted, nothing refused
        (every request a 2026-07-28 POST), every instance got tools/call, every retry whose
        requestState an instance handed out went back to that instance, and (with
        --expect-retries) some tools/call were retries carrying inputResponses/requestState
        (the questions went round).
rr      from the round-robin forwarder's log in front of the two replicas: every legacy
        session with 4+ requests was served by both replicas, and at least one of the
        client's answers to a server request (a JSON-RPC response POST, 202) landed on the
        replica that was not streaming the call it answers (so it was forwarded).

Prints one line per check: PASS|FAIL legacy-modern:<check>: detail. Exit 1 on any FAIL.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import urllib.error
import urllib.request

from rr_proxy import parse_log  # the forwarder's and the filters' log lines (same directory)

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
FAILED = False


def report(ok: bool, check: str, detail: str) -> bool:
    global FAILED
    print(f"{'PASS' if ok else 'FAIL'} legacy-modern:{check}: {detail}", flush=True)
    FAILED |= not ok
    return ok


def http(url: str, verb: str, body: dict | None = None, headers: dict | None = None):
    """(status, JSON-RPC message from a JSON or SSE body or None, raw text)."""
    data = json.dumps(body).encode() if body is not None else None
    h = {"Accept": "application/json, text/event-stream", **(headers or {})}
    if data is not None:
        h["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=h, method=verb)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, ctype, text = r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        status, ctype, text = e.code, e.headers.get("Content-Type", ""), e.read().decode()
    msg = None
    if ctype.startswith("text/event-stream"):
        for line in text.splitlines():
            if line.startswith("data:"):
                try:
                    m = json.loads(line[5:])
                except ValueError:
                    continue
                if "result" in m or "error" in m:
                    msg = m
    elif text:
        try:
            msg = json.loads(text)
        except ValueError:
            pass
    return status, msg, text


def modern_headers(method: str, name: str | None = None) -> dict:
    h = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    if name:
        h["Mcp-Name"] = name
    return h


def meta() -> dict:
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
        "io.modelcontextprotocol/clientInfo": {"name": "legacy-modern-check", "version": "0"},
    }


def check_filter(args) -> None:
    url = args.url
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "legacy", "version": "0"}}}
    status, msg, text = http(url, "POST", init)
    err = (msg or {}).get("error") or {}
    report(status == 400 and err.get("code") == -32022 and (err.get("data") or {}).get("supported") == [MODERN]
           and msg.get("id") == 1,
           "initialize-refused", f"initialize -> {status} {text[:200]}")
    status, msg, text = http(url, "POST", {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                             {"MCP-Protocol-Version": LEGACY, "Mcp-Session-Id": "legacy-session"})
    err = (msg or {}).get("error") or {}
    report(status == 400 and err.get("code") == -32022 and (err.get("data") or {}).get("supported") == [MODERN],
           "legacy-request-refused", f"tools/list with {LEGACY} and a session id -> {status} {text[:200]}")
    for verb in ("GET", "DELETE"):
        status, _, text = http(url, verb, None, {"Mcp-Session-Id": "legacy-session"})
        report(status == 405, f"{verb.lower()}-405", f"{verb} -> {status} {text[:100]}")
    disc = {"jsonrpc": "2.0", "id": 3, "method": "server/discover", "params": {"_meta": meta()}}
    status, msg, text = http(url, "POST", disc, modern_headers("server/discover"))
    versions = ((msg or {}).get("result") or {}).get("supportedVersions")
    report(status == 200 and versions == [MODERN], "discover-2026-only",
           f"server/discover -> {status}, supportedVersions {versions}")
    call = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
        "name": "test_input_required_result_elicitation", "arguments": {}, "_meta": meta()}}
    status, msg, text = http(url, "POST", call, modern_headers("tools/call", "test_input_required_result_elicitation"))
    result = (msg or {}).get("result") or {}
    report(status == 200 and result.get("resultType") == "input_required" and "user_name" in (result.get("inputRequests") or {}),
           "modern-call-forwarded", f"2026-07-28 tools/call -> {status} {text[:200]}")


def check_wire(args) -> None:
    per_log = {path: parse_log(path) for path in args.log}
    rows = [r for rs in per_log.values() for r in rs]
    counts = collections.Counter(r.get("rpc") or ("reply" if r.get("reply") else r["verb"]) for r in rows)
    print(f"INFO legacy-modern:requests: {len(rows)} requests upstream: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    if not report(bool(rows), "traffic", f"{len(rows)} requests reached the upstream instances"):
        return
    # The gateway's own probes (server/discover, and one 2025 initialize asking whether the
    # upstream serves the session era too) are not client traffic: counted, not failed.
    probes = [r for r in rows if r.get("probe")]
    print(f"INFO legacy-modern:wire:probes: {len(probes)} gateway probes "
          f"({', '.join(sorted({str(r.get('rpc')) for r in probes})) or 'none'})")
    rows = [r for r in rows if not r.get("probe")]
    init = [r for r in rows if r.get("rpc") in ("initialize", "notifications/initialized")]
    report(not init, "no-initialize",
           "no initialize upstream" if not init else f"{len(init)} initialize requests, e.g. {init[0]['line']}")
    sess = [r for r in rows if r["session"] != "-"]
    report(not sess, "no-session-id",
           "no request carried Mcp-Session-Id" if not sess else f"{len(sess)} with a session id, e.g. {sess[0]['line']}")
    minted = [r for r in rows if "minted" in r]
    report(not minted, "no-session-minted",
           "no answer minted a session" if not minted else f"e.g. {minted[0]['line']}")
    refused = [r for r in rows if r["backend"] == "filter" or r.get("proto") != MODERN or r["verb"] != "POST"]
    report(not refused, "all-2026",
           f"all {len(rows)} were 2026-07-28 POSTs" if not refused
           else f"{len(refused)} not (refused by the 2026-only filter), e.g. {refused[0]['line']}")
    idle = [p for p, rs in per_log.items() if not any(r.get("rpc") == "tools/call" for r in rs)]
    report(not idle, "both-instances",
           "every instance took tools/call: " + ", ".join(
               f"{sum(r.get('rpc') == 'tools/call' for r in rs)}" for rs in per_log.values())
           if not idle else f"no tools/call reached {idle}")
    asked_by = {r["asked"]: path for path, rs in per_log.items() for r in rs if "asked" in r}
    stated = [(path, r) for path, rs in per_log.items() for r in rs if "state" in r]
    known = [(path, r) for path, r in stated if r["state"] in asked_by]
    moved = [r for path, r in known if asked_by[r["state"]] != path]
    if stated:
        report(bool(known) and not moved, "retries-on-asking-instance",
               f"{len(known)} of {len(stated)} retries carried a requestState an instance handed out, "
               + (f"each back to that instance" if not moved else f"{len(moved)} to another one, e.g. {moved[0]['line']}"))
    retries = [r for r in rows if r.get("retry") and r.get("rpc") == "tools/call"]
    if not args.expect_retries:
        print(f"INFO legacy-modern:retries: {len(retries)} tools/call upstream carried inputResponses/requestState")
        return
    report(bool(retries), "retried-with-answers",
           f"{len(retries)} tools/call retries carried inputResponses/requestState"
           if retries else "no tools/call upstream carried inputResponses/requestState: no question went round")


def check_rr(args) -> None:
    rows = parse_log(args.log)
    a, b = args.replica
    per_backend = collections.Counter(r["backend"] for r in rows)
    per_session: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in rows:
        if r["session"] != "-":
            per_session[r["session"]][r["backend"]] += 1
    busy = {s: c for s, c in per_session.items() if sum(c.values()) >= 4}
    print(f"INFO legacy-modern:requests: {len(rows)} requests, {a} {per_backend[a]}, {b} {per_backend[b]}; "
          f"{len(per_session)} legacy sessions, {len(busy)} with 4+ requests", flush=True)
    errors = [r for r in rows if r["status"] == "error"]
    if errors:
        report(False, "forwarder", f"{len(errors)} requests did not reach a replica, e.g. {errors[0]['line']}")
    one_sided = [s for s, c in busy.items() if len(c) < 2]
    report(bool(busy) and not one_sided, "alternation",
           f"each of the {len(busy)} legacy sessions with 4+ requests was served by both replicas" if busy and not one_sided
           else ("no legacy session made 4 or more requests" if not busy
                 else f"{len(one_sided)} legacy sessions were served by one replica only"))
    # A reply answers the question pushed on the stream of the latest call (tools/call,
    # prompts/get, resources/read) of its session that was sent before it.
    calls: dict[str, dict] = {}
    cross = same = 0
    bad = []
    for r in sorted(rows, key=lambda r: r["seq"]):
        if r.get("rpc") in ("tools/call", "prompts/get", "resources/read"):
            calls[r["session"]] = r
        elif r.get("reply"):
            if r["status"] != "202":
                bad.append(r)
            call = calls.get(r["session"])
            if call is None:
                continue
            if call["backend"] != r["backend"]:
                cross += 1
            else:
                same += 1
    report(not bad and (cross + same) > 0, "answers-accepted",
           f"{cross + same} answers to server requests, all 202" if not bad
           else f"{len(bad)} answers not 202, e.g. {bad[0]['line']}")
    report(cross > 0, "answers-cross-replica",
           f"{cross} answers reached the replica not streaming their call (forwarded), {same} the one streaming it")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("filter")
    f.add_argument("--url", required=True)
    w = sub.add_parser("wire")
    w.add_argument("--log", action="append", required=True)
    w.add_argument("--expect-retries", action="store_true")
    r = sub.add_parser("rr")
    r.add_argument("--log", required=True)
    r.add_argument("--replica", action="append", required=True)
    args = ap.parse_args()
    {"filter": check_filter, "wire": check_wire, "rr": check_rr}[args.cmd](args)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
