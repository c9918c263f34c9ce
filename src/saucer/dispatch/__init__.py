"""Command dispatch: messages, the dispatcher protocol, local (MCP) and remote dispatchers.

The MCP-backed names (``LocalCommandDispatcher``, ``MCPServerConfig``, ...) are
loaded on first access, so importing the messages does not import the MCP SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from saucer._lazy import lazy_exports
from saucer.dispatch.base import BasicCommandDispatcher, BatchCommandDispatcher, run_batch
from saucer.dispatch.messages import Command, Result, ResultStatus

if TYPE_CHECKING:
    from saucer.dispatch.local import Approver, LocalCommandDispatcher, ServerStartError
    from saucer.dispatch.servers import DesktopServer, MCPServerConfig, default_servers

__all__ = [
    "Command",
    "Result",
    "ResultStatus",
    "BasicCommandDispatcher",
    "BatchCommandDispatcher",
    "run_batch",
    "LocalCommandDispatcher",
    "Approver",
    "ServerStartError",
    "MCPServerConfig",
    "DesktopServer",
    "default_servers",
]

_LAZY = {
    "LocalCommandDispatcher": "saucer.dispatch.local",
    "Approver": "saucer.dispatch.local",
    "ServerStartError": "saucer.dispatch.local",
    "MCPServerConfig": "saucer.dispatch.servers",
    "DesktopServer": "saucer.dispatch.servers",
    "default_servers": "saucer.dispatch.servers",
}


__getattr__ = lazy_exports(__name__, globals(), _LAZY)
