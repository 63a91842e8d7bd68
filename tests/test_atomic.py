"""Atomic writes: a full disk or a killed writer leaves the previous file intact."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from calmd import atomic
from calmd.formats.ctds import CtdsReader, write_ctds
from calmd.formats.cwgt import CwgtHeader, Metadata, read_cwgt, write_cwgt

HEADER = CwgtHeader(
    d_model=8, n_layers=1, ffn_expand=0, expand=2, d_state=4, d_conv=4, dt_rank=1, param_count=0
)
SEQ = [257, 259, 264, 108, 115, 258]


def test_full_disk_keeps_old_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_cwgt(tmp_path / "shell.cwgt", HEADER, np.ones(10, np.float32), Metadata())
    before = path.read_bytes()

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", no_space)
    with pytest.raises(OSError, match="No space left"):
        write_cwgt(path, HEADER, np.zeros(10, np.float32), Metadata())
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["shell.cwgt"]
    np.testing.assert_array_equal(read_cwgt(path).weights, np.ones(10))


def test_full_disk_keeps_old_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_ctds(tmp_path / "train.ctds", [SEQ])
    before = path.read_bytes()
    monkeypatch.setattr(atomic.os, "replace", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(OSError, match="full"):
        write_ctds(path, [SEQ, SEQ])
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["train.ctds"]


WRITER = """
import sys, time
from calmd.formats.ctds import CtdsWriter
w = CtdsWriter(sys.argv[1])
for i in range(10**9):
    w.add([257, 259, 264, 97 + i % 20, 258])
    if i == 1000:
        print("writing", flush=True)
        time.sleep(60)
"""


def test_killed_writer_leaves_old_dataset(tmp_path: Path) -> None:
    path = write_ctds(tmp_path / "train.ctds", [SEQ])
    argv = [sys.executable, "-c", WRITER, str(path)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(0.05)
    ds = CtdsReader(path)
    assert ds.count() == 1 and ds.sequence(0).tolist() == SEQ
