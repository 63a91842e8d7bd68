"""The user units (systemd/calmd.socket, calmd.service): where they come from, how they are installed.

The daemon side of socket activation (LISTEN_FDS) is in server.py; this module only writes units.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from calmd import paths

UNITS = ("calmd.socket", "calmd.service")


def unit_source() -> Path:
    """The repository's systemd/ folder in a checkout, else the copy installed with the package."""
    source = paths.PACKAGE_DATA.parent.parent / "systemd"
    if source.is_dir():
        return source
    return Path(str(resources.files("calmd") / "data" / "systemd"))


def install_units(target: Path, calmd_bin: str) -> list[Path]:
    """Write both units into `target` (created), the service pointing at `calmd_bin`."""
    source = unit_source()
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name in UNITS:
        text = (source / name).read_text()
        if name == "calmd.service":
            text = text.replace("ExecStart=%h/.local/bin/calmd serve", f"ExecStart={calmd_bin} serve")
        (target / name).write_text(text)
        written.append(target / name)
    return written
