"""The panel's judges (calmd/quality/panel.py): for each prefix people type every day, the kind of
a sensible next word and the judge that tells whether a drawn ghost's next word is of that kind.
They are written from what the project holds and what the commands take, independently of the
engine's filters (calmd/suggest/kinds.py), which they check."""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from calmd.quality.panel_project import BRANCHES, MAKE_TARGETS, PROJECT, Project
from calmd.suggest.filters import placeholder

Judge = Callable[[list[str], Project], str | None]  # the drawn words past the prefix -> why absurd, or None
_FLAG = re.compile(r"--?[A-Za-z0-9][\w-]*(=.*)?\Z")
_FILE_EXT = re.compile(
    r".+\.(md|txt|csv|json|toml|ya?ml|html?|py|cfg|ini|log|sh|lock|gz|tar|zip|whl)\Z", re.I
)


def _flag(word: str) -> bool:
    return bool(_FLAG.match(word))


def _ip(word: str) -> bool:
    try:
        ipaddress.ip_address(word)
        return True
    except ValueError:
        return False


def _host(word: str, project: Project) -> bool:
    host = word.rsplit("@", 1)[-1].split(":", 1)[0]
    if host in project.hosts or host == "localhost" or _ip(host):
        return True
    return "." in host and not _FILE_EXT.match(host) and bool(re.fullmatch(r"[a-z0-9][a-z0-9.-]*[a-z]", host))


def one_of(names: frozenset[str], what: str, *, flags: bool = True) -> Judge:
    """The next word is one of `names` (or a flag)."""

    def judge(words: list[str], project: Project) -> str | None:
        w = words[0]
        if w in names or (flags and _flag(w)):
            return None
        return f"{w!r} is no {what}"

    return judge


def path(*, folder: bool = False, flags: bool = True, new_ok: bool = False) -> Judge:
    """An existing path of the project (`new_ok`: or a new file's name, as an editor makes one)."""

    def judge(words: list[str], project: Project) -> str | None:
        w = words[0]
        if flags and _flag(w):
            return None
        if project.exists(w, folder=folder) or (folder and w == "-"):
            return None
        if new_ok and "/" not in w.rstrip("/") and _FILE_EXT.match(w):
            return None
        return f"{w!r} is no {'folder' if folder else 'path'} of the project"

    return judge


def module(words: list[str], project: Project) -> str | None:
    top = words[0].split(".", 1)[0]
    if top in STANDARD_MODULES or top in PYTHON_TOOLS or top == PROJECT or project.exists(f"{top}.py"):
        return None
    return f"{words[0]!r} is no module"


def python(words: list[str], project: Project) -> str | None:
    w = words[0]
    if w == "-m":
        return module(words[1:], project) if len(words) > 1 else None
    if _flag(w) or (w.endswith(".py") and project.exists(w)):
        return None
    return f"{w!r} is no Python script nor flag"


def host(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or _host(w, project):
        return None
    return f"{w!r} is no host"


def url(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w):
        return None
    m = re.match(r"(https?|ftp)://([^/:?#]+)", w)
    hostname = m.group(2) if m else w.split("/", 1)[0].split(":", 1)[0]
    if _host(hostname, project):
        return None
    return f"{w!r} is no URL"


def scp(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or project.exists(w) or (":" in w and _host(w.split(":", 1)[0], project)):
        return None
    return f"{w!r} is no local path nor host:path"


def tar(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or re.fullmatch(r"[vzjJfp]*[ctxru][vzjJfp]*", w):
        return None
    return f"{w!r} is no tar operation"


def find_expression(words: list[str], project: Project) -> str | None:
    w = words[0]
    if w in FIND_TESTS or w in ("(", "!", "\\("):
        return None
    return f"{w!r} is no find expression"


def signal_or_pid(words: list[str], project: Project) -> str | None:
    for w in words:
        if w in ("-s", "-l", "-L", "--") or re.fullmatch(r"-(\d{1,2}|(SIG)?[A-Z]+)", w):
            continue
        if not re.fullmatch(r"\d+|%\d*|\$\S+", w):
            return f"{w!r} is no signal, pid nor job"
    return None


def variable(words: list[str], project: Project) -> str | None:
    for w in words:
        if _flag(w):
            continue
        name, eq, _ = w.partition("=")
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            return f"{w!r} is no variable"
        if not eq and name != name.upper() and name not in project.variables:
            return f"{w!r} is no variable one exports"
    return None


def package(words: list[str], project: Project) -> str | None:
    w = words[0]
    if w in BRANCHES or (w not in (".", "./") and project.exists(w)):
        return f"{w!r} is the project's own branch or file, copied where a package belongs"
    if w in (".", "-e", "-r", "--editable", "--requirement"):
        rest = words[1:2]
        return None if not rest or project.exists(rest[0]) else f"{rest[0]!r} is not in the project"
    if _flag(w):
        return None
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[\w,]+\])?([<>=!~]=?\S+)?", w) and not _FILE_EXT.match(w):
        return None
    return f"{w!r} is no package"


def unit(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or re.fullmatch(r"[a-z][\w@-]*(\.(service|socket|timer|target|mount|path))?", w):
        return None
    return f"{w!r} is no unit"


def image(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or (re.fullmatch(r"[a-z0-9][a-z0-9._/-]*(:[\w.-]+)?", w) and not _FILE_EXT.match(w)):
        return None
    return f"{w!r} is no image"


def branch_or_path(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or w in BRANCHES or w == "-" or project.exists(w) or w.startswith("HEAD"):
        return None
    return f"{w!r} is no branch nor path"


def remote(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or w == "origin":
        return None
    return f"{w!r} is no remote"


def pattern(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or not project.exists(w):
        return None  # a pattern is any word; a file name first means the pattern was left out
    return f"{w!r} is a file where grep's pattern belongs"


def mode(words: list[str], project: Project) -> str | None:
    w = words[0]
    if re.fullmatch(r"[ugoa]*[-+=][rwxXst]+|[0-7]{3,4}|-R|--\w[\w-]*", w):
        return None
    return f"{w!r} is no mode"


def script(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or re.fullmatch(r"[a-z][\w:-]*", w):
        return None
    return f"{w!r} is no script name"


def link_target(words: list[str], project: Project) -> str | None:
    w = words[0]
    if _flag(w) or project.exists(w) or (w.startswith("/") and os.path.exists(w)):
        return None
    return f"{w!r} names nothing to link to"


def sub(*names: str) -> frozenset[str]:
    return frozenset(" ".join(names).split())


STANDARD_MODULES = frozenset(sys.stdlib_module_names)
PYTHON_TOOLS = sub("pip pytest venv black ruff mypy flake8 pylint isort coverage build twine ipykernel",
                   "jupyter notebook uvicorn gunicorn flask django mkdocs sphinx pipx poetry tox nox",
                   "virtualenv pre_commit IPython")  # fmt: skip
FIND_TESTS = sub("-name -iname -type -path -ipath -regex -maxdepth -mindepth -mtime -mmin -atime -size",
                 "-newer -empty -user -group -perm -exec -execdir -delete -print -print0 -ls -prune",
                 "-not -o -a -and -or -L -H -P -xdev -follow -wholename -readable -writable",
                 "-executable")  # fmt: skip
GIT = sub("add am apply archive bisect blame branch checkout cherry-pick clean clone commit config diff",
          "fetch grep init log merge mv pull push rebase reflog remote reset restore revert rm show",
          "stash status switch tag worktree submodule describe shortlog ls-files gc fsck")  # fmt: skip
DOCKER = sub("attach build builder buildx commit compose container context cp create diff events exec",
             "export history image images import info inspect kill load login logout logs network",
             "pause port ps pull push rename restart rm rmi run save search start stats stop system",
             "tag top unpause update version volume wait")  # fmt: skip
KUBECTL = sub("annotate api-resources apply attach auth autoscale cluster-info config cordon cp create",
              "debug delete describe diff drain edit events exec explain expose get label logs patch",
              "port-forward proxy rollout run scale set taint top uncordon version wait")  # fmt: skip
RESOURCES = sub("all pods pod po deployments deployment deploy services service svc nodes node no",
                "namespaces namespace ns configmaps configmap cm secrets secret ingress ingresses ing",
                "jobs job cronjobs cronjob cj pv pvc persistentvolumeclaims persistentvolumes",
                "statefulsets sts daemonsets ds replicasets rs events ev endpoints ep",
                "serviceaccounts sa roles rolebindings clusterroles hpa crd")  # fmt: skip
SYSTEMCTL = sub("status start stop restart reload enable disable is-active is-enabled is-failed",
                "daemon-reload list-units list-unit-files list-timers cat edit mask unmask kill",
                "show reboot poweroff suspend --user --failed")  # fmt: skip
NPM = sub("install i ci run test start build init publish update uninstall ls list audit outdated",
          "exec link pack version view cache config login whoami prune dedupe fund doctor")  # fmt: skip
CARGO = sub("build b check c run r test t bench doc new init add remove update clean fmt clippy",
            "install uninstall publish search tree fix metadata package vendor login")  # fmt: skip
PIP = sub("install uninstall list freeze show download wheel check config cache search hash index")
JOURNALCTL_FLAGS = sub("-u -f -e -x -xe -b -k -n -p -r -o --since --until --unit --user --follow",
                       "--boot --no-pager --disk-usage --vacuum-size --vacuum-time -xeu -fu")  # fmt: skip


@dataclass(frozen=True)
class Prefix:
    typed: str
    kind: str  # the kind of a sensible next word, in words
    judge: Judge


PREFIXES: tuple[Prefix, ...] = tuple(Prefix(t, k, j) for t, k, j in (
    ("python3 -m ", "a module", module),
    ("python3 ", "a script of the project or a flag", python),
    ("pip install ", "a package name, -e ., -r FILE of the project, a flag", package),
    ("pip ", "a pip subcommand", one_of(PIP, "pip subcommand")),
    ("git ", "a git subcommand", one_of(GIT, "git subcommand")),
    ("git checkout ", "a branch, -b NAME, -, a path", branch_or_path),
    ("git add ", "a path of the project or a flag", path()),
    ("git commit ", "a flag (-m, -a, --amend)", one_of(frozenset(), "commit flag")),
    ("git push ", "a remote or a flag", remote),
    ("docker ", "a docker subcommand", one_of(DOCKER, "docker subcommand")),
    ("docker run ", "a flag or an image", image),
    ("docker build ", "a flag or the context folder", path(folder=True)),
    ("kubectl ", "a kubectl subcommand", one_of(KUBECTL, "kubectl subcommand")),
    ("kubectl get ", "a resource type", one_of(RESOURCES, "resource type")),
    ("ssh ", "a host (never a placeholder) or a flag", host),
    ("scp ", "a local path or host:path", scp),
    ("ping ", "a host or a flag", host),
    ("curl ", "a URL or a flag", url),
    ("wget ", "a URL or a flag", url),
    ("tar ", "an operation (-xzf, czf, --extract)", tar),
    ("find . ", "a whole test or option (-name, -type ...)", find_expression),
    ("find ", "a path or an option", path()),
    ("make ", "a target of the Makefile or a flag", one_of(MAKE_TARGETS, "target of the Makefile")),
    ("systemctl ", "a systemctl subcommand", one_of(SYSTEMCTL, "systemctl subcommand")),
    ("systemctl status ", "a unit", unit),
    ("journalctl ", "a flag", one_of(JOURNALCTL_FLAGS, "journalctl flag")),
    ("kill ", "a signal, a pid or %job", signal_or_pid),
    ("kill -9 ", "a pid or %job", signal_or_pid),
    ("export ", "a VARIABLE or NAME=value", variable),
    ("unset ", "a variable", variable),
    ("cd ", "a folder of the project, -, ..", path(folder=True)),
    ("ls ", "a path of the project or a flag", path()),
    ("mv ", "a path of the project or a flag", path()),
    ("cp ", "a path of the project or a flag", path()),
    ("rm ", "a path of the project or a flag", path()),
    ("cat ", "a file of the project", path(flags=False)),
    ("vim ", "a file of the project, or a new file", path(new_ok=True)),
    ("grep ", "a flag or a pattern", pattern),
    ("sudo apt install ", "a package name", package),
    ("npm ", "an npm subcommand", one_of(NPM, "npm subcommand")),
    ("npm run ", "a script name", script),
    ("cargo ", "a cargo subcommand", one_of(CARGO, "cargo subcommand")),
    ("chmod ", "a mode or a flag", mode),
    ("ln -s ", "an existing path to link to", link_target),
    ("source ", "a file to source (the virtualenv's activate)", path(flags=False)),
    ("head ", "a file of the project or a flag", path()),
    ("tail -f ", "a file of the project", path(flags=False)),
    ("python3 -m pytest ", "a test path or a flag", path()),
))  # fmt: skip


def judge(prefix: Prefix, drawn: str, project: Project) -> tuple[str, str]:
    """(verdict, why) of a drawn ghost for the prefix: `placeholder`, `absurd` or `sensible`."""
    name = placeholder(drawn, prefix.typed)
    if name is not None:
        return "placeholder", name
    rest = drawn[len(prefix.typed) :] if drawn.startswith(prefix.typed) else drawn
    words = rest.split()
    if not words:
        return "sensible", "nothing past the prefix"
    why = prefix.judge(words, project)
    return ("absurd", why) if why is not None else ("sensible", "")
