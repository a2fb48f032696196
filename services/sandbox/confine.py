"""Where a sandbox worker runs: inside bubblewrap (``bwrap``), or -- only where the operator
allowed it -- as a plain child process (the weaker mode).

Under bubblewrap a worker gets (docs/security.md):

* its own mount namespace whose root is an empty tmpfs; visible in it, read-only, are only
  the Python installation (``sys.base_prefix``, the virtual environment, the directories on
  ``sys.path`` that hold libraries), the meshrl packages the worker imports, the system
  libraries (``/usr``, ``/lib*``) and the job's inputs it is given; ``/tmp`` is a fresh
  tmpfs, its only writable place (also ``HOME`` and the working directory);
* a new pid, IPC, UTS and cgroup namespace; a new network namespace (no interface but a down
  loopback) unless the operator allowed the network;
* when the service runs as root: a separate unprivileged uid/gid (``nobody``/``nogroup``,
  or ``MESHRL_SANDBOX_UID``/``MESHRL_SANDBOX_GID``), no supplementary groups, no
  capabilities, ``no_new_privs`` (``setpriv`` between bwrap and Python). Otherwise a user
  namespace keeps the service's own uid (the mount namespace still hides everything else);
* ``--die-with-parent``; the worker stays in the service's process group, so stopping the
  job's group (pause) stops it too; killing the bwrap process tears down the whole pid
  namespace (every process the user code forked dies with it).

Resource limits (memory, CPU time, processes, file size, descriptors) are set by the child
itself before the user code is imported (:mod:`services.sandbox.child`).

Policy: user code (reward functions, tool classes other than the built-in ones) needs
bubblewrap. Where it cannot run, :func:`sandbox_mode` raises :class:`SandboxUnavailable`
with a one-line reason, unless ``MESHRL_SANDBOX_WEAK=1`` (the operator's opt-in:
``meshrl gateway --allow weak_sandbox``, ``meshrl run --weak-sandbox``), which logs a
one-line warning and runs the plain process sandbox. Built-in code (the built-in scorers,
the calculator tool) falls back to the weaker mode on its own, with the same warning.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: The operator's opt-in to the weaker process sandbox where bubblewrap cannot run.
WEAK_ENV = "MESHRL_SANDBOX_WEAK"
#: Extra read-only paths (the job's inputs), os.pathsep-separated, set by the job controller.
INPUTS_ENV = "MESHRL_SANDBOX_INPUTS"
#: The binary (tests point it at a missing file to see the refusal).
BWRAP_ENV = "MESHRL_BWRAP"
UID_ENV = "MESHRL_SANDBOX_UID"
GID_ENV = "MESHRL_SANDBOX_GID"

#: Files of /etc a worker sees; with the network also those that resolve names and verify TLS.
_ETC = ("/etc/ld.so.cache", "/etc/localtime", "/etc/mime.types")
_ETC_NET = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/host.conf",
            "/etc/ssl", "/etc/ca-certificates", "/etc/pki")
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SCRATCH = "/tmp"


class SandboxUnavailable(RuntimeError):
    """User code must run under bubblewrap and bubblewrap cannot run here (one-line reason)."""


@dataclass(frozen=True)
class Confinement:
    """What one worker may see and do beyond the defaults.

    ``packages``: top-level modules/packages the worker imports (bound read-only where they
    live, their parent directory put on ``PYTHONPATH``); ``inputs``: files and directories
    bound read-only at their own path; ``allow_network``; ``user_code``: False for built-in
    code, which may fall back to the process sandbox without the operator's opt-in."""

    packages: tuple[str, ...] = ("services",)
    inputs: tuple[str, ...] = ()
    allow_network: bool = False
    user_code: bool = True
    extra_env: Mapping[str, str] = field(default_factory=dict)


def bwrap_binary() -> str | None:
    name = os.environ.get(BWRAP_ENV) or "bwrap"
    return shutil.which(name) if os.sep not in name else (name if os.access(name, os.X_OK) else None)


def _sandbox_ids() -> tuple[int, int]:
    try:
        uid = int(os.environ[UID_ENV])
    except (KeyError, ValueError):
        try:
            uid = pwd.getpwnam("nobody").pw_uid
        except KeyError:
            uid = 65534
    try:
        gid = int(os.environ[GID_ENV])
    except (KeyError, ValueError):
        gid = 65534
    return uid, gid


def _as_root() -> bool:
    return os.geteuid() == 0


def _base_args(allow_network: bool) -> list[str]:
    args = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    if not allow_network:
        args.append("--unshare-net")
    if not _as_root():
        args.append("--unshare-user")
    args += ["--die-with-parent", "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", SCRATCH, "--chdir", SCRATCH]
    if any(_isatty(fd) for fd in (0, 1, 2)):
        # an interactive service: detach from its terminal (no TIOCSTI); pause by the job's
        # process group only matters for launched jobs, which have no terminal
        args.append("--new-session")
    return args


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _system_binds() -> list[str]:
    out: list[str] = []
    for p in _SYSTEM:
        if os.path.islink(p):
            out += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            out += ["--ro-bind", p, p]
    return out


def _drop_privileges() -> list[str]:
    """bwrap's tail that switches to the sandbox uid before Python starts (root only)."""
    if not _as_root():
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SandboxUnavailable("setpriv (util-linux) not found: cannot switch the sandbox to an unprivileged uid")
    uid, gid = _sandbox_ids()
    return ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--", setpriv, f"--reuid={uid}", f"--regid={gid}",
            "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


@functools.lru_cache(maxsize=4)
def bwrap_problem(binary: str | None) -> str | None:
    """None when bubblewrap runs here (probed once per binary), else a one-line reason."""
    if binary is None:
        return "bubblewrap (bwrap) is not installed (scripts/install.sh installs it: apt-get install bubblewrap)"
    try:
        tail = _drop_privileges()
    except SandboxUnavailable as exc:
        return str(exc)
    argv = [binary, *_base_args(False), *_system_binds(), *(tail or ["--"]), "true"]
    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap cannot run: {exc}"
    if res.returncode != 0:
        why = res.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"bubblewrap cannot run here ({why[-1] if why else f'exit code {res.returncode}'}; user namespaces off?)"
    return None


_warned: set[str] = set()


def sandbox_mode(user_code: bool = True) -> str:
    """``"bwrap"``, or ``"process"`` (the weaker mode: bwrap unusable and the operator opted
    in, or built-in code); raises :class:`SandboxUnavailable` for user code otherwise."""
    problem = bwrap_problem(bwrap_binary())
    if problem is None:
        return "bwrap"
    if user_code and os.environ.get(WEAK_ENV) != "1":
        raise SandboxUnavailable(f"user code refused: {problem}; or let the operator allow the weaker process "
                                 "sandbox (meshrl gateway --allow weak_sandbox, meshrl run --weak-sandbox)")
    if problem not in _warned:
        _warned.add(problem)
        log.warning("WARNING: sandbox without bubblewrap (weaker: no filesystem or uid isolation): %s", problem)
    return "process"


def _package_dirs(name: str) -> tuple[list[str], str | None]:
    """(paths to bind, the directory to put on PYTHONPATH) of top-level module ``name``,
    found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return [], None
    if spec is None:
        return [], None
    if spec.submodule_search_locations:
        dirs = [os.path.realpath(d) for d in spec.submodule_search_locations]
        return dirs, os.path.dirname(dirs[0])
    if spec.origin and os.path.isfile(spec.origin):
        origin = os.path.realpath(spec.origin)
        return [origin], os.path.dirname(origin)
    return [], None


def _python_paths() -> list[str]:
    """The Python installation and library directories on ``sys.path`` (not the working
    directory, not the repository root: packages are bound one by one)."""
    out = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix),
           os.path.realpath(os.path.dirname(sys.executable))}
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        real = os.path.realpath(entry)
        if "site-packages" in real or "dist-packages" in real or real.startswith(tuple(out)):
            out.add(real)
    return sorted(out)


def job_inputs() -> list[str]:
    """The job's input paths the controller handed down (``MESHRL_SANDBOX_INPUTS``)."""
    raw = os.environ.get(INPUTS_ENV, "")
    return [p for p in raw.split(os.pathsep) if p]


def _bind(path: str) -> list[str]:
    """Read-only binds of ``path`` at its own path (and at its real path, if a symlink)."""
    if not os.path.isabs(path) or not os.path.exists(path):
        return []
    real = os.path.realpath(path)
    out = ["--ro-bind", real, real]
    if os.path.abspath(path) != real:
        out += ["--ro-bind", real, os.path.abspath(path)]
    return out


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def bwrap_argv(argv: Iterable[str], conf: Confinement, env: dict[str, str]) -> list[str]:
    """``argv`` wrapped in bubblewrap per ``conf``; ``env`` (the worker's) is adjusted in place."""
    binary = bwrap_binary()
    assert binary is not None
    binds: list[str] = []  # read-only, each at its own path; nested ones are dropped
    python = _python_paths()
    pythonpath: list[str] = []
    for name in dict.fromkeys(conf.packages):
        dirs, parent = _package_dirs(name)
        binds += dirs
        if parent and parent not in pythonpath and not _under(parent, python):
            pythonpath.append(parent)
    extra: list[str] = []
    for p in dict.fromkeys([*conf.inputs, *job_inputs()]):
        extra += _bind(p)
    kept: list[str] = []
    for p in sorted(set(python + binds), key=len):
        if not _under(p, kept):
            kept.append(p)
    out = [binary, *_base_args(conf.allow_network), *_system_binds()]
    out += ["--perms", "0755", "--dir", "/etc"]
    for p in _ETC + (_ETC_NET if conf.allow_network else ()):
        out += ["--ro-bind-try", p, p]
    # the directories leading to each bind are made traversable (bwrap would copy a 0700 /root)
    made: set[str] = {"/", SCRATCH}
    for dest in [*kept, *extra[2::3]]:
        parent = os.path.dirname(dest)
        chain = []
        while parent not in made and parent != os.sep and not _under(parent, ["/usr", "/proc", "/dev"]):
            chain.append(parent)
            made.add(parent)
            parent = os.path.dirname(parent)
        for d in reversed(chain):
            out += ["--perms", "0755", "--dir", d]
    for p in kept:
        out += ["--ro-bind", p, p]
    out += extra
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env.update(HOME=SCRATCH, TMPDIR=SCRATCH, **dict(conf.extra_env))
    return [*out, *(_drop_privileges() or ["--"]), *argv]


__all__ = ["BWRAP_ENV", "Confinement", "INPUTS_ENV", "SCRATCH", "SandboxUnavailable", "WEAK_ENV", "bwrap_argv",
           "bwrap_binary", "bwrap_problem", "job_inputs", "sandbox_mode"]
