"""The X11 side with python-xlib: screen capture, top-level windows, and input through the XTEST extension.

Every method blocks on the X connection; the server calls them from a worker
thread, one at a time. Key names are X keysym names (``Return``, ``Tab``,
``BackSpace``, ``F5``, ``a``) or the usual short forms (``enter``, ``esc``,
``ctrl``, ``pgup``); a combination joins them with ``+`` (``ctrl+shift+t``) and
a sequence separates combinations with spaces (``ctrl+a BackSpace``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from PIL import Image
from Xlib import XK, X, display, error
from Xlib.ext import xtest

from saucer.tools.desktop import INSTALL_HINT, DesktopError

__all__ = ["X11", "XWindow", "parse_keys", "char_keysym", "X_LOST", "X_REFUSED"]

for _group in ("xkb", "xf86", "latin2", "latin3", "latin4", "greek", "cyrillic", "publishing"):
    XK.load_keysym_group(_group)

#: What python-xlib raises when the connection to the X server is gone, and when one request failed.
X_LOST: tuple[type[BaseException], ...] = (error.ConnectionClosedError, error.DisplayError, OSError)
X_REFUSED = error.XError
# The connection is gone or the server refused a request: what a best-effort clean-up may meet.
_X_CLEANUP_FAILURES: tuple[type[BaseException], ...] = (*X_LOST, X_REFUSED)

_MODIFIERS = {
    "ctrl": "Control_L",
    "control": "Control_L",
    "shift": "Shift_L",
    "alt": "Alt_L",
    "meta": "Meta_L",
    "super": "Super_L",
    "win": "Super_L",
    "cmd": "Super_L",
    "altgr": "ISO_Level3_Shift",
}
_KEYS = {
    "enter": "Return",
    "return": "Return",
    "esc": "Escape",
    "escape": "Escape",
    "backspace": "BackSpace",
    "tab": "Tab",
    "space": "space",
    "del": "Delete",
    "delete": "Delete",
    "ins": "Insert",
    "insert": "Insert",
    "home": "Home",
    "end": "End",
    "pgup": "Prior",
    "pageup": "Prior",
    "pgdn": "Next",
    "pagedown": "Next",
    "up": "Up",
    "down": "Down",
    "left": "Left",
    "right": "Right",
    "plus": "plus",
    "minus": "minus",
    "menu": "Menu",
    "print": "Print",
    "capslock": "Caps_Lock",
}
_SPECIAL_CHARS = {"\n": "Return", "\r": "Return", "\t": "Tab", " ": "space", "\b": "BackSpace"}
_BUTTONS = {"left": 1, "middle": 2, "right": 3}
_WHEEL = {"up": 4, "down": 5, "left": 6, "right": 7}
# Time for clients to see a changed keyboard mapping before a key on it is pressed.
_REMAP_SETTLE = 0.05


def char_keysym(char: str) -> int:
    """The keysym that types ``char`` (Latin-1 keysyms equal their code point, others are 0x01000000 + it)."""
    if char in _SPECIAL_CHARS:
        return XK.string_to_keysym(_SPECIAL_CHARS[char])
    point = ord(char)
    if 0x20 <= point <= 0x7E or 0xA0 <= point <= 0xFF:
        return point
    return 0x01000000 | point


def _keysym(name: str, spec: str) -> int:
    lowered = name.lower()
    name = _MODIFIERS.get(lowered) or _KEYS.get(lowered) or name
    if re.fullmatch(r"f([1-9]|1[0-9]|2[0-4])", name, re.IGNORECASE):
        name = name.upper()
    keysym = XK.string_to_keysym(name)
    if keysym == 0 and len(name) == 1:
        keysym = char_keysym(name)
    if keysym == 0:
        raise DesktopError(
            f"unknown key {name!r} in {spec!r}: use X key names such as Return, Tab, Escape, BackSpace, Delete, "
            "Left, F5, a, plus, or ctrl, shift, alt, super in combinations like ctrl+a"
        )
    return keysym


def parse_keys(spec: str) -> list[list[int]]:
    """``"ctrl+a BackSpace"`` -> one list of keysyms per combination (modifiers first)."""
    combos = spec.split()
    if not combos:
        raise DesktopError("keys is empty: give key names such as 'ctrl+a', 'Return' or 'ctrl+a BackSpace'")
    parsed = []
    for combo in combos:
        if combo.endswith("++"):  # "ctrl++": the last key is the plus sign
            names = [*combo[:-2].split("+"), "plus"] if len(combo) > 2 else ["plus"]
        elif combo == "+":
            names = ["plus"]
        else:
            names = combo.split("+")
        if any(not n for n in names):
            raise DesktopError(f"{combo!r} in {spec!r} has an empty key name (write the plus key as 'plus')")
        parsed.append([_keysym(n, spec) for n in names])
    return parsed


@dataclass
class XWindow:
    """A top-level window as X11 knows it."""

    id: int
    title: str
    app: str
    pid: int | None
    x: int
    y: int
    width: int
    height: int
    focused: bool
    frame: tuple[int, int, int, int] | None  # _GTK_FRAME_EXTENTS: left, right, top, bottom
    #: The first part of ``WM_CLASS`` (usually the program's name; ``app`` is the class, e.g. ``Mousepad``).
    instance: str = ""


def _frame_extents(value: Sequence[int]) -> tuple[int, int, int, int] | None:
    """``_GTK_FRAME_EXTENTS`` (left, right, top, bottom) as ints, or None when the property is short."""
    if len(value) < 4:
        return None
    left, right, top, bottom = (int(v) for v in value[:4])
    return left, right, top, bottom


class X11:
    """One connection to an X display (``DISPLAY`` unless a name is given)."""

    def __init__(self, name: str | None = None) -> None:
        name = name or os.environ.get("DISPLAY")
        if not name:
            raise DesktopError(
                "no X display: DISPLAY is not set. The desktop server needs an X11 display; on a machine "
                f"without one, start a virtual display (Debian: {INSTALL_HINT}; then `Xvfb :99 &` and "
                "DISPLAY=:99, or run saucer under `xvfb-run -a dbus-run-session -- COMMAND`). A server from "
                "[mcp.servers] gets DISPLAY only through its env table"
            )
        try:
            self.d = display.Display(name)
        except (error.DisplayError, error.ConnectionClosedError, OSError) as exc:
            raise DesktopError(
                f"cannot open the X display {name!r} ({exc}); is the X server (e.g. Xvfb) running? "
                f"Debian packages: {INSTALL_HINT}"
            ) from None
        self.name = name
        if not self.d.has_extension("XTEST"):
            self.d.close()
            raise DesktopError(f"the X display {name!r} has no XTEST extension, so input cannot be simulated")
        self.root = self.d.screen().root
        self._free: list[int] = []  # keycodes without keysyms
        self._borrowed: list[int] = []  # spare keycodes given a keysym by this connection, oldest first

    def close(self) -> None:
        """Give the borrowed keycodes back (best effort) and disconnect."""
        try:
            for code in self._borrowed:
                per_key = len(self.d.get_keyboard_mapping(code, 1)[0])
                self.d.change_keyboard_mapping(code, [(0,) * per_key])
            self._borrowed.clear()
            self.d.close()
        except _X_CLEANUP_FAILURES:
            pass

    def atom(self, name: str) -> int:
        return self.d.intern_atom(name)

    # -- screen -------------------------------------------------------------------------------
    def screen_size(self) -> tuple[int, int]:
        geometry = self.root.get_geometry()
        return int(geometry.width), int(geometry.height)

    def capture(self, x: int, y: int, width: int, height: int) -> Image.Image:
        """The pixels of a screen rectangle as an RGB image."""
        raw = self.root.get_image(x, y, width, height, X.ZPixmap, 0xFFFFFFFF)
        fmt = next((f for f in self.d.display.info.pixmap_formats if f.depth == raw.depth), None)
        if fmt is None:
            raise DesktopError(f"the X server sent an image of depth {raw.depth} without a pixel format")
        lsb = self.d.display.info.image_byte_order == X.LSBFirst
        modes = {32: "BGRX" if lsb else "XRGB", 24: "BGR" if lsb else "RGB", 16: "BGR;16"}
        mode = modes.get(fmt.bits_per_pixel)
        if mode is None or (fmt.bits_per_pixel == 16 and not lsb):
            raise DesktopError(f"screenshots of {fmt.bits_per_pixel}-bit displays are not supported")
        pad = fmt.scanline_pad
        stride = (width * fmt.bits_per_pixel + pad - 1) // pad * pad // 8
        data = raw.data if isinstance(raw.data, bytes) else bytes(raw.data, "latin-1")
        return Image.frombuffer("RGB", (width, height), data, "raw", mode, stride, 1).copy()

    def bus_address_property(self) -> str | None:
        """The ``AT_SPI_BUS`` property at-spi2-core's launcher puts on the root window, if any."""
        prop = self.root.get_full_property(self.atom("AT_SPI_BUS"), X.AnyPropertyType)
        if prop is None or not prop.value:
            return None
        value = prop.value
        return value.decode() if isinstance(value, bytes) else str(value)

    # -- windows ------------------------------------------------------------------------------
    def _text_property(self, window: Any, name: str) -> str | None:
        prop = window.get_full_property(self.atom(name), X.AnyPropertyType)
        if prop is None or prop.value is None:
            return None
        value = prop.value
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    def _parent(self, window_id: int) -> int:
        """The parent of a window (0 for the root, or when the window no longer exists)."""
        try:
            tree = self.d.create_resource_object("window", window_id).query_tree()
        except error.XError:
            return 0
        return tree.parent.id if tree.parent else 0

    def _top_of(self, window_id: int) -> int:
        """The child of the root that holds ``window_id`` (its window manager frame, or itself), or 0."""
        current, steps = window_id, 0
        while current and steps < 32:
            parent = self._parent(current)
            if parent == self.root.id:
                return current
            current, steps = parent, steps + 1
        return 0

    def focus_holder(self) -> int:
        """The window that gets the keyboard: the input focus, or under ``PointerRoot`` the top-level window
        below the pointer; 0 when there is none (focus ``None``, or the pointer over the bare root)."""
        focus = self.d.get_input_focus().focus
        focus_id = focus.id if hasattr(focus, "id") else int(focus)
        if focus_id == X.PointerRoot:
            child = self.root.query_pointer().child
            return child.id if hasattr(child, "id") and child.id else 0
        if focus_id in (X.NONE, self.root.id):
            return 0
        return focus_id

    def _clients(self) -> list[int]:
        """The client windows, bottom to top: ``_NET_CLIENT_LIST_STACKING`` (or ``_NET_CLIENT_LIST``) under an
        EWMH window manager; else the root's children (with ``WM_STATE``, a class or a name), a frame of a
        window manager that does not keep those lists replaced by the window inside it that has ``WM_STATE``."""
        for name in ("_NET_CLIENT_LIST_STACKING", "_NET_CLIENT_LIST"):
            listed = self.root.get_full_property(self.atom(name), X.AnyPropertyType)
            if listed is not None and len(listed.value):
                return [int(w) for w in listed.value]
        wm_state = self.atom("WM_STATE")
        found = []
        for child in self.root.query_tree().children:
            try:
                if (
                    child.get_full_property(wm_state, X.AnyPropertyType) is not None
                    or child.get_wm_class()
                    or child.get_wm_name()
                ):
                    found.append(child.id)
                    continue
                inner = [w for w in child.query_tree().children if w.get_full_property(wm_state, X.AnyPropertyType)]
                found.extend(w.id for w in inner[:1])
            except error.XError:
                continue  # closed while we looked at it
        return found

    def windows(self) -> list[XWindow]:
        """The mapped top-level windows, bottom to top, with or without a window manager.

        ``focused`` marks the window that gets the keyboard (:meth:`focus_holder`):
        the one holding the input focus or one of its children, or, under
        ``PointerRoot`` (a bare X server's default), the one below the pointer.
        """
        holder = self.focus_holder()
        chain: set[int] = set()
        current, steps = holder, 0
        while current and current != self.root.id and steps < 32:
            chain.add(current)
            current, steps = self._parent(current), steps + 1
        found = []
        for window_id in self._clients():
            window = self.d.create_resource_object("window", window_id)
            try:
                attrs = window.get_attributes()
                if attrs.override_redirect or attrs.map_state != X.IsViewable:
                    continue
                title = self._text_property(window, "_NET_WM_NAME") or window.get_wm_name() or ""
                wm_class = window.get_wm_class()
                if not title and not wm_class:
                    continue
                geometry = window.get_geometry()
                origin = self.root.translate_coords(window, 0, 0)
                pid = window.get_full_property(self.atom("_NET_WM_PID"), X.AnyPropertyType)
                frame = window.get_full_property(self.atom("_GTK_FRAME_EXTENTS"), X.AnyPropertyType)
                focused = bool(chain) and (window_id in chain or self._top_of(window_id) in chain)
                found.append(
                    XWindow(
                        id=window_id,
                        title=str(title),
                        app=wm_class[1] if wm_class else "",
                        pid=int(pid.value[0]) if pid is not None and len(pid.value) else None,
                        x=int(origin.x),
                        y=int(origin.y),
                        width=int(geometry.width),
                        height=int(geometry.height),
                        focused=focused,
                        frame=_frame_extents(frame.value) if frame is not None else None,
                        instance=wm_class[0] if wm_class else "",
                    )
                )
            except error.XError:
                continue  # closed while we looked at it
        return found

    def focus(self, window: XWindow) -> None:
        """Raise ``window`` and give it the input focus (asking the window manager too, when there is one)."""
        target = self.d.create_resource_object("window", window.id)
        catch = error.CatchError()
        target.configure(stack_mode=X.Above, onerror=catch)
        target.set_input_focus(X.RevertToParent, X.CurrentTime, onerror=catch)
        if self.root.get_full_property(self.atom("_NET_SUPPORTING_WM_CHECK"), X.AnyPropertyType) is not None:
            from Xlib.protocol import event

            message = event.ClientMessage(
                window=target, client_type=self.atom("_NET_ACTIVE_WINDOW"), data=(32, [2, X.CurrentTime, 0, 0, 0])
            )
            self.root.send_event(
                message, event_mask=X.SubstructureRedirectMask | X.SubstructureNotifyMask, onerror=catch
            )
        self.d.sync()
        if catch.get_error() is not None:
            raise DesktopError(f"could not focus window {window.id:#x} ({catch.get_error()})")

    def request_close(self, window_id: int) -> bool:
        """Ask a window to close as its close button would: a ``WM_DELETE_WINDOW`` message when the window
        takes it (``WM_PROTOCOLS``). False when it does not, or no longer exists."""
        from Xlib.protocol import event

        target = self.d.create_resource_object("window", window_id)
        delete = self.atom("WM_DELETE_WINDOW")
        try:
            protocols = target.get_wm_protocols() or []
        except error.XError:
            return False
        if delete not in protocols:
            return False
        message = event.ClientMessage(
            window=target, client_type=self.atom("WM_PROTOCOLS"), data=(32, [delete, X.CurrentTime, 0, 0, 0])
        )
        catch = error.CatchError()
        target.send_event(message, event_mask=X.NoEventMask, onerror=catch)
        self.d.sync()
        return catch.get_error() is None

    # -- pointer ------------------------------------------------------------------------------
    def _check_point(self, x: int, y: int) -> None:
        width, height = self.screen_size()
        if not (0 <= x < width and 0 <= y < height):
            raise DesktopError(f"point ({x}, {y}) is outside the screen ({width}x{height})")

    def _buttons(self, x: int, y: int, number: int, times: int) -> None:
        """Move the pointer to (x, y), then press and release button ``number`` ``times`` times."""
        self._check_point(x, y)
        xtest.fake_input(self.d, X.MotionNotify, x=x, y=y)
        for _ in range(times):
            xtest.fake_input(self.d, X.ButtonPress, number)
            xtest.fake_input(self.d, X.ButtonRelease, number)
        self.d.sync()

    def click(self, x: int, y: int, button: str = "left", count: int = 1) -> None:
        """Click ``count`` times at (x, y)."""
        self._buttons(x, y, _BUTTONS[button], count)

    def scroll(self, x: int, y: int, direction: str, amount: int) -> None:
        """Turn the wheel ``amount`` notches at (x, y) (X11 wheel buttons 4-7)."""
        self._buttons(x, y, _WHEEL[direction], amount)

    def pointer(self) -> tuple[int, int]:
        reply = self.root.query_pointer()
        return int(reply.root_x), int(reply.root_y)

    # -- keyboard -----------------------------------------------------------------------------
    def _keymap(self) -> dict[int, tuple[int, int]]:
        """keysym -> (keycode, level) from the server's current mapping (levels 0 and 1: plain and shifted)."""
        info = self.d.display.info
        first, count = info.min_keycode, info.max_keycode - info.min_keycode + 1
        mapping: dict[int, tuple[int, int]] = {}
        self._free = []
        for offset, syms in enumerate(self.d.get_keyboard_mapping(first, count)):
            if not any(syms):
                self._free.append(first + offset)
            for level, sym in enumerate(syms[:2]):
                if sym and sym not in mapping:
                    mapping[sym] = (first + offset, level)
        return mapping

    def _tap(self, keycode: int, shift: bool, shift_code: int, modifiers: Sequence[int] = ()) -> None:
        held = list(modifiers) + ([shift_code] if shift else [])
        for code in held:
            xtest.fake_input(self.d, X.KeyPress, code)
        xtest.fake_input(self.d, X.KeyPress, keycode)
        xtest.fake_input(self.d, X.KeyRelease, keycode)
        for code in reversed(held):
            xtest.fake_input(self.d, X.KeyRelease, code)

    def _map_spare(self, keysym: int, keymap: dict[int, tuple[int, int]]) -> int:
        """Put a keysym no key has on a spare keycode (as xdotool does) and return the keycode.

        The keycode keeps it afterwards: a client may look the key up only
        when it handles the event, so taking it back at once could turn the
        key into nothing. Spare keycodes are used in turn; one is reassigned
        only when all are taken. :meth:`close` clears them.
        """
        if self._free:
            code = self._free.pop(0)
        elif self._borrowed:
            code = self._borrowed.pop(0)
            for sym in [sym for sym, (kc, _) in keymap.items() if kc == code]:
                del keymap[sym]
        else:
            raise DesktopError(f"the keyboard has no free key to type keysym {keysym:#x} with")
        self._borrowed.append(code)
        per_key = len(self.d.get_keyboard_mapping(code, 1)[0])
        self.d.change_keyboard_mapping(code, [(keysym,) * per_key])
        self.d.sync()
        time.sleep(_REMAP_SETTLE)  # let clients see the new mapping before the key comes
        keymap[keysym] = (code, 0)
        return code

    def press(self, combos: list[list[int]], delay: float = 0.0) -> None:
        """Press each combination of keysyms (from :func:`parse_keys`) in turn."""
        keymap = self._keymap()
        shift_code = keymap.get(XK.string_to_keysym("Shift_L"), (0, 0))[0]
        for combo in combos:
            *mods, key = combo
            mod_codes = []
            for sym in mods:
                if sym not in keymap:
                    raise DesktopError(f"no key on this keyboard produces the modifier {XK.keysym_to_string(sym)!r}")
                mod_codes.append(keymap[sym][0])
            code, level = keymap[key] if key in keymap else (self._map_spare(key, keymap), 0)
            self._tap(code, level == 1, shift_code, mod_codes)
            if delay:
                self.d.sync()
                time.sleep(delay)
        self.d.sync()

    def type_text(self, text: str, delay: float = 0.0) -> None:
        """Type ``text`` character by character on the focused window."""
        self.press([[char_keysym(char)] for char in text], delay)

    def __repr__(self) -> str:
        return f"<X11 {self.name}>"
