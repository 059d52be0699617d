// bench/loadgen/check.h — the exactly-once check of idem-bench: what every intent got back from
// idemd, held against the charges provider-sim made. No I/O here, so the check itself is unit
// tested (check_test.cc) and the same code runs after a load and under --check-only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/result.h"

namespace idem::bench {

// One business intent: a merchant order, sent under one Idempotency-Key (the same string) as
// often as the scenario repeats it, and a summary of every answer it got.
struct IntentRecord {
  std::string key;  // also the merchant order number
  uint32_t sent = 0;
  uint32_t answered = 0;    // with an HTTP status (not a transport error)
  uint32_t successes = 0;   // 200 and 201
  uint32_t executions = 0;  // successes not marked Idempotent-Replayed: true
  // The payment id of the first success, from its Location, which the body must agree with.
  std::string payment_id;
  // Ids other successes named instead, and successes whose body differed from the first's
  // (a replay is byte-identical) or did not name this order and payment.
  std::vector<std::string> other_payment_ids;
  uint32_t body_mismatches = 0;
  int last_status = 0;  // of the last answer; 0 when the last attempt got none

  // An answer the client may stop at: a success, or a final refusal (4xx other than 409/429).
  bool Final() const;
};

// The payment id of a 200/201 body, if it is a payment object for merchant order `order`;
// idem-bench holds it against the Location of the same answer.
std::optional<std::string> PaymentIdInBody(std::string_view body, std::string_view order);

// Charges by reference (idemd's payment id), as provider-sim's GET /admin/stats lists them.
using ChargeCounts = std::map<std::string, int64_t, std::less<>>;

// Errors: kInvalidArgument when `body` is not a stats object with charges_by_reference.
Result<ChargeCounts> ParseProviderStats(std::string_view body);

struct CheckResult {
  bool pass = false;
  uint64_t intents = 0;
  uint64_t succeeded = 0;   // intents with at least one 200/201
  uint64_t unresolved = 0;  // intents whose last answer was not final (no verdict from idemd)
  uint64_t charges_checked = 0;
  // Each way to break exactly-once, counted.
  uint64_t split_intents = 0;         // an intent answered with more than one payment id
  uint64_t shared_payment_ids = 0;    // one payment id answered to two intents
  uint64_t multiple_executions = 0;   // an intent with two non-replayed successes
  uint64_t body_mismatches = 0;       // successes of one intent that were not byte-identical
  uint64_t missing_charges = 0;       // a success with no charge at the provider
  uint64_t duplicate_charges = 0;     // a success whose payment was charged more than once
  uint64_t unexpected_charges = 0;    // charges (new since the run began) no success accounts for
  uint64_t replay_violations = 0;     // replay scenario: retries not answered as replays
  std::vector<std::string> failures;  // the first few, each naming its key or payment id
};

// `before`: the provider's charges when the run began (others' charges are not this run's);
// `after`: now. `replay_violations`: answers in the replay scenario that were not 200/201 with
// Idempotent-Replayed: true. The check passes when something succeeded and:
//   - every intent that got a 200/201 got one payment id, the same body on every success, and at
//     most one answer that was not a replay, and no two intents share a payment id;
//   - each of those payment ids has exactly one charge at the provider made since `before`;
//   - no other charge was made since `before` (so none for an intent without a success);
//   - replay_violations is 0.
CheckResult CheckExactlyOnce(const std::vector<IntentRecord>& intents, const ChargeCounts& before,
                             const ChargeCounts& after, uint64_t replay_violations);

// The --intents file: the provider's charges when the run began and every intent, so the check
// can be made again later (--check-only).
struct IntentsFile {
  ChargeCounts provider_before;
  uint64_t replay_violations = 0;
  std::vector<IntentRecord> intents;
};
std::string IntentsToJson(const IntentsFile& file);
// Errors: kInvalidArgument for text that is not such a file.
Result<IntentsFile> IntentsFromJson(std::string_view text);

}  // namespace idem::bench
