"""The settings' schema: every section, and :class:`SettingsModel` holding them (see :mod:`saucer.config`)."""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Any, Literal

import re2  # google-re2 ships no type information: an override in pyproject.toml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)

from saucer.config._explain import ConfigError
from saucer.config.shell import ShellSettings

DEFAULT_CONFIG_FILE = "saucer.toml"
SaveExperience = Literal["always", "ask", "auto", "always_not"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, defer_build=True)


class SystemSettings(_Section):
    """How sessions run."""

    max_step: int = Field(50, ge=1, description="Most agent steps in one session.")
    max_round: int | None = Field(
        10, ge=0, description="Most rounds in one session (plan steps count); 0 or None: no limit."
    )
    eva_session: bool = Field(True, description="Evaluate each session when it ends.")
    eva_round: bool = Field(False, description="Evaluate each round when it ends.")
    save_experience: SaveExperience = Field(
        "ask",
        description="Save a successful session as a replayable plan: always, ask (the interactor decides; "
        "no terminal means no), auto (when the evaluation says the task is complete), always_not.",
    )
    experience_dir: Path | None = Field(
        None, description="Where experience plans go (default: the session's log folder)."
    )
    log_to_markdown: bool = Field(True, description="Write output.md next to the logs when a session ends.")
    save_ui_tree: bool = Field(
        True,
        description="Before each step, save the focused window's UI tree and a screenshot (desktop.ui_tree, "
        "desktop.screenshot) as the step's artifacts, listed in its record and by saucer show; starts the "
        "built-in desktop server when there is an X display (without one it is skipped, and the session says so).",
    )
    sleep_time: float = Field(0.0, ge=0, description="Seconds to wait between steps (asyncio.sleep, never blocking).")


class StoreSettings(_Section):
    """Where sessions are kept."""

    url: str = Field("sqlite:///.saucer/saucer.db", min_length=1)
    durability: Literal["step", "strict", "exit"] = "step"
    snapshot_every: int = Field(100, ge=1)
    lease_ttl: float = Field(30.0, gt=0, description="Seconds a runner's lease on a session lasts unless renewed.")
    encrypt: list[str] = Field(
        [],
        description="Names and vars.KEY patterns (fnmatch) whose values are encrypted at rest, e.g. ['vars.api_*', 'REQUEST'].",
    )
    key_file: str | None = Field(
        None,
        description="File holding the store key (base64 of 32 bytes); SAUCER_STORE_KEY wins over it. Never in the store.",
    )


# Checked here, where a bad table is named by its key: config imports nothing of saucer.tools.rules (nor .linear, RE2's).
_REGEX_PREFIX = "re:"
_RE2_QUIET = re2.Options()
_RE2_QUIET.log_errors = False  # the reason goes into the error, not to stderr


def _check_command_pattern(pattern: str) -> None:
    """A ValueError naming ``pattern`` when it is empty or its ``re:`` expression does not compile with RE2."""
    if not isinstance(pattern, str) or not pattern.strip():
        raise ValueError(f"a command rule must be a non-empty string, got {pattern!r}")
    try:  # with RE2, as the rules will match it: in linear time
        pattern.startswith(_REGEX_PREFIX) and re2.compile(pattern[len(_REGEX_PREFIX) :], _RE2_QUIET)
    except re2.error as exc:
        raise ValueError(
            f"invalid regular expression in rule '{pattern}' (RE2 syntax): {exc.args[0].decode()}"
        ) from None


MCPTransport = Literal["stdio", "http", "inprocess"]
#: Seconds one command may take on an MCP server unless its table says otherwise.
DEFAULT_MCP_TIMEOUT = 30.0

_IMPORT_PATH = re2.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
# The key that selects each transport, and the keys only that transport accepts.
_SELECTOR: dict[str, MCPTransport] = {"command": "stdio", "url": "http", "import_path": "inprocess"}
_OWN_FIELDS: dict[MCPTransport, tuple[str, ...]] = {
    "stdio": ("command", "args", "env", "cwd", "stderr"),
    "http": ("url", "headers"),
    "inprocess": ("import_path", "options"),
}


class MCPServerConfig(BaseModel):
    """How to reach one MCP server, its per-command timeout and which of its tools need approval."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    transport: MCPTransport = Field(
        description="stdio, http (streamable HTTP) or inprocess; inferred from command, url or import_path."
    )
    # stdio
    command: str | None = Field(None, min_length=1, description="Executable of a stdio server.")
    args: list[str] = Field([], description="Arguments of the stdio server.")
    env: dict[str, str] = Field(
        {},
        description="Extra environment variables, added to a minimal inherited set (HOME, PATH, USER, ...).",
    )
    cwd: Path | None = Field(None, description="Working directory of the stdio server.")
    stderr: Literal["inherit", "discard"] | Path = Field(
        "inherit", description="Where the stdio server's stderr goes: inherit, discard, or a file to append to."
    )
    # streamable HTTP
    url: str | None = Field(None, description="Endpoint of a streamable HTTP server, e.g. http://127.0.0.1:8000/mcp.")
    headers: dict[str, str] = Field({}, description="HTTP headers sent with every request.")
    # in-process
    import_path: str | None = Field(
        None, description="'module:attribute': an MCPServer, a Server or a function returning one."
    )
    options: dict[str, Any] = Field({}, description="Keyword arguments of an import_path function.")
    # all transports
    timeout: float = Field(DEFAULT_MCP_TIMEOUT, gt=0, description="Seconds one command may take on this server.")
    startup_timeout: float = Field(30.0, gt=0, description="Seconds the server may take to start and answer.")
    sensitive_tools: list[str] = Field(
        [], description="Tools of this server (bare names) that need the user's approval."
    )
    sensitive_commands: list[str] = Field(
        [],
        description="Glob or 're:' patterns; a call whose string 'command' parameter matches needs approval.",
    )

    @model_validator(mode="before")
    @classmethod
    def _infer_transport(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("transport") is not None:
            return data
        present = [key for key in _SELECTOR if data.get(key) is not None]
        if not present:
            message = "a server needs one of 'command' (stdio), 'url' (streamable HTTP) or 'import_path' (in-process)"
            unknown = [key for key in data if key not in cls.model_fields]
            if unknown:
                # Likely a typo of the selecting key: name it, since nothing else will be checked.
                import difflib  # only for this message

                hints = []
                for key in unknown:
                    close = difflib.get_close_matches(str(key), list(cls.model_fields), n=1)
                    hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
                message = f"unknown field {', '.join(hints)}; {message}"
            raise ValueError(message)
        if len(present) > 1:
            raise ValueError(f"give only one of 'command', 'url' or 'import_path', not {' and '.join(present)}")
        return {**data, "transport": _SELECTOR[present[0]]}

    @model_validator(mode="after")
    def _check_transport_fields(self) -> MCPServerConfig:
        needed = next(key for key, kind in _SELECTOR.items() if kind == self.transport)
        if getattr(self, needed) is None:
            raise ValueError(f"field {needed!r} is required for a {self.transport} server")
        for kind, fields in _OWN_FIELDS.items():
            if kind == self.transport:
                continue
            for name in fields:
                # A default value is no claim (a full dump carries every field), anything else is.
                default = type(self).model_fields[name].get_default(call_default_factory=True)
                if getattr(self, name) != default:
                    raise ValueError(f"field {name!r} applies to {kind} servers, not to this {self.transport} server")
        return self

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value

    @field_validator("import_path")
    @classmethod
    def _check_import_path(cls, value: str | None) -> str | None:
        if value is not None and not _IMPORT_PATH.match(value):
            raise ValueError(f"must look like 'package.module:attribute', got {value!r}")
        return value

    @field_validator("sensitive_commands")
    @classmethod
    def _check_patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            _check_command_pattern(pattern)
        return value

    @field_validator("sensitive_tools")
    @classmethod
    def _check_tool_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name.strip():
                raise ValueError("tool names must not be empty")
        return value


class MCPSettings(_Section):
    """MCP servers the local dispatcher starts (empty: the built-in Linux tools)."""

    servers: dict[str, MCPServerConfig] = Field({})
    isolate: bool | list[Literal["shell", "files"]] = Field(
        False, description="true or [shell, files]: stdio processes"
    )


_COMPONENT_PATH = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"


class AgentsSettings(_Section):
    """The agents and evaluator the engine runs, each named by ``package.module:attribute``.

    The engine names only their protocols (``Agent``, ``Evaluator``, ``AgentProvider``) and loads
    what is named here when a session first needs it; saucer's own are the defaults.
    """

    follower: str = Field(
        "saucer.agents.follower:FollowerAgent",
        pattern=_COMPONENT_PATH,
        description="Agent class, called with no arguments, that runs the command steps of a plan.",
    )
    evaluator: str = Field(
        "saucer.agents.evaluator:RuleEvaluator",
        pattern=_COMPONENT_PATH,
        description="Evaluator class, called with no arguments, that judges sessions and rounds "
        "(system.eva_session, system.eva_round) when the session's agents bring none.",
    )
    provider: str = Field(
        "saucer.agents.llm:create_agent_provider",
        pattern=_COMPONENT_PATH,
        description="Function called with the settings that returns the LLM agents for requests.",
    )
    operator: str = Field(
        "saucer.agents.operator:create_operator_provider",
        pattern=_COMPONENT_PATH,
        description="Function called with the settings and mode=operator|normal_operator that returns "
        "the computer-use agent of the operator modes.",
    )


class LogsSettings(_Section):
    """Per-session log files under ``root/<task>/<session_id>/``."""

    root: Path = Path("logs")
    enabled: bool = True


class LLMSettings(_Section):
    """An OpenAI-compatible model endpoint and the LLM agents of normal mode (``saucer.agents.llm``)."""

    base_url: str | None = None
    api_key: SecretStr | None = None
    model: str | None = None
    temperature: float | None = Field(0.0, ge=0, le=2)
    max_tokens: int | None = Field(1024, gt=0, description="Most tokens the model may generate per call.")
    tool_choice: Literal["auto", "required", "omit"] = Field(
        "auto",
        description="tool_choice sent with the tools: auto, required (the agent then gets a finish tool), "
        "or omit (send none, for servers that reject the field).",
    )
    tool_grammar: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Constrain a required tool call with a JSON-schema grammar (response_format): auto (where the "
        "endpoint is llama.cpp's llama-server, asked at /props), on (any server), off (never).",
    )
    context_window: int | None = Field(
        8192, ge=256, description="Tokens the model's context holds; longer conversations are trimmed to fit."
    )
    token_budget: int | None = Field(
        None, gt=0, description="Most tokens (prompt + completion) the agents may use in one session; then it stops."
    )
    no_action_retries: int = Field(
        2, ge=0, description="Times the agent is asked again when it answers without calling a tool."
    )
    tool_description_chars: int = Field(
        160, ge=0, description="Tool descriptions sent to the model are cut to this many characters (0: whole)."
    )
    timeout: float = Field(60.0, gt=0)
    max_retries: int = Field(3, ge=0)
    backoff_base: float = Field(0.5, ge=0)
    backoff_max: float = Field(8.0, ge=0)
    backoff_jitter: float = Field(0.25, ge=0, le=1)
    price_file: Path | None = None
    prompt_templating: bool = False
    hidden_vars: list[str] = Field([])
    agent: Literal["single", "host"] = "single"
    max_consecutive_failures: int = Field(3, ge=1)
    judge_model: str | None = None
    system_prompt: str | None = None
    ask_user: bool = Field(True, description="Give the agents an ask_user tool: the model may ask the user a question.")

    @model_validator(mode="after")
    def _window_holds_a_reply(self) -> LLMSettings:
        if self.context_window is not None and self.max_tokens is not None and self.max_tokens >= self.context_window:
            raise ValueError(
                f"llm.max_tokens ({self.max_tokens}) must be smaller than llm.context_window ({self.context_window}): "
                "the window holds the prompt and the reply"
            )
        return self


class ServiceDeviceSettings(_Section):
    """One ``[service.devices.NAME]`` table: who may register device NAME and who it is shared with."""

    owner: str | None = Field(None, description="The only principal that may register this device id.")
    principals: list[str] = Field(
        [],
        description="Principals (token names) that may use the device besides its owner; '*' for all.",
    )


class ServiceSettings(_Section):
    """``saucer serve``: where it listens, which tokens it accepts, who may use which device, how it watches them."""

    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    tokens: list[SecretStr] = Field(
        [],
        description="Bearer tokens, each 'name=token' (the name owns "
        "the sessions it submits) or a bare token; SAUCER_SERVICE_TOKENS (name=token,...) adds more.",
    )
    devices: dict[str, ServiceDeviceSettings] = Field(
        {},
        description="Sharing per device id: a device is usable by the principal that registered it, the principals "
        "listed here, those its owner granted it to through the API, and admins.",
    )
    admins: list[str] = Field([], description="Principals that see and use every device.")
    state_dir: Path = Field(Path(".saucer/service"), description="Session records and the server's identity.")
    session_logs: Literal["auto"] | bool = Field(
        "auto",
        description="Which sessions write a log folder under logs.root (default <state_dir>/logs): auto, those "
        "with LLM agents (a plan session's steps and verdict are all in the event store: saucer show SESSION); "
        "true, every one; false, none.",
    )
    heartbeat_interval: float = Field(10.0, gt=0, description="Seconds between device heartbeats.")
    missed_heartbeats: int = Field(3, ge=1, description="Heartbeats a device may miss before it is offline.")
    reconnect_grace: float = Field(
        0.0, ge=0, description="Seconds pending commands wait for a lost device to reconnect."
    )
    step_timeout: float = Field(300.0, gt=0, description="Default seconds for one step's command batch.")
    max_frame_bytes: int = Field(1024 * 1024, ge=1024, description="Largest WebSocket frame or request body accepted.")
    max_streams: int = Field(
        16, ge=1, description="Live viewer pages (saucer serve's /ui, saucer ui) one principal may keep open."
    )
    certfile: Path | None = Field(None, description="TLS certificate (PEM); with keyfile, the server speaks https/wss.")
    keyfile: Path | None = Field(None, description="TLS private key (PEM).")


class DesktopSettings(_Section):
    """The built-in ``desktop`` server: screenshots, UI trees, mouse and keyboard on an X11 display."""

    enabled: bool = Field(
        False,
        description="Start the desktop server beside shell and files (when mcp.servers is empty); needs an X11 "
        "display and at-spi2-core (Debian: apt-get install -y xvfb at-spi2-core dbus).",
    )
    display: str | None = Field(
        None, description="X display for the server and the programs it launches (default: $DISPLAY)."
    )
    artifacts_dir: Path | None = Field(
        None, description="Where screenshots and saved trees go (default: the session's log folder, artifacts/)."
    )


class QueueSettings(_Section):
    """The job queue (``saucer worker``, ``saucer run --queue``): PostgreSQL stores only. Times in seconds."""

    name: str = Field(
        "sessions", min_length=1, max_length=100, description="Queue used by run --queue and taken from by workers."
    )
    priority: int = Field(0, description="Priority of queued jobs; a higher one is taken first.")
    concurrency: int = Field(4, ge=1, description="Sessions one worker runs at once.")
    limits: dict[str, int] = Field({}, description="Most sessions of a queue running at once over all workers.")
    job_timeout: float | None = Field(
        None, gt=0, description="How long one job may run before it is stopped and failed."
    )
    heartbeat: float = Field(10.0, gt=0, description="Time between a worker's heartbeats.")
    stalled_after: float = Field(30.0, gt=0, description="Silence after which a worker is dead and its jobs go back.")
    shutdown_timeout: float = Field(
        30.0, ge=0, description="On SIGTERM, how long sessions run on before they are handed back."
    )


class ApprovalSettings(_Section):
    """Sensitive steps nobody at a terminal can confirm wait as pending approvals (``saucer approve``), and the
    model's questions nobody at a terminal can answer as pending questions (``saucer answer``)."""

    timeout: float = Field(
        300.0,
        ge=0,
        description="Seconds a pending approval waits before it is refused by timeout (0: refuse at once); "
        'a pending question, before the model reads "no answer (timeout)" (0: "no one to ask" at once).',
    )


# The file given, and its settings when a reader of another format (saucer.ufo_config) has read them.
_FileSpec = tuple[Path | None, dict[str, Any] | None]
_CONFIG_FILE: contextvars.ContextVar[_FileSpec] = contextvars.ContextVar("saucer_config_file", default=(None, None))


def _read_toml(path: Path, *, required: bool) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
        import tomllib  # only when there is a file (most commands run without one)
    except FileNotFoundError:
        if required:
            raise ConfigError(f"config file {path} does not exist") from None
        return {}
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory, not a TOML file") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


class SettingsModel(BaseModel):
    """All of saucer's settings as one model, read by no source of its own: :func:`saucer.config.load_settings`
    builds one from defaults and flags when no file and no ``SAUCER_*`` variable needs pydantic-settings;
    :class:`saucer.config.Settings` (``BaseSettings``) adds the sources. Code that reads settings takes this type."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True, defer_build=True)

    system: SystemSettings = Field(default_factory=SystemSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    mcp: MCPSettings = Field(default_factory=MCPSettings)
    agents: AgentsSettings = Field(default_factory=AgentsSettings)
    logs: LogsSettings = Field(default_factory=LogsSettings)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    desktop: DesktopSettings = Field(default_factory=DesktopSettings)
    queue: QueueSettings = Field(default_factory=QueueSettings)
    shell: ShellSettings = Field(default_factory=ShellSettings)
    approvals: ApprovalSettings = Field(default_factory=ApprovalSettings)

    _config_file: Path | None = PrivateAttr(None)

    @property
    def config_file(self) -> Path | None:
        """The settings file that was read (None when there was none)."""
        return self._config_file
