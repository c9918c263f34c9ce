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

The names are loaded on first access (as :mod:`saucer.dispatch` and :mod:`saucer.service` do), so a
process that imports one module of the engine -- ``saucer run`` the factory -- does not pay for the
rest (the transition graph's dataclasses, the pool...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from saucer._lazy import lazy_exports

if TYPE_CHECKING:
    from saucer.engine.accounting import (
        CostSummary,
        Limits,
    )
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
    from saucer.engine.evaluation import (
        Evaluation,
        Evaluator,
    )
    from saucer.engine.factory import (
        MODES,
        SessionFactory,
    )
    from saucer.engine.host import (
        AgentHost,
        ProviderHost,
        RoundView,
    )
    from saucer.engine.interactor import (
        Interactor,
        NonInteractiveInteractor,
        UserChannel,
    )
    from saucer.engine.logs import (
        EvaluationLogEntry,
        RequestLogEntry,
        SessionLogs,
        StepRecord,
        read_evaluation_log,
        read_request_log,
        read_step_log,
    )
    from saucer.engine.observer import (
        CompositeObserver,
        NullObserver,
        SessionObserver,
    )
    from saucer.engine.plan import (
        Plan,
        PlanCommand,
        PlanStep,
        load_plan,
        load_plan_folder,
        parse_plan,
    )
    from saucer.engine.pool import SessionPool
    from saucer.engine.round import (
        Round,
        RoundResult,
        RoundStatus,
    )
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
    from saucer.engine.session import (
        Session,
        SessionResult,
        SessionStatus,
    )

#: Each public name and the module it is loaded from.
_EXPORTS = {
    "CostSummary": "saucer.engine.accounting",
    "Limits": "saucer.engine.accounting",
    "Agent": "saucer.engine.agent",
    "AgentProvider": "saucer.engine.agent",
    "AgentSet": "saucer.engine.agent",
    "AgentState": "saucer.engine.agent",
    "AgentStatus": "saucer.engine.agent",
    "ConfirmState": "saucer.engine.agent",
    "ContinueState": "saucer.engine.agent",
    "ErrorState": "saucer.engine.agent",
    "FailState": "saucer.engine.agent",
    "FinishState": "saucer.engine.agent",
    "NoActionState": "saucer.engine.agent",
    "PendingState": "saucer.engine.agent",
    "StateRegistry": "saucer.engine.agent",
    "StopState": "saucer.engine.agent",
    "as_agent_set": "saucer.engine.agent",
    "DispatcherUnavailableError": "saucer.engine.errors",
    "EngineError": "saucer.engine.errors",
    "ExpressionError": "saucer.engine.errors",
    "GraphError": "saucer.engine.errors",
    "LeaseHeldError": "saucer.engine.errors",
    "LeaseLostError": "saucer.engine.errors",
    "LLMUnavailableError": "saucer.engine.errors",
    "ModeError": "saucer.engine.errors",
    "PlanError": "saucer.engine.errors",
    "PlatformNotSupportedError": "saucer.engine.errors",
    "ServiceModeError": "saucer.engine.errors",
    "UnknownConditionError": "saucer.engine.errors",
    "UnknownStateError": "saucer.engine.errors",
    "Evaluation": "saucer.engine.evaluation",
    "Evaluator": "saucer.engine.evaluation",
    "MODES": "saucer.engine.factory",
    "SessionFactory": "saucer.engine.factory",
    "AgentHost": "saucer.engine.host",
    "ProviderHost": "saucer.engine.host",
    "RoundView": "saucer.engine.host",
    "Interactor": "saucer.engine.interactor",
    "NonInteractiveInteractor": "saucer.engine.interactor",
    "UserChannel": "saucer.engine.interactor",
    "EvaluationLogEntry": "saucer.engine.logs",
    "RequestLogEntry": "saucer.engine.logs",
    "SessionLogs": "saucer.engine.logs",
    "StepRecord": "saucer.engine.logs",
    "read_evaluation_log": "saucer.engine.logs",
    "read_request_log": "saucer.engine.logs",
    "read_step_log": "saucer.engine.logs",
    "CompositeObserver": "saucer.engine.observer",
    "NullObserver": "saucer.engine.observer",
    "SessionObserver": "saucer.engine.observer",
    "Plan": "saucer.engine.plan",
    "PlanCommand": "saucer.engine.plan",
    "PlanStep": "saucer.engine.plan",
    "load_plan": "saucer.engine.plan",
    "load_plan_folder": "saucer.engine.plan",
    "parse_plan": "saucer.engine.plan",
    "SessionPool": "saucer.engine.pool",
    "Round": "saucer.engine.round",
    "RoundResult": "saucer.engine.round",
    "RoundStatus": "saucer.engine.round",
    "AgentTarget": "saucer.engine.routing",
    "Always": "saucer.engine.routing",
    "Condition": "saucer.engine.routing",
    "ContextEquals": "saucer.engine.routing",
    "Expression": "saucer.engine.routing",
    "FromAgent": "saucer.engine.routing",
    "RevertToInitiator": "saucer.engine.routing",
    "RouteInput": "saucer.engine.routing",
    "StayTarget": "saucer.engine.routing",
    "Target": "saucer.engine.routing",
    "Terminate": "saucer.engine.routing",
    "ToolCalled": "saucer.engine.routing",
    "Transition": "saucer.engine.routing",
    "TransitionGraph": "saucer.engine.routing",
    "register_condition": "saucer.engine.routing",
    "register_target": "saucer.engine.routing",
    "Session": "saucer.engine.session",
    "SessionResult": "saucer.engine.session",
    "SessionStatus": "saucer.engine.session",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, globals(), _EXPORTS)
