// src/store/sqlite/sqlite_store.cc — the SQLite Store: WAL, one writer connection and a pool of
// readers, BEGIN IMMEDIATE for every write transaction, per-connection prepared statements, typed
// columns. The SQL text and the record operations are the shared ones of src/store/sql.h.
#include <sqlite3.h>

#include <unordered_map>

#include "idem/mutex.h"
#include "idem/store/sqlite.h"
#include "src/store/pool.h"
#include "src/store/sql.h"

namespace idem {
namespace {

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
    case SQLITE_MISMATCH:
    case SQLITE_RANGE:
      return MakeError(Errc::kInvalidArgument, std::move(message));
    case SQLITE_TOOBIG:
      return MakeError(Errc::kTooLarge, std::move(message));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return MakeError(Errc::kDataLoss, std::move(message));
    default:
      return MakeError(Errc::kInternal, std::move(message));
  }
}

using store_internal::RecordSql;
using store_internal::SqlRunner;
using store_internal::SqlTxn;
using store_internal::StoreTime;

const RecordSql& Sql() {
  static const RecordSql kSql(store_internal::SqliteDialect());
  return kSql;
}

// Whether a column's declared type says it holds an instant (Unix milliseconds).
bool DeclaredTimestamp(const char* decltype_name) {
  if (decltype_name == nullptr) return false;
  return sqlite3_strnicmp(decltype_name, "TIMESTAMP", 9) == 0;
}

// ---- One connection with its statement cache -------------------------------------------------

class Connection final : public SqlRunner {
 public:
  Connection() = default;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection() override {
    for (auto& [sql, stmt] : statements_) sqlite3_finalize(stmt);
    if (db_ != nullptr) sqlite3_close_v2(db_);
  }

  Status Open(const SqliteStoreOptions& options) {
    // Without migrations the file must exist already: nothing is created.
    const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX |
                      (options.apply_migrations ? SQLITE_OPEN_CREATE : 0);
    int rc = sqlite3_open_v2(options.path.c_str(), &db_, flags, nullptr);
    if (rc == SQLITE_CANTOPEN && !options.apply_migrations) {
      return MakeError(Errc::kInvalidArgument, "sqlite: cannot open " + options.path +
                                                   ": no such database; start idemd once to "
                                                   "create it");
    }
    if (rc != SQLITE_OK) return SqliteError(db_, rc, "open " + options.path);
    sqlite3_extended_result_codes(db_, 1);
    sqlite3_busy_timeout(db_, static_cast<int>(options.busy_timeout.count()));
    if (options.apply_migrations) IDEM_RETURN_IF_ERROR(Script("PRAGMA journal_mode=WAL"));
    IDEM_RETURN_IF_ERROR(
        Script(options.synchronous_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"));
    IDEM_RETURN_IF_ERROR(Script("PRAGMA foreign_keys=ON"));
    return Ok();
  }

  // SQLite connections do not break the way network connections do.
  bool Broken() const { return false; }

  sqlite3* Handle() const { return db_; }

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

  Result<std::vector<SqlRow>> Run(std::string_view sql, const std::vector<SqlValue>& params,
                                  int* changed) override {
    IDEM_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, Prepare(sql));
    return Step(stmt, params, changed);
  }

  // Binds `params` to a prepared statement and steps it to completion, collecting rows.
  Result<std::vector<SqlRow>> Step(sqlite3_stmt* stmt, const std::vector<SqlValue>& params,
                                   int* changed) {
    struct Reset {
      sqlite3_stmt* stmt;
      ~Reset() { sqlite3_reset(stmt); }
    } reset{stmt};
    IDEM_RETURN_IF_ERROR(store_internal::CheckParameterCount(
        "sql", sqlite3_bind_parameter_count(stmt), params.size()));
    for (std::size_t i = 0; i < params.size(); ++i) {
      IDEM_RETURN_IF_ERROR(Bind(stmt, static_cast<int>(i) + 1, params[i]));
    }
    std::vector<SqlRow> rows;
    while (true) {
      const int rc = sqlite3_step(stmt);
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return SqliteError(db_, rc, "step");
      SqlRow row;
      const int n = sqlite3_column_count(stmt);
      row.reserve(static_cast<std::size_t>(n));
      for (int c = 0; c < n; ++c) row.push_back(Column(stmt, c));
      rows.push_back(std::move(row));
    }
    if (changed != nullptr) *changed = sqlite3_changes(db_);
    return rows;
  }

 private:
  static constexpr std::size_t kMaxCachedStatements = 256;

  Status Bind(sqlite3_stmt* stmt, int i, const SqlValue& v) {
    int rc = SQLITE_OK;
    if (std::holds_alternative<std::monostate>(v)) {
      rc = sqlite3_bind_null(stmt, i);
    } else if (const int64_t* n = std::get_if<int64_t>(&v)) {
      rc = sqlite3_bind_int64(stmt, i, *n);
    } else if (const double* d = std::get_if<double>(&v)) {
      rc = sqlite3_bind_double(stmt, i, *d);
    } else if (const std::string* s = std::get_if<std::string>(&v)) {
      rc = sqlite3_bind_text64(stmt, i, s->data(), s->size(), SQLITE_TRANSIENT, SQLITE_UTF8);
    } else if (const Blob* b = std::get_if<Blob>(&v)) {
      rc = sqlite3_bind_blob64(stmt, i, b->bytes.data(), b->bytes.size(), SQLITE_TRANSIENT);
    } else {
      rc = sqlite3_bind_int64(stmt, i, ToUnixMillis(std::get<Timestamp>(v)));
    }
    if (rc != SQLITE_OK) return SqliteError(db_, rc, "bind");
    return Ok();
  }

  static SqlValue Column(sqlite3_stmt* stmt, int c) {
    switch (sqlite3_column_type(stmt, c)) {
      case SQLITE_INTEGER: {
        const int64_t n = sqlite3_column_int64(stmt, c);
        if (DeclaredTimestamp(sqlite3_column_decltype(stmt, c))) return FromUnixMillis(n);
        return n;
      }
      case SQLITE_FLOAT:
        return sqlite3_column_double(stmt, c);
      case SQLITE_TEXT: {
        auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt, c));
        return std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(stmt, c)));
      }
      case SQLITE_BLOB: {
        auto* p = static_cast<const char*>(sqlite3_column_blob(stmt, c));
        return Blob{
            std::string(p ? p : "", static_cast<std::size_t>(sqlite3_column_bytes(stmt, c)))};
      }
      default:
        return std::monostate{};
    }
  }

  sqlite3* db_ = nullptr;
  std::unordered_map<std::string, sqlite3_stmt*> statements_;
};

using Pool = store_internal::Pool<Connection>;
using PooledConnection = store_internal::Lent<Connection>;

// ---- Group commit ----------------------------------------------------------------------------

// The writer connection of this process, shared by all its write transactions. Each transaction
// runs in a savepoint inside one SQLite transaction, which stays open while other transactions
// wait to write: a group. The group commits when its last member leaves and nobody is waiting (or
// max_group have joined), so one WAL append and one sync serve the whole group. A member's Commit
// answers only after the group's COMMIT, with its result: nothing is acknowledged before it is
// durable, and a member that read another's writes learns at its Commit whether they held.
class WriteGroups {
 public:
  // What members of one group learn when it ends. Under mu_, which a GUARDED_BY in Group cannot
  // name.
  struct Group {
    bool done = false;
    Status status = Ok();
  };

  WriteGroups(std::unique_ptr<Connection> conn, Millis wait, int max_group)
      : conn_(std::move(conn)), wait_(wait), max_group_(max_group) {}

  // Lends the connection (waiting up to `wait`), inside a savepoint of the open group; opens one
  // with BEGIN IMMEDIATE when none is. Errors: kUnavailable (no turn within the wait; the file
  // locked by another process).
  Result<std::shared_ptr<Group>> Join() {
    MutexLock lock(mu_);
    ++waiting_;
    const bool turn = free_.WaitFor(mu_, wait_, [&]() IDEM_REQUIRES(mu_) { return !held_; });
    --waiting_;
    // A waiter that gives up leaves the group to whoever holds the connection: its Leave sees
    // the waiter gone and commits.
    if (!turn) {
      return MakeError(Errc::kUnavailable,
                       "sqlite: no turn to write within " + std::to_string(wait_.count()) + " ms");
    }
    held_ = true;
    if (!open_) {
      lock.Unlock();
      Status begun = conn_->Script("BEGIN IMMEDIATE");
      lock.Lock();
      if (!begun) {
        PassOn();
        return std::move(begun).error();
      }
      open_ = std::make_shared<Group>();
      members_ = 0;
    }
    ++members_;
    std::shared_ptr<Group> group = open_;
    lock.Unlock();
    if (Status saved = conn_->Script("SAVEPOINT idem_member"); !saved) {
      (void)Leave(group, /*keep=*/false);
      return std::move(saved).error();
    }
    return group;
  }

  // Ends the holder's member of `group`: keeps its writes in the group (`keep`) or undoes them,
  // and commits the group when nobody waits to join it. Returns, for a kept member, the group's
  // commit status once it is known: kUnavailable when nothing was committed.
  Status Leave(const std::shared_ptr<Group>& group, bool keep) {
    Status ended = InTransaction() ? End(keep) : Ok();
    MutexLock lock(mu_);
    if (!InTransaction()) {
      // SQLite rolled the whole transaction back (SQLITE_FULL, an I/O error, ...): every
      // member's writes are gone.
      Finish(*group, MakeError(Errc::kUnavailable,
                               "sqlite: the write transaction was rolled back by the database; "
                               "nothing was committed"));
      PassOn();
      return keep ? group->status : Ok();
    }
    if (!ended) keep = false;  // its writes are undone (End), the group goes on
    if (waiting_ > 0 && members_ < max_group_) {
      PassOn();  // the next member joins the open group; the last one commits it
      if (!keep) return ended;
      done_.Wait(mu_, [&] { return group->done; });
      return group->status;
    }
    lock.Unlock();
    Status committed = conn_->Script("COMMIT");
    if (!committed) {
      if (InTransaction()) (void)conn_->Script("ROLLBACK");
      committed =
          MakeError(Errc::kUnavailable, "nothing was committed: " + committed.error().message);
    }
    lock.Lock();
    Finish(*group, std::move(committed));
    PassOn();
    if (!ended) return ended;
    return keep ? group->status : Ok();
  }

  Connection& Conn() const { return *conn_; }

  // Whether the group's SQLite transaction is open; false once SQLite rolled it back.
  bool InTransaction() const { return sqlite3_get_autocommit(conn_->Handle()) == 0; }

 private:
  // Releases the member's savepoint (its writes join the group) or rolls back to it.
  Status End(bool keep) {
    if (keep) {
      Status released = conn_->Script("RELEASE idem_member");
      if (released) return released;
      (void)End(/*keep=*/false);
      return released;
    }
    return conn_->Script("ROLLBACK TO idem_member; RELEASE idem_member");
  }

  // The group is over with `status`; its members are told.
  void Finish(Group& group, Status status) IDEM_REQUIRES(mu_) {
    group.done = true;
    group.status = std::move(status);
    if (open_.get() == &group) open_.reset();
    members_ = 0;
    done_.NotifyAll();
  }

  // Gives the connection up, to a waiter if any.
  void PassOn() IDEM_REQUIRES(mu_) {
    held_ = false;
    free_.NotifyOne();
  }

  std::unique_ptr<Connection> conn_;
  const Millis wait_;
  const int max_group_;
  Mutex mu_;
  CondVar free_;  // the connection was given up
  CondVar done_;  // a group ended
  // A member (or a committing leader) uses the connection: conn_ is then its own, without mu_.
  bool held_ IDEM_GUARDED_BY(mu_) = false;
  int waiting_ IDEM_GUARDED_BY(mu_) = 0;              // Join calls waiting for their turn
  int members_ IDEM_GUARDED_BY(mu_) = 0;              // members of the open group so far
  std::shared_ptr<Group> open_ IDEM_GUARDED_BY(mu_);  // the open group; null outside a transaction
};

// ---- Transaction ---------------------------------------------------------------------------

// One member of a write group: BEGIN IMMEDIATE holds the database's write lock from the group's
// start, so claims never upgrade a read lock and quota counts need no lock of their own.
class SqliteSession final : public store_internal::TxnSession {
 public:
  SqliteSession(WriteGroups& groups, std::shared_ptr<WriteGroups::Group> group)
      : groups_(groups), group_(std::move(group)) {}
  ~SqliteSession() override {
    if (group_) (void)groups_.Leave(group_, /*keep=*/false);
  }

  Result<std::vector<SqlRow>> Run(std::string_view sql, const std::vector<SqlValue>& params,
                                  int* changed) override {
    IDEM_RETURN_IF_ERROR(Usable());
    return groups_.Conn().Run(sql, params, changed);
  }
  // A failed statement leaves an SQLite transaction usable as it is, unless SQLite rolled it all
  // back (then every later statement fails: none runs outside the transaction).
  Result<std::vector<SqlRow>> Exec(std::string_view sql,
                                   const std::vector<SqlValue>& params) override {
    return Run(sql, params, nullptr);
  }
  Status Commit() override {
    IDEM_CHECK(group_ != nullptr);
    return groups_.Leave(std::exchange(group_, nullptr), /*keep=*/true);
  }

 private:
  Status Usable() const {
    if (group_ == nullptr) return MakeError(Errc::kInternal, "sqlite: transaction has ended");
    if (!groups_.InTransaction()) {
      return MakeError(Errc::kUnavailable,
                       "sqlite: the write transaction was rolled back by the database");
    }
    return Ok();
  }

  WriteGroups& groups_;
  std::shared_ptr<WriteGroups::Group> group_;
};

// ---- Store ---------------------------------------------------------------------------------

class SqliteStore final : public Store {
 public:
  SqliteStore(std::unique_ptr<Connection> writer, std::unique_ptr<Pool> readers,
              const SqliteStoreOptions& options, Clock& clock, Random& random)
      : writer_(std::move(writer), options.pool_wait, options.max_group),
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
    IDEM_ASSIGN_OR_RETURN(std::shared_ptr<WriteGroups::Group> group, writer_.Join());
    auto session = std::make_unique<SqliteSession>(writer_, std::move(group));
    return std::unique_ptr<StoreTxn>(
        std::make_unique<SqlTxn>(std::move(session), Sql(), StoreTime::Of(clock_), random_));
  }

  Result<std::optional<Record>> Read(const ScopeHash& scope) override {
    IDEM_ASSIGN_OR_RETURN(PooledConnection conn, Lend(*readers_));
    return store_internal::GetRecord(*conn, Sql(), StoreTime::Of(clock_), scope);
  }

  Result<std::vector<SqlRow>> Query(std::string_view sql,
                                    const std::vector<SqlValue>& params) override {
    IDEM_ASSIGN_OR_RETURN(PooledConnection conn, Lend(*readers_));
    IDEM_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, conn->Prepare(sql));
    if (sqlite3_stmt_readonly(stmt) == 0) {
      return MakeError(Errc::kInvalidArgument, "query: statement is not read-only");
    }
    return conn->Step(stmt, params, nullptr);
  }

  Result<std::vector<Record>> ListStale(std::string_view route,
                                        const std::vector<std::string>& sent_points,
                                        int limit) override {
    IDEM_ASSIGN_OR_RETURN(PooledConnection conn, Lend(*readers_));
    return store_internal::ListStaleRecords(*conn, Sql(), route, sent_points, StoreTime::Of(clock_),
                                            limit);
  }

  Result<std::vector<Record>> ListHeld(std::string_view route, int limit) override {
    IDEM_ASSIGN_OR_RETURN(PooledConnection conn, Lend(*readers_));
    return store_internal::ListHeldRecords(*conn, Sql(), route, StoreTime::Of(clock_), limit);
  }

  Result<int> Sweep(int batch, const std::vector<std::string>& sent_points) override {
    // One DELETE, a member of a write group like every write.
    IDEM_ASSIGN_OR_RETURN(std::shared_ptr<WriteGroups::Group> group, writer_.Join());
    SqliteSession session(writer_, std::move(group));
    IDEM_ASSIGN_OR_RETURN(
        int deleted,
        store_internal::SweepRecords(session, Sql(), StoreTime::Of(clock_), batch, sent_points));
    IDEM_RETURN_IF_ERROR(session.Commit());
    return deleted;
  }

  Result<RecordCensus> Census() override {
    IDEM_ASSIGN_OR_RETURN(PooledConnection conn, Lend(*readers_));
    return store_internal::CensusRecords(*conn, Sql(), StoreTime::Of(clock_));
  }

 private:
  Result<PooledConnection> Lend(Pool& pool) {
    return store_internal::Borrow(pool, options_.pool_wait);
  }

  // SQLite admits one writer at a time, so this process queues its writers on one connection in
  // memory instead of spinning in SQLite's busy handler, and commits them in groups; other
  // processes still meet the file lock.
  WriteGroups writer_;
  std::unique_ptr<Pool> readers_;
  SqliteStoreOptions options_;
  Clock& clock_;
  Random& random_;
  StoreCapabilities caps_;
};

// Creates or checks the schema on `conn`: every migration in one IMMEDIATE transaction, so
// processes opening the same file at once apply each migration once.
Status PrepareSchema(Connection& conn, const SqliteStoreOptions& options, Clock& clock) {
  if (!options.apply_migrations) return store_internal::CheckSchema(conn, Sql());
  IDEM_RETURN_IF_ERROR(conn.Script("BEGIN IMMEDIATE"));
  Status migrated = store_internal::MigrateAll(
      conn, Sql(), [&](const std::string& sql) { return conn.Script(sql); }, options.apps,
      clock.Now());
  if (migrated) migrated = conn.Script("COMMIT");
  if (!migrated) (void)conn.Script("ROLLBACK");
  return migrated;
}

}  // namespace

Result<std::unique_ptr<Store>> OpenSqliteStore(const SqliteStoreOptions& options, Clock& clock,
                                               Random& random) {
  if (options.path.empty()) return MakeError(Errc::kInvalidArgument, "sqlite: empty path");
  if (options.pool_size < 1 || options.pool_size > 64) {
    return MakeError(Errc::kInvalidArgument, "sqlite: pool_size must be 1..64");
  }
  if (options.max_group < 1 || options.max_group > 1024) {
    return MakeError(Errc::kInvalidArgument, "sqlite: max_group must be 1..1024");
  }
  if (options.write_cache_bytes < kSqliteWriteCacheMinBytes ||
      options.write_cache_bytes > kSqliteWriteCacheMaxBytes) {
    return MakeError(Errc::kInvalidArgument, "sqlite: write_cache_bytes must be 1 MiB..16 GiB");
  }
  if (options.wal_autocheckpoint_pages < 1 || options.wal_autocheckpoint_pages > 1'000'000) {
    return MakeError(Errc::kInvalidArgument, "sqlite: wal_autocheckpoint_pages must be 1..1000000");
  }
  IDEM_RETURN_IF_ERROR(store_internal::CheckAppNames("sqlite", options.apps));
  std::vector<std::unique_ptr<Connection>> conns;
  for (int i = 0; i < options.pool_size + 1; ++i) {
    auto conn = std::make_unique<Connection>();
    IDEM_RETURN_IF_ERROR(conn->Open(options));
    conns.push_back(std::move(conn));
  }
  IDEM_RETURN_IF_ERROR(PrepareSchema(*conns.front(), options, clock));
  std::unique_ptr<Connection> writer = std::move(conns.front());
  conns.erase(conns.begin());
  // Every write runs on this connection: its cache and checkpoints are the writer's alone (a
  // negative cache_size is in KiB).
  IDEM_RETURN_IF_ERROR(
      writer->Script("PRAGMA cache_size=-" + std::to_string(options.write_cache_bytes / 1024)));
  IDEM_RETURN_IF_ERROR(writer->Script("PRAGMA wal_autocheckpoint=" +
                                      std::to_string(options.wal_autocheckpoint_pages)));
  return std::unique_ptr<Store>(std::make_unique<SqliteStore>(
      std::move(writer), std::make_unique<Pool>("sqlite", std::move(conns)), options, clock,
      random));
}

}  // namespace idem
