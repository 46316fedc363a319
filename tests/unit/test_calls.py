"""The package's calls name their values (issue 19): scripts/check_calls.py finds none that passes more
than 4 arguments, or a bare True/False, by position."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

# Files whose calls are rewritten by the refactoring of the checkpoint and the trainer's set-up
# (issue 19, section 1): remove each one as it passes.
PENDING: tuple[str, ...] = ()


def test_no_call_passes_more_than_four_values_or_a_bare_bool_by_position():
    proc = subprocess.run(
        [sys.executable, "scripts/check_calls.py"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    found = proc.stdout.splitlines()
    assert proc.returncode == (1 if found else 0), proc.stderr
    assert [line for line in found if not line.startswith(PENDING)] == []
    still = {f for f in PENDING if any(line.startswith(f) for line in found)}
    assert still == set(PENDING), f"{set(PENDING) - still} pass now: take them out of PENDING"
