"""A real model server on this machine: llama.cpp's llama-server with SmolLM2-135M-Instruct.

    make llama-server                 # once: builds the server, fetches the model (cached)
    python bench/llm_server.py [--calls N] [--max-tokens N] [--record FILE]

Prints, through saucer's own :class:`~saucer.agents.llm.ModelClient`:

* the first prompt of normal mode in tokens (as the server counts them), with
  the built-in ``shell`` and ``files`` tools: the tools' whole descriptions
  and schemas (``[llm] tool_description_chars = 0``) beside the short ones
  sent by default, and the prompt with no tools at all;
* latency per call (p50, max) and the server's own prompt and generation
  speeds (tokens per second, from llama-server's ``timings``), for ``--calls``
  calls of that first prompt with ``max_tokens`` replies.

``--record FILE`` writes one request and its response as they went over the
wire (through a recording proxy) to FILE as JSON.

``--sessions N`` instead runs ``make demo-llm``'s request ("create notes.txt
containing hello, then show it") N times as whole ``saucer run`` sessions,
with the settings of ``scripts/llama_server.py`` (``tool_choice = "required"``;
saucer adds the JSON-schema grammar of one tool call, ``[llm] tool_grammar``),
and prints how many finished, how many left ``notes.txt`` holding ``hello``
(a session finishes after *any* tool call that succeeded), and the time per run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_ROOT / "scripts"), str(_ROOT / "tests" / "agents")]

import llama_server  # noqa: E402
from recording_proxy import RecordingProxy  # noqa: E402

from saucer.agents.llm import ModelClient, ModelSettings  # noqa: E402
from saucer.agents.llm.prompts import linux_agent_system_prompt, request_message  # noqa: E402
from saucer.agents.llm.tools import ToolSet  # noqa: E402
from saucer.dispatch import LocalCommandDispatcher  # noqa: E402
from saucer.dispatch.servers import default_servers  # noqa: E402

REQUEST = "List the Python files here and count their lines."


async def _builtin_tool_info() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as workspace:
        async with LocalCommandDispatcher(default_servers(Path(workspace))) as dispatcher:
            return await dispatcher.list_tools()


def _first_prompt(tools: ToolSet | None) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": linux_agent_system_prompt(tools)},
        {"role": "user", "content": request_message(REQUEST, [])},
    ]


async def _measure(base_url: str, calls: int, max_tokens: int, info: dict[str, Any]) -> dict[str, Any]:
    settings = ModelSettings(base_url=base_url, model="smollm2-135m-instruct", max_tokens=max_tokens, timeout=300)
    out: dict[str, Any] = {"prompt_tokens": {}}
    async with ModelClient(settings) as client:
        for label, chars in (
            ("whole descriptions (tool_description_chars = 0)", 0),
            (f"short descriptions (default, {settings.tool_description_chars})", settings.tool_description_chars),
        ):
            tools = ToolSet.from_tool_info(info, description_chars=chars)
            reply = await client.complete(_first_prompt(tools), tools=tools)
            out["prompt_tokens"][label] = reply.usage.prompt_tokens
        reply = await client.complete(_first_prompt(None))
        out["prompt_tokens"]["no tools"] = reply.usage.prompt_tokens
        tools = ToolSet.from_tool_info(info, description_chars=settings.tool_description_chars)
        latencies, completion = [], []
        for i in range(calls):
            messages = _first_prompt(tools)
            messages[1]["content"] += f" (run {i})"  # a new prompt each time: no cached prefix past the tools
            started = time.perf_counter()
            reply = await client.complete(messages, tools=tools)
            latencies.append(time.perf_counter() - started)
            completion.append(reply.usage.completion_tokens)
        out["latency"] = latencies
        out["completion_tokens"] = completion
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--threads", type=int, default=1, help="llama-server's -t (1: steadiest on a busy 2-core machine)"
    )
    parser.add_argument("--record", type=Path, default=None, help="write one recorded request/response here (JSON)")
    parser.add_argument(
        "--sessions", type=int, default=0, help="run the demo request N times as sessions; count the finished"
    )
    args = parser.parse_args()
    gaps = llama_server.missing()
    if gaps:
        sys.exit(f"missing {', '.join(gaps)}; build them with: {llama_server.BUILD_COMMAND}")
    if args.sessions:
        import demo_llm

        sys.exit(demo_llm.main(["--runs", str(args.sessions), "--threads", str(args.threads)]))
    info = asyncio.run(_builtin_tool_info())
    with (
        llama_server.serve(ctx_size=8192, threads=args.threads) as server,
        RecordingProxy(server.base_url.removesuffix("/v1")) as proxy,
    ):
        figures = asyncio.run(_measure(proxy.base_url, args.calls, args.max_tokens, info))
        first, exchanges = proxy.completions()[0], proxy.completions()[-args.calls :]
    timings = [e.response_json.get("timings", {}) for e in exchanges]
    cold = first.response_json.get("timings", {})  # the first prompt of the run: nothing cached
    print(
        f"llama-server {llama_server.LLAMA_CPP_PYTHON_VERSION} (llama-cpp-python sdist), {llama_server.MODEL_FILE}, "
        f"{len(info)} built-in tools, ctx 8192, {args.threads} thread(s)"
    )
    print("\nfirst prompt of normal mode, tokens counted by the server:")
    for label, tokens in figures["prompt_tokens"].items():
        print(f"  {label:<52} {tokens:>6}")
    lat = figures["latency"]
    print(f"\n{args.calls} calls of that prompt, max_tokens {args.max_tokens}:")
    print(f"  latency per call            p50 {statistics.median(lat):6.2f} s   max {max(lat):6.2f} s")
    print(f"  completion tokens per call  {statistics.median(figures['completion_tokens']):6.0f} (median)")
    gen_speed = [t["predicted_per_second"] for t in timings if t.get("predicted_n", 0) > 1]
    if cold.get("prompt_n"):
        print(
            f"  prompt processing           {cold['prompt_per_second']:6.0f} tokens/s "
            f"({cold['prompt_n']} tokens, nothing cached: {cold['prompt_ms'] / 1000:.2f} s)"
        )
    if gen_speed:
        print(f"  generation                  {statistics.median(gen_speed):6.0f} tokens/s (median)")
    if args.record is not None and exchanges:
        e = exchanges[0]
        args.record.write_text(
            json.dumps({"request": e.request_json, "status": e.status, "response": e.response_json}, indent=1)
        )
        print(f"\none exchange as recorded on the wire: {args.record}")


if __name__ == "__main__":
    main()
