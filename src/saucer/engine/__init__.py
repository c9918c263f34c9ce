"""The engine: sessions made of rounds, rounds of agent steps, all durable in the Context.

Public API (stable for the CLI, the service and the LLM agents)::

    from saucer.engine import (
        Session, SessionResult, SessionStatus, Round, RoundResult,
        SessionFactory, SessionPool,
        Agent, AgentState, AgentStatus, AgentSet, ContinueState, FinishState, ...,
        TransitionGraph, Transition, ContextEquals, Expression, AgentTarget, Terminate, ...,
        Interactor, NonInteractiveInteractor, UserChannel, SessionObserver, NullObserver,
        AgentHost, ProviderHost, RoundView,
        Evaluator, Evaluation, CostSummary, Limits, StepRecord, load_plan, Plan,
    )
"""

import types as _types

from saucer.engine.accounting import CostSummary, Limits
from saucer.engine.agent import (
    Agent,
    AgentProvider,
    AgentSet,
    AgentState,
    AgentStatus,
    ConfirmState,
    ContinueState,
    ErrorState,
    FailState,
    FinishState,
    NoActionState,
    PendingState,
    StateRegistry,
    StopState,
    as_agent_set,
)
from saucer.engine.errors import (
    DispatcherUnavailableError,
    EngineError,
    ExpressionError,
    GraphError,
    LeaseHeldError,
    LeaseLostError,
    LLMUnavailableError,
    ModeError,
    PlanError,
    PlatformNotSupportedError,
    ServiceModeError,
    UnknownConditionError,
    UnknownStateError,
)
from saucer.engine.evaluation import Evaluation, Evaluator
from saucer.engine.factory import MODES, SessionFactory
from saucer.engine.host import AgentHost, ProviderHost, RoundView
from saucer.engine.interactor import Interactor, NonInteractiveInteractor, UserChannel
from saucer.engine.logs import (
    EvaluationLogEntry,
    RequestLogEntry,
    SessionLogs,
    StepRecord,
    read_evaluation_log,
    read_request_log,
    read_step_log,
)
from saucer.engine.observer import CompositeObserver, NullObserver, SessionObserver
from saucer.engine.plan import Plan, PlanCommand, PlanStep, load_plan, load_plan_folder, parse_plan
from saucer.engine.pool import SessionPool
from saucer.engine.round import Round, RoundResult, RoundStatus
from saucer.engine.routing import (
    AgentTarget,
    Always,
    Condition,
    ContextEquals,
    Expression,
    FromAgent,
    RevertToInitiator,
    RouteInput,
    StayTarget,
    Target,
    Terminate,
    ToolCalled,
    Transition,
    TransitionGraph,
    register_condition,
    register_target,
)
from saucer.engine.session import Session, SessionResult, SessionStatus

__all__ = sorted(
    name
    for name, value in list(globals().items())
    if not name.startswith("_") and not isinstance(value, _types.ModuleType)
)
