"""The user units: installed by `calmd install-systemd`, accepted by systemd-analyze."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent


def test_units_say_what_calmd_md_fixes() -> None:
    socket_unit = (REPO / "systemd" / "calmd.socket").read_text()
    assert "ListenStream=%t/calm/calmd.sock" in socket_unit
    assert "SocketMode=0600" in socket_unit and "DirectoryMode=0700" in socket_unit
    service = (REPO / "systemd" / "calmd.service").read_text()
    assert "ExecStart=%h/.local/bin/calmd serve" in service
    assert "ExecReload=/bin/kill -HUP $MAINPID" in service


def test_install_systemd_writes_units_with_the_real_binary(tmp_path: Path) -> None:
    out = subprocess.run([str(BIN / "calmd"), "install-systemd", "--dir", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "systemctl --user enable --now calmd.socket" in out
    service = (tmp_path / "calmd.service").read_text()
    exec_line = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    binary = exec_line.removeprefix("ExecStart=").split()[0]
    assert Path(binary).is_file() and Path(binary).name == "calmd"
    assert (tmp_path / "calmd.socket").read_text() == (REPO / "systemd" / "calmd.socket").read_text()


@pytest.mark.needs("systemd-analyze")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    subprocess.run(
        [str(BIN / "calmd"), "install-systemd", "--dir", str(tmp_path)], check=True, capture_output=True
    )
    proc = subprocess.run(
        ["systemd-analyze", "verify", "calmd.socket", "calmd.service"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
