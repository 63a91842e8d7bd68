"""`calm replay`: the baselines answer from the past only, and the whole replay runs from the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calmd import paths
from calmd.cli import calm_main
from calmd.quality.anchor import ANCHOR_SYSTEM
from calmd.quality.systems import PastOnly
from calmd.quality.typist import keys_whole_line, keys_with_ghosts, keys_word_by_word
from calmd.suggest.ghost import next_word


def past_of(*commands: str) -> PastOnly:
    past = PastOnly()
    for c in commands:
        past.add(c)
    return past


def test_zsh_history_strategy_is_the_most_recent_match() -> None:
    past = past_of("git status", "git stash", "git status", "ls")
    assert past.suggest("zsh-autosuggestions:history", "git st") == ["git status", "git stash"]
    assert past.suggest("zsh-autosuggestions:history", "") == ["ls", "git status", "git stash"]


def test_match_prev_cmd_prefers_what_followed_the_previous_command() -> None:
    past = past_of("make", "make test", "make", "make install", "ls", "make")
    # after "make": "make install" followed it most recently, then "make test"
    assert past.suggest("zsh-autosuggestions:match_prev_cmd", "make ")[:2] == ["make install", "make test"]
    past.add("cd /")  # nothing ever followed "cd /": fall back to the most recent match
    assert past.suggest("zsh-autosuggestions:match_prev_cmd", "make ") == ["make install", "make test"]


def test_fish_strategy_is_the_most_frequent_match() -> None:
    past = past_of("git pull", "git push", "git pull", "git push", "git pull", "git prune")
    assert past.suggest("fish", "git p") == ["git pull", "git push", "git prune"]


def test_keystrokes_saved_counts_the_accept_key() -> None:
    # right after typing 2 of 10 characters: 3 keys (2 typed, 1 to accept), 7 saved
    assert keys_whole_line("git status", lambda p: "git status" if len(p) >= 2 else None) == 3
    assert keys_whole_line("git status", lambda p: None) == 10


def test_every_key_asks_with_the_line_drawn_so_far() -> None:
    """As the zsh client does: every change of the buffer sends a request, carrying the line drawn
    until then while it still extends the buffer (typed along, or a word of it taken)."""
    asked: list[tuple[str, str | None]] = []

    def request(typed: str, drawn: str | None) -> str | None:
        asked.append((typed, drawn))
        if drawn is not None:
            return drawn if typed != "git stas" else None  # kept while it fits
        return {"": "git status", "git stas": "git stash"}.get(typed)

    # "git " taken (1 key), "s", "t", "a" typed along the ghost (3), "s" leaves it (1): asked
    # without a drawn line at "git stas", which draws the whole command (1)
    assert keys_with_ghosts("git stash", request, words=True) == 6
    assert asked == [("", None), ("git ", "git status"), ("git s", "git status"), ("git st", "git status"),
                     ("git sta", "git status"), ("git stas", None)]  # fmt: skip
    asked.clear()
    # the whole-line user types along the ghost until it stops fitting, then takes the new one
    assert keys_with_ghosts("git stash", request, words=False) == 8 + 1
    assert asked[-1] == ("git stas", None) and len(asked) == 9


def test_without_a_ghost_every_key_asks_with_nothing_drawn() -> None:
    asked: list[tuple[str, str | None]] = []

    def request(typed: str, drawn: str | None) -> str | None:
        asked.append((typed, drawn))
        return "ls -la" if typed == "ls" else None

    assert keys_with_ghosts("ls -la", request, words=True) == 2 + 1  # "l", "s", then " -la" whole
    assert asked == [("", None), ("l", None), ("ls", None)]


def test_next_word_is_what_forward_word_accepts() -> None:
    assert next_word("it -m wip") == "it "  # the rest of the word under the cursor and its space
    assert next_word(" commit -m x") == " commit "  # a leading space comes along
    assert next_word("wip") == "wip"  # the last word: no space follows
    assert next_word("  x") == "  x"


def test_word_acceptance_takes_the_matching_words_then_types() -> None:
    # the ghost is always an older commit: its first three words are right, its message is not
    def suggest(prefix: str) -> str | None:
        return "git commit -m fix"

    cmd = "git commit -m wip"  # 17 characters
    # "git ", "commit ", "-m " accepted (3 keys); "fix" is not what follows: w, i, p typed (3 keys)
    assert keys_word_by_word(cmd, suggest) == 6
    assert keys_whole_line(cmd, suggest) == 17  # never the whole line: every character typed


def test_word_acceptance_takes_the_whole_line_when_it_is_shown() -> None:
    def suggest(prefix: str) -> str | None:
        return "git status" if len(prefix) >= 2 else "gx"

    # "gx": its word is not what follows, g and i typed; then the whole line: 3 keys either way
    assert keys_word_by_word("git status", suggest) == 3
    assert keys_whole_line("git status", suggest) == 3


def test_word_acceptance_follows_the_policy_even_when_a_word_costs_the_line() -> None:
    # the whole line shows only after "l" is typed; the word-accepting user takes "ls " at once
    # and never sees it again (the policy, not the best of both users)
    def suggest(prefix: str) -> str | None:
        return {"": "ls -la /var", "l": "ls -la /tmp"}.get(prefix)

    cmd = "ls -la /tmp"  # 11 characters
    assert keys_whole_line(cmd, suggest) == 2  # "l", then accept
    assert keys_word_by_word(cmd, suggest) == 1 + 8  # "ls ", then "-la /tmp" typed


def test_replay_reports_word_acceptance_for_every_system_with_one_policy(
    tmp_path: Path, tiny_weights: Path
) -> None:
    model = tiny_weights
    # every command is a new commit message: a lookup never has the line, but its words help
    history = tmp_path / "user5.txt"
    history.write_text("".join(f"git commit -m v{i:03d}\n" for i in range(80)))
    out = tmp_path / "replay.json"
    code = calm_main(["replay", str(history), "-m", str(model), "--positions", "10", "--typing", "5",
                      "--warmup", "20", "--json", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    totals = json.loads(out.read_text())["totals"]
    for system in ("zsh-autosuggestions:history", "zsh-autosuggestions:match_prev_cmd", "fish"):
        t = totals[system]
        assert t["typed_commands"] == 5 and t["typed_characters"] == 5 * 18
        # the previous commit is suggested from the empty prompt on: "git ", "commit ", "-m "
        # accepted, then "v", "0", "0" or so and the last digit typed: 7 keys of 18
        assert t["keystrokes_saved_lines"] == pytest.approx(0.0)
        assert t["keystrokes_saved_words"] == pytest.approx(1 - 7 / 18)
        # the baselines draw their suggestion always: what is drawn is what is suggested
        assert t["keystrokes_saved_words_drawn"] == t["keystrokes_saved_words"]
        assert t["keystrokes_saved_lines_drawn"] == t["keystrokes_saved_lines"]
    calmd = totals["calmd"]
    assert 0.0 <= calmd["keystrokes_saved_words"] <= 1.0
    assert 0.0 <= calmd["keystrokes_saved_words_drawn"] <= 1.0


def test_replay_cli_scores_calmd_and_baselines_on_the_same_queries(
    tmp_path: Path, tiny_weights: Path
) -> None:
    model = tiny_weights
    # a strictly periodic history: after warm-up, "what followed the previous command" is always right
    cycle = ["cd proj", "git status", "make test", "ls -la"]
    history = tmp_path / "user1.txt"
    history.write_text("\n".join(cycle * 30) + "\n")
    out = tmp_path / "replay.json"
    code = calm_main(["replay", str(history), "-m", str(model), "--positions", "12", "--typing", "4",
                      "--warmup", "20", "--json", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    totals = result["totals"]
    assert set(totals) == {
        "calmd",
        ANCHOR_SYSTEM,  # the learned ranker over the history alone, beside calmd by default
        "zsh-autosuggestions:history",
        "zsh-autosuggestions:match_prev_cmd",
        "fish",
    }
    queries = {s: t["queries"] for s, t in totals.items()}
    assert len({json.dumps(q, sort_keys=True) for q in queries.values()}) == 1  # the same queries for all
    assert totals["calmd"]["queries"]["0"] == 12
    assert totals["zsh-autosuggestions:match_prev_cmd"]["top1"]["0"] == 1.0
    assert totals[ANCHOR_SYSTEM]["top1"]["0"] == 1.0  # what followed the previous line, learned
    assert totals["zsh-autosuggestions:history"]["top1"]["0"] == 0.0  # the last command never repeats
    assert totals["calmd"]["top1"]["0"] == 1.0  # the follows-previous signal finds it too
    assert totals["calmd"]["keystrokes_saved"] > 0.5
    assert totals["calmd"]["seen_before"]["0"] == 1.0  # after warm-up every line is a repeat


def test_replay_reports_coverage_and_precision_at_the_confidence_threshold(
    tmp_path: Path, tiny_weights: Path
) -> None:
    model = tiny_weights
    # a loop (predictable: shown and right) broken by new lines (unpredictable: not shown)
    lines: list[str] = []
    for i in range(60):
        lines += ["git status", "make test", "ls -la"] + ([f"vim notes{i}.txt"] if i % 2 else [])
    history = tmp_path / "user4.txt"
    history.write_text("\n".join(lines) + "\n")
    out = tmp_path / "replay.json"
    code = calm_main(["replay", str(history), "-m", str(model), "--positions", "40", "--typing", "4",
                      "--warmup", "30", "--json", str(out), "--quiet",
                      "--min-confidence", "0.5"])  # fmt: skip
    assert code == 0
    calmd = json.loads(out.read_text())["totals"]["calmd"]
    # after a `v`, the loop's lines are never wanted: a new vim line comes, and it gets no ghost
    coverage, precision = calmd["coverage"]["1"], calmd["precision"]["1"]
    assert 0.0 < coverage < 1.0
    assert precision > calmd["top1"]["1"]  # what is shown is right more often than the top-1 overall
    sweep = calmd["sweep"]
    covered = [sweep[t]["0"][0] for t in sorted(sweep, key=float)]
    assert covered == sorted(covered, reverse=True)  # a higher threshold shows fewer ghosts
    assert [sweep["0.5"][k][0] for k in ("0", "1", "2")] == [calmd["coverage"][k] for k in ("0", "1", "2")]
    assert 0.0 <= calmd["keystrokes_saved_drawn"] <= 1.0


def test_replay_reports_the_history_ceiling_that_bounds_every_baseline(
    tmp_path: Path, tiny_weights: Path
) -> None:
    model = tiny_weights
    # every third command is new (an ever-growing counter), the others repeat the two before
    lines: list[str] = []
    for i in range(40):
        lines += [f"vim notes{i}.txt", "git status", "make test"]
    history = tmp_path / "user3.txt"
    history.write_text("\n".join(lines) + "\n")
    out = tmp_path / "replay.json"
    code = calm_main(["replay", str(history), "-m", str(model), "--positions", "30", "--typing", "0",
                      "--warmup", "10", "--json", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    totals = json.loads(out.read_text())["totals"]
    seen = totals["calmd"]["seen_before"]
    for k in ("0", "1", "2", "4", "8"):
        # the ceiling is a property of the queries, not of who answers them
        assert {t["seen_before"][k] for t in totals.values()} == {seen[k]}
        for system in ("zsh-autosuggestions:history", "zsh-autosuggestions:match_prev_cmd", "fish"):
            assert totals[system]["top1"][k] <= totals[system]["top5"][k] <= seen[k]
    # k = 0: about two thirds of the sampled lines are repeats, never all, never none
    assert 0.4 < seen["0"] < 0.9
    # k = 8: all three are longer than 8 characters and the vim lines are always new
    assert 0.0 < seen["8"] < 1.0


def test_replay_with_training_runs_the_background_trainer(tmp_path: Path, tiny_weights: Path) -> None:
    model = tiny_weights
    history = tmp_path / "user2.txt"
    history.write_text("\n".join(f"echo {i % 40}" for i in range(130)) + "\n")
    out = tmp_path / "replay.json"
    argv = ["replay", str(history), "-m", str(model), "--positions", "5", "--typing", "0", "--warmup", "100",
            "--with-training", "--train-every", "60", "--json", str(out), "--quiet"]  # fmt: skip
    assert calm_main(argv) == 0
    calmd = json.loads(out.read_text())["totals"]["calmd"]
    assert calmd["training_runs"] >= 1  # after commands 60 and 120 (positions run up to 129)


def test_replay_with_comp_scores_calmd_with_the_reconstructed_disk_too(tmp_path: Path) -> None:
    model = paths.packaged_weights()  # the tiny test model cannot read a file name: it knows 4 commands
    # files made early, each opened once much later: no history lookup (nor the carry-over of the
    # previous command's argument) can know the `vim` line, the reconstruction of the disk can
    words = "alpha bravo delta echo golf hotel india juliet kilo lima mike oscar papa quebec romeo sierra"
    names = [f"{w}.md" for w in words.split()]
    lines = [f"touch {name}" for name in names]
    lines += [line for name in names[::-1] for line in (f"vim {name}", "ls")]
    history = tmp_path / "user1.txt"
    history.write_text("\n".join(lines) + "\n")
    out = tmp_path / "replay.json"
    code = calm_main(["replay", str(history), "-m", str(model), "--positions", "16", "--typing", "6",
                      "--warmup", "20", "--comp", "--json", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    totals = json.loads(out.read_text())["totals"]
    assert "calmd+comp" in totals and totals["calmd+comp"]["queries"] == totals["calmd"]["queries"]
    ours = totals["calmd+comp"]
    # COMP was there for most queries (not at k=0: no word begun) and held the word typed for the
    # `vim alph` ones (k=8: the one file), not for `v`/`vi` (six commands of the vocabulary) nor for
    # `vim ` (the first six files): the reconstruction knew what `touch` made, and no more
    assert 0.5 < ours["comp_filled"] < 1 and 0.2 < ours["comp_held_the_word"] < 0.5
    assert "comp_filled" not in totals["calmd"]


def test_replay_compares_several_models_on_the_same_queries(
    tmp_path: Path, tiny_weights: Path, other_tiny_weights: Path
) -> None:
    (tmp_path / "good").mkdir()
    good = tmp_path / "good" / "weights.cwgt"  # named after its folder, as in /work/models/<name>/
    good.write_bytes(tiny_weights.read_bytes())
    # another model, which learned other lines
    other = other_tiny_weights
    cycle = ["cd proj", "git status", "make test", "ls -la"]
    history = tmp_path / "user6.txt"
    history.write_text("\n".join(cycle * 30) + "\n")
    out = tmp_path / "replay.json"
    code = calm_main(["replay", str(history), "-m", str(good), "-m", str(other), "--positions", "8",
                      "--typing", "2", "--warmup", "20", "--json", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    totals = result["totals"]
    assert list(totals)[:2] == ["calmd:good", "calmd:other"]
    assert result["models"] == {"calmd:good": str(good), "calmd:other": str(other)}
    for system in ("calmd:good", "calmd:other"):
        t = totals[system]
        assert t["queries"] == totals["fish"]["queries"]  # every model answered every query
        assert t["latency_ms"]["queries"] == sum(t["queries"].values())
        assert 0 < t["latency_ms"]["done_p50"] <= t["latency_ms"]["done_p99"]
    # one model alone gives the same figures in a run of its own: the models do not interfere
    alone = tmp_path / "alone.json"
    assert calm_main(["replay", str(history), "-m", str(other), "--positions", "8", "--typing", "2",
                      "--warmup", "20", "--json", str(alone), "--quiet"]) == 0  # fmt: skip
    single = json.loads(alone.read_text())["totals"]["calmd"]
    for key in ("top1", "top5", "keystrokes_saved", "keystrokes_saved_words"):
        assert single[key] == totals["calmd:other"][key]


def test_compared_models_are_named_after_their_folder_or_file() -> None:
    from calmd.quality.replay import model_names

    names = model_names([Path("/m/nano-comp/model.cwgt"), Path("calmd/data/default.cwgt"),
                         Path("/m/micro/weights.cwgt"), Path("/n/micro/weights.cwgt")])  # fmt: skip
    assert list(names) == ["calmd:nano-comp", "calmd:default", "calmd:micro", "calmd:micro-2"]
    assert names["calmd:micro-2"] == Path("/n/micro/weights.cwgt")


def test_the_mixtures_parts_are_replayed_alone(tmp_path: Path, tiny_weights: Path) -> None:
    # a strictly periodic history: what followed the previous command is always right, and the
    # tiny model knows none of `cd proj`, `ls -la`
    history = tmp_path / "user1.txt"
    history.write_text("\n".join(["cd proj", "git status", "make test", "ls -la"] * 30) + "\n")
    top1: dict[str, dict[str, float]] = {}
    for arm in ("history", "model", "mixture"):
        out = tmp_path / f"{arm}.json"
        code = calm_main(["replay", str(history), "-m", str(tiny_weights), "--positions", "12",
                          "--typing", "0", "--warmup", "20", "--ranker", arm, "--json", str(out),
                          "--quiet"])  # fmt: skip
        assert code == 0
        result = json.loads(out.read_text())
        assert result["ranker"] == arm
        top1[arm] = result["totals"]["calmd"]["top1"]
    assert top1["history"]["0"] == top1["mixture"]["0"] == 1.0
    assert top1["model"]["0"] <= 0.5  # it cannot write half of the loop's lines


@pytest.mark.slow  # refits the ranker after every 60 commands (7 s)
def test_the_learning_curve_compares_the_refitted_ranker_with_the_packaged_one(
    tmp_path: Path, tiny_weights: Path
) -> None:
    from tests.training.test_ranker_refit import rounds

    history = tmp_path / "rounds.txt"
    history.write_text("\n".join(rounds(100)) + "\n")  # a habit the packaged ranker misses
    out = tmp_path / "curve.json"
    argv = ["replay", str(history), "-m", str(tiny_weights), "--ranker", "history", "--positions", "600",
            "--typing", "3", "--warmup", "200", "--with-training", "--refit", "ranker",
            "--train-every", "200", "--json", str(out), "--quiet"]  # fmt: skip
    assert calm_main(argv) == 0
    totals = json.loads(out.read_text())["totals"]
    learnt, packaged = totals["calmd"], totals["calmd:packaged"]
    assert learnt["queries"] == packaged["queries"] and learnt["queries"]["0"] == 600
    assert learnt["training_runs"] == 3 and packaged["training_runs"] == 0  # after 200, 400, 600
    # the stretches: before the first run nothing is asked (the warm-up), then 200 commands each
    assert [p["queries"]["0"] for p in learnt["curve"]] == [0, 200, 200, 200]
    assert sum(p["typed_commands"] for p in learnt["curve"]) == learnt["typed_commands"] == 3
    for point in (learnt, *learnt["curve"][1:]):
        assert point["top1"]["0"] is not None
    assert learnt["top1"]["0"] > packaged["top1"]["0"] + 0.03  # the refit learnt the habit


@pytest.mark.slow  # spawns a process per user, each importing torch (5 s)
def test_parallel_users_give_the_same_figures(tmp_path: Path, tiny_weights: Path) -> None:
    for n, cycle in enumerate((["cd proj", "git status", "make test"], ["ls -la", "vim notes.txt"])):
        (tmp_path / f"user{n}.txt").write_text("\n".join(cycle * 20 + ["git stash pop"] + cycle * 10) + "\n")
    results = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}.json"
        argv = ["replay", str(tmp_path), "-m", str(tiny_weights), "--ranker", "history", "--positions", "20",
                "--typing", "4", "--jobs", jobs, "--json", str(out), "--quiet"]  # fmt: skip
        assert calm_main(argv) == 0
        results.append(json.loads(out.read_text()))
    serial, parallel = ({s: {k: v for k, v in t.items() if k != "latency_ms"} for s, t in r["totals"].items()}
                        for r in results)  # fmt: skip
    assert serial == parallel and serial["calmd"]["queries"]["0"] == 20 + 11  # user1: 11 past the warm-up
    assert list(results[1]["per_user"]) == ["user0", "user1"]  # in the files' order, whoever finished first


def test_the_cli_offers_every_part_and_refit() -> None:
    import argparse

    from calmd.cli import calm_parser
    from calmd.quality.replay import REFITS
    from calmd.suggest.engine import PARTS

    commands = next(a for a in calm_parser()._actions if isinstance(a, argparse._SubParsersAction))
    replay = commands.choices["replay"]
    choices = {a.dest: a.choices for a in replay._actions if a.dest in ("ranker", "refit")}
    assert tuple(choices["ranker"] or ()) == PARTS and tuple(choices["refit"] or ()) == REFITS
