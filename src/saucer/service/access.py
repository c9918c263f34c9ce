"""Who may use a device: its owner, the principals it is shared with, and admins.

A device id belongs to the principal (token name) that registered it first,
durably (or to the ``owner`` the server's configuration pins it to). It is
usable by:

- its owner;
- the principals it is shared with in the server's configuration::

      [service.devices.laptop]
      principals = ["bob", "carol"]     # "*" shares it with every principal
      owner = "alice"                   # optional: only alice may register "laptop"

- the principals its owner granted it to through the API
  (``PUT /api/devices/{id}/grants/{principal}``, durable, revocable);
- the admin principals (``[service] admins = ["ops"]``), which see and use
  every device and manage its grants.

Everyone else is told the device does not exist: it is left out of
``GET /api/devices`` and a submission to it gets the same 404 as an unknown id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DeviceAccess", "AccessPolicy", "EVERYONE"]

EVERYONE = "*"
"""In ``principals``: every principal the server knows."""


class DeviceAccess(BaseModel):
    """One ``[service.devices.NAME]`` table: who may register the device and who may use it."""

    model_config = ConfigDict(extra="forbid")

    owner: str | None = Field(default=None, description="the only principal that may register this device id")
    principals: list[str] = Field(default_factory=list, description="principals it is shared with ('*': all)")


class AccessPolicy:
    """The configured part of device access (sharing, pinned owners, admins); grants are passed in."""

    def __init__(self, devices: Mapping[str, DeviceAccess] | None = None, admins: Iterable[str] = ()) -> None:
        self.devices = dict(devices or {})
        self.admins = frozenset(admins)

    def check_principals(self, known: Iterable[str]) -> None:
        """Raise ValueError naming any configured principal that has no token (a typo would share nothing)."""
        names = set(known)
        problems = [f"service.admins names {p!r}" for p in sorted(self.admins) if p not in names]
        for device_id, access in sorted(self.devices.items()):
            for principal in access.principals:
                if principal != EVERYONE and principal not in names:
                    problems.append(f"service.devices.{device_id}.principals names {principal!r}")
            if access.owner is not None and access.owner not in names:
                problems.append(f"service.devices.{device_id}.owner names {access.owner!r}")
        if problems:
            known_names = ", ".join(sorted(names)) or "none"
            raise ValueError("; ".join(problems) + f", which has no token (principals with tokens: {known_names})")

    def pinned_owner(self, device_id: str) -> str | None:
        """The principal the configuration reserves ``device_id`` for, if any."""
        access = self.devices.get(device_id)
        return access.owner if access is not None else None

    def is_admin(self, principal: str) -> bool:
        """Whether ``principal`` sees and uses every device."""
        return principal in self.admins

    def may_use(self, device_id: str, owner: str, principal: str, grants: Iterable[str] = ()) -> bool:
        """Whether ``principal`` may see ``device_id`` (owned by ``owner``) and submit to it."""
        if principal == owner or self.is_admin(principal):
            return True
        access = self.devices.get(device_id)
        shared = set(access.principals) if access is not None else set()
        return principal in shared or EVERYONE in shared or principal in set(grants)

    def may_manage(self, owner: str, principal: str) -> bool:
        """Whether ``principal`` may grant and revoke access to a device owned by ``owner``."""
        return principal == owner or self.is_admin(principal)
