"""Command dispatch: messages, the dispatcher protocol, local (MCP) and remote dispatchers."""

from saucer.dispatch.messages import Command, Result, ResultStatus

__all__ = ["Command", "Result", "ResultStatus"]
