"""What the Python interop clients share on a protected route (tests/interop/auth.sh).

The options (--bearer, --unauthorized, --wrong-bearer, --denied-tool, --denied-bearer, the
tokens also from the environment), the Authorization header, and the checks that do not
depend on the SDK: a 401 challenge and a tool list without the denied tool. Standard
library only: py_client.py imports it on mcp==2.3.0, legacy_client.py on mcp==1.30.0.
"""

from __future__ import annotations

import argparse
import os
from typing import Any


def add_options(ap: argparse.ArgumentParser) -> None:
    env = os.environ.get
    ap.add_argument("--bearer", default=env("INTEROP_BEARER"), help="send Authorization: Bearer TOKEN (env INTEROP_BEARER)")
    ap.add_argument("--unauthorized", action="store_true", help="also check that no token and --wrong-bearer get a 401 challenge")
    ap.add_argument("--wrong-bearer", default=env("INTEROP_WRONG_BEARER"), help="a token the route refuses (env INTEROP_WRONG_BEARER)")
    ap.add_argument("--denied-tool", help="a tool a rule denies the --denied-bearer caller")
    ap.add_argument("--denied-bearer", default=env("INTEROP_DENIED_BEARER"), help="that caller's token (env INTEROP_DENIED_BEARER)")


def check_options(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.denied_tool and not args.denied_bearer:
        ap.error("--denied-tool needs --denied-bearer (or INTEROP_DENIED_BEARER)")


def bearer_headers(bearer: str | None) -> dict[str, str] | None:
    return {"Authorization": f"Bearer {bearer}"} if bearer else None


def first(e: BaseException, kind: type[BaseException]) -> Any:
    """`e` if it is a `kind`, else the first `kind` in its exception group, else None."""
    if isinstance(e, kind):
        return e
    if isinstance(e, BaseExceptionGroup):
        for x in e.exceptions:
            if (found := first(x, kind)) is not None:
                return found
    return None


def args_for(profile: dict[str, Any], tool: str) -> dict[str, Any]:
    """The arguments the profile calls `tool` with (none when it names no such call)."""
    for spec in profile.values():
        if isinstance(spec, dict) and spec.get("tool") == tool:
            return spec.get("args", {})
    return {}


def check_listed_without(names: set[str], tool: str, echo: dict[str, Any] | None) -> None:
    """The denied caller's tools/list: not empty, without `tool`, with the profile's echo tool."""
    assert names, "tools/list is empty"
    assert tool not in names, f"tools/list shows the denied tool {tool!r}: {sorted(names)}"
    if echo:
        assert echo["tool"] in names, f"tools/list lacks {echo['tool']!r} (has {sorted(names)})"


def check_challenge(statuses: list[int | None], challenge: str, bearer: str | None) -> None:
    """Every exchange answered 401, the first with a Bearer challenge naming the metadata
    (and, for a token that came, error="invalid_token")."""
    assert statuses and all(st == 401 for st in statuses), f"HTTP statuses {statuses}, want only 401"
    assert challenge.startswith("Bearer"), f"WWW-Authenticate {challenge!r}"
    assert 'resource_metadata="' in challenge, f"WWW-Authenticate without resource_metadata: {challenge!r}"
    if bearer:
        assert 'error="invalid_token"' in challenge, f"WWW-Authenticate {challenge!r}"


