"""A small round-robin client for the sessionless cluster tests (tests/cluster/run.sh).

Raw MCP 2026-07-28 HTTP requests (stdlib http.client; no SDK), sent to the gateway
replicas the way a round-robin load balancer would: each request to the next
replica in turn; a 503 with Retry-After (a draining replica) or a refused
connection (a replica gone) sends the same request to the next replica instead.

    python rr_client.py flows  --replicas 127.0.0.1:A,127.0.0.1:B --path /mcp --tool elicit_name \
        --args '{}' --answer '{"user_name": "Ada"}' --expect 'hello, Ada' --count 20 --label NAME
        # flow i: round 1 on replica i % 2, its retry on the other one; all must complete
    python rr_client.py round  --replica 127.0.0.1:A --path ... --tool ... --args ... --save FILE
        # round 1 of one call on one replica; its input_required round saved to FILE
    python rr_client.py retry  --replica 127.0.0.1:B --load FILE --answer ... (--expect TEXT | --expect-error 400:-32602:flow_lost)
    python rr_client.py begin  --replicas ... --path ... --tool ... --count 20 --save FILE
        # round 1 of COUNT calls through the balancer (spread over the replicas)
    python rr_client.py finish --replicas ... --load FILE --answer ... --expect ... --draining 127.0.0.1:A
        # checks the draining replica (readyz 503, new call 503 + Retry-After, which the
        # balancer sends elsewhere), then retries every saved call through the balancer

Prints `PASS <label>` or `FAIL <label>: <reason>` (one line) and exits 0 or 1.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import sys
import time
from typing import Any, Callable

VERSION = "2026-07-28"
TIMEOUT = 30.0
_ids = itertools.count(1)


class Fail(Exception):
    def __init__(self, message: str, answer: Answer | None = None) -> None:
        super().__init__(message)
        self.answer = answer  # the unexpected answer, when there is one


class Answer:
    def __init__(self, status: int, headers: dict[str, str], raw: str, replica: str, request_id: Any = None) -> None:
        self.status = status
        self.request_id = request_id
        self.headers = headers
        self.raw = raw
        self.replica = replica
        self.body: Any = None
        if headers.get("content-type", "").startswith("text/event-stream"):
            messages = []
            for event in raw.replace("\r\n", "\n").split("\n\n"):
                data = "\n".join(
                    line[5:].lstrip(" ") if line.startswith("data:") else ""
                    for line in event.split("\n")
                    if line.startswith("data:")
                )
                if data.strip():
                    messages.append(json.loads(data))
            self.body = messages[-1] if messages else None
        elif raw:
            try:
                self.body = json.loads(raw)
            except ValueError:
                self.body = None

    def short(self) -> str:
        return f"{self.status} from {self.replica}: {self.raw[:400]}"

    def result(self) -> dict[str, Any]:
        if self.status != 200 or not isinstance(self.body, dict) or "result" not in self.body:
            raise Fail(f"expected a result, got {self.short()}", self)
        return self.body["result"]

    def error(self) -> tuple[int, int | None, str | None]:
        err = (self.body or {}).get("error") or {}
        return self.status, err.get("code"), (err.get("data") or {}).get("reason")

    def shape(self) -> str:
        """`STATUS CODE REASON` of an error answer (`None` for what it lacks)."""
        return " ".join(str(part) for part in self.error())


class NotDelivered(Exception):
    """The connection broke while the request was being sent."""


def send(replica: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> Answer:
    """POSTs one JSON-RPC message (with `headers` beside the content type and accept)."""
    host, port = replica.rsplit(":", 1)
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream", **headers}
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    try:
        try:
            conn.request("POST", path, body=json.dumps(body), headers=headers)
        except (BrokenPipeError, ConnectionResetError) as e:
            # Reset while sending: a replica that stopped listening dropped the
            # connection from its accept queue; the request never arrived.
            raise NotDelivered(str(e)) from e
        resp = conn.getresponse()
        raw = resp.read().decode("utf-8", "replace")
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw, replica, body.get("id"))
    finally:
        conn.close()


def post(replica: str, path: str, method: str, params: dict[str, Any], name: str | None) -> Answer:
    """One 2026-07-28 request: `_meta` and the version, method (and name) headers."""
    body = {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": method,
        "params": {
            **params,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
            },
        },
    }
    headers = {"mcp-protocol-version": VERSION, "mcp-method": method}
    if name is not None:
        headers["mcp-name"] = name
    return send(replica, path, body, headers)


def get(replica: str, path: str) -> tuple[int, str]:
    host, port = replica.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def get_status(replica: str, path: str) -> int:
    return get(replica, path)[0]


class Balancer:
    """Round robin over the replicas, failing over like a load balancer."""

    def __init__(self, replicas: list[str], start: int = 0) -> None:
        self.replicas = replicas
        self.next = start
        self.failovers: list[str] = []

    def send(self, path: str, method: str, params: dict[str, Any], name: str | None) -> Answer:
        last = "no replica"
        for _ in range(len(self.replicas)):
            replica = self.replicas[self.next % len(self.replicas)]
            self.next += 1
            try:
                answer = post(replica, path, method, params, name)
            except ConnectionRefusedError:
                last = f"{replica} refused the connection"
                self.failovers.append(last)
                continue
            except NotDelivered as e:
                # What a load balancer retries elsewhere: the request was not sent.
                last = f"{replica} reset the connection before the request was sent ({e})"
                self.failovers.append(last)
                continue
            if answer.status == 503 and "retry-after" in answer.headers:
                last = f"{replica} answered 503 Retry-After: {answer.headers['retry-after']}"
                self.failovers.append(last)
                continue
            return answer
        raise Fail(f"every replica refused: {last}")


def call_params(tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": tool, "arguments": args}


def round_of(answer: Answer, what: str) -> dict[str, Any]:
    result = answer.result()
    if result.get("resultType") != "input_required":
        raise Fail(f"{what}: expected input_required, got {answer.short()}")
    requests = result.get("inputRequests") or {}
    if len(requests) != 1 or not isinstance(result.get("requestState"), str):
        raise Fail(f"{what}: expected one input request and a requestState, got {answer.short()}")
    return {"key": next(iter(requests)), "state": result["requestState"], "owner": answer.replica}


def retry_params(flow: dict[str, Any], answer_content: dict[str, Any]) -> dict[str, Any]:
    return {
        **call_params(flow["tool"], flow["args"]),
        "requestState": flow["state"],
        "inputResponses": {flow["key"]: {"action": "accept", "content": answer_content}},
    }


def text_of(result: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for c in result.get("content", []) if isinstance(c, dict))


def check_complete(answer: Answer, expect: str, what: str) -> None:
    result = answer.result()
    if result.get("resultType") != "complete":
        raise Fail(f"{what}: expected a complete result, got {answer.short()}")
    if expect not in text_of(result):
        raise Fail(f"{what}: expected text containing {expect!r}, got {answer.short()}")


# ---------------------------------------------------------------- commands


def cmd_flows(a: argparse.Namespace) -> str:
    replicas = a.replicas.split(",")
    args, content = json.loads(a.args), json.loads(a.answer)
    for i in range(a.count):
        first, other = replicas[i % 2], replicas[(i + 1) % 2]
        flow = round_of(post(first, a.path, "tools/call", call_params(a.tool, args), a.tool), f"flow {i} round 1 on {first}")
        flow.update(tool=a.tool, args=args)
        done = post(other, a.path, "tools/call", retry_params(flow, content), a.tool)
        check_complete(done, a.expect, f"flow {i} (round 1 on {first}, retry on {other})")
    return f"{a.count} flows, each retried on the other replica"


def cmd_round(a: argparse.Namespace) -> str:
    args = json.loads(a.args)
    flow = round_of(post(a.replica, a.path, "tools/call", call_params(a.tool, args), a.tool), f"round 1 on {a.replica}")
    flow.update(tool=a.tool, args=args, path=a.path)
    with open(a.save, "w") as f:
        json.dump(flow, f)
    return f"parked on {a.replica}"


def cmd_retry(a: argparse.Namespace) -> str:
    with open(a.load) as f:
        flow = json.load(f)
    started = time.monotonic()
    answer = post(a.replica, flow["path"], "tools/call", retry_params(flow, json.loads(a.answer)), flow["tool"])
    took = time.monotonic() - started
    if a.expect_error:
        status, code, reason = a.expect_error.split(":")
        got = answer.error()
        if (got[0], got[1], got[2]) != (int(status), int(code), reason):
            raise Fail(f"expected {status} {code} {reason}, got {answer.short()}")
        return f"{status} {code} {reason} in {took:.2f}s"
    check_complete(answer, a.expect, f"retry on {a.replica}")
    return f"completed in {took:.2f}s"


def cmd_begin(a: argparse.Namespace) -> str:
    lb = Balancer(a.replicas.split(","))
    args = json.loads(a.args)
    flows = []
    for i in range(a.count):
        flow = round_of(lb.send(a.path, "tools/call", call_params(a.tool, args), a.tool), f"flow {i} round 1")
        flow.update(tool=a.tool, args=args, path=a.path)
        flows.append(flow)
    with open(a.save, "w") as f:
        json.dump(flows, f)
    owners = {r: sum(1 for fl in flows if fl["owner"] == r) for r in lb.replicas}
    if any(n == 0 for n in owners.values()):
        raise Fail(f"round 1 not spread over the replicas: {owners}")
    return f"{a.count} flows parked: {owners}"


def cmd_finish(a: argparse.Namespace) -> str:
    replicas = a.replicas.split(",")
    with open(a.load) as f:
        flows = json.load(f)
    content = json.loads(a.answer)
    notes = []
    if a.draining:
        ready = get_status(a.draining, "/readyz")
        if ready != 503:
            raise Fail(f"draining replica {a.draining}: /readyz {ready}, expected 503")
        probe = post(a.draining, a.path, "tools/call", call_params(a.probe_tool, json.loads(a.probe_args)), a.probe_tool)
        if probe.status != 503 or "retry-after" not in probe.headers:
            raise Fail(f"draining replica took a new call: {probe.short()}")
        # The balancer, starting at the draining replica, sends the new call elsewhere.
        lb = Balancer(replicas, start=replicas.index(a.draining))
        moved = lb.send(a.path, "tools/call", call_params(a.probe_tool, json.loads(a.probe_args)), a.probe_tool)
        check_complete(moved, a.probe_expect, "a new call during the drain, failed over")
        if moved.replica == a.draining or not lb.failovers:
            raise Fail(f"the new call was not failed over: {moved.short()}")
        notes.append("new call 503+Retry-After, failed over")
    # Retries through the balancer, offset by one: most land on the replica that
    # did not serve round 1 (forwarded to the owner, draining or not).
    lb = Balancer(replicas, start=1)
    crossed = 0
    for i, flow in enumerate(flows):
        done = lb.send(flow["path"], "tools/call", retry_params(flow, content), flow["tool"])
        check_complete(done, a.expect, f"retry of flow {i} (round 1 on {flow['owner']}, retry on {done.replica})")
        crossed += done.replica != flow["owner"]
    notes.append(f"{len(flows)} retries completed, {crossed} on the other replica, {len(lb.failovers)} failovers")
    return "; ".join(notes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p: argparse.ArgumentParser, replicas: bool) -> None:
        if replicas:
            p.add_argument("--replicas", required=True, help="host:port,host:port")
        else:
            p.add_argument("--replica", required=True, help="host:port")
        p.add_argument("--label", default=None)

    p = sub.add_parser("flows")
    common(p, True)
    for opt in ("--path", "--tool", "--args", "--answer", "--expect"):
        p.add_argument(opt, required=True)
    p.add_argument("--count", type=int, default=20)
    p = sub.add_parser("round")
    common(p, False)
    for opt in ("--path", "--tool", "--args", "--save"):
        p.add_argument(opt, required=True)
    p = sub.add_parser("retry")
    common(p, False)
    p.add_argument("--load", required=True)
    p.add_argument("--answer", required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--expect")
    g.add_argument("--expect-error", help="STATUS:CODE:REASON")
    p = sub.add_parser("begin")
    common(p, True)
    for opt in ("--path", "--tool", "--args", "--save"):
        p.add_argument(opt, required=True)
    p.add_argument("--count", type=int, default=20)
    p = sub.add_parser("finish")
    common(p, True)
    for opt in ("--path", "--load", "--answer", "--expect"):
        p.add_argument(opt, required=True)
    p.add_argument("--draining", default=None, help="host:port of the replica that got SIGTERM")
    p.add_argument("--probe-tool", default="echo")
    p.add_argument("--probe-args", default='{"message": "during the drain"}')
    p.add_argument("--probe-expect", default="echo: during the drain")
    a = ap.parse_args()
    handler = {"flows": cmd_flows, "round": cmd_round, "retry": cmd_retry, "begin": cmd_begin, "finish": cmd_finish}
    return run(handler[a.cmd], a)


def run(handler: Callable[[argparse.Namespace], str], a: argparse.Namespace) -> int:
    """Runs one command; prints its one verdict line, `PASS|FAIL <label>...`."""
    label = a.label or a.cmd
    try:
        note = handler(a)
    except Fail as e:
        print(f"FAIL {label}: {e}", flush=True)
        return 1
    except Exception as e:  # noqa: BLE001 - any other failure is a FAIL line too
        print(f"FAIL {label}: {type(e).__name__}: {e}", flush=True)
        return 1
    print(f"PASS {label}: {note}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
