"""The client side of tests/cluster/instances.sh: one legacy upstream, several instances.

Raw HTTP (stdlib; the request and answer helpers are rr_client.py's) against two
gateway replicas whose one route has `urls = [instance 1, instance 2]`. Legacy
(2025-11-25) sessions are driven by hand, so that every request goes to the replica
chosen here and every answer's status and JSON-RPC error can be checked exactly.

    python instances_client.py sessions --replicas A,B --path /mcp --count 20
        # session i: initialize (+ notifications/initialized) on replica i % 2, then
        # tools/list and tools/call echo on the other one; all must complete
    python instances_client.py park --replicas A,B --path /mcp --tool elicit_name --args '{}' \
        --flows 10 --sessions 10 --save FILE
        # round 1 of FLOWS calls (input_required, parked) and SESSIONS initialized legacy
        # sessions, alternating over the replicas; saved to FILE
    python instances_client.py settle --replicas A,B --load FILE --answer '{"user_name": "Ada"}' --expect 'hello, Ada'
        # after an instance was killed: each flow retried and each session used on the
        # other replica; each must complete, or end with the clear error (a flow: 400
        # -32602 flow_lost|instance_unreachable; a session: 404 -32001), at least one
        # of each of each kind, no other answer, no hang
    python instances_client.py snapshot --replicas A,B --save FILE
        # sessionless_upstream_requests_total by replica, instance and status
    python instances_client.py spread --replicas A,B --instances URL1,URL2 --since FILE
        # since the snapshot, every replica sent requests to every instance, and each
        # instance took at least --min-share of them all
    python instances_client.py moved --replicas A,B --instances DEAD,LIVE --since FILE
        # since the snapshot, DEAD answered nothing (counted for failed attempts at most)
        # and LIVE took work; sessionless_upstream_instance_up is 0 for DEAD and 1 for LIVE on every replica
    python instances_client.py up --replicas A,B --instances URL1,URL2 --wait 10
        # sessionless_upstream_instance_up is 1 for every instance on every replica

Prints `PASS <label>: ...` or `FAIL <label>: <reason>` (one line) and exits 0 or 1.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import time
from collections import Counter
from typing import Any

import rr_client as rr
from rr_client import Answer, Fail

LEGACY_VERSION = "2025-11-25"
# A request that has not answered in this long counts as hung.
rr.TIMEOUT = 15.0
# The clear errors for work held by an instance that is gone (see the module doc).
FLOW_LOST = {"flow_lost", "instance_unreachable"}
SESSION_NOT_FOUND = -32001

REQUESTS = "sessionless_upstream_requests_total"
INSTANCE_UP = "sessionless_upstream_instance_up"
# A request the instance answered is counted under its status class (2xx, 4xx...);
# a dead instance may be counted only for attempts that found it gone (connect_error).
ANSWERED = re.compile(r"^\dxx$")


# ---------------------------------------------------------------- legacy sessions


class Ended(Exception):
    """The clear error for held work whose instance is gone: a legacy session not
    found (the client must initialize again), or an MRTR flow lost (call again)."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.short())
        self.answer = answer


def legacy(replica: str, path: str, method: str, params: dict[str, Any] | None, session: str | None,
           notification: bool = False) -> Answer:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if not notification:
        body["id"] = next(rr._ids)
    if params is not None:
        body["params"] = params
    headers = {} if session is None else {"mcp-session-id": session, "mcp-protocol-version": LEGACY_VERSION}
    return rr.send(replica, path, body, headers)


def open_session(replica: str, path: str, what: str) -> str:
    """initialize and notifications/initialized on `replica`; the gateway's session id."""
    init = legacy(replica, path, "initialize", {
        "protocolVersion": LEGACY_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "sessionless-instances-test", "version": "1"},
    }, None)
    result = init.result()
    if result.get("protocolVersion") != LEGACY_VERSION:
        raise Fail(f"{what}: initialize negotiated {result.get('protocolVersion')!r}: {init.short()}")
    session = init.headers.get("mcp-session-id")
    if not session:
        raise Fail(f"{what}: initialize issued no Mcp-Session-Id: {init.short()}")
    note = legacy(replica, path, "notifications/initialized", None, session, notification=True)
    if note.status not in (200, 202, 204):
        raise Fail(f"{what}: notifications/initialized answered {note.short()}")
    return session


def gone(answer: Answer) -> bool:
    """Whether `answer` is the clear "session not found": 404, -32001, the request's id."""
    status, code, _ = answer.error()
    return status == 404 and code == SESSION_NOT_FOUND and (answer.body or {}).get("id") == answer.request_id


def use_session(replica: str, path: str, session: str, n: int, what: str) -> None:
    """tools/list, then tools/call echo, on `replica`. Ended if the first says so."""
    listed = legacy(replica, path, "tools/list", {}, session)
    if gone(listed):
        raise Ended(listed)
    names = {t.get("name") for t in listed.result().get("tools", [])}
    if "echo" not in names:
        raise Fail(f"{what}: tools/list without echo: {listed.short()}")
    message = f"session {n}"
    called = legacy(replica, path, "tools/call", {"name": "echo", "arguments": {"message": message}}, session)
    result = called.result()
    if result.get("isError") or rr.text_of(result) != f"echo: {message}":
        raise Fail(f"{what}: tools/call echo answered {called.short()}")


def other(replicas: list[str], replica: str) -> str:
    return replicas[(replicas.index(replica) + 1) % len(replicas)]


# ---------------------------------------------------------------- commands


def cmd_sessions(a: argparse.Namespace) -> str:
    replicas = a.replicas.split(",")
    for i in range(a.count):
        first = replicas[i % len(replicas)]
        what = f"session {i} (initialize on {first})"
        session = open_session(first, a.path, what)
        try:
            use_session(other(replicas, first), a.path, session, i, what)
        except Ended as e:
            raise Fail(f"{what}: refused on {other(replicas, first)}: {e}") from e
    return f"{a.count} legacy sessions, each initialized on one replica and used on the other"


def cmd_park(a: argparse.Namespace) -> str:
    replicas, args = a.replicas.split(","), json.loads(a.args)
    flows, sessions = [], []
    for i in range(a.flows):
        replica = replicas[i % len(replicas)]
        answer = rr.post(replica, a.path, "tools/call", rr.call_params(a.tool, args), a.tool)
        flow = rr.round_of(answer, f"flow {i} round 1 on {replica}")
        flow.update(tool=a.tool, args=args, path=a.path)
        flows.append(flow)
    for i in range(a.sessions):
        replica = replicas[i % len(replicas)]
        sessions.append({"id": open_session(replica, a.path, f"session {i}"), "owner": replica, "path": a.path})
    with open(a.save, "w") as f:
        json.dump({"flows": flows, "sessions": sessions}, f)
    return f"{len(flows)} flows parked and {len(sessions)} legacy sessions open over {len(replicas)} replicas"


def timed(fn, *args) -> tuple[str, float, str]:
    """Runs fn: (outcome, seconds, detail), the outcome "completed", "error" (the clear
    one) or the shape of anything else (`STATUS CODE REASON`); a hang fails at once."""
    started = time.monotonic()
    outcome, detail = "completed", ""
    try:
        fn(*args)
    except Ended as e:
        outcome, detail = "error", str(e)
    except (socket.timeout, TimeoutError) as e:
        raise Fail(f"no answer within {rr.TIMEOUT:.0f}s ({e})") from e
    except Fail as e:
        outcome, detail = (e.answer.shape() if e.answer else "unexpected answer"), str(e)
    except (OSError, ValueError) as e:
        outcome, detail = type(e).__name__, str(e)
    return outcome, time.monotonic() - started, detail


def cmd_settle(a: argparse.Namespace) -> str:
    replicas = a.replicas.split(",")
    with open(a.load) as f:
        held = json.load(f)
    content = json.loads(a.answer)
    problems: dict[str, list[str]] = {}
    tally: dict[str, Counter[str]] = {}
    slowest = 0.0

    def retry(i: int, flow: dict[str, Any]) -> None:
        replica = other(replicas, flow["owner"])
        answer = rr.post(replica, flow["path"], "tools/call", rr.retry_params(flow, content), flow["tool"])
        status, code, reason = answer.error()
        if (status, code) == (400, -32602) and reason in FLOW_LOST:
            raise Ended(answer)
        rr.check_complete(answer, a.expect, f"flow {i} (round 1 on {flow['owner']}, retry on {replica})")

    def resume(i: int, session: dict[str, Any]) -> None:
        use_session(other(replicas, session["owner"]), session["path"], session["id"], i,
                    f"session {i} (initialize on {session['owner']})")

    for kind, items, fn in (("flows", held["flows"], retry), ("sessions", held["sessions"], resume)):
        counts = tally.setdefault(kind, Counter(completed=0, error=0))
        for i, item in enumerate(items):
            try:
                outcome, took, detail = timed(fn, i, item)
            except Fail as e:
                raise Fail(f"{kind[:-1]} {i} hung: {e}") from e
            slowest = max(slowest, took)
            counts[outcome] += 1
            if outcome not in ("completed", "error"):
                problems.setdefault(kind, []).append(f"{kind[:-1]} {i}: {detail}")
    figures = "; ".join(
        f"{kind}: {c['completed']} completed, {c['error']} clear errors"
        + "".join(f", {n} answered {shape}" for shape, n in c.items() if shape not in ("completed", "error"))
        for kind, c in tally.items()
    )
    if problems:
        raise Fail(f"not settled cleanly ({figures}; slowest answer {slowest:.2f}s), e.g. "
                   + "; ".join(p[0] for p in problems.values()))
    for kind, counts in tally.items():
        if counts["completed"] == 0 or counts["error"] == 0:
            raise Fail(f"{kind} were not spread over the instances: {figures} (need at least one of each)")
    return f"{figures}; slowest answer {slowest:.2f}s"


# ---------------------------------------------------------------- metrics

_SERIES = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(replica: str, name: str) -> list[tuple[dict[str, str], float]]:
    status, text = rr.get(replica, "/metrics")
    if status != 200:
        raise Fail(f"/metrics on {replica} answered {status}")
    series = []
    for line in text.splitlines():
        m = _SERIES.match(line)
        if m and m.group(1) == name:
            series.append((dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return series


def instance_of(labels: dict[str, str], instances: list[str]) -> str | None:
    """Which of `instances` (URLs) a series' `instance` label names."""
    value = labels.get("instance")
    for url in instances:
        if value is not None and value.rstrip("/") == url.rstrip("/"):
            return url
    return None


def requests(replicas: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """replica -> instance label -> status -> requests (every series of the family)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for replica in replicas:
        per = out.setdefault(replica, {})
        for labels, value in scrape(replica, REQUESTS):
            if "instance" not in labels:
                raise Fail(f"{REQUESTS} on {replica} has no instance label: {labels}")
            status = per.setdefault(labels["instance"], {})
            status[labels.get("status", "")] = status.get(labels.get("status", ""), 0) + value
    return out


def since(a: argparse.Namespace) -> tuple[list[str], list[str], dict[str, dict[str, dict[str, float]]]]:
    """The replicas, the instances, and the requests counted since the snapshot --since,
    keyed by instance URL (a label naming no instance given fails)."""
    replicas, instances = a.replicas.split(","), a.instances.split(",")
    with open(a.since) as f:
        before = json.load(f)
    now = requests(replicas)
    delta: dict[str, dict[str, dict[str, float]]] = {}
    for replica in replicas:
        for label, statuses in now[replica].items():
            url = instance_of({"instance": label}, instances)
            if url is None:
                raise Fail(f"{REQUESTS} on {replica} names instance {label!r}, none of {instances}")
            for status, value in statuses.items():
                was = before.get(replica, {}).get(label, {}).get(status, 0)
                per = delta.setdefault(replica, {}).setdefault(url, {})
                per[status] = per.get(status, 0) + value - was
    return replicas, instances, delta


def total(delta: dict[str, dict[str, dict[str, float]]], replica: str | None, url: str,
          skip: frozenset[str] = frozenset()) -> int:
    replicas = [replica] if replica else list(delta)
    return int(sum(v for r in replicas for s, v in delta.get(r, {}).get(url, {}).items() if s not in skip))


def cmd_snapshot(a: argparse.Namespace) -> str:
    counts = requests(a.replicas.split(","))
    with open(a.save, "w") as f:
        json.dump(counts, f)
    return f"{REQUESTS} saved: {json.dumps(counts)}"


def cmd_spread(a: argparse.Namespace) -> str:
    replicas, instances, delta = since(a)
    per = {url: total(delta, None, url) for url in instances}
    figures = ", ".join(f"{url} {n}" for url, n in per.items())
    by_replica = "; ".join(
        f"{r}: " + ", ".join(f"{url} {total(delta, r, url)}" for url in instances) for r in replicas
    )
    for r in replicas:
        idle = [url for url in instances if total(delta, r, url) == 0]
        if idle:
            raise Fail(f"replica {r} sent no request to {idle} ({by_replica})")
    all_requests = sum(per.values())
    for url, n in per.items():
        if n < a.min_share * all_requests:
            raise Fail(f"{url} took {n} of {all_requests} upstream requests, under {a.min_share:.0%} ({by_replica})")
    return f"upstream requests by instance: {figures} ({by_replica})"


def instance_up(replicas: list[str], instances: list[str]) -> dict[str, dict[str, float | None]]:
    """replica -> instance URL -> sessionless_upstream_instance_up (None when not reported)."""
    out: dict[str, dict[str, float | None]] = {}
    for replica in replicas:
        seen: dict[str, float | None] = {url: None for url in instances}
        for labels, value in scrape(replica, INSTANCE_UP):
            url = instance_of(labels, instances)
            if url is not None:
                seen[url] = value
        out[replica] = seen
    return out


def wait_up(replicas: list[str], want: dict[str, float], secs: float) -> tuple[float, dict[str, Any]]:
    """Polls instance_up until every replica reports `want` (URL -> value) or `secs` pass."""
    started = time.monotonic()
    while True:
        now = instance_up(replicas, list(want))
        if all(now[r][url] == v for r in replicas for url, v in want.items()):
            return time.monotonic() - started, now
        if time.monotonic() - started > secs:
            raise Fail(f"{INSTANCE_UP} after {secs:.0f}s: {now}, expected {want} on every replica")
        time.sleep(0.2)


def cmd_moved(a: argparse.Namespace) -> str:
    replicas, (dead, live), delta = since(a)
    stray = {r: delta.get(r, {}).get(dead, {}) for r in replicas}
    answered = {r: {s: int(v) for s, v in st.items() if v and ANSWERED.match(s)} for r, st in stray.items()}
    if any(answered.values()):
        raise Fail(f"the dead instance {dead} was counted for answered requests: {answered}")
    took = total(delta, None, live)
    if took < a.min_live:
        raise Fail(f"the live instance {live} took {took} upstream requests, expected at least {a.min_live}")
    failed = {r: {s: int(v) for s, v in st.items() if v} for r, st in stray.items()}
    waited, now = wait_up(replicas, {dead: 0, live: 1}, a.wait)
    return (f"{live} took {took} upstream requests; {dead} none answered, failed attempts {failed}; "
            f"{INSTANCE_UP} {now} (after {waited:.1f}s)")


def cmd_up(a: argparse.Namespace) -> str:
    replicas, instances = a.replicas.split(","), a.instances.split(",")
    waited, now = wait_up(replicas, {url: 1 for url in instances}, a.wait)
    return f"{INSTANCE_UP} 1 for every instance on every replica after {waited:.1f}s: {now}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def command(name: str, *required: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name)
        p.add_argument("--replicas", required=True, help="host:port,host:port")
        p.add_argument("--label", default=None)
        for opt in required:
            p.add_argument(opt, required=True)
        return p

    command("sessions", "--path").add_argument("--count", type=int, default=20)
    p = command("park", "--path", "--tool", "--args", "--save")
    p.add_argument("--flows", type=int, default=10)
    p.add_argument("--sessions", type=int, default=10)
    command("settle", "--load", "--answer", "--expect")
    command("snapshot", "--save")
    command("spread", "--instances", "--since").add_argument("--min-share", type=float, default=0.2)
    p = command("moved", "--instances", "--since")
    p.add_argument("--min-live", type=int, default=1)
    p.add_argument("--wait", type=float, default=5)
    command("up", "--instances").add_argument("--wait", type=float, default=10)
    a = ap.parse_args()
    handler = {
        "sessions": cmd_sessions,
        "park": cmd_park,
        "settle": cmd_settle,
        "snapshot": cmd_snapshot,
        "spread": cmd_spread,
        "moved": cmd_moved,
        "up": cmd_up,
    }
    return rr.run(handler[a.cmd], a)


if __name__ == "__main__":
    sys.exit(main())
