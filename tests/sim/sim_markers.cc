// tests/sim/sim_markers.cc — the simulator's in-flight markers.
#include "tests/sim/sim_markers.h"

#include "idem/key.h"

namespace idem::sim {

SimMarkers::SimMarkers(const MonotonicClock& clock, std::mt19937_64& rng,
                       std::function<void(Millis)> late,
                       std::function<void(const std::string&)> log)
    : clock_(clock), rng_(rng), late_(std::move(late)), log_(std::move(log)) {}

void SimMarkers::Vanish() {
  log_("redis fails over: its " + std::to_string(markers_.size()) + " in-flight markers are gone");
  markers_.clear();
}

bool SimMarkers::Fails(const char* call) {
  if (!faults_) return false;
  const uint64_t what = rng_() % 20;
  if (what == 0) {
    log_(std::string("redis: a marker's ") + call + " gets no answer in time");
    return true;
  }
  if (what == 1) {
    const Millis d(static_cast<int64_t>(1 + rng_() % 300));
    log_(std::string("redis: a marker's ") + call + " answers " + std::to_string(d.count()) +
         " ms late");
    late_(d);
  }
  return false;
}

Placement SimMarkers::Place(const ScopeHash& scope, const InFlight& mine, Millis ttl) {
  if (Fails("placement")) return {};
  const SteadyTime now = clock_.Now();
  const std::string at = ToHex(scope);
  auto it = markers_.find(at);
  if (it != markers_.end() && it->second.until > now) {
    InFlight held = it->second.said;
    held.lease_left = std::chrono::duration_cast<Millis>(it->second.until - now);
    return {std::nullopt, held};
  }
  Marker& marker = markers_[at];
  marker.token = "m" + std::to_string(++next_token_);
  marker.said = mine;
  marker.until = now + ttl;
  return {marker.token, std::nullopt};
}

void SimMarkers::Release(const ScopeHash& scope, const MarkerToken& token) {
  if (Fails("release")) return;
  auto it = markers_.find(ToHex(scope));
  if (it != markers_.end() && it->second.token == token) markers_.erase(it);
}

}  // namespace idem::sim
