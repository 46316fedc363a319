"""scripts/fault_inject.py, briefly: SIGKILL at random moments, rerun, compare with an uninterrupted run."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow


def test_fault_injection_two_rounds():
    proc = subprocess.run(
        [sys.executable, "scripts/fault_inject.py", "--rounds", "2", "--max-steps", "40", "--seed", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-1000:]
    assert "corrupt checkpoints: 0" in proc.stdout and "IDENTICAL" in proc.stdout
