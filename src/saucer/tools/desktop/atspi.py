"""AT-SPI over D-Bus with jeepney: find the accessibility bus, call accessible objects, read one node.

AT-SPI is a D-Bus protocol: every accessible object is an object path on the
connection (bus name) of its application, with the interfaces
``org.a11y.atspi.Accessible``, ``Component`` (bounds), ``Text``, ``Value``,
``Action`` and others. The accessibility bus is a separate bus; its address
is found like libatspi finds it: ``AT_SPI_BUS_ADDRESS``, else the
``AT_SPI_BUS`` property of the X root window, else ``org.a11y.Bus.GetAddress``
on the session bus (at-spi2-core's launcher starts the bus on demand).

Speaking the protocol directly keeps the server free of PyGObject, which
needs a C compiler and GObject headers to install from PyPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from jeepney import DBusAddress, MessageType, Properties, new_method_call
from jeepney.bus_messages import message_bus
from jeepney.io.asyncio import DBusConnection, DBusRouter, open_dbus_connection
from jeepney.wrappers import DBusErrorResponse

from saucer.tools.desktop import INSTALL_HINT, DesktopError

__all__ = [
    "Ref",
    "REGISTRY_ROOT",
    "STATE_NAMES",
    "AtspiBus",
    "ElementGone",
    "NodeInfo",
    "find_bus_address",
    "read_node",
    "read_details",
    "short_interface",
]

#: An accessible object: (bus name of its application, object path).
Ref = tuple[str, str]
REGISTRY_ROOT: Ref = ("org.a11y.atspi.Registry", "/org/a11y/atspi/accessible/root")
NULL_PATH = "/org/a11y/atspi/null"
#: The path of every application's root accessible (the parent of its top-level windows).
APP_ROOT_PATH = "/org/a11y/atspi/accessible/root"
_PREFIX = "org.a11y.atspi."
ACCESSIBLE = _PREFIX + "Accessible"
COMPONENT = _PREFIX + "Component"
TEXT = _PREFIX + "Text"
VALUE = _PREFIX + "Value"
ACTION = _PREFIX + "Action"
_COORD_SCREEN = 0
# Above this many children, only the first ones the budget allows are asked for, one by one.
_MANY_CHILDREN = 256
# D-Bus daemons cap the replies a connection may wait for; stay well below the usual limits.
_MAX_IN_FLIGHT = 64
_GONE_ERRORS = {
    "org.freedesktop.DBus.Error.UnknownObject",
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.NoReply",
    "org.freedesktop.DBus.Error.Disconnected",
}

#: AtspiStateType, in the order of at-spi2-core's atspi-constants.h (bit n of the state set).
STATE_NAMES: tuple[str, ...] = (
    "invalid", "active", "armed", "busy", "checked", "collapsed", "defunct", "editable", "enabled",
    "expandable", "expanded", "focusable", "focused", "has_tooltip", "horizontal", "iconified", "modal",
    "multi_line", "multiselectable", "opaque", "pressed", "resizable", "selectable", "selected", "sensitive", "showing",
    "single_line", "stale", "transient", "vertical", "visible", "manages_descendants", "indeterminate",
    "required", "truncated", "animated", "invalid_entry", "supports_autocompletion", "selectable_text",
    "is_default", "visited", "checkable", "has_popup", "read_only",
)


class ElementGone(DesktopError):
    """The accessible object (or its whole application) no longer exists."""


def short_interface(name: str) -> str:
    """``org.a11y.atspi.Text`` -> ``Text``."""
    return name[len(_PREFIX):] if name.startswith(_PREFIX) else name


def decode_states(words: Any) -> frozenset[str]:
    """The names of the bits set in an AT-SPI state set (two 32-bit words)."""
    names = set()
    for index, word in enumerate(list(words)[:2]):
        for bit in range(32):
            if int(word) >> bit & 1:
                position = index * 32 + bit
                names.add(STATE_NAMES[position] if position < len(STATE_NAMES) else f"state_{position}")
    return frozenset(names)


def _no_bus(reason: str) -> DesktopError:
    return DesktopError(
        f"no accessibility bus: {reason}. The desktop server reads UI trees over AT-SPI, which needs a D-Bus "
        f"session bus and at-spi2-core (Debian: {INSTALL_HINT}); run saucer inside a desktop session, or "
        "start one with `dbus-run-session -- COMMAND` (under Xvfb: `xvfb-run -a dbus-run-session -- COMMAND`)"
    )


async def _open(address: str, timeout: float) -> DBusConnection:
    try:
        async with asyncio.timeout(timeout):
            return await open_dbus_connection(address)
    except TimeoutError:
        raise DesktopError(f"the D-Bus bus at {address} did not answer within {timeout:g} s") from None
    except (OSError, EOFError, RuntimeError, ValueError, KeyError, StopIteration) as exc:
        raise DesktopError(f"cannot connect to the D-Bus bus at {address}: {exc or type(exc).__name__}") from None


async def find_bus_address(x_property: Callable[[], Awaitable[str | None]] | None, timeout: float) -> str:
    """The accessibility bus address (see the module docstring); ``x_property`` reads the X root property."""
    explicit = os.environ.get("AT_SPI_BUS_ADDRESS")
    if explicit:
        return explicit
    if x_property is not None:
        with contextlib.suppress(DesktopError):
            found = await x_property()
            if found:
                return found
    session = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
    if not session:
        raise _no_bus("DBUS_SESSION_BUS_ADDRESS is not set and no AT_SPI_BUS address was found")
    try:
        conn = await _open(session, timeout)
    except DesktopError as exc:
        raise _no_bus(str(exc)) from None
    try:
        router = DBusRouter(conn)
        async with router:
            launcher = DBusAddress("/org/a11y/bus", bus_name="org.a11y.Bus", interface="org.a11y.Bus")
            async with asyncio.timeout(timeout):
                # Toolkits that check it (Qt, Chromium) expose their UI only when this is on.
                await router.send_and_get_reply(
                    Properties(DBusAddress("/org/a11y/bus", bus_name="org.a11y.Bus", interface="org.a11y.Status"))
                    .set("IsEnabled", "b", True)
                )
                reply = await router.send_and_get_reply(new_method_call(launcher, "GetAddress"))
    except TimeoutError:
        raise _no_bus(f"the accessibility bus launcher did not answer within {timeout:g} s") from None
    finally:
        await conn.close()
    if reply.header.message_type == MessageType.error:
        error = DBusErrorResponse(reply)
        raise _no_bus(f"the session bus has no accessibility bus launcher (org.a11y.Bus: {error.name}); "
                      "is at-spi2-core installed?")
    return str(reply.body[0])


class AtspiBus:
    """One connection to the accessibility bus; every call is bounded by ``timeout`` seconds."""

    def __init__(self, conn: DBusConnection, router: DBusRouter, address: str, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._conn = conn
        self._router = router
        self._slots = asyncio.Semaphore(_MAX_IN_FLIGHT)

    @classmethod
    async def connect(cls, address: str, timeout: float) -> "AtspiBus":
        """Connect to the accessibility bus at ``address``."""
        conn = await _open(address, timeout)
        return cls(conn, DBusRouter(conn), address, timeout)

    @property
    def closed(self) -> bool:
        """True once the connection is gone (the bus stopped, or :meth:`close` was called)."""
        return self._router._rcv_task.done()  # noqa: SLF001 - jeepney exposes no other liveness check

    async def close(self) -> None:
        """Close the connection."""
        with contextlib.suppress(Exception):
            await self._router.__aexit__(None, None, None)
        with contextlib.suppress(Exception):
            await self._conn.close()

    async def call(self, ref: Ref, interface: str, method: str, signature: str | None = None, body: tuple = ()) -> tuple:
        """Call ``interface.method`` on ``ref``; errors are :class:`DesktopError` (:class:`ElementGone` when it vanished)."""
        bus_name, path = ref
        message = new_method_call(DBusAddress(path, bus_name=bus_name, interface=interface), method, signature, body)
        return await self._send(message, f"{short_interface(interface)}.{method}", ref)

    async def call1(self, ref: Ref, interface: str, method: str, signature: str | None = None, body: tuple = ()) -> Any:
        """The first value :meth:`call` returns (an application answering nothing is an error, not a crash)."""
        reply = await self.call(ref, interface, method, signature, body)
        if not reply:
            raise DesktopError(f"{short_interface(interface)}.{method} on {ref[1]} of {ref[0]} returned nothing")
        return reply[0]

    async def get(self, ref: Ref, interface: str, name: str) -> Any:
        """One property of ``ref``."""
        message = Properties(DBusAddress(ref[1], bus_name=ref[0], interface=interface)).get(name)
        reply = await self._send(message, f"{short_interface(interface)}.{name}", ref)
        if not reply or not isinstance(reply[0], tuple) or len(reply[0]) != 2:
            raise DesktopError(f"property {short_interface(interface)}.{name} of {ref[1]} of {ref[0]} is malformed")
        return reply[0][1]

    async def get_all(self, ref: Ref, interface: str) -> dict[str, Any]:
        """All properties of one interface of ``ref``, by name (empty when the application sends none)."""
        message = Properties(DBusAddress(ref[1], bus_name=ref[0], interface=interface)).get_all()
        reply = await self._send(message, f"{short_interface(interface)} properties", ref)
        values = reply[0] if reply and isinstance(reply[0], dict) else {}
        return {key: variant[1] for key, variant in values.items() if isinstance(variant, tuple) and len(variant) == 2}

    async def pid_of(self, bus_name: str) -> int | None:
        """The process id of the application owning ``bus_name`` (None when the bus does not say)."""
        with contextlib.suppress(DesktopError):
            (pid,) = await self._send(message_bus.GetConnectionUnixProcessID(bus_name), "process id", (bus_name, "/"))
            return int(pid)
        return None

    async def _send(self, message: Any, what: str, ref: Ref) -> tuple:
        try:
            async with self._slots, asyncio.timeout(self.timeout):
                reply = await self._router.send_and_get_reply(message)
        except TimeoutError:
            raise DesktopError(
                f"the application {ref[0]} did not answer {what} within {self.timeout:g} s (is it busy or frozen?)"
            ) from None
        except Exception as exc:  # jeepney raises RouterClosed, OSError, ... when the bus goes away
            raise DesktopError(f"the accessibility bus connection failed ({type(exc).__name__}: {exc})") from None
        if reply.header.message_type == MessageType.error:
            error = DBusErrorResponse(reply)
            detail = error.data[0] if error.data and isinstance(error.data[0], str) else ""
            if error.name in _GONE_ERRORS:
                raise ElementGone(f"the element {ref[1]} of {ref[0]} no longer exists ({what}: {error.name})")
            raise DesktopError(f"{what} failed on {ref[1]}: {error.name} {detail}".strip())
        return tuple(reply.body)


@dataclass
class NodeInfo:
    """What AT-SPI says about one accessible object."""

    ref: Ref
    name: str
    role: str
    states: frozenset[str]
    interfaces: frozenset[str]
    child_count: int
    description: str = ""
    bounds: tuple[int, int, int, int] | None = None
    text: str | None = None
    text_length: int = 0
    value: dict[str, float] | None = None
    actions: list[str] = field(default_factory=list)
    children: list[Ref] = field(default_factory=list)


async def read_node(bus: AtspiBus, ref: Ref) -> NodeInfo:
    """Name, role, states, interfaces and child count of ``ref`` (four calls, sent together)."""
    props, role, states, interfaces = await asyncio.gather(
        bus.get_all(ref, ACCESSIBLE),
        bus.call1(ref, ACCESSIBLE, "GetRoleName"),
        bus.call1(ref, ACCESSIBLE, "GetState"),
        bus.call1(ref, ACCESSIBLE, "GetInterfaces"),
    )
    return NodeInfo(
        ref=ref,
        name=str(props.get("Name") or ""),
        description=str(props.get("Description") or ""),
        role=str(role),
        states=decode_states(states),
        interfaces=frozenset(short_interface(i) for i in interfaces),
        child_count=max(int(props.get("ChildCount") or 0), 0),
    )


async def _children(bus: AtspiBus, info: NodeInfo, budget: int) -> list[Ref]:
    if info.child_count <= 0 or budget <= 0:
        return []
    if info.child_count <= _MANY_CHILDREN:
        refs = await bus.call1(info.ref, ACCESSIBLE, "GetChildren")
    else:
        wanted = min(info.child_count, budget)
        replies = await asyncio.gather(
            *(bus.call(info.ref, ACCESSIBLE, "GetChildAtIndex", "i", (i,)) for i in range(wanted)),
            return_exceptions=True,
        )
        refs = [reply[0] for reply in replies if isinstance(reply, tuple) and reply]
    return [(str(b), str(p)) for b, p in refs if p != NULL_PATH and b]


async def _text(bus: AtspiBus, ref: Ref, max_text: int) -> tuple[str, int]:
    length = int(await bus.get(ref, TEXT, "CharacterCount"))
    if length <= 0 or max_text <= 0:
        return "", max(length, 0)
    text = await bus.call1(ref, TEXT, "GetText", "ii", (0, min(length, max_text)))
    return str(text)[:max_text], length


async def _value(bus: AtspiBus, ref: Ref) -> dict[str, float]:
    props = await bus.get_all(ref, VALUE)
    keys = {"CurrentValue": "current", "MinimumValue": "min", "MaximumValue": "max"}
    return {short: float(props[key]) for key, short in keys.items() if key in props}


async def _optional(awaitable: Awaitable[Any]) -> Any:
    """The value, or None when the object does not really implement what it announced."""
    try:
        return await awaitable
    except ElementGone:
        raise
    except DesktopError:
        return None


async def read_details(bus: AtspiBus, info: NodeInfo, *, max_text: int, child_budget: int) -> NodeInfo:
    """Fill in bounds, text, value, actions and children refs of ``info`` (calls sent together)."""
    ref = info.ref
    jobs: dict[str, Awaitable[Any]] = {"children": _optional(_children(bus, info, child_budget))}
    if "Component" in info.interfaces:
        jobs["bounds"] = _optional(bus.call1(ref, COMPONENT, "GetExtents", "u", (_COORD_SCREEN,)))
    if "Text" in info.interfaces:
        jobs["text"] = _optional(_text(bus, ref, max_text))
    if "Value" in info.interfaces:
        jobs["value"] = _optional(_value(bus, ref))
    if "Action" in info.interfaces:
        jobs["actions"] = _optional(bus.call1(ref, ACTION, "GetActions"))
    results = dict(zip(jobs, await asyncio.gather(*jobs.values())))
    info.children = results["children"] or []
    if results.get("bounds"):
        x, y, w, h = results["bounds"]
        info.bounds = (int(x), int(y), int(w), int(h))
    if results.get("text"):
        info.text, info.text_length = results["text"]
    if results.get("value"):
        info.value = results["value"]
    if results.get("actions"):
        # Kept in order and complete: DoAction takes the position in this list.
        info.actions = [str(entry[0]) for entry in results["actions"] if isinstance(entry, tuple) and entry]
    return info
