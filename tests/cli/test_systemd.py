"""The user units: installed by `calmd install-systemd`, accepted by systemd-analyze."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from calmd import paths

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def test_units_say_what_calmd_md_fixes() -> None:
    socket_unit = (REPO / "systemd" / paths.SYSTEMD_SOCKET_UNIT).read_text()
    assert f"ListenStream=%t/{paths.APP}/{paths.SOCKET}" in socket_unit
    assert "SocketMode=0600" in socket_unit and "DirectoryMode=0700" in socket_unit
    service = (REPO / "systemd" / paths.SYSTEMD_SERVICE_UNIT).read_text()
    assert "ExecStart=%h/.local/bin/calmd serve" in service
    assert "ExecReload=/bin/kill -HUP $MAINPID" in service


@contextlib.contextmanager
def user_manager(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment where `systemctl --user` would find its manager: a systemctl on PATH and a
    socket at $XDG_RUNTIME_DIR/bus (install-systemd only checks that they are there)."""
    run, tools = tmp_path / "run", tmp_path / "bin"
    run.mkdir(mode=0o700, parents=True)
    tools.mkdir()
    (tools / "systemctl").write_text("#!/bin/sh\nexit 0\n")
    (tools / "systemctl").chmod(0o755)
    bus = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bus.bind(str(run / "bus"))
    env = {k: v for k, v in os.environ.items() if k != "DBUS_SESSION_BUS_ADDRESS"}
    try:
        yield env | {"XDG_RUNTIME_DIR": str(run), "PATH": f"{tools}:{os.environ['PATH']}"}
    finally:
        bus.close()


def test_install_systemd_writes_units_with_the_real_binary(tmp_path: Path) -> None:
    units = tmp_path / "units"
    with user_manager(tmp_path) as env:
        out = subprocess.run([str(BIN / "calmd"), "install-systemd", "--dir", str(units)],
                             capture_output=True, text=True, check=True, env=env).stdout  # fmt: skip
        service = (units / paths.SYSTEMD_SERVICE_UNIT).read_text()
        # opting out of the first-start import of the shells' history files
        subprocess.run([str(BIN / "calmd"), "install-systemd", "--dir", str(units), "--no-import"],
                       capture_output=True, text=True, check=True, env=env)  # fmt: skip
    assert f"systemctl --user enable --now {paths.SYSTEMD_SOCKET_UNIT}" in out
    exec_line = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    binary = exec_line.removeprefix("ExecStart=").split()[0]
    assert Path(binary).is_file() and Path(binary).name == "calmd"
    assert exec_line == f"ExecStart={binary} serve"
    assert f"ExecStart={binary} serve --no-import\n" in (units / paths.SYSTEMD_SERVICE_UNIT).read_text()
    assert (units / paths.SYSTEMD_SOCKET_UNIT).read_text() == (
        REPO / "systemd" / paths.SYSTEMD_SOCKET_UNIT
    ).read_text()


@pytest.mark.needs("systemd-analyze")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    with user_manager(tmp_path / "home") as env:
        subprocess.run([str(BIN / "calmd"), "install-systemd", "--dir", str(tmp_path)], check=True,
                       capture_output=True, env=env)  # fmt: skip
    proc = subprocess.run(
        ["systemd-analyze", "verify", paths.SYSTEMD_SOCKET_UNIT, paths.SYSTEMD_SERVICE_UNIT],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
