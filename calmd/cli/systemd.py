"""The user units (systemd/calmd.socket, calmd.service): where they come from, how they are installed.

The daemon side of socket activation (LISTEN_FDS) is in server.py; this module only writes units.
"""

from __future__ import annotations

import os
import shutil
import stat
from importlib import resources
from pathlib import Path

from calmd import paths

UNITS = (paths.SYSTEMD_SOCKET_UNIT, paths.SYSTEMD_SERVICE_UNIT)


def unit_source() -> Path:
    """The repository's systemd/ folder in a checkout, else the copy installed with the package."""
    source = paths.PACKAGE_DATA.parent.parent / "systemd"
    if source.is_dir():
        return source
    return Path(str(resources.files("calmd") / "data" / "systemd"))


def install_units(target: Path, calmd_bin: str, serve_args: tuple[str, ...] = ()) -> list[Path]:
    """Write both units into `target` (created), the service running `calmd_bin serve SERVE_ARGS`."""
    source = unit_source()
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for name in UNITS:
        text = (source / name).read_text()
        if name == paths.SYSTEMD_SERVICE_UNIT:
            serve = " ".join([calmd_bin, "serve", *serve_args])
            text = text.replace("ExecStart=%h/.local/bin/calmd serve", f"ExecStart={serve}")
        (target / name).write_text(text)
        written.append(target / name)
    return written


def user_manager_problem() -> str | None:
    """Why `systemctl --user` cannot work here, or None: it needs systemctl and the user manager's
    bus (`$DBUS_SESSION_BUS_ADDRESS`, else `$XDG_RUNTIME_DIR/bus`). Without it systemctl fails with
    "Failed to connect to bus" (a container, an SSH login without a user session, no systemd)."""
    if shutil.which("systemctl") is None:
        return "systemctl is not installed (no systemd here)"
    address = os.environ.get("DBUS_SESSION_BUS_ADDRESS", "")
    bus: Path | None = None
    if address.startswith("unix:path="):
        bus = Path(address.removeprefix("unix:path=").split(",", 1)[0])
    elif os.environ.get("XDG_RUNTIME_DIR"):
        bus = Path(os.environ["XDG_RUNTIME_DIR"]) / "bus"
    if bus is None:
        return "no user bus: neither DBUS_SESSION_BUS_ADDRESS nor XDG_RUNTIME_DIR is set"
    try:
        if stat.S_ISSOCK(bus.stat().st_mode):
            return None
    except OSError:
        pass
    return f"no systemd user manager answers at {bus} (no user session)"
