# calm.fish: command suggestions and the history search from calmd, for fish. Loaded from
# ~/.config/fish/config.fish by the setup line of docs/shells.md, which sources the copy
# `calmd init fish` keeps in the data dir (or its output).
#
# fish keeps no file descriptor open between commands, so the shell helper (`calmd shell-helper
# --spool DIR`, one per shell, the same as bash's and zsh's) reads its requests from files the
# hook writes into a private folder with the builtin printf (never blocking the shell), and
# answers Shift-Tab through a FIFO there, read with `timeout` (calmd/shell/spool.py). Records
# come from fish's events: fish_preexec (the line, its folder and branch as typed) and
# fish_postexec ($status, $CMD_DURATION); with CALM_RECORD=0, only that a command ran then (`p`:
# fish writes the line to its own history, which the daemon imports). Shift-Tab (CALM_KEY) inserts
# the best candidate and cycles as in bash; Ctrl-R (CALM_SEARCH_KEY) opens `calm search`. fish's
# own autosuggestion is left alone: fish offers no supported way for a plugin to feed it.
# `calmd init` sets _CALM_HELPER, _CALM_SEARCH and _CALM_DISABLED_FILE before this file.

status is-interactive; or return 0
set -q _CALM_LOADED; and return 0
set -g _CALM_LOADED 1

# Options: set only what the user has not set.
set -q CALM_KEY; or set -g CALM_KEY \e\[Z
set -q CALM_MAX_CANDIDATES; or set -g CALM_MAX_CANDIDATES 5
set -q CALM_MIN_LENGTH; or set -g CALM_MIN_LENGTH 1
set -q CALM_PREDICT; or set -g CALM_PREDICT 1
set -q CALM_RECORD; or set -g CALM_RECORD 1
set -q CALM_AUTOSTART; or set -g CALM_AUTOSTART 0
set -q CALM_TIMEOUT; or set -g CALM_TIMEOUT 1
set -q CALM_SEARCH; or set -g CALM_SEARCH 1
set -q CALM_SEARCH_KEY; or set -g CALM_SEARCH_KEY \cr

set -g _calm_session fish-(string split -m 1 . -- $hostname)[1]-$fish_pid-(random)
set -g _calm_dir ''
set -g _calm_pid 0
set -g _calm_retry 0  # prompts until a helper that went away is started again
set -g _calm_said 0  # the one line saying the helper cannot run was printed
set -g _calm_seq 0
set -g _calm_cmd ''
set -g _calm_cmd_cwd ''
set -g _calm_cmd_git ''
set -g _calm_ran 0
set -g _calm_env \1
set -g _calm_cands
set -g _calm_flags ''
set -g _calm_idx 0
set -g _calm_cycling 0
set -g _calm_typed ''
set -g _calm_inserted ''

# --------------------------------------------------------------------------- the helper

# Whether the helper runs (or is starting: it reads what was written before it started). One
# that exited and that fish has not reaped yet is a zombie: state Z, after its name's `)`.
function _calm_alive
    test -n "$_calm_dir" -a -d "$_calm_dir"; or return 1
    test -d /proc; or return 0
    read -l stat </proc/$_calm_pid/stat 2>/dev/null; or return 1
    not string match -q '* Z *' -- (string replace -r '.*\)' '' -- $stat)
end

# Say once per shell, in one line, why calm is off in it: the helper cannot start, or stopped
# (its errors go nowhere: running the command shows them). The shell goes on without calm.
function _calm_say
    test $_calm_said = 1; and return
    set -g _calm_said 1
    printf 'calm: no suggestions or recording in this shell: %s\n' $argv[1] >&2
end

# Start the helper (at a prompt; after it went away, at every tenth prompt only).
function _calm_start
    _calm_alive; and return 0
    if test $_calm_pid -ne 0  # it ran, and exited
        set -l helper (string join ' ' -- (string escape -- $_CALM_HELPER))
        _calm_say "its helper stopped (`$helper --spool DIR` shows why)"
    end
    if not test -x "$_CALM_HELPER[1]"  # the Python calmd was installed with is gone
        _calm_say "$_CALM_HELPER[1] is not there (`calmd init fish` writes the hook for the calmd you have now)"
        return 1
    end
    if test $_calm_retry -gt 0
        set -g _calm_retry (math $_calm_retry - 1)
        return 1
    end
    set -g _calm_retry 10
    test -n "$_calm_dir"; and command rm -rf -- $_calm_dir
    set -g _calm_dir (command mktemp -d (string trim -r -c / -- (set -q TMPDIR; and echo $TMPDIR; or echo /tmp))/calm-fish.XXXXXX 2>/dev/null)
    or return 1
    # the answers' FIFO, made now: a key pressed while the helper starts waits for it (CALM_TIMEOUT)
    command mkfifo -m 600 $_calm_dir/reply 2>/dev/null
    # the helper watches this fish by its pid (it goes when fish does, and removes the folder)
    set -l argv_ $_CALM_HELPER --format 2 --session $_calm_session --shell-pid $fish_pid --spool $_calm_dir
    test "$CALM_AUTOSTART" = 1; and set -a argv_ --autostart
    command $argv_ </dev/null >/dev/null 2>&1 &
    set -g _calm_pid $last_pid
    disown $last_pid 2>/dev/null
    set -g _calm_env \1  # a new helper knows no environment yet: the next prompt sends it
    return 0
end

# $argv escaped for the line protocol: backslash, newline and tab written \\ \n \t.
function _calm_esc
    set -l s (string replace -a -- '\\' '\\\\' $argv[1] | string collect)
    set s (string replace -a -- \n '\n' "$s")
    string replace -a -- \t '\t' "$s"
end

# Write lines to the helper: one new file in its folder (a regular file: never blocks).
function _calm_send
    test -n "$_calm_dir" -a -d "$_calm_dir"; or return 1
    set -g _calm_seq (math $_calm_seq + 1)
    printf '%s\n' $argv >$_calm_dir/$_calm_seq
end

# The branch (or short commit) of the repository around $PWD, read from .git/HEAD.
function _calm_git_branch
    set -l dir $PWD
    set -l gitdir ''
    while true
        if test -d "$dir/.git"
            set gitdir $dir/.git
            break
        else if test -f "$dir/.git"
            read -l head <$dir/.git
            set gitdir (string replace 'gitdir: ' '' -- $head)
            string match -q '/*' -- $gitdir; or set gitdir $dir/$gitdir
            break
        end
        test "$dir" = / -o -z "$dir"; and return
        set dir (string replace -r '/[^/]*$' '' -- $dir)
        test -z "$dir"; and set dir /
    end
    test -r $gitdir/HEAD; or return
    read -l head <$gitdir/HEAD
    if string match -q 'ref: refs/heads/*' -- $head
        string replace 'ref: refs/heads/' '' -- $head
    else
        string sub -l 7 -- $head
    end
end

# --------------------------------------------------------------------------- recording

function _calm_preexec --on-event fish_preexec
    set -g _calm_cmd $argv[1]
    set -g _calm_cmd_cwd $PWD
    set -g _calm_cmd_git (_calm_git_branch)
    set -g _calm_ran 1
end

function _calm_postexec --on-event fish_postexec
    set -l ret $status
    set -l took $CMD_DURATION
    test "$_calm_ran" = 1; or return
    set -g _calm_ran 0
    string match -qr '^\s' -- $_calm_cmd; and return  # a line starting with a space is not kept
    string length -q -- (string trim -- $_calm_cmd); or return
    _calm_start; or return
    set -l secs (math --scale 3 "$took / 1000")
    if test "$CALM_RECORD" != 1
        # Paused: fish keeps the line in its own history all the same. The daemon is told when it
        # ran, and nothing else, so that no import of that file brings it back.
        _calm_send (string join \t -- p '' $secs)
        return
    end
    set -l cwd (_calm_esc "$_calm_cmd_cwd")
    set -l git (_calm_esc "$_calm_cmd_git")
    set -l cmd (_calm_esc "$_calm_cmd")
    # no start time: the helper takes now minus the seconds it ran
    _calm_send (string join \t -- r $ret "$cwd" "$git" '' "$cmd" $secs)
end

function _calm_prompt --on-event fish_prompt
    _calm_start; or return
    set -l env "$VIRTUAL_ENV"\t"$CONDA_DEFAULT_ENV"
    if test "$env" != "$_calm_env"
        set -g _calm_env $env
        set -l venv (_calm_esc "$VIRTUAL_ENV")
        set -l conda (_calm_esc "$CONDA_DEFAULT_ENV")
        _calm_send (string join \t -- e "$venv" "$conda")
    end
    set -g _calm_cycling 0
end

# --------------------------------------------------------------------------- Shift-Tab

function _calm_set_line
    commandline -r -- "$argv[1]"
    commandline -C (string length -- "$argv[1]")
end

# First press: the best candidate for the line, if it is sure enough; again: the next one (the
# less sure ones too), then back to what was typed. As bash's CALM_KEY (docs/shells.md).
function _calm_key
    set -l line (commandline -b | string collect)
    set -l n (count $_calm_cands)
    if test "$_calm_cycling" = 1 -a "$line" = "$_calm_inserted" -a $n -gt 0
        set -g _calm_idx (math "($_calm_idx + 1) % ($n + 1)")
        if test $_calm_idx -eq $n
            _calm_set_line "$_calm_typed"
        else
            set -l k (math $_calm_idx + 1)
            _calm_set_line "$_calm_cands[$k]"
        end
        set -g _calm_inserted (commandline -b | string collect)
        return
    end
    set -g _calm_cycling 0
    set -g _calm_inserted ''
    set -g _calm_typed "$line"
    test -n "$_CALM_DISABLED_FILE" -a -e "$_CALM_DISABLED_FILE"; and return
    if test -z "$line"
        test "$CALM_PREDICT" = 1; or return
    else if test (string length -- $line) -lt $CALM_MIN_LENGTH
        return
    end
    _calm_alive; or return
    set -l cwd (_calm_esc "$PWD")
    set -l git (_calm_git_branch)
    set -l input (_calm_esc "$line")
    _calm_send (string join \t -- c (math $_calm_seq + 1) $CALM_MAX_CANDIDATES "$cwd" "$git" "$CALM_MIN_CONFIDENCE" "$input")
    set -l seq $_calm_seq
    set -l reply (command timeout $CALM_TIMEOUT cat $_calm_dir/reply 2>/dev/null | string split0)
    test "$reply[1]" = "$seq" -a "$reply[2]" = 1; or return
    set -l flags $reply[3]
    set -g _calm_cands
    set -g _calm_flags ''
    set -l i 0
    for cand in $reply[4..]
        set i (math $i + 1)
        if test "$cand" != "$line"; and string match -q -- "$line*" $cand
            set -a _calm_cands $cand
            set -l flag (string sub -s $i -l 1 -- "$flags")
            set -g _calm_flags "$_calm_flags$flag"
        end
    end
    test (count $_calm_cands) -gt 0; or return
    set -g _calm_cycling 1
    if test (string sub -l 1 -- $_calm_flags) = 1
        set -g _calm_idx 0
        _calm_set_line "$_calm_cands[1]"
    else
        set -g _calm_idx -1  # not sure enough: the next press brings the first candidate
    end
    set -g _calm_inserted (commandline -b | string collect)
end

# --------------------------------------------------------------------------- history search (Ctrl-R)

# CALM_SEARCH_KEY (Ctrl-R) opens `calm search` (calmd/shell/search_ui.py) over the whole history,
# ranked by calmd; it prints `run` or `edit` and the line chosen. When no daemon answers (its
# status 3) or it cannot start, fish's own history search opens: Ctrl-R never waits on a daemon
# that is not there. CALM_SEARCH=0 leaves the key alone.
function _calm_search
    set -l out (command $_CALM_SEARCH --session $_calm_session -- (commandline -b | string collect) </dev/tty 2>/dev/null | string collect)
    set -l ret $pipestatus[1]
    switch $ret
        case 0
            set -l parts (string split -m 1 \n -- "$out")
            _calm_set_line "$parts[2]"
            commandline -f repaint
            test "$parts[1]" = run; and commandline -f execute
        case 1
            commandline -f repaint  # Esc: the line as it was
        case '*'
            if contains history-pager (bind --function-names)
                commandline -f history-pager
            else
                commandline -f history-search-backward
            end
    end
end

# --------------------------------------------------------------------------- keys

bind $CALM_KEY _calm_key
bind -M insert $CALM_KEY _calm_key 2>/dev/null
if test "$CALM_SEARCH" = 1 -a -n "$CALM_SEARCH_KEY"; and set -q _CALM_SEARCH[1]
    bind $CALM_SEARCH_KEY _calm_search
    bind -M insert $CALM_SEARCH_KEY _calm_search 2>/dev/null
end
return 0  # sourced: its status says it loaded (the setup line's `or` runs calmd init otherwise)
