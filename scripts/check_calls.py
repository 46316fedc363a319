"""Calls a reader can follow (issue 19): no call passes more than 4 arguments by position, and none
passes a bare True or False by position. Past four values, or for a flag, the call names them
(keyword arguments, or a settings object passed whole).

    python3 scripts/check_calls.py [PATH ...]    (default: bertcli/)

Prints `file:line: what` for each offending call and exits 1 when there is one. A bare bool is
allowed where the API cannot take it by name: POSITIONAL_ONLY below, and `x.get(key, default)`;
more than four values only for a C function (C_FUNCTIONS).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_POSITIONAL = 4
# Functions whose boolean argument has no keyword: os.set_blocking is positional-only, and
# typer.Option's first parameter (the default) comes before the flag names, so it cannot be named.
POSITIONAL_ONLY = {"os.set_blocking", "typer.Option"}
# C functions called through ctypes, which take no keyword arguments (store.exchange).
C_FUNCTIONS = {"renameat2"}


def offending_calls(path: Path) -> list[str]:
    """`file:line: what` for each call in `path` that passes too many values, or a bare bool, by position."""
    found = []
    calls = [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))) if isinstance(n, ast.Call)]
    for node in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
        name = ast.unparse(node.func)
        positional = [a for a in node.args if not isinstance(a, ast.Starred)]
        bare = [a for a in positional if isinstance(a, ast.Constant) and isinstance(a.value, bool)]
        dict_get = isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 2
        if len(positional) > MAX_POSITIONAL and name not in C_FUNCTIONS:
            found.append(f"{path}:{node.lineno}: {name}: {len(positional)} positional arguments")
        elif bare and name not in POSITIONAL_ONLY and not dict_get:
            found.append(f"{path}:{node.lineno}: {name}: a bare {bare[0].value} by position")
    return found


def main(paths: list[str]) -> int:
    files = sorted(f for p in map(Path, paths or ["bertcli"]) for f in ([p] if p.is_file() else p.rglob("*.py")))
    found = [line for f in files for line in offending_calls(f)]
    for line in found:
        print(line)
    print(f"{len(found)} offending call(s) in {len(files)} file(s)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
