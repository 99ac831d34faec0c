"""Drives a stdio MCP server straight, with no gateway: the control of tests/interop/stdio.sh.

Python stdlib only. Spawns the server's argv (no shell), speaks 2025-11-25 JSON-RPC over
its stdin/stdout one message per line, and checks what any legacy stdio server must do:
`initialize` answered with the server's name, `tools/list` listing the tools named, and
one tool call per --call, answering the server's own requests on the way (elicitation:
accept with --elicit; sampling: the text of --sample; roots/list, with --roots: one root). A line on
stdout that is not JSON fails the run (stdout is the protocol's); stderr is left to the
caller's log. The process is ended by closing stdin (then TERM, then KILL, 5 s apart).

    python3 tests/interop/stdio_direct.py --label py-legacy --server-name sessionless-interop-legacy \
        --tools echo,elicit_name --call 'echo {"message":"hi"} =echo: hi' \
        --call 'elicit_name {} =hello, Ada' --elicit '{"user_name":"Ada"}' \
        -- .peers/py-legacy/bin/python tests/interop/legacy_server.py --stdio

--call 'TOOL JSON_ARGS =TEXT' wants the joined text exactly, '~TEXT' a substring.
Prints one line per check, `PASS|FAIL direct:<label>/<check>[: reason]`; exits 1 on a FAIL.
"""

from __future__ import annotations

import argparse
import json
import queue
import subprocess
import sys
import threading
import time

VERSION = "2025-11-25"


class Server:
    def __init__(self, argv: list[str], cwd: str | None) -> None:
        self.proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.noise: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, message: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict, answers: dict, timeout: float = 30.0) -> dict:
        """Sends a request and reads until its response, answering the server's requests."""
        self.next_id += 1
        rid = self.next_id
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no answer to {method} within {timeout:.0f}s")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"the server closed stdout before answering {method} (exit {self.proc.poll()})")
            text = line.decode(errors="replace").strip()
            if not text:
                continue
            try:
                msg = json.loads(text)
            except ValueError:
                self.noise.append(text[:200])
                continue
            if msg.get("id") == rid and ("result" in msg or "error" in msg):
                if "error" in msg:
                    raise RuntimeError(f"{method}: error {json.dumps(msg['error'])[:300]}")
                return msg["result"]
            if "method" in msg and "id" in msg:  # a server request: answer it
                self.send({"jsonrpc": "2.0", "id": msg["id"], **answer(msg["method"], answers)})

    def stop(self) -> tuple[int, str]:
        """Closes stdin, then TERM, then KILL (5 s each); the exit status and what ended it."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        for how, act in (("stdin closed", None), ("SIGTERM", self.proc.terminate), ("SIGKILL", self.proc.kill)):
            if act is not None:
                act()
            try:
                return self.proc.wait(timeout=5), how
            except subprocess.TimeoutExpired:
                continue
        return self.proc.wait(), "SIGKILL"


def answer(method: str, answers: dict) -> dict:
    if method == "elicitation/create" and answers.get("elicit") is not None:
        return {"result": {"action": "accept", "content": answers["elicit"]}}
    if method == "sampling/createMessage" and answers.get("sample") is not None:
        return {"result": {"role": "assistant", "content": {"type": "text", "text": answers["sample"]}, "model": "stdio-direct"}}
    if method == "roots/list":
        return {"result": {"roots": [{"uri": "file:///tmp/sessionless-interop", "name": "interop-root"}]}}
    if method == "ping":
        return {"result": {}}
    return {"error": {"code": -32601, "message": f"stdio_direct does not answer {method}"}}


def text_of(result: dict) -> str:
    return "".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--server-name", required=True)
    ap.add_argument("--tools", default="", help="comma-separated tool names that must be listed")
    ap.add_argument("--call", action="append", default=[], help="'TOOL JSON_ARGS =TEXT' or '~TEXT'")
    ap.add_argument("--elicit", help="JSON content an elicitation is accepted with (declares elicitation)")
    ap.add_argument("--sample", help="text a sampling request is answered with (declares sampling)")
    ap.add_argument("--roots", action="store_true", help="declare roots (roots/list answered with one root)")
    ap.add_argument("--cwd")
    ap.add_argument("argv", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        ap.error("the server's argv follows --")
    answers = {"elicit": json.loads(args.elicit) if args.elicit else None, "sample": args.sample}
    caps: dict = {"roots": {}} if args.roots else {}
    if args.elicit:
        caps["elicitation"] = {}
    if args.sample:
        caps["sampling"] = {}

    failed = False

    def report(ok: bool, check: str, why: str = "") -> None:
        nonlocal failed
        failed |= not ok
        print(f"{'PASS' if ok else 'FAIL'} direct:{args.label}/{check}{'' if ok or not why else ': ' + why}", flush=True)

    t0 = time.monotonic()
    server = Server(argv, args.cwd)
    try:
        try:
            init = server.request("initialize", {"protocolVersion": VERSION, "capabilities": caps,
                                                 "clientInfo": {"name": "stdio-direct", "version": "0"}}, answers)
            name = (init.get("serverInfo") or {}).get("name")
            report(name == args.server_name, "initialize",
                   f"server name {name!r}, want {args.server_name!r}")
            print(f"INFO direct:{args.label}/start: initialize answered in {time.monotonic() - t0:.2f}s", flush=True)
            server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        except RuntimeError as e:
            report(False, "initialize", str(e))
            return 1
        try:
            listed = {t["name"] for t in server.request("tools/list", {}, answers).get("tools", [])}
            missing = [t for t in args.tools.split(",") if t and t not in listed]
            report(not missing, "tools-list", f"missing {missing} (listed {sorted(listed)})")
        except RuntimeError as e:
            report(False, "tools-list", str(e))
        for spec in args.call:
            head, _, want = spec.partition(" =") if " =" in spec else spec.partition(" ~")
            exact = " =" in spec
            tool, _, raw = head.partition(" ")
            try:
                result = server.request("tools/call", {"name": tool, "arguments": json.loads(raw or "{}")}, answers)
                got = text_of(result)
                ok = (got == want) if exact else (want in got)
                report(ok and not result.get("isError"), f"call-{tool}", f"text {got[:200]!r}, want {'' if exact else '~'}{want!r}")
            except RuntimeError as e:
                report(False, f"call-{tool}", str(e))
        report(not server.noise, "stdout-protocol-only", f"non-JSON lines on stdout: {server.noise[:3]}")
    finally:
        rc, how = server.stop()
    print(f"INFO direct:{args.label}/stop: exited {rc} after {how}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
