"""One history across machines: sealed segments in a folder that another program replicates.

calmd never talks to the network. Each machine writes its share of the history into a folder the
user names (`calm sync --folder DIR`) and reads the other machines' shares from it; whatever
replicates the folder (Syncthing, a cloud drive, NFS, rsync, git) is the engine (docs/sync.md).

The folder: one sub-folder per machine, named by its random sync id (16 hex digits, made once,
kept in the store's meta), holding numbered segments `00000001.calm`, `00000002.calm`, ... (0700,
0600). A machine writes only in its own sub-folder, so no two machines ever write the same file
and an engine's conflict copies (any other name) are never read.

The rooms:

    config.py    sync.json (folder, mode, git remote, interval), SyncError, the sync lock
    seal.py      the key (its phrase and id) and the segment format: header, sealed chunks, opening
    wire.py      what a chunk holds: manifests, records, forgets (parsed with every field checked)
    state.py     the machine's state in the store, a run's report
    export.py    this machine's share: its check, sealing again, merging, rewriting, the writer
    import_.py   the others' shares: read newest first, refused whole or stored
    machine.py   Sync: a run (export, the engine, import) under the lock; its status
    engines.py   what replicates the folder (git, driven from here)
    folder.py    a glance at the folder before joining it: the machines there, the keys they name
    leave.py     `calm forget --all`'s part: this machine leaves sync

It sits above calmd/history (it reads and writes the store) and below calmd/daemon and calmd/cli,
which run it. Only what the store kept is shared (it passed the credential detector when it was
recorded), and what arrives passes this machine's detector again before it is stored.
"""
