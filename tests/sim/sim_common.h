// tests/sim/sim_common.h — what the simulator's downstreams (sim_provider.h, sim_upstream.h) and
// its schedule share.
#pragma once

#include <random>
#include <string>
#include <string_view>

#include "http/async.h"
#include "idem/clock.h"

namespace idem::sim {

// The string member `name` of a JSON object, or "" (not JSON, not an object, no such string).
std::string StringMember(std::string_view json, std::string_view name);

// A downstream's delays in simulated time, drawn from the schedule's random stream.
// Single-threaded.
class SimDelays {
 public:
  explicit SimDelays(std::mt19937_64& rng) : rng_(rng) {}
  // At once: Wait does not wait (the takeover loop's calls, made from plain code that runs a
  // private event loop with no simulated time).
  void SetAtOnce(bool at_once) { at_once_ = at_once; }
  // Waits `d` on the loop's timer clock (http::SleepFor), unless at once.
  http::Async<void> Wait(Millis d);
  // A delay in [0, limit); `limit` > 0.
  Millis Below(Millis limit) {
    return Millis(static_cast<int64_t>(rng_() % static_cast<uint64_t>(limit.count())));
  }

 private:
  std::mt19937_64& rng_;
  bool at_once_ = false;
};

}  // namespace idem::sim
