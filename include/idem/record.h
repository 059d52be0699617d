// include/idem/record.h — the idempotency record, its state machine, leases and stored responses.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/fingerprint.h"
#include "idem/key.h"
#include "idem/result.h"

namespace idem {

// PROCESSING → SUCCEEDED | FAILED_FINAL | FAILED_RETRYABLE. A FAILED_RETRYABLE record, a
// PROCESSING record whose lease expired, and any record past its expiry may be claimed again
// (PROCESSING, fence + 1). SUCCEEDED and FAILED_FINAL are replayed until they expire — except a
// held outcome (kOutcomeUnknownPoint), which an operator settles once (StoreTxn::Settle).
enum class RecordState : uint8_t {
  kProcessing = 1,
  kSucceeded = 2,
  kFailedFinal = 3,
  kFailedRetryable = 4,
};

// "PROCESSING", "SUCCEEDED", "FAILED_FINAL", "FAILED_RETRYABLE": the stored spelling.
std::string_view RecordStateName(RecordState state);
// Errors: kDataLoss for a spelling that is none of the four (the store holds something foreign).
Result<RecordState> ParseRecordState(std::string_view name);
// Whether a finished outcome is replayed as it is (SUCCEEDED, FAILED_FINAL).
bool IsReplayable(RecordState state);

// The recovery point of a held outcome: a FAILED_FINAL record whose service could not learn
// whether its operation executed, and would not try it again (a gateway route whose upstream can
// neither be asked nor deduplicates). It is replayed as stored (a 502 naming the unknown outcome)
// but never from a cache, is listed by Store::ListHeld, and is settled once by an operator
// (Engine::Settle): executed, with the answer to store, which then holds kOperatorSettledPoint;
// or not executed, which makes it FAILED_RETRYABLE at the point of a fresh claim ("").
inline constexpr std::string_view kOutcomeUnknownPoint = "outcome_unknown";
inline constexpr std::string_view kOperatorSettledPoint = "operator_settled";

using OwnerToken = std::array<uint8_t, 16>;

// The right to execute a claimed record: whoever holds the record's current owner token and fence.
// A takeover bumps the fence, so every write of the previous holder matches nothing.
struct Lease {
  OwnerToken owner{};
  int64_t fence = 0;
  Timestamp until{};
};

// One row of the records table (see docs/design.md for every column).
struct Record {
  ScopeHash scope{};
  std::string tenant;
  std::string user;
  std::string route;
  Fingerprint fingerprint;
  RecordState state = RecordState::kProcessing;
  std::string recovery_point;  // advanced by the business code: "claimed", "charge_sent", ...
  std::string resource_id;     // fixed in the claim transaction (the payment id)
  int status_code = 0;         // once finished
  std::string response;        // sealed StoredResponse bytes, once finished
  Lease lease;
  Timestamp created_at{};
  Timestamp updated_at{};
  Timestamp expires_at{};
  // When the record last advanced to a point before an external call
  // (StoreTxn::AdvanceCovered): the last moment a request may have left. Zero before any. Unlike
  // updated_at, no renewal, release or takeover moves it: an unknown outcome settles from here.
  Timestamp sent_at{};
  // The store's clock when this copy was read: every time above is on the store's clock, and a
  // decision about them (is the lease live, has the record expired, has the send settled)
  // compares them with this, never with the reading instance's own clock, which may be skewed.
  // Not a column: each read sets it (on PostgreSQL, the database's time of the statement).
  Timestamp observed_at{};
};

// Whether a store may write a record in state `to` over `from`, the record as the writing
// transaction reads it, at `now` on the store's clock — a transition of the state machine:
//   PROCESSING → any state         a renewal, progress or a takeover (PROCESSING), or the finish;
//   FAILED_RETRYABLE → PROCESSING  a retry (StoreTxn::Reclaim);
//   any state → PROCESSING         once the record expired (expires_at <= now): a new operation;
//   a held outcome → not PROCESSING  an unexpired FAILED_FINAL at kOutcomeUnknownPoint, settled
//                                  once by an operator (StoreTxn::Settle).
// Nothing else: a finished record is otherwise replayed as it is until it expires. (A new record,
// which has no `from`, is PROCESSING: a claim.)
bool IsLegalTransition(const Record& from, RecordState to, Timestamp now);
// The last moment a request of `record` may have left: sent_at, or updated_at for a record
// advanced before sent_at existed (which is no earlier).
Timestamp LastSent(const Record& record);
// Has the last send of `record` settled? How long until it has — `window` after LastSent — by
// the store's clock when the record was read (observed_at), never by the reader's own; nothing
// once it has. A send settles when no executor can still be acting on it: the downstream's
// timeout and a margin for a late arrival (the gateway), or the provider's settle window.
std::optional<Millis> UntilSettled(const Record& record, Millis window);
// The key an operation sends its downstream, fixed in its first claim (kept as the record's
// resource id, so a resume keeps it): 64 hex digits, a SHA-256 of the scope and the claim's owner
// token, which no other claim holds. A record claimed afresh after it expired gets a new owner,
// hence a new key, and the downstream learns neither the token nor the client's key.
std::string OperationKeyOf(const Record& record);

// The answer replayed for a finished record: status, the headers that matter, the exact body.
struct StoredResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  bool operator==(const StoredResponse&) const = default;
};

// A compact length-prefixed encoding of StoredResponse (sealed before it is stored).
std::string EncodeResponse(const StoredResponse& response);
// Errors: kDataLoss for bytes that EncodeResponse did not make.
Result<StoredResponse> DecodeResponse(std::string_view bytes);

}  // namespace idem
