"""saucer's built-in MCP servers for Linux: ``shell`` and ``files``.

Run them over stdio with ``python -m saucer.tools.shell`` and
``python -m saucer.tools.files`` (``--help`` lists the options), or build
them in-process with :func:`saucer.tools.shell.build_server` and
:func:`saucer.tools.files.build_server`. :mod:`saucer.tools.rules` holds the
allow/deny and sensitivity rules shared with the dispatcher.
"""
