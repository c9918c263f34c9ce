"""What the tests share: fakes and helpers, imported as ``tests.support.<module>`` (pytest puts the
repository root on the import path: ``pythonpath`` in pyproject.toml; no test edits ``sys.path``).

- :mod:`~tests.support.fakes`: the one fake dispatcher (``FakeDispatcher``), in-process and in device processes;
- :mod:`~tests.support.engine`: scripted and crashing agents, a recording observer, command plans;
- :mod:`~tests.support.llm`, :mod:`~tests.support.fake_openai`, :mod:`~tests.support.recording_proxy`:
  the LLM tests' tool table and sessions, a fake OpenAI-compatible server, a recording proxy;
- :mod:`~tests.support.cli`: the CLI as a user runs it (``SAUCER``, ``cli_env``);
- :mod:`~tests.support.service`, :mod:`~tests.support.aip_peers`: tokens, ports, server and device processes,
  minimal AIP peers;
- :mod:`~tests.support.ui`: the viewer's stores and a viewer server in a thread;
- :mod:`~tests.support.queueing`, :mod:`~tests.support.context`, :mod:`~tests.support.desktop`: the queue's plans and
  environment, damaged stores, the desktop tools and their cases;
"""
