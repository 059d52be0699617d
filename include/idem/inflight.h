// include/idem/inflight.h — in-flight markers: an optional hint, kept outside the database, that
// an execution of a scope is running, so that a concurrent duplicate can be turned away before it
// reaches the database.
//
// A marker is a hint, never a decision. The engine answers a request that meets a live marker of
// the same request (same fingerprint) with a retryable "in progress", never with a final answer;
// everything else goes to the database, which decides. A missing, lost or expired marker only
// costs a trip to the database. A marker belongs to the request that placed it: only the holder
// of its token removes it, so a request that differs, a duplicate, or a takeover never deletes a
// running executor's marker. A crashed executor's marker expires with its ttl.
#pragma once

#include <optional>
#include <string>

#include "idem/clock.h"
#include "idem/fingerprint.h"
#include "idem/key.h"

namespace idem {

// What a marker says about the execution that placed it.
struct InFlight {
  Fingerprint fingerprint;
  Timestamp expires_at{};  // until when its key is recognised, as its placer reckoned it (a hint)
  // Read back only (Placement::held): how long the marker still lives, by the marker backend's
  // own clock, so no instance's clock, however skewed, decides whether it is live.
  Millis lease_left{0};
};

// Proof of having placed one marker: an opaque value chosen by the implementation when it places
// the marker, unique to that placement (it carries random bytes).
using MarkerToken = std::string;

// The outcome of InFlightMarkers::Place. At most one member is set; neither means the
// implementation could not tell (its backend failed or is resting): go to the database, holding
// no marker.
struct Placement {
  std::optional<MarkerToken> token;  // this call placed the marker; release it with this token
  std::optional<InFlight> held;      // another request's marker is there, saying this
};

// Thread-safe. Never blocks longer than its implementation's per-call timeout, and never fails:
// every failure is reported as "could not tell" (Place) or ignored (Release).
class InFlightMarkers {
 public:
  virtual ~InFlightMarkers() = default;

  // Places a marker for `scope` saying `mine`, living `ttl`, unless one is there, and returns
  // the new marker's token or what the existing marker says.
  virtual Placement Place(const ScopeHash& scope, const InFlight& mine, Millis ttl) = 0;

  // Removes the marker of `scope` if it is still the one placed with `token` (compare and
  // delete, atomically); any other marker stays. Best effort: a failure leaves the marker to
  // expire with its ttl.
  virtual void Release(const ScopeHash& scope, const MarkerToken& token) = 0;
};

}  // namespace idem
