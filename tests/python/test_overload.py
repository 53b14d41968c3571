"""Overload: ten times the workload's clients and rate against one owner (python -m fluxon.overload)."""

import json
import os
import subprocess
import sys

from conftest import BUILD, FLUXON_BIN


def test_overload_ten_times_the_clients_degrades_gracefully_and_returns_to_baseline():
    """40 client processes, each ten times as fast as the 4 of the baseline, against one owner of
    128 MiB: every failure is a documented overload answer, no read returns wrong bytes, both
    daemons' anonymous memory stays under 512 MiB, both live, and afterwards the owner holds no
    plan, holder, prepared slot or session and serves a fresh put and get (a 4 KiB put on an owner
    full of 16 KiB slots: it waited the whole 30 s hard timeout before grants were drained)."""
    env = dict(os.environ, PYTHONPATH=str(BUILD / "python"), FLUXON_BIN=FLUXON_BIN)
    out = subprocess.run([sys.executable, "-m", "fluxon.overload", "--seconds", "4", "--json"],
                         capture_output=True, text=True, timeout=400, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    r = json.loads(out.stdout)
    assert r["problems"] == []
    base, over = r["baseline"], r["overload"]
    assert (base["clients"], over["clients"]) == (4, 40)
    assert base["reported"] == 4 and over["reported"] == 40
    assert base["counts"]["keys_put"] > 0 and over["counts"]["keys_put"] > 0
    assert over["counts"]["keys_read"] > 0 and over["counts"].get("bad_bytes", 0) == 0
    for phase in (base, over):
        assert all(k.split(":", 1)[1] in {"NoSpace", "LocalReserveTimeout", "Timeout", "Busy"}
                   for k in phase["failures"]), phase["failures"]
    assert r["after"] == {"left": {}, "sessions": 1, "fresh_put_get_ok": True}
    for name in ("master", "owner-1"):
        assert 0 < r["peak_memory_bytes"][name]["RssAnon"] < 512 << 20
    assert r["daemons_alive"] == {"master": True, "owner-1": True}
