"""`python -m bertcli` (also what `torchrun ... -m bertcli pretrain ...` runs)."""

import importlib.util
import sys
from pathlib import Path

if getattr(sys.modules["bertcli"], "__file__", None) is None:
    # A folder named bertcli without __init__.py in the current folder (a clone's top) was imported as a namespace
    # package ahead of the installed one: this file's package takes its place, so its modules import as they are.
    _here = Path(__file__).resolve().parent
    _spec = importlib.util.spec_from_file_location(
        "bertcli", _here / "__init__.py", submodule_search_locations=[str(_here)]
    )
    sys.modules["bertcli"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["bertcli"])

from bertcli.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
