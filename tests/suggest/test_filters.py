"""What is never suggested: unbalanced lines, invented subcommands and flags, the cwd pasted in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calmd.errors import FormatError
from calmd.quality.fit_vocabulary import build, edits, main
from calmd.suggest.filters import (
    UserVocabulary,
    Vocabulary,
    balanced,
    cut_off,
    cwd_argument,
    invented,
    packaged_vocabulary,
    repeats_word,
    segments,
)


@pytest.mark.parametrize(
    "line",
    [
        'git commit -m "fix login redirect"',
        'echo "it\'s fine"',
        "awk '{print $1}' file.txt",
        'echo $(ls "a b") `date`',
        "[[ -f x ]] && echo ok",
        'echo "${HOME}/x"',
        "echo it\\'s",
        "ls # a comment with an ' apostrophe",
        "find . -name '*.[ch]'",
    ],
)
def test_balanced_lines(line: str) -> None:
    assert balanced(line)


@pytest.mark.parametrize(
    "line",
    [
        "awk '{print ${PASSWORD}",  # the examples
        'git commit -m "fix main',
        "echo $(ls",
        "sudo nvim /etc/fstab]",
        'echo "$(date"',
        "rm -rf {",
        "echo `whoami",
    ],
)
def test_unbalanced_lines(line: str) -> None:
    assert not balanced(line)


def test_segments_skip_prefix_commands_and_assignments() -> None:
    assert [s for _, s in segments(["sudo", "-E", "FOO=1", "make", "install", "&&", "git", "push"])] == [
        ["make", "install"],
        ["git", "push"],
    ]


def test_packaged_vocabulary_knows_invented_subcommands_and_flags() -> None:
    v = packaged_vocabulary()
    # the examples
    assert invented("git stash status", "git st", v) == "'status' never seen after git stash"
    assert invented("systemctl restics", "sys", v) == "'restics' never seen after systemctl"
    assert invented("git status -a", "git status", v) == "flag -a never seen after git status"
    assert invented("tar -xzf .", "tar", v) == "'.' never seen after tar -xzf"
    # what is real stays
    real = ("git stash pop", "systemctl restart nginx", "git status -s", "ls -lahtr", "git add .", "code .",
            "sudo systemctl status docker", "docker compose up -d", "kubectl get pods")  # fmt: skip
    for line in real:
        assert invented(line, "", v) is None, line
    # commands whose next word is a file or a host are not judged on it
    assert invented("cd newproj", "cd", v) is None
    assert invented("ssh myhost", "ssh", v) is None
    assert invented("frobnicate --whatever", "", v) is None  # a command the corpus does not know


def test_what_the_user_typed_is_theirs() -> None:
    v = packaged_vocabulary()
    assert invented("git stash status", "git stash status", v) is None  # typed in full
    assert invented("git stash status -v", "git stash status ", v) is None
    assert invented("git stash status", "git stash sta", v) is not None  # only partly typed


def test_the_users_own_history_vouches_for_a_token() -> None:
    v = packaged_vocabulary()
    user = UserVocabulary()
    assert invented("git stash status", "git", v, user) is not None
    user.add("git stash status")  # say, an alias of theirs
    assert invented("git stash status", "git", v, user) is None
    user.add("ls -Z")
    assert invented("ls -lZ", "ls", v, user) is None  # a bundle of letters that are all known


def test_the_cwd_pasted_in_as_an_argument() -> None:
    home = "/home/u"
    assert cwd_argument("kubectl ~/src/api-server", "kub", "/home/u/src/api-server", home)
    assert cwd_argument("ls /home/u/src/api-server/", "ls", "/home/u/src/api-server", home)
    assert not cwd_argument("kubectl get pods", "kub", "/home/u/src/api-server", home)
    assert not cwd_argument(
        "cd ~/src/api-server", "cd ~/src/api-server", "/home/u/src/api-server", home
    )  # typed
    assert not cwd_argument("ls /", "ls", "/", home)  # the root is no pasted path


def test_build_needs_tldr_or_two_users_and_judges_only_subcommand_taking_commands() -> None:
    sources = [
        ("tldr", ["tool start", "tool stop"] * 10),
        ("u1", ["tool restart", "tool start -v"] * 10 + [f"open file{i}" for i in range(30)]),
        ("u2", ["tool restart"] * 5 + ["open file0"]),
        ("u3", ["tool typo"]),
    ]
    v = build(sources)
    assert v.known["tool"] == {"start", "stop", "restart"}  # typo: one user only
    assert "tool" in v.judged
    assert "open" not in v.judged  # its next word is anything: not judged
    assert "tool -" in v.judged and "tool -" not in v.known  # -v: one user only
    assert invented("tool typo", "", v) is not None
    assert invented("tool start -v", "", v) == "flag -v never seen after tool"


def test_the_same_slip_by_two_users_is_still_a_slip() -> None:
    sources = [
        ("tldr", ["tool start"] * 30),
        ("u1", ["tool status"] * 40 + ["tool statu"]),
        ("u2", ["tool status"] * 40 + ["tool statu", "tool stop"]),
        ("u3", ["tool stop", "ls -l"] * 30),
    ]
    v = build(sources)
    assert v.known["tool"] == {"start", "status", "stop"}  # `statu`: two users, 40 times rarer
    assert invented("tool statu", "", v) == "'statu' never seen after tool"
    assert edits("barnch", "branch", 2) == 1 and edits("statu", "status", 2) == 1
    assert edits("commit", "status", 2) == 3  # over the limit: limit + 1


def test_vocabulary_file_round_trip_and_errors(tmp_path: Path) -> None:
    v = build([("tldr", ["tool start"] * 30)])
    again = Vocabulary.from_json(json.loads(json.dumps(v.to_json())))
    assert again.known == v.known and again.judged == v.judged
    with pytest.raises(FormatError, match="not a calm-vocabulary"):
        Vocabulary.from_json({"format": "other"})
    with pytest.raises(FormatError, match="version"):
        Vocabulary.from_json({**v.to_json(), "version": 99})
    bad = tmp_path / "v.json"
    bad.write_text("{")
    with pytest.raises(FormatError, match="cannot read"):
        Vocabulary.load(bad)


def test_building_command_writes_a_loadable_vocabulary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    (data / "tldr" / "common").mkdir(parents=True)
    (data / "tldr" / "common" / "tool.md").write_text("# tool\n\n- Start:\n\n`tool start {{name}}`\n")
    users = data / "histories" / "users"
    users.mkdir(parents=True)
    for name in ("alice", "bob", "carol", "dave", "erin", "frank"):
        (users / f"{name}.txt").write_text("tool start\ntool stop\n" * 20)
    out = tmp_path / "vocabulary.json"
    assert main(["--data", str(data), "--output", str(out)]) == 0
    v = Vocabulary.load(out)
    assert "tool" in v.judged and {"start", "stop"} <= v.known["tool"]
    assert v.info["training_users"] >= 2 and "wrote" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("line", "cut"),
    [
        ("make to", True),  # `make tools` is what the user types
        ("git log --one", True),  # a flag cut in the middle
        ("git sta", True),
        ("make tools", False),
        ("git log --oneline", False),
        ("git commit -m wip", False),  # a message is nobody's vocabulary
        ("ls -la", False),
        ("docker ps -a", False),
    ],
)
def test_a_line_that_stops_in_the_middle_of_a_word_is_cut_off(line: str, cut: bool) -> None:
    user = UserVocabulary()
    user.add("make tools")
    assert cut_off(line, packaged_vocabulary(), user) is cut


@pytest.mark.parametrize(
    ("line", "repeats"),
    [("make test test", True), ("git git status", True), ("make test", False), ("cp a b a", False)],
)
def test_a_word_written_twice_in_a_row_is_a_stutter(line: str, repeats: bool) -> None:
    assert repeats_word(line) is repeats
