// include/idem/engine.h — the idempotency protocol over a Store: key → scope → fingerprint →
// claim or decide → execute → finish in the business transaction.
//
// The engine knows nothing of HTTP. idemd's idempotency filter, the queue consumer and the gateway
// mode drive the same engine with their own route policies.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/canonical.h"
#include "idem/clock.h"
#include "idem/fingerprint.h"
#include "idem/inflight.h"
#include "idem/key.h"
#include "idem/limits.h"
#include "idem/record.h"
#include "idem/result.h"
#include "idem/seal.h"
#include "idem/store.h"

namespace idem {

// Everything the protocol needs to know about one route. Value type.
struct RoutePolicy {
  std::string route;  // the route id in the scope, e.g. "payments.create"
  KeyPolicy key_policy;
  CanonicalRules rules;  // current rules; new records use rules.version
  // Rules of earlier versions still present in stored records (rotation of the rule set).
  std::vector<CanonicalRules> previous_rules;
  Millis lease{limits::kDefaultLease};
  Millis retention{limits::kDefaultRetention};
  // Quotas per principal: records PROCESSING at once, and records retained.
  int64_t max_processing = limits::kMaxProcessingPerPrincipal;
  int64_t max_retained = limits::kMaxRetainedPerPrincipal;
  // The Retry-After suggested to a duplicate that meets a running execution, at most.
  Millis retry_after{limits::kDefaultRetryAfter};
  // The recovery points past a call that cannot be called back: the points this route gives
  // AdvanceBeforeCall (e.g. "charge_sent"). A retryable failure at one of them proves nothing
  // about that call (a 5xx, or a transport error after the request left, may come after the
  // downstream acted), so ListStale hands such records to the takeover loop once their lease, which
  // covered the call, has run out; it resolves them like an expired PROCESSING record, by asking
  // the downstream. A retryable failure at any other point is left to the client's retry. At
  // most limits::kMaxSentPoints, none empty.
  std::vector<std::string> sent_points;
  // The largest stored answer of a finished record (encoded: status, headers and body), in
  // bytes; at most limits::kSealedResponseCeiling and the sealer's own cap. Finish refuses a
  // larger one with kTooLarge.
  std::size_t max_response_bytes = limits::kSealedResponseMaxBytes;
};

// Who is asking: from authentication, never from the request.
struct Principal {
  std::string tenant;
  std::string user;
};

struct Request {
  Principal principal;
  std::optional<std::string_view> key_header;  // nullopt when the header is absent
  std::string_view method;
  std::string_view content_type;  // as sent: only its media type is fingerprinted (MediaTypeOf)
  std::string_view api_version;
  std::string_view body;
  std::string_view target = {};  // RequestFacts::target: "" where the route fixes the path
  // Engine::Canonical of this request under the policy it is given with, when the caller has made
  // it already (idemd's filter makes it once, before judging the body): the engine's every step
  // uses it instead of making it again. Null: the engine makes it where it needs it.
  const CanonicalRequest* canonical = nullptr;
};

// The right to execute one claimed operation, and what the claim saw.
struct Ticket {
  ScopeHash scope{};
  Lease lease;
  Record record;         // the record right after the claim (recovery point, resource id)
  bool resumed = false;  // true after a takeover or a retry: a downstream call may have happened
  // The state the record was resumed from: PROCESSING (a takeover of an expired or released
  // lease) or FAILED_RETRYABLE (a retry, or the takeover loop settling a retryable failure past the
  // send, whose lease covered the call and has ended). PROCESSING when not resumed. A takeover
  // that raced the owner's own finish may report PROCESSING for a record that had just failed
  // retryably, never the other way round.
  RecordState resumed_from = RecordState::kProcessing;
  // The in-flight marker this request placed, if any (never after TakeOver): Finish and Release
  // remove it with this token, and nothing else removes it.
  std::optional<MarkerToken> marker;
  // How long each renewal extends the lease (AdvanceBeforeCall, Heartbeat): the route's lease
  // when the ticket was issued. Set by the engine.
  Millis lease_ttl{0};
  // The route's RoutePolicy::max_response_bytes when the ticket was issued. Set by the engine.
  std::size_t max_response_bytes = limits::kSealedResponseMaxBytes;
  // The route's RoutePolicy::retention when the ticket was issued (Outcome::retention). Set by
  // the engine.
  Millis retention{0};
  // A moment inside the claim's transaction, by the caller's monotonic clock, no later than the
  // claim hook's first statement and the read back (so no later than the store reckoned
  // record.observed_at): set by the caller (idemd's filter takes it as its hook starts), never
  // by the engine; left unset, nothing uses it. An operation whose claim hook advanced the record
  // past an external call (StoreTxn::AdvanceCovered) counts the time left to send from here;
  // Engine::Finish hands the finished record to the store's cache as read at this moment.
  SteadyTime claim_began{};
};

struct Decision {
  enum class Kind {
    kExecute,     // the caller runs the operation and calls Finish (ticket is set)
    kReplay,      // a finished outcome; answer `response` again (marked as a replay)
    kInProgress,  // another executor holds a live lease; answer 409/202 with retry_after
  };
  Kind kind = Kind::kExecute;
  std::string key;          // the parsed key
  Ticket ticket;            // kExecute
  StoredResponse response;  // kReplay
  Record record;            // every kind: the record as decided on
  Millis retry_after{0};    // kInProgress
  Timestamp key_expires{};  // until when a retry with this key is recognised
};

// A record as Engine::Lookup found it, with its stored answer opened.
struct FoundRecord {
  std::string key;  // the parsed key when looked up by key; empty when looked up by scope hash
  Record record;
  // The record's expiry has passed by the store's clock: the key is no longer recognised (the
  // next request with it starts a new operation) and its answer is never given again.
  bool expired = false;
  // The stored answer, opened with the scope that was looked up: set when the record is finished
  // (SUCCEEDED or FAILED_FINAL) and not expired.
  std::optional<StoredResponse> response;
  // Set when the record is PROCESSING under a live lease by the store's clock (Start would answer
  // kInProgress): how long the lease still lasts, 0 when it ends this millisecond.
  std::optional<Millis> lease_left;
};

// Business writes that join a record transaction. Returning an error rolls the transaction back;
// so does throwing, which the engine reports as kInternal. A claim hook runs on every claim that
// wins the right to execute, resumes included: record.resource_id tells whether an earlier
// attempt already fixed the operation's ids.
using TxnHook = std::function<Status(StoreTxn& txn, const Record& record)>;

// The operation of requests[index] in Engine::ExecuteInTxn: runs inside the transaction that has
// just claimed its record (`ticket`: the claim; resumed after a takeover of an expired lease or a
// retry) and returns the answer to keep. Its business writes go through `txn`, and commit only
// with the record's finish. Returning an error rolls the whole transaction back; so does throwing,
// which the engine reports as kInternal. It must have no effect outside `txn`: an operation that
// calls out uses Start, AdvanceBeforeCall and Finish instead.
using TxnOperation =
    std::function<Result<StoredResponse>(std::size_t index, StoreTxn& txn, const Ticket& ticket)>;

// Runs the protocol. Borrows everything it is given; all of it must outlive the engine.
// Thread-safe: one engine serves all requests.
class Engine {
 public:
  // `markers` (optional, nullptr for none) turn obvious concurrent duplicates away before the
  // database; see include/idem/inflight.h.
  Engine(Store& store, const Fingerprinter& fingerprinter, const Sealer& sealer, Clock& clock,
         InFlightMarkers* markers = nullptr);

  // The request as its fingerprint covers it: the body canonicalised under policy.rules
  // (MakeCanonicalRequest). Errors: those of MakeCanonicalRequest, which Start returns for the
  // request after any error of its key.
  static Result<CanonicalRequest> Canonical(const RoutePolicy& policy, const Request& request);

  // Steps 1–4 and 13: parses the key, fingerprints the request, and claims or decides.
  // `on_claim` runs inside the claim transaction when this call wins the right to execute (fix
  // ids, insert pending business rows, Advance the recovery point).
  // Errors: kInvalidArgument (key missing or malformed, body invalid), kTooLarge (body),
  // kFingerprintMismatch (the key was used for a different request), kResourceExhausted
  // (quota), kUnavailable (store), kDataLoss (a stored record or response failed to verify).
  // With kFingerprintMismatch, and only then, *mismatch_expires (when not null) is set to the
  // expiry of the record that holds the key, which a caller may tell the client; every other
  // outcome leaves it untouched.
  // Start begins with a snapshot read, which answers a finished record, and a duplicate of one a
  // live lease holds ("in progress"), without the claim's write transaction; `read_first` = false
  // leaves it out, for a caller that has just made it (ReplayFromStore decided nothing).
  Result<Decision> Start(const RoutePolicy& policy, const Request& request,
                         const TxnHook& on_claim = {}, Timestamp* mismatch_expires = nullptr,
                         bool read_first = true);

  // Start's snapshot read alone: the replay of a finished, unexpired record, kInProgress for a
  // PROCESSING record under a live lease (by the store's clock), or the error Start would return
  // for either (a mismatch); nullopt when the record is not there or the claim must decide (then
  // Start decides, read_first = false). No write transaction: a caller can run it where claims do
  // not queue, so neither a replay nor a duplicate of a running operation waits behind
  // executions. Errors: as Start's.
  Result<std::optional<Decision>> ReplayFromStore(const RoutePolicy& policy, const Request& request,
                                                  Timestamp* mismatch_expires = nullptr);

  // Start's answer for a request whose record is finished and held in memory by the store's
  // cache (Store::ReadCached): the replay, or the error Start would return for it (a mismatch),
  // decided without blocking — no store I/O, so a caller that must not block may call it.
  // nullopt when the cache holds nothing for it: then Start decides. Errors: as Start's.
  Result<std::optional<Decision>> ReplayFromMemory(const RoutePolicy& policy,
                                                   const Request& request,
                                                   Timestamp* mismatch_expires = nullptr);

  // Steps 1–7 for operations whose every effect is a write to the store's own database (a queue
  // consumer's handler; libidem's Inbox, include/idem/inbox.h): each request is decided as Start
  // decides it (snapshot read first; a mismatch, a replay, in progress), and each that wins its
  // claim runs `operation` and is finished in ONE transaction with the claims of all the others,
  // one commit for all of them. The claim, the business writes and the finish commit together or
  // not at all: after a crash or an error before the commit nothing is left — no record, no
  // business row — and the next attempt executes afresh. A record claimed here is never seen
  // PROCESSING by anyone else. A finished answer is SUCCEEDED for a 2xx status, FAILED_FINAL
  // otherwise, at the point "done", sealed for its scope. Requests are claimed in the order of
  // their scope hashes (two such transactions over the same keys lock them in one order); of two
  // requests with one key, the first given executes and the second meets its record in this
  // transaction: a replay of it, or a mismatch. The quota is counted last, once per principal.
  // No in-flight markers are placed. Returns, in the order of `requests`, each one's decision:
  // kExecute (executed and finished by this call; `response` is the answer kept, `ticket` the
  // claim, whose lease the finish ended), kReplay, kInProgress, or its own error (kInvalidArgument
  // or kTooLarge for its key or body; kFingerprintMismatch; kDataLoss) — given only once the
  // transaction committed. Errors of the whole call, after which nothing was committed: the
  // first error an operation returned; kTooLarge (an answer over policy.max_response_bytes);
  // kInvalidArgument (an answer's status outside 200..599); kResourceExhausted (quota);
  // kUnavailable (store); and from the commit kDeadlineExceeded, the outcome unknown (look the
  // records up, or run the requests again: they are then replays).
  Result<std::vector<Result<Decision>>> ExecuteInTxn(const RoutePolicy& policy,
                                                     std::span<const Request> requests,
                                                     const TxnOperation& operation);

  // Step 10's read side, outside any transaction (a snapshot read): the record of `key` on
  // `policy.route` for `principal`, and its stored answer opened and decoded. `key` is parsed as
  // Start parses the Idempotency-Key header, under policy.key_policy. This and Start are the only
  // places that open a stored answer, and both open it with the scope hash computed from the
  // request, never with the scope a store returned. Returns nullopt when there is no record.
  // Errors: kInvalidArgument (key malformed, or a scope part empty or too long); kUnavailable
  // (store); kDataLoss (the record failed to decode, or its stored answer failed to open or
  // decode: altered bytes, a response sealed for another scope, a seal key no longer configured).
  Result<std::optional<FoundRecord>> Lookup(const Principal& principal, const RoutePolicy& policy,
                                            std::string_view key);
  // The same for a scope hash the caller already holds (a ticket's, a stale record's).
  // Errors: kUnavailable, kDataLoss as above.
  Result<std::optional<FoundRecord>> Lookup(const ScopeHash& scope);

  // Up to `limit` records of `policy.route` for the takeover loop's TakeOver, oldest lease first:
  // PROCESSING records whose lease has expired (executions that crashed, stalled or released
  // with an unknown outcome) and FAILED_RETRYABLE records at one of policy.sent_points whose
  // lease has expired (Store::ListStale). Errors: kInvalidArgument (policy.sent_points too many,
  // or an empty one); kUnavailable (store); kDataLoss (a record failed to decode).
  Result<std::vector<Record>> ListStale(const RoutePolicy& policy, int limit);

  // Step 6: records progress before a side effect (e.g. "charge_sent"), in its own transaction
  // with optional business writes. Errors: kFenced if the lease was lost.
  Status Advance(const Ticket& ticket, std::string_view point, std::string_view resource_id = {},
                 const TxnHook& business = {});

  // Step 6 before an external call that cannot be called back (e.g. "charge_sent" before the
  // provider charge): in one transaction, renews the lease to now + ticket.lease_ttl and records
  // `point`, only if the renewed lease covers the whole call — lease_until >= now + must_cover,
  // checked inside the fenced UPDATE (StoreTxn::AdvanceCovered). `must_cover` is the call's
  // timeout plus a margin for store latency and the time to the send. So no executor sends under a
  // lease that could end, and be taken over, while its call is still out. On success ticket.lease
  // is the renewed lease; on any error nothing was written and the caller must not call out.
  // Errors: kFenced (the lease was lost to a takeover: stop); kConflict (the lease is still held
  // but ticket.lease_ttl is shorter than must_cover, so no renewal can cover this call: give
  // up, e.g. Release, and configure a longer lease); kInvalidArgument (point too long);
  // kUnavailable (store).
  Status AdvanceBeforeCall(Ticket& ticket, std::string_view point, Millis must_cover);

  // Extends the ticket's lease to now + policy.lease. Errors: kFenced; kUnavailable.
  Status Renew(const RoutePolicy& policy, Ticket& ticket);
  // Extends the ticket's lease to now + ticket.lease_ttl (what a Heartbeat does).
  // Errors: kFenced; kUnavailable.
  Status Renew(Ticket& ticket);

  // Gives the lease up, leaving the record PROCESSING at its recovery point: used when the
  // outcome is unknown. By default the lease ends now, so the next attempt (or the takeover loop)
  // takes over at once; with `hold`, it ends `hold` from now, and until then every attempt is
  // answered in progress (Start, Lookup's lease_left) while nobody works on it — for an
  // operation that must not run again before then, such as a send whose outcome is still
  // settling. Removes the ticket's in-flight marker. Errors: kFenced.
  Status Release(Ticket& ticket, Millis hold = Millis(0));

  // Takes over a record found by ListStale (the takeover loop's claim): an expired PROCESSING one,
  // or a retryable failure past the send. The ticket is resumed, resumed_from the listed state.
  // Errors: kConflict if someone else took it first; kUnavailable.
  Result<Ticket> TakeOver(const RoutePolicy& policy, const Record& stale);

  // Step 7: finishes the operation with `state` and `response` (sealed before it is stored), in
  // one transaction with `business`, then removes the ticket's in-flight marker. A finished
  // record's recovery point becomes "done"; a FAILED_RETRYABLE one keeps its point unless
  // `recovery_point` names the point the next attempt resumes from (e.g. one before the send,
  // once a lookup proved the call had no effect, so the takeover loop stops listing it). A
  // FAILED_FINAL record finished at kOutcomeUnknownPoint is a held outcome, which an operator
  // settles (Settle).
  // Errors: kFenced (lost the lease; nothing was written, the business writes included),
  // kTooLarge (a replayable response over ticket.max_response_bytes or the sealer's cap; nothing
  // was written: finish again with an answer that fits), kInvalidArgument (recovery_point given
  // with a final state other than a held outcome, or too long), kUnavailable.
  Status Finish(const Ticket& ticket, RecordState state, const StoredResponse& response,
                const TxnHook& business = {}, std::string_view recovery_point = {});

  // An operator's settlement of the held outcome `scope` (include/idem/record.h): `answer` when
  // its operation executed — sealed for the scope and replayed from then on, SUCCEEDED for a 2xx
  // and FAILED_FINAL otherwise, at kOperatorSettledPoint — or nullopt when it did not: the record
  // becomes FAILED_RETRYABLE at the point of a fresh claim, and the next request with its key
  // executes, under the ids the operation fixed (its resource id is kept). One transaction,
  // conditional on the record being what this call read. Returns the record as settled.
  // Errors: kNotFound (no record, or expired); kConflict (not a held outcome, or settled
  // meanwhile); kInvalidArgument (a status outside 200..599); kTooLarge (an answer over
  // limits::kSealedResponseCeiling); kUnavailable.
  Result<Record> Settle(const ScopeHash& scope, const std::optional<StoredResponse>& answer);

 private:
  Result<Decision> DecideExisting(const RoutePolicy& policy, const Request& request,
                                  Decision decision, const CanonicalRequest& canonical);
  // decision.record's stored answer, opened with `scope` (the hash of the request's scope).
  Result<Decision> Replay(const ScopeHash& scope, Decision decision) const;
  // Decrypts and decodes the stored answer of finished `record` with the requested `scope`.
  Result<StoredResponse> OpenAnswer(const ScopeHash& scope, const Record& record) const;
  Status CheckQuota(const RoutePolicy& policy, StoreTxn& txn, const Principal& who);
  // Extends the ticket's lease to now + ttl in its own transaction.
  Status RenewFor(Ticket& ticket, Millis ttl);
  // The answer for a request whose claim found `record` deciding it (ClaimIn): `refused` when
  // set, else the replay of finished `record` or kInProgress. Only once the transaction that read
  // it has committed.
  Result<Decision> Unclaimed(const RoutePolicy& policy, const ScopeHash& scope, Decision decision,
                             Record record, std::optional<Error> refused) const;
  Result<Decision> ClaimInTxn(const RoutePolicy& policy, const Request& request,
                              const ClaimSpec& spec, const CanonicalRequest& canonical,
                              Decision decision, const TxnHook& on_claim,
                              Timestamp* mismatch_expires);

  // Removes the marker `token` placed, if any.
  void ReleaseMarker(const ScopeHash& scope, const std::optional<MarkerToken>& token);
  // ReplayFromMemory and ReplayFromStore: the record `read` returns for the request's scope,
  // answered (AnswerRead) if a read decides it and the request is the same.
  // A replay of `seen` when it is finished, else kInProgress; kFingerprintMismatch when `seen`
  // holds its key for another request. `decision` carries the parsed key.
  Result<Decision> AnswerRead(const RoutePolicy& policy, const Request& request,
                              const CanonicalRequest& canonical, const ScopeHash& scope,
                              Decision decision, Record seen, Timestamp* mismatch_expires);
  Result<std::optional<Decision>> ReplayOf(
      const RoutePolicy& policy, const Request& request, Timestamp* mismatch_expires,
      const std::function<Result<std::optional<Record>>(const ScopeHash&)>& read);

  Store& store_;
  const Fingerprinter& fingerprinter_;
  const Sealer& sealer_;
  Clock& clock_;
  InFlightMarkers* markers_;  // may be null
};

}  // namespace idem
