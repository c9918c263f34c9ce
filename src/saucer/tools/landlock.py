"""Linux Landlock through its three system calls (ctypes, no compiled code): rulesets and thread confinement.

Landlock (Linux 5.13+) lets an unprivileged thread give up rights for good:
after :meth:`Ruleset.restrict_self`, the calling *thread* and every process
it starts afterwards can only do, on the file system and the network, what
the ruleset's rules allow for the access rights it *handles*. A right the
ruleset does not handle stays allowed. Rules on a directory cover everything
beneath it, and a path is checked where it really lies (``..``, symbolic
links, ``/proc/self/root`` and bind mounts resolve first), so what counts is
the object reached, never the spelling.

Only the calling thread is restricted (not its process): a host keeps one
dedicated thread per policy that starts the confined commands, and the rest
of the host runs free (see :mod:`saucer.tools.confine`).

The ABI version decides which rights exist: 1 the file system basics, 2
``REFER`` (link and rename between directories), 3 ``TRUNCATE``, 4 TCP
bind and connect ports, 5 ``IOCTL_DEV``, 6 scopes (signals, abstract UNIX
sockets), 7 audit flags. :func:`abi_version` asks the kernel; 0 means no
Landlock (an old kernel, or ``lsm=`` without it).
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
from collections.abc import Iterable

__all__ = [
    "LandlockError",
    "Ruleset",
    "abi_version",
    "drop_capabilities",
    "fs_rights",
    "FS_READ",
    "FS_WRITE",
    "FS_FILE_WRITE",
    "NET_BIND_TCP",
    "NET_CONNECT_TCP",
    "SCOPE_ABSTRACT_UNIX_SOCKET",
    "SCOPE_SIGNAL",
]

# <linux/landlock.h>; the system call numbers are the same on every architecture (added after 5.1).
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
#: Capabilities that reach past Landlock (load a module, raw I/O, mount and namespaces, trace, devices,
#: the network's configuration, BPF, the clock, the boot): dropped from the bounding set of the
#: confined thread, so no program it starts (even as root) holds them.
ESCAPING_CAPABILITIES = (12, 16, 17, 19, 21, 22, 25, 27, 32, 33, 34, 38, 39)

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15

NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

#: Reading and running what lies beneath a path.
FS_READ = EXECUTE | READ_FILE | READ_DIR
#: Everything a workspace needs, except making device nodes (a root could write to a disk through one).
FS_WRITE = (
    FS_READ
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
    | TRUNCATE
    | IOCTL_DEV
)
#: The rights that may be granted on a single file (not a directory), e.g. /dev/null.
FS_FILE_WRITE = READ_FILE | WRITE_FILE | TRUNCATE

# Rights added by each ABI version, to handle exactly what the kernel knows.
_FS_BY_ABI = {1: (1 << 13) - 1, 2: REFER, 3: TRUNCATE, 5: IOCTL_DEV}
_FILE_ONLY = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV


class LandlockError(OSError):
    """A Landlock call failed; the message says which and why."""


def _load() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall, prctl = libc.syscall, libc.prctl
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return libc


_libc = _load()


def _call(what: str, *args: object) -> int:
    assert _libc is not None
    result = _libc.syscall(*args)
    if result < 0:
        code = ctypes.get_errno()
        raise LandlockError(code, f"{what}: {os.strerror(code)}")
    return int(result)


def abi_version() -> int:
    """The Landlock ABI this kernel offers (1, 2, ...), or 0 when it has none (or it is disabled)."""
    if _libc is None:
        return 0
    try:
        return _call(
            "landlock_create_ruleset",
            ctypes.c_long(_SYS_CREATE_RULESET),
            None,
            ctypes.c_size_t(0),
            ctypes.c_uint32(_CREATE_RULESET_VERSION),
        )
    except LandlockError:
        return 0


def fs_rights(abi: int) -> int:
    """Every file-system right the ABI version ``abi`` knows (0 for none)."""
    return sum(bits for version, bits in _FS_BY_ABI.items() if version <= abi)


def drop_capabilities(capabilities: Iterable[int] = ESCAPING_CAPABILITIES) -> int:
    """Drop ``capabilities`` from the calling thread's bounding set; how many were dropped.

    Without ``CAP_SETPCAP`` (not root) nothing can be dropped and nothing needs to be:
    a program started with ``no_new_privs`` gains no capability.
    """
    assert _libc is not None
    dropped = 0
    for capability in capabilities:
        if _libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) == 0:
            dropped += 1
    return dropped


class Ruleset:
    """A ruleset under construction: handled rights, then rules, then :meth:`restrict_self`.

    ``abi`` is the kernel's version (:func:`abi_version`); rights it does not
    know are left out of what is handled and of every rule, so one policy
    works on every kernel with the protection that kernel can give. ``net``
    handles TCP bind and connect (ABI 4+): with no port rule, none is
    allowed. ``scopes`` (ABI 6+) keeps signals and abstract UNIX sockets
    inside the domain.
    """

    def __init__(self, abi: int, *, net: bool = False, scopes: int = 0) -> None:
        if abi < 1:
            raise LandlockError(errno.EOPNOTSUPP, "Landlock is not available on this kernel")
        self.abi = abi
        self.fs = fs_rights(abi)
        self.net = (NET_BIND_TCP | NET_CONNECT_TCP) if net and abi >= 4 else 0
        self.scopes = scopes if abi >= 6 else 0
        if abi >= 6:
            attr = struct.pack("=QQQ", self.fs, self.net, self.scopes)
        elif abi >= 4:
            attr = struct.pack("=QQ", self.fs, self.net)
        else:
            attr = struct.pack("=Q", self.fs)
        buffer = ctypes.create_string_buffer(attr, len(attr))
        self.fd = _call(
            "landlock_create_ruleset",
            ctypes.c_long(_SYS_CREATE_RULESET),
            buffer,
            ctypes.c_size_t(len(attr)),
            ctypes.c_uint32(0),
        )

    def allow_path(self, path: str | os.PathLike[str], rights: int) -> None:
        """Grant ``rights`` beneath ``path`` (a directory) or on it (a file: only the file rights count).

        A path that does not exist is skipped (a missing ``/dev/full`` takes nothing away).
        """
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            allowed = rights & self.fs
            if not os.path.isdir(f"/proc/self/fd/{fd}"):
                allowed &= _FILE_ONLY
            if not allowed:
                return
            attr = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)
            _call(
                f"landlock_add_rule({os.fspath(path)!r})",
                ctypes.c_long(_SYS_ADD_RULE),
                ctypes.c_int(self.fd),
                ctypes.c_int(_RULE_PATH_BENEATH),
                attr,
                ctypes.c_uint32(0),
            )
        finally:
            os.close(fd)

    def allow_ports(self, ports: Iterable[int], rights: int = NET_CONNECT_TCP) -> None:
        """Allow ``rights`` (connect by default) on each TCP port of ``ports`` (nothing before ABI 4)."""
        allowed = rights & self.net
        for port in ports if allowed else ():
            attr = ctypes.create_string_buffer(struct.pack("=QQ", allowed, port), 16)
            _call(
                f"landlock_add_rule(port {port})",
                ctypes.c_long(_SYS_ADD_RULE),
                ctypes.c_int(self.fd),
                ctypes.c_int(_RULE_NET_PORT),
                attr,
                ctypes.c_uint32(0),
            )

    def restrict_self(self) -> None:
        """Confine the calling thread (and what it starts from now on) for good; sets ``no_new_privs`` first."""
        assert _libc is not None
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            code = ctypes.get_errno()
            raise LandlockError(code, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(code)}")
        _call("landlock_restrict_self", ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(self.fd), ctypes.c_uint32(0))

    def close(self) -> None:  # noqa: D401 - kept beside restrict_self
        """Release the ruleset's descriptor (a restricted thread keeps its confinement)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Ruleset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
