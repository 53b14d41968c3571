"""`fluxon top [FILE | HOST:PORT ...]`: the cluster at a glance in a terminal, redrawn every second.

It reads the master's `/api/status` (the status page's document, docs/operations.md) from the
master's metrics port: `fluxon top FILE` finds it in the cluster config (with `masters:`, the one
that leads), `python -m fluxon.top HOST:PORT [HOST:PORT ...]` takes the addresses. `--once` prints
one screen and exits (1 when no master answered), for scripts and logs."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import urllib.error
import urllib.request

BARS = "▁▂▃▄▅▆▇█"


def fetch(address: str, timeout: float = 2.0) -> dict:
    with urllib.request.urlopen(f"http://{address}/api/status", timeout=timeout) as r:
        return json.loads(r.read().decode())


def pick(addresses: list[str]) -> tuple[str, dict]:
    """The leader's document (HA), else the first master that answered. Raises OSError naming every
    address and why when none did."""
    errors, first = [], None
    for a in addresses:
        try:
            doc = fetch(a)
        except (OSError, ValueError) as e:
            errors.append(f"{a}: {getattr(e, 'reason', e)}")
            continue
        if doc.get("leading"):
            return a, doc
        first = first or (a, doc)
    if first:
        return first
    raise OSError("no master's status page answered (" + "; ".join(errors) + ")")


def size(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def count(n) -> str:
    if n is None:
        return "-"
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e4:
        return f"{n / 1e3:.1f}k"
    return f"{n:.0f}" if float(n).is_integer() else f"{n:.1f}"


def spark(values: list, width: int = 30) -> str:
    v = values[-width:]
    if not v:
        return ""
    top = max(v) or 1
    return "".join(BARS[min(len(BARS) - 1, int(x / top * (len(BARS) - 1) + 0.5))] for x in v)


def render(address: str, doc: dict, color: bool, width: int | None = None) -> str:
    """The screen; lines cut at `width` columns (a terminal's), whole when None (a pipe, a log)."""
    red = (lambda s: f"\x1b[31;1m{s}\x1b[0m") if color else (lambda s: s)
    bold = (lambda s: f"\x1b[1m{s}\x1b[0m") if color else (lambda s: s)
    out = [bold(f"fluxon top - cluster {doc['cluster']}") +
           f"  master {doc['master_address']} ({'leader' if doc['leading'] else 'standby'}"
           + (f", term {doc['term']}" if doc.get("term") else "") + f")  status from {address}"
           + f"  up {doc['uptime_s']} s  {time.strftime('%H:%M:%S', time.localtime(doc['now_ms'] / 1000))}"]
    for a in doc["alerts"]:
        out.append(red("! " + a))
    out.append("")
    cols = [("node", 5), ("role", 13), ("slots free", 10), ("in use", 7), ("committed", 10), ("grants", 6),
            ("resident", 10), ("hot tier", 10), ("reclaim", 10), ("served", 10), ("put", 8), ("read (hit)", 14),
            ("errors", 6), ("report", 8)]
    out.append(" ".join(f"{n:>{w}}" if i > 1 else f"{n:<{w}}" for i, (n, w) in enumerate(cols)))
    for o in doc["owners"]:
        r = o["report"]
        got = r.get("get_keys_total", 0)
        hit = f" ({100 * r.get('get_hit_keys_total', 0) // got}%)" if got else ""
        in_use = r.get("slots_prepared", 0) + r.get("slots_pending", 0) + r.get("slots_pending_local_visible", 0)
        age = "none" if o["report_age_ms"] is None else f"{o['report_age_ms'] / 1000:.1f} s"
        vals = [str(o["node"]), o["role"], count(r.get("slots_free")), count(in_use), count(r.get("slots_committed")),
                count(r.get("grants")), size(r.get("resident_bytes")), size(r.get("hot_bytes")),
                size(r.get("pending_eviction_reclaim_bytes")), size(r.get("data_served_bytes_total")),
                count(r.get("put_keys_total")), count(got) + hit, count(r.get("errors_total")), age]
        line = " ".join(f"{v:>{w}}" if i > 1 else f"{v:<{w}}" for i, (v, (_, w)) in enumerate(zip(vals, cols)))
        out.append(red(line) if o["stale"] else line)
    m = doc["master"]
    out += ["", bold("master") + f"  routes {count(m['routes'])}  replicas {count(m['replicas'])}  "
            f"owners {m['owners']}  in-flight gets {m['inflight_gets']}  replica tasks queued "
            f"{m['replica_tasks_queued']}  reclaims {m['reclaims']}  tombstones {count(m['tombstones'])}  "
            + (red(f"errors {m['errors_total']}") if m["errors_total"] else "errors 0"), "",
            bold("per second") + "  (now, and the last 30 s)"]
    for name, values in doc["history"]["series"].items():
        now = values[-1] if values else 0
        shown = (size(now) if "bytes" in name else count(now)) + "/s"
        label = name.removesuffix("_per_s").replace("_", " ")
        line = f"  {label:<20} {shown:>12}  {spark(values)}"
        out.append(red(line) if name.startswith("errors") and any(values[-10:]) else line)
    if width is None:
        return "\n".join(out) + "\n"
    # Cut what shows, not the colour codes: a coloured line is cut before its codes count.
    return "\n".join(x if len(x) <= width or "\x1b" in x else x[:width] for x in out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="fluxon top", description=__doc__.splitlines()[0])
    ap.add_argument("address", nargs="+", help="the master's metrics address HOST:PORT (several: the HA masters)")
    ap.add_argument("--once", action="store_true", help="print one screen and exit")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between screens (default 1)")
    ap.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    args = ap.parse_args(argv)
    if args.interval <= 0:
        ap.error(f"--interval: must be > 0 seconds, got {args.interval}")
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    if args.once:
        try:
            address, doc = pick(args.address)
        except OSError as e:
            print(f"fluxon top: {e}", file=sys.stderr)
            return 1
        sys.stdout.write(render(address, doc, color, shutil.get_terminal_size().columns if sys.stdout.isatty() else None))
        return 0
    try:
        while True:
            try:
                address, doc = pick(args.address)
                screen = render(address, doc, color,
                                shutil.get_terminal_size().columns if sys.stdout.isatty() else None)
            except OSError as e:
                screen = f"fluxon top: {e} - trying again every {args.interval:g} s\n"
            sys.stdout.write("\x1b[H\x1b[2J" + screen)
            sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
