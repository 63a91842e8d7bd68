"""The credential detector: recall on the test corpus and on the held-out corpus (written before
issue 39's rules, never tuned on), look-alikes dropped, commands flagged in the public histories,
cost per command and on hostile 64 KiB lines; the new detector against the older ones (as of
OLD_COMMITS, read from git) and, when installed, detect-secrets' plugins, in the same run.

    .venv/bin/python bench/secrets_scan.py                 # new vs old (+ detect-secrets if installed)
    .venv/bin/python bench/secrets_scan.py --show-flagged  # print what each flags in the histories
    .venv/bin/python bench/secrets_scan.py --ds-sample 0   # detect-secrets on every command (slow)

detect-secrets is not a calmd dependency (docs/secrets.md says why); `pip install
detect-secrets==1.5.0` into the venv to include it. It runs as `detect-secrets scan` runs a file:
its default plugins and filters over each command as one line of a file named history.sh.
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from calmd.arguments import Parser, run_tool  # noqa: E402
from calmd.secrets import find_secret  # noqa: E402

# The detector as a package (calmd/secrets/, since issue 39): read from git whole.
PACKAGE_COMMITS = {"before round 5": "5598eae"}  # issue 39's fifth round
OLD_COMMITS = {"before issue 39": "578f0c0", "before issue 30": "ffe7a68", "before issue 23": "ad7d2a1",
               "before issue 12": "aa4422d"}  # fmt: skip
CORPUS = REPO / "tests" / "data" / "secrets"
# the public histories: $CALM_SHARED_DATA, beside the checkout, or where this project's machines
# mount them (the places tests/support/tools.py looks)
HISTORIES = next(
    (
        base / "histories" / "users"
        for base in (
            *([Path(os.environ["CALM_SHARED_DATA"])] if os.environ.get("CALM_SHARED_DATA") else []),
            REPO.parent / "shared" / "data",
            Path("/work/shared/data"),
        )
        if (base / "histories" / "users").is_dir()
    ),
    REPO.parent / "shared" / "data" / "histories" / "users",
)

Detector = Callable[[str], "str | None"]
_KEEP: list[object] = []


def old_detector(commit: str) -> Detector:
    """find_secret as of `commit` (the module lived in calmd/ before the package had floors)."""
    for where in ("calmd/history/secrets.py", "calmd/secrets.py"):
        shown = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{where}"],
                               capture_output=True, text=True)  # fmt: skip
        if shown.returncode == 0:
            break
    else:
        raise SystemExit(f"no detector at {commit}: {shown.stderr.strip()}")
    module = types.ModuleType(f"old_secrets_{commit}")
    sys.modules[module.__name__] = module  # (its dataclasses look their module up)
    exec(compile(shown.stdout, f"{commit}:{where}", "exec"), module.__dict__)
    return module.find_secret


def old_package(commit: str) -> Detector:
    """find_secret of the calmd/secrets package as of `commit`, imported under a name of its own
    (`git archive` into a temporary folder, its `calmd.secrets` imports renamed)."""
    name = f"old_secrets_{commit}"
    folder = Path(tempfile.mkdtemp(prefix="calm-secrets-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "calmd/secrets"],
                             capture_output=True, check=True)  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    package = folder / name
    (folder / "calmd" / "secrets").rename(package)
    for module in package.glob("*.py"):
        module.write_text(module.read_text().replace("calmd.secrets", name))
    sys.path.insert(0, str(folder))
    return importlib.import_module(name).find_secret  # type: ignore[no-any-return]


def detect_secrets_detector() -> Detector | None:
    try:
        from detect_secrets.core.scan import _process_line_based_plugins
        from detect_secrets.settings import default_settings
    except ImportError:
        return None
    settings = default_settings()
    settings.__enter__()  # for the whole run
    _KEEP.append(settings)  # collected, it would restore empty settings (no plugins)

    def scan(cmd: str) -> str | None:
        for secret in _process_line_based_plugins(lines=[(1, cmd)], filename="history.sh"):
            return str(secret.type)
        return None

    return scan


def load_corpus(name: str) -> list[tuple[str, str]]:
    rows = []
    for line in (CORPUS / name).read_text().splitlines():
        if line and not line.startswith("#"):
            kind, _, cmd = line.partition("\t")
            rows.append((kind, cmd))
    return rows


def public_commands() -> Iterator[str]:
    for path in sorted(HISTORIES.glob("*.txt")):
        yield from path.read_text(errors="surrogateescape").splitlines()


def timed(detector: Detector, commands: list[str]) -> tuple[list[float], list[tuple[str, str]]]:
    """Per-command cost in microseconds, and the (rule, command) pairs flagged."""
    costs: list[float] = []
    flagged: list[tuple[str, str]] = []
    clock = time.perf_counter_ns
    for cmd in commands:
        start = clock()
        rule = detector(cmd)
        costs.append((clock() - start) / 1e3)
        if rule:
            flagged.append((rule, cmd))
    return costs, flagged


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


# The record limit's worst shapes for the rules: each repeated to 64 KiB.
HOSTILE_UNITS = ["a=", "-p ", "'a'", "x:y@", "--password=", "AKIA", "k" * 19 + " ", "echo x | ", "<(", "( ",
                 "-----BEGIN RSA PRIVATE KEY----- ab", "auth=('a', ", "-u a -p b ", "-K 0a1b2c3d ",
                 "input_pw x ", "--user a:b ", "a:b@c ", "https://h/hooks/", "?k=", "$(", "\"a b\" ",
                 "password: ", "QUJD", "a/B+c", "calm sync key ", "cat <<'E'\nA=1\n"]  # fmt: skip


def hostile(detectors: dict[str, Detector]) -> None:
    """The slowest of HOSTILE_UNITS at 64 KiB, for each detector (detect-secrets left out)."""
    print("\nhostile 64 KiB lines: the slowest shape, seconds")
    for name, detect in detectors.items():
        if name == "detect-secrets":
            continue
        worst = (0.0, "")
        for unit in HOSTILE_UNITS:
            cmd = (unit * (65536 // len(unit)))[:65536]
            start = time.perf_counter()
            detect(cmd)
            worst = max(worst, (time.perf_counter() - start, unit))
        print(f"  {name:16s} {worst[0]:.3f} s  ({worst[1]!r})")


PROG = "bench/secrets_scan.py"


def main() -> int:
    parser = Parser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ds-sample", type=int, default=20_000,
                        help="public commands for detect-secrets (every Nth; 0: all, ~4 min)")  # fmt: skip
    parser.add_argument("--show-flagged", action="store_true", help="print every flagged public command")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds (best median kept)")
    args = parser.parse_args()

    detectors: dict[str, Detector] = {"new": find_secret}
    detectors |= {name: old_package(commit) for name, commit in PACKAGE_COMMITS.items()}
    detectors |= {name: old_detector(commit) for name, commit in OLD_COMMITS.items()}
    ds = detect_secrets_detector()
    if ds is not None:
        detectors["detect-secrets"] = ds
    corpora = (("corpus", "credentials.tsv", "lookalikes.tsv"),
               ("held-out corpus", "holdout.tsv", "holdout_lookalikes.tsv"))  # fmt: skip
    for title, secret_file, harmless_file in corpora:
        credentials = load_corpus(secret_file)
        lookalikes = load_corpus(harmless_file)
        print(f"{title}: {len(credentials)} credentials, {len(lookalikes)} look-alikes")
        for name, detect in detectors.items():
            missed = Counter(kind for kind, cmd in credentials if not detect(cmd))
            dropped = Counter(kind for kind, cmd in lookalikes if detect(cmd))
            print(f"  {name:16s} recall {len(credentials) - sum(missed.values())}/{len(credentials)}"
                  f"  look-alikes dropped {sum(dropped.values())}/{len(lookalikes)}")  # fmt: skip
            if missed:
                print(f"  {'':15s} missed by class: {dict(missed.most_common())}")
            if dropped:
                print(f"  {'':15s} dropped by kind: {dict(dropped.most_common())}")
    hostile(detectors)

    if not HISTORIES.is_dir():
        print(f"{HISTORIES} not found: no public-history figures")
        return 0
    commands = list(public_commands())
    print(f"\npublic histories: {len(commands):,} commands")
    medians: dict[str, float] = {}
    for name, detect in detectors.items():
        sample = commands
        if name == "detect-secrets" and args.ds_sample:
            sample = commands[:: max(1, len(commands) // args.ds_sample)]
        rounds = 1 if name == "detect-secrets" else args.rounds
        best: tuple[list[float], list[tuple[str, str]]] | None = None
        for _ in range(rounds):
            costs, flagged = timed(detect, sample)
            if best is None or statistics.median(costs) < statistics.median(best[0]):
                best = (costs, flagged)
        assert best is not None
        costs, flagged = best
        medians[name] = statistics.median(costs)
        rules = Counter(rule for rule, _ in flagged)
        print(f"  {name:16s} flagged {len(flagged):,} of {len(sample):,} ({len(flagged) / len(sample):.2e})"
              f"   per command: median {medians[name]:.1f} us, p99 {p99(costs):.1f} us,"
              f" mean {statistics.fmean(costs):.1f} us")  # fmt: skip
        print(f"  {'':15s} rules: {dict(rules.most_common(8))}")
        if args.show_flagged:
            for rule, cmd in flagged:
                print(f"      {rule:22s} {cmd[:150]}")
    for name in [*PACKAGE_COMMITS, *OLD_COMMITS]:
        print(f"\nmedian cost new/{name}: {medians['new'] / medians[name]:.2f}x")
    if "detect-secrets" in medians:
        print(f"median cost detect-secrets/new: {medians['detect-secrets'] / medians['new']:.0f}x")
    for settings in _KEEP:
        settings.__exit__(None, None, None)  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from bench.harness import with_machine_line

    raise SystemExit(run_tool(PROG, with_machine_line(main)))
