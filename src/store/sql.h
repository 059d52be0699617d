// src/store/sql.h — the one SQL text of libidem's records, for every SQL backend: the schema (a
// template with per-backend type names), the record statements, the migration runner, and the
// StoreTxn both SQL stores share. A backend supplies only what really differs: how a statement
// runs on its connections (placeholders, binding, decoding, error mapping), how a transaction
// locks, and what a failed commit means. Internal to the store targets.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/record.h"
#include "idem/store.h"
#include "src/store/pool.h"

namespace idem::store_internal {

// What differs in the SQL text between backends; everything else is written once below.
struct Dialect {
  std::string_view name;
  std::string_view integer_type;  // a 64-bit integer column
  std::string_view bytes_type;    // a byte-string column
  std::string_view record_table_options;
  bool numbered_placeholders = false;  // $1, $2, ... instead of ?
  // Appended to the sweeper's inner SELECT: concurrent sweepers skip each other's rows.
  std::string_view sweep_lock;
  // Appended to the finish UPDATE (PostgreSQL: notify listeners when the transaction commits).
  std::string_view on_finish;
  // The store's time of a statement in milliseconds, written where a statement says {now}. It
  // holds one '?', which SqlTxn::Now binds (a null, or a caller's clock where the expression
  // takes one).
  std::string_view now;
  // Schema text: the triggers that keep idem_retained (each principal's number of records) in
  // step with every insert into and delete from idem_records, in the same transaction.
  std::string_view retained_triggers;
  // Schema text run after them (migration 5): where the insert trigger is moved to the commit, so
  // that a claim holds its principal's counter row only while it commits (PostgreSQL). A comment
  // where it stays as it is.
  std::string_view retained_insert_at_commit;
  // Whether idem_retained counts a transaction's inserts only as it commits (above): its quota
  // count then adds the records this transaction inserted itself.
  bool retained_counted_at_commit = false;
  // The principal's retained count (as count_any reads it), read under its counter row's lock,
  // which serialises one principal's quota counts until the transaction ends, where the backend's
  // write lock does not already (SqlTxn counts after it); two '?', tenant and user. Empty: no lock.
  std::string_view count_any_locked;
};

const Dialect& SqliteDialect();
// `notify_finished` false: the finish notifies no one (PostgresStoreOptions::notifications).
const Dialect& PostgresDialect(bool notify_finished = true);

// `sql` with its '?' placeholders written as $1, $2, ... (quoted text is left alone); `count`
// receives the number of placeholders when non-null.
std::string Numbered(std::string_view sql, int* count = nullptr);

// Errors: kInvalidArgument, worded the same on every backend, when a statement takes `expected`
// parameters and `got` were given.
Status CheckParameterCount(std::string_view op, int expected, std::size_t got);

// Every statement on the records table, rendered once for a dialect.
struct RecordSql {
  explicit RecordSql(const Dialect& dialect);

  const Dialect& dialect;
  std::vector<Migration> migrations;  // libidem's schema, oldest first
  std::string create_schema_table;
  std::string schema_version;  // (component) → the highest applied version, or 0
  std::string schema_insert;   // (component, version, applied_at)
  std::string get;
  std::string claim;
  std::string reclaim_fresh;
  std::string reclaim_resume;
  std::string renew;
  std::string advance;
  std::string advance_covered;
  std::string finish;
  std::string settle;
  std::string count_any;
  std::string count_any_locked;  // empty where the dialect needs no lock
  std::string count_state;
  std::string list_stale;
  std::string list_held;
  std::string sweep;
  std::string census_unfinished;  // rows (state, count, min created_at, now)
  std::string census_retained;    // one row (records in all, now)
};

// One statement of a batch (SqlRunner::RunAll): its text in the backend's placeholder form and
// its parameters, then what it returned.
struct SqlStep {
  SqlStep() = default;
  SqlStep(std::string_view sql_text, std::vector<SqlValue> values = {}, bool prepare = true)
      : sql(sql_text), params(std::move(values)), preparable(prepare) {}

  std::string_view sql;
  std::vector<SqlValue> params;
  // False for the words of a transaction (BEGIN, SAVEPOINT, ...): never a prepared statement.
  bool preparable = true;
  std::vector<SqlRow> rows;  // out
  int changed = 0;           // out: rows the statement changed
};

// Runs statements of the shared text on one connection; each backend's connection is one.
class SqlRunner {
 public:
  virtual ~SqlRunner() = default;
  // Runs one statement, already in this backend's placeholder form, with `params` bound in
  // order; returns its rows and sets `*changed` (when non-null) to the number of rows it changed.
  // Errors: the backend's mapping — kAlreadyExists (unique violation), kInvalidArgument (SQL the
  // database rejects), kUnavailable (busy or unreachable), kDataLoss (corruption).
  virtual Result<std::vector<SqlRow>> Run(std::string_view sql, const std::vector<SqlValue>& params,
                                          int* changed) = 0;

  // Runs `steps` in order and fills in what each returned; stops at the first that fails and
  // returns its error (the later ones did not run). A backend with a network between it and its
  // database sends them all before it waits (PostgreSQL's pipeline mode): one round trip for
  // the lot. Errors: as Run.
  virtual Status RunAll(std::vector<SqlStep>& steps) {
    for (SqlStep& step : steps) {
      IDEM_ASSIGN_OR_RETURN(step.rows, Run(step.sql, step.params, &step.changed));
    }
    return Ok();
  }
};

// The backend's half of one write transaction: a connection inside BEGIN. Destroying it without a
// successful Commit rolls back.
class TxnSession : public SqlRunner {
 public:
  // Runs business SQL as its caller wrote it ('?' placeholders) so that a failed statement leaves
  // the transaction usable. Errors: as Run; kInvalidArgument for a wrong parameter count.
  virtual Result<std::vector<SqlRow>> Exec(std::string_view sql,
                                           const std::vector<SqlValue>& params) = 0;
  // Errors: kUnavailable (nothing was committed; the transaction stays open until destroyed);
  // kDeadlineExceeded when the outcome is unknown (the connection broke during COMMIT).
  virtual Status Commit() = 0;
};

// A TxnSession on a connection lent by a Pool: `Conn` is the backend's connection (a SqlRunner
// with Script(sql), Broken(), TimedOut() and ClearTimedOut()). BEGIN is not sent on its own: it
// goes with the transaction's first statements, in their round trip. Rolls back on destruction
// unless committed, on a connection that still works.
template <typename Conn>
class LentSession : public TxnSession {
 public:
  // `begin` opens the transaction ("BEGIN"). A connection found dead by the first statements
  // (it died while idle in the pool; nothing was committed, for no COMMIT was sent) is replaced
  // by another of the pool, waited for up to `pool_wait`, at most `retries` times; one that timed
  // out is not: it met a stalled server, which another would only wait for again.
  LentSession(Lent<Conn> conn, std::string begin, int retries, Millis pool_wait)
      : conn_(std::move(conn)), begin_(std::move(begin)), retries_(retries), pool_wait_(pool_wait) {
    conn_->ClearTimedOut();
  }
  ~LentSession() override {
    if (open_ && conn_ && !conn_->Broken()) (void)conn_->Script("ROLLBACK");
  }

  Result<std::vector<SqlRow>> Run(std::string_view sql, const std::vector<SqlValue>& params,
                                  int* changed) override {
    if (begun_) return conn_->Run(sql, params, changed);
    std::vector<SqlStep> steps(1);
    steps[0].sql = sql;
    steps[0].params = params;
    IDEM_RETURN_IF_ERROR(RunAll(steps));
    if (changed != nullptr) *changed = steps[0].changed;
    return std::move(steps[0].rows);
  }

  Status RunAll(std::vector<SqlStep>& steps) override {
    if (begun_) return conn_->RunAll(steps);
    if (lost_) return Lost();
    std::vector<SqlStep> first;
    first.reserve(steps.size() + 1);
    first.push_back(SqlStep{begin_, {}, false});
    for (SqlStep& step : steps) first.push_back(std::move(step));
    Status run = Ok();
    for (int attempt = 0;; ++attempt) {
      run = conn_->RunAll(first);
      if (run || !conn_->Broken() || attempt >= retries_ || conn_->TimedOut()) break;
      if (Status replaced = conn_.Replace(pool_wait_); !replaced) {
        lost_ = true;
        return replaced;
      }
      conn_->ClearTimedOut();
    }
    for (std::size_t i = 0; i < steps.size(); ++i) steps[i] = std::move(first[i + 1]);
    // A statement that failed on a working connection leaves the transaction open (aborted).
    if (conn_->Broken()) {
      lost_ = true;
    } else {
      begun_ = open_ = true;
    }
    return run;
  }

 protected:
  // COMMIT; on failure the transaction stays open (rolled back on destruction) unless the
  // connection broke, when the outcome is unknown: kDeadlineExceeded. A transaction that ran
  // nothing has nothing to commit.
  Status CommitOnce() {
    if (lost_) return Lost();
    if (!begun_) return Ok();
    Status s = conn_->Script("COMMIT");
    if (!s && conn_->Broken()) {
      open_ = false;
      return MakeError(Errc::kDeadlineExceeded,
                       "commit outcome unknown (connection lost): " + s.error().message);
    }
    IDEM_RETURN_IF_ERROR(s);
    open_ = false;
    return Ok();
  }

  Lent<Conn> conn_;

 private:
  static Error Lost() {
    return MakeError(Errc::kUnavailable, "the transaction's connection was lost before it began");
  }

  std::string begin_;
  int retries_;
  Millis pool_wait_;
  bool begun_ = false;  // BEGIN was sent and the connection still works
  bool open_ = false;   // rolled back on destruction
  bool lost_ = false;   // the first statements found no working connection: nothing ran
};

// What a statement's {now} parameters are bound to: the caller's clock, or null where the
// dialect then reads the database's own (PostgreSQL's statement time).
class StoreTime {
 public:
  static StoreTime Database() { return StoreTime(nullptr); }
  static StoreTime Of(Clock& clock) { return StoreTime(&clock); }

  // The value of every {now} of one statement.
  SqlValue Param() const {
    return clock_ != nullptr ? SqlValue{ToUnixMillis(clock_->Now())} : SqlValue{};
  }

 private:
  explicit StoreTime(Clock* clock) : clock_(clock) {}
  Clock* clock_;
};

// The StoreTxn of every SQL backend: record operations in the shared text over a session.
// Used by one thread, like every StoreTxn.
class SqlTxn final : public StoreTxn {
 public:
  // Borrows `sql` and `random`, which outlive the transaction (and the clock `time` reads).
  SqlTxn(std::unique_ptr<TxnSession> session, const RecordSql& sql, StoreTime time, Random& random);

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
                                   const std::vector<SqlValue>& params) override;
  Status Commit() override;
  void AfterCommit(std::function<void()> fn) override { after_commit_.push_back(std::move(fn)); }

 private:
  Result<int> Change(const std::string& sql, const std::vector<SqlValue>& params);
  // Keeps `row`, the record a statement of this transaction wrote and returned, for Get.
  Status Wrote(const SqlRow& row);
  struct Counts {
    int64_t retained = 0;  // idem_retained's count, as read (Retained adjusts it)
    int64_t state = 0;     // the records in the state asked
  };
  // A principal's counts in one RunAll: first its retained count where `retained` is asked or
  // this transaction does not hold the principal's lock yet (count_any_locked then, which takes
  // it), then `state_count` where given.
  Result<Counts> Counted(std::string_view tenant, std::string_view user, bool retained,
                         std::optional<SqlStep> state_count);
  // The count_any statement's parameters.
  static std::vector<SqlValue> AnyParams(std::string_view tenant, std::string_view user);
  // count_any's integer as Count reports it: this transaction's own inserts added where the
  // dialect counts them at commit, capped at `limit`.
  int64_t Retained(std::string_view tenant, std::string_view user, int64_t counted,
                   int64_t limit) const;

  std::unique_ptr<TxnSession> session_;
  const RecordSql& sql_;
  StoreTime time_;
  Random& random_;
  bool committed_ = false;
  // The principals (tenant, user) of the records this transaction inserted, one entry each.
  std::vector<std::pair<std::string, std::string>> inserted_;
  std::string locked_;  // the principal (tenant 0x1F user) whose lock this transaction holds
  // The record the last record statement of this transaction wrote and returned, while no other
  // statement that may change it has run since.
  std::optional<Record> written_;
  std::vector<std::function<void()>> after_commit_;
};

// Store-level reads and deletes outside a write transaction, on any connection.
Result<std::optional<Record>> GetRecord(SqlRunner& conn, const RecordSql& sql, StoreTime time,
                                        const ScopeHash& scope);
// Store::ListStale. Errors: kInvalidArgument for more than limits::kMaxSentPoints sent points, or
// an empty one.
Result<std::vector<Record>> ListStaleRecords(SqlRunner& conn, const RecordSql& sql,
                                             std::string_view route,
                                             const std::vector<std::string>& sent_points,
                                             StoreTime time, int limit);
// Store::ListHeld.
Result<std::vector<Record>> ListHeldRecords(SqlRunner& conn, const RecordSql& sql,
                                            std::string_view route, StoreTime time, int limit);
// One atomic statement: deletes up to `batch` expired finished records, returns how many.
Result<int> SweepRecords(SqlRunner& conn, const RecordSql& sql, StoreTime time, int batch,
                         const std::vector<std::string>& sent_points);

// Store::Census, in two statements that read only the unfinished records' index and the
// principals' counters.
Result<RecordCensus> CensusRecords(SqlRunner& conn, const RecordSql& sql, StoreTime time);

// Creates the schema table if needed and applies the pending migrations of libidem and then of
// each of `apps`, inside the caller's transaction.
// `script` runs parameterless statements (DDL). Errors: kDataLoss when the database's schema is
// newer than this build; kInvalidArgument naming a migration the database rejects.
Status MigrateAll(SqlRunner& conn, const RecordSql& sql,
                  const std::function<Status(const std::string&)>& script,
                  const std::vector<AppMigrations>& apps, Timestamp now);

// For a store opened without migrations: libidem's schema must be there, at a version this build
// knows. Errors: kInvalidArgument when it is missing; kDataLoss when it is newer.
Status CheckSchema(SqlRunner& conn, const RecordSql& sql);

// Errors: kInvalidArgument when an application's migrations come without a name of their own
// (empty, "idem", or another application's).
Status CheckAppNames(std::string_view backend, const std::vector<AppMigrations>& apps);

// The one integer a query like "SELECT count(*)" returns. Errors: kDataLoss for anything else.
Result<int64_t> SingleInteger(const std::vector<SqlRow>& rows, const char* what);

inline Blob BytesOf(const uint8_t* data, std::size_t size) {
  return Blob{std::string(reinterpret_cast<const char*>(data), size)};
}
template <std::size_t N>
Blob BytesOf(const std::array<uint8_t, N>& a) {
  return BytesOf(a.data(), N);
}

}  // namespace idem::store_internal
