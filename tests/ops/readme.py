#!/usr/bin/env python3
"""The README's quick start, run as written (called by tests/ops/readme.sh).

Reads the "## Quick start" section of README.md and runs each ```sh block
in it, in order, one command a block:

- `cargo run --release -- ARGS` starts the gateway. The test runs the
  already-built binary it is given (the debug build scripts/test made) with
  the same ARGS: `cargo run --release --` only builds a release binary of
  this same crate and runs it with them.
- `curl ...` runs in bash as written and must print the JSON of the ```json
  block that follows it (compared as JSON values, so the key order and
  spacing are free; nothing may be left out).
- `scripts/test` is what runs this test: not run again.

Any other command fails the test: a command added to the quick start must be
taught here, so that it is run.

Ports: the quick start's addresses are 127.0.0.1:8080 (the gateway's default
listen, checked against `--help` below) and 127.0.0.1:9000 (your server). On
a shared CI machine those may be taken, so each server is started on a free
127.0.0.1 port instead: `--listen 127.0.0.1:PORT` is added to its command and
the README's address is replaced by that port in the commands that follow.
`--upstream URL` runs in front of a real server on URL's (replaced) port: the
built-in legacy server, `sessionless demo-upstream`, stands in for "your own
MCP server". The quick start's call is made through that gateway too, and
must give the same answer: it is the same server behind it.

Every process started runs in its own process group and is stopped on exit,
on failure or on SIGINT/SIGTERM/SIGHUP too. A missing binary, section or
block, a server that does not come up, or an answer that differs fails the
test; nothing is skipped. python3 stdlib only.
"""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
GATEWAY_ADDR = "127.0.0.1:8080"  # the default listen address the README's commands use
YOUR_SERVER_ADDR = "127.0.0.1:9000"  # "your own MCP server" in the README
CARGO_RUN = ["cargo", "run", "--release", "--"]
START_SECONDS = 30

PROCS = []  # (name, Popen, log path)
WORK = tempfile.mkdtemp(prefix="sessionless-readme-")
# Loopback only: a proxy from the environment must not carry these requests.
ENV = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
    ENV.pop(var, None)
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Failed(Exception):
    pass


def fail(msg):
    raise Failed(msg)


def say(msg):
    print(f"readme.py: {msg}", flush=True)


def quick_start_blocks():
    """[(lang, text)] of the fenced blocks of the Quick start section, in order."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## Quick start\n(.*?)(?=^## )", text, re.S | re.M)
    if m is None:
        fail("README.md has no '## Quick start' section followed by another '## ' section")
    blocks = re.findall(r"^```(\w*)\n(.*?)^```[ \t]*$", m.group(1), re.S | re.M)
    if not any(lang == "sh" for lang, _ in blocks):
        fail("the README's Quick start has no ```sh block")
    return blocks


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path, lines=30):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


def start(name, argv):
    log = os.path.join(WORK, f"{name}.log")
    out = open(log, "ab")
    say(f"start {name}: {shlex.join(argv)}")
    p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True, env=ENV, cwd=ROOT)
    out.close()
    PROCS.append((name, p, log))
    return p, log


def stop_all():
    for _, p, _ in PROCS:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for _, p, _ in PROCS:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the whole group, in case a child stayed
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
    PROCS.clear()


def wait_healthy(name, p, log, port):
    """Until GET /healthz answers 200; fails naming why, with the log's tail."""
    url = f"http://127.0.0.1:{port}/healthz"
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if p.poll() is not None:
            fail(f"{name} exited with status {p.returncode} before {url} answered\n{log_tail(log)}")
        try:
            with OPENER.open(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    fail(f"{name}: {url} did not answer 200 within {START_SECONDS} s\n{log_tail(log)}")


def wait_listening(name, p, log, port):
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if p.poll() is not None:
            fail(f"{name} exited with status {p.returncode} before listening on {port}\n{log_tail(log)}")
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    fail(f"{name} did not listen on 127.0.0.1:{port} within {START_SECONDS} s\n{log_tail(log)}")


def check_default_listen(bin_):
    """The README's 8080 is the binary's default, for the gateway and the demo."""
    for args in ([], ["demo"]):
        out = subprocess.run([bin_, *args, "--help"], capture_output=True, text=True, env=ENV)
        if out.returncode != 0 or f"default: {GATEWAY_ADDR}" not in out.stdout:
            fail(f"`sessionless {' '.join(args + ['--help'])}` does not give {GATEWAY_ADDR} as the "
                 f"default listen address the README's quick start relies on:\n{out.stdout}{out.stderr}")


class QuickStart:
    def __init__(self, bin_):
        self.bin = bin_
        self.gateway_port = None  # the running gateway's, which replaces GATEWAY_ADDR's
        self.calls = []  # (curl text, expected JSON) made so far, made again through each new gateway

    def run(self, blocks):
        ran = 0
        i = 0
        while i < len(blocks):
            lang, text = blocks[i]
            i += 1
            if lang != "sh":
                continue
            command = text.strip()
            if command == "scripts/test":
                say("scripts/test: not run (it is what runs this test)")
                continue
            words = shlex.split(command, comments=True)
            if words[:4] == CARGO_RUN:
                self.server(words[4:])
            elif words[:1] == ["curl"]:
                if i >= len(blocks) or blocks[i][0] != "json":
                    fail(f"the quick start's curl is not followed by a ```json block of its answer:\n{command}")
                expected = blocks[i][1]
                i += 1
                self.curl(command, expected)
                self.calls.append((command, expected))
            else:
                fail(f"the quick start has a command this test does not know how to run "
                     f"(teach tests/ops/readme.py):\n{command}")
            ran += 1
        if self.gateway_port is None:
            fail("the quick start starts no gateway (`cargo run --release -- ...`)")
        if not self.calls:
            fail("the quick start makes no call (`curl ...` and its ```json answer)")
        say(f"{ran} commands run")

    def server(self, args):
        """`cargo run --release -- ARGS`: the gateway, on a free port, in place of the one before."""
        stop_all()  # the README's servers share 127.0.0.1:8080: one at a time
        self.gateway_port = None
        if "--listen" in args:
            fail(f"`{shlex.join(args)}`: this test adds --listen itself; teach it the README's own")
        args = list(args)
        if "--upstream" in args:
            at = args.index("--upstream") + 1
            url = args[at]
            if f"//{YOUR_SERVER_ADDR}/" not in url:
                fail(f"--upstream {url}: this test stands a server in for {YOUR_SERVER_ADDR} only")
            up = free_port()
            p, log = start("your-server", [self.bin, "demo-upstream", "--listen", f"127.0.0.1:{up}"])
            wait_listening("your-server (sessionless demo-upstream)", p, log, up)
            args[at] = url.replace(YOUR_SERVER_ADDR, f"127.0.0.1:{up}")
        port = free_port()
        name = "demo" if args[:1] == ["demo"] else "gateway"
        p, log = start(name, [self.bin, *args, "--listen", f"127.0.0.1:{port}"])
        wait_healthy(name, p, log, port)
        self.gateway_port = port
        if name == "demo":
            self.check_demo_prints(p, log, port)
        for command, expected in self.calls:
            say("the call before, made again through this gateway")
            self.curl(command, expected)

    def check_demo_prints(self, p, log, port):
        """What the README says the demo does: prints curl commands to try, against itself."""
        want = [f"gateway on http://127.0.0.1:{port}/mcp", f"curl -sN http://127.0.0.1:{port}/mcp"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = log_tail(log, 1000)
            if all(w in text for w in want):
                say("demo: prints its address and curl commands to try: ok")
                return
            if p.poll() is not None:
                break
            time.sleep(0.1)
        fail(f"the demo did not print {want}:\n{log_tail(log)}")

    def curl(self, command, expected_text):
        if self.gateway_port is None:
            fail(f"the quick start's curl comes before any gateway is started:\n{command}")
        try:
            expected = json.loads(expected_text)
        except ValueError as e:
            fail(f"the quick start's ```json block is not JSON ({e}); it must be the answer, whole:\n{expected_text}")
        run = command.replace(GATEWAY_ADDR, f"127.0.0.1:{self.gateway_port}")
        out = subprocess.run(["bash", "-c", run], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)
        if out.returncode != 0:
            fail(f"curl exited {out.returncode}: {out.stderr}\n{run}")
        try:
            got = json.loads(out.stdout)
        except ValueError:
            fail(f"the answer is not JSON:\n{out.stdout}\n{run}")
        if got != expected:
            fail("the answer differs from the README's:\n"
                 f"README: {json.dumps(expected, sort_keys=True)}\n"
                 f"got:    {json.dumps(got, sort_keys=True)}")
        say(f"curl on 127.0.0.1:{self.gateway_port}: the README's answer: ok")


def main():
    if len(sys.argv) != 2:
        print("usage: readme.py PATH-TO-sessionless", file=sys.stderr)
        return 2
    bin_ = os.path.abspath(sys.argv[1])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: sys.exit(128 + s))
    try:
        if not os.access(bin_, os.X_OK):
            fail(f"no gateway binary at {bin_}")
        check_default_listen(bin_)
        QuickStart(bin_).run(quick_start_blocks())
        say("the README's quick start: ok")
        return 0
    except Failed as e:
        print(f"readme.py: FAIL: {e}", file=sys.stderr)
        return 1
    finally:
        stop_all()
        for name in os.listdir(WORK):
            os.remove(os.path.join(WORK, name))
        os.rmdir(WORK)


if __name__ == "__main__":
    sys.exit(main())
