"""One vocabulary, one rendering (issue 33, item 6): ``state`` text shows every value ``--json`` gives,
zero, false, "" and null included; ``diff --json`` gives the value ``state --json`` gives for the same
version; piped, ``state`` and ``diff`` are plain lines, never box tables."""

from __future__ import annotations

import json
from pathlib import Path

from saucer.cli.inspect import shown

BOX = set("─│┃━┏┓┗┛┡┩╇┼┳┻╭╮╰╯")


def test_state_and_diff_agree_in_text_and_json(cli_here, tmp_path: Path) -> None:
    cli_here("demo", check=True)
    (sid,) = [row["id"] for row in json.loads(cli_here("sessions", "--json", check=True).stdout)]
    head = json.loads(cli_here("state", sid, "--json", check=True).stdout)["version"]
    at3 = json.loads(cli_here("state", sid, "--at", "3", "--json", check=True).stdout)
    text = cli_here("state", sid, "--at", "3", check=True).stdout.splitlines()
    assert not BOX & set("".join(text)) and max(map(len, text)) < 260
    lines = dict(line.split(" = ", 1) for line in text[1:])
    for name, value in at3["names"].items():
        assert lines[name] == shown(value, 200), name  # every name, its value rendered one way
    assert (lines["ID"], lines["CURRENT_ROUND_ID"], lines["SESSION_COST"]) == ("0", "0", "0.0")  # hidden before
    assert lines["ROUND_RESULT"] == '""'
    for name, value in at3["vars"].items():
        assert lines[f"vars.{name}"] == shown(value, 200)
    # diff --json from v1 to the head: "before" is what state --json says at v1, "after" what it says at the head
    at1 = json.loads(cli_here("state", sid, "--at", "1", "--json", check=True).stdout)
    now = json.loads(cli_here("state", sid, "--json", check=True).stdout)
    changes = json.loads(cli_here("diff", sid, "1", str(head), "--json", check=True).stdout)
    names = [k for k in changes if not k.startswith(("vars.", "retired."))]
    assert names
    for key in names:
        assert changes[key]["before"] == at1["names"][key], key
        assert changes[key]["after"] == now["names"][key], key
    piped = cli_here("diff", sid, "1", str(head), check=True).stdout.splitlines()
    assert not BOX & set("".join(piped)) and piped[0] == f"changes from v1 to v{head}"
    for line in piped[1:]:
        key, rest = line.split(": ", 1)
        if key in names:
            assert rest == f"{shown(changes[key]['before'], 80)} -> {shown(changes[key]['after'], 80)}"


def test_the_live_progress_line_shows_every_command_of_a_step(run_cli) -> None:
    out = run_cli("demo", check=True, timeout=120).stdout
    [line] = [x for x in out.splitlines() if "files.search" in x and " step " in x]
    assert line.count("files.search success") == 2, line  # the demo's step 8 runs two searches


def test_ui_open_says_when_no_browser_opens(tmp_path: Path) -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from saucer.store import open_store

    with open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        store.create_session("one")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("SAUCER_") and k not in ("DISPLAY", "WAYLAND_DISPLAY")
    }
    env.update({"BROWSER": "false", "NO_COLOR": "1"})  # the only browser there is fails, as on a headless machine
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "saucer",
            "ui",
            "--open",
            "--port",
            str(port),
            "--store",
            f"sqlite:///{tmp_path / 's.db'}",
        ],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                continue
        time.sleep(2)  # the opener runs once the server listens
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    [said] = [x for x in err.splitlines() if x.startswith("--open:")]
    assert f"http://127.0.0.1:{port}/" in said and "no browser could be opened" in said


def test_sessions_piped_is_plain_and_narrow(run_cli, tmp_path: Path) -> None:
    """Piped, ``sessions`` is a header line and one line a session: no title, box or rule lines, no padding."""
    from saucer.store import open_store

    with open_store(f"sqlite:///{tmp_path / 's.db'}") as store:
        for sid in ("one", "a-longer-id"):
            store.create_session(sid)
    out = run_cli("sessions", "--store", f"sqlite:///{tmp_path / 's.db'}", check=True).stdout
    lines = out.splitlines()
    assert not BOX & set(out), out
    assert lines[0].split() == ["id", "task", "mode", "status", "rounds", "steps", "cost", "updated"], out
    assert sorted(line.split()[0] for line in lines[1:]) == ["a-longer-id", "one"], out
    assert all(line == line.strip() and line for line in lines), out  # no blank, padded or indented line
    assert max(map(len, lines)) < 80, out  # short cells make a short line: the columns fit their values
