// src/store/postgres/postgres_store.cc — the PostgreSQL Store: a bounded pool that replaces lost
// connections, transactions on them, LISTEN for completions, migrations under an advisory lock,
// a readiness ping on a connection of its own. The SQL text and the record operations are the
// shared ones of src/store/sql.h; values, deadlines and the connection (libpq in nonblocking mode
// with a deadline on every call, optional per-connection prepared statements, typed binary
// results, SQLSTATE-aware errors) are in the files postgres_internal.h names.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <thread>

#include "idem/mutex.h"
#include "idem/store/postgres.h"
#include "idem/thread_name.h"
#include "src/store/pool.h"
#include "src/store/postgres/postgres_internal.h"
#include "src/store/sql.h"

namespace idem {
namespace {

using postgres_internal::Bounded;
using postgres_internal::Bounds;
using postgres_internal::BusinessSql;
using postgres_internal::Connect;
using postgres_internal::Connection;
using postgres_internal::MillisText;
using postgres_internal::Now;
using store_internal::RecordSql;
using store_internal::SqlTxn;
using store_internal::StoreTime;

using Pool = store_internal::Pool<Connection>;
using Lent = store_internal::Lent<Connection>;

// pg_advisory_xact_lock key for migrations: "idem" in ASCII.
constexpr int64_t kMigrationLock = 0x6964656d;

// The statements, with or without the finish's notification (PostgresStoreOptions::notifications);
// they differ in nothing else.
const RecordSql& Sql(bool notify = true) {
  static const RecordSql kNotifying(store_internal::PostgresDialect(true));
  static const RecordSql kQuiet(store_internal::PostgresDialect(false));
  return notify ? kNotifying : kQuiet;
}

// ---- Transaction ---------------------------------------------------------------------------

// A pooled connection inside BEGIN (READ COMMITTED): claims conflict on the primary key, which
// waits for the other inserter; quota counts lock the principal's counter row (SqlTxn).
class PostgresSession final : public store_internal::LentSession<Connection> {
 public:
  using LentSession::LentSession;

  Result<std::vector<SqlRow>> Exec(std::string_view sql,
                                   const std::vector<SqlValue>& params) override {
    IDEM_ASSIGN_OR_RETURN(std::string numbered, BusinessSql("sql", sql, params));
    // A failed statement aborts a PostgreSQL transaction; a savepoint keeps this one usable, so
    // the caller can decide from the existing row after a unique violation. The savepoint, the
    // statement and its release go in one round trip.
    std::vector<store_internal::SqlStep> steps(3);
    steps[0] = {"SAVEPOINT idem_exec", {}, false};
    steps[1].sql = numbered;
    steps[1].params = params;
    steps[2] = {"RELEASE SAVEPOINT idem_exec", {}, false};
    if (Status run = RunAll(steps); !run) {
      if (conn_ && !conn_->Broken()) (void)conn_->Script("ROLLBACK TO SAVEPOINT idem_exec");
      return std::move(run).error();
    }
    return std::move(steps[1].rows);
  }

  Status Commit() override { return CommitOnce(); }
};

// LISTENs on its own connection (not the pool's) on a thread, reconnecting with back-off. Its
// connection has the pool's bounds and keepalives, so a vanished server is noticed and left.
class FinishedListener final : public Subscription {
 public:
  FinishedListener(PostgresStoreOptions options, std::function<void(const ScopeHash&)> on_finished)
      : options_(std::move(options)), on_finished_(std::move(on_finished)), thread_([this] {
          NameThisThread("pg-listener");
          Run();
        }) {}
  ~FinishedListener() override {
    stop_ = true;
    thread_.join();
  }

 private:
  void Run() {
    auto backoff = std::chrono::milliseconds(100);
    while (!stop_) {
      auto conn =
          Connect(ListenerOptions(), Bounded(options_.timeouts), Now() + options_.timeouts.connect);
      if (conn && (*conn)->Script("LISTEN idem_finished")) {
        backoff = std::chrono::milliseconds(100);
        Listen(**conn);
      }
      for (auto waited = std::chrono::milliseconds(0); waited < backoff && !stop_;
           waited += std::chrono::milliseconds(50)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
    }
  }

  PostgresStoreOptions ListenerOptions() const {
    PostgresStoreOptions listener = options_;
    if (!listener.listen_conninfo.empty()) listener.conninfo = listener.listen_conninfo;
    listener.prepared_statements = false;
    return listener;
  }

  // Until stopped or the connection fails.
  void Listen(Connection& conn) {
    auto on_notify = [&](std::string_view hex) {
      if (hex.size() != 64) return;
      ScopeHash scope{};
      bool ok = true;
      for (std::size_t i = 0; i < 32; ++i) {
        auto nibble = [&](char c) -> int {
          return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        };
        const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
        ok &= hi >= 0 && lo >= 0;
        scope[i] = static_cast<uint8_t>((hi << 4) | (lo & 0xf));
      }
      if (ok) on_finished_(scope);
    };
    while (!stop_ && conn.ConsumeNotifications(std::chrono::milliseconds(200), on_notify)) {
    }
  }

  PostgresStoreOptions options_;
  std::function<void(const ScopeHash&)> on_finished_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class PostgresStore final : public Store {
 public:
  PostgresStore(std::unique_ptr<Pool> pool, PostgresStoreOptions options, StoreTime time,
                Random& random)
      : pool_(std::move(pool)), options_(std::move(options)), time_(time), random_(random) {
    caps_.name = "postgres";
    caps_.shared_across_processes = true;
    caps_.durable = true;
    caps_.notifications = options_.notifications;
  }

  const StoreCapabilities& capabilities() const override { return caps_; }

  Result<std::unique_ptr<Subscription>> SubscribeFinished(
      std::function<void(const ScopeHash&)> on_finished) override {
    if (!options_.notifications) return Store::SubscribeFinished(std::move(on_finished));
    return std::unique_ptr<Subscription>(
        std::make_unique<FinishedListener>(options_, std::move(on_finished)));
  }

  // On a connection of its own, made when needed, so that readiness reflects the server rather
  // than how busy the pool is; the connection's statement_timeout is the ping's timeout, and the
  // whole ping — waiting for a concurrent one, connecting, SELECT 1 — has one deadline. A
  // connection that missed it is dropped and made again by the next ping.
  Status Ping(Millis timeout) override {
    const SteadyTime deadline = Now() + timeout;
    // One ping at a time on the ping connection; a concurrent one waits until the deadline. (A
    // flag under a condition variable rather than std::timed_mutex, whose timed lock
    // ThreadSanitizer cannot follow.)
    {
      MutexLock lock(ping_mu_);
      if (!ping_cv_.WaitUntil(ping_mu_, deadline,
                              [&]() IDEM_REQUIRES(ping_mu_) { return !pinging_; })) {
        return MakeError(Errc::kUnavailable,
                         "postgres ping: no answer within " + MillisText(timeout));
      }
      pinging_ = true;
    }
    struct Done {
      PostgresStore* store;
      ~Done() {
        {
          MutexLock lock(store->ping_mu_);
          store->pinging_ = false;
        }
        store->ping_cv_.NotifyOne();
      }
    } done{this};
    if (ping_ != nullptr && ping_->Broken()) ping_.reset();
    if (ping_ == nullptr) {
      auto conn = Connect(options_, Bounds{timeout, timeout, Millis(0), timeout}, deadline);
      if (!conn) return std::move(conn).error();
      ping_ = std::move(*conn);
    }
    Status pong = ping_->ScriptBy("SELECT 1", deadline);
    if (!pong) {
      if (ping_->Broken()) ping_.reset();
      return MakeError(Errc::kUnavailable, "postgres ping: " + pong.error().message);
    }
    return Ok();
  }

  // BEGIN goes with the transaction's first statements (LentSession), which also try a fresh
  // connection when the one lent died while idle.
  Result<std::unique_ptr<StoreTxn>> Begin() override {
    IDEM_ASSIGN_OR_RETURN(Lent conn, store_internal::Borrow(*pool_, options_.pool_wait));
    auto session = std::make_unique<PostgresSession>(std::move(conn), "BEGIN", options_.max_retries,
                                                     options_.pool_wait);
    return std::unique_ptr<StoreTxn>(
        std::make_unique<SqlTxn>(std::move(session), Sql(options_.notifications), time_, random_));
  }

  Result<std::optional<Record>> Read(const ScopeHash& scope) override {
    return Retrying(
        [&](Connection& c) { return store_internal::GetRecord(c, Sql(), time_, scope); });
  }

  Result<std::vector<SqlRow>> Query(std::string_view sql,
                                    const std::vector<SqlValue>& params) override {
    IDEM_ASSIGN_OR_RETURN(std::string numbered, BusinessSql("sql", sql, params));
    return Retrying([&](Connection& c) -> Result<std::vector<SqlRow>> {
      // A read-only transaction makes the server refuse writes.
      IDEM_RETURN_IF_ERROR(c.Script("BEGIN READ ONLY"));
      auto rows = c.Run(numbered, params, nullptr);
      if (!c.Broken()) (void)c.Script(rows ? "COMMIT" : "ROLLBACK");
      if (!rows && c.LastSqlstate() == "25006") {
        return MakeError(Errc::kInvalidArgument, "query: statement is not read-only");
      }
      return rows;
    });
  }

  Result<std::vector<Record>> ListStale(std::string_view route,
                                        const std::vector<std::string>& sent_points,
                                        int limit) override {
    return Retrying([&](Connection& c) {
      return store_internal::ListStaleRecords(c, Sql(), route, sent_points, time_, limit);
    });
  }

  Result<std::vector<Record>> ListHeld(std::string_view route, int limit) override {
    return Retrying([&](Connection& c) {
      return store_internal::ListHeldRecords(c, Sql(), route, time_, limit);
    });
  }

  Result<int> Sweep(int batch, const std::vector<std::string>& sent_points) override {
    return Retrying([&](Connection& c) {
      return store_internal::SweepRecords(c, Sql(), time_, batch, sent_points);
    });
  }

  Result<RecordCensus> Census() override {
    return Retrying([&](Connection& c) { return store_internal::CensusRecords(c, Sql(), time_); });
  }

 private:
  // Runs a single-statement operation (autocommit), retrying serialisation failures, deadlocks
  // and connections that were lost: these statements are idempotent reads or deletes. Timeouts
  // are not retried: the server is stalled or overloaded, and each attempt would wait again.
  template <typename F>
  auto Retrying(F&& op) -> decltype(op(std::declval<Connection&>())) {
    for (int attempt = 0;; ++attempt) {
      auto lent = store_internal::Borrow(*pool_, options_.pool_wait);
      if (!lent) return std::move(lent).error();
      (*lent)->ClearTimedOut();
      auto result = op(**lent);
      if (result || result.error().code != Errc::kUnavailable || (*lent)->TimedOut() ||
          attempt >= options_.max_retries) {
        return result;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5 << attempt));
    }
  }

  std::unique_ptr<Pool> pool_;
  PostgresStoreOptions options_;
  StoreTime time_;
  Random& random_;
  StoreCapabilities caps_;
  Mutex ping_mu_;
  CondVar ping_cv_;
  bool pinging_ IDEM_GUARDED_BY(ping_mu_) = false;
  std::unique_ptr<Connection> ping_;  // used only by the one ping that set pinging_
};

bool ValidSchemaName(const std::string& s) {
  return !s.empty() && s.size() <= 63 &&
         s.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
}

// Creates or checks the schema in one transaction on a connection of its own. Migrating takes a
// database-wide advisory lock inside that transaction, so instances that start at once apply each
// migration once, and the lock ends with the transaction: behind a transaction pooler
// (PgBouncer), whose server sessions change between transactions, a session-level lock could be
// released on another session than the one that holds it and stay held. Every setting is local
// to the transaction for the same reason. Migrating has no statement, lock or answer bound: a
// long migration must not be cancelled, and instances wait for each other's.
Status PrepareSchema(const PostgresStoreOptions& options, Clock& clock) {
  PostgresStoreOptions plain = options;
  plain.schema = "public";
  plain.prepared_statements = false;
  Bounds bounds = Bounded(options.timeouts);
  if (options.apply_migrations) bounds.answer = std::nullopt;
  IDEM_ASSIGN_OR_RETURN(auto conn, Connect(plain, bounds, Now() + options.timeouts.connect));
  IDEM_RETURN_IF_ERROR(conn->Script("BEGIN"));
  Status prepared = [&]() -> Status {
    if (options.schema != "public") {
      IDEM_RETURN_IF_ERROR(
          conn->Run("SELECT set_config('search_path', $1, true)", {options.schema}, nullptr));
    }
    if (!options.apply_migrations) return store_internal::CheckSchema(*conn, Sql());
    IDEM_RETURN_IF_ERROR(conn->Script(
        "SELECT set_config('statement_timeout', '0', true), set_config('lock_timeout', '0', true), "
        "set_config('idle_in_transaction_session_timeout', '0', true)"));
    IDEM_RETURN_IF_ERROR(conn->Run("SELECT pg_advisory_xact_lock($1)", {kMigrationLock}, nullptr));
    if (options.schema != "public") {
      IDEM_RETURN_IF_ERROR(conn->Script("CREATE SCHEMA IF NOT EXISTS " + options.schema));
    }
    return store_internal::MigrateAll(
        *conn, Sql(), [&](const std::string& sql) { return conn->Script(sql); }, options.apps,
        clock.Now());
  }();
  if (!prepared) {
    (void)conn->Script("ROLLBACK");
    return prepared;
  }
  return conn->Script("COMMIT");
}

}  // namespace

Status ValidatePostgresTimeouts(const PostgresTimeouts& t) {
  constexpr Millis kLongest{3'600'000};
  for (const auto& [name, value] : {std::pair{"connect", t.connect},
                                    {"statement", t.statement},
                                    {"lock", t.lock},
                                    {"idle_in_transaction", t.idle_in_transaction}}) {
    if (value < Millis(1) || value > kLongest) {
      return MakeError(Errc::kInvalidArgument, std::string("postgres: the ") + name +
                                                   " timeout must be 1.." +
                                                   std::to_string(kLongest.count()) + " ms");
    }
  }
  if (t.lock > t.statement) {
    return MakeError(Errc::kInvalidArgument,
                     "postgres: the lock timeout must not be longer than the statement timeout");
  }
  for (const auto& [name, value] : {std::pair{"keepalives_idle", t.keepalives_idle},
                                    {"keepalives_interval", t.keepalives_interval}}) {
    if (value.count() < 1 || value.count() > 32767) {
      return MakeError(Errc::kInvalidArgument,
                       std::string("postgres: ") + name + " must be 1..32767 s");
    }
  }
  if (t.keepalives_count < 1 || t.keepalives_count > 127) {
    return MakeError(Errc::kInvalidArgument, "postgres: keepalives_count must be 1..127");
  }
  return Ok();
}

namespace {

Result<std::unique_ptr<Store>> Open(const PostgresStoreOptions& options, StoreTime time,
                                    Clock& clock, Random& random) {
  if (options.pool_size < 1 || options.pool_size > 256) {
    return MakeError(Errc::kInvalidArgument, "postgres: pool_size must be 1..256");
  }
  if (!ValidSchemaName(options.schema)) {
    return MakeError(Errc::kInvalidArgument, "postgres: schema must be 1..63 of a-z 0-9 _");
  }
  IDEM_RETURN_IF_ERROR(ValidatePostgresTimeouts(options.timeouts));
  IDEM_RETURN_IF_ERROR(store_internal::CheckAppNames("postgres", options.apps));
  IDEM_RETURN_IF_ERROR(PrepareSchema(options, clock));
  auto connect = [options]() {
    return Connect(options, Bounded(options.timeouts), Now() + options.timeouts.connect);
  };
  std::vector<std::unique_ptr<Connection>> conns;
  for (int i = 0; i < options.pool_size; ++i) {
    IDEM_ASSIGN_OR_RETURN(auto conn, connect());
    conns.push_back(std::move(conn));
  }
  auto pool = std::make_unique<Pool>("postgres", std::move(conns), connect);
  return std::unique_ptr<Store>(
      std::make_unique<PostgresStore>(std::move(pool), options, time, random));
}

}  // namespace

Result<std::unique_ptr<Store>> OpenPostgresStore(const PostgresStoreOptions& options,
                                                 Random& random) {
  // The wall clock only dates applied migrations; every lease, expiry and takeover is the
  // database's.
  return Open(options, StoreTime::Database(), SystemClock(), random);
}

Result<std::unique_ptr<Store>> OpenPostgresStore(const PostgresStoreOptions& options, Clock& clock,
                                                 Random& random) {
  return Open(options, StoreTime::Of(clock), clock, random);
}

}  // namespace idem
