"""The web viewer (:mod:`saucer.ui`) inside ``saucer serve``, at ``/ui``, behind the service's tokens.

A principal sees the sessions it submitted (the same rule as ``GET
/api/sessions``) and the devices it may use (as ``GET /api/devices``), with
their online state and last heartbeat. Anything else is a 404. The viewer
reads the event store the engine runner writes the sessions' Contexts to.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Mount

from saucer.service.auth import TokenAuthenticator
from saucer.service.hub import DeviceHub
from saucer.service.records import SessionRecordStore
from saucer.store import EventStore
from saucer.ui import create_app

__all__ = ["ServiceScope", "viewer_mount", "UI_PATH"]

UI_PATH = "/ui"


class ServiceScope:
    """:class:`saucer.ui.Scope` of a service: each principal's own sessions and usable devices."""

    def __init__(self, records: SessionRecordStore, hub: DeviceHub) -> None:
        self.records = records
        self.hub = hub

    async def session_ids(self, principal: str | None) -> set[str] | None:
        if principal is None:
            return set()
        return {record.session_id for record in await self.records.list_sessions(owner=principal)}

    async def devices(self, principal: str | None) -> list[dict[str, Any]] | None:
        if principal is None:
            return []
        return [
            {
                "id": d.device_id,
                "owner": d.owner,
                "online": d.online,
                "last_heartbeat": d.last_seen_at,
                "platform": (d.info or {}).get("platform") if isinstance(d.info, dict) else None,
            }
            for d in self.hub.devices(principal)
        ]


def viewer_mount(
    runner: Any, records: SessionRecordStore, hub: DeviceHub, auth: TokenAuthenticator, max_streams: int
) -> list[Mount]:
    """The ``/ui`` mount over the runner's event store (none for a runner without one, such as the plan runner)."""
    store = getattr(runner, "store", None)
    if not isinstance(store, EventStore):
        return []
    app = create_app(
        store, authenticate=auth.principal, scope=ServiceScope(records, hub), title="saucer serve", max_streams=max_streams
    )
    return [Mount(UI_PATH, app=app)]
