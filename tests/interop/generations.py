#!/usr/bin/env python3
"""Checks for tests/interop/generations.sh (Python stdlib only, plain HTTP on loopback).

    generations.py found  --gateway http://127.0.0.1:Q --expect legacy|modern --label NAME
    generations.py probe  --log PROXY_LOG --expect legacy|modern --label NAME
    generations.py replay --gateway http://127.0.0.1:Q --log PROXY_LOG --label NAME

found   one 2026-07-28 tools/list through the gateway (which makes it probe the upstream
        on first need), then its /metrics: sessionless_upstream_generation{generation=EXPECT}
        is 1 and the request was counted with generation="modern", upstream=EXPECT.
probe   from the log of tests/interop/rr_proxy.py (one backend) between the gateway and
        the upstream: the gateway's server/discover probe was sent, and every session its
        answer minted (Mcp-Session-Id) was ended by a DELETE (answered 2xx, or 404 when the
        upstream had already dropped it). A legacy probe that minted nothing fails: the
        check would prove nothing (mcp==1.30.0 mints one on its 400).
replay  against a modern upstream (the mcp==2.3.0 everything-server): principal A
        (Bearer a) calls test_input_required_result_request_state and gets input_required
        with a requestState; principal B (Bearer b) retries with it and A's inputResponses:
        HTTP 400, JSON-RPC -32602, data.reason "wrong_principal", and nothing reached the
        upstream (sessionless_upstream_requests_total and the proxy's log unchanged); A's
        state sent with another tool name is refused the same way ("wrong_request"); then
        A's own retry completes ("state-ok: ...", the upstream got its state back).

Prints one line per check: PASS|FAIL generations:<label>/<check>[: detail]. Exit 1 on any FAIL.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.request

from rr_proxy import parse_log  # the proxy's log lines (same directory)

VERSION = "2026-07-28"
RESULTS: list[str] = []


def report(ok: bool, label: str, check: str, detail: str) -> bool:
    line = f"{'PASS' if ok else 'FAIL'} generations:{label}/{check}: {detail}"
    RESULTS.append(line)
    print(line, flush=True)
    return ok


def meta(capabilities: dict | None = None) -> dict:
    return {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": capabilities or {},
        "io.modelcontextprotocol/clientInfo": {"name": "generations-check", "version": "0"},
    }


def post(gateway: str, method: str, params: dict, rid, name: str | None = None, bearer: str | None = None):
    """One 2026-07-28 request; (HTTP status, the JSON-RPC answer or None, raw body text)."""
    body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": method,
    }
    if name is not None:
        headers["Mcp-Name"] = name
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    req = urllib.request.Request(f"{gateway}/mcp", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, ctype, text = r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        status, ctype, text = e.code, e.headers.get("Content-Type", ""), e.read().decode()
    return status, answer(text, ctype, rid), text


def answer(text: str, ctype: str, rid):
    """The JSON-RPC response with id `rid` in a JSON or SSE body, or None."""
    if ctype.startswith("text/event-stream"):
        for event in text.replace("\r\n", "\n").split("\n\n"):
            data = "\n".join(
                line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:")
            )
            try:
                msg = json.loads(data)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("id") == rid and ("result" in msg or "error" in msg):
                return msg
        return None
    try:
        msg = json.loads(text)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


def metrics(gateway: str) -> list[tuple[str, dict, float]]:
    with urllib.request.urlopen(f"{gateway}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = []
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line)
        if m:
            out.append((m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))), float(m.group(3))))
    return out


def total(samples, name: str, **labels) -> float:
    return sum(v for n, lab, v in samples if n == name and all(lab.get(k) == w for k, w in labels.items()))


def short(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "…"


# ------------------------------------------------------------------ found


def found(args) -> None:
    gw, label, expect = args.gateway, args.label, args.expect
    status, msg, text = post(gw, "tools/list", {"_meta": meta()}, 1)
    tools = (msg or {}).get("result", {}).get("tools")
    report(
        status == 200 and isinstance(tools, list) and len(tools) > 0,
        label,
        "tools-list",
        f"HTTP {status}, {len(tools)} tools" if isinstance(tools, list) else f"HTTP {status}: {short(text)}",
    )
    samples = metrics(gw)
    gens = sorted(lab.get("generation", "?") for n, lab, v in samples if n == "sessionless_upstream_generation" and v == 1)
    report(
        gens == [expect],
        label,
        f"found-{expect}",
        f"sessionless_upstream_generation is 1 for {gens or 'nothing'} (want [{expect!r}])",
    )
    counted = total(samples, "sessionless_requests_total", method="tools/list", generation="modern", upstream=expect)
    others = total(samples, "sessionless_requests_total", generation="modern") - counted
    report(
        counted >= 1 and others == 0,
        label,
        f"counted-modern-{expect}",
        f'{int(counted)} tools/list counted generation="modern",upstream="{expect}", {int(others)} modern requests otherwise',
    )


# ------------------------------------------------------------------ probe


def probe(args) -> None:
    label, expect = args.label, args.expect
    rows = parse_log(args.log)
    probes = [r for r in rows if r.get("rpc") == "server/discover" and r["session"] == "-" and r["verb"] == "POST"]
    if not report(bool(probes), label, "probe-sent",
                  f"{len(probes)} server/discover probe(s) without a session, answered {[p['status'] for p in probes]}"):
        return
    if expect == "modern":
        bad = [p for p in probes if not p["status"].startswith("2")]
        report(not bad, label, "probe-answered", "the probe got 2xx" if not bad else f"probe answered {bad[0]['line']}")
    minted = [p for p in probes if "minted" in p]
    if expect == "legacy" and not minted:
        report(False, label, "probe-minted",
               "the probe's answer minted no session, so this check shows nothing (mcp==1.30.0 mints one on its 400)")
        return
    if not minted:
        report(True, label, "probe-no-session", "the probe's answer minted no session: nothing to end")
        return
    for p in minted:
        sid = p["minted"]
        deletes = [r for r in rows if r["verb"] == "DELETE" and r["session"] == sid and r["seq"] > p["seq"]]
        reused = [r for r in rows if r["verb"] != "DELETE" and r["session"] == sid]
        ended = [d for d in deletes if d["status"].startswith("2") or d["status"] == "404"]
        report(
            bool(ended) and not reused,
            label,
            "probe-session-deleted",
            f"probe #{p['seq']} answered {p['status']} with a fresh session {sid}; "
            + (f"DELETE #{ended[0]['seq']} for it answered {ended[0]['status']}" if ended
               else f"no DELETE ended it (DELETEs: {[d['status'] for d in deletes]})")
            + (f"; but {len(reused)} other requests used it" if reused else "; no other request used it"),
        )


# ------------------------------------------------------------------ replay

TOOL = "test_input_required_result_request_state"
# Answers "state-ok: <the requestState it got>" to any call that carries one.
OTHER = "test_input_required_result_tampered_state"


def log_lines(path: str) -> int:
    return sum(1 for _ in open(path))


def refused(args, label: str, who: str, params: dict, rid, name: str, bearer: str, reason: str) -> None:
    """A retry the gateway must refuse (400, -32602, data.reason) with nothing sent upstream."""
    gw = args.gateway
    before, lines_before = metrics(gw), log_lines(args.log)
    status, msg, text = post(gw, "tools/call", params, rid, name=name, bearer=bearer)
    time.sleep(0.5)  # anything the gateway sent upstream for it has reached the proxy's log by now
    after, lines_after = metrics(gw), log_lines(args.log)
    err = (msg or {}).get("error") or {}
    got = (err.get("data") or {}).get("reason")
    report(
        status == 400 and err.get("code") == -32602 and got == reason and (msg or {}).get("id") == rid,
        label,
        f"{who}-refused",
        f"HTTP {status}, {short(text)}",
    )
    sent = total(after, "sessionless_upstream_requests_total") - total(before, "sessionless_upstream_requests_total")
    rejected = total(after, "sessionless_request_state_rejected_total", reason=reason) - total(
        before, "sessionless_request_state_rejected_total", reason=reason)
    report(
        sent == 0 and lines_after == lines_before and rejected == 1,
        label,
        f"{who}-nothing-upstream",
        f"sessionless_upstream_requests_total +{int(sent)}, requests seen by the proxy in front of the upstream "
        f"+{lines_after - lines_before}, sessionless_request_state_rejected_total{{reason=\"{reason}\"}} +{int(rejected)}",
    )


def replay(args) -> None:
    gw, label = args.gateway, args.label
    caps = {"elicitation": {}}
    status, msg, text = post(gw, "tools/call", {"name": TOOL, "arguments": {}, "_meta": meta(caps)}, 1,
                             name=TOOL, bearer="a")
    result = (msg or {}).get("result") or {}
    state = result.get("requestState")
    asked = status == 200 and result.get("resultType") == "input_required" and "confirm" in (result.get("inputRequests") or {})
    if not report(asked and isinstance(state, str) and state != "", label, "a-input-required",
                  f"HTTP {status}, resultType {result.get('resultType')!r}, inputRequests "
                  f"{sorted(result.get('inputRequests') or {})}, requestState of {len(state or '')} chars"
                  if msg else f"HTTP {status}: {short(text)}"):
        return
    retry = {
        "name": TOOL,
        "arguments": {},
        "inputResponses": {"confirm": {"action": "accept", "content": {"ok": True}}},
        "requestState": state,
        "_meta": meta(caps),
    }

    # B replays A's state: refused before anything goes upstream.
    refused(args, label, "b", retry, 2, TOOL, "b", "wrong_principal")
    # A sends its state with another tool (one that echoes any state it is given): refused too.
    other = dict(retry, name=OTHER)
    refused(args, label, "a-other-tool", other, 4, OTHER, "a", "wrong_request")

    before, lines_before = metrics(gw), log_lines(args.log)
    status, msg, text = post(gw, "tools/call", retry, 3, name=TOOL, bearer="a")
    result = (msg or {}).get("result") or {}
    texts = [c.get("text") for c in result.get("content") or [] if isinstance(c, dict)]
    report(
        status == 200 and result.get("resultType", "complete") == "complete"
        and "state-ok: confirmation received" in texts,
        label,
        "a-retry-completes",
        f"HTTP {status}, content {texts}" if msg else f"HTTP {status}: {short(text)}",
    )
    final = metrics(gw)
    report(
        total(final, "sessionless_upstream_requests_total") - total(before, "sessionless_upstream_requests_total") >= 1
        and log_lines(args.log) > lines_before,
        label,
        "a-retry-upstream",
        "A's retry reached the upstream (its requestState handed back: the upstream accepted it)",
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("found")
    f.add_argument("--gateway", required=True)
    f.add_argument("--expect", choices=["legacy", "modern"], required=True)
    f.add_argument("--label", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--log", required=True)
    p.add_argument("--expect", choices=["legacy", "modern"], required=True)
    p.add_argument("--label", required=True)
    r = sub.add_parser("replay")
    r.add_argument("--gateway", required=True)
    r.add_argument("--log", required=True)
    r.add_argument("--label", required=True)
    args = ap.parse_args()
    try:
        {"found": found, "probe": probe, "replay": replay}[args.cmd](args)
    except Exception as e:  # an unexpected answer or an unreachable gateway is a failure, said so
        report(False, args.label, args.cmd, f"{type(e).__name__}: {e}")
    sys.exit(1 if any(line.startswith("FAIL") for line in RESULTS) else 0)


if __name__ == "__main__":
    main()
