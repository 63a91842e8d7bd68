"""Every artifact name in one place (issue 40): calmd/paths.py names every file calm keeps, ships or
listens on, and no other module of the package writes one of those names by hand (the quality panel
wrote `history.sqlite3` itself), so that renaming one is one edit and a grep finds every use."""

from __future__ import annotations

import ast
from pathlib import Path

from calmd import paths

PACKAGE = Path(paths.__file__).resolve().parent


def artifact_names() -> set[str]:
    """The file names paths.py defines: its upper-case string constants that name a file."""
    names = {value for name, value in vars(paths).items() if name.isupper() and isinstance(value, str)}
    return {name for name in names if "." in name or "-" in name} - {paths.APP}


def hand_written(path: Path, names: set[str]) -> list[str]:
    """`file:line: 'name'` for each string constant in `path` that is exactly one of `names`
    (docstrings, messages and comments that mention a name in a sentence are not constants equal to it)."""
    where = path.relative_to(PACKAGE.parent)
    constants = [
        node for node in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(node, ast.Constant)
    ]
    return [f"{where}:{node.lineno}: {node.value!r}" for node in constants if node.value in names]


def test_the_names_are_the_ones_calm_uses() -> None:
    names = artifact_names()
    # what README.md's "Where it keeps things" and the units name: a name dropped from paths.py fails here
    for expected in ("history.sqlite3", "shell.cwgt", "ranker.json", "sync.json", "sync.key", "calmd.sock",
                     "calmd.service", "calmd.socket", "default.cwgt"):  # fmt: skip
        assert expected in names, (expected, sorted(names))
    assert set(paths.DATA_FILES) >= {paths.HISTORY, paths.WEIGHTS, paths.SYNC_KEY, paths.SYNC_CONFIG}


def test_no_module_of_the_package_writes_an_artifact_name_by_hand() -> None:
    names = artifact_names()
    found = [hit for module in sorted(PACKAGE.rglob("*.py")) if module.name != "paths.py"
             for hit in hand_written(module, names)]  # fmt: skip
    assert not found, "use calmd.paths for these names:\n" + "\n".join(found)
