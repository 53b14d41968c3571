"""The owners' /metrics pages, read the way the run's report needs them."""

from __future__ import annotations

import sys
import time


def owner_page(port: int, timeout: float = 10.0) -> str:
    """An owner's /metrics page refreshed after this call began (it counts each refresh last)."""
    import urllib.error
    import urllib.request

    end = time.time() + timeout

    def get():
        # A scrape the owner's HTTP server drops (a reset on a loaded host) is tried again until the
        # deadline; an owner that is gone fails every try and raises the last error.
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return r.read().decode()
            except (ConnectionError, urllib.error.URLError):
                if time.time() >= end:
                    raise
                time.sleep(0.05)

    def refreshes(page):
        for line in page.splitlines():
            if line.startswith("fluxon_owner_metrics_refreshes_total "):
                return float(line.split()[-1])
        return 0.0
    seen = refreshes(get())
    page = ""
    while time.time() < end:
        time.sleep(0.05)
        page = get()
        if refreshes(page) > seen:
            break
    return page


def owner_slots(metrics_ports) -> list:
    """Each owner's slots by state, from its /metrics page. A daemon that died (killed on purpose,
    say) has no page: its entry says so, and the report goes on without its slots."""
    out = []
    for what, port in metrics_ports:
        try:
            out.append({"owner": what, "slots": slot_counts(owner_page(port, timeout=3.0))})
        except OSError as e:  # URLError and ConnectionError are OSErrors
            out.append({"owner": what, "slots": {}, "unreachable": str(e)})
            print(f"workload: {what}'s /metrics is unreachable ({e}): its slots are left out", file=sys.stderr)
    return out


def slot_counts(page: str) -> dict:
    """Slots by state from an owner's page: fluxon_owner_slots{state="..."}."""
    out = {}
    for line in page.splitlines():
        if line.startswith('fluxon_owner_slots{state="'):
            state = line.split('"')[1]
            out[state] = int(float(line.rsplit(" ", 1)[1]))
    return out


def _page(port: int, timeout: float = 5.0) -> str:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.read().decode()


def _sample(page: str, name: str) -> float:
    for line in page.splitlines():
        if line.split(" ")[0] == name:
            return float(line.split()[-1])
    return -1.0
