"""The device part of the HTTP API: listing devices, describing them, and sharing them.

::

    GET    /api/devices                           the devices this token may use
    GET    /api/devices/{id}                      one of them
    GET    /api/devices/{id}/info                 ask the device for a fresh description
    GET    /api/devices/{id}/grants               owner, configured sharing and grants (owner, admins)
    PUT    /api/devices/{id}/grants/{principal}   share the device with a principal (owner, admins)
    DELETE /api/devices/{id}/grants/{principal}   stop sharing it (owner, admins)

A device this token may not use gets the same 404 as an id that never
registered (see :mod:`saucer.service.access`); one it may use but not manage
gets 403 on the grant routes.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from saucer.dispatch.websocket import DeviceUnavailable
from saucer.service.auth import TokenAuthenticator
from saucer.service.http import error_response, float_param, json_response, unauthorized
from saucer.service.hub import DeviceHub, DeviceState
from saucer.service.protocol import ErrorCode

__all__ = ["DeviceRoutes", "unknown_device_message"]


def unknown_device_message(device_id: str) -> str:
    """The one answer for an unknown device and for someone else's: ids are not an oracle."""
    return f"no device {device_id!r} is available to this token"


class DeviceRoutes:
    """HTTP handlers for devices over one hub, with the server's authenticator and principal names."""

    def __init__(self, hub: DeviceHub, auth: TokenAuthenticator, principals: Iterable[str]) -> None:
        self.hub = hub
        self.auth = auth
        self.principals = frozenset(principals)

    def routes(self) -> list[Route]:
        """The routes, to add to the app."""
        return [
            Route("/api/devices", self.list_devices, methods=["GET"]),
            Route("/api/devices/{device_id}", self.get_device, methods=["GET"]),
            Route("/api/devices/{device_id}/info", self.device_info, methods=["GET"]),
            Route("/api/devices/{device_id}/grants", self.list_grants, methods=["GET"]),
            Route("/api/devices/{device_id}/grants/{principal}", self.put_grant, methods=["PUT"]),
            Route("/api/devices/{device_id}/grants/{principal}", self.delete_grant, methods=["DELETE"]),
        ]

    def _device(self, request: Request) -> tuple[str, DeviceState] | Response:
        principal = self.auth.from_header(request.headers.get("authorization"))
        if principal is None:
            return unauthorized()
        device_id = request.path_params["device_id"]
        device = self.hub.visible(device_id, principal)
        if device is None:
            return error_response(404, ErrorCode.UNKNOWN_DEVICE, unknown_device_message(device_id))
        return principal, device

    def _managed(self, request: Request) -> tuple[str, DeviceState] | Response:
        found = self._device(request)
        if isinstance(found, Response):
            return found
        principal, device = found
        if not self.hub.policy.may_manage(device.owner, principal):
            return error_response(
                403, "not_device_owner", f"only the owner of device {device.device_id!r} (or an admin) can share it"
            )
        return found

    def _grants(self, device: DeviceState) -> Response:
        configured = self.hub.policy.devices.get(device.device_id)
        return json_response(
            {
                "device_id": device.device_id,
                "owner": device.owner,
                "configured": sorted(configured.principals) if configured is not None else [],
                "granted": sorted(device.grants),
            }
        )

    async def list_devices(self, request: Request) -> Response:
        """The devices this token may use."""
        principal = self.auth.from_header(request.headers.get("authorization"))
        if principal is None:
            return unauthorized()
        return json_response({"devices": [d.describe() for d in self.hub.devices(principal)]})

    async def get_device(self, request: Request) -> Response:
        """One device."""
        found = self._device(request)
        return found if isinstance(found, Response) else json_response(found[1].describe())

    async def device_info(self, request: Request) -> Response:
        """Ask the device itself for a fresh description."""
        found = self._device(request)
        if isinstance(found, Response):
            return found
        device_id = found[1].device_id
        try:
            info = await self.hub.request_info(device_id, timeout=float_param(request, "timeout", 5.0, 60.0))
        except DeviceUnavailable as exc:
            return error_response(409, ErrorCode.DEVICE_OFFLINE, str(exc))
        except TimeoutError:
            return error_response(504, "timeout", f"device {device_id!r} did not answer in time")
        return json_response({"device_id": device_id, "info": info})

    async def list_grants(self, request: Request) -> Response:
        """Who the device is shared with."""
        found = self._managed(request)
        return found if isinstance(found, Response) else self._grants(found[1])

    async def put_grant(self, request: Request) -> Response:
        """Share the device with a principal."""
        found = self._managed(request)
        if isinstance(found, Response):
            return found
        device, principal = found[1], request.path_params["principal"]
        if principal not in self.principals:
            return error_response(422, "unknown_principal", f"no principal {principal!r} has a token on this server")
        await self.hub.grant(device.device_id, principal)
        return self._grants(device)

    async def delete_grant(self, request: Request) -> Response:
        """Stop sharing the device with a principal (its running sessions go on)."""
        found = self._managed(request)
        if isinstance(found, Response):
            return found
        device, principal = found[1], request.path_params["principal"]
        if not await self.hub.revoke(device.device_id, principal):
            return error_response(404, "unknown_grant", f"device {device.device_id!r} is not granted to {principal!r}")
        return self._grants(device)
