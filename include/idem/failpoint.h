// include/idem/failpoint.h — named failpoints: places in the protocol where a test can make the
// process crash, stall or fail, to prove what a crash at exactly that step leaves behind.
//
// Points are armed at run time (ArmFailpoints, or the IDEM_FAILPOINTS environment variable read
// by idemd at start-up): "after_charge_sent=crash,before_complete_commit=stall:5000". Builds with
// -DIDEM_FAILPOINTS=OFF compile every point to nothing.
#pragma once

#include <array>
#include <string_view>

#include "idem/build_config.h"
#include "idem/result.h"

namespace idem {

// Every failpoint, in protocol order. IDEM_FAILPOINT refuses (at compile time) a name not listed
// here, and ArmFailpoints (so IDEM_FAILPOINTS) refuses one at run time: a typo is an error, never
// a point that silently does nothing.
inline constexpr std::array<std::string_view, 12> kFailpoints = {
    // This request's in-flight marker is in Redis, its claim not yet made (Engine::Start, only
    // with markers): two stores written one after the other, so a marker can outlive its request.
    "cache_after_marker",
    "after_claim",            // the claim transaction committed (Engine::Start)
    "heartbeat",              // a lease renewal of a running execution (Heartbeat)
    "after_charge_sent",      // charge_sent committed, the charge not yet sent (payments)
    "after_provider_charge",  // the provider charged, the outcome not yet recorded (payments)
    // The completion's transaction is about to commit (Engine::Finish; Engine::ExecuteInTxn, whose
    // transaction also holds the claims and the operations' writes).
    "before_complete_commit",
    "after_complete_commit",  // the completion committed, the answer not yet sent
    // A finished record read from the database, not yet put in the LRU and Redis (the replay
    // cache's read-through fill; nothing fills the cache at completion). `error` skips the fill.
    "cache_before_fill",
    // A full batch of the sweeper deleted and committed, the next not yet run (SweepExpired):
    // each batch is its own statement, so a round is not atomic.
    "sweep_between_batches",
    "reconcile_after_refund",  // a refund of the books left, not yet recorded (Reconciliation)
    // A queue message's record is finished, the broker not yet told (idemd's consumers): the
    // broker delivers it again, and the copy must be answered from the record.
    "consumer_before_ack",
    // A page of outbox events confirmed by the broker, not yet marked published (the outbox
    // relay): the next pass publishes them again, under the same ids.
    "outbox_after_publish",
};

// Arms points from a spec: comma-separated name=action, action one of crash (the process exits
// at once with status 86, like a kill -9 at that line), stall:MS (sleeps), error (the step fails
// with kUnavailable). "off" disarms. Errors: kInvalidArgument for a malformed spec.
// Errors: kInvalidArgument for a malformed spec or a name not in kFailpoints.
Status ArmFailpoints(std::string_view spec);

// Disarms every point.
void ClearFailpoints();
// Whether any point is armed (one relaxed atomic load): lets a caller that must not block (a
// coroutine on an I/O thread) pass a point through a thread pool only when it could stall.
bool FailpointsArmed();

// Fixes a test can take back, one by one, to show that the simulator (tests/sim) finds the
// double execution each one prevents. IDEM_REVERTED(name) is true while the fix is taken back
// (RevertFixes); builds without failpoints compile it to false. Nothing but a test arms one: no
// environment variable, flag or configuration reaches them.
inline constexpr std::array<std::string_view, 6> kRevertibleFixes = {
    // A charge leaves only within the lease margin after its covered advance, the claim's own
    // included (ChargeSteps::BeforeSend, CoverIsFresh and SendWithin); taken back, it leaves
    // however late the store answered.
    "margin",
    // A provider 5xx it does not declare as "nothing charged" is an unknown outcome
    // (ChargeSteps::AfterSend); taken back, it abandons the attempt as if nothing was charged.
    "unknown_5xx",
    // An executed operation whose answer is too large to keep is finished with a small answer
    // that says so (IdempotencyFilter::Finish); taken back, it is left unfinished.
    "too_large",
    // A status URL's answer other than 404 or a 2xx cannot tell (ForwardSteps::FromStatus);
    // taken back, anything but a 2xx reads as "never ran", and the request is forwarded again.
    "status_vocabulary",
    // Each operation forwards a key of its own (UpstreamKeyOf); taken back, every operation of a
    // client key forwards the scope's, also after the record expired and a new one began.
    "upstream_key",
    // A gateway upstream's 5xx that is neither final nor declared "nothing done" is an unknown
    // outcome (ForwardSteps::MayHaveActed); taken back, it is retryable, forwarded again.
    "gateway_5xx",
};

// Takes back the fixes a comma-separated list names ("" restores every fix). Errors:
// kInvalidArgument for a name not in kRevertibleFixes, or when failpoints are compiled out.
Status RevertFixes(std::string_view names);

namespace internal {
Status HitFailpoint(std::string_view name);
bool Reverted(std::string_view name);

consteval std::string_view Revertible(std::string_view name) {
  for (std::string_view known : kRevertibleFixes) {
    if (known == name) return name;
  }
  throw "IDEM_REVERTED: not a name in kRevertibleFixes";
}

// `name` if it is a listed failpoint; used in a constant expression, an unlisted name does not
// compile.
consteval std::string_view Listed(std::string_view name) {
  for (std::string_view known : kFailpoints) {
    if (known == name) return name;
  }
  throw "IDEM_FAILPOINT: not a name in kFailpoints";
}
}  // namespace internal

}  // namespace idem

#if defined(IDEM_NO_FAILPOINTS)
#define IDEM_FAILPOINT(name) ::idem::Status()
#define IDEM_REVERTED(name) false
#else
// Whether the fix `name` is taken back (RevertFixes).
#define IDEM_REVERTED(name) ::idem::internal::Reverted(::idem::internal::Revertible(name))
// Evaluates to a Status: Ok unless the point is armed with "error".
#define IDEM_FAILPOINT(name) ::idem::internal::HitFailpoint(::idem::internal::Listed(name))
#endif
