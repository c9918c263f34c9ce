"""The web viewer of sessions (``saucer ui``; ``saucer serve`` mounts it at ``/ui``).

Read-only, server-rendered pages over any event store: the sessions table,
a session's timeline, its state at any version, diffs, the history of a key,
and a live view of a running session (server-sent events from the store's
:meth:`~saucer.store.EventStore.watch`). Every asset ships inside the package
(htmx is vendored under ``static/``); nothing is fetched at run time.

:func:`create_app` builds the Starlette app; :mod:`saucer.ui.queries` reads
what the pages show; :mod:`saucer.ui.render` turns it into escaped HTML.
"""

from saucer.ui.app import COOKIE, Scope, create_app

__all__ = ["create_app", "Scope", "COOKIE"]
