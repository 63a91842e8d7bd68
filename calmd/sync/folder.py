"""What a glance at the sync folder tells before this machine takes part in it (`calm sync
--folder`): the other machines there, and the keys their shares say they are sealed with (each
segment's header names its key by its id, calmd/sync/seal.py `key_id`: a machine whose key reads
none of them would only write a share no other machine can read, and read nothing)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from calmd.sync.config import SyncError
from calmd.sync.seal import HOST_ID, SEGMENT_NAME, key_id, peek_header

HEADERS_TRIED = 8  # a machine's newest files looked at for a header (junk named like segments aside)


def other_machines(folder: Path, own: str) -> list[str]:
    """The other machines whose share the folder holds (their sub-folders)."""
    try:
        return sorted(n for n in os.listdir(folder) if HOST_ID.match(n) and n != own)
    except OSError:
        return []


def share_key(host_dir: Path) -> bytes | None:
    """The key id a machine's share says it is sealed with: the header of its newest segment that
    has one (where it lies: its host and number), None when none of its newest files has one."""
    try:
        names = os.listdir(host_dir)
    except OSError:
        return None
    numbered = sorted(
        ((int(m.group(1)), m.group(0)) for m in map(SEGMENT_NAME.match, names) if m), reverse=True
    )
    for seq, name in numbered[:HEADERS_TRIED]:
        header = peek_header(host_dir / name)
        if header is not None and header.host.hex() == host_dir.name and header.seq == seq:
            return header.key_id
    return None


def check_key_reads(folder: Path, own: str, key: bytes) -> None:
    """SyncError unless `key` reads the other machines' shares in the folder: at least one is sealed
    with it (while a new key travels, some still carry the old one), or none says. The error names
    the key expected by its id (never the key)."""
    keys = Counter(k for k in (share_key(folder / host) for host in other_machines(folder, own)) if k)
    if not keys or key_id(key) in keys:
        return
    said = ", ".join(f"{k.hex()} ({n} machine{'s' * (n != 1)})" for k, n in keys.most_common())
    raise SyncError(
        f"{folder}: the other machines' shares there are sealed with key{'s' * (len(keys) != 1)} {said}, "
        "not this machine's "
        f"({key_id(key).hex()}): it could read none of them, and they none of its. Bring their key "
        "(`calm sync key --show` on one of them, `calm sync key --import` here), then run this again"
    )
