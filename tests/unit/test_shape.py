"""scripts/check_shape.py finds what it exists to find: an import that points up the layers, an import
cycle (function-local imports count), a long function and a comment citing a trial."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_shape.py"


def load_checker():
    spec = importlib.util.spec_from_file_location("check_shape", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shape_checker_finds_upward_imports_cycles_long_functions_and_trial_citations(tmp_path):
    checker = load_checker()
    package = tmp_path / "bertcli"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "errors.py").write_text("def f():\n    from bertcli.cli import app  # local imports count\n")
    (package / "cli.py").write_text("from bertcli import errors\napp = 1\n")
    body = "".join(f"    x{i} = {i}\n" for i in range(checker.MAX_FUNCTION))
    (package / "layout.py").write_text(f"# as trial 12 found\ndef long():\n{body}")
    problems, total = checker.problems_of(package)
    assert "errors imports cli, of a higher layer" in problems
    assert any(p.startswith("import cycle:") and "cli" in p and "errors" in p for p in problems)
    assert any("layout.py:2: long is" in p for p in problems)
    assert any("layout.py:1: cites a trial" in p for p in problems)
    assert total == sum(len(p.read_text().splitlines()) for p in package.glob("*.py"))


def test_a_clean_package_has_no_problems(tmp_path):
    checker = load_checker()
    package = tmp_path / "bertcli"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "errors.py").write_text("class Error(Exception):\n    pass\n")
    (package / "cli.py").write_text("from bertcli.errors import Error\n")
    assert checker.problems_of(package) == ([], 3)
