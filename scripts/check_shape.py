"""The shape of the package, checked: the layering of its imports, and its size.

    python scripts/check_shape.py          # exit 1 with one line per problem

- Every module belongs to one layer (LAYERS, lowest first). A module imports from its own layer or
  lower ones, never higher, and the imports (function-local ones too) form no cycle.
- `bertcli/` holds at most MAX_LINES lines, no module more than MAX_MODULE, no function more than
  MAX_FUNCTION; no comment or docstring cites a trial (history belongs in commit messages).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bertcli"
MAX_LINES, MAX_MODULE, MAX_FUNCTION = 11_000, 800, 60

# Lowest first. A module may import from its own layer and the ones before it.
LAYERS = {
    "foundation": ["__init__", "errors", "console"],
    "files": ["layout", "store", "sniff", "stopping"],
    "config": ["config", "config_load", "config_write", "sizes"],
    "model": ["model", "hf_names", "dropout", "optim", "weights"],
    "data": [
        "data.__init__",
        "data.text",
        "data.tokenizer",
        "data.corpus",
        "data.chunks",
        "data.examples",
        "data.loader",
        "data.scan",
        "data.units",
        "data.prepared",
        "data.prepare",
    ],
    "runs": [
        "resolve",
        "sbert",
        "hf_import",
        "checkpoint",
        "resume",
        "export",
        "adopt",
        "runtime",
        "parallel",
        "metrics",
        "encode",
        "encode_io",
        "trainer",
        "labeled",
        "probe",
        "evaluation",
    ],
    "commands": ["summary", "preflight", "cli", "__main__"],
}
LAYER = {module: rank for rank, modules in enumerate(LAYERS.values()) for module in modules}


def module_name(path: Path, package: Path) -> str:
    return ".".join(path.relative_to(package).with_suffix("").parts)


def imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The package's modules that `tree` imports, anywhere in it (function-local imports too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "bertcli":
            base = node.module.removeprefix("bertcli").lstrip(".")
            for alias in node.names:
                for candidate in (f"{base}.{alias.name}".lstrip("."), base):
                    name = candidate if candidate in modules else f"{candidate}.__init__"
                    if name in modules:
                        found.add(name)
                        break
        elif isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name.removeprefix("bertcli").lstrip(".")
                if alias.name.startswith("bertcli") and name in modules:
                    found.add(name)
    return found


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph`, as its modules in order, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def problems_of(package: Path) -> tuple[list[str], int]:
    """Every problem of the package at `package`, one line each, and its number of lines."""
    files = {module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    trees = {name: ast.parse(path.read_text()) for name, path in files.items()}
    graph = {name: imports(tree, set(files)) - {name} for name, tree in trees.items()}
    problems = [f"{name}: in no layer of scripts/check_shape.py's LAYERS" for name in files if name not in LAYER]
    for name, targets in graph.items():
        for target in sorted(targets):
            if name in LAYER and target in LAYER and LAYER[target] > LAYER[name]:
                problems.append(f"{name} imports {target}, of a higher layer")
    if found := cycle(graph):
        problems.append(f"import cycle: {' -> '.join(found)}")
    total = 0
    for name, path in files.items():
        lines = path.read_text().splitlines()
        total += len(lines)
        if len(lines) > MAX_MODULE:
            problems.append(f"{path.relative_to(package.parent)}: {len(lines)} lines (at most {MAX_MODULE})")
        for node in ast.walk(trees[name]):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION:
                    problems.append(f"{path.relative_to(package.parent)}:{node.lineno}: {node.name} is {length} lines")
        for number, line in enumerate(lines, 1):
            if re.search(r"\btrials? \d", line, re.IGNORECASE):
                problems.append(f"{path.relative_to(package.parent)}:{number}: cites a trial")
    if total > MAX_LINES:
        problems.append(f"{package.name}/: {total:,} lines (at most {MAX_LINES:,})")
    return problems, total


def main() -> int:
    problems, total = problems_of(PACKAGE)
    for problem in problems:
        print(problem)
    print(f"{total:,} lines, {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
