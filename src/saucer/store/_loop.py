"""The event loop running in this thread, found without a system call per commit.

``asyncio.get_running_loop()`` makes a ``getpid()`` system call on Python 3.11
(its fork check), once per group commit; :func:`this_loop` remembers the loop a
thread last ran and trusts it while that loop still runs in that thread.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # asyncio is imported by the coroutines that use it
    import asyncio

__all__ = ["running_loop", "this_loop"]


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None (also in a program that never imported asyncio)."""
    try:  # no event loop runs in a program that never imported asyncio
        return this_loop() if "asyncio" in sys.modules else None
    except RuntimeError:
        return None


_loops: dict[int, Any] = {}  # thread id -> the BaseEventLoop that thread last ran (see this_loop)
os.register_at_fork(after_in_child=_loops.clear)  # a forked child runs none of them


def this_loop() -> asyncio.AbstractEventLoop:
    """``asyncio.get_running_loop()`` without its ``getpid()`` system call (Python 3.11's fork check, once per
    commit): the loop this thread last ran while it runs here still (a ``BaseEventLoop``'s ``_thread_id``)."""
    me = threading.get_ident()
    loop = _loops.get(me)
    if loop is None or loop._thread_id != me:
        loop = sys.modules["asyncio"].get_running_loop()  # (imported: a coroutine calls this)
        if isinstance(loop, sys.modules["asyncio"].BaseEventLoop):  # any other kind is asked for each time
            _loops[me] = loop
    return loop  # type: ignore[no-any-return]
