// include/idem/inbox.h — a queue consumer's inbox: each message processed exactly once, on the
// store the consumer's handler already writes to (docs/inbox.md).
//
// Brokers deliver at least once. An Inbox turns each message into an operation of the engine,
// keyed by the message's business key and fingerprinted by its payload, so a redelivery, or a
// copy the producer published again, is recognised and answered with the first execution's kept
// result instead of being run again. Three ways to run a handler:
//
//   Process           the handler's only effects are writes to the store's database: the claim,
//                     the writes and the finish commit in ONE transaction (Engine::ExecuteInTxn),
//                     so a crash or an error anywhere leaves nothing and the redelivery runs it
//                     afresh.
//   ProcessBatch      the same for several messages in one transaction, one commit.
//   ProcessWithCalls  the handler also calls something that is not transactional (an HTTP API):
//                     the claim commits first, each call is preceded by a covered advance
//                     (Engine::AdvanceBeforeCall) and carries a stable downstream key, and the
//                     finish commits the handler's last writes with the record (Engine::Finish).
//
// Records live under the scope (tenant, consumer group, "inbox.<name>", message key). Use one
// mode per consumer name: a record Process took over from ProcessWithCalls would not ask the
// downstream what an earlier call did.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/engine.h"

namespace idem {

// What one consumer of a queue is. Value type; InboxPolicy::For fills in the defaults.
struct InboxPolicy {
  // The principal of the records: tenant and the consumer group (its user). Two groups that
  // consume the same queue each process every message once.
  std::string tenant = "inbox";
  std::string group;
  // The consumer's name: its records are on the route "inbox.<name>" (at most
  // limits::kRouteMaxLength in all).
  std::string name;
  // How long a claim of ProcessWithCalls holds a message before another consumer may take it
  // over (each BeforeCall and Renew extends it by this much). Process and ProcessBatch hold no
  // lease beyond their transaction.
  Millis lease{limits::kDefaultLease};
  // How long a processed message's key is recognised. Must cover every delivery the broker can
  // still make of it (its redelivery horizon: attempts x redelivery delay, and any copy the
  // producer may publish later); a copy that comes later runs again.
  Millis retention{limits::kDefaultRetention};
  // What a message key may be: by default 1 to limits::kKeyMaxLength printable ASCII characters
  // other than space (BusinessKeyPolicy).
  KeyPolicy key_policy = BusinessKeyPolicy();
  // How a payload is fingerprinted, exactly as an HTTP body of a route: JSON canonicalised under
  // these rules (so {"a":1,"b":2} and {"b":2,"a":1} are one payload); set rules.opaque_body for a
  // payload of bytes, which counts exactly as it came. Its size limit is rules.max_bytes.
  CanonicalRules rules;
  // The largest result a handler may keep, encoded (limits::kSealedResponseCeiling at most).
  std::size_t max_result_bytes = limits::kSealedResponseMaxBytes;
  // Per consumer group: messages PROCESSING at once (ProcessWithCalls) and records retained.
  int64_t max_processing = limits::kMaxProcessingPerPrincipal;
  int64_t max_retained = limits::kMaxRetainedPerPrincipal;

  static InboxPolicy For(std::string group, std::string name);
  static KeyPolicy BusinessKeyPolicy();
};

// One delivery of a message. The key is a business key the producer puts in the message (an
// order id): the same on every copy of the message, and only on copies of it.
struct InboxMessage {
  std::string key;
  std::string payload;
  // Only its media type counts in the fingerprint (MediaTypeOf).
  std::string content_type = "application/json";

  static InboxMessage Keyed(std::string key, std::string payload,
                            std::string content_type = "application/json");
  // The key from a header (or a field) of the message: its value as it is. Errors:
  // kInvalidArgument when the header is absent (nullopt) or empty.
  static Result<InboxMessage> KeyedByHeader(std::optional<std::string_view> value,
                                            std::string payload,
                                            std::string content_type = "application/json");
  // The key from a member of the JSON payload, by JSON pointer (RFC 6901, "/order/id"): a string
  // as it is, an integer as its decimal digits. Errors: kInvalidArgument when the payload is not
  // JSON, or the member is absent, or is neither a string nor an integer.
  static Result<InboxMessage> KeyedByJson(std::string payload, std::string_view pointer,
                                          std::string content_type = "application/json");
  // The broker's id of the delivery (a stream entry id, an AMQP message-id) as the key: only when
  // the message has no business key. A copy the producer publishes again gets a new id from most
  // brokers, and then runs again.
  static InboxMessage KeyedByBrokerId(std::string broker_id, std::string payload,
                                      std::string content_type = "application/json");
};

// What became of one message. Acknowledge() says what to tell the broker.
struct InboxOutcome {
  enum class Kind : uint8_t {
    // The handler ran now and its writes and result committed: acknowledge.
    kExecuted,
    // Processed before (a redelivery, or a copy): the handler did not run, `result` is what the
    // first execution kept. Not an error: acknowledge.
    kDuplicate,
    // The key was processed before with another payload (the first one's record holds it): not
    // run. Quarantine it (a dead-letter queue) — no delivery of it will ever run.
    kMismatch,
    // The message can never be processed as it is (its key or payload is malformed or over a
    // limit): not run; quarantine it. `error` says why.
    kInvalid,
    // Another consumer is running it now (ProcessWithCalls, under a live lease): keep the message
    // or let the broker deliver it again after retry_after; the copy is then a duplicate, or is
    // taken over if that consumer died.
    kInProgress,
    // Not processed (the handler failed, the store is unavailable, the result is too large, or
    // its lease was lost): nothing it wrote in the store committed. Let the broker redeliver it.
    kFailed,
  };
  Kind kind = Kind::kFailed;
  std::string key;             // the message's key (InboxMessage::key)
  std::string result;          // kExecuted, kDuplicate: the kept result
  std::optional<Error> error;  // kMismatch, kInvalid, kFailed: why
  Millis retry_after{0};       // kInProgress: when to look again, at the earliest
  // kExecuted: the record was resumed from an earlier attempt (a takeover of an expired lease).
  bool resumed = false;
  // kExecuted, kDuplicate, kInProgress: until when the key is recognised.
  Timestamp key_expires{};

  // Whether the broker may forget the message: executed or duplicate.
  bool Acknowledge() const { return kind == Kind::kExecuted || kind == Kind::kDuplicate; }
};

// "executed", "duplicate", "mismatch", "invalid", "in_progress", "failed": for logs and metrics.
std::string_view InboxOutcomeName(InboxOutcome::Kind kind);

// A handler's way into the transaction that commits with its message's record: business writes
// and reads on the store's database. Used by one thread, for the length of one handler call.
class InboxTxn {
 public:
  InboxTxn(StoreTxn& txn, const InboxMessage& message, const std::string& key, bool resumed)
      : txn_(txn), message_(message), key_(key), resumed_(resumed) {}

  // StoreTxn::Exec: one statement with '?' placeholders. Errors as StoreTxn::Exec's
  // (kAlreadyExists on a unique violation; the transaction goes on).
  Result<std::vector<SqlRow>> Exec(std::string_view sql, const std::vector<SqlValue>& params = {}) {
    return txn_.Exec(sql, params);
  }
  const InboxMessage& Message() const { return message_; }
  // The message key as the record holds it.
  const std::string& Key() const { return key_; }
  // Whether the record was taken over from an earlier attempt whose lease expired.
  bool Resumed() const { return resumed_; }

 private:
  StoreTxn& txn_;
  const InboxMessage& message_;
  const std::string& key_;
  bool resumed_;
};

// A handler of Process and ProcessBatch: does its business writes through `txn` and returns the
// result to keep (a duplicate is answered with it), or an error, which rolls everything back.
// It must have no effect outside `txn`: it runs again on the redelivery after a crash or an
// error, and, in a batch that falls back, once more in the message's own transaction.
using InboxHandler = std::function<Result<std::string>(InboxTxn& txn)>;

// What a handler of ProcessWithCalls works with: its claim, its calls' keys and recovery points,
// and the writes of the finishing transaction. Used by one thread, for one handler call.
class InboxCall {
 public:
  InboxCall(Engine& engine, Ticket& ticket, const InboxMessage& message, const std::string& key)
      : engine_(engine), ticket_(ticket), message_(message), key_(key) {}

  const InboxMessage& Message() const { return message_; }
  const std::string& Key() const { return key_; }
  // Whether an earlier attempt held this message and lost it (its consumer died or gave up with
  // an unknown outcome): a call it made may have happened. Ask the downstream (by DownstreamKey)
  // before calling again.
  bool Resumed() const { return ticket_.resumed; }
  // The last step an attempt reached with BeforeCall ("" before any): after a resume, the calls
  // up to this step may have happened.
  const std::string& RecoveryPoint() const { return ticket_.record.recovery_point; }

  // Before the call of `step` (e.g. "charge"; at most limits::kRecoveryPointMaxLength, not
  // "done"), made at most `must_cover` from now (its timeout plus a margin, e.g.
  // limits::kDefaultLeaseMargin): records `step` as the recovery point and renews the lease so
  // that it covers the call, in one transaction (Engine::AdvanceBeforeCall). Do not call when
  // this fails. Errors: kConflict (the policy's lease is shorter than must_cover: no renewal
  // covers the call); kFenced (the lease was lost: another consumer took the message over);
  // kInvalidArgument (a bad step name); kUnavailable.
  Status BeforeCall(std::string_view step, Millis must_cover);
  // The idempotency key to send the downstream with the call of `step`: 64 hex digits, the same
  // on every attempt of this message's operation (redeliveries and takeovers, in any process),
  // different for every step and every operation (a message whose record expired and runs anew
  // gets new ones), and not derivable from the message key.
  std::string DownstreamKey(std::string_view step) const;
  // Extends the lease by the policy's lease, for a handler that works long between calls.
  // Errors: kFenced; kUnavailable.
  Status Renew();
  // Adds business writes to the transaction that finishes the record, run in the order added
  // after its fenced finish: they commit with the result, or not at all (a lost lease rolls them
  // back).
  void AtFinish(std::function<Status(InboxTxn& txn)> writes) {
    at_finish_.push_back(std::move(writes));
  }

 private:
  friend class Inbox;
  Engine& engine_;
  Ticket& ticket_;
  const InboxMessage& message_;
  const std::string& key_;
  std::vector<std::function<Status(InboxTxn&)>> at_finish_;
};

// A handler of ProcessWithCalls: returns the result to keep, or an error when it cannot finish.
// An error leaves the record PROCESSING at its recovery point with its lease released, so the
// next delivery takes it over at once (resumed), and must ask the downstream what the calls past
// RecoveryPoint() did.
using InboxCallHandler = std::function<Result<std::string>(InboxCall& call)>;

// A consumer's inbox over an Engine. Borrows the engine, which must outlive it. Immutable once
// made; thread-safe as the engine is (many threads may process at once). No message content can
// make it abort: limits on keys, payloads and results are the engine's, reported as kInvalid or
// kFailed.
class Inbox {
 public:
  // Errors: kInvalidArgument for a policy that cannot make records: group or name empty, too
  // long or containing 0x1f, a key policy without a minimum of 1, a lease that is not positive, a
  // retention not longer than the lease, or max_result_bytes over limits::kSealedResponseCeiling.
  static Result<Inbox> Create(Engine& engine, const InboxPolicy& policy);

  // Processes `message` with `handler` in one transaction (the claim, the handler's writes and
  // the finish with its result): executed, duplicate, mismatch, invalid, in progress (a
  // ProcessWithCalls of the same consumer runs it) or failed (the handler's error, or the
  // store's; nothing committed).
  InboxOutcome Process(const InboxMessage& message, const InboxHandler& handler) const;

  // Processes `messages` in one transaction, one commit: each new one runs `handler`, each one
  // processed before — also a second copy of a key earlier in the same batch — is a duplicate
  // and does not run, a key met with another payload is a mismatch, a malformed one invalid.
  // If a handler fails (or the quota, the store or the commit does), the batch is rolled back
  // and each message is processed again in a transaction of its own (Process), so one bad
  // message does not hold the others back: their handlers then run a second time, which is why a
  // handler must have no effect outside its transaction. Returns one outcome per message, in
  // their order.
  std::vector<InboxOutcome> ProcessBatch(std::span<const InboxMessage> messages,
                                         const InboxHandler& handler) const;

  // Processes `message` with a handler that calls out. The claim commits first (Engine::Start;
  // the operation's downstream keys are fixed in it), the handler runs under its lease, calling
  // BeforeCall before each call, and its result and AtFinish writes commit with the finish
  // (Engine::Finish). A handler error leaves the record to the next delivery (Engine::Release)
  // and is reported kFailed, as is a lost lease (kFenced: the finish and its writes rolled back;
  // the consumer that took it over finishes it).
  InboxOutcome ProcessWithCalls(const InboxMessage& message, const InboxCallHandler& handler) const;

  // The record of `key` as Engine::Lookup finds it (an operator's question, or a consumer asking
  // about a message it quarantined). Errors: as Engine::Lookup's.
  Result<std::optional<FoundRecord>> Lookup(std::string_view key) const;

  // The route the inbox's records are on, as the engine is given it (for Engine::ListStale, an
  // operator's tools).
  const RoutePolicy& policy() const { return route_; }

 private:
  Inbox(Engine& engine, RoutePolicy route, Principal principal)
      : engine_(&engine), route_(std::move(route)), principal_(std::move(principal)) {}

  // The engine's request for `message`; `key_header` holds the bytes its key_header views.
  Request RequestOf(const InboxMessage& message, std::string& key_header) const;

  Engine* engine_;
  RoutePolicy route_;
  Principal principal_;
};

}  // namespace idem
