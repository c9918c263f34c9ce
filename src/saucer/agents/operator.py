"""Operator modes (UFO's ``operator`` and ``normal_operator``): a computer-use agent on a Linux desktop.

Each step of the :class:`OperatorAgent` is one model call that sees the screen:

1. it looks at the desktop through the ``desktop`` tools
   (:func:`saucer.engine.uitree.look`): the focused window's UI tree and a
   screenshot, saved as the step's artifacts (the tree too when
   ``system.save_ui_tree`` is on) and listed in the step's record;
2. it appends one user message to the conversation: a compact summary of the
   tree (one line per element: id, role, name, text, bounds, states) and the
   screenshot's path and size. That text is what the Context keeps; the call
   itself sends the screenshot too, as an ``image_url`` part (a base64 PNG
   data URL), attached to the newest observation only, so the stored
   conversation and ``request.log`` never hold image data;
3. the model answers with tool calls (``desktop.click`` on an element id
   from the summary, ``type_text``, ``press_keys``, ``launch``...), run as
   in normal mode: a sensitive call (``desktop.launch`` by default) asks
   first, a refusal is told to the model, a final answer after a successful
   action finishes the round (:class:`~saucer.agents.llm.agent.ToolUsingAgent`).

``operator`` offers the model only the ``desktop`` tools; ``normal_operator``
offers every tool of the session (shell and files too). The endpoint must be
OpenAI-compatible with vision and tool calling (``[llm]`` settings, as for
normal mode). Follower plans drive the same tools offline, without a model.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saucer.agents.llm.agent import ToolUsingAgent
from saucer.agents.llm.client import ModelClient, ModelSettings, require_model_settings
from saucer.agents.llm.evaluator import LLMEvaluator
from saucer.agents.llm.prompts import request_message
from saucer.agents.llm.tools import ToolSet
from saucer.agents.treesummary import summarize_tree
from saucer.context.names import ContextNames
from saucer.engine.agent import AgentSet
from saucer.engine.uitree import DesktopView, artifact_name, look

if TYPE_CHECKING:
    from saucer.context import Context
    from saucer.engine.host import ProviderHost

__all__ = [
    "OPERATOR_MODES",
    "OperatorAgent",
    "create_operator_provider",
    "summarize_tree",
    "OBSERVATION_HEADER",
    "MAX_SCREENSHOT_BYTES",
]

OPERATOR_MODES = ("operator", "normal_operator")
#: How every observation message starts (the image goes with the newest one).
OBSERVATION_HEADER = "[screen before step"
#: A screenshot file larger than this is not sent (the model is told why).
MAX_SCREENSHOT_BYTES = 20 * 1024 * 1024
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

_OPERATOR_PROMPT = """You are saucer's desktop operator. You carry out the user's request on a Linux desktop by calling tools, one step at a time.

Before each of your steps you get the current screen: a screenshot (an image) and a summary of the UI tree of the focused window, one element per line: its id, role, "name", text, [x, y, width, height] on the screen, and states. The focused element and editable text (with the text it holds) come first, then buttons and other controls, then labels; elements that are not on the screen are left out.

Rules:
- Act only by calling tools; never invent a tool result. Prefer element ids from the newest summary (click element_id=...) to screen coordinates.
- If no application is open yet, start it with {launch}.
- After each tool result, look at the new screen and decide the next step. A result marked "refused by the user" was not run: do not retry it.
- When the request is done (or cannot be done), {finish} That ends your work.

Tools: {tools}"""


def _observation_text(view: DesktopView, session_step: int | None, image_note: str) -> str:
    head = f"{OBSERVATION_HEADER} {session_step if session_step is not None else '?'}]"
    lines = [head]
    shot = view.screenshot
    if shot is not None:
        screen = shot.get("screen") or [shot.get("width"), shot.get("height")]
        lines.append(
            f"screenshot: {shot.get('path')} ({shot.get('width')}x{shot.get('height')} pixels; the screen is "
            f"{screen[0]}x{screen[1]}) {image_note}"
        )
    else:
        lines.append(f"screenshot: not available ({view.errors.get('screenshot', 'unknown error')})")
    tree = view.tree
    if tree is not None:
        where = (
            f"window {tree.get('window')!r} of {tree.get('app')!r}"
            if tree.get("window")
            else f"application {tree.get('app')!r}"
        )
        cut = ", cut at max_nodes" if tree.get("truncated") else ""
        lines.append(f"UI tree of the focused {where} ({tree.get('node_count')} elements{cut}):")
        screen = (shot.get("screen") if shot is not None else None) or None
        lines.append(summarize_tree(tree.get("tree"), screen=screen))
    else:
        lines.append(f"UI tree: not available ({view.errors.get('ui_tree', 'unknown error')})")
    return "\n".join(lines)


def _read_png(path: str) -> tuple[bytes | None, str]:
    """The screenshot's bytes, or None and why not."""
    try:
        file = Path(path)
        size = file.stat().st_size
        if size > MAX_SCREENSHOT_BYTES:
            return None, f"(not attached: {size} bytes, more than {MAX_SCREENSHOT_BYTES})"
        data = file.read_bytes()
    except OSError as exc:
        return None, f"(not attached: cannot read it here: {exc.strerror or exc})"
    if not data.startswith(_PNG_SIGNATURE):
        return None, "(not attached: the file is not a PNG)"
    return data, "(attached as an image)"


class OperatorAgent(ToolUsingAgent):
    """A computer-use agent: each step it sees a screenshot and the UI tree, and answers with tool calls."""

    #: The round does not look at the desktop for ``system.save_ui_tree`` before this agent's steps: it does.
    looks_at_desktop = True
    #: Only the desktop's tools are offered: no ask_user.
    offers_ask_user = False

    def __init__(
        self,
        name: str = "operator",
        *,
        client: ModelClient,
        settings: ModelSettings | None = None,
        mix_tools: bool = False,
        save_trees: bool = False,
        tree_nodes: int = 300,
    ) -> None:
        super().__init__(name, client=client, settings=settings)
        #: ``normal_operator``: offer every tool of the session, not only the desktop's.
        self.mix_tools = mix_tools
        #: ``system.save_ui_tree``: also save each step's tree as an artifact.
        self.save_trees = save_trees
        self.tree_nodes = tree_nodes
        self._image: bytes | None = None

    def tools(self, context: Context) -> ToolSet:
        """The ``desktop`` tools (``operator``), or every tool of the session (``normal_operator``)."""
        every = super().tools(context)
        if self.mix_tools:
            return every
        return ToolSet([spec for spec in every.specs if spec.name.startswith("desktop.")])

    def initial_messages(self, context: Context, tools: ToolSet) -> list[dict[str, Any]]:
        launch = next((s.function_name for s in tools.specs if s.name == "desktop.launch"), "the launch tool")
        finish = (
            "call finish with a short summary." if self.finish_tool else "answer with a short summary and call no tool."
        )
        names = ", ".join(spec.function_name for spec in tools.specs) or "(no tools are available)"
        sensitive = [spec.function_name for spec in tools.specs if spec.sensitive]
        if sensitive:
            names += "\nSensitive (the user is asked before they run): " + ", ".join(sensitive)
        prompt = _OPERATOR_PROMPT.format(launch=launch, finish=finish, tools=names)
        extra = self.system_extra(context)
        if extra:
            prompt += "\n\n" + extra
        request = request_message(context.get(ContextNames.REQUEST), context.get(ContextNames.PREVIOUS_SUBTASKS))
        return [{"role": "system", "content": prompt}, {"role": "user", "content": request}]

    async def act(self, context: Context) -> str:
        tools = self.tools(context)
        if not tools.get("desktop.screenshot") or not tools.get("desktop.ui_tree"):
            offered = ", ".join(tools.names()) or "none"
            return self._error(
                "operator modes need the desktop server's tools (desktop.screenshot, desktop.ui_tree, desktop.click...), "
                f"and this session's dispatcher offers: {offered}; the factory adds the built-in desktop server for "
                "these modes, so a dispatcher of your own must include it"
            )
        return await super().act(context)

    async def before_model_call(self, context: Context, messages: list[dict[str, Any]]) -> None:
        """Look at the desktop and append what was seen (the image itself is sent by :meth:`outgoing`)."""
        step = self.step
        session_step = step.session_step if step is not None else None
        name = artifact_name(session_step) if session_step is not None else "operator"
        view = await look(
            context.command_dispatcher,
            name,
            save_tree=self.save_trees,
            include_tree=True,
            tree_parameters={"max_nodes": self.tree_nodes, "on_screen": True},
        )
        if step is not None:
            step.artifacts.extend(view.artifacts())
        self._image, note = (None, "")
        if view.screenshot is not None:
            self._image, note = _read_png(str(view.screenshot.get("path")))
        self._append(context, messages, {"role": "user", "content": _observation_text(view, session_step, note)})

    def outgoing(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation with the newest screenshot attached to the newest observation."""
        if self._image is None:
            return messages
        for index in range(len(messages) - 1, -1, -1):
            message = messages[index]
            content = message.get("content")
            if message.get("role") == "user" and isinstance(content, str) and content.startswith(OBSERVATION_HEADER):
                url = "data:image/png;base64," + base64.b64encode(self._image).decode("ascii")
                parts = [{"type": "text", "text": content}, {"type": "image_url", "image_url": {"url": url}}]
                return [*messages[:index], {**message, "content": parts}, *messages[index + 1 :]]
        return messages


def create_operator_provider(
    settings: Any = None,
    *,
    mode: str = "operator",
    env: Mapping[str, str] | None = None,
    client_factory: Callable[[ModelSettings], ModelClient] | None = None,
) -> Callable[[ProviderHost], AgentSet]:
    """A provider (``agents=``) for ``operator`` or ``normal_operator`` sessions.

    ``settings`` is as for :func:`saucer.agents.llm.create_agent_provider`
    (checked now when given; :class:`~saucer.agents.llm.ModelNotConfiguredError`
    says what to set). One :class:`ModelClient` per session.
    """
    if mode not in OPERATOR_MODES:
        raise ValueError(f"unknown operator mode {mode!r}; use one of: {', '.join(OPERATOR_MODES)}")
    resolved = require_model_settings(settings, env) if settings is not None else None
    make_client = client_factory or ModelClient

    def provider(session: ProviderHost) -> AgentSet:
        model_settings = resolved or require_model_settings(session.settings, env)
        client = make_client(model_settings)
        session.add_closer(client.aclose)
        agent = OperatorAgent(
            client=client,
            settings=model_settings,
            mix_tools=mode == "normal_operator",
            save_trees=session.settings.system.save_ui_tree,
        )
        return AgentSet([agent], evaluator=LLMEvaluator(client, model_settings))

    return provider
