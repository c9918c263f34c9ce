"""A read-only view of the file system for one thread (and what it starts), where the writable folders stay writable.

Landlock decides who may *open* what; it cannot yet refuse ``chmod``, ``chown``,
``utime`` or ``setxattr``, and a command run as root owns most of the system's
files, so it could still change their modes or owners. With ``CAP_SYS_ADMIN``
(root), the confining thread therefore also takes a mount namespace of its own
(``unshare(CLONE_NEWNS | CLONE_FS)`` acts on the calling thread only), binds
each writable folder onto itself, makes every mount read-only in one call
(``mount_setattr(AT_RECURSIVE)``, Linux 5.12+) and makes the writable binds
writable again. The programs it starts inherit that namespace: outside the
allowed folders, any change of a file, its metadata included, fails with EROFS.
It costs about 0.15 ms, once per confining thread. Mount events never
propagate back (every mount is made private first), and the host's namespace
is untouched. The thread's working directory becomes its own (``CLONE_FS``):
programs it starts are given theirs explicitly.

Without the privilege (not root, or a kernel without ``mount_setattr``)
:func:`read_only_view` returns False and changes nothing: Landlock alone is the
wall, and a user can only change the metadata of files that user owns.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Iterable

__all__ = ["read_only_view"]

_CLONE_NEWNS, _CLONE_FS = 0x00020000, 0x00000200
_MS_REC, _MS_PRIVATE, _MS_BIND = 0x4000, 1 << 18, 0x1000
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_SYS_MOUNT_SETATTR = 442

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _set_attr(path: str, set_flags: int, clear_flags: int) -> None:
    attr = struct.pack("=QQQQ", set_flags, clear_flags, 0, 0)
    _check(
        _libc.syscall(
            ctypes.c_long(_SYS_MOUNT_SETATTR),
            ctypes.c_int(_AT_FDCWD),
            os.fsencode(path),
            ctypes.c_uint(_AT_RECURSIVE),
            attr,
            ctypes.c_size_t(len(attr)),
        ),
        f"mount_setattr({path!r})",
    )


def read_only_view(writable: Iterable[str]) -> bool:
    """In the calling thread: everything read-only but ``writable``; True when done, False when not possible.

    Call it in a thread of its own, before Landlock (which forbids mounting), and
    start the programs from that thread. An error after the namespace was taken
    is raised (the thread must then start nothing).
    """
    if os.geteuid() != 0:
        return False
    if _libc.unshare(_CLONE_NEWNS | _CLONE_FS) != 0:
        return False  # no CAP_SYS_ADMIN here (a container without it): Landlock alone
    _check(_libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "making the mounts private")
    folders = [os.fspath(path) for path in writable]
    for folder in folders:
        _check(
            _libc.mount(os.fsencode(folder), os.fsencode(folder), None, _MS_BIND | _MS_REC, None), f"binding {folder!r}"
        )
    try:
        _set_attr("/", _MOUNT_ATTR_RDONLY, 0)
    except OSError:
        return False  # no mount_setattr (Linux < 5.12): nothing was made read-only, Landlock alone
    for folder in folders:
        _set_attr(folder, 0, _MOUNT_ATTR_RDONLY)
    return True
