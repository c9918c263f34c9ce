"""``DEVICE_INFO``: filled at a session's start from what its dispatcher's device reported."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from tests.support.fakes import FakeDispatcher

from saucer.context import Context, ContextNames
from saucer.engine import Agent, AgentStatus, Session
from saucer.store.memory import MemoryStore


class Done(Agent):
    async def act(self, context: Context) -> AgentStatus:
        return AgentStatus.FINISH


class DeviceDispatcher(FakeDispatcher):
    def __init__(self, info: Any) -> None:
        super().__init__()
        self.info = info

    def device_info(self) -> Any:
        if isinstance(self.info, Exception):
            raise self.info
        return self.info


def _device_info(settings: Any, dispatcher: Any) -> Any:
    store = MemoryStore()
    session = Session("dev", settings=settings, store=store, request="go", agents=Done("a"), dispatcher=dispatcher)
    assert asyncio.run(session.run()).ok
    return Context.open(store, session.session_id, create=False).get(ContextNames.DEVICE_INFO)


def test_device_info_is_what_the_device_reported(settings: Any, caplog: pytest.LogCaptureFixture) -> None:
    reported = {"device_id": "box", "protocol": "aip", "system_info": {"cpu_count": 4}}
    assert _device_info(settings, DeviceDispatcher([reported])) == [reported]
    assert _device_info(settings, DeviceDispatcher(reported)) == [reported]  # one device, not in a list
    assert _device_info(settings, FakeDispatcher()) == []  # a dispatcher with no device
    caplog.set_level(logging.WARNING)
    assert _device_info(settings, DeviceDispatcher(RuntimeError("gone"))) == []
    assert "could not read the device's info: gone" in caplog.text
