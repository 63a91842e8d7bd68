"""The simulated users of `calm replay` (calmd/quality/replay.py): how many keys a person
types to enter a command with a system's suggestions, and what the screen showed them.

- whole-line acceptance (`keys_whole_line`): the user types the command one character at a time
  and accepts the top suggestion (one key) as soon as it is the whole command;
- word acceptance (`keys_word_by_word`), as zsh-autosuggestions' and fish's forward-word: at each
  state, one key accepts the top suggestion when it is the whole command; else one key accepts
  the suggestion's next word (up to and including the following space) when the command
  continues with it; else the user types one character;
- the same users with only the ghosts a shell draws (`keys_with_ghosts`), as calm's zsh client
  asks: a request at every change of the buffer, carrying the line drawn so far; `Screen`
  counts the states with a ghost drawn and those showing a wrong one.
Enter is not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

from calmd.suggest.ghost import next_word


@dataclass
class Screen:
    """What the word-by-word user of the drawn ghosts saw (`keys_with_ghosts`): each state is a
    buffer the user passed through while typing a command out (after the answer to its request);
    a ghost is drawn there when the shell shows text past the cursor, and it is wrong when its
    next word is not what the user types next (they read past it)."""

    states: int = 0
    drawn: int = 0
    wrong: int = 0

    def add(self, other: Screen) -> None:
        self.states += other.states
        self.drawn += other.drawn
        self.wrong += other.wrong

    def see(self, cmd: str, typed: str, ghost: str | None) -> None:
        self.states += 1
        if not extends(ghost, typed):
            return
        self.drawn += 1
        self.wrong += not right_next_word(cmd, typed, ghost)

    def to_json(self) -> dict[str, Any]:
        return {
            "states": self.states, "drawn": self.drawn, "wrong": self.wrong,
            "drawn_share": self.drawn / self.states if self.states else None,
            "wrong_of_drawn": self.wrong / self.drawn if self.drawn else None,
            "wrong_share": self.wrong / self.states if self.states else None,
        }  # fmt: skip


def ghost_replaced(before: str | None, after: str | None) -> bool:
    """Whether drawing `after` where `before` was drawn replaces it: the ghost goes, or says
    something else (a ghost that grows or shrinks along its own text is the same ghost)."""
    if before is None:
        return False
    return after is None or not (after.startswith(before) or before.startswith(after))


def right_next_word(cmd: str, typed: str, ghost: str) -> bool:
    """Whether the ghost's next word (`next_word`, without the space after it) is what the user
    types next: `cmd` goes on with it, then with a space or its end."""
    word = next_word(ghost[len(typed) :]).rstrip(" ")
    end = len(typed) + len(word)
    return bool(word) and cmd.startswith(word, len(typed)) and (end == len(cmd) or cmd[end] == " ")


Suggest = Callable[[str], "str | None"]  # typed prefix -> the top suggestion (a whole line) or None


def keys_whole_line(cmd: str, suggest: Suggest) -> int:
    """Keys to enter `cmd` typing it character by character and accepting (one key) the top
    suggestion as soon as it is the whole command. Enter is not counted."""
    for typed in range(len(cmd)):
        if suggest(cmd[:typed]) == cmd:
            return typed + 1
    return len(cmd)


def extends(line: str | None, typed: str) -> TypeGuard[str]:
    """Whether `line` shows something past the cursor: it starts with `typed` and goes on."""
    return line is not None and len(line) > len(typed) and line.startswith(typed)


Request = Callable[[str, "str | None"], "str | None"]  # (buffer, line drawn now) -> line drawn after


def keys_with_ghosts(cmd: str, request: Request, words: bool, screen: Screen | None = None) -> int:
    """Keys to enter `cmd` with the ghosts a zsh client draws: `request(typed, drawn)` is the line
    drawn after the request every change of the buffer sends (None: nothing), `drawn` the line
    shown until then when it still extends the buffer (the user typed along it, or took a word
    of it: the daemon keeps it unless it is clearly beaten). The user accepts the ghost when it
    is the whole command (one key), else (`words`) its next word when the command continues with
    it, else types one character. Enter is not counted. `screen` counts what was drawn at each
    state."""
    typed, keys = "", 0
    ghost: str | None = None
    while len(typed) < len(cmd):
        keys += 1
        still = ghost if extends(ghost, typed) else None
        ghost = request(typed, still)
        if screen is not None:
            screen.see(cmd, typed, ghost)
        if ghost == cmd:
            return keys
        if words and extends(ghost, typed):
            word = next_word(ghost[len(typed) :])
            if cmd.startswith(word, len(typed)):
                typed += word
                continue
        typed = cmd[: len(typed) + 1]
    return keys


def keys_word_by_word(cmd: str, suggest: Suggest) -> int:
    """Keys to enter `cmd` (Enter not counted) for a user who, at each state, accepts the top
    suggestion when it is the whole command (one key), else accepts its next word when the
    command continues with that word (one key), else types the next character (one key): the
    ghosts' user, with the suggestion for each buffer whatever was drawn before."""
    return keys_with_ghosts(cmd, lambda typed, _drawn: suggest(typed), words=True)
