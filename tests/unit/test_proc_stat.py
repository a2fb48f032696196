"""The one reader of ``/proc/<pid>/stat`` (services.procs.proc_stat): the fields come from
after the *last* ``)``, so a command name with spaces and parentheses parses; a process that
is gone reads as None, a zombie as not alive."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from services.procs import ProcStat, all_proc_stats, parse_proc_stat, pid_alive, proc_stat

# a real line's shape (proc(5)): pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
# cmajflt utime stime cutime cstime priority nice threads itrealvalue starttime vsize rss ...
LINE = "4242 ({comm}) S 17 4240 4200 0 -1 4194560 120 0 0 0 31 7 0 0 20 0 1 0 98765 1234567 89 " + " ".join(
    ["0"] * 30)


@pytest.mark.parametrize("comm", ["python", "a b", "x) S 1 2 3 (y", ") )", "(", ""])
def test_the_fields_follow_the_last_paren_whatever_the_command_name(comm):
    st = parse_proc_stat(LINE.format(comm=comm))
    assert st == ProcStat(pid=4242, comm=comm, state="S", ppid=17, pgid=4240, session=4200, utime=31, stime=7,
                          starttime=98765)
    assert st.cpu_ticks == 38 and not st.zombie


@pytest.mark.parametrize("text", ["", "4242 python S 1 2", "4242 (x) S 1 2 3", "not a pid (x) " + "0 " * 30])
def test_what_is_not_a_stat_line_is_refused(text):
    with pytest.raises(ValueError):
        parse_proc_stat(text)


def test_a_live_process_whose_name_has_spaces_and_parens():
    name = "w a) (b"  # set by the child itself: the kernel keeps what it is given (up to 15 bytes)
    child = subprocess.Popen(
        [sys.executable, "-c", f"import sys; open('/proc/self/comm', 'w').write({name!r}); print('ok', flush=True); "
                               "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "ok"
        st = proc_stat(child.pid)
        assert st is not None
        assert (st.pid, st.comm, st.ppid) == (child.pid, name, os.getpid())
        assert st.pgid == os.getpgid(child.pid) and st.state in "RS"
        assert pid_alive(child.pid)
        assert child.pid in {s.pid for s in all_proc_stats()}
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_a_vanished_pid_reads_as_none_and_a_zombie_as_not_alive():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # not reaped yet: once it exits it is a zombie (state Z) until waited for
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    st = proc_stat(child.pid)
    assert st is not None and st.zombie and not pid_alive(child.pid)
    child.wait()
    assert proc_stat(child.pid) is None and not pid_alive(child.pid)
    assert proc_stat(2**22 + 1) is None  # above any pid_max: never a process


def test_this_process_reads_as_itself():
    st = proc_stat(os.getpid())
    assert st is not None and st.ppid == os.getppid() and st.pgid == os.getpgrp() and st.state == "R"
