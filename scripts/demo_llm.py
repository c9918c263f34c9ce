"""``make demo-llm``: one normal-mode session against the local llama-server, as a newcomer runs it.

Builds or reuses llama-server and its model (``scripts/llama_server.py``),
starts it with the settings saucer needs, prints them, then runs

    saucer run --request "create notes.txt containing hello, then show it"

in a new workspace under ``.saucer/demo-llm/``, and ``saucer show`` of the
session: the model's replies and tool calls as a conversation.

    python scripts/demo_llm.py [--runs N] [--request TEXT]

``--runs N`` runs the request N times (each a new session and workspace)
and prints how many finished: what ``bench/llm_server.py --sessions N`` reports.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama_server  # noqa: E402

REQUEST = "create notes.txt containing hello, then show it"


def saucer_env(base_url: str) -> dict[str, str]:
    """The settings a session needs for the local model (:func:`llama_server.saucer_settings`)."""
    return llama_server.saucer_settings(base_url)


def saucer_command() -> list[str]:
    """How to run saucer: the checkout's .venv, else whatever ``saucer`` is on PATH."""
    venv = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "saucer"
    return [str(venv)] if venv.exists() else ["saucer"]


def run_once(base_url: str, request: str, store: str, *, quiet: bool = False) -> tuple[str, str, float, Path]:
    """One session of ``request``: (session id, its status, seconds, its workspace)."""
    sid = f"demo-llm-{uuid.uuid4().hex[:6]}"
    workspace = Path(".saucer") / "demo-llm" / sid
    workspace.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAUCER_LLM__")} | saucer_env(base_url)
    started = time.perf_counter()
    command = [
        *saucer_command(),
        "run",
        "--request",
        request,
        "--session-id",
        sid,
        "--workspace",
        str(workspace),
        "--store",
        store,
        "--yes",
    ]
    proc = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=quiet, text=True)
    elapsed = time.perf_counter() - started
    show = subprocess.run(
        [*saucer_command(), "sessions", "--json", "--store", store], env=env, capture_output=True, text=True
    )
    status = next((r["status"] for r in json.loads(show.stdout or "[]") if r["id"] == sid), f"exit {proc.returncode}")
    return sid, status, elapsed, workspace


def did_the_demo(workspace: Path) -> bool:
    """Whether the workspace shows the demo request done: ``notes.txt`` holds ``hello``.

    A session is ``finished`` when the model ends its work after a tool call
    that succeeded -- listing a folder counts -- so the file is checked too.
    """
    notes = workspace / "notes.txt"
    return notes.is_file() and notes.read_text(errors="replace").strip().lower() == "hello"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--request", default=REQUEST)
    parser.add_argument("--store", default="sqlite:///.saucer/demo-llm.db")
    parser.add_argument(
        "--threads", type=int, default=1, help="llama-server's -t (1: steadiest on a busy 2-core machine)"
    )
    args = parser.parse_args(argv)
    print(llama_server.MODEL_WARNING, flush=True)  # before a build that can take 20 minutes
    llama_server.fetch_model()
    llama_server.build_server()
    Path(".saucer").mkdir(exist_ok=True)
    with llama_server.serve(ctx_size=8192, threads=args.threads) as server:
        print(f"llama-server on {server.base_url} ({llama_server.MODEL_FILE}); saucer's settings for it:")
        for key, value in saucer_env(server.base_url).items():
            print(f"  {key}={shlex.quote(value)}")
        finished, done, times = 0, 0, []
        for i in range(args.runs):
            sid, status, seconds, workspace = run_once(server.base_url, args.request, args.store, quiet=args.runs > 1)
            finished += status == "finished"
            times.append(seconds)
            work = ""
            if args.request == REQUEST:
                done += did_the_demo(workspace)
                work = f"; notes.txt holds hello: {'yes' if did_the_demo(workspace) else 'no'}"
            print(f"run {i + 1}: session {sid} {status} in {seconds:.1f} s{work}", flush=True)
            if args.runs == 1:
                subprocess.run([*saucer_command(), "show", sid, "--store", args.store])
    if args.runs > 1:
        did = f"; {done} of {args.runs} left notes.txt holding hello" if args.request == REQUEST else ""
        print(
            f"{finished} of {args.runs} runs finished{did}; time per run: median {statistics.median(times):.1f} s, "
            f"min {min(times):.1f} s, max {max(times):.1f} s (load average {os.getloadavg()[0]:.1f})"
        )
    return 0 if finished == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
