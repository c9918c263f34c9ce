"""saucer's built-in MCP servers for Linux: ``shell``, ``files`` and ``desktop``.

Run them over stdio with ``python -m saucer.tools.shell``,
``python -m saucer.tools.files`` and ``python -m saucer.tools.desktop``
(``--help`` lists the options), or build them in-process with
:func:`saucer.tools.shell.build_server`, :func:`saucer.tools.files.build_server`
and :func:`saucer.tools.desktop.server.build_server`. The dispatcher runs
``shell`` and ``files`` in-process by default through their ``create_server``
(the command line's options as keyword arguments), which returns their tool
table (:class:`saucer.tools.native.NativeServer`): called directly, without
an MCP server or the MCP SDK, with the same listing and results as over MCP.
Their blocking work runs in daemon worker threads (:func:`saucer.tools._common.offload`). :mod:`saucer.tools.sandbox`
resolves the files tools' paths from a descriptor of their root;
:mod:`saucer.tools.confine` starts the shell's commands and the desktop's programs
confined by the kernel (Landlock, else bubblewrap);
:mod:`saucer.tools.rules` holds the allow/deny and sensitivity rules shared
with the dispatcher, decided on the parse of :mod:`saucer.tools.shellparse`.
"""
