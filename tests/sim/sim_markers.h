// tests/sim/sim_markers.h — the simulator's in-flight markers: what idemd keeps in Redis
// (idem/inflight.h), shared by every instance, in simulated time, failing as a Redis does: a call
// that cannot tell (Redis down or slow past its timeout), an answer that comes late, a release
// lost, and every marker gone at once (a failover to a replica that had not received them). A
// marker lives its ttl by the backend's clock (the world's). Each fault is drawn from the
// schedule's random stream.
#pragma once

#include <functional>
#include <map>
#include <random>
#include <string>

#include "idem/clock.h"
#include "idem/inflight.h"

namespace idem::sim {

// Single-threaded: the simulator's one thread calls it. Borrows `clock`, `rng` and `log`.
class SimMarkers final : public InFlightMarkers {
 public:
  // `late(d)`: a call whose answer takes `d` moves the world's time on by it.
  SimMarkers(const MonotonicClock& clock, std::mt19937_64& rng, std::function<void(Millis)> late,
             std::function<void(const std::string&)> log);

  void SetFaults(bool on) { faults_ = on; }
  // Every marker is gone (a failover).
  void Vanish();

  Placement Place(const ScopeHash& scope, const InFlight& mine, Millis ttl) override;
  void Release(const ScopeHash& scope, const MarkerToken& token) override;

 private:
  struct Marker {
    MarkerToken token;
    InFlight said;
    SteadyTime until;
  };
  // Whether this call meets a fault that leaves it unable to tell; logs it.
  bool Fails(const char* call);

  const MonotonicClock& clock_;
  std::mt19937_64& rng_;
  std::function<void(Millis)> late_;
  std::function<void(const std::string&)> log_;
  bool faults_ = true;
  int next_token_ = 0;
  std::map<std::string, Marker> markers_;  // by scope, hex
};

}  // namespace idem::sim
