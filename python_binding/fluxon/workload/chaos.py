"""--chaos: kill -9s of the private cluster's daemons on a seeded schedule, bystander clients, and
the checks after it (nothing lost, owners back at their baseline, master routes = owners' slots)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import random
import subprocess
import sys
import time

from .scrape import _page, _sample, owner_page, slot_counts


def bystander_main(conf, seed, counts, pythonpath):
    """A client beside the ranks that crash chaos kills: it puts batches, reads its own keys back
    (checking every byte) and holds views while it reads, so that it dies holding things. counts:
    puts, keys read, bad bytes, reattaches, other errors."""
    sys.path.insert(0, pythonpath) if pythonpath else None
    import fluxon
    rnd = random.Random(seed)
    size = 16 << 10

    def value(k):
        return hashlib.sha256(k.encode()).digest() * (size // 32)
    c = None
    done = []
    n = 0
    while True:
        try:
            if c is None:
                c = fluxon.KvClient(conf)
            keys = [f"bystander-{seed}-{n}-{j}" for j in range(8)]
            n += 1
            p = c.local_fast_put_start(keys, size)
            for k, ptr in zip(keys, fluxon.plan_pointers(p)):
                ctypes.memmove(ptr, value(k), size)
            c.local_fast_put_commit(p).result(20)
            counts[0] += 1
            done.append(keys)
            back = rnd.choice(done[-32:])
            h, r = c.get_start(back)
            if r.transferable_len == 0:
                c.cancel_get_transfer(h)
                continue
            plan = c.get_transfer(h)
            time.sleep(0.02)  # held while "restoring"
            for k, ptr in zip(back, fluxon.plan_pointers(plan)):
                counts[1] += 1
                if ctypes.string_at(ptr, size) != value(k):
                    counts[2] += 1
            c.release_views(plan)
        except (fluxon.Closed, fluxon.GenerationMismatch):
            counts[3] += 1
            try:
                c.wait_local_segments_ready()
            except fluxon.Error:
                time.sleep(0.1)
        except fluxon.Error:
            counts[4] += 1
            time.sleep(0.05)


class Chaos:
    """--chaos: kill -9s daemons of the private cluster (restarted by `fluxon cluster up` after a
    seeded pause) and the bystander client (a fresh one started) at seeded random points. In the HA
    mode (ha_metrics: the masters' /metrics ports) a master kill is the leader's, timed: from the
    kill to the first remote get through the new leader of keys published through the old one."""

    def __init__(self, seed, kills, cluster, names, client_confs, pythonpath, ctx, ha_metrics=None):
        import threading
        self.rng = random.Random(seed)
        self.seed, self.kills = seed, kills
        self.fb, self.cfg = cluster
        self.run_dir = self.cfg.parent
        self.names, self.confs, self.pythonpath, self.ctx = names, client_confs, pythonpath, ctx
        self.events = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.counts = ctx.Array("q", 5)
        self.bystander = None
        self.bystanders = 0
        self.report = {}
        self.finished = False
        self.ha_metrics = ha_metrics
        self.probe = None  # (writer, reader): clients of instance 0's and instance 1's owners

    def start(self):
        self.t0 = time.time()
        self._spawn_bystander()
        self.thread.start()

    def _spawn_bystander(self):
        conf = self.confs[self.bystanders % len(self.confs)]
        self.bystander = self.ctx.Process(target=bystander_main, daemon=True,
                                          args=(conf, self.seed * 1000 + self.bystanders, self.counts, self.pythonpath))
        self.bystander.start()
        self.bystanders += 1

    def _up(self):
        """Every daemon up again; why not, if one did not come up (the event says so)."""
        r = subprocess.run([self.fb, "cluster", "up", str(self.cfg)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        return None if r.returncode == 0 else (r.stderr.strip() or f"cluster up exited {r.returncode}")

    def _leader(self, wait_s: float = 10.0):
        """The index of the master whose /metrics says it leads, waiting up to wait_s for one (an
        election and the page's first refresh take a moment after the cluster is up; None: none)."""
        end = time.time() + wait_s
        while True:
            for i, port in enumerate(self.ha_metrics):
                try:
                    if _sample(_page(port, timeout=2.0), "fluxon_master_leader") == 1:
                        return i
                except OSError:
                    pass
            if time.time() >= end or self.stop.is_set():
                return None
            time.sleep(0.1)

    def _probe_keys(self, k):
        """Keys put through instance 0's owner and published (through the leader about to die)."""
        import fluxon
        if self.probe is None:
            self.probe = (fluxon.KvClient(self.confs[0]), fluxon.KvClient(self.confs[1]))
        w = self.probe[0]
        keys = [f"failover-{self.seed}-{k}-{i}" for i in range(4)]
        p = w.local_fast_put_start(keys, 4096)
        for key, ptr in zip(keys, fluxon.plan_pointers(p)):
            ctypes.memmove(ptr, hashlib.sha256(key.encode()).digest() * 128, 4096)
        w.local_fast_put_commit(p).result(20)
        return keys

    def _first_remote_get_ms(self, keys, t0):
        """Reads `keys` through instance 1's owner until they come (remote: the new leader routes
        them); ms since t0, the bytes checked. None after 30 s."""
        import fluxon
        r = self.probe[1]
        while time.time() - t0 < 30:
            h, res = r.get_start(keys)
            if res.transferable_len == len(keys):
                plan = r.get_transfer(h)
                t = (time.time() - t0) * 1000
                ok = all(ctypes.string_at(ptr, 4096) == hashlib.sha256(k.encode()).digest() * 128
                         for k, ptr in zip(keys, fluxon.plan_pointers(plan)))
                r.release_views(plan)
                if not ok:
                    self.counts[2] += 1
                return round(t)
            r.cancel_get_transfer(h)
            time.sleep(0.01)
        return None

    def _run(self):
        import signal
        for k in range(self.kills):
            if self.stop.wait(self.rng.uniform(0.5, 1.5)):
                return
            victim = self.rng.choice(self.names)
            at = round(time.time() - self.t0, 2)
            if victim == "client":
                self.bystander.kill()
                self.bystander.join()
                self._spawn_bystander()
                self.events.append({"at_s": at, "victim": "client", "down_s": 0})
                continue
            down = self.rng.uniform(0.5, 2.0)
            timed = victim == "master" and self.ha_metrics is not None and len(self.confs) > 1
            keys = None
            if timed:
                lead = self._leader()
                if lead is None:
                    self.events.append({"at_s": at, "victim": "leader", "error": "no leader to kill"})
                    continue
                victim = f"master-{lead}"
                try:
                    keys = self._probe_keys(k)
                except Exception as e:  # noqa: BLE001 - reported as the event's error
                    self.events.append({"at_s": at, "victim": victim, "error": f"probe put: {e}"})
                    continue
            t0 = time.time()
            try:
                os.kill(int((self.run_dir / f"{victim}.pid").read_text()), signal.SIGKILL)
            except (OSError, ValueError) as e:
                self.events.append({"at_s": at, "victim": victim, "error": str(e)})
                continue
            event = {"at_s": at, "victim": victim, "down_s": round(down, 2)}
            if timed:
                try:
                    event["first_remote_get_ms"] = self._first_remote_get_ms(keys, t0)
                except Exception as e:  # noqa: BLE001
                    event["error"] = f"probe get: {e}"
            time.sleep(max(0.0, down - (time.time() - t0)))
            failed = self._up()
            if failed:
                event["error"] = f"restart: {failed}"
            if timed:  # back as a standby before the next kill
                time.sleep(1.0)
            self.events.append(event)

    def finish(self):
        """Stops killing; the last bystander dies by kill -9 too; every daemon is up again."""
        if self.finished:
            return
        self.finished = True
        self.stop.set()
        self.thread.join()
        if self.bystander is not None:
            self.bystander.kill()
            self.bystander.join()
        if self.probe:
            for c in self.probe:
                c.close()
        self._up()


def chaos_check(metrics_ports, master_port, chaos) -> dict:
    """After the chaos: every owner back at baseline (nothing held, pending or prepared: the killed
    clients' sessions ended; no publish job, write-back, reclaim or reclaim byte still in flight: each
    completed or was retried to its end under the master that came back) and the master's replicas
    equal to the owners' committed slots (no route of a live owner lost, none left for a slot that is
    gone), the master with no reclaim or fence left. Waits up to 30 s for all of it."""
    end = time.time() + 30
    while True:
        pages = [owner_page(port, timeout=10.0) for _, port in metrics_ports]
        slots = [slot_counts(pg) for pg in pages]
        holders = [int(_sample(pg, "fluxon_owner_holders")) for pg in pages]
        inflight = [s.get("pending", 0) + s.get("pending_local_visible", 0) + s.get("prepared", 0) for s in slots]
        jobs = {name: [int(_sample(pg, f"fluxon_owner_{name}")) for pg in pages]
                for name in ("publish_jobs", "writeback_jobs", "reclaims", "pending_eviction_reclaim_bytes")}
        committed = sum(s.get("committed", 0) for s in slots)
        lead = chaos._leader() if chaos.ha_metrics else 0
        mpage = _page(master_port[lead]) if lead is not None else ""
        replicas = int(_sample(mpage, "fluxon_master_replicas")) if lead is not None else -1
        master_left = {name: int(_sample(mpage, f"fluxon_master_{name}")) for name in ("reclaims", "reclaim_fences")}
        baseline = not any(holders) and not any(inflight) and not any(x for v in jobs.values() for x in v) and \
            not any(master_left.values())
        match = replicas == committed
        if (baseline and match) or time.time() > end:
            break
        time.sleep(0.5)
    c = list(chaos.counts)
    took = sorted(e["first_remote_get_ms"] for e in chaos.events if e.get("first_remote_get_ms") is not None)
    failover = {"kills": sum(1 for e in chaos.events if "first_remote_get_ms" in e), "ms": took}
    if took:
        import statistics
        failover.update(median_ms=statistics.median(took), min_ms=took[0], max_ms=took[-1])
    return {"seed": chaos.seed, "events": chaos.events, "baseline": baseline, "holders": holders,
            "failover": failover, "owner_jobs": jobs, "master_left": master_left,
            "inflight_slots": inflight, "routes_match": match, "master_replicas": replicas,
            "owners_committed_slots": committed,
            "bystander": {"clients": chaos.bystanders, "puts": c[0], "keys_read": c[1], "bad_bytes": c[2],
                          "reattached": c[3], "other_errors": c[4]},
            "bystander_ok": c[2] == 0 and c[0] > 0}
