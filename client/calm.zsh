# calm.zsh: inline command suggestions from calmd. Loaded by the setup line of docs/shells.md,
# which sources the copy `calmd init zsh` keeps in the data dir (or evals `calmd init zsh`).
#
# One helper process per shell (`calmd shell-helper`, started once) holds the daemon connection;
# the shell writes one line per request to it and reads the replies through `zle -F`, so typing
# never waits. Ghost text lives in POSTDISPLAY. `calmd init` sets _CALM_HELPER and
# _CALM_DISABLED_FILE before this file. Options: docs/shells.md.

[[ -o interactive ]] || return 0
(( ${+_CALM_LOADED} )) && return 0
typeset -g _CALM_LOADED=1

zmodload zsh/system zsh/datetime 2>/dev/null || return 0
zmodload -F zsh/files b:zf_rm 2>/dev/null || zf_rm() { command rm "$@" }

# Options: set only what the user has not set.
(( ${+CALM_HIGHLIGHT} ))      || typeset -g CALM_HIGHLIGHT='fg=8'
(( ${+CALM_MIN_LENGTH} ))     || typeset -g CALM_MIN_LENGTH=1
(( ${+CALM_MAX_CANDIDATES} )) || typeset -g CALM_MAX_CANDIDATES=5
(( ${+CALM_PREDICT} ))        || typeset -g CALM_PREDICT=1
(( ${+CALM_RECORD} ))         || typeset -g CALM_RECORD=1
(( ${+CALM_AUTOSTART} ))      || typeset -g CALM_AUTOSTART=0
(( ${+CALM_CYCLE_KEY} ))      || typeset -g CALM_CYCLE_KEY='^[[Z'
# Not Esc: bound alone, it would end zsh's wait for the rest of Esc-prefixed keys (Esc . or Esc b
# typed slowly) after KEYTIMEOUT. vi insert mode's Esc dismisses anyway (vi-cmd-mode).
(( ${+CALM_DISMISS_KEYS} ))   || typeset -ga CALM_DISMISS_KEYS=('^G')
(( ${+CALM_DISMISS_WIDGETS} )) || typeset -ga CALM_DISMISS_WIDGETS=(kill-line)
(( ${+CALM_ACCEPT_WIDGETS} )) || typeset -ga CALM_ACCEPT_WIDGETS=(
  forward-char end-of-line vi-forward-char vi-end-of-line vi-add-eol)
(( ${+CALM_PARTIAL_WIDGETS} )) || typeset -ga CALM_PARTIAL_WIDGETS=(
  forward-word emacs-forward-word vi-forward-word vi-forward-word-end vi-forward-blank-word
  vi-forward-blank-word-end)

typeset -g _CALM_SESSION="zsh-${HOST%%.*}-$$-$EPOCHSECONDS"
typeset -g _CALM_WFD= _CALM_RFD= _CALM_INBUF= _CALM_REDRAW_FN= _CALM_CWD= _CALM_HL_AT=-1 _CALM_ENV=
typeset -g _CALM_SHOWN= _CALM_LAST_BUF= _CALM_CMD= _CALM_TS= _CALM_CMD_CWD= _CALM_CMD_GIT=
typeset -g _CALM_BRANCH= _CALM_BRANCH_DIR= _CALM_OFF=0 _CALM_RAN=0 _CALM_IDX=0 _CALM_SEQ=0
typeset -g _CALM_STARTED_AT=0
typeset -gi _CALM_SAID=0  # the one line that says the helper cannot run was printed
typeset -gi _CALM_CYCLED=0  # the user cycled to the candidate shown: typing along it keeps it
typeset -gi _CALM_HISTNO=0 _CALM_ISEARCH=0 _CALM_LIST_SEQ=-1  # the request _CALM_CANDS answer
typeset -ga _CALM_CANDS=() _CALM_KEYS=()  # _CALM_KEYS: this prompt's first keys' lines
typeset -g _CALM_FLAGS=  # per candidate: 1 sure enough to be shown unasked, 0 for cycling only, 2 a first key's line
typeset -gA _CALM_ORIG=()  # "keymap:keys" -> the widget that key had before us
typeset -ga _CALM_WIDGETS=(_calm_on_reply _calm_pre_redraw _calm_line_init _calm_line_finish
  _calm_cycle _calm_dismiss _calm_isearch_update _calm_isearch_exit _calm_interrupt)

# --------------------------------------------------------------------------- the helper

_calm_start() {
  emulate -L zsh
  [[ -n $_CALM_WFD ]] && return 0
  (( EPOCHSECONDS - _CALM_STARTED_AT < 10 )) && return 1
  _CALM_STARTED_AT=$EPOCHSECONDS
  if [[ ! -x $_CALM_HELPER[1] ]]; then  # the Python calmd was installed with is gone
    _calm_say "$_CALM_HELPER[1] is not there (\`calmd init zsh\` writes the hook for the calmd you have now)"
    return 1
  fi
  _calm_pipe || return 1
  # The helper gets the pipe as stdin (it reopens it read-only, to see the shell go); its end
  # shows here as the end of its replies. The terminal's hangup does not stop it: it goes when
  # the shell does. The shell waits for the new process to say it runs (an empty line) before zle
  # draws the prompt: drawn while the process was still being set up, the first prompt now and
  # then came out blank (about one start in a hundred in the tests). zsh-autosuggestions waits
  # for its child likewise.
  _CALM_ENV=$'\1'  # a new helper knows no environment yet: the next prompt sends it
  local -a argv=($_CALM_HELPER --format 3 --session $_CALM_SESSION)
  (( CALM_AUTOSTART )) && argv+=(--autostart)
  exec {_CALM_RFD}< <(trap '' HUP; print; exec 2>/dev/null $argv <&$_CALM_WFD {_CALM_WFD}>&-)
  local started
  read -r -u $_CALM_RFD started
  zle -F -w $_CALM_RFD _calm_on_reply 2>/dev/null
  return 0
}

# Say once per shell, in one line, why calm is off in it: the helper cannot start, or stopped
# (its errors go nowhere: running the command shows them). The shell goes on without calm.
_calm_say() {
  (( _CALM_SAID )) && return
  _CALM_SAID=1
  [[ -n ${WIDGET-} ]] && zle -I  # from a zle handler: print above the prompt, which zle redraws
  print -ru2 -- "calm: no suggestions or recording in this shell: $1"
}

# _CALM_WFD: a pipe of which the shell holds both ends (read-write), so that opening it waits for
# no one and writing to it never meets a pipe without a reader. On Linux: a process substitution's
# pipe reopened read-write through /proc (one fork, no exec, no file); elsewhere a FIFO, removed
# once open.
_calm_pipe() {
  local t fifo=${TMPDIR:-/tmp}/calm-$UID-$$-$RANDOM
  if [[ -d /proc/self/fd ]]; then
    exec {t}< <(:)
    { exec {_CALM_WFD}<>/proc/self/fd/$t } 2>/dev/null
    exec {t}<&-
  elif command mkfifo -m 600 -- $fifo 2>/dev/null; then
    { exec {_CALM_WFD}<>$fifo } 2>/dev/null
    zf_rm -f -- $fifo
  fi
  [[ -n $_CALM_WFD ]]
}

_calm_stop() {
  emulate -L zsh
  if [[ -n $_CALM_RFD ]]; then
    zle -F $_CALM_RFD 2>/dev/null
    exec {_CALM_RFD}<&-
  fi
  [[ -n $_CALM_WFD ]] && exec {_CALM_WFD}>&-
  _CALM_RFD= _CALM_WFD= _CALM_INBUF=
}

# REPLY = $1 with backslash, newline and tab escaped (the helper's line format).
_calm_esc() { REPLY=${${${1//\\/\\\\}//$'\n'/\\n}//$'\t'/\\t} }

_calm_send() {
  [[ -n $_CALM_WFD ]] || return 1
  local IFS=$'\t'
  print -rnu $_CALM_WFD -- "$*"$'\n' 2>/dev/null || _calm_stop
}

# Ask for the buffer. Runs on every key: one write, no further function call; the folder was
# escaped when it changed (_calm_cwd), the buffer is escaped only when it needs it.
_calm_request() {
  [[ -n $_CALM_WFD ]] || return
  local input=$BUFFER
  [[ $input == *[\\$'\n\t']* ]] && input=${${${input//\\/\\\\}//$'\n'/\\n}//$'\t'/\\t}
  print -rnu $_CALM_WFD -- c$'\t'$(( ++_CALM_SEQ ))$'\t'$CALM_MAX_CANDIDATES$'\t'$_CALM_CWD$'\t'$_CALM_BRANCH$'\t'${CALM_MIN_CONFIDENCE-}$'\t'$input$'\n' 2>/dev/null ||
    _calm_stop
}

# _CALM_CWD: $PWD escaped for the request lines (on chpwd and at each prompt).
_calm_cwd() { _calm_esc $PWD; _CALM_CWD=$REPLY }

# zle -F handler: replies for the newest request replace the candidates; older ones are dropped.
# A reply is "seq final flags candidate...".
_calm_on_reply() {
  emulate -L zsh
  local data line
  sysread -i $1 -s 65536 data 2>/dev/null
  case $? in
    0) ;;
    4) return ;;
    *)  # end of file: the helper exited
      _calm_stop
      _calm_say "its helper stopped (\`${(j: :)${(q-)_CALM_HELPER}}\` shows why)"
      return ;;
  esac
  _CALM_INBUF+=$data
  [[ $_CALM_INBUF == *$'\n'* ]] || return
  local -a lines=("${(@f)${_CALM_INBUF%$'\n'*}}")
  _CALM_INBUF=${_CALM_INBUF##*$'\n'}
  for line in ${(Oa)lines}; do
    [[ ${line%%$'\t'*} == $_CALM_SEQ ]] || continue
    local -a parts=("${(@ps:\t:)line}")
    local shown=$_CALM_SHOWN
    _CALM_LIST_SEQ=$_CALM_SEQ
    _CALM_FLAGS=$parts[3]
    _CALM_CANDS=("${(@g::)parts[4,-1]}")
    # The empty prompt's answer ends with its first keys' lines (flag 2): kept for this prompt,
    # and put after the candidates of the answers that follow (typing again after Ctrl-U).
    if [[ $_CALM_FLAGS == *2* ]]; then
      _CALM_KEYS=("${(@)_CALM_CANDS[${_CALM_FLAGS[(i)2]},-1]}")
    elif (( $#_CALM_KEYS )); then
      _CALM_CANDS+=("${(@)_CALM_KEYS}")
      _CALM_FLAGS+=${(l:$#_CALM_KEYS::2:)}
    fi
    _CALM_IDX=0 _CALM_CYCLED=0
    (( _CALM_ISEARCH )) || _calm_pick
    [[ $_CALM_SHOWN == $shown ]] || zle -R  # redraw only when the text changed
    return
  done
}

# --------------------------------------------------------------------------- ghost text

_calm_hide() {
  [[ -z $_CALM_SHOWN ]] && return  # nothing of ours: nothing to undo (the common case per key)
  [[ $POSTDISPLAY == $_CALM_SHOWN ]] && POSTDISPLAY=
  _CALM_SHOWN= _CALM_HL_AT=-1
  _calm_hl
}

# Our region_highlight entry (memo=calm) covers the ghost text while it is shown, and is gone
# otherwise. (Callers run under emulate -L zsh; _calm_hl_after runs after zsh-syntax-highlighting,
# which rebuilds region_highlight from scratch after the widgets it wraps: see _calm_precmd.)
_calm_hl() {
  region_highlight=("${(@)region_highlight:#*memo=calm}")
  [[ -n $_CALM_SHOWN && $POSTDISPLAY == $_CALM_SHOWN ]] &&
    region_highlight+=("$#BUFFER $(( $#BUFFER + $#_CALM_SHOWN )) $CALM_HIGHLIGHT memo=calm")
  return 0
}

_calm_hl_after() {
  emulate -L zsh
  [[ -n $_CALM_SHOWN || -n ${(M)region_highlight:#*memo=calm} ]] && _calm_hl
  return 0
}

# Show candidate $1 (an index into _CALM_CANDS) if it extends the buffer; 1 when it does not.
_calm_show() {
  local cand=$_CALM_CANDS[$1]
  if [[ -z $cand || $#cand -le $#BUFFER || ${cand[1,$#BUFFER]} != $BUFFER ]]; then
    return 1
  fi
  local ghost=${cand[$#BUFFER+1,-1]}
  # Someone else's text (zsh-autosuggestions) may be shown: ours takes its place (docs/shells.md).
  _CALM_IDX=$1
  [[ $ghost == $_CALM_SHOWN && $POSTDISPLAY == $ghost && $_CALM_HL_AT == $#BUFFER ]] && return 0
  _CALM_SHOWN=$ghost _CALM_HL_AT=$#BUFFER
  POSTDISPLAY=$ghost
  _calm_hl
  return 0
}

# Show what fits the buffer: the candidate shown so far while it still extends it (the user may
# have cycled to it), else the best candidate that extends it if it is sure enough (flag 1), else
# nothing: a less sure one is for cycling only. The empty prompt's answer also holds, flagged 2,
# the line to draw when a line's first key alone is typed (the daemon chose it): drawn at once,
# with no round trip, until the answer to that key comes.
_calm_pick() {
  (( _CALM_IDX )) && _calm_show $_CALM_IDX && return 0
  local -i i
  local cand
  for (( i = 1; i <= $#_CALM_CANDS; i++ )); do
    cand=$_CALM_CANDS[i]
    [[ $#cand -gt $#BUFFER && ${cand[1,$#BUFFER]} == $BUFFER ]] || continue
    [[ $_CALM_FLAGS[i] == 2 && $#BUFFER -ne 1 ]] && continue
    [[ $_CALM_FLAGS[i] == [12] ]] && _calm_show $i && return 0
    (( $#BUFFER == 1 )) || break
  done
  _CALM_IDX=0
  _calm_hide
  return 1
}

# Nothing to show until the user edits the line again: drop what is shown, what is asked for and
# what we have.
_calm_quiet() {
  (( ++_CALM_SEQ ))
  _calm_hide
  _CALM_CANDS=() _CALM_IDX=0 _CALM_CYCLED=0 _CALM_LAST_BUF=$BUFFER
}

_calm_pre_redraw() {
  emulate -L zsh
  # Quiet until the next edit: completion draws the line itself (listings, menus) and clips
  # region_highlight to the buffer, so a ghost left there looks typed; during Ctrl-R the line is
  # the search's; and a pasted line is what the user meant to type.
  if (( _CALM_ISEARCH )); then
    _calm_quiet
    return
  fi
  case $LASTWIDGET in
    (self-insert|backward-delete-char) ;;  # most keys: no further look-up
    (*complet*|list-choices|delete-char-or-list|menu-select|bracketed-paste) _calm_quiet; return ;;
    (*) if [[ ${widgets[$LASTWIDGET]} == completion:* ]]; then _calm_quiet; return; fi ;;
  esac
  # A line recalled from the history (Up, history searches) is quiet until edited; the user's own
  # line (back down to it, a search given up) is not.
  if (( HISTNO != _CALM_HISTNO )); then
    _CALM_HISTNO=$HISTNO
    if (( HISTNO != HISTCMD )); then
      _calm_quiet
      return
    fi
    _CALM_LAST_BUF=$'\0'  # ask again even if the text is the same
  fi
  if [[ $BUFFER == $_CALM_LAST_BUF ]]; then
    # zsh-autosuggestions replaced POSTDISPLAY (or cleared it): show ours again
    [[ $POSTDISPLAY != $_CALM_SHOWN && -n $_CALM_SHOWN ]] && _calm_pick
    return
  fi
  local before=$_CALM_LAST_BUF
  _CALM_LAST_BUF=$BUFFER
  if (( _CALM_OFF )) || [[ -z $_CALM_WFD ]]; then
    _calm_hide
    return
  fi
  # Typed along a ghost from the answer to the latest request: it just gets shorter at once (the
  # path of most keys, hence written out here), and the daemon is asked again with it as the line
  # drawn, which it keeps unless it has a clearly better one (calmd/suggest/ghost.py). A candidate
  # the user cycled to is theirs: typing along it asks nothing. Anything else asks again, also
  # typing along a ghost from an older answer while a newer request is on its way.
  if (( _CALM_IDX && _CALM_LIST_SEQ == _CALM_SEQ )) && [[ -n $_CALM_SHOWN && $BUFFER == $before?* ]]; then
    local cand=$_CALM_CANDS[_CALM_IDX]
    local ghost=${cand[$#BUFFER+1,-1]}
    if [[ $#cand -gt $#BUFFER && ${cand[1,$#BUFFER]} == $BUFFER &&
          ( $POSTDISPLAY == $_CALM_SHOWN || $POSTDISPLAY == $ghost || -z $POSTDISPLAY ) ]]; then
      _CALM_SHOWN=$ghost _CALM_HL_AT=$#BUFFER
      POSTDISPLAY=$ghost
      region_highlight=("${(@)region_highlight:#*memo=calm}" "$#BUFFER $#cand $CALM_HIGHLIGHT memo=calm")
      (( _CALM_CYCLED )) || _calm_request
      return
    fi
  fi
  _calm_pick  # keep showing a candidate that still fits while the new answer comes
  if (( $#BUFFER >= CALM_MIN_LENGTH || ($#BUFFER == 0 && CALM_PREDICT) )); then
    _calm_request
  else
    (( ++_CALM_SEQ ))
  fi
}

_calm_line_init() {
  emulate -L zsh
  _CALM_CANDS=() _CALM_IDX=0 _CALM_SHOWN= _CALM_LAST_BUF=$BUFFER _CALM_HISTNO=$HISTNO _CALM_ISEARCH=0
  _CALM_CYCLED=0
  (( _CALM_OFF || HISTNO != HISTCMD )) && return  # a line pushed from the history (Ctrl-o)
  [[ -z $BUFFER ]] && (( ! CALM_PREDICT )) && return
  _calm_request
}

_calm_line_finish() {
  emulate -L zsh
  (( ++_CALM_SEQ ))
  _calm_hide
  _CALM_CANDS=() _CALM_IDX=0
}

_calm_isearch_update() { _CALM_ISEARCH=1; _calm_quiet }
_calm_isearch_exit() { _CALM_ISEARCH=0 }

# Ctrl-C at the prompt ends zle without running zle-line-finish (zsh skips hooks while an
# interrupt is pending), so the ghost text would stay in the scrollback: TRAPINT hides it first.
_calm_interrupt() {
  _calm_line_finish
  zle -R
}

_calm_on_int() { zle && zle _calm_interrupt }

# 0 when INT is trapped with `trap '...' INT`: that is no function, and defining TRAPINT would
# replace it, so calm leaves Ctrl-C alone then. Only `trap`'s listing shows it, and a subshell
# would not: the listing goes through a private file. (No emulate -L here: its local_traps would
# take back a TRAPINT defined inside.)
_calm_int_trapped() {
  _calm_capture trap || return 0
  [[ $'\n'$REPLY == *$'\n'trap\ *\ INT(|$'\n'*) ]]
}

# REPLY = the output of the command $@, without the fork of $(...): through a private file
# (created exclusively, 0600) that zsh reads in-process. 1 when no file could be made.
_calm_capture() {
  local tmp=${TMPDIR:-/tmp}/calm-$UID-$$-$RANDOM fd
  REPLY=
  sysopen -w -o creat,excl -m 600 -u fd $tmp 2>/dev/null || return 1
  "$@" >&$fd 2>/dev/null
  exec {fd}>&-
  REPLY=$(<$tmp)
  zf_rm -f -- $tmp
  return 0
}

# --------------------------------------------------------------------------- keys

# 1 in vi command mode, where the cursor sits on the last character, not after it.
_calm_vicmd() { [[ $KEYMAP == vicmd ]] && REPLY=1 || REPLY=0 }

_calm_at_end() { _calm_vicmd; (( CURSOR >= $#BUFFER - REPLY )) }

_calm_shown() { [[ -n $_CALM_SHOWN && $POSTDISPLAY == $_CALM_SHOWN ]] }

# $1: the original widget. Accept the whole suggestion, or do what the key did before.
_calm_accept() {
  emulate -L zsh
  if _calm_shown && _calm_at_end; then
    local ghost=$_CALM_SHOWN
    _calm_hide
    BUFFER+=$ghost
    _calm_vicmd
    CURSOR=$(( $#BUFFER - REPLY ))
  else
    zle $1 -- "${@:2}"
  fi
}

# $1: the original (word-motion) widget. Accept up to where it moves the cursor.
_calm_partial() {
  emulate -L zsh
  if _calm_shown && _calm_at_end; then
    local before=$BUFFER ghost=$_CALM_SHOWN
    _calm_hide
    BUFFER+=$ghost
    CURSOR=$#before
    zle $1 -- "${@:2}"
    [[ $KEYMAP == vicmd ]] && (( CURSOR++ ))
    if (( CURSOR <= $#before )); then
      BUFFER=$before
    else
      BUFFER=${BUFFER[1,CURSOR]}
    fi
    _CALM_LAST_BUF=$BUFFER
    _calm_pick
    # the rest of the line stays drawn; the daemon is asked for the new buffer with it as the
    # line drawn (it keeps it unless it has a clearly better one)
    (( _CALM_CYCLED || $#BUFFER <= $#before )) || _calm_request
  else
    zle $1 -- "${@:2}"
  fi
}

# The key's previous widget in this keymap (for keys calm binds directly).
_calm_orig() {
  local w=${_CALM_ORIG[$KEYMAP:$KEYS]:-${_CALM_ORIG[main:$KEYS]}}
  [[ -n $w && $w != undefined-key ]] && zle $w
}

# The next candidate that extends the buffer, wrapping; the first one when none is shown (below
# the threshold too: cycling reaches every candidate).
_calm_cycle() {
  emulate -L zsh
  local -i n=$#_CALM_CANDS k i
  for (( k = 1; k <= n; k++ )); do
    i=$(( (_CALM_IDX + k - 1) % n + 1 ))
    [[ $_CALM_FLAGS[i] == 2 ]] && continue  # a first key's line, not one of the answer's
    _calm_show $i && { _CALM_CYCLED=1; return 0 }
  done
  _calm_orig
}

_calm_dismiss() {
  emulate -L zsh
  if _calm_shown; then
    _calm_quiet
  else
    _calm_orig
  fi
}

# $1: the original widget (kill-line). The suggestion is what lies after the cursor at the end of
# the line: kill it; anywhere else, kill as always.
_calm_kill() {
  emulate -L zsh
  if _calm_shown && _calm_at_end; then
    _calm_quiet
  else
    zle $1 -- "${@:2}"
  fi
}

# Wrap widget $1: function $2 gets what the widget was before as its first argument. A builtin is
# called by its dot name (`.end-of-line`), which nothing can rebind; only a user widget is kept as
# a copy, _calm_orig_$1. (A copy of a builtin would itself look builtin to zsh-syntax-highlighting,
# which would then call a `._calm_orig_...` that does not exist.)
_calm_wrap() {
  local widget=$1 kind=$2 orig
  [[ -n ${widgets[$widget]} ]] || return
  [[ ${widgets[$widget]} == user:_calm_w_* ]] && return
  if [[ ${widgets[$widget]} == builtin ]]; then
    orig=.$widget
  else
    orig=_calm_orig_$widget
    zle -A $widget $orig
  fi
  functions[_calm_w_$widget]="$kind $orig \"\$@\""
  zle -N $widget _calm_w_$widget
}

# In vi insert mode Esc leaves for command mode: dismiss on the way.
_calm_vi_cmd_mode() {
  emulate -L zsh
  _calm_shown && _calm_dismiss
  zle $1 -- "${@:2}"
}

# Hook widget $2 as zle-$1 (line-init...): the widget itself when nothing else uses the hook, else
# through add-zle-hook-widget. Its dispatcher costs a zstyle look-up and a widget call each time
# (line-pre-redraw runs on every key) and loading it 0.7 ms at start; it takes a widget it finds as
# its first hook when someone adds one later.
_calm_hook() {
  if (( ${+widgets[zle-$1]} )); then
    (( ${+functions[add-zle-hook-widget]} )) || autoload -Uz add-zle-hook-widget
    add-zle-hook-widget $1 $2
  else
    zle -N zle-$1 $2
  fi
}

# What the main keymap is, then what each key of $todo (_calm_setup_zle's) is bound to.
_calm_bindings() {
  bindkey -lL main
  for km key w in $todo; do bindkey -M $km -- $key; done
}

_calm_setup_zle() {
  local w key km
  for w in $CALM_ACCEPT_WIDGETS; do _calm_wrap $w _calm_accept; done
  for w in $CALM_PARTIAL_WIDGETS; do _calm_wrap $w _calm_partial; done
  for w in $CALM_DISMISS_WIDGETS; do _calm_wrap $w _calm_kill; done
  for w in $_CALM_WIDGETS; do zle -N $w; done
  _calm_hook line-pre-redraw _calm_pre_redraw
  _CALM_REDRAW_FN=${widgets[zle-line-pre-redraw]#user:}
  _calm_hook line-init _calm_line_init
  _calm_hook line-finish _calm_line_finish
  _calm_hook isearch-update _calm_isearch_update
  _calm_hook isearch-exit _calm_isearch_exit
  _calm_wrap vi-cmd-mode _calm_vi_cmd_mode
  # (keymap key widget) triples to bind; what each key did before is looked up in one go.
  local -a todo
  if [[ -n $CALM_CYCLE_KEY ]]; then
    todo+=(emacs $CALM_CYCLE_KEY _calm_cycle viins $CALM_CYCLE_KEY _calm_cycle)
  fi
  for key in $CALM_DISMISS_KEYS; do
    todo+=(emacs $key _calm_dismiss)
    [[ $key == '^[' ]] || todo+=(viins $key _calm_dismiss)  # viins: Esc is vi-cmd-mode, above
  done
  # End keys that nothing handles yet (zsh -f binds none) go to the end of the line: accept.
  for key in '^[[F' '^[OF' '^[[4~' '^[[8~'; do
    todo+=(emacs $key +end-of-line viins $key +end-of-line vicmd $key +vi-end-of-line)
  done
  # During Ctrl-R a key that the isearch keymap leaves unbound runs the main keymap's widget,
  # which ends the search first: Ctrl-g would accept the found line instead of giving up. Such a
  # key keeps its old meaning there (=: bind it to what the main keymap had, if it is unbound).
  for key in $CALM_CYCLE_KEY $CALM_DISMISS_KEYS; do
    [[ -n $key ]] && todo+=(isearch $key =)
  done
  _calm_capture _calm_bindings || REPLY=$(_calm_bindings 2>/dev/null)  # no private file: fork
  local -a old=("${(@f)REPLY}")
  local main=${${(z)old[1]}[3]}  # emacs or viins
  local -i i=1
  for km key w in $todo; do
    (( ++i ))
    local was=${${(z)old[i]}[2]}
    if [[ $w == +* ]]; then
      [[ $was == undefined-key ]] && bindkey -M $km -- $key ${w#+}
    elif [[ $w == = ]]; then
      w=${_CALM_ORIG[$main:${(g:ec:)key}]}
      [[ $was == undefined-key && -n $w && $w != undefined-key ]] && bindkey -M $km -- $key $w
    elif [[ $was != $w ]]; then
      _CALM_ORIG[$km:${(g:ec:)key}]=$was
      bindkey -M $km -- $key $w
    fi
  done
}

# --------------------------------------------------------------------------- recording

# _CALM_BRANCH: the branch (or short commit) of the repository around $PWD, read from .git/HEAD.
_calm_git_branch() {
  _CALM_BRANCH= _CALM_BRANCH_DIR=$PWD
  local dir=$PWD gitdir head
  while true; do
    if [[ -d $dir/.git ]]; then
      gitdir=$dir/.git
      break
    elif [[ -f $dir/.git ]]; then
      read -r head <$dir/.git 2>/dev/null
      gitdir=${head#gitdir: }
      [[ $gitdir == /* ]] || gitdir=$dir/$gitdir
      break
    fi
    [[ $dir == / || -z $dir ]] && return
    dir=${dir:h}
  done
  [[ -r $gitdir/HEAD ]] || return
  read -r head <$gitdir/HEAD 2>/dev/null
  if [[ $head == 'ref: refs/heads/'* ]]; then
    _CALM_BRANCH=${head#ref: refs/heads/}
  else
    _CALM_BRANCH=${head[1,7]}
  fi
}

# The line is recorded with the folder and branch it was typed in (a `cd proj` line with the folder
# it was typed in, not proj), as the model sees them when it suggests that line.
_calm_preexec() {
  _CALM_CMD=$1 _CALM_TS=$EPOCHREALTIME _CALM_RAN=1
  [[ $PWD == $_CALM_BRANCH_DIR ]] || _calm_git_branch  # a widget changed folder at the prompt
  _CALM_CMD_CWD=$PWD _CALM_CMD_GIT=$_CALM_BRANCH
}

_calm_precmd() {
  local ret=$?
  emulate -L zsh
  if [[ -n $_CALM_DISABLED_FILE && -e $_CALM_DISABLED_FILE ]]; then _CALM_OFF=1; else _CALM_OFF=0; fi
  [[ -z $_CALM_WFD ]] && _calm_start
  _CALM_KEYS=()  # a new prompt: the last one's first keys were chosen for another context
  if (( _CALM_RAN )); then
    _CALM_RAN=0
    if [[ $_CALM_CMD != [[:space:]]* && -n ${_CALM_CMD//[[:space:]]/} ]]; then
      if (( CALM_RECORD )); then
        local cmd cwd
        _calm_esc $_CALM_CMD; cmd=$REPLY
        _calm_esc $_CALM_CMD_CWD; cwd=$REPLY
        _calm_send r $ret "$cwd" "$_CALM_CMD_GIT" "$_CALM_TS" "$cmd" $(( EPOCHREALTIME - _CALM_TS ))
      else
        # Paused: zsh writes the line to its own history file all the same. The daemon is told
        # when it started, and nothing else, so that no import of that file brings it back.
        _calm_send p "$_CALM_TS" $(( EPOCHREALTIME - _CALM_TS ))
      fi
    fi
  fi
  # The environment (ENV frame), when it changed: after the record, which was typed before it did.
  if [[ ${VIRTUAL_ENV-}$'\t'${CONDA_DEFAULT_ENV-} != "$_CALM_ENV" && -n $_CALM_WFD ]]; then
    _CALM_ENV=${VIRTUAL_ENV-}$'\t'${CONDA_DEFAULT_ENV-}
    local venv; _calm_esc ${VIRTUAL_ENV-}; venv=$REPLY; _calm_esc ${CONDA_DEFAULT_ENV-}
    _calm_send e "$venv" "$REPLY"
  fi
  _calm_git_branch
  _calm_cwd
  # zsh-autosuggestions wraps every widget at its first precmd; ours must stay unwrapped.
  if (( ${+ZSH_AUTOSUGGEST_IGNORE_WIDGETS} )) && (( ! ${ZSH_AUTOSUGGEST_IGNORE_WIDGETS[(I)_calm_*]} )); then
    ZSH_AUTOSUGGEST_IGNORE_WIDGETS+=('_calm_*')
  fi
  # Its answer (sync, or an fd handler after which zle redraws without line-pre-redraw) sets or
  # clears POSTDISPLAY: give our ghost text back right there.
  if (( ${+functions[_zsh_autosuggest_suggest]} && ! ${+functions[_calm_orig_autosuggest_suggest]} )); then
    functions[_calm_orig_autosuggest_suggest]=$functions[_zsh_autosuggest_suggest]
    functions[_zsh_autosuggest_suggest]='_calm_orig_autosuggest_suggest "$@"; _calm_restore'
  fi
  # zsh-syntax-highlighting (0.7) empties region_highlight and rebuilds its own entries after every
  # widget it wraps, the line-pre-redraw hook included when it loads after us: put ours back each
  # time. Its wrappers around our own widgets only cost time (they change no text): undo them.
  if (( ${+functions[_zsh_highlight]} && ! ${+functions[_calm_orig_zsh_highlight]} )); then
    functions[_calm_orig_zsh_highlight]=$functions[_zsh_highlight]
    functions[_zsh_highlight]='_calm_orig_zsh_highlight "$@"; local ret=$?; _calm_hl_after; return ret'
  fi
  local w
  for w in $_CALM_WIDGETS; do
    [[ ${widgets[$w]} == user:$w ]] || zle -N $w
  done
  # It also wraps zle-line-pre-redraw when that exists as it loads (ours): a redraw then drops
  # zsh-autosuggestions' highlight, which a widget set just before, and costs a rebuild per key.
  if [[ ${widgets[zle-line-pre-redraw]} == user:_zsh_highlight_widget_* ]] &&
     (( ${+functions[$_CALM_REDRAW_FN]} )); then
    zle -N zle-line-pre-redraw $_CALM_REDRAW_FN
  fi
}

# Show our candidate again when someone else (zsh-autosuggestions) replaced or cleared POSTDISPLAY
# for the same buffer: when calm has a ghost, it is what the user sees.
_calm_restore() {
  [[ $POSTDISPLAY != $_CALM_SHOWN && -n $_CALM_SHOWN && $BUFFER == $_CALM_LAST_BUF ]] || return 0
  _calm_pick
  return 0
}

# --------------------------------------------------------------------------- start

_calm_setup_zle
if (( ${+functions[TRAPINT]} )); then  # chain the user's
  functions[_calm_user_trapint]=$functions[TRAPINT]
  TRAPINT() { _calm_on_int; _calm_user_trapint "$@" }
elif ! _calm_int_trapped; then
  TRAPINT() { _calm_on_int; return $(( 128 + $1 )) }
fi
preexec_functions=(${preexec_functions:#_calm_preexec} _calm_preexec)
chpwd_functions=(${chpwd_functions:#_calm_cwd} _calm_cwd)
precmd_functions=(_calm_precmd ${precmd_functions:#_calm_precmd})  # first: it needs $?

# --------------------------------------------------------------------------- history search (Ctrl-R)

# CALM_SEARCH_KEY (Ctrl-R) opens `calm search` (calmd/shell/search_ui.py) over the whole history,
# ranked by calmd; it prints `run` or `edit` and the line chosen. When no daemon answers (its
# status 3) or it cannot start, the key does what it did before calm (zsh's own search): Ctrl-R
# never waits on a daemon that is not there. CALM_SEARCH=0 leaves the key alone.
(( ${+CALM_SEARCH} ))     || typeset -g CALM_SEARCH=1
(( ${+CALM_SEARCH_KEY} )) || typeset -g CALM_SEARCH_KEY='^R'
typeset -gA _CALM_SEARCH_ORIG=()  # keymap -> the widget the key had before

_calm_search() {
  emulate -L zsh
  local out
  out=$($_CALM_SEARCH --session $_CALM_SESSION -- $BUFFER 2>/dev/null </dev/tty)
  case $? in
    0)
      BUFFER=${out#*$'\n'}
      CURSOR=$#BUFFER
      zle reset-prompt
      [[ ${out%%$'\n'*} == run ]] && zle accept-line
      ;;
    1) zle reset-prompt ;;  # Esc: the line as it was
    *) zle ${_CALM_SEARCH_ORIG[$KEYMAP]:-${_CALM_SEARCH_ORIG[main]:-history-incremental-search-backward}} ;;
  esac
  return 0
}

_calm_search_setup() {
  (( CALM_SEARCH )) && [[ -n $CALM_SEARCH_KEY && -n ${_CALM_SEARCH-} ]] || return 0
  zle -N _calm_search
  local km w
  local -a old
  # what the key does now in each keymap (main: emacs or viins, as $KEYMAP names it in a widget)
  _calm_capture eval 'for km in main emacs viins; do bindkey -M $km -- $CALM_SEARCH_KEY; done' ||
    REPLY=$(for km in main emacs viins; do bindkey -M $km -- $CALM_SEARCH_KEY; done)
  old=("${(@f)REPLY}")
  for km in main emacs viins; do
    w=${${(z)old[1]}[2]}
    shift old
    [[ $w == _calm_search || $w == undefined-key || -z $w ]] || _CALM_SEARCH_ORIG[$km]=$w
  done
  for km in emacs viins; do bindkey -M $km -- $CALM_SEARCH_KEY _calm_search; done
}
_calm_search_setup
