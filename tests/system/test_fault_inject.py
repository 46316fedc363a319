"""scripts/fault_inject.py, briefly: SIGKILL at random moments, rerun, compare with an uninterrupted run."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow


def test_fault_injection_two_rounds(capsys):
    # The script's main in this process (its torch import saved); the runs it kills are processes.
    spec = importlib.util.spec_from_file_location("fault_inject", REPO / "scripts" / "fault_inject.py")
    fault_inject = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fault_inject)
    code = fault_inject.main(["--rounds", "2", "--max-steps", "20", "--seed", "2"])
    out = capsys.readouterr().out
    assert code == 0, out[-1000:]
    assert "corrupt checkpoints: 0" in out and "IDENTICAL" in out
