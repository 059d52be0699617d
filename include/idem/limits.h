// include/idem/limits.h — every default limit of libidem in one place.
//
// Each limit is a default for a field of an options struct; deployments change them through
// configuration. Tests exercise each at the limit and one past it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace idem::limits {

// Idempotency-Key length in characters (after sf-string decoding).
inline constexpr std::size_t kKeyMinLength = 8;
inline constexpr std::size_t kKeyMaxLength = 255;
// Raw header value length accepted before any parsing (quotes and escapes included).
inline constexpr std::size_t kKeyHeaderMaxBytes = 2 * kKeyMaxLength + 2;

// Request bodies fed to the canonicaliser.
inline constexpr std::size_t kJsonMaxBytes = 64 * 1024;
inline constexpr std::size_t kJsonMaxDepth = 32;
// Members of one object / elements of one array.
inline constexpr std::size_t kJsonMaxContainerSize = 4096;
// Digits of one number and magnitude of its exponent, both as written and in its canonical form
// (CanonicalDecimal), so that canonical text is always accepted again.
inline constexpr std::size_t kJsonMaxNumberDigits = 100;
inline constexpr int64_t kJsonMaxExponent = 1000;

// Plaintext of one stored (sealed) response: a route's default (RoutePolicy::max_response_bytes),
// and the most any route may keep (as large as the largest answer idemd's HTTP client takes).
inline constexpr std::size_t kSealedResponseMaxBytes = 16 * 1024;
inline constexpr std::size_t kSealedResponseCeiling = 1024 * 1024;

// Principal identity and route id lengths.
inline constexpr std::size_t kPrincipalMaxLength = 128;
inline constexpr std::size_t kRouteMaxLength = 128;
// Recovery point and resource id lengths.
inline constexpr std::size_t kRecoveryPointMaxLength = 64;
inline constexpr std::size_t kResourceIdMaxLength = 128;
// Recovery points of one route past a call that cannot be called back (RoutePolicy::sent_points).
inline constexpr std::size_t kMaxSentPoints = 4;

// Quotas per principal.
inline constexpr int64_t kMaxProcessingPerPrincipal = 100;
// Sized for a busy merchant: 100 new keys a second, sustained over the default retention of 7 days,
// is 100 × 604,800 = 60,480,000 records; rounded up. The count is one row per principal
// (idem_retained), so a claim costs the same at any number retained.
inline constexpr int64_t kMaxRetainedPerPrincipal = 64'000'000;

// Requests one principal may bring to the claim (new keys, and retries of failed or stopped ones)
// on one route of one instance, each second, and at once after a pause: a key flood is refused
// (429) within a second, long before the retained quota, while a busy merchant (100 new keys a
// second) is never near it.
inline constexpr int64_t kMaxNewKeysPerSecondPerPrincipal = 1000;

// Time of records: how long a claim's lease lasts before another executor may take over (renewed
// by a heartbeat), how long a record is retained and its key recognised, and the longest
// Retry-After suggested to a duplicate that meets a running execution.
inline constexpr std::chrono::milliseconds kDefaultLease{30'000};
inline constexpr std::chrono::milliseconds kDefaultRetention{7LL * 24 * 3600 * 1000};
inline constexpr std::chrono::milliseconds kDefaultRetryAfter{1'000};
// What a lease must cover beyond an external call's timeout before the call may be sent
// (Engine::AdvanceBeforeCall): store latency and the time from
// the renewal to the send. A lease shorter than timeout + margin is refused by configuration.
inline constexpr std::chrono::milliseconds kDefaultLeaseMargin{2'000};

// The longest a request may wait for a running duplicate (Prefer: wait, capped by configuration
// at no more than this): a parked request holds a connection and memory.
inline constexpr std::chrono::milliseconds kWaitMax{300'000};
// Requests parked by Prefer: wait: at most this many per principal (so one principal's waiters
// cannot fill the room meant for everyone's), and at most this many in all on one server. Parked
// requests hold no thread, only a connection and memory; configuration may raise either up to
// kParkedCeiling.
inline constexpr int64_t kMaxWaitersPerPrincipal = 100;
inline constexpr int64_t kMaxParked = 1024;
inline constexpr int64_t kParkedCeiling = 100'000;

// A sweep deletes expired records in batches of this many, so it never holds the write lock for
// long; SweepExpired's rounds run at most this many batches unless told otherwise (idemd's and
// `idemctl sweep`'s are unbounded).
inline constexpr int kSweepBatch = 500;
inline constexpr int kSweepBatchesPerRound = 20;
// idemd's sweeper rests this many times as long as each batch took before the next (SweepPacing):
// at most a third of the store's time, whatever the backlog, and a round goes on until it has
// caught up; `idemctl sweep` does not rest.
inline constexpr int64_t kSweepRestPerWork = 2;

}  // namespace idem::limits
