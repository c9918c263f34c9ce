"""A model-as-judge :class:`~saucer.engine.evaluation.Evaluator` for ``eva_round`` / ``eva_session``.

It shows the judge the request(s), the steps taken (from ``STRUCTURAL_LOGS``:
agent, status, tools called and their outcomes, the agents' answers) and the
results, and asks for ``{"complete": "yes"|"no"|"unsure", "reason", "sub_scores"}``.
The call is asynchronous like every model call; it goes to ``request.log``
(agent ``evaluator``) and its cost is returned in the verdict, which the
engine writes to ``evaluation.log`` and adds to ``SESSION_COST`` and the cost
summary. A judge that cannot be reached, or answers something that is not
the JSON asked for, gives an ``unsure`` verdict saying why, never a crash.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from saucer.agents.llm.client import ModelCallError, ModelClient, ModelSettings
from saucer.agents.llm.logs import RequestLogger
from saucer.agents.llm.prompts import format_previous_subtasks, judge_system_prompt
from saucer.context.names import ContextNames
from saucer.engine.evaluation import Evaluation, Scope

if TYPE_CHECKING:
    from saucer.context import Context

__all__ = ["LLMEvaluator", "parse_verdict"]

_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)
_YES = {"yes", "true", "complete", "completed", "done", "success", "1"}
_NO = {"no", "false", "incomplete", "failed", "fail", "0"}
_MAX_STEPS = 200


Verdict = Literal["yes", "no", "unsure"]


def _norm(value: Any) -> Verdict:
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = str(value).strip().lower()
    if text in _YES:
        return "yes"
    if text in _NO:
        return "no"
    return "unsure"


def parse_verdict(content: str | None) -> tuple[Verdict, str, dict[str, Any]]:
    """``(complete, reason, sub_scores)`` from the judge's answer (``unsure`` when it is not the JSON asked for)."""
    text = (content or "").strip()
    match = _JSON_OBJECT.search(text)
    data: Any = None
    if match:
        try:
            data = json.loads(match.group(0))
        except json.JSONDecodeError:
            data = None
    if not isinstance(data, Mapping):
        return "unsure", f"the judge did not answer with the JSON verdict asked for: {text[:300]!r}", {}
    complete = _norm(data.get("complete", data.get("completed", "unsure")))
    reason = str(data.get("reason", "") or "")
    sub = data.get("sub_scores") or {}
    sub_scores = (
        {str(k): _norm(v) if isinstance(v, (str, bool)) else v for k, v in sub.items()}
        if isinstance(sub, Mapping)
        else {}
    )
    return complete, reason, sub_scores


class LLMEvaluator:
    """Judges a round or a session with a model (``[llm] judge_model``, default ``[llm] model``)."""

    name = "llm-judge"

    def __init__(self, client: ModelClient, settings: ModelSettings | None = None) -> None:
        self.client = client
        self.settings = settings or client.settings

    async def evaluate(self, context: Context, *, scope: Scope, round_id: int | None = None) -> Evaluation:
        messages = [
            {"role": "system", "content": judge_system_prompt()},
            {"role": "user", "content": self.describe(context, scope, round_id)},
        ]
        fields = {"agent": "evaluator", "scope": scope, "round": round_id}
        try:
            reply = await self.client.complete(
                messages,
                model=self.settings.judge_model or None,
                temperature=0.0,
                request_logger=RequestLogger.for_context(context),
                log_fields=fields,
            )
        except ModelCallError as exc:
            return Evaluation(
                scope=scope,
                round=round_id,
                complete="unsure",
                reason=f"the judge could not be reached: {exc}",
                cost=0.0,
                evaluator=self.name,
            )
        complete, reason, sub_scores = parse_verdict(reply.content)
        return Evaluation(
            scope=scope,
            round=round_id,
            complete=complete,
            reason=reason,
            sub_scores=sub_scores,
            cost=reply.cost,
            evaluator=self.name,
        )

    # ------------------------------------------------------------- the brief

    def describe(self, context: Context, scope: Scope, round_id: int | None) -> str:
        """What the judge reads: requests, steps and results of the round or the session."""
        rounds = self._rounds(context, scope, round_id)
        parts = [f"Scope: the {'whole session' if scope == 'session' else f'round {round_id}'}."]
        logs = context.get(ContextNames.STRUCTURAL_LOGS) or {}
        previous = context.get(ContextNames.PREVIOUS_SUBTASKS) or []
        for rid in rounds:
            request, result = self._request_and_result(context, rid)
            parts.append(f"## Round {rid}\nRequest: {request or '(unknown)'}")
            done = [p for p in previous if isinstance(p, Mapping) and p.get("round") == rid]
            if done:
                parts.append("Subtasks:\n" + format_previous_subtasks(done))
            steps = [entry for sub in sorted((logs.get(rid) or {}).items()) for entry in sub[1]]
            if steps:
                parts.append("Steps:\n" + "\n".join(self._step_line(e) for e in steps[:_MAX_STEPS]))
            else:
                parts.append("Steps: (none recorded)")
            if result:
                parts.append(f"Result: {result}")
        return "\n\n".join(parts)

    @staticmethod
    def _rounds(context: Context, scope: Scope, round_id: int | None) -> list[int]:
        if scope == "round" and round_id is not None:
            return [round_id]
        logs = context.get(ContextNames.STRUCTURAL_LOGS) or {}
        ids = set(logs)
        ids.add(context.get(ContextNames.CURRENT_ROUND_ID))
        return sorted(int(i) for i in ids)

    @staticmethod
    def _request_and_result(context: Context, round_id: int) -> tuple[str, str]:
        """The round's request and result: from the event log when there is one, else the current values."""
        request = result = ""
        if context.store is not None:
            try:
                for event in context.history():
                    if event.round != round_id:
                        continue
                    kind = event.meta.get("kind")
                    if kind == "round_start":
                        request = str(event.meta.get("request") or request)
                    elif kind == "round_end":
                        result = str(event.meta.get("reason") or event.meta.get("round_status") or result)
            except Exception:  # noqa: BLE001 - the brief is best effort; the Context below still answers
                pass
        if round_id == context.get(ContextNames.CURRENT_ROUND_ID):
            request = request or context.get(ContextNames.REQUEST)
            result = result or context.get(ContextNames.ROUND_RESULT)
        return request, result

    @staticmethod
    def _step_line(entry: Mapping[str, Any]) -> str:
        head = f"- step {entry.get('Step', '?')} {entry.get('Agent', '')} [{entry.get('Status', '')}]"
        if entry.get("Subtask"):
            head += f" subtask: {entry['Subtask']}"
        commands = entry.get("Commands") or []
        results = entry.get("Results") or []
        if commands:
            pairs = [f"{c} → {results[i] if i < len(results) else '?'}" for i, c in enumerate(commands)]
            head += "; tools: " + ", ".join(pairs)
        if entry.get("refused"):
            head += "; refused by the user: " + ", ".join(map(str, entry["refused"]))
        if entry.get("assigned"):
            head += f"; assigned: {entry['assigned']}"
        if entry.get("answer"):
            head += f"; answer: {str(entry['answer'])[:300]}"
        return head
