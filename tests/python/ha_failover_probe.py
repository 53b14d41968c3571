"""Failover, measured: kill -9 the leading master N times and print how long after each kill the
first remote get through the new leader succeeded (a real etcd, two masters, two owners).

    FLUXON_BUILD_DIR=build /usr/bin/python3 tests/python/ha_failover_probe.py [--kills 10] [--lease-ms 1000]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest  # noqa: E402,F401  (puts the built package on the path)
from conftest import free_port  # noqa: E402
from test_ha import HaCluster  # noqa: E402
from test_remote import _put, _read  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--lease-ms", type=int, default=1000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fluxon-failover-"))
    ha = HaCluster(tmp, f"fo{os.getpid()}x{free_port()}", lease_ttl_ms=args.lease_ms).start()
    took = []
    try:
        a, b = ha.client(0), ha.client(1)
        for k in range(args.kills):
            lead, term = ha.wait_leader()
            keys = [f"kill{k}_{i}" for i in range(8)]
            _put(a, keys, 4096, seed=k)  # published through the leader about to die
            ha.masters[lead].kill()
            ha.masters[lead].wait()
            t0 = time.time()
            while True:
                r, _ = _read(b, keys, 4096)
                if r.transferable_len == len(keys):
                    break
                if time.time() - t0 > 30:
                    raise SystemExit(f"kill {k}: no remote get through a new leader in 30 s")
                time.sleep(0.01)
            took.append((time.time() - t0) * 1000)
            print(f"kill {k}: term {term} -> first remote get through the new leader after {took[-1]:.0f} ms",
                  flush=True)
            ha.start_master(lead)  # back as a standby for the next kill
            time.sleep(1.0)
        a.close()
        b.close()
    finally:
        ha.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(took)} kills, lease {args.lease_ms} ms: median {statistics.median(took):.0f} ms, "
          f"min {min(took):.0f}, max {max(took):.0f}")


if __name__ == "__main__":
    main()
