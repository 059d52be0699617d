// include/idem/store.h — the durable home of idempotency records.
//
// The API is transaction-shaped: a StoreTxn is one database transaction, and the caller's business
// writes (Exec) commit or roll back together with the record operations made through it. Every
// operation that needs a lease is conditional on the lease's owner token and fence, so a stale
// executor's transaction changes nothing — its business writes included.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "idem/clock.h"
#include "idem/limits.h"
#include "idem/record.h"
#include "idem/result.h"

namespace idem {

// A schema change of the application that shares the database (its business tables). Written in
// SQL both backends accept (TEXT, BIGINT, CHECK, UNIQUE) unless the app targets one backend.
struct Migration {
  int version = 0;  // 1, 2, ... applied in order, each once
  std::string sql;  // one or more statements
};

// How a SQL store treats its schema when it opens; every SQL backend's options include these.
// An application's own migrations, recorded under `name` (not "idem", and one per application):
// its versions are its own, applied in order, each once.
struct AppMigrations {
  std::string name;
  std::vector<Migration> migrations;
};

struct SchemaOptions {
  // false: use the database as it is — nothing is created and no migration runs; libidem's
  // schema is only checked (tools that read a service's store use this).
  bool apply_migrations = true;
  // The applications' own migrations, applied after libidem's, each under its name, in this
  // order (e.g. a service's tables, then a component's of its own).
  std::vector<AppMigrations> apps;
};

// What a backend can do; tests and callers branch on these, never on the backend's name.
struct StoreCapabilities {
  std::string name;                      // "sqlite", for logs
  bool shared_across_processes = false;  // several processes may open the same store
  bool durable = false;                  // records survive a restart of the process
  bool notifications = false;            // SubscribeFinished works, across processes
  // StoreTxn::Exec and Store::Query run the application's SQL on the records' database. False
  // for a store with no database (the in-memory model of testing/memory_store.h), which answers
  // both with kInvalidArgument.
  bool business_sql = true;
};

// What a claim writes for a new (or renewed-by-expiry) record.
struct ClaimSpec {
  ScopeHash scope{};
  std::string tenant;
  std::string user;
  std::string route;
  Fingerprint fingerprint;
  Millis lease_ttl{limits::kDefaultLease};
  Millis retention{limits::kDefaultRetention};
};

// How many records there are, for gauges (Store::Census).
struct RecordCensus {
  int64_t processing = 0;  // PROCESSING records
  // PROCESSING records by route id, routes without any left out: a route no process serves any
  // more (a gateway route removed or renamed) shows here, as nothing else resolves its records.
  std::map<std::string, int64_t> processing_by_route;
  int64_t failed_retryable = 0;  // FAILED_RETRYABLE records
  int64_t retained = 0;          // records in every state, not yet swept
  // The store's time now minus the created_at of the oldest PROCESSING record (when its
  // operation was first claimed: a takeover or a retry keeps it); nullopt when none is.
  std::optional<Millis> oldest_processing_age;
};

struct ClaimResult {
  // true: the record was inserted and the caller holds record.lease. false: a record already
  // existed and `record` is it, unchanged; the caller decides from its state.
  bool claimed = false;
  Record record;
};

// The end of an execution, written by StoreTxn::Finish.
struct Outcome {
  RecordState state = RecordState::kSucceeded;  // must not be kProcessing
  int status_code = 0;
  std::string sealed_response;  // Sealer output; may be empty for FAILED_RETRYABLE
  std::string recovery_point;   // the point reached, e.g. "done"; empty leaves it unchanged
  // A finish reached at or past the record's expires_at keeps the record for this long from now
  // (an execution that outlived its retention: a retry that waited meanwhile is answered from it
  // instead of beginning a new operation); an unexpired record keeps its expires_at.
  Millis retention{0};
};

// Bytes bound to or read from business SQL (BYTEA on PostgreSQL, BLOB on SQLite), distinct from
// text.
struct Blob {
  std::string bytes;
  bool operator==(const Blob&) const = default;
};

// A value bound to or read from business SQL. Both backends read a column back as the same
// alternative, by its type:
//   NULL                                        → std::monostate
//   SMALLINT, INTEGER, BIGINT, BOOLEAN (0 / 1)  → int64_t
//   REAL, DOUBLE PRECISION                      → double
//   TEXT, VARCHAR, CHAR, JSON, JSONB, UUID      → std::string
//   NUMERIC / DECIMAL                           → std::string holding the exact decimal
//                                                 (PostgreSQL; SQLite stores these as numbers,
//                                                 so portable money is BIGINT minor units)
//   BYTEA (BLOB)                                → Blob
//   TIMESTAMPTZ, TIMESTAMP                      → Timestamp (UTC; SQLite keeps Unix
//                                                 milliseconds in a column declared so)
// A column of any other type is refused with kInvalidArgument naming the column and its type.
// Bound parameters map the same way back (a Timestamp binds as the instant it names).
using SqlValue = std::variant<std::monostate, int64_t, double, std::string, Blob, Timestamp>;
using SqlRow = std::vector<SqlValue>;

// One write transaction, on one connection, used by one thread. Destroying it without a successful
// Commit rolls everything back.
class StoreTxn {
 public:
  virtual ~StoreTxn() = default;

  // Atomically inserts a PROCESSING record with a fresh owner token, fence 1, a lease of
  // spec.lease_ttl and an expiry of spec.retention from now, unless a record with this scope
  // exists. Never "select then insert". Errors: kUnavailable / kInternal from the database.
  virtual Result<ClaimResult> Claim(const ClaimSpec& spec) = 0;

  // Claims an existing record again, if it still has fence `seen_fence` and is claimable: a
  // PROCESSING record whose lease expired (a takeover: recovery point and resource id are kept),
  // a FAILED_RETRYABLE record (a retry: the same), or a finished record past its expiry (a new
  // operation: every column is rewritten from `spec`). A PROCESSING record past its expiry is
  // only ever taken over: its downstream call may have happened. The new holder gets a fresh owner
  // token, fence + 1 and a lease of spec.lease_ttl. A takeover or a retry also extends the
  // record's expiry to at least now + spec.retention (never shortening it), so its outcome is
  // kept for a full retention however late the resume came. Errors: kConflict if the record
  // moved on or its lease is still live; kNotFound if it is gone (a sweeper deleted it after the
  // caller read it: claim again).
  virtual Result<Record> Reclaim(const ClaimSpec& spec, int64_t seen_fence) = 0;

  // Extends a live lease to now + ttl (a heartbeat; retention is not touched).
  // Errors: kFenced if `lease` no longer owns a PROCESSING record.
  virtual Result<Lease> Renew(const ScopeHash& scope, const Lease& lease, Millis ttl) = 0;

  // Records progress: the recovery point, and the resource id when non-empty.
  // Errors: kInvalidArgument for a point or id longer than limits::kRecoveryPointMaxLength /
  // kResourceIdMaxLength; kFenced as for Renew.
  virtual Status Advance(const ScopeHash& scope, const Lease& lease, std::string_view point,
                         std::string_view resource_id) = 0;

  // Records `point` before an external call that cannot be called back (e.g. "charge_sent"),
  // only while the lease covers the whole call: lease_until >= now + must_cover, where
  // must_cover is the call's timeout plus a margin. The condition is part of the same fenced
  // UPDATE; when it fails nothing is written. Errors: kConflict when `lease` still owns the
  // PROCESSING record but ends too soon — the lease is not lost: Renew (in this transaction)
  // and try again, or give up; either way do not call before this succeeds; kFenced as for
  // Renew; kInvalidArgument as for Advance.
  virtual Status AdvanceCovered(const ScopeHash& scope, const Lease& lease, std::string_view point,
                                Millis must_cover) = 0;

  // Finishes the execution: PROCESSING → outcome.state with the sealed response.
  // Errors: kInvalidArgument for a recovery point over limits::kRecoveryPointMaxLength; kFenced
  // as for Renew; the caller must then drop the transaction, which rolls back its business writes.
  virtual Status Finish(const ScopeHash& scope, const Lease& lease, const Outcome& outcome) = 0;

  // An operator's settlement of a held outcome: the record, if it still has fence `seen_fence`
  // and is FAILED_FINAL at kOutcomeUnknownPoint, unexpired, becomes outcome.state with outcome's
  // status, sealed response and recovery point (written as given, "" included), fence + 1. No
  // lease is involved: nobody holds a finished record. Errors: kConflict when the record moved
  // on (settled already, another fence) or is not a held outcome; kNotFound when there is none
  // (or it expired); kInvalidArgument for outcome.state PROCESSING or a point over
  // limits::kRecoveryPointMaxLength.
  virtual Status Settle(const ScopeHash& scope, int64_t seen_fence, const Outcome& outcome) = 0;

  // The record as this transaction sees it, or nullopt.
  virtual Result<std::optional<Record>> Get(const ScopeHash& scope) = 0;

  // Records of one principal, in `state` or in any state when nullopt, counting at most `limit`.
  // The cost does not grow with the principal's history: for a state it is bounded by the quota
  // being checked; for any state the SQL stores read one counter row (idem_retained). Records
  // this transaction wrote count. Counting serialises the principal's transactions until they end
  // (a lock on PostgreSQL; SQLite's one writer), so a transaction counts last, just before Commit.
  virtual Result<int64_t> Count(std::string_view tenant, std::string_view user,
                                std::optional<RecordState> state, int64_t limit) = 0;

  // A claim's two quota counts, as the two Counts give them: the principal's PROCESSING records
  // up to `processing_limit` and its records in any state up to `retained_limit`. One call, so a
  // store may take both (and the principal's lock) in one round trip, as PostgreSQL does.
  struct QuotaCounts {
    int64_t processing = 0;
    int64_t retained = 0;
  };
  virtual Result<QuotaCounts> CountQuota(std::string_view tenant, std::string_view user,
                                         int64_t processing_limit, int64_t retained_limit) {
    QuotaCounts counts;
    IDEM_ASSIGN_OR_RETURN(counts.processing,
                          Count(tenant, user, RecordState::kProcessing, processing_limit));
    IDEM_ASSIGN_OR_RETURN(counts.retained, Count(tenant, user, std::nullopt, retained_limit));
    return counts;
  }

  // Runs one business SQL statement with '?' placeholders bound to `params`, returning its rows.
  // Errors: kAlreadyExists on a unique or primary key violation (decide from the existing row);
  // kInvalidArgument for SQL the database rejects; kUnavailable when the database is busy.
  virtual Result<std::vector<SqlRow>> Exec(std::string_view sql,
                                           const std::vector<SqlValue>& params = {}) = 0;

  // Makes every write of this transaction durable. After an error nothing was committed unless
  // the error is kDeadlineExceeded (outcome unknown: re-read before acting). A store may commit
  // transactions in groups (SQLite does): a transaction can then read what an earlier member of
  // its group wrote before that is durable, so a decision taken on what a transaction read stands
  // only once its Commit has succeeded, even for a transaction that wrote nothing.
  virtual Status Commit() = 0;

  // Calls `fn` once this transaction's Commit has succeeded, on the committing thread, before
  // Commit returns; in the order added. Never when the transaction rolls back (destroyed without
  // Commit) or its Commit fails, kDeadlineExceeded included: a hook counts or announces only what
  // is known to have committed (idemd's count of outbox events written). `fn` must not throw or
  // use this transaction.
  virtual void AfterCommit(std::function<void()> fn) = 0;
};

// A live subscription; destroying it stops the notifications.
class Subscription {
 public:
  virtual ~Subscription() = default;
};

// A Store is safe for concurrent use from many threads without external locking.
class Store {
 public:
  virtual ~Store() = default;

  // Calls `on_finished(scope)`, from a thread the store owns, whenever any process finishes a
  // record (StoreTxn::Finish committed), so waiters on other instances wake without polling.
  // Delivery is best effort (a lost connection loses notifications until it is re-established):
  // waiters must also poll. Errors: kUnavailable where the backend has no such channel
  // (capabilities().notifications is false).
  virtual Result<std::unique_ptr<Subscription>> SubscribeFinished(
      std::function<void(const ScopeHash&)> on_finished) {
    (void)on_finished;
    return MakeError(Errc::kUnavailable, "this store has no completion notifications");
  }

  virtual const StoreCapabilities& capabilities() const = 0;

  // Whether the store can be reached and answers now, decided within about `timeout` whatever
  // the database does (a readiness probe; no record is read, no pooled connection is waited for
  // where the backend can avoid it). Errors: kUnavailable when the database cannot be reached or
  // does not answer in time. This default runs Query("SELECT 1"), bounded only by the backend's
  // own waits; a backend whose database can stall overrides it.
  virtual Status Ping(Millis timeout) {
    (void)timeout;
    auto rows = Query("SELECT 1");
    if (!rows) return MakeError(Errc::kUnavailable, rows.error().message);
    return Ok();
  }

  // Starts a write transaction. Errors: kUnavailable if no connection or write lock could be had
  // within the configured waits.
  virtual Result<std::unique_ptr<StoreTxn>> Begin() = 0;

  // Reads one record outside any write transaction (a consistent snapshot).
  virtual Result<std::optional<Record>> Read(const ScopeHash& scope) = 0;

  // A finished record that a cache in front of the store holds in memory, at once: no I/O and no
  // wait beyond a short lock, so a caller that must not block (a coroutine on an I/O thread) may
  // ask. Never one past its expiry; nullopt when none is held, always for a store without such a
  // cache (the default). What Read would answer for a finished record, never anything else.
  virtual std::optional<Record> ReadCached(const ScopeHash& /*scope*/) { return std::nullopt; }

  // Told, after the transaction that finished `record` committed, what the record now is (as
  // Read would answer it, with observed_at the store's time at the claim): a cache in front of
  // the store may keep it as if read at `as_of`, which must be no later than the store reckoned
  // observed_at, on the monotonic clock the cache counts lifetimes on (the system's unless the
  // cache was given another). The first replay then needs no read. The default keeps nothing.
  virtual void KeepFinished(const Record& /*record*/, SteadyTime /*as_of*/) {}

  // Runs one read-only business SQL statement ('?' placeholders) outside any write transaction,
  // on a consistent snapshot. Errors: kInvalidArgument for SQL the database rejects (or that
  // writes); kUnavailable when no connection is free in time.
  virtual Result<std::vector<SqlRow>> Query(std::string_view sql,
                                            const std::vector<SqlValue>& params = {}) = 0;

  // Up to `limit` records of `route` that the takeover loop must resolve, oldest lease first: those
  // PROCESSING whose lease has expired (executions that crashed, stalled or gave up with an
  // unknown outcome), and those FAILED_RETRYABLE at one of `sent_points` whose lease has expired
  // (a retryable failure after a call that cannot be called back, which proves nothing about that
  // call: RoutePolicy::sent_points). Per route, so the stale records of one route never crowd out
  // another's. Errors: kInvalidArgument for more than limits::kMaxSentPoints points, or an empty
  // one; kUnavailable; kDataLoss (a record failed to decode).
  virtual Result<std::vector<Record>> ListStale(std::string_view route,
                                                const std::vector<std::string>& sent_points,
                                                int limit) = 0;

  // Up to `limit` held outcomes (FAILED_FINAL at kOutcomeUnknownPoint, unexpired) of `route`, or
  // of every route when it is empty, the longest held first (updated_at), for an operator to
  // settle. Errors: kUnavailable; kDataLoss (a record failed to decode).
  virtual Result<std::vector<Record>> ListHeld(std::string_view route, int limit) = 0;

  // Deletes up to `batch` finished records whose expiry has passed, oldest first, and returns how
  // many it deleted. PROCESSING records, and FAILED_RETRYABLE ones at one of `sent_points` (a
  // retryable failure past a call that cannot be called back: ListStale), are left to the
  // takeover loop, which must first learn whether their downstream call happened; deleted, they
  // would leave their business rows (a payment holding its order) unresolved for ever.
  // Errors: kInvalidArgument (sent_points as for ListStale); kUnavailable.
  virtual Result<int> Sweep(int batch, const std::vector<std::string>& sent_points) = 0;

  // Counts the records for gauges, at a cost that does not grow with the history: the unfinished
  // ones (PROCESSING, FAILED_RETRYABLE) through the index the takeover loop scans, all of them from
  // the principals' counters (idem_retained on the SQL stores), so SUCCEEDED and FAILED_FINAL
  // are not told apart. Errors: kUnavailable.
  virtual Result<RecordCensus> Census() = 0;
};

// The calls of Store and StoreTxn that reach the database, one per method: what a forwarding
// wrapper's Around hook is told (a decorator times them, or injects a fault into them).
enum class StoreOperation : uint8_t {
  kBegin,
  kClaim,
  kReclaim,
  kRenew,
  kAdvance,
  kAdvanceCovered,
  kFinish,
  kGet,
  kCount,
  kExec,
  kCommit,
  kRead,
  kQuery,
  kListStale,
  kSweep,
  kPing,
  kCensus,
  kSettle,
  kListHeld,
};
inline constexpr std::size_t kStoreOperations = 19;
// The method's name in snake case: "begin", "claim", ..., "advance_covered", "list_stale", ...
// (idemd's metric label values and the fault injector's logs).
std::string_view StoreOperationName(StoreOperation operation);

// The forwarded call a wrapper's Around hook runs: the inner store's (or transaction's) method
// with the caller's arguments. Answers Ok or the inner call's error; its result is kept for the
// caller. Borrowed for the length of one Around; call it at most once.
class ForwardedCall {
 public:
  template <typename Call>
  explicit ForwardedCall(Call& call)
      : call_(&call), invoke_([](void* c) -> Status { return (*static_cast<Call*>(c))(); }) {}
  Status operator()() const { return invoke_(call_); }

 private:
  void* call_;
  Status (*invoke_)(void*);
};

// A StoreTxn that forwards every call to another, each through Around: a decorator overrides
// Around to time, fail or delay calls, or a method to change what it does. Owns `target`;
// used by one thread, as every transaction is.
class StoreTxnWrapper : public StoreTxn {
 public:
  explicit StoreTxnWrapper(std::unique_ptr<StoreTxn> target) : target_(std::move(target)) {}

  StoreTxn& target() const { return *target_; }

  Result<ClaimResult> Claim(const ClaimSpec& spec) override;
  Result<Record> Reclaim(const ClaimSpec& spec, int64_t seen_fence) override;
  Result<Lease> Renew(const ScopeHash& scope, const Lease& lease, Millis ttl) override;
  Status Advance(const ScopeHash& scope, const Lease& lease, std::string_view point,
                 std::string_view resource_id) override;
  Status AdvanceCovered(const ScopeHash& scope, const Lease& lease, std::string_view point,
                        Millis must_cover) override;
  Status Finish(const ScopeHash& scope, const Lease& lease, const Outcome& outcome) override;
  Status Settle(const ScopeHash& scope, int64_t seen_fence, const Outcome& outcome) override;
  Result<std::optional<Record>> Get(const ScopeHash& scope) override;
  Result<int64_t> Count(std::string_view tenant, std::string_view user,
                        std::optional<RecordState> state, int64_t limit) override;
  Result<QuotaCounts> CountQuota(std::string_view tenant, std::string_view user,
                                 int64_t processing_limit, int64_t retained_limit) override;
  Result<std::vector<SqlRow>> Exec(std::string_view sql,
                                   const std::vector<SqlValue>& params = {}) override;
  Status Commit() override;
  // Forwarded to the target, whose own Commit runs the hooks: an error a decorator injects after
  // a commit that succeeded does not hide what committed from them.
  void AfterCommit(std::function<void()> fn) override { target_->AfterCommit(std::move(fn)); }

 protected:
  // Runs `call`, the forwarded `operation`, and answers Ok or an error. An error is the answer
  // of the method, whether `call` ran or not (a fault injected before or after it); Ok answers
  // what `call` returned, so Around must then have run it. Around cannot make a failed call
  // succeed. The default runs it and nothing else.
  virtual Status Around(StoreOperation operation, const ForwardedCall& call);

 private:
  // Runs `forward` through Around(operation) and answers as Around says (src/core/store.cc).
  template <typename Forward>
  auto Through(StoreOperation operation, Forward&& forward);

  std::unique_ptr<StoreTxn> target_;
};

// A Store that forwards every call to another (leveldb's EnvWrapper): decorators — a cache,
// timing, fault injection in tests — derive from it and override Around, WrapTxn or only the
// methods they change. The calls that reach the database go through Around (Begin, Read, Query,
// ListStale, ListHeld, Sweep, Census, Ping); SubscribeFinished, capabilities, ReadCached and
// KeepFinished are forwarded as they are. Borrows `target`, which must outlive the wrapper, or
// owns it; as thread-safe as the target, and as Around and WrapTxn.
class StoreWrapper : public Store {
 public:
  explicit StoreWrapper(Store& target) : target_(target) {}
  explicit StoreWrapper(std::unique_ptr<Store> target)
      : owned_(std::move(target)), target_(*owned_) {}

  Store& target() const { return target_; }

  Result<std::unique_ptr<Subscription>> SubscribeFinished(
      std::function<void(const ScopeHash&)> on_finished) override {
    return target_.SubscribeFinished(std::move(on_finished));
  }
  const StoreCapabilities& capabilities() const override { return target_.capabilities(); }
  std::optional<Record> ReadCached(const ScopeHash& scope) override {
    return target_.ReadCached(scope);
  }
  void KeepFinished(const Record& record, SteadyTime as_of) override {
    target_.KeepFinished(record, as_of);
  }

  Status Ping(Millis timeout) override;
  // The target's transaction, through WrapTxn, both inside one Around.
  Result<std::unique_ptr<StoreTxn>> Begin() override;
  Result<std::optional<Record>> Read(const ScopeHash& scope) override;
  Result<std::vector<SqlRow>> Query(std::string_view sql,
                                    const std::vector<SqlValue>& params = {}) override;
  Result<std::vector<Record>> ListStale(std::string_view route,
                                        const std::vector<std::string>& sent_points,
                                        int limit) override;
  Result<std::vector<Record>> ListHeld(std::string_view route, int limit) override;
  Result<int> Sweep(int batch, const std::vector<std::string>& sent_points) override;
  Result<RecordCensus> Census() override;

 protected:
  // As StoreTxnWrapper::Around, for the store's calls.
  virtual Status Around(StoreOperation operation, const ForwardedCall& call);
  // What Begin answers for a transaction the target began (a StoreTxnWrapper of it, say); the
  // default answers it as it is.
  virtual std::unique_ptr<StoreTxn> WrapTxn(std::unique_ptr<StoreTxn> txn) { return txn; }

 private:
  // Runs `forward` through Around(operation) and answers as Around says (src/core/store.cc).
  template <typename Forward>
  auto Through(StoreOperation operation, Forward&& forward);

  std::unique_ptr<Store> owned_;  // null when borrowed
  Store& target_;
};

// The bounds every store checks before it records progress (StoreTxn::Advance, AdvanceCovered,
// Finish). Errors: kInvalidArgument for a recovery point longer than
// limits::kRecoveryPointMaxLength or a resource id longer than limits::kResourceIdMaxLength.
Status CheckProgress(std::string_view point, std::string_view resource_id);
// What every store checks of a settlement before it writes (StoreTxn::Settle): kInvalidArgument
// for a PROCESSING state or a recovery point too long.
Status CheckSettlement(const Outcome& outcome);
// The error of a settlement that changed nothing, worded the same on every backend, from the
// record as the transaction now reads it: kNotFound, or kConflict saying why.
Error SettleRefused(const std::optional<Record>& record, int64_t seen_fence);

// How a sweep shares the store with the requests beside it: after each full batch but the
// round's last it rests `rest_per_work` times as long as that batch took on `clock`, so it takes
// at most 1 / (1 + rest_per_work) of the store's time (a SQLite file has one writer: a sweep
// deleting back to back starves the claims). `rest` waits and says whether the round goes on
// (idemd's cuts the wait short and says no on shutdown); it is asked after every full batch but
// the round's last, also when `rest_per_work` is 0. The rest is rounded up to whole
// milliseconds, so a batch faster than a millisecond still rests.
struct SweepPacing {
  const MonotonicClock* clock = nullptr;
  int64_t rest_per_work = 0;
  std::function<bool(Millis)> rest;
  // When set, told each batch's deletions as soon as the batch has committed: idemd counts them
  // as they go, so a round a backlog keeps going, or one that fails, still shows what it deleted.
  std::function<void(int64_t)> swept;
};

// Deletes expired finished records in batches of limits::kSweepBatch until a batch comes back
// short, `max_batches` ran or `pacing`'s rest says stop, and returns how many it deleted;
// `sent_points` as for Store::Sweep (every route's that shares the store). idemd's sweeper runs
// unbounded rounds, paced, so that it keeps up with any rate of expiry the store can take.
// Errors: the store's, after the batches that succeeded (their deletions stand).
Result<int64_t> SweepExpired(Store& store, const std::vector<std::string>& sent_points,
                             int max_batches = limits::kSweepBatchesPerRound,
                             const SweepPacing* pacing = nullptr);

}  // namespace idem
