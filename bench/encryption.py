"""Benchmark of encryption at rest (``store.encrypt``): its cost per commit.

    python bench/encryption.py [--dir DIR] [--commits 2000] [--postgres-url URL]

For each backend (SQLite on the repository's disk; memory, to see the CPU cost
alone; PostgreSQL when ``--postgres-url`` or ``SAUCER_TEST_POSTGRES_URL`` names
a server) it runs the same session twice, without and with ``store.encrypt``
covering the values written, and prints the median and mean time per commit
(one commit = one event of three operations: a covered 200-character token,
a covered counter ``incr``, an uncovered var), the difference, and the time to
open the session afterwards (every event read and opened with the key). It
also prints the raw cost of sealing and opening one value with AES-256-GCM.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from saucer.context import Context  # noqa: E402
from saucer.store import open_store  # noqa: E402
from saucer.store.crypto import KeyRing, new_key  # noqa: E402

PATTERNS = ["vars.api_*"]
TOKEN = "t" * 200


def run(url: str, commits: int, encrypt: bool) -> dict[str, float]:
    with open_store(url, encrypt=PATTERNS if encrypt else ()) as store:
        ctx = Context.open(store, "bench", snapshot_every=100)
        times = []
        for i in range(commits):
            ctx.update_vars({"api_token": f"{TOKEN}{i}", "plain": i})
            ctx.incr("api_calls")
            start = time.perf_counter()
            ctx.commit()
            times.append(time.perf_counter() - start)
        ctx.close()
        start = time.perf_counter()
        again = Context.open(store, "bench")
        opened = time.perf_counter() - start
        assert again.vars["api_calls"] == commits and again.vars["api_token"] == f"{TOKEN}{commits - 1}"
        start = time.perf_counter()
        replayed = len(list(store.read("bench")))
        read_all = time.perf_counter() - start
        assert replayed == commits
    return {
        "median_us": statistics.median(times) * 1e6,
        "mean_us": statistics.fmean(times) * 1e6,
        "open_ms": opened * 1e3,
        "read_all_ms": read_all * 1e3,
    }


def seal_cost(n: int = 20000) -> tuple[float, float]:
    ring = KeyRing(os.urandom(32))
    start = time.perf_counter()
    tokens = [ring.seal("bench", "vars.api_token", TOKEN) for _ in range(n)]
    sealed = (time.perf_counter() - start) / n
    start = time.perf_counter()
    for token in tokens:
        ring.open("bench", "vars.api_token", token)
    opened = (time.perf_counter() - start) / n
    return sealed * 1e6, opened * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parents[1] / ".saucer" / "bench")
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--postgres-url", default=os.environ.get("SAUCER_TEST_POSTGRES_URL"))
    args = parser.parse_args()
    os.environ["SAUCER_STORE_KEY"] = new_key()
    args.dir.mkdir(parents=True, exist_ok=True)
    sealed, opened = seal_cost()
    print(f"AES-256-GCM, one 200-character value: seal {sealed:.1f} us, open {opened:.1f} us")
    print(f"{args.commits} commits of 3 operations (2 covered by store.encrypt), per commit:")
    print(
        f"{'backend':<12}{'plain median':>14}{'sealed median':>15}{'cost':>11}{'plain mean':>12}{'sealed mean':>13}"
        f"{'open plain':>12}{'open sealed':>13}"
    )
    backends = [("memory", lambda: f"memory://bench-{uuid.uuid4().hex}")]
    tmp = tempfile.mkdtemp(dir=args.dir)
    backends.append(("sqlite", lambda: f"sqlite:///{tmp}/{uuid.uuid4().hex}.db"))
    schemas: list[str] = []
    if args.postgres_url:

        def pg() -> str:
            schemas.append("bench_enc_" + uuid.uuid4().hex[:10])
            return f"{args.postgres_url}?schema={schemas[-1]}"

        backends.append(("postgresql", pg))
    try:
        for name, make in backends:
            plain = run(make(), args.commits, False)
            sealed_run = run(make(), args.commits, True)
            print(
                f"{name:<12}{plain['median_us']:>11.1f} us{sealed_run['median_us']:>12.1f} us"
                f"{sealed_run['median_us'] - plain['median_us']:>+8.1f} us{plain['mean_us']:>9.1f} us{sealed_run['mean_us']:>10.1f} us"
                f"{plain['open_ms']:>9.1f} ms{sealed_run['open_ms']:>10.1f} ms"
            )
    finally:
        if schemas:
            import psycopg

            with psycopg.connect(args.postgres_url, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        for f in Path(tmp).glob("*"):
            f.unlink()
        Path(tmp).rmdir()


if __name__ == "__main__":
    main()
