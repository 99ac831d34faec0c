"""Checks of tests/interop/stdio.sh that no SDK client makes (Python stdlib only).

    files      a 2026-07-28 client in plain HTTP against a route whose upstream is
               @modelcontextprotocol/server-filesystem over stdio: tools listed, the served
               directory allowed, the test file listed and read, a file outside refused
    retries    from rr_proxy.py's --log and --states-log: every MRTR retry that went through
               the forwarder carried a requestState the forwarder saw handed out, was
               answered 200, and, per route, some reached another replica than the round
               that asked (the gateways forwarded them to the replica holding the process)
    abandon    --count calls at once whose clients go away --after seconds, before any
               answer (while the gateway is still starting processes for them): the
               starts so abandoned must not leave processes behind (stdio.sh's idle check)
    snapshot   the gateways' child processes (and theirs): some exist, none is a zombie,
               each leads its own process group, at most --max per upstream, and each
               child's environment is exactly what the config lists plus PATH, HOME, LANG
               and TMPDIR (no gateway secret, no value_env source name); saved to --out
    count      how many live children of each gateway run each --match command (one line each)
    gone       after the gateways stopped: no process of the snapshot is left (same pid and
               start time), nor any in their process groups; leftovers are reported, then
               killed so the run leaves nothing behind

Prints `PASS|FAIL|INFO <tag>:<check>[: detail]`; exits 1 on a FAIL.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import itertools
import json
import os
import signal
import sys
import time
from typing import Any

VERSION = "2026-07-28"
FAILED = False
TAG = "stdio"
_ids = itertools.count(1)


def report(ok: bool, check: str, detail: str = "") -> bool:
    global FAILED
    FAILED |= not ok
    print(f"{'PASS' if ok else 'FAIL'} {TAG}:{check}{': ' + detail if detail else ''}", flush=True)
    return ok


def info(check: str, detail: str) -> None:
    print(f"INFO {TAG}:{check}: {detail}", flush=True)


# ---------------------------------------------------------------- files


def post(url: str, method: str, params: dict[str, Any], name: str | None = None) -> tuple[int, Any, str]:
    """One 2026-07-28 request (no capabilities declared): status, last JSON-RPC message, raw."""
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, port = hostport.rsplit(":", 1)
    body = {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": method,
        "params": {
            **params,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": {"name": "stdio-checks", "version": "1"},
            },
        },
    }
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": VERSION,
        "mcp-method": method,
    }
    if name is not None:
        headers["mcp-name"] = name
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", "/" + path, body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        raw = resp.read().decode("utf-8", "replace")
        ctype = resp.getheader("Content-Type") or ""
    finally:
        conn.close()
    msg: Any = None
    if ctype.startswith("text/event-stream"):
        for event in raw.replace("\r\n", "\n").split("\n\n"):
            data = "\n".join(line[5:].lstrip(" ") for line in event.split("\n") if line.startswith("data:"))
            if data.strip():
                msg = json.loads(data)
    elif raw.strip():
        try:
            msg = json.loads(raw)
        except ValueError:
            msg = None
    return resp.status, msg, raw


def result_of(answer: tuple[int, Any, str], what: str) -> dict[str, Any]:
    status, msg, raw = answer
    if status != 200 or not isinstance(msg, dict) or not isinstance(msg.get("result"), dict):
        raise AssertionError(f"{what}: HTTP {status}: {raw[:300]}")
    return msg["result"]


def text_of(result: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for c in result.get("content", []) if isinstance(c, dict))


def cmd_files(a: argparse.Namespace) -> None:
    directory = os.path.realpath(a.dir)
    path = os.path.join(directory, a.file)
    want = open(path).read()

    def call(tool: str, args: dict[str, Any]) -> dict[str, Any]:
        return result_of(post(a.url, "tools/call", {"name": tool, "arguments": args}, tool), f"tools/call {tool}")

    def check(name: str, fn) -> None:
        try:
            detail = fn()
            report(True, f"files/{name}", detail or "")
        except (AssertionError, OSError, ValueError) as e:
            report(False, f"files/{name}", str(e))

    def tools() -> str:
        names = {t["name"] for t in result_of(post(a.url, "tools/list", {}), "tools/list").get("tools", [])}
        need = {"read_text_file", "list_directory", "list_allowed_directories", "write_file"}
        assert need <= names, f"tools/list lacks {sorted(need - names)} (has {sorted(names)})"
        return f"{len(names)} tools"

    def allowed() -> str:
        r = call("list_allowed_directories", {})
        assert not r.get("isError") and directory in text_of(r), f"{directory} not in {text_of(r)[:300]!r}"
        return directory

    def listing() -> str:
        r = call("list_directory", {"path": directory})
        assert not r.get("isError") and f"[FILE] {a.file}" in text_of(r), f"listing {text_of(r)[:300]!r}"
        return f"[FILE] {a.file} listed"

    def read() -> str:
        r = call("read_text_file", {"path": path})
        assert not r.get("isError") and text_of(r) == want, f"read {text_of(r)[:300]!r}, want {want!r}"
        return f"{len(want)} characters read back"

    def outside() -> str:
        r = call("read_text_file", {"path": "/etc/hostname"})
        assert r.get("isError") and "denied" in text_of(r).lower(), f"reading /etc/hostname: {r}"
        return "a file outside the directory refused (isError)"

    for name, fn in (("tools-list", tools), ("allowed-directory", allowed), ("list-directory", listing),
                     ("read-file", read), ("outside-refused", outside)):
        check(name, fn)


# ---------------------------------------------------------------- abandon


def cmd_abandon(a: argparse.Namespace) -> None:
    import socket
    import threading

    rest = a.url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, port = hostport.rsplit(":", 1)
    caps = json.loads(a.caps)
    outcome: list[str] = []

    def one(i: int) -> None:
        body = json.dumps({
            "jsonrpc": "2.0", "id": i, "method": "tools/call",
            "params": {"name": a.tool, "arguments": json.loads(a.args), "_meta": {
                "io.modelcontextprotocol/protocolVersion": VERSION,
                "io.modelcontextprotocol/clientCapabilities": caps}},
        }).encode()
        head = (f"POST /{path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\n"
                f"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {VERSION}\r\n"
                f"Mcp-Method: tools/call\r\nMcp-Name: {a.tool}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        s = socket.create_connection((host, int(port)), timeout=5)
        try:
            s.sendall(head + body)
            s.settimeout(a.after)
            try:
                got = s.recv(1)
                outcome.append("answered" if got else "closed")
            except socket.timeout:
                outcome.append("abandoned")
        finally:
            s.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(1, a.count + 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c = collections.Counter(outcome)
    info("abandon", f"{a.count} calls of {a.tool} with capabilities {a.caps}: {c['abandoned']} abandoned after "
         f"{a.after}s without an answer, {c['answered']} answered before, {c['closed']} closed by the gateway")
    report(c["abandoned"] > 0, "abandon", f"{c['abandoned']} starts abandoned by their clients" if c["abandoned"]
           else "every call was answered before its client left: nothing was abandoned (raise --count or lower --after)")


# ---------------------------------------------------------------- retries


def parse_rr(path: str) -> dict[int, dict[str, str]]:
    rows = {}
    for line in open(path):
        parts = line.split()
        if len(parts) < 6 or not parts[0].isdigit() or not parts[4].startswith("session="):
            continue
        row = {"seq": parts[0], "backend": parts[1], "verb": parts[2], "path": parts[3], "status": parts[5]}
        for extra in parts[6:]:
            k, _, v = extra.partition("=")
            row[k] = v
        rows[int(parts[0])] = row
    return rows


def cmd_retries(a: argparse.Namespace) -> None:
    rows = parse_rr(a.log)
    asked: dict[str, dict[str, str]] = {}
    for line in open(a.states):
        parts = line.split()
        if len(parts) == 3 and parts[2].startswith("asked="):
            asked.setdefault(parts[2][len("asked="):], {"seq": parts[0], "backend": parts[1]})
    retries = [r for seq, r in sorted(rows.items()) if a.first <= seq <= (a.last or seq) and r.get("retry") and r.get("state")]
    per_path: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    unknown, not_ok = [], []
    for r in retries:
        origin = asked.get(r["state"])
        if origin is None:
            unknown.append(r)
            continue
        if r["status"] != "200":
            not_ok.append(r)
        per_path[r["path"]]["cross" if origin["backend"] != r["backend"] else "same"] += 1
    for path in a.path:
        c = per_path.get(path, collections.Counter())
        report(c["cross"] > 0 and (c["same"] == 0 or not a.all_cross), f"retries{path}",
               f"{c['cross'] + c['same']} retries of an input_required round through the forwarder: "
               f"{c['cross']} on the other replica than the round that asked, {c['same']} on the same one")
    report(not unknown, "retries/state-known",
           f"every one of the {len(retries)} retries carried a requestState a replica handed out through the forwarder"
           if not unknown else f"{len(unknown)} retries carried a requestState the forwarder never saw, e.g. seq {unknown[0]['seq']}")
    report(not not_ok, "retries/answered",
           "every retry was answered 200" if not not_ok
           else f"{len(not_ok)} retries not answered 200, e.g. seq {not_ok[0]['seq']} {not_ok[0]['status']}")


# ---------------------------------------------------------------- processes


def proc_stat(pid: int) -> dict[str, Any] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    head, _, rest = raw.rpartition(")")
    fields = rest.split()
    # fields[0] is field 3 (state): ppid 4, pgrp 5, session 6, starttime 22
    return {"pid": pid, "comm": head.split("(", 1)[1], "state": fields[0], "ppid": int(fields[1]),
            "pgid": int(fields[2]), "sid": int(fields[3]), "start": fields[19]}


def all_procs() -> list[dict[str, Any]]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                out.append(st)
    return out


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [p.decode(errors="replace") for p in f.read().split(b"\0") if p]
    except OSError:
        return []


def environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    env = {}
    for item in raw.split(b"\0"):
        if item:
            k, _, v = item.decode(errors="replace").partition("=")
            env[k] = v
    return env


def descendants(root: int, procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kids = collections.defaultdict(list)
    for p in procs:
        kids[p["ppid"]].append(p)
    out, todo = [], [root]
    while todo:
        for p in kids.get(todo.pop(), []):
            out.append(p)
            todo.append(p["pid"])
    return out


def upstream_of(cmd: list[str], matches: dict[str, str]) -> str:
    joined = " ".join(cmd)
    for name, needle in matches.items():
        if needle in joined:
            return name
    return "?"


def cmd_snapshot(a: argparse.Namespace) -> None:
    gateways = dict(g.split("=", 1) for g in a.gateway)
    matches = dict(m.split("=", 1) for m in a.match)
    caps = {k: int(v) for k, v in (m.split("=", 1) for m in a.max)}
    envs: dict[str, dict[str, str]] = collections.defaultdict(dict)  # upstream -> listed NAME -> value
    for e in a.env:
        up, _, pair = e.partition(":")
        k, _, v = pair.partition("=")
        envs[up][k] = v
    inherited = {"PATH", "HOME", "LANG", "TMPDIR"}
    def look() -> list[dict[str, Any]]:
        """The processes below the gateways, with command line and environment, in one pass."""
        everything = all_procs()
        procs = [p for pid in gateways.values() for p in descendants(int(pid), everything)]
        for p in procs:
            p["cmd"], p["env"] = cmdline(p["pid"]), environ(p["pid"])
        return procs

    def whole(p: dict[str, Any]) -> bool:
        return p["state"] != "Z" and bool(p["cmd"]) and p["env"] is not None

    # A process caught exiting (a zombie not yet reaped, or its command line and
    # environment already gone: being stopped once idle, say) is looked at again a second
    # later: gone by then, it is left out; still there, it is judged as it is then.
    procs = look()
    if not all(whole(p) for p in procs):
        time.sleep(1.0)
        again = {p["pid"]: p for p in look()}
        kept = []
        for p in procs:
            now = again.get(p["pid"])
            if whole(p):
                kept.append(p)
            elif now is not None and now["start"] == p["start"]:
                kept.append(now)
        if len(kept) < len(procs):
            info("children/exiting", f"{len(procs) - len(kept)} processes were exiting at the first look and gone a second later")
        procs = kept
    snapshot = []
    if a.save_only:
        for gw, pid in gateways.items():
            for p in descendants(int(pid), procs):
                p.pop("env", None)
                snapshot.append({**p, "gateway": gw, "upstream": upstream_of(p["cmd"], matches)})
        with open(a.out, "w") as f:
            json.dump(snapshot, f)
        return
    for gw, pid in gateways.items():
        pid = int(pid)
        gw_env = environ(pid) or {}
        tree = descendants(pid, procs)
        children = [p for p in tree if p["ppid"] == pid]
        per_up = collections.Counter()
        problems = []
        for p in tree:
            p["gateway"] = gw
            p["upstream"] = upstream_of(p["cmd"], matches)
            snapshot.append(p)
        for p in children:
            per_up[p["upstream"]] += 1
            what = f"pid {p['pid']} ({p['upstream']}: {' '.join(p['cmd'])[:120]})"
            if p["state"] == "Z":
                problems.append(f"zombie {what}")
                continue
            if p["pgid"] != p["pid"]:
                problems.append(f"{what} is in process group {p['pgid']}, not its own")
            env = p.pop("env", None)
            if env is None:
                problems.append(f"cannot read the environment of {what}")
                continue
            listed = envs.get(p["upstream"], {})
            want = set(listed) | {k for k in inherited if k in gw_env}
            extra, missing = sorted(set(env) - want), sorted(want - set(env))
            if extra:
                problems.append(f"{what} has variables the config does not list: {extra}")
            if missing:
                problems.append(f"{what} lacks {missing}")
            wrong = [k for k, v in listed.items() if k in env and env[k] != v]
            wrong += [k for k in inherited if k in env and k not in listed and env[k] != gw_env.get(k)]
            if wrong:
                problems.append(f"{what}: wrong values for {wrong}")
            leaked = [k for k, v in env.items() if any(s and s in v for s in a.secret)]
            if leaked:
                problems.append(f"{what}: a gateway secret in {leaked}")
        zombies = [p for p in tree if p["state"] == "Z"]
        info(f"children/{gw}", f"{len(children)} children ({dict(per_up)}), {len(tree)} processes below the gateway")
        report(bool(children), f"children/{gw}/some", f"{len(children)} child processes while serving"
               if children else "the gateway has no child process after the flows (nothing to check)")
        report(not zombies, f"children/{gw}/no-zombie",
               "no zombie below the gateway" if not zombies else f"zombies: {[z['pid'] for z in zombies]}")
        over = {u: n for u, n in per_up.items() if u in caps and n > caps[u]}
        report(not over, f"children/{gw}/cap", f"per upstream {dict(per_up)}, caps {caps}" if not over
               else f"over max_processes: {over} (caps {caps})")
        unknown = per_up.get("?", 0)
        report(not unknown, f"children/{gw}/known", "every child runs a configured command" if not unknown
               else f"{unknown} children run no configured command")
        report(not problems, f"children/{gw}/hygiene",
               "each child leads its own process group; its environment is exactly what the config lists plus PATH, HOME, LANG, TMPDIR, no gateway secret"
               if not problems else "; ".join(problems[:6]))
    seen = collections.Counter(p["upstream"] for p in snapshot if p["gateway"] and p["ppid"] == int(gateways[p["gateway"]]))
    missing = [u for u in a.need if not seen[u]]
    report(not missing, "children/every-upstream",
           f"children of every upstream were checked: {dict(seen)}" if not missing
           else f"no child of {missing} below the gateways at this point: their environment was not checked ({dict(seen)})")
    for p in snapshot:
        p.pop("env", None)  # values of the environment stay out of the log directory
    with open(a.out, "w") as f:
        json.dump(snapshot, f)


def cmd_count(a: argparse.Namespace) -> None:
    """One line per --match: NAME and, per --gateway in order, its live children running it."""
    procs = all_procs()
    gateways = [int(g.partition("=")[2]) for g in a.gateway]
    for m in a.match:
        name, _, needle = m.partition("=")
        counts = [sum(1 for p in procs if p["ppid"] == pid and p["state"] != "Z" and needle in " ".join(cmdline(p["pid"])))
                  for pid in gateways]
        print(name, *counts)


def cmd_gone(a: argparse.Namespace) -> None:
    snapshot: list[dict[str, Any]] = []
    for path in a.snapshot:
        with open(path) as f:
            for p in json.load(f):
                if not any(q["pid"] == p["pid"] and q["start"] == p["start"] for q in snapshot):
                    snapshot.append(p)
    groups = {p["pgid"] for p in snapshot}
    deadline = time.monotonic() + a.wait
    while True:
        left = []
        for p in all_procs():
            was = next((s for s in snapshot if s["pid"] == p["pid"] and s["start"] == p["start"]), None)
            if was is not None or p["pgid"] in groups and p["pid"] != os.getpid():
                left.append((p, was))
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    report(not left, "children/gone",
           f"none of the {len(snapshot)} processes below the gateways is left, nor any in their process groups"
           if not left else "left after the gateways stopped: "
           + "; ".join(f"pid {p['pid']} state {p['state']} ppid {p['ppid']} pgid {p['pgid']} "
                       f"({(was or {}).get('upstream', 'in a child group')}: {' '.join(cmdline(p['pid']))[:100]})"
                       for p, was in left[:6]))
    for p, _ in left:  # leave nothing behind
        try:
            os.kill(p["pid"], signal.SIGKILL)
        except OSError:
            pass


def main() -> None:
    global TAG
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default="stdio")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("files")
    f.add_argument("--url", required=True)
    f.add_argument("--dir", required=True)
    f.add_argument("--file", required=True)
    r = sub.add_parser("retries")
    r.add_argument("--log", required=True)
    r.add_argument("--states", required=True)
    r.add_argument("--path", action="append", required=True, help="a route that must have cross-replica retries")
    r.add_argument("--first", type=int, default=0, help="first seq of the forwarder's log to look at")
    r.add_argument("--last", type=int, default=0, help="last seq (0: to the end)")
    r.add_argument("--all-cross", action="store_true", help="every retry must reach the other replica")
    ab = sub.add_parser("abandon")
    ab.add_argument("--url", required=True)
    ab.add_argument("--tool", required=True)
    ab.add_argument("--args", default="{}")
    ab.add_argument("--caps", default="{}", help="the calls' clientCapabilities (JSON)")
    ab.add_argument("--count", type=int, default=4)
    ab.add_argument("--after", type=float, default=0.2)
    s = sub.add_parser("snapshot")
    s.add_argument("--gateway", action="append", required=True, help="NAME=PID")
    s.add_argument("--match", action="append", default=[], help="UPSTREAM=substring of its command line")
    s.add_argument("--max", action="append", default=[], help="UPSTREAM=max_processes")
    s.add_argument("--env", action="append", default=[], help="UPSTREAM:NAME=VALUE the config lists")
    s.add_argument("--secret", action="append", default=[], help="a value no child may see")
    s.add_argument("--need", action="append", default=[], help="an upstream that must have a child now")
    s.add_argument("--save-only", action="store_true", help="record the processes for gone, check nothing")
    s.add_argument("--out", required=True)
    c = sub.add_parser("count")
    c.add_argument("--gateway", action="append", required=True, help="NAME=PID")
    c.add_argument("--match", action="append", required=True, help="NAME=substring of the command line")
    g = sub.add_parser("gone")
    g.add_argument("--snapshot", action="append", required=True, help="a snapshot file (repeat: their union)")
    g.add_argument("--wait", type=float, default=5.0, help="seconds to wait for the processes to go")
    args = ap.parse_args()
    TAG = args.tag
    {"files": cmd_files, "abandon": cmd_abandon, "retries": cmd_retries, "snapshot": cmd_snapshot, "count": cmd_count, "gone": cmd_gone}[args.cmd](args)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
