"""Command dispatch: messages, the dispatcher protocol, local (MCP) and remote dispatchers.

The MCP-backed names (``LocalCommandDispatcher``, ``MCPServerConfig``, ...) are
loaded on first access, so importing the messages does not import the MCP SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'saucer.dispatch' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
