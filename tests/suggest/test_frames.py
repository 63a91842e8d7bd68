"""The context frames (calmd/suggest/frames.py) and the file-system reconstruction that feeds COMP
in the corpus and the replay (calmd/suggest/reconstruct.py)."""

from __future__ import annotations

from pathlib import Path

from calmd.daemon.comp_state import SessionComp
from calmd.formats.tokenizer import DEFAULT_SHELL_TEMPLATE, Special, build_sequence, parse_sequence
from calmd.suggest.disk import Disk
from calmd.suggest.frames import (
    COMP_ITEMS,
    VocabularyFollowers,
    clean_env,
    comp_cut,
    completions,
    context_frames,
    current_word,
    served_completions,
    short_env,
)
from calmd.suggest.reconstruct import Reconstruction, named_paths
from calmd.training.corpus import CompSources, history_examples


def listing(*names: str) -> tuple[str, ...]:
    return tuple(sorted(names))


ENTRIES = listing("build/", "notes.md", "node_modules/", ".git/", ".env", "Makefile", "src/")


def lister(directory: str) -> tuple[str, ...] | None:
    return {"": ENTRIES, "src": listing("main.py", "mod/")}.get(directory)


def test_cwd_entries_extend_the_word_directories_marked() -> None:
    assert completions("cd b", lister=lister) == ["build/"]
    assert completions("vim no", lister=lister) == ["node_modules/", "notes.md"]
    assert completions("cd no", lister=lister) == ["node_modules/"]  # cd lists directories only
    assert completions("cat src/m", lister=lister) == ["src/main.py", "src/mod/"]
    assert completions("ls ", lister=lister) == ["Makefile", "build/", "node_modules/", "notes.md", "src/"]
    assert completions("ls .", lister=lister) == [".env", ".git/"]  # hidden only when asked for
    assert completions("cd dist", lister=lister) == []
    assert completions("vim ~/no", lister=lister) == []  # never expanded


def test_first_word_is_a_command_and_the_rest_follows_the_vocabulary() -> None:
    commands = ("gcc", "git", "gitk", "grep")
    assert completions("gi", commands=commands) == ["git", "gitk"]
    assert completions("", commands=commands) == []  # an empty first word: nothing worth saying
    assert completions("ls | gr", commands=commands) == ["grep"]  # a new simple command
    follow = VocabularyFollowers({"git": {"checkout", "commit", "config"}},
                                 {"git": {"clone", "commit"}, "git -": {"--version"}}, static=1)  # fmt: skip
    assert completions("git co", followers=follow) == ["commit", "config"]  # the user's first
    assert completions("sudo git cl", followers=follow) == ["clone"]
    assert completions("git --v", followers=follow) == ["--version"]
    # subcommands take half the frame when files extend the word too
    many = completions("git ", followers=follow, lister=lister)
    assert len(many) == COMP_ITEMS and many[:3] == ["checkout", "commit", "config"]


def test_credentials_in_file_names_never_reach_the_frame() -> None:
    def leaky(directory: str) -> tuple[str, ...]:
        return listing("ghp_abcdefghijklmnopqrstuvwxyz0123456789AB.txt", "notes.md")

    assert completions("cat ", lister=leaky) == ["notes.md"]
    assert clean_env("venv:ghp_abcdefghijklmnopqrstuvwxyz0123456789AB") == ""


def test_the_stored_cut_is_a_prefix_inside_a_word_and_stable() -> None:
    for cmd in ["vim notes.md", "git commit -m 'x'", "make", "cd build"]:
        cut = comp_cut(cmd)
        assert cmd.startswith(cut) and cut and cut == comp_cut(cmd)
        words, word = current_word(cut)
        assert word  # one or two bytes into a word
        assert len(words) >= 1 or cmd == "make"
    assert comp_cut("") == ""


def test_env_short_form() -> None:
    assert short_env("/home/u/proj/.venv") == "venv:proj"
    assert short_env("/home/u/envs/tools") == "venv:tools"
    assert short_env("", "base") == ""
    assert short_env("/p/.venv", "ml") == "venv:p conda:ml"
    assert len(clean_env("x" * 500)) == 64


def test_frames_go_into_the_sequence_in_template_order() -> None:
    ctx = context_frames(cwd="/w", history=[("ls", 0)], completions=["build/", "notes.md"], env="venv:w")
    seq = build_sequence(DEFAULT_SHELL_TEMPLATE, {**ctx, "input": "cd build"}, training=True)
    assert Special.COMP in seq.tolist() and Special.ENV in seq.tolist()
    back = parse_sequence(seq)
    assert back.fields["completions"] == ["build/", "notes.md"]
    assert back.fields["env"] == "venv:w"
    assert context_frames(completions=["a"] * 30)["completions"] == ["a"] * COMP_ITEMS
    assert context_frames() == {}


def test_reconstruction_follows_what_commands_create_name_and_remove() -> None:
    disk = Reconstruction()
    for cmd in ["mkdir -p build src/lib", "touch notes.md", "echo hi > out.txt", "git clone https://x/y/repo.git",
                "vim src/main.py", "cp notes.md backup/", "rm out.txt", "cd /etc", "cat *.log"]:  # fmt: skip
        disk.add(cmd)
    assert disk.listing("") == ("backup/", "build/", "notes.md", "repo/", "src/")
    assert disk.listing("src") == ("lib/", "main.py")
    assert not disk.has("out.txt") and disk.has("notes.md")
    both = [("build", True, "create"), ("build", True, "name")]
    assert list(named_paths("mkdir build && cd build")) == both
    disk.add("source .venv/bin/activate")
    assert disk.env == "venv:.venv"  # no project name in a history without cwd: the folder's
    disk.add("deactivate")
    assert disk.env == ""
    disk.add("conda activate ml")
    assert disk.env == "conda:ml"


def test_history_examples_carry_comp_from_earlier_commands_not_the_created_file() -> None:
    sources = CompSources(("ls", "make", "mkdir", "vim"), VocabularyFollowers({}))
    cmds = ["touch notes.md", "vim notes.md", "mkdir build", "mkdir bin"]
    examples = {e.cmd: e for e in history_examples(cmds, sources=sources)}
    assert comp_cut("vim notes.md") == "vim n"
    assert examples["vim notes.md"].fields["completions"] == ["notes.md"]
    # `mkdir bin` was typed when build/ existed and bin/ did not
    comp = examples["mkdir bin"].fields.get("completions", [])
    assert "bin/" not in comp
    assert all(e.fields.get("env", "") == "" for e in examples.values())


def test_served_completions_are_what_the_daemon_serves_a_user_typing_byte_by_byte(tmp_path: Path) -> None:
    # The replay and the probes compute, without a session, the frame the daemon keeps per session:
    # computed when a word is begun, kept while an item still extends it, else computed again.
    for name in ["build/", "bin/", "notes.md", "node_modules/", "Makefile", "main.py", "mod/"]:
        (tmp_path / name.rstrip("/")).mkdir() if name.endswith("/") else (tmp_path / name).touch()

    def followers(words: object) -> list[str]:
        return ["status", "stash", "show", "--short", "--stat"]

    disk = Disk(budget=5.0)  # no keystroke may go without its listing here
    try:
        frames = SessionComp(disk)
        cwd = str(tmp_path)
        for cmd in ["vim notes.md", "cd build", "cd bi", "git status --short", "ls no", "vim m", "make "]:
            for end in range(1, len(cmd) + 1):
                ctx: dict[str, object] = {"input": cmd[:end], "cwd": cwd}
                frames.fill(ctx, "s", followers)
                served = served_completions(cmd[:end], lister=disk.lister(cwd), followers=followers)
                assert ctx.get("completions", []) == served, cmd[:end]
        # kept, not recomputed: at `vim notes` the frame is the one made at `vim n` (two items)
        assert served_completions("vim notes", lister=disk.lister(cwd)) == ["node_modules/", "notes.md"]
        assert completions("vim notes", lister=disk.lister(cwd)) == ["notes.md"]
    finally:
        disk.close()
