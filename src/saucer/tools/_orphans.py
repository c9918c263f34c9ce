"""Commands never outlive the process that runs their shell server, even one killed outright.

Each shell command runs in a process group of its own, so a timeout or a
cancelled call can stop it with all its children. A group also survives its
parent: when the process that started it is killed with SIGKILL (a device
killed by its operator, an OOM kill) nothing stops the group. A stdio shell
server hears its client go away and stops its commands; an in-process one
dies with its host, silently.

So the first command starts one watchdog per process: a ``/bin/sh`` reading
a pipe whose write end only this process holds. Each group is announced
(``+PGID``) when it starts and withdrawn (``-PGID``) when it is over. When
the pipe reaches end of file -- this process is gone, however it ended --
the watchdog stops every group still announced: SIGTERM, one second, SIGKILL,
as a timed-out command is stopped. The watchdog is a shell builtin loop in a
session of its own (a terminal's Ctrl-C does not reach it) with no output.
"""

from __future__ import annotations

import contextlib
import os
import threading

__all__ = ["watch_group", "forget_group"]

# Group ids are kept as " 12 34 " so one can be found and cut out with builtins only (no process per line).
_WATCHDOG = r"""
live=" "
while IFS= read -r line; do
  case "$line" in
    +*) live="$live${line#+} " ;;
    -*) p="${line#-}"
        case "$live" in *" $p "*) live="${live%% $p *} ${live#* $p }" ;; esac ;;
  esac
done
[ "$live" = " " ] && exit 0
for p in $live; do kill -TERM "-$p" 2>/dev/null; done
sleep 1
for p in $live; do kill -KILL "-$p" 2>/dev/null; done
"""

_lock = threading.Lock()
_pipe: int | None = None
_owner_pid: int | None = None


def _writer() -> int | None:
    """The write end of this process's watchdog pipe, starting the watchdog on first use (None if it cannot)."""
    global _pipe, _owner_pid
    with _lock:
        if _pipe is not None and _owner_pid == os.getpid():
            return _pipe
        read_end, write_end = os.pipe()  # not inherited by other children: Python makes both ends non-inheritable
        try:
            # posix_spawn, not Popen: it outlives every object of this process (a Popen would warn at exit).
            os.posix_spawn(
                "/bin/sh",
                ["/bin/sh", "-c", _WATCHDOG],
                {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},  # for sleep; nothing else of the host's
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, read_end, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                ],
                setsid=True,
            )
        except OSError:
            os.close(write_end)
            return None
        finally:
            os.close(read_end)
        # A forked child (multiprocessing) must start its own watchdog rather than write into its parent's.
        _pipe, _owner_pid = write_end, os.getpid()
        return _pipe


def _send(line: str) -> None:
    fd = _writer()
    if fd is None:
        return
    with contextlib.suppress(OSError):  # a watchdog that is gone cannot be told; the command still runs
        os.write(fd, line.encode())


def watch_group(pgid: int) -> None:
    """Stop the process group ``pgid`` if this process ends while it is still announced."""
    _send(f"+{pgid}\n")


def forget_group(pgid: int) -> None:
    """The group ``pgid`` is over (or stopped by its caller): no longer stop it at exit."""
    _send(f"-{pgid}\n")
