"""The human report of a run."""

from __future__ import annotations



def print_report(a, run):
    r0, results, reconciled = run["r0"], run["results"], run["reconciled"]
    t = r0["totals"]
    print()
    print(f"{'round':>5} {'reqs':>5} {'tokens':>9} {'L1%':>6} {'L2%':>6} {'L3%':>6} {'total%':>7} "
          f"{'recomp':>8} {'backup MB':>10} {'restore MB':>11} {'req/s':>7}")
    for i, r in enumerate(r0["rounds"]):
        tok = max(1, r["tokens"])
        print(f"{i + 1:>5} {r['requests']:>5} {r['tokens']:>9} {100 * r['l1'] / tok:6.1f} {100 * r['l2'] / tok:6.1f} "
              f"{100 * r['l3'] / tok:6.1f} {100 * (r['l1'] + r['l2'] + r['l3']) / tok:7.1f} {r['recomputed']:>8} "
              f"{r['backup_bytes'] / 1e6:10.1f} {r['restore_bytes'] / 1e6:11.1f} {r['requests'] / r['seconds']:7.1f}")
    tok = max(1, t["tokens"])
    print(f"total: {t['requests']} requests, {t['tokens']} tokens in {t['seconds']:.2f} s = "
          f"{t['requests'] / t['seconds']:.1f} req/s ({a.instances} instance(s) x TP {a.tp}); hits L1 {100 * t['l1'] / tok:.1f}% "
          f"L2 {100 * t['l2'] / tok:.1f}% L3 {100 * t['l3'] / tok:.1f}% total "
          f"{100 * (t['l1'] + t['l2'] + t['l3']) / tok:.1f}%; recomputed {t['recomputed']} tokens; "
          f"{t['remote_restores']} of {t['restores']} restores fetched from a remote owner; "
          f"backup {t['backup_bytes'] / 1e6:.1f} MB, restore {t['restore_bytes'] / 1e6:.1f} MB")
    tt = r0["ttft_ms"]
    print(f"  TTFT (modelled): p50 {tt['p50']:.1f} ms  p90 {tt['p90']:.1f} ms  p99 {tt['p99']:.1f} ms over "
          f"{len(r0['requests'])} requests (queued p50 {tt['queued_p50']:.1f} ms); "
          + (f"arrivals at trace time / {a.speedup:g}" if a.speedup else "closed loop")
          + (f", prefill {a.prefill_tok_s:.0f} tokens/s per rank" if a.prefill_tok_s else ", no prefill modelled")
          + "; pages moved at the bytes below, not the model's")
    print(f"  bytes: {a.model_note}")
    for k, v in r0["latency_us"].items():
        note = "  (observed at the next scheduler poll)" if k == "commit_to_future" else ""
        print(f"  {k:<17} p50 {v['p50']:8.1f} us  p99 {v['p99']:8.1f} us  ({v['n']} calls, instance 0 rank 0){note}")
    # Instance 0 rank 0's own time (r0's totals add the instances' prefill up: more than one clock).
    own, lu = results[0]["totals"], r0["latency_us"]
    calls = {k: lu[k]["sum_s"] for k in ("put_start", "get_start", "get_transfer")}
    rest = own["seconds"] - own["prefill_seconds"] - own["round_wait_seconds"] - sum(calls.values())
    print(f"  time of instance 0 rank 0: {own['seconds']:.2f} s = modelled prefill {own['prefill_seconds']:.2f} s + "
          + " + ".join(f"{k} {v:.2f} s" for k, v in calls.items())
          + f" + round ends {own['round_wait_seconds']:.2f} s (its backups published, the other ranks)"
          + f" + the rest {rest:.2f} s (the pool, verifying, polls)")
    bad = run["verify_failures"]
    mism = [r["counters"]["tp_mismatch_retry"] for r in results]
    st = r0["owner_stats"]
    ctr = r0["counters"]
    print(f"  owner slots: {st['slots_committed']} committed, {st['slots_free']} free, {st['grants']} grants; "
          f"backups {ctr['backup_backed']} backed, {ctr['backup_conflict']} already stored, "
          f"{ctr['backup_stored_elsewhere']} stored first by another owner, "
          f"{ctr['backup_failed'] + ctr['backup_write_failed']} failed; restores failed {ctr['restore_failed']}")
    ms = r0["master_stats"]
    print(f"  master: {ms.get('routes', 0)} routes, {ms.get('replicas', 0)} replicas; remote gets started "
          f"{ms.get('get_started_total', 0)}, done {ms.get('get_done_total', 0)}, revoked "
          f"{ms.get('get_revoked_total', 0)}; replica tasks ({a.replica_policy}) assigned "
          f"{ms.get('replica_tasks_assigned_total', 0)}, queued {ms.get('replica_tasks_queued', 0)}, "
          f"without a target {ms.get('replica_tasks_no_target_total', 0)}; evicted/removed copies "
          f"{ms.get('removed_with_copies_left_total', 0)} with another copy left, "
          f"{ms.get('removed_last_copy_total', 0)} last copies; write-back tasks "
          f"{ms.get('writeback_tasks_total', 0)}, backed {ms.get('writeback_backed_total', 0)}, demoted keys "
          f"{ms.get('demoted_keys_total', 0)}, demotions refused {ms.get('demote_kept_total', 0)}")
    pending = st.get("pending_eviction_reclaim_bytes", 0)
    print(f"  evictions (S4): {st.get('evicted_keys_total', 0)} keys / {st.get('evicted_bytes_total', 0)} bytes selected"
          f" = committed {st.get('reclaim_committed_bytes_total', 0)} + restored {st.get('reclaim_restored_bytes_total', 0)}"
          f" + obsolete {st.get('reclaim_obsolete_bytes_total', 0)} + pending {pending} bytes"
          f" ({'reconciled' if reconciled else 'NOT RECONCILED'}); {st.get('reclaim_started_total', 0)}"
          f" transactions; deferred: master activity {st.get('reclaim_master_activity_total', 0)}, partial"
          f" {st.get('reclaim_master_partial_total', 0)}, closure {st.get('reclaim_master_closure_total', 0)}, owner holder"
          f" {st.get('reclaim_owner_holder_total', 0)}, write {st.get('reclaim_owner_write_total', 0)}; back-offs"
          f" {st.get('reclaim_retry_queued_total', 0)}, then committed {st.get('reclaim_retry_completed_total', 0)},"
          f" restored {st.get('reclaim_restored_total', 0)}; master fenced {ms.get('reclaim_fenced_total', 0)},"
          f" refused gets {ms.get('reclaim_refused_gets_total', 0)} puts {ms.get('reclaim_refused_puts_total', 0)},"
          f" fences left {ms.get('reclaim_fences', 0)}")
    print(f"  restored pages verified byte for byte: {'all ok' if bad == 0 else f'{bad} FAILED'}; "
          f"TP mismatch retries {mism}; gate rejections {[r['counters']['gate_rejected'] for r in results]}")
    ch = run["report"].get("chaos")
    if ch:
        by = ch["bystander"]
        print(f"  crash chaos (seed {ch['seed']}): " + ", ".join(
            f"{e['victim']} at {e['at_s']} s" + (f" (down {e['down_s']} s)" if e.get("down_s") else "")
            for e in ch["events"]) + f"; ranks lost their owner {sum(r['counters']['owner_lost'] for r in results)}"
              f" times, reattached {sum(r['counters']['reattached'] for r in results)}; bystander clients "
              f"{by['clients']} ({by['puts']} puts, {by['keys_read']} keys read, {by['bad_bytes']} bad); owners at "
              f"baseline: {'yes' if ch['baseline'] else 'NO'}; master replicas {ch['master_replicas']} = owners' "
              f"committed slots {ch['owners_committed_slots']}: {'yes' if ch['routes_match'] else 'NO'}")
        fo = ch["failover"]
        if fo["kills"]:
            print(f"  failover: {fo['kills']} leader kills; first remote get through the new leader after "
                  f"{fo['ms']} ms" + (f" (median {fo['median_ms']:.0f} ms)" if fo["ms"] else ""))
