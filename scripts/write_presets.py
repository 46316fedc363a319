"""Regenerate configs/<preset>.yaml from the code: exactly what `bertcli init --preset NAME` writes.

    python scripts/write_presets.py

tests/unit/test_config.py fails when the two drift apart.
"""

from pathlib import Path

from bertcli import store
from bertcli.config import PRESETS
from bertcli.config_load import preset_config
from bertcli.config_write import preset_header, to_yaml

if __name__ == "__main__":
    folder = Path(__file__).resolve().parents[1] / "configs"
    folder.mkdir(exist_ok=True)
    for name in PRESETS:
        store.write_text(folder / f"{name}.yaml", to_yaml(preset_config(name), preset_header(name)))
        print(f"wrote {folder / name}.yaml")
