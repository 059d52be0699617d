// src/store/sqlite/sqlite_store.cc — the SQLite Store: WAL, a bounded connection pool, BEGIN
// IMMEDIATE for every write transaction, per-connection prepared statements, and versioned
// migrations applied on open.
#include <sqlite3.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <unordered_map>

#include "include/idem/store/sqlite.h"
#include "src/store/common.h"

namespace idem {
namespace {

constexpr std::string_view kComponent = "idem";

// libidem's own schema, one entry per version. Never edit an applied entry; append a new one.
const std::vector<Migration>& CoreMigrations() {
  static const std::vector<Migration> kMigrations = {
      {1, R"sql(
CREATE TABLE idem_records (
  scope_hash     BLOB PRIMARY KEY,
  tenant         TEXT NOT NULL,
  user_id        TEXT NOT NULL,
  route          TEXT NOT NULL,
  request_hash   BLOB NOT NULL,
  fp_version     INTEGER NOT NULL,
  secret_id      INTEGER NOT NULL,
  state          TEXT NOT NULL
                 CHECK (state IN ('PROCESSING','SUCCEEDED','FAILED_FINAL','FAILED_RETRYABLE')),
  recovery_point TEXT NOT NULL DEFAULT '',
  resource_id    TEXT NOT NULL DEFAULT '',
  status_code    INTEGER NOT NULL DEFAULT 0,
  response       BLOB,
  owner_token    BLOB NOT NULL,
  fence          INTEGER NOT NULL,
  lease_until    INTEGER NOT NULL,
  created_at     INTEGER NOT NULL,
  updated_at     INTEGER NOT NULL,
  expires_at     INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX idem_records_quota ON idem_records (tenant, user_id, state);
CREATE INDEX idem_records_expiry ON idem_records (expires_at);
)sql"},
  };
  return kMigrations;
}

Error SqliteError(sqlite3* db, int rc, std::string_view what) {
  const int primary = rc & 0xff;
  std::string message = std::string(what) + ": " + (db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  switch (primary) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_CANTOPEN:
    case SQLITE_FULL:
    case SQLITE_IOERR:
      return MakeError(Errc::kUnavailable, std::move(message));
    case SQLITE_CONSTRAINT:
      if (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY) {
        return MakeError(Errc::kAlreadyExists, std::move(message));
      }
      return MakeError(Errc::kInvalidArgument, std::move(message));
    case SQLITE_ERROR:
      return MakeError(Errc::kInvalidArgument, std::move(message));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return MakeError(Errc::kDataLoss, std::move(message));
    default:
      return MakeError(Errc::kInternal, std::move(message));
  }
}

// ---- One connection with its statement cache -------------------------------------------------

class Connection {
 public:
  Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() {
    for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
    if (db_ != nullptr) sqlite3_close_v2(db_);
  }

  Status Open(const SqliteStoreOptions& options) {
    int rc =
        sqlite3_open_v2(options.path.c_str(), &db_,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db_, rc, "open " + options.path);
    sqlite3_extended_result_codes(db_, 1);
    sqlite3_busy_timeout(db_, static_cast<int>(options.busy_timeout.count()));
    IDEM_RETURN_IF_ERROR(Script("PRAGMA journal_mode=WAL"));
    IDEM_RETURN_IF_ERROR(
        Script(options.synchronous_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"));
    IDEM_RETURN_IF_ERROR(Script("PRAGMA foreign_keys=ON"));
    return Ok();
  }

  sqlite3* db() const { return db_; }
  // SQLite connections do not break the way network connections do.
  bool broken() const { return false; }

  // Runs statements without parameters or results.
  Status Script(const std::string& sql) {
    char* err = nullptr;
    int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err);
    sqlite3_free(err);
    if (rc != SQLITE_OK) return SqliteError(db_, rc, "exec");
    return Ok();
  }

  // A cached, reset statement for `sql`.
  Result<sqlite3_stmt*> Prepare(std::string_view sql) {
    auto it = statements_.find(std::string(sql));
    if (it != statements_.end()) {
      sqlite3_reset(it->second);
      sqlite3_clear_bindings(it->second);
      return it->second;
    }
    sqlite3_stmt* stmt = nullptr;
    int rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                                SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db_, rc, "prepare");
    if (statements_.size() >= kMaxCachedStatements) {
      for (auto& [s, old] : statements_) sqlite3_finalize(old);
      statements_.clear();
    }
    statements_.emplace(std::string(sql), stmt);
    return stmt;
  }

 private:
  static constexpr std::size_t kMaxCachedStatements = 256;
  sqlite3* db_ = nullptr;
  std::unordered_map<std::string, sqlite3_stmt*> statements_;
};

// Binds and steps one statement; rows come back as SqlValues.
class Statement {
 public:
  Statement(Connection& conn, sqlite3_stmt* stmt) : conn_(conn), stmt_(stmt) {}
  ~Statement() { sqlite3_reset(stmt_); }

  Statement& Bind(const SqlValue& v) {
    int i = ++index_;
    if (std::holds_alternative<std::monostate>(v)) {
      sqlite3_bind_null(stmt_, i);
    } else if (auto* n = std::get_if<int64_t>(&v)) {
      sqlite3_bind_int64(stmt_, i, *n);
    } else if (auto* s = std::get_if<std::string>(&v)) {
      sqlite3_bind_text(stmt_, i, s->data(), static_cast<int>(s->size()), SQLITE_TRANSIENT);
    } else {
      const std::string& b = std::get<Blob>(v).bytes;
      sqlite3_bind_blob(stmt_, i, b.data(), static_cast<int>(b.size()), SQLITE_TRANSIENT);
    }
    return *this;
  }
  Statement& BindBytes(const uint8_t* data, std::size_t size) {
    sqlite3_bind_blob(stmt_, ++index_, data, static_cast<int>(size), SQLITE_TRANSIENT);
    return *this;
  }

  // Steps to completion, collecting rows. `changes` receives sqlite3_changes when non-null.
  Result<std::vector<SqlRow>> Run(int* changes = nullptr) {
    std::vector<SqlRow> rows;
    while (true) {
      int rc = sqlite3_step(stmt_);
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return SqliteError(conn_.db(), rc, "step");
      SqlRow row;
      const int n = sqlite3_column_count(stmt_);
      for (int c = 0; c < n; ++c) row.push_back(Column(c));
      rows.push_back(std::move(row));
    }
    if (changes != nullptr) *changes = sqlite3_changes(conn_.db());
    return rows;
  }

  sqlite3_stmt* raw() const { return stmt_; }

 private:
  SqlValue Column(int c) {
    switch (sqlite3_column_type(stmt_, c)) {
      case SQLITE_INTEGER:
        return static_cast<int64_t>(sqlite3_column_int64(stmt_, c));
      case SQLITE_TEXT: {
        auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, c));
        return std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, c)));
      }
      case SQLITE_BLOB: {
        auto* p = static_cast<const char*>(sqlite3_column_blob(stmt_, c));
        return Blob{
            std::string(p ? p : "", static_cast<std::size_t>(sqlite3_column_bytes(stmt_, c)))};
      }
      case SQLITE_FLOAT:
        return std::to_string(sqlite3_column_double(stmt_, c));
      default:
        return std::monostate{};
    }
  }

  Connection& conn_;
  sqlite3_stmt* stmt_;
  int index_ = 0;
};

using store_internal::BytesOf;
using store_internal::Fenced;
using store_internal::kRecordColumns;
using store_internal::RecordFromRow;
using store_internal::SingleInteger;
using Pool = store_internal::Pool<Connection>;
using PooledConnection = store_internal::Lent<Connection>;

Result<std::optional<Record>> GetRecord(Connection& conn, const ScopeHash& scope) {
  static const std::string sql =
      "SELECT " + std::string(kRecordColumns) + " FROM idem_records WHERE scope_hash = ?";
  IDEM_ASSIGN_OR_RETURN(sqlite3_stmt * raw, conn.Prepare(sql));
  Statement stmt(conn, raw);
  IDEM_ASSIGN_OR_RETURN(auto rows, stmt.Bind(BytesOf(scope)).Run());
  if (rows.empty()) return std::optional<Record>();
  IDEM_ASSIGN_OR_RETURN(Record r, RecordFromRow(rows[0]));
  return std::optional<Record>(std::move(r));
}

// Runs `sql` on `conn` with params; returns the number of changed rows.
Result<int> Change(Connection& conn, std::string_view sql, const std::vector<SqlValue>& params) {
  IDEM_ASSIGN_OR_RETURN(sqlite3_stmt * raw, conn.Prepare(sql));
  Statement stmt(conn, raw);
  for (const SqlValue& p : params) stmt.Bind(p);
  int changes = 0;
  IDEM_RETURN_IF_ERROR(stmt.Run(&changes));
  return changes;
}

// ---- Transaction ---------------------------------------------------------------------------

class SqliteTxn final : public StoreTxn {
 public:
  SqliteTxn(PooledConnection conn, Clock& clock, Random& random)
      : conn_(std::move(conn)), clock_(clock), random_(random) {}

  ~SqliteTxn() override {
    if (!finished_) (void)conn_->Script("ROLLBACK");
  }

  Status BeginImmediate() { return conn_->Script("BEGIN IMMEDIATE"); }

  Result<ClaimResult> Claim(const ClaimSpec& spec) override {
    static const std::string sql = "INSERT INTO idem_records (" + std::string(kRecordColumns) +
                                   ") VALUES (?, ?, ?, ?, ?, ?, ?, 'PROCESSING', '', '', 0, NULL, "
                                   "?, 1, ?, ?, ?, ?) ON CONFLICT (scope_hash) DO NOTHING";
    const Timestamp now = clock_.Now();
    Record r = NewRecord(spec, now, 1);
    IDEM_ASSIGN_OR_RETURN(
        int changed, Change(*conn_, sql,
                            {BytesOf(spec.scope), spec.tenant, spec.user, spec.route,
                             BytesOf(spec.fingerprint.mac), int64_t{spec.fingerprint.rules_version},
                             int64_t{spec.fingerprint.secret_id}, BytesOf(r.lease.owner),
                             ToUnixMillis(r.lease.until), ToUnixMillis(now), ToUnixMillis(now),
                             ToUnixMillis(r.expires_at)}));
    if (changed == 1) return ClaimResult{true, std::move(r)};
    IDEM_ASSIGN_OR_RETURN(auto existing, GetRecord(*conn_, spec.scope));
    if (!existing) return MakeError(Errc::kInternal, "claim: conflicting record vanished");
    return ClaimResult{false, std::move(*existing)};
  }

  Result<Record> Reclaim(const ClaimSpec& spec, int64_t seen_fence) override {
    const Timestamp now = clock_.Now();
    const int64_t now_ms = ToUnixMillis(now);
    Record r = NewRecord(spec, now, seen_fence + 1);
    // An expired, finished record starts a new operation: all columns from the spec. An expired
    // PROCESSING record is still unresolved (a charge may have left) and is only taken over.
    static const std::string fresh_sql =
        "UPDATE idem_records SET tenant = ?, user_id = ?, route = ?, request_hash = ?, "
        "fp_version = ?, secret_id = ?, state = 'PROCESSING', recovery_point = '', "
        "resource_id = '', status_code = 0, response = NULL, owner_token = ?, fence = ?, "
        "lease_until = ?, created_at = ?, updated_at = ?, expires_at = ? "
        "WHERE scope_hash = ? AND fence = ? AND expires_at <= ? AND state <> 'PROCESSING'";
    IDEM_ASSIGN_OR_RETURN(
        int changed,
        Change(*conn_, fresh_sql,
               {spec.tenant, spec.user, spec.route, BytesOf(spec.fingerprint.mac),
                int64_t{spec.fingerprint.rules_version}, int64_t{spec.fingerprint.secret_id},
                BytesOf(r.lease.owner), r.lease.fence, ToUnixMillis(r.lease.until), now_ms, now_ms,
                ToUnixMillis(r.expires_at), BytesOf(spec.scope), seen_fence, now_ms}));
    if (changed == 0) {
      // A takeover of an expired lease, or a retry after a retryable failure: same operation.
      static const std::string resume_sql =
          "UPDATE idem_records SET state = 'PROCESSING', owner_token = ?, fence = ?, "
          "lease_until = ?, updated_at = ? WHERE scope_hash = ? AND fence = ? AND "
          "(state = 'FAILED_RETRYABLE' OR (state = 'PROCESSING' AND lease_until < ?))";
      IDEM_ASSIGN_OR_RETURN(
          changed, Change(*conn_, resume_sql,
                          {BytesOf(r.lease.owner), r.lease.fence, ToUnixMillis(r.lease.until),
                           now_ms, BytesOf(spec.scope), seen_fence, now_ms}));
    }
    IDEM_ASSIGN_OR_RETURN(auto current, GetRecord(*conn_, spec.scope));
    return store_internal::ReclaimResult(changed, std::move(current));
  }

  Result<Lease> Renew(const ScopeHash& scope, const Lease& lease, Millis ttl) override {
    const Timestamp now = clock_.Now();
    Lease renewed = lease;
    renewed.until = now + ttl;
    static const std::string sql =
        "UPDATE idem_records SET lease_until = ?, updated_at = ? WHERE scope_hash = ? AND "
        "owner_token = ? AND fence = ? AND state = 'PROCESSING'";
    IDEM_ASSIGN_OR_RETURN(int changed, Change(*conn_, sql,
                                              {ToUnixMillis(renewed.until), ToUnixMillis(now),
                                               BytesOf(scope), BytesOf(lease.owner), lease.fence}));
    if (changed == 0) return Fenced("renew");
    return renewed;
  }

  Status Advance(const ScopeHash& scope, const Lease& lease, std::string_view point,
                 std::string_view resource_id) override {
    static const std::string sql =
        "UPDATE idem_records SET recovery_point = ?, "
        "resource_id = CASE WHEN ? = '' THEN resource_id ELSE ? END, updated_at = ? "
        "WHERE scope_hash = ? AND owner_token = ? AND fence = ? AND state = 'PROCESSING'";
    IDEM_ASSIGN_OR_RETURN(int changed, Change(*conn_, sql,
                                              {std::string(point), std::string(resource_id),
                                               std::string(resource_id), ToUnixMillis(clock_.Now()),
                                               BytesOf(scope), BytesOf(lease.owner), lease.fence}));
    if (changed == 0) return Fenced("advance");
    return Ok();
  }

  Status Finish(const ScopeHash& scope, const Lease& lease, const Outcome& outcome) override {
    IDEM_CHECK(outcome.state != RecordState::kProcessing);
    static const std::string sql =
        "UPDATE idem_records SET state = ?, status_code = ?, response = ?, "
        "recovery_point = CASE WHEN ? = '' THEN recovery_point ELSE ? END, updated_at = ? "
        "WHERE scope_hash = ? AND owner_token = ? AND fence = ? AND state = 'PROCESSING'";
    SqlValue response =
        outcome.sealed_response.empty() ? SqlValue{} : SqlValue{Blob{outcome.sealed_response}};
    IDEM_ASSIGN_OR_RETURN(
        int changed,
        Change(*conn_, sql,
               {std::string(RecordStateName(outcome.state)), int64_t{outcome.status_code},
                std::move(response), outcome.recovery_point, outcome.recovery_point,
                ToUnixMillis(clock_.Now()), BytesOf(scope), BytesOf(lease.owner), lease.fence}));
    if (changed == 0) return Fenced("finish");
    return Ok();
  }

  Result<std::optional<Record>> Get(const ScopeHash& scope) override {
    return GetRecord(*conn_, scope);
  }

  Result<int64_t> Count(std::string_view tenant, std::string_view user,
                        std::optional<RecordState> state, int64_t limit) override {
    return CountRecords(*conn_, tenant, user, state, limit);
  }

  Result<std::vector<SqlRow>> Exec(std::string_view sql,
                                   const std::vector<SqlValue>& params) override {
    IDEM_ASSIGN_OR_RETURN(sqlite3_stmt * raw, conn_->Prepare(sql));
    if (sqlite3_bind_parameter_count(raw) != static_cast<int>(params.size())) {
      return MakeError(Errc::kInvalidArgument,
                       "exec: statement takes " +
                           std::to_string(sqlite3_bind_parameter_count(raw)) + " parameters, got " +
                           std::to_string(params.size()));
    }
    Statement stmt(*conn_, raw);
    for (const SqlValue& p : params) stmt.Bind(p);
    return stmt.Run();
  }

  Status Commit() override {
    IDEM_CHECK(!finished_);
    Status s = conn_->Script("COMMIT");
    if (!s) return s;  // still open: the destructor rolls back
    finished_ = true;
    return Ok();
  }

  static Result<int64_t> CountRecords(Connection& conn, std::string_view tenant,
                                      std::string_view user, std::optional<RecordState> state,
                                      int64_t limit) {
    static const std::string any_sql =
        "SELECT count(*) FROM (SELECT 1 FROM idem_records WHERE tenant = ? AND user_id = ? "
        "LIMIT ?)";
    static const std::string state_sql =
        "SELECT count(*) FROM (SELECT 1 FROM idem_records WHERE tenant = ? AND user_id = ? AND "
        "state = ? LIMIT ?)";
    std::vector<SqlValue> params{std::string(tenant), std::string(user)};
    if (state) params.emplace_back(std::string(RecordStateName(*state)));
    params.emplace_back(limit);
    IDEM_ASSIGN_OR_RETURN(sqlite3_stmt * raw, conn.Prepare(state ? state_sql : any_sql));
    Statement stmt(conn, raw);
    for (const SqlValue& p : params) stmt.Bind(p);
    IDEM_ASSIGN_OR_RETURN(auto rows, stmt.Run());
    return SingleInteger(rows, "count");
  }

 private:
  Record NewRecord(const ClaimSpec& spec, Timestamp now, int64_t fence) {
    return store_internal::NewRecord(spec, now, fence, random_);
  }

  PooledConnection conn_;
  Clock& clock_;
  Random& random_;
  bool finished_ = false;
};

// ---- Store ---------------------------------------------------------------------------------

class SqliteStore final : public Store {
 public:
  SqliteStore(std::unique_ptr<Pool> writer, std::unique_ptr<Pool> readers,
              const SqliteStoreOptions& options, Clock& clock, Random& random)
      : writer_(std::move(writer)),
        readers_(std::move(readers)),
        options_(options),
        clock_(clock),
        random_(random) {
    caps_.name = "sqlite";
    caps_.shared_across_processes = true;
    caps_.durable = true;
  }

  const StoreCapabilities& capabilities() const override { return caps_; }

  Result<std::unique_ptr<StoreTxn>> Begin() override {
    IDEM_ASSIGN_OR_RETURN(PooledConnection conn, Lend(*writer_));
    auto txn = std::make_unique<SqliteTxn>(std::move(conn), clock_, random_);
    Status s = txn->BeginImmediate();
    if (!s) {
      // Never opened: nothing to roll back, but the destructor's ROLLBACK is harmless.
      return std::move(s).error();
    }
    return std::unique_ptr<StoreTxn>(std::move(txn));
  }

  Result<std::optional<Record>> Read(const ScopeHash& scope) override {
    IDEM_ASSIGN_OR_RETURN(PooledConnection conn, Lend(*readers_));
    return GetRecord(*conn, scope);
  }

  Result<std::vector<SqlRow>> Query(std::string_view sql,
                                    const std::vector<SqlValue>& params) override {
    IDEM_ASSIGN_OR_RETURN(PooledConnection conn, Lend(*readers_));
    IDEM_ASSIGN_OR_RETURN(sqlite3_stmt * raw, conn->Prepare(sql));
    if (sqlite3_stmt_readonly(raw) == 0) {
      return MakeError(Errc::kInvalidArgument, "query: statement is not read-only");
    }
    if (sqlite3_bind_parameter_count(raw) != static_cast<int>(params.size())) {
      return MakeError(Errc::kInvalidArgument, "query: wrong number of parameters");
    }
    Statement stmt(*conn, raw);
    for (const SqlValue& p : params) stmt.Bind(p);
    return stmt.Run();
  }

  Result<std::vector<Record>> ListStale(int limit) override {
    static const std::string sql = "SELECT " + std::string(kRecordColumns) +
                                   " FROM idem_records WHERE state = 'PROCESSING' AND "
                                   "lease_until < ? ORDER BY lease_until LIMIT ?";
    IDEM_ASSIGN_OR_RETURN(PooledConnection conn, Lend(*readers_));
    IDEM_ASSIGN_OR_RETURN(sqlite3_stmt * raw, conn->Prepare(sql));
    Statement stmt(*conn, raw);
    stmt.Bind(ToUnixMillis(clock_.Now())).Bind(int64_t{limit});
    IDEM_ASSIGN_OR_RETURN(auto rows, stmt.Run());
    std::vector<Record> records;
    for (const SqlRow& row : rows) {
      IDEM_ASSIGN_OR_RETURN(Record r, RecordFromRow(row));
      records.push_back(std::move(r));
    }
    return records;
  }

  Result<int> Sweep(int batch) override {
    IDEM_ASSIGN_OR_RETURN(auto txn, Begin());
    static const std::string sql =
        "DELETE FROM idem_records WHERE scope_hash IN (SELECT scope_hash FROM idem_records "
        "WHERE expires_at <= ? AND state <> 'PROCESSING' ORDER BY expires_at LIMIT ?)";
    IDEM_RETURN_IF_ERROR(txn->Exec(sql, {ToUnixMillis(clock_.Now()), int64_t{batch}}));
    // Exec does not report changes; SQLite's changes() does, for the statement just run.
    IDEM_ASSIGN_OR_RETURN(auto rows, txn->Exec("SELECT changes()"));
    IDEM_ASSIGN_OR_RETURN(int64_t deleted, SingleInteger(rows, "sweep"));
    IDEM_RETURN_IF_ERROR(txn->Commit());
    return static_cast<int>(deleted);
  }

 private:
  Result<PooledConnection> Lend(Pool& pool) {
    return store_internal::Borrow(pool, options_.pool_wait);
  }

  // SQLite admits one writer at a time, so this process queues its writers on one connection in
  // memory instead of spinning in SQLite's busy handler; other processes still meet the file lock.
  std::unique_ptr<Pool> writer_;
  std::unique_ptr<Pool> readers_;
  SqliteStoreOptions options_;
  Clock& clock_;
  Random& random_;
  StoreCapabilities caps_;
};

// Applies the pending migrations of one component inside the caller's IMMEDIATE transaction.
Status Migrate(Connection& conn, std::string_view component,
               const std::vector<Migration>& migrations, int64_t now_ms) {
  IDEM_ASSIGN_OR_RETURN(sqlite3_stmt * raw,
                        conn.Prepare("SELECT coalesce(max(version), 0) FROM idem_schema "
                                     "WHERE component = ?"));
  int64_t current = 0;
  {
    Statement stmt(conn, raw);
    IDEM_ASSIGN_OR_RETURN(auto rows, stmt.Bind(std::string(component)).Run());
    IDEM_ASSIGN_OR_RETURN(current, SingleInteger(rows, "schema version"));
  }
  return store_internal::ApplyMigrations(
      component, migrations, current, [&](const std::string& sql) { return conn.Script(sql); },
      [&](int version) -> Status {
        IDEM_RETURN_IF_ERROR(Change(conn,
                                    "INSERT INTO idem_schema (component, version, applied_at) "
                                    "VALUES (?, ?, ?)",
                                    {std::string(component), int64_t{version}, now_ms}));
        return Ok();
      });
}

// SqliteStoreOptions::apply_migrations = false: checks libidem's schema on a connection of its
// own that neither creates the file nor writes to it.
Status CheckSchema(const SqliteStoreOptions& options) {
  const std::string none =
      "sqlite: " + options.path + " has no idem schema; start idemd once to create it";
  std::error_code ec;
  if (!std::filesystem::exists(options.path, ec)) return MakeError(Errc::kInvalidArgument, none);
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(options.path.c_str(), &raw,
                                 SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr);
  std::unique_ptr<sqlite3, int (*)(sqlite3*)> db(raw, sqlite3_close_v2);
  if (rc != SQLITE_OK) return SqliteError(db.get(), rc, "open " + options.path);
  sqlite3_busy_timeout(db.get(), static_cast<int>(options.busy_timeout.count()));
  auto integer = [&](const char* sql) -> Result<int64_t> {
    sqlite3_stmt* stmt = nullptr;
    int step = sqlite3_prepare_v2(db.get(), sql, -1, &stmt, nullptr);
    if (step == SQLITE_OK) step = sqlite3_step(stmt);
    const int64_t value = step == SQLITE_ROW ? sqlite3_column_int64(stmt, 0) : 0;
    sqlite3_finalize(stmt);
    if (step != SQLITE_ROW) return SqliteError(db.get(), step, "schema check");
    return value;
  };
  IDEM_ASSIGN_OR_RETURN(int64_t tables, integer("SELECT count(*) FROM sqlite_master "
                                                "WHERE type = 'table' AND name = 'idem_schema'"));
  if (tables == 0) return MakeError(Errc::kInvalidArgument, none);
  IDEM_ASSIGN_OR_RETURN(int64_t current, integer("SELECT coalesce(max(version), 0) FROM "
                                                 "idem_schema WHERE component = 'idem'"));
  if (current == 0) return MakeError(Errc::kInvalidArgument, none);
  const int64_t known = CoreMigrations().back().version;
  if (current > known) {
    return MakeError(Errc::kDataLoss, "sqlite: schema of 'idem' is at version " +
                                          std::to_string(current) + ", newer than this build (" +
                                          std::to_string(known) + ")");
  }
  return Ok();
}

}  // namespace

Result<std::unique_ptr<Store>> OpenSqliteStore(const SqliteStoreOptions& options, Clock& clock,
                                               Random& random) {
  if (options.path.empty()) return MakeError(Errc::kInvalidArgument, "sqlite: empty path");
  if (options.pool_size < 1 || options.pool_size > 64) {
    return MakeError(Errc::kInvalidArgument, "sqlite: pool_size must be 1..64");
  }
  if (!options.app_migrations.empty() &&
      (options.app_name.empty() || options.app_name == kComponent)) {
    return MakeError(Errc::kInvalidArgument, "sqlite: app migrations need an app_name");
  }
  if (!options.apply_migrations) IDEM_RETURN_IF_ERROR(CheckSchema(options));
  std::vector<std::unique_ptr<Connection>> conns;
  for (int i = 0; i < options.pool_size + 1; ++i) {
    auto conn = std::make_unique<Connection>();
    IDEM_RETURN_IF_ERROR(conn->Open(options));
    conns.push_back(std::move(conn));
  }
  Connection& first = *conns.front();
  Status migrated = !options.apply_migrations ? Ok() : [&]() -> Status {
    IDEM_RETURN_IF_ERROR(first.Script("BEGIN IMMEDIATE"));
    IDEM_RETURN_IF_ERROR(
        first.Script("CREATE TABLE IF NOT EXISTS idem_schema (component TEXT NOT NULL, "
                     "version INTEGER NOT NULL, applied_at INTEGER NOT NULL, "
                     "PRIMARY KEY (component, version))"));
    const int64_t now_ms = ToUnixMillis(clock.Now());
    IDEM_RETURN_IF_ERROR(Migrate(first, kComponent, CoreMigrations(), now_ms));
    if (!options.app_migrations.empty()) {
      IDEM_RETURN_IF_ERROR(Migrate(first, options.app_name, options.app_migrations, now_ms));
    }
    return first.Script("COMMIT");
  }();
  if (!migrated) {
    (void)first.Script("ROLLBACK");
    return std::move(migrated).error();
  }
  std::vector<std::unique_ptr<Connection>> writer;
  writer.push_back(std::move(conns.front()));
  conns.erase(conns.begin());
  return std::unique_ptr<Store>(std::make_unique<SqliteStore>(
      std::make_unique<Pool>("sqlite", std::move(writer)),
      std::make_unique<Pool>("sqlite", std::move(conns)), options, clock, random));
}

}  // namespace idem
