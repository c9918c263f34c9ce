"""The web viewer (:mod:`saucer.ui`) inside ``saucer serve``, at ``/ui``, behind the service's tokens.

A principal sees the sessions it submitted, those whose task names it as a
participant, and (an admin) every session: the sessions the approvals API
lets it act on (participants added later through the event log excepted),
and the devices it may use (as ``GET /api/devices``), with
their online state and last heartbeat. Anything else is a 404. On a session's
page, the principals the approvals API allows (owner, admins, participants) get
forms to write variables, decide approvals, answer questions and cancel
(:mod:`saucer.ui.acting`). The viewer
reads the event store the engine runner writes the sessions' Contexts to.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Mount

from saucer.service.approvals import may_act, principal_author
from saucer.service.auth import TokenAuthenticator
from saucer.service.hub import DeviceHub
from saucer.service.records import SessionRecordStore
from saucer.service.sessions import sees_session
from saucer.store import EventStore
from saucer.ui import create_app
from saucer.ui.acting import Acting

__all__ = ["ServiceScope", "service_acting", "viewer_mount", "UI_PATH"]

UI_PATH = "/ui"


class ServiceScope:
    """:class:`saucer.ui.Scope` of a service: the sessions each principal may act on, and its usable devices."""

    def __init__(self, records: SessionRecordStore, hub: DeviceHub, admins: frozenset[str] = frozenset()) -> None:
        self.records = records
        self.hub = hub
        self.admins = admins

    async def session_ids(self, principal: str | None) -> set[str] | None:
        if principal is None:
            return set()
        # the one rule of what a principal sees, as GET /api/sessions lists it
        every = await self.records.list_sessions()
        return {r.session_id for r in every if sees_session(r, principal, self.admins)}

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


def service_acting(store: EventStore, records: SessionRecordStore, sessions: Any, admins: Any) -> Acting:
    """The viewer's forms under ``saucer serve``: for the principals the approvals API allows
    (:func:`saucer.service.approvals.may_act`), recorded as the principal; cancel as ``POST /api/sessions/{id}/cancel``."""

    async def allowed(principal: str | None, session_id: str) -> bool:
        record = await records.get_session(session_id)
        if principal is None or record is None:
            return False
        return await may_act(store, session_id, principal, record.owner, record.task.participants, admins)

    async def cancel(session_id: str, principal: str | None, reason: str) -> str | None:
        record = await records.get_session(session_id)
        if record is None or principal is None:
            return f"no session {session_id!r} on this server"
        if record.status.terminal:
            return f"session {session_id} already ended as {record.status.value}"
        await sessions.cancel(session_id, principal_author(principal), reason)  # recorded as the principal
        return None

    return Acting(allowed=allowed, author=lambda principal: principal_author(principal or ""), cancel=cancel)


def viewer_mount(
    store: EventStore | None,
    records: SessionRecordStore,
    hub: DeviceHub,
    auth: TokenAuthenticator,
    max_streams: int,
    sessions: Any = None,
    admins: Any = (),
) -> list[Mount]:
    """The ``/ui`` mount over the runner's event store (none for a runner without one, such as the plan runner:
    ``store`` None); with the service's ``sessions`` (its SessionManager) the session pages get their forms
    (:func:`service_acting`)."""
    if store is None:
        return []
    acting = service_acting(store, records, sessions, frozenset(admins)) if sessions is not None else None
    app = create_app(
        store,
        authenticate=auth.principal,
        scope=ServiceScope(records, hub, frozenset(admins)),
        title="saucer serve",
        max_streams=max_streams,
        acting=acting,
    )
    return [Mount(UI_PATH, app=app)]
