"""AT-SPI over D-Bus with dbus-fast: find the accessibility bus, call accessible objects, read one node.

AT-SPI is a D-Bus protocol: every accessible object is an object path on the
connection (bus name) of its application, with the interfaces
``org.a11y.atspi.Accessible``, ``Component`` (bounds), ``Text``, ``Value``,
``Action`` and others. The accessibility bus is a separate bus; its address
is found like libatspi finds it: ``AT_SPI_BUS_ADDRESS``, else the
``AT_SPI_BUS`` property of the X root window, else ``org.a11y.Bus.GetAddress``
on the session bus (at-spi2-core's launcher starts the bus on demand).

Speaking the protocol directly keeps the server free of PyGObject, which
needs a C compiler and GObject headers to install from PyPI. A tree read is
hundreds of small calls: dbus-fast's compiled (un)marshalling makes it about
twice as fast as a pure-Python D-Bus library.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from dbus_fast import Message, MessageType, Variant
from dbus_fast.aio import MessageBus

from saucer.tools.desktop import INSTALL_HINT, DesktopError

__all__ = [
    "Ref",
    "REGISTRY_ROOT",
    "STATE_NAMES",
    "AtspiBus",
    "ElementGone",
    "NodeInfo",
    "find_bus_address",
    "pair",
    "read_node",
    "read_details",
    "ALL_PARTS",
    "DETAILS",
    "short_interface",
]

logger = logging.getLogger("saucer.tools.desktop")

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
#: Above this many children, only the first ones the budget allows are asked for, one by one.
MANY_CHILDREN = 256
_MANY_CHILDREN = MANY_CHILDREN
#: Longest name or description kept (the rest is cut; the node says the full length).
MAX_NAME = 1000
# Objects whose role and interfaces a bus connection remembers (the oldest are forgotten first).
_STATIC_SIZE = 100_000
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
    "invalid",
    "active",
    "armed",
    "busy",
    "checked",
    "collapsed",
    "defunct",
    "editable",
    "enabled",
    "expandable",
    "expanded",
    "focusable",
    "focused",
    "has_tooltip",
    "horizontal",
    "iconified",
    "modal",
    "multi_line",
    "multiselectable",
    "opaque",
    "pressed",
    "resizable",
    "selectable",
    "selected",
    "sensitive",
    "showing",
    "single_line",
    "stale",
    "transient",
    "vertical",
    "visible",
    "manages_descendants",
    "indeterminate",
    "required",
    "truncated",
    "animated",
    "invalid_entry",
    "supports_autocompletion",
    "selectable_text",
    "is_default",
    "visited",
    "checkable",
    "has_popup",
    "read_only",
)


class ElementGone(DesktopError):
    """The accessible object (or its whole application) no longer exists."""


def short_interface(name: str) -> str:
    """``org.a11y.atspi.Text`` -> ``Text``."""
    return name[len(_PREFIX) :] if name.startswith(_PREFIX) else name


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


_PROPERTIES = "org.freedesktop.DBus.Properties"


async def _open(address: str, timeout: float) -> MessageBus:
    try:
        async with asyncio.timeout(timeout):
            return await MessageBus(bus_address=address).connect()
    except TimeoutError:
        raise DesktopError(f"the D-Bus bus at {address} did not answer within {timeout:g} s") from None
    except Exception as exc:  # OSError, AuthError, InvalidAddressError, ...: all mean "no usable bus there"
        raise DesktopError(f"cannot connect to the D-Bus bus at {address}: {exc or type(exc).__name__}") from None


def pair(value: Any) -> tuple[Any, Any] | None:
    """A D-Bus struct of two (a list or a tuple), else None."""
    return (value[0], value[1]) if isinstance(value, (list, tuple)) and len(value) == 2 else None


async def find_bus_address(
    x_property: Callable[[], Awaitable[str | None]] | None, timeout: float, stale: list[str] | None = None
) -> str:
    """The accessibility bus address (see the module docstring); ``x_property`` reads the X root property.

    An ``AT_SPI_BUS`` property whose bus does not answer is skipped (and appended to ``stale``)."""
    explicit = os.environ.get("AT_SPI_BUS_ADDRESS")
    if explicit:
        return explicit
    if x_property is not None:
        found = None
        with contextlib.suppress(DesktopError):
            found = await x_property()
        if found:
            try:
                probe = await _open(found, timeout)
            except DesktopError as exc:
                # Left by an accessibility bus that is gone (a killed session): the session bus knows the live one.
                logger.warning(
                    "desktop: the X root window's AT_SPI_BUS (%s) is stale (%s); asking the session bus", found, exc
                )
                if stale is not None:
                    stale.append(found)
            else:
                probe.disconnect()
                return found
    session = os.environ.get("DBUS_SESSION_BUS_ADDRESS")
    if not session:
        why = f"the X root window's AT_SPI_BUS ({stale[-1]}) is stale" if stale else "no AT_SPI_BUS address was found"
        raise _no_bus(f"DBUS_SESSION_BUS_ADDRESS is not set and {why}")
    try:
        bus = await _open(session, timeout)
    except DesktopError as exc:
        raise _no_bus(str(exc)) from None
    launcher, launcher_path = "org.a11y.Bus", "/org/a11y/bus"
    try:
        async with asyncio.timeout(timeout):
            # Toolkits that check it (Qt, Chromium) expose their UI only when this is on.
            await bus.call(
                Message(
                    destination=launcher,
                    path=launcher_path,
                    interface=_PROPERTIES,
                    member="Set",
                    signature="ssv",
                    body=["org.a11y.Status", "IsEnabled", Variant("b", True)],
                )
            )
            reply = await bus.call(
                Message(destination=launcher, path=launcher_path, interface="org.a11y.Bus", member="GetAddress")
            )
    except TimeoutError:
        raise _no_bus(f"the accessibility bus launcher did not answer within {timeout:g} s") from None
    except Exception as exc:
        raise _no_bus(f"the session bus connection failed ({type(exc).__name__}: {exc})") from None
    finally:
        bus.disconnect()
    if reply.message_type == MessageType.ERROR or not reply.body:
        raise _no_bus(
            f"the session bus has no accessibility bus launcher (org.a11y.Bus: {reply.error_name}); "
            "is at-spi2-core installed?"
        )
    return str(reply.body[0])


class AtspiBus:
    """One connection to the accessibility bus; every call is bounded by ``timeout`` seconds."""

    def __init__(self, bus: MessageBus, address: str, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._bus = bus
        self._slots = asyncio.Semaphore(_MAX_IN_FLIGHT)
        #: Role and interfaces of the objects read so far (an object keeps both for its life): a tree read
        #: again, as the operator does before each step, asks only for what changes.
        self.static: dict[Ref, tuple[str, frozenset[str], int]] = {}

    @classmethod
    async def connect(cls, address: str, timeout: float) -> AtspiBus:
        """Connect to the accessibility bus at ``address``."""
        return cls(await _open(address, timeout), address, timeout)

    @property
    def closed(self) -> bool:
        """True once the connection is gone (the bus stopped, or :meth:`close` was called)."""
        return not self._bus.connected

    async def close(self) -> None:
        """Close the connection."""
        with contextlib.suppress(Exception):
            self._bus.disconnect()
            await self._bus.wait_for_disconnect()  # type: ignore[no-untyped-call]  # dbus_fast leaves it unannotated

    async def call(
        self, ref: Ref, interface: str, method: str, signature: str = "", body: tuple[Any, ...] = ()
    ) -> list[Any]:
        """Call ``interface.method`` on ``ref``; errors are :class:`DesktopError` (:class:`ElementGone` when it vanished)."""
        message = Message(
            destination=ref[0], path=ref[1], interface=interface, member=method, signature=signature, body=list(body)
        )
        return await self._send(message, f"{short_interface(interface)}.{method}", ref)

    async def call1(
        self, ref: Ref, interface: str, method: str, signature: str = "", body: tuple[Any, ...] = ()
    ) -> Any:
        """The first value :meth:`call` returns (an application answering nothing is an error, not a crash)."""
        reply = await self.call(ref, interface, method, signature, body)
        if not reply:
            raise DesktopError(f"{short_interface(interface)}.{method} on {ref[1]} of {ref[0]} returned nothing")
        return reply[0]

    async def get(self, ref: Ref, interface: str, name: str) -> Any:
        """One property of ``ref``."""
        value = await self.call1(ref, _PROPERTIES, "Get", "ss", (interface, name))
        if not isinstance(value, Variant):
            raise DesktopError(f"property {short_interface(interface)}.{name} of {ref[1]} of {ref[0]} is malformed")
        return value.value

    async def get_all(self, ref: Ref, interface: str) -> dict[str, Any]:
        """All properties of one interface of ``ref``, by name (empty when the application sends none)."""
        reply = await self.call(ref, _PROPERTIES, "GetAll", "s", (interface,))
        values = reply[0] if reply and isinstance(reply[0], dict) else {}
        return {key: variant.value for key, variant in values.items() if isinstance(variant, Variant)}

    async def pid_of(self, bus_name: str) -> int | None:
        """The process id of the application owning ``bus_name`` (None when the bus does not say)."""
        daemon = ("org.freedesktop.DBus", "/org/freedesktop/DBus")
        with contextlib.suppress(DesktopError, TypeError, ValueError):
            return int(await self.call1(daemon, "org.freedesktop.DBus", "GetConnectionUnixProcessID", "s", (bus_name,)))
        return None

    async def _send(self, message: Message, what: str, ref: Ref) -> list[Any]:
        try:
            async with self._slots, asyncio.timeout(self.timeout):
                reply = await self._bus.call(message)
        except TimeoutError:
            raise DesktopError(
                f"the application {ref[0]} did not answer {what} within {self.timeout:g} s (is it busy or frozen?)"
            ) from None
        except Exception as exc:  # the bus went away, or the message could not be sent
            raise DesktopError(f"the accessibility bus connection failed ({type(exc).__name__}: {exc})") from None
        if reply.message_type == MessageType.ERROR:
            detail = reply.body[0] if reply.body and isinstance(reply.body[0], str) else ""
            if reply.error_name in _GONE_ERRORS:
                raise ElementGone(f"the element {ref[1]} of {ref[0]} no longer exists ({what}: {reply.error_name})")
            raise DesktopError(f"{what} failed on {ref[1]}: {reply.error_name} {detail}".strip())
        return list(reply.body)


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
    #: Lengths before the cut at MAX_NAME characters (a hostile application may send megabytes).
    name_length: int = 0
    description_length: int = 0
    bounds: tuple[int, int, int, int] | None = None
    text: str | None = None
    text_length: int = 0
    value: dict[str, float] | None = None
    actions: list[str] = field(default_factory=list)
    children: list[Ref] = field(default_factory=list)


async def read_node(bus: AtspiBus, ref: Ref) -> NodeInfo:
    """Name, role, states, interfaces and child count of ``ref`` (four calls, sent together; two for an
    object read before, whose role and interfaces the bus remembers)."""
    static = bus.static
    known = static.get(ref)
    if known is not None:
        props, states = await asyncio.gather(bus.get_all(ref, ACCESSIBLE), bus.call1(ref, ACCESSIBLE, "GetState"))
        role, names, _ = known
    else:
        props, role, states, interfaces = await asyncio.gather(
            bus.get_all(ref, ACCESSIBLE),
            bus.call1(ref, ACCESSIBLE, "GetRoleName"),
            bus.call1(ref, ACCESSIBLE, "GetState"),
            bus.call1(ref, ACCESSIBLE, "GetInterfaces"),
        )
        role, names = str(role), frozenset(short_interface(i) for i in interfaces)
    name, description = str(props.get("Name") or ""), str(props.get("Description") or "")
    if len(static) >= _STATIC_SIZE and ref not in static:
        static.pop(next(iter(static)))
    static[ref] = (role, names, max(int(props.get("ChildCount") or 0), 0))
    return NodeInfo(
        ref=ref,
        name=name[:MAX_NAME],
        name_length=len(name),
        description=description[:MAX_NAME],
        description_length=len(description),
        role=role,
        states=decode_states(states),
        interfaces=names,
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
        refs = [reply[0] for reply in replies if isinstance(reply, (list, tuple)) and reply]
    pairs = [pair(ref) for ref in refs]
    return [(str(p[0]), str(p[1])) for p in pairs if p is not None and p[0] and p[1] != NULL_PATH]


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


#: What :func:`read_details` can read.
ALL_PARTS = frozenset({"children", "bounds", "text", "value", "actions"})
DETAILS = ALL_PARTS - {"children"}


async def read_details(
    bus: AtspiBus, info: NodeInfo, *, max_text: int = 0, child_budget: int = 0, parts: frozenset[str] = ALL_PARTS
) -> NodeInfo:
    """Fill in the ``parts`` of ``info`` it has interfaces for: children refs (at most ``child_budget``
    when there are many), bounds, text, value and actions; the calls are sent together."""
    ref = info.ref
    jobs: dict[str, Awaitable[Any]] = {}
    if "children" in parts:
        jobs["children"] = _optional(_children(bus, info, child_budget))
    if "bounds" in parts and "Component" in info.interfaces:
        jobs["bounds"] = _optional(bus.call1(ref, COMPONENT, "GetExtents", "u", (_COORD_SCREEN,)))
    if "text" in parts and "Text" in info.interfaces:
        jobs["text"] = _optional(_text(bus, ref, max_text))
    if "value" in parts and "Value" in info.interfaces:
        jobs["value"] = _optional(_value(bus, ref))
    if "actions" in parts and "Action" in info.interfaces:
        jobs["actions"] = _optional(bus.call1(ref, ACTION, "GetActions"))
    results = dict(zip(jobs, await asyncio.gather(*jobs.values()), strict=False))
    if "children" in parts:
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
        info.actions = [str(entry[0]) for entry in results["actions"] if isinstance(entry, (list, tuple)) and entry]
    return info
