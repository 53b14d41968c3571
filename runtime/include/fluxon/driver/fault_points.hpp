// Fault points, written once: the places where a fault may be injected into an owner's traffic,
// each with its odds, drawn from one seeded generator. The simulator drives them from its seed
// (every link of the simulated cluster), the daemons from their fault_injection config; both go
// through OwnerDriver, so a point placed here fires in both. Every fault fired is counted by point.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <random>
#include <string_view>

namespace fluxon {

using Millis = int64_t;

// A link's faults: each message is lost with odds `drop`, else delayed uniformly in
// [min_delay, max_delay] and, with odds `duplicate`, delivered a second time (its own delay).
// For a data-plane fetch, `drop` is the odds that the batch fails after its bytes arrived.
struct LinkFaults {
  double drop = 0, duplicate = 0;
  Millis min_delay = 0, max_delay = 0;
  bool any() const { return drop > 0 || duplicate > 0 || max_delay > 0; }
};

// The points and what is injected at each: (name, link of FaultPlan).
#define FLUXON_FAULT_POINTS(X)                                                            \
  X(master_request, "owner -> master requests: lost, duplicated, delayed")               \
  X(master_reply, "master -> owner replies: lost, duplicated, delayed")                  \
  X(fetch, "data-plane fetch batches: failed after the bytes came, delayed")

struct FaultPlan {
#define FLUXON_FAULT_FIELD_(name, help) LinkFaults name;
  FLUXON_FAULT_POINTS(FLUXON_FAULT_FIELD_)
#undef FLUXON_FAULT_FIELD_
};

class FaultPoints {
 public:
  enum Point : uint8_t {
#define FLUXON_FAULT_ENUM_(name, help) k_##name,
    FLUXON_FAULT_POINTS(FLUXON_FAULT_ENUM_)
#undef FLUXON_FAULT_ENUM_
    kPoints
  };
  enum Fault : uint8_t { kDropped, kDuplicated, kDelayed, kFaults };
  static constexpr std::array<std::string_view, kPoints> kNames{
#define FLUXON_FAULT_NAME_(name, help) #name,
      FLUXON_FAULT_POINTS(FLUXON_FAULT_NAME_)
#undef FLUXON_FAULT_NAME_
  };
  static constexpr std::array<std::string_view, kFaults> kFaultNames{"dropped", "duplicated", "delayed"};

  // `plan` and `rng` outlive this (the simulator shares one of each among its owners).
  FaultPoints(const FaultPlan* plan, std::mt19937_64* rng) : plan_(plan), rng_(rng) {}

  // How many copies of a message at `p` go out (0: lost), each after its delay.
  struct Copies {
    int n = 1;
    Millis delay[2] = {0, 0};
  };
  Copies link(Point p) {
    const LinkFaults& f = at(p);
    Copies c;
    if (!f.any()) return c;  // no draw: a plan with no faults changes nothing, not even the sequence
    std::uniform_real_distribution<double> u(0, 1);
    if (u(*rng_) < f.drop) {
      fired_[p][kDropped]++;
      c.n = 0;
      return c;
    }
    c.delay[0] = delay(f);
    if (c.delay[0] > 0) fired_[p][kDelayed]++;
    if (u(*rng_) < f.duplicate) {
      fired_[p][kDuplicated]++;
      c.n = 2;
      c.delay[1] = delay(f);
    }
    return c;
  }
  // A fetch: whether it fails (after its bytes came) and how long it takes.
  struct Fetch {
    bool fail = false;
    Millis delay = 0;
  };
  Fetch fetch() {
    const LinkFaults& f = at(k_fetch);
    Fetch r;
    if (!f.any()) return r;
    std::uniform_real_distribution<double> u(0, 1);
    r.fail = u(*rng_) < f.drop;
    if (r.fail) fired_[k_fetch][kDropped]++;
    r.delay = delay(f);
    return r;
  }
  uint64_t fired(Point p, Fault f) const { return fired_[p][f]; }
  // fn(point name, fault name, count) for every pair.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (int p = 0; p < kPoints; ++p)
      for (int f = 0; f < kFaults; ++f) fn(kNames[p], kFaultNames[f], fired_[p][f]);
  }
  bool any() const {
    for (int p = 0; p < kPoints; ++p)
      if (at(Point(p)).any()) return true;
    return false;
  }

 private:
  const LinkFaults& at(Point p) const {
    switch (p) {
#define FLUXON_FAULT_CASE_(name, help) \
  case k_##name:                       \
    return plan_->name;
      FLUXON_FAULT_POINTS(FLUXON_FAULT_CASE_)
#undef FLUXON_FAULT_CASE_
      default: return plan_->master_request;
    }
  }
  Millis delay(const LinkFaults& f) {
    std::uniform_int_distribution<Millis> d(f.min_delay, std::max(f.min_delay, f.max_delay));
    return d(*rng_);
  }
  const FaultPlan* plan_;
  std::mt19937_64* rng_;
  std::array<std::array<uint64_t, kFaults>, kPoints> fired_{};
};

}  // namespace fluxon
