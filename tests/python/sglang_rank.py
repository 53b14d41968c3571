"""One TP rank of an SGLang server, as a process: the backend built by SGLang's dynamic loader, a
host pool, the controller's threads, and the ranks joined by torch.distributed (gloo) for the MIN
all-reduces. Reads one JSON command per line on stdin, answers one JSON line on stdout.

    python sglang_rank.py RANK WORLD PORT CLIENT_CONFIG LAYOUT
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.environ["FLUXON_BUILD_DIR"], "python"))
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from sglang_harness import (Controller, MHAHostPool, dynamic_extra, fill_page, load_backend, page_bytes,  # noqa: E402
                            storage_config)


def main():
    rank, world, port, client_config, layout = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], \
        sys.argv[5]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    pool = MHAHostPool(layout, pages=512, page_size=16, layer_num=4, head_num=2, head_dim=64)
    extra = dynamic_extra(client_config, call_timeout_s=1.0, log_interval_s=60.0)
    backend = load_backend(storage_config(rank, world, layout=layout, extra=extra), pool)
    ctl = Controller(backend, pool, group=dist.group.WORLD)
    for line in sys.stdin:
        cmd = json.loads(line)
        t0 = time.monotonic()
        out = {}
        if cmd["op"] == "backup":
            for h, p in zip(cmd["hashes"], cmd["pages"]):
                fill_page(pool, p, f"{h}/{rank}")
            out["done"] = ctl.backup(cmd["hashes"], cmd["pages"])
        elif cmd["op"] == "prefetch":
            n = ctl.prefetch(cmd["hashes"], cmd["pages"])
            out["restored"] = n
            out["verified"] = all(page_bytes(pool, p) == _expected(pool, h, rank)
                                  for h, p in zip(cmd["hashes"][:n], cmd["pages"][:n]))
        elif cmd["op"] == "flush":
            out["settled"] = backend.flush(cmd.get("timeout", 10))
        elif cmd["op"] == "stats":
            s = backend.fluxon_stats()
            out = {"counters": s["counters"], "failures": s["failures"]}
        elif cmd["op"] == "exit":
            backend.close()
            print(json.dumps({"bye": True}), flush=True)
            break
        out["secs"] = time.monotonic() - t0
        out["thread_errors"] = [repr(e) for e in ctl.thread_errors]
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def _expected(pool, h, rank):
    """The bytes fill_page wrote for (h, rank), regenerated in a scratch pool."""
    scratch = MHAHostPool(pool.layout, pages=1, page_size=pool.page_size, layer_num=pool.layer_num,
                          head_num=pool.head_num, head_dim=pool.head_dim, dtype=pool.dtype)
    return fill_page(scratch, 0, f"{h}/{rank}")


if __name__ == "__main__":
    main()
