"""calmd/shell/helper.py without a terminal: the line protocol, the helper process against a real daemon,
`calmd init`, `calm enable|disable`."""

from __future__ import annotations

import os
import select
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calmd import paths
from calmd.shell import helper as shell_helper
from calmd.shell import hooks, lines
from tests.support.daemon import BIN, Daemon, running_daemon
from tests.support.fake_daemon import SURE, UNSURE, FakeDaemon, candidates
from tests.support.tmux import history_rows, record, shell_env, wait_recorded
from tests.support.tools import need
from tests.support.waiting import HANG_S


class HelperProcess:
    """`python -m calmd.shell.helper shell-helper` on two pipes, as a shell runs it."""

    def __init__(self, home: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "calmd", "shell-helper", "--session", "s-test", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=shell_env(home),
        )  # fmt: skip
        self.buf = b""

    def send(self, *fields: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(("\t".join(fields) + "\n").encode())
        self.proc.stdin.flush()

    def complete(self, seq: int, text: str, n: int = 5) -> None:
        self.send("c", str(seq), str(n), "/tmp", "main", lines.escape(text))

    def complete2(self, seq: int, text: str, n: int = 5, min_confidence: str = "") -> None:
        """A request as the hooks send it to a `--format 2` helper (with the threshold)."""
        self.send("c", str(seq), str(n), "/tmp", "main", min_confidence, lines.escape(text))

    def reply2(self, timeout: float = HANG_S) -> tuple[str, bool, str, list[str]]:
        """A `--format 2` answer: (seq, final, flags, candidates)."""
        seq, final, cands = self.reply(timeout)
        return seq, final, cands[0] if cands else "", cands[1:]

    def until_final(self, seq: int) -> tuple[list[tuple[str, list[str]]], tuple[str, list[str]]]:
        """`--format 2` answers to `seq`: the (flags, candidates) of those before the final one,
        and of the final one."""
        before = []
        while True:
            got, final, flags, cands = self.reply2()
            if got != str(seq):
                continue
            if final:
                return before, (flags, cands)
            before.append((flags, cands))

    def reply(self, timeout: float = HANG_S) -> tuple[str, bool, list[str]]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise AssertionError("no reply from the helper")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError("the helper exited")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        seq, final, *cands = line.decode().split("\t")
        return seq, final == "1", [lines.unescape(c) for c in cands]

    def final(self, seq: int) -> list[str]:
        """The candidates of the last reply to `seq` (earlier requests' replies are skipped)."""
        while True:
            got, final, cands = self.reply()
            if got == str(seq) and final:
                return cands

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=HANG_S)
        for stream in (self.proc.stdout, self.proc.stderr):
            assert stream is not None
            stream.close()
        return code


@pytest.fixture
def helper(home: Path) -> Iterator[HelperProcess]:
    h = HelperProcess(home)
    yield h
    h.close()


@pytest.mark.parametrize("text", ["", "plain", "a\tb", "two\nlines", "back\\slash", "\\n literal", "é ✓"])
def test_escape_round_trip(text: str) -> None:
    escaped = lines.escape(text)
    assert "\n" not in escaped and "\t" not in escaped
    assert lines.unescape(escaped) == text


def test_parse_request() -> None:
    c = lines.parse_request("c\t7\t3\t/src\tmain\tgit s\\tx")
    assert c == lines.Complete("7", 3, "git s\tx", "/src", "main")
    r = lines.parse_request("r\t1\t/src\t\t1700000000.5\techo a\\nb")
    assert r == lines.Record("echo a\nb", 1, "/src", "", 1700000000.5)
    assert isinstance(r, lines.Record)
    assert r.fields("s") == {"exit": 1, "cwd": "/src", "ts": 1700000000.5, "session": "s"}
    assert lines.parse_request("c\t1\t99\t\t\tx") == lines.Complete("1", 32, "x", "", "")
    assert lines.parse_request("c\t1\t5\t/\tm\t0.25\tx") == lines.Complete("1", 5, "x", "/", "m", 0.25)
    for odd in ("", "-1", "2", "nan", "abc"):  # the default threshold
        assert lines.parse_request(f"c\t1\t5\t/\tm\t{odd}\tx") == lines.Complete("1", 5, "x", "/", "m", None)
    assert lines.parse_request("r\t\t\t\t\tls") == lines.Record("ls", None, "", "", None)
    # a clock or a status no shell reports (issue 30): the command is still recorded, without them
    for ts, code, kept in (("inf", "1", 1), ("nan", "1", 1), ("1e20", "99999999999999999999", None),
                           ("-5", "4294967296", None)):  # fmt: skip
        odd = lines.parse_request(f"r\t{code}\t\t\t{ts}\tls")
        assert odd == lines.Record("ls", kept, "", "", None), (ts, code)
    assert lines.parse_request("e\t/p/.venv\t") == lines.Env("/p/.venv", "")
    for bad in ("", "x", "c\t1", "c\t1\tnot-a-number\t\t\tx", "r\t0\t\t\tnot-a-time\tls", "p\tls"):
        assert lines.parse_request(bad) is None
    # a command timed from when the shell wrote its line (fish's request file's mtime), less its run
    assert lines.parse_request("r\t0\t\t\t\tls\t1.5", written=1700000010.0).ts == 1700000008.5  # type: ignore[union-attr]
    # paused (CALM_RECORD=0): when it started, and nothing else goes to the daemon
    paused = lines.parse_request("p\t\t2.25", written=1700000010.0)
    assert paused == lines.Record("", None, "", "", 1700000007.75, paused=True)
    assert paused.fields("fish-1") == {"paused": True, "session": "fish-1", "ts": 1700000007.75}


def test_helper_completes_and_records(home: Path, daemon: Daemon, helper: HelperProcess) -> None:
    record(daemon, "git status")
    helper.complete(1, "git st")
    assert helper.final(1) == ["git status", "git stmmit", "git stmmand", "git stnfig", "git stpy"]
    helper.send("r", "2", lines.escape("/tmp/x"), "main", "1700000000.25", lines.escape("git st\\uff"))
    helper.complete(2, "git st", n=1)
    assert helper.final(2) == ["git st\\uff"]  # the record is stored before the next complete runs
    row = wait_recorded(home, "git st\\uff")
    assert (row.exit, row.cwd, row.git, row.ts, row.session) == (2, "/tmp/x", "main", 1700000000.25, "s-test")
    # A tab is a control character: stored as typed, never sent back to a shell.
    helper.send("r", "0", "/tmp", "", "", lines.escape("git st\tab"))
    wait_recorded(home, "git st\tab")
    helper.complete(3, "git st", n=2)
    assert helper.final(3) == ["git st\\uff"]


def test_helper_sends_the_environment_and_its_path_once(home: Path, daemon: Daemon) -> None:
    helper = HelperProcess(home, "--format", "2")
    try:
        helper.send("r", "0", "/tmp", "", "", "python -m venv .venv")  # typed before the env changed
        helper.send("e", lines.escape("/home/u/proj/.venv"), "")
        helper.send("r", "0", "/tmp", "", "", "pip install -e .")
        helper.complete2(1, "pip")
        helper.final(1)
        assert wait_recorded(home, "python -m venv .venv").env == ""
        assert wait_recorded(home, "pip install -e .").env == "venv:proj"
        helper.send("e", "", "ml")  # deactivated, then a conda env
        helper.send("r", "0", "/tmp", "", "", "conda list")
        helper.complete2(2, "con")
        helper.final(2)
        assert wait_recorded(home, "conda list").env == "conda:ml"
    finally:
        assert helper.close() == 0

    def script(request: dict[str, Any]) -> Iterator[Any]:
        yield from candidates((request["ctx"]["input"] + "x", SURE))

    (home / "fake").mkdir()
    with FakeDaemon.at_home(home / "fake", script) as fake:
        helper = HelperProcess(home / "fake", "--format", "2")
        try:
            helper.send("e", lines.escape("/w/tools"), "")
            for seq in (1, 2):
                helper.complete2(seq, "ls")
                helper.final(seq)
            first, second = fake.wait_requests(2)[:2]
            assert first["ctx"]["env"] == second["ctx"]["env"] == "venv:tools"
            assert first["path"] == shell_env(home / "fake")["PATH"]
            assert "path" not in second  # once per connection
        finally:
            assert helper.close() == 0


def test_helper_streams_and_skips_superseded_requests(home: Path) -> None:
    with running_daemon(home, env={"CALMD_TEST_DELAY": "0.05"}):
        helper = HelperProcess(home)
        try:
            helper.complete(1, "slow")
            seq, final, cands = helper.reply()
            assert (seq, final, cands) == ("1", False, ["slowmmit"])  # sent as soon as it is known
            helper.complete(2, "new")  # the daemon cancels 1
            assert helper.final(2) == ["newmmit", "newmmand", "newnfig", "newpy", "newunt"]
        finally:
            helper.close()


def test_helper_without_daemon_answers_empty_and_keeps_records(home: Path) -> None:
    helper = HelperProcess(home)
    try:
        helper.complete(1, "git")
        assert helper.reply() == ("1", True, [])
        helper.send("r", "0", "/tmp", "", "", "echo offline")
        helper.complete(2, "x")
        assert helper.reply() == ("2", True, [])
        with running_daemon(home):
            helper.complete(3, "echo off")
            assert helper.final(3)[0] == "echo offline"  # the kept record went first
            helper.complete(4, "x")
            assert helper.final(4)
        # The daemon went away again: an empty answer, then back to normal with a new daemon.
        helper.complete(5, "x")
        assert helper.final(5) == []
        with running_daemon(home):
            helper.complete(6, "x", n=1)
            assert helper.final(6) == ["xmmit"]
    finally:
        assert helper.close() == 0
    assert "connected" in (home / "data" / paths.HELPER_LOG).read_text()


def test_disabled_flag(home: Path, daemon: Daemon, helper: HelperProcess) -> None:
    env = shell_env(home)
    out = subprocess.run([str(BIN / "calm"), "disable"], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert "disabled" in out.stdout
    assert (home / "data" / paths.DISABLED_FLAG).exists()
    helper.complete(1, "x")
    assert helper.reply() == ("1", True, [])
    helper.send("r", "0", "", "", "", "echo still-recorded")
    subprocess.run([str(BIN / "calm"), "enable"], env=env, capture_output=True, check=True)
    assert not (home / "data" / paths.DISABLED_FLAG).exists()
    helper.complete(2, "x", n=1)
    assert helper.final(2) == ["xmmit"]
    assert "echo still-recorded" in [r.cmd for r in history_rows(home)]


def test_helper_passes_the_early_answer_on_at_once_then_refines(home: Path) -> None:
    release, release_more = threading.Event(), threading.Event()

    def script(request: dict[str, Any]) -> Iterator[Any]:
        typed = request["ctx"]["input"]
        model = candidates((typed + " --model", SURE), (typed + " --less-sure", UNSURE))
        yield {"early": typed + " --from-history", "confidence": SURE}
        yield release  # the model's candidates wait until the early answer has been seen
        yield model[0]
        yield release_more  # and the rest until the model's best has been
        yield model[1]

    with FakeDaemon.at_home(home, script) as fake:
        helper = HelperProcess(home, "--format", "2")
        try:
            helper.complete2(1, "git")
            assert helper.reply2() == ("1", False, "1", ["git --from-history"])  # before any candidate
            assert fake.requests[0]["early"] is True
            release.set()
            assert helper.reply2() == ("1", False, "1", ["git --model"])  # the model's best, at once
            release_more.set()
            assert helper.reply2() == ("1", True, "10", ["git --model", "git --less-sure"])
        finally:
            assert helper.close() == 0


def test_helper_draws_the_head_the_daemon_says_and_keeps_the_line_for_cycling(home: Path) -> None:
    def script(request: dict[str, Any]) -> Iterator[Any]:
        typed = request["ctx"]["input"]
        line = typed + "un --rm -it alpine"
        head = typed + "un --rm -it "
        yield {"candidate": line, "score": -1.0, "confidence": 0.3, "ghost": True, "draw": head}
        yield {"candidate": typed + "un --rm -it ubuntu", "score": -1.2, "confidence": 0.3, "ghost": False}
        # a `draw` that is no head of its line (or does not extend the input) is not drawn
        yield {"candidate": typed + "m -f x", "score": -2.0, "confidence": 0.2, "ghost": False, "draw": "ls"}

    with FakeDaemon.at_home(home, script) as fake:
        helper = HelperProcess(home, "--format", "2")
        try:
            helper.complete2(1, "docker r")
            early, final = helper.until_final(1)
            assert final == ("1000", ["docker run --rm -it ", "docker run --rm -it alpine",
                                      "docker run --rm -it ubuntu", "docker rm -f x"])  # fmt: skip
            assert early in ([], [("1", ["docker run --rm -it "])])
            helper.complete2(2, "docker run --r")  # typed along the head: it is what is drawn
            helper.until_final(2)
            assert fake.requests[-1]["drawn"] == "docker run --rm -it "
        finally:
            assert helper.close() == 0


def test_helper_applies_the_confidence_threshold(home: Path) -> None:
    def script(request: dict[str, Any]) -> Iterator[Any]:
        typed = request["ctx"]["input"]
        yield {"early": typed + "-early", "confidence": UNSURE}
        yield from candidates((typed + "-a", UNSURE), (typed + "-b", SURE), (typed + "-a", SURE))

    with FakeDaemon.at_home(home, script):
        helper = HelperProcess(home, "--format", "2")
        try:
            # The default threshold (calmd.protocol): nothing sure enough comes early, no
            # duplicate, and the list says which candidate may be shown unasked.
            helper.complete2(1, "x")
            assert helper.until_final(1) == ([], ("01", ["x-a", "x-b"]))
            helper.complete2(2, "x", min_confidence=f"{UNSURE:.3f}")  # CALM_MIN_CONFIDENCE lower
            early, final = helper.until_final(2)
            assert final == ("11", ["x-a", "x-b"])
            # (a batch that holds the final answer goes out alone: what came before may be left out)
            assert early in ([], [("1", ["x-early"])], [("1", ["x-early"]), ("1", ["x-a"])])
            helper.complete2(3, "x", min_confidence="1")
            assert helper.until_final(3) == ([], ("00", ["x-a", "x-b"]))
            helper.complete2(4, "x", min_confidence="not a number")  # the default again
            assert helper.until_final(4) == ([], ("01", ["x-a", "x-b"]))
        finally:
            assert helper.close() == 0


def test_helper_with_an_older_daemon_shows_everything(home: Path) -> None:
    """No `early` message and no `confidence` field (a daemon from before them): every candidate
    counts as sure, as before."""

    def script(request: dict[str, Any]) -> Iterator[Any]:
        typed = request["ctx"]["input"]
        yield from candidates((typed + "1", None), (typed + "2", None))

    with FakeDaemon.at_home(home, script):
        helper = HelperProcess(home, "--format", "2")
        try:
            helper.complete2(1, "x", min_confidence="0.99")
            early, final = helper.until_final(1)
            assert final == ("11", ["x1", "x2"])
            assert early in ([], [("1", ["x1"])])
        finally:
            assert helper.close() == 0


def test_helper_for_a_hook_from_before_the_line_format(home: Path) -> None:
    """A shell still running the old hook whose helper an upgraded calmd restarts: old lines both
    ways, no early answer asked for."""

    def script(request: dict[str, Any]) -> Iterator[Any]:
        yield {"early": "never asked for", "confidence": 1.0}
        yield from candidates(("x1", UNSURE), ("x2", SURE))

    with FakeDaemon.at_home(home, script) as fake:
        helper = HelperProcess(home)
        try:
            helper.complete(1, "x")
            assert helper.final(1) == ["x1", "x2"]
            assert "early" not in fake.requests[0]
        finally:
            assert helper.close() == 0


def test_helper_on_a_read_write_fifo_sees_the_shell_go(home: Path, daemon: Daemon) -> None:
    """The hooks hand the helper its input as a FIFO they hold open read-write (so that neither
    side waits for the other) and remove at once. The helper reopens it read-only, so it still sees
    the shell go; what the shell wrote before going is not lost, even when it went before the
    helper ran."""
    fifo = home / "input.fifo"
    os.mkfifo(fifo, 0o600)
    shell_side = os.open(fifo, os.O_RDWR)
    fifo.unlink()
    proc = subprocess.Popen(
        [sys.executable, "-m", "calmd", "shell-helper", "--session", "s-fifo", "--format", "2"],
        stdin=shell_side, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=shell_env(home),
    )  # fmt: skip
    os.write(shell_side, b"r\t0\t/tmp\t\t\techo through-the-fifo\n")
    os.close(shell_side)  # the shell is gone, likely before the helper even started
    assert proc.wait(timeout=HANG_S) == 0  # end of file: it did not wait for its parent to go
    assert wait_recorded(home, "echo through-the-fifo").session == "s-fifo"


def test_helper_exits_when_the_shell_closes_its_pipe(home: Path) -> None:
    helper = HelperProcess(home)
    assert helper.close() == 0


@pytest.mark.parametrize("name", ["zsh", "bash"])
def test_init_script(home: Path, name: str) -> None:
    need(name)  # its syntax is checked by the shell itself
    out = subprocess.run(
        [sys.executable, "-m", "calmd", "init", name],
        env=shell_env(home), capture_output=True, text=True, check=True,
    )  # fmt: skip
    text = out.stdout
    assert "-m calmd shell-helper" in text
    assert str(home / "data" / paths.DISABLED_FLAG) in text
    assert text.endswith(hooks.script_path(name).read_text())
    syntax = subprocess.run([name, "-n"], input=text, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


@pytest.mark.parametrize("name", ["zsh", "bash"])
def test_init_keeps_the_hook_in_the_data_dir(home: Path, name: str) -> None:
    """For the setup line that sources it: the same text, owner-only, written once; a hook for
    another socket is printed, not kept (the file is what the setup line's `calmd init` gives)."""
    run = [sys.executable, "-m", "calmd", "init", name]
    out = subprocess.run(run, env=shell_env(home), capture_output=True, text=True, check=True).stdout
    hook = home / "data" / f"calm.{name}"
    assert hook.read_text() == out
    assert stat.S_IMODE(hook.stat().st_mode) == 0o600
    assert stat.S_IMODE(hook.parent.stat().st_mode) == 0o700
    first = hook.stat()
    subprocess.run(run, env=shell_env(home), capture_output=True, check=True)
    assert (hook.stat().st_ino, hook.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # untouched
    hook.unlink()
    other = [sys.executable, "-m", "calmd", "--socket", str(home / "other.sock"), "init", name]
    out = subprocess.run(other, env=shell_env(home), capture_output=True, text=True, check=True).stdout
    assert "other.sock" in out
    assert not hook.exists()


def test_hooks_of_earlier_versions_still_start_their_helper(home: Path) -> None:
    """Hook files cached by an earlier calmd run `python -m calmd.shell.helper ...`: the same CLI."""
    out = subprocess.run(
        [sys.executable, "-m", "calmd.shell.helper", "init", "bash"],
        env=shell_env(home), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "-m calmd shell-helper" in out.stdout  # and the hook it prints is the new one


def test_the_hooks_run_calmd_isolated_from_the_current_folder(tmp_path: Path) -> None:
    """`python -m calmd` imports the current folder's `calmd/` or `calmd.py` first: the hooks
    start this interpreter with `-I` when it still finds this calmd so (a virtual environment,
    as here), else with `-P` (a calmd found through PYTHONPATH or the user site, which `-I`
    ignores): both leave the current folder out."""
    quoted = shlex.quote(sys.executable)
    text = hooks.init_script("zsh")
    assert f"_CALM_HELPER=({quoted} -I -m calmd shell-helper --shell zsh)" in text
    assert f"_CALM_SEARCH=({quoted} -I -m calmd.shell.search_ui)" in text
    shadow = tmp_path / "clone"
    (shadow / "calmd").mkdir(parents=True)
    (shadow / "calmd" / "__init__.py").write_text("raise SystemExit('shadowed')\n")
    (shadow / "calmd.py").write_text("raise SystemExit('shadowed')\n")
    alt = tmp_path / "alt"  # a calmd that only PYTHONPATH reaches
    package = Path(shell_helper.__file__).resolve().parents[1]
    shutil.copytree(package, alt / "calmd", ignore=shutil.ignore_patterns("data", "__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(alt)}
    code = "import calmd, calmd.shell.hooks as h; print(calmd.__file__, h.python_command()[1])"

    def run(argv: list[str], cwd: Path) -> str:
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout

    where, flag = run([sys.executable, "-c", code], tmp_path).split()
    assert (Path(where).parent.parent, flag) == (alt, "-P")
    for option in ("-P", "-I"):
        found = run([sys.executable, option, "-c", "import calmd; print(calmd.__file__)"], shadow).strip()
        assert Path(found).parent.parent == (alt if option == "-P" else package.parent), option


def test_init_script_bakes_in_a_socket(home: Path) -> None:
    text = hooks.init_script("zsh", "/run/x y/calmd.sock")
    assert "--socket '/run/x y/calmd.sock'" in text


def test_the_cli_registers_the_shell_commands() -> None:
    from calmd.cli import calm_parser, calmd_parser

    assert calmd_parser().parse_args(["init", "zsh"]).func is hooks.cmd_init
    from calmd.cli import cmd_shell_helper  # bash's and zsh's helper, or fish's with --spool

    assert calmd_parser().parse_args(["shell-helper", "--session", "s"]).func is cmd_shell_helper
    assert calm_parser().parse_args(["enable"]).func is hooks.cmd_enable
    assert calm_parser().parse_args(["disable"]).func is hooks.cmd_disable
    assert calmd_parser().parse_args(["init", "fish"]).func is hooks.cmd_init
    with pytest.raises(SystemExit):
        calmd_parser().parse_args(["init", "tcsh"])


@pytest.mark.parametrize(
    ("module", "heavy"),
    [("calmd.shell.helper", ("torch", "numpy", "calmd.shell.client")), ("calmd.cli", ("torch", "numpy"))],
)
def test_what_every_shell_and_every_calm_command_imports_stays_light(
    module: str, heavy: tuple[str, ...]
) -> None:
    code = f"import sys, {module}; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
