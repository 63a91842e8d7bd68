# calm.bash: command suggestions from calmd. Loaded, last in ~/.bashrc, by the setup line of
# docs/shells.md, which evals the copy `calmd init bash` keeps in the data dir (or its output).
#
# Readline offers no hook per keystroke, so bash gets a key instead of ghost text: CALM_KEY
# (Shift-Tab) puts the best candidate for the line into READLINE_LINE, pressing it again cycles
# through the others and back to what was typed; on an empty line it offers the predicted next
# command. One helper process per shell (`calmd shell-helper`) holds the daemon connection.
# `calmd init` sets _CALM_HELPER and _CALM_DISABLED_FILE before this file. Options: docs/shells.md.

[[ $- == *i* ]] || return 0
[[ -n ${_CALM_LOADED-} ]] && return 0
(( BASH_VERSINFO[0] >= 5 )) || return 0  # EPOCHREALTIME, {fd} redirections
_CALM_LOADED=1

# Options: set only what the user has not set.
: "${CALM_KEY=\e[Z}"
: "${CALM_MAX_CANDIDATES=5}"
: "${CALM_MIN_LENGTH=1}"
: "${CALM_PREDICT=1}"
: "${CALM_RECORD=1}"
: "${CALM_AUTOSTART=0}"
: "${CALM_TIMEOUT=1}"

_CALM_SESSION="bash-${HOSTNAME%%.*}-$$-$EPOCHSECONDS"
_CALM_WFD= _CALM_RFD= _CALM_STARTED_AT=0 _CALM_SEQ=0 _CALM_PRED_SEQ=-1 _CALM_OFF=0
_CALM_ARMED=0 _CALM_NEXT_HIST=0 _CALM_CMD= _CALM_TS= _CALM_BRANCH= _CALM_BRANCH_DIR=
_CALM_CMD_CWD= _CALM_CMD_GIT= _CALM_ENV=
_CALM_TYPED= _CALM_INSERTED= _CALM_IDX=0 _CALM_CYCLING=0
_CALM_CANDS=() _CALM_FLAGS= _CALM_PRED=() _CALM_PRED_FLAGS= _CALM_PRED_READY=0
_CALM_SAID=0 _CALM_GONE=0  # the one line saying the helper cannot run was printed; it exited

# --------------------------------------------------------------------------- the helper

_calm_start() {
  [[ -n $_CALM_WFD ]] && return 0
  (( EPOCHSECONDS - _CALM_STARTED_AT < 10 )) && return 1
  _CALM_STARTED_AT=$EPOCHSECONDS
  if [[ ! -x ${_CALM_HELPER[0]} ]]; then  # the Python calmd was installed with is gone
    _calm_say "${_CALM_HELPER[0]} is not there (\`calmd init bash\` writes the hook for the calmd you have now)"
    return 1
  fi
  _calm_pipe || return 1
  # The helper gets the pipe as stdin (it reopens it read-only, to see the shell go). The
  # terminal's hangup does not stop it: it goes when the shell does.
  _CALM_ENV=$'\1'  # a new helper knows no environment yet: the next prompt sends it
  local argv=("${_CALM_HELPER[@]}" --format 2 --session "$_CALM_SESSION")
  (( CALM_AUTOSTART )) && argv+=(--autostart)
  exec {_CALM_RFD}< <(trap '' HUP; exec 2>/dev/null "${argv[@]}" <&"$_CALM_WFD" {_CALM_WFD}>&-)
}

# Say once per shell, in one line, why calm is off in it: the helper cannot start, or stopped
# (its errors go nowhere: running the command shows them). The shell goes on without calm.
_calm_say() {
  (( _CALM_SAID )) && return
  _CALM_SAID=1
  printf 'calm: no suggestions or recording in this shell: %s\n' "$1" >&2
}

# The helper's replies ended: it exited. Said at the next prompt (not in the middle of a key).
_calm_gone() {
  _calm_stop
  _CALM_GONE=1
}

# _CALM_WFD: a pipe of which the shell holds both ends (read-write), so that opening it waits for
# no one and writing to it never meets a pipe without a reader (an interactive bash would die of
# SIGPIPE). On Linux: a process substitution's pipe reopened read-write through /proc (one fork,
# no exec, no file); elsewhere a FIFO, removed once open.
_calm_pipe() {
  local t fifo=${TMPDIR:-/tmp}/calm-$UID-$$-$RANDOM
  if [[ -d /proc/self/fd ]]; then
    exec {t}< <(:)
    { exec {_CALM_WFD}<>"/proc/self/fd/$t"; } 2>/dev/null
    exec {t}<&-
  elif command mkfifo -m 600 -- "$fifo" 2>/dev/null; then
    { exec {_CALM_WFD}<>"$fifo"; } 2>/dev/null
    command rm -f -- "$fifo"
  fi
  [[ -n $_CALM_WFD ]]
}

_calm_stop() {
  [[ -n $_CALM_RFD ]] && exec {_CALM_RFD}<&-
  [[ -n $_CALM_WFD ]] && exec {_CALM_WFD}>&-
  _CALM_RFD= _CALM_WFD=
}

# REPLY = $1 with backslash, newline and tab escaped (the helper's line format).
_calm_esc() {
  REPLY=${1//\\/\\\\}
  REPLY=${REPLY//$'\n'/\\n}
  REPLY=${REPLY//$'\t'/\\t}
}

# Write $1 to the helper, in the shell itself (no subshell: see _calm_pipe). Should the helper die,
# its replies end: _calm_drain, which runs before every write, stops there, so what goes unread is
# one line at most.
_calm_write() {
  [[ -n $_CALM_WFD ]] || return 1
  printf '%s' "$1" >&"$_CALM_WFD" 2>/dev/null || _calm_stop
}

# Throw away replies nobody waits for any more.
_calm_drain() {
  local line
  while [[ -n $_CALM_RFD ]] && read -t 0 -u "$_CALM_RFD" 2>/dev/null; do
    IFS= read -r -u "$_CALM_RFD" line || { _calm_gone; return; }
  done
}

# _CALM_CANDS = the candidates of the final reply to request $1 (wait up to CALM_TIMEOUT), and
# _CALM_FLAGS one character per candidate: 1 when it is sure enough to be inserted first.
_calm_collect() {
  local line rest status
  _CALM_CANDS=() _CALM_FLAGS=
  while [[ -n $_CALM_RFD ]]; do
    IFS= read -r -t "$CALM_TIMEOUT" -u "$_CALM_RFD" line
    status=$?
    if (( status > 128 )); then return 1; fi  # timed out: leave the line alone
    if (( status )); then _calm_gone; return 1; fi
    [[ ${line%%$'\t'*} == "$1" ]] || continue
    rest=${line#*$'\t'}
    [[ ${rest%%$'\t'*} == 1 ]] || continue
    [[ $rest == *$'\t'* ]] || return 0
    local -a parts
    IFS=$'\t' read -r -a parts <<<"${rest#*$'\t'}"
    (( ${#parts[@]} )) || return 0
    _CALM_FLAGS=${parts[0]}
    local part
    for part in "${parts[@]:1}"; do
      printf -v part '%b' "$part"
      _CALM_CANDS+=("$part")
    done
    return 0
  done
  return 1
}

# --------------------------------------------------------------------------- the key

_calm_set_line() {
  READLINE_LINE=$1
  READLINE_POINT=${#READLINE_LINE}
}

# First press: the best candidate for the line, if it is sure enough (its confidence reaches
# CALM_MIN_CONFIDENCE); otherwise the line stays as typed. Again: the next candidate (the less sure
# ones too), then back to what was typed.
_calm_key() {
  if (( _CALM_CYCLING )) && [[ $READLINE_LINE == "$_CALM_INSERTED" ]] && (( ${#_CALM_CANDS[@]} )); then
    _CALM_IDX=$(( (_CALM_IDX + 1) % (${#_CALM_CANDS[@]} + 1) ))
    if (( _CALM_IDX == ${#_CALM_CANDS[@]} )); then
      _calm_set_line "$_CALM_TYPED"
    else
      _calm_set_line "${_CALM_CANDS[_CALM_IDX]}"
    fi
    _CALM_INSERTED=$READLINE_LINE
    return
  fi
  _CALM_CYCLING=0 _CALM_INSERTED= _CALM_TYPED=$READLINE_LINE
  (( _CALM_OFF )) && return
  [[ -z $_CALM_WFD ]] && return
  local seq
  if [[ -z $READLINE_LINE ]] && (( _CALM_PRED_READY )); then
    _CALM_CANDS=("${_CALM_PRED[@]}") _CALM_FLAGS=$_CALM_PRED_FLAGS
  elif [[ -z $READLINE_LINE ]] && (( _CALM_PRED_SEQ == _CALM_SEQ )); then
    # Asked for at the prompt; usually here already.
    _calm_collect "$_CALM_PRED_SEQ" || return
    _CALM_PRED=("${_CALM_CANDS[@]}") _CALM_PRED_FLAGS=$_CALM_FLAGS _CALM_PRED_READY=1
  else
    # A line emptied after the prediction went (Ctrl-U after a press): ask for it again.
    if [[ -z $READLINE_LINE ]]; then
      (( CALM_PREDICT )) || return
    elif (( ${#READLINE_LINE} < CALM_MIN_LENGTH )); then
      return
    fi
    _calm_drain
    seq=$(( ++_CALM_SEQ ))
    _calm_esc "$PWD"; local cwd=$REPLY
    _calm_esc "$READLINE_LINE"
    _calm_write "c"$'\t'"$seq"$'\t'"$CALM_MAX_CANDIDATES"$'\t'"$cwd"$'\t'"$_CALM_BRANCH"$'\t'"${CALM_MIN_CONFIDENCE-}"$'\t'"$REPLY"$'\n'
    _calm_collect "$seq" || return
  fi
  local -i i
  local keep=() flags=
  for (( i = 0; i < ${#_CALM_CANDS[@]}; i++ )); do
    [[ ${_CALM_CANDS[i]} != "$_CALM_TYPED" && ${_CALM_CANDS[i]} == "$_CALM_TYPED"* ]] || continue
    keep+=("${_CALM_CANDS[i]}")
    flags+=${_CALM_FLAGS:i:1}
  done
  _CALM_CANDS=("${keep[@]}") _CALM_FLAGS=$flags
  (( ${#_CALM_CANDS[@]} )) || return
  _CALM_CYCLING=1
  if [[ ${_CALM_FLAGS:0:1} == 1 ]]; then
    _CALM_IDX=0
    _calm_set_line "${_CALM_CANDS[0]}"
  else
    _CALM_IDX=-1  # not sure enough: the next press brings the first candidate
  fi
  _CALM_INSERTED=$READLINE_LINE
}

# --------------------------------------------------------------------------- recording

# _CALM_BRANCH: the branch (or short commit) of the repository around $PWD, read from .git/HEAD.
_calm_git_branch() {
  _CALM_BRANCH= _CALM_BRANCH_DIR=$PWD
  local dir=$PWD gitdir= head=
  while true; do
    if [[ -d $dir/.git ]]; then
      gitdir=$dir/.git
      break
    elif [[ -f $dir/.git ]]; then
      IFS= read -r head <"$dir/.git" 2>/dev/null
      gitdir=${head#gitdir: }
      [[ $gitdir == /* ]] || gitdir=$dir/$gitdir
      break
    fi
    [[ $dir == / || -z $dir ]] && return
    dir=${dir%/*}
    [[ -z $dir ]] && dir=/
  done
  [[ -r $gitdir/HEAD ]] || return
  IFS= read -r head <"$gitdir/HEAD" 2>/dev/null
  if [[ $head == 'ref: refs/heads/'* ]]; then
    _CALM_BRANCH=${head#ref: refs/heads/}
  else
    _CALM_BRANCH=${head:0:7}
  fi
}

# The command line about to run ($1), as bash-preexec passes it or as read from the history. It
# is recorded with the folder and branch it was typed in (a `cd proj` line with the folder it was
# typed in, not proj), as the model sees them when it suggests that line.
_calm_preexec() {
  _CALM_CMD=$1 _CALM_TS=$EPOCHREALTIME
  [[ $PWD == "$_CALM_BRANCH_DIR" ]] || _calm_git_branch
  _CALM_CMD_CWD=$PWD _CALM_CMD_GIT=$_CALM_BRANCH
}

# DEBUG trap: the first command after the prompt starts the user's line.
_calm_debug() {
  local status=$?
  (( _CALM_ARMED )) || return $status
  [[ -z ${COMP_LINE-} && $BASH_COMMAND != _calm_* ]] || return $status
  # Commands of PROMPT_COMMAND that run after ours are not the user's.
  local IFS=$'\n' entry pc
  pc=$'\n'"${PROMPT_COMMAND[*]-}"$'\n'
  pc=${pc//;/$'\n'}
  pc=${pc//$'\n' /$'\n'}
  if [[ $pc != *$'\n'"$BASH_COMMAND"$'\n'* ]]; then
    _CALM_ARMED=0
    entry=$(HISTTIMEFORMAT= builtin history 1)
    if [[ $entry =~ ^\ *([0-9]+)[\ *]\ (.*)$ ]]; then
      entry=${BASH_REMATCH[2]}
      # Not saved in the history (ignorespace, ignoredups...): only a repeat of the last line counts.
      if (( HISTCMD >= _CALM_NEXT_HIST )) || [[ $entry == "$BASH_COMMAND"* ]]; then
        _calm_preexec "$entry"
      fi
    fi
  fi
  return $status
}

_calm_precmd() {
  local ret=$? out=
  if [[ -n ${_CALM_DISABLED_FILE-} && -e $_CALM_DISABLED_FILE ]]; then _CALM_OFF=1; else _CALM_OFF=0; fi
  [[ -z $_CALM_WFD ]] && _calm_start
  _calm_drain
  if (( _CALM_GONE )); then
    _CALM_GONE=0
    _calm_say "its helper stopped (\`${_CALM_HELPER[*]}\` shows why)"
  fi
  _calm_esc "$PWD"; local cwd=$REPLY
  # A line whose commands all ran in a subshell, like `(exit 3)`, or that only defined a function,
  # never reached the DEBUG trap; it is in the history all the same.
  if (( _CALM_ARMED && HISTCMD > _CALM_NEXT_HIST )) && [[ -z $_CALM_CMD ]]; then
    local entry
    entry=$(HISTTIMEFORMAT= builtin history 1)
    [[ $entry =~ ^\ *[0-9]+[\ *]\ (.*)$ ]] && _calm_preexec "${BASH_REMATCH[1]}"
  fi
  if [[ -n $_CALM_CMD ]]; then
    if [[ $_CALM_CMD != [[:space:]]* ]]; then
      # how long it ran, from microseconds (bash has no floating point)
      local -i took=$(( 10#${EPOCHREALTIME//[!0-9]/} - 10#${_CALM_TS//[!0-9]/} ))
      local took_s; printf -v took_s "%d.%06d" $(( took / 1000000 )) $(( took % 1000000 ))
      if (( CALM_RECORD )); then
        _calm_esc "$_CALM_CMD_CWD"; local typed_in=$REPLY
        _calm_esc "$_CALM_CMD"
        out+="r"$'\t'"$ret"$'\t'"$typed_in"$'\t'"$_CALM_CMD_GIT"$'\t'"$_CALM_TS"$'\t'"$REPLY"$'\t'"$took_s"$'\n'
      else
        # Paused: bash writes the line to its own history file all the same. The daemon is told
        # when it started, and nothing else, so that no import of that file brings it back.
        out+="p"$'\t'"$_CALM_TS"$'\t'"$took_s"$'\n'
      fi
    fi
    _CALM_CMD=
  fi
  # The environment (ENV frame), when it changed: after the record, which was typed before it did.
  if [[ ${VIRTUAL_ENV-}$'\t'${CONDA_DEFAULT_ENV-} != "$_CALM_ENV" && -n $_CALM_WFD ]]; then
    _CALM_ENV=${VIRTUAL_ENV-}$'\t'${CONDA_DEFAULT_ENV-}
    _calm_esc "${VIRTUAL_ENV-}"; local venv=$REPLY; _calm_esc "${CONDA_DEFAULT_ENV-}"
    out+="e"$'\t'"$venv"$'\t'"$REPLY"$'\n'
  fi
  _calm_git_branch
  if (( CALM_PREDICT && ! _CALM_OFF )); then
    _CALM_PRED_SEQ=$(( ++_CALM_SEQ ))
    out+="c"$'\t'"$_CALM_SEQ"$'\t'"$CALM_MAX_CANDIDATES"$'\t'"$cwd"$'\t'"$_CALM_BRANCH"$'\t'"${CALM_MIN_CONFIDENCE-}"$'\t'$'\n'
  fi
  [[ -n $out ]] && _calm_write "$out"
  _CALM_CYCLING=0 _CALM_INSERTED= _CALM_CANDS=() _CALM_PRED=() _CALM_PRED_READY=0
  _CALM_NEXT_HIST=$HISTCMD _CALM_ARMED=1
  return $ret
}

# --------------------------------------------------------------------------- install

_calm_install() {
  local km
  for km in emacs vi-insert; do
    bind -m "$km" -x "\"$CALM_KEY\": _calm_key"
  done
  if [[ -n ${bash_preexec_imported-}${__bp_imported-} ]]; then
    preexec_functions+=(_calm_preexec)
    precmd_functions=(_calm_precmd "${precmd_functions[@]}")
    return
  fi
  # Our DEBUG trap runs first and keeps $? for the one that was there ($1, `trap -p DEBUG`).
  local prev=$1
  prev=${prev#"trap -- '"}
  prev=${prev%"' DEBUG"}
  prev=${prev//"'\\''"/"'"}
  # shellcheck disable=SC2064
  trap "_calm_debug; ${prev:-:}" DEBUG
  # Under `set -u`, bash 5.2 calls even ${#PROMPT_COMMAND[@]} of a string unbound: ask for the
  # array attribute, and only of a variable that is set.
  if [[ -n ${PROMPT_COMMAND+set} && ${PROMPT_COMMAND@a} == *a* ]]; then
    PROMPT_COMMAND=(_calm_precmd "${PROMPT_COMMAND[@]}")
  else
    PROMPT_COMMAND="_calm_precmd${PROMPT_COMMAND:+$'\n'$PROMPT_COMMAND}"
  fi
}

# Read at the top level: inside a function bash shows no DEBUG trap.
_calm_install "$(trap -p DEBUG)"

# --------------------------------------------------------------------------- history search (Ctrl-R)

# CALM_SEARCH_KEY (Ctrl-R) opens `calm search` (calmd/shell/search_ui.py) over the whole history,
# ranked by calmd; it prints `run` or `edit` and the line chosen. A `bind -x` function cannot run
# a readline command, so the key is a macro of two hidden keys: the first runs _calm_search, which
# binds the second to what must follow: accept-line (Enter in the search), nothing (Tab, Esc), or
# reverse-search-history, bash's own search, when no daemon answers (status 3) or the search
# cannot start: Ctrl-R never waits on a daemon that is not there. CALM_SEARCH=0 leaves the key alone.
: "${CALM_SEARCH=1}"
: "${CALM_SEARCH_KEY=\C-r}"
_CALM_SEARCH_RUN='\C-x\C-_\C-s' _CALM_SEARCH_THEN='\C-x\C-_\C-t'

_calm_search() {
  local out status
  out=$("${_CALM_SEARCH[@]}" --session "$_CALM_SESSION" -- "$READLINE_LINE" 2>/dev/null </dev/tty)
  status=$?
  case $status in
    0)
      READLINE_LINE=${out#*$'\n'}
      READLINE_POINT=${#READLINE_LINE}
      if [[ ${out%%$'\n'*} == run ]]; then _calm_then accept-line; else _calm_then redraw-current-line; fi
      ;;
    1) _calm_then redraw-current-line ;;  # Esc: the line as it was
    *) _calm_then reverse-search-history ;;
  esac
}

# What the macro's second key does this time.
_calm_then() {
  local km
  for km in emacs vi-insert; do bind -m "$km" "\"$_CALM_SEARCH_THEN\": $1"; done
}

if (( CALM_SEARCH )) && [[ -n $CALM_SEARCH_KEY && -n ${_CALM_SEARCH-} ]]; then
  for _calm_km in emacs vi-insert; do
    bind -m "$_calm_km" -x "\"$_CALM_SEARCH_RUN\": _calm_search"
    bind -m "$_calm_km" "\"$_CALM_SEARCH_THEN\": redraw-current-line"
    bind -m "$_calm_km" "\"$CALM_SEARCH_KEY\": \"$_CALM_SEARCH_RUN$_CALM_SEARCH_THEN\""
  done
  unset _calm_km
fi
