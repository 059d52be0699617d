// src/store/postgres/postgres_store.cc — the PostgreSQL Store: libpq, a bounded pool that replaces
// lost connections, optional per-connection prepared statements, binary results, migrations under
// an advisory lock, SQLSTATE-aware errors.
#include <libpq-fe.h>
#include <poll.h>

#include <atomic>
#include <cstring>
#include <map>
#include <thread>

#include "include/idem/store/postgres.h"
#include "src/store/common.h"

namespace idem {
namespace {

using store_internal::BytesOf;
using store_internal::Fenced;
using store_internal::kRecordColumns;
using store_internal::RecordFromRow;
using store_internal::SingleInteger;

constexpr std::string_view kComponent = "idem";
// pg_advisory_lock key for migrations: "idem" in ASCII.
constexpr int64_t kMigrationLock = 0x6964656d;

const std::vector<Migration>& CoreMigrations() {
  static const std::vector<Migration> kMigrations = {
      {1, R"sql(
CREATE TABLE idem_records (
  scope_hash     BYTEA PRIMARY KEY,
  tenant         TEXT NOT NULL,
  user_id        TEXT NOT NULL,
  route          TEXT NOT NULL,
  request_hash   BYTEA NOT NULL,
  fp_version     BIGINT NOT NULL,
  secret_id      BIGINT NOT NULL,
  state          TEXT NOT NULL
                 CHECK (state IN ('PROCESSING','SUCCEEDED','FAILED_FINAL','FAILED_RETRYABLE')),
  recovery_point TEXT NOT NULL DEFAULT '',
  resource_id    TEXT NOT NULL DEFAULT '',
  status_code    BIGINT NOT NULL DEFAULT 0,
  response       BYTEA,
  owner_token    BYTEA NOT NULL,
  fence          BIGINT NOT NULL,
  lease_until    BIGINT NOT NULL,
  created_at     BIGINT NOT NULL,
  updated_at     BIGINT NOT NULL,
  expires_at     BIGINT NOT NULL
);
CREATE INDEX idem_records_quota ON idem_records (tenant, user_id, state);
CREATE INDEX idem_records_expiry ON idem_records (expires_at);
CREATE INDEX idem_records_stale ON idem_records (lease_until) WHERE state = 'PROCESSING';
)sql"},
  };
  return kMigrations;
}

struct ResultFree {
  void operator()(PGresult* r) const { PQclear(r); }
};
using PgResult = std::unique_ptr<PGresult, ResultFree>;

// Business SQL is written with '?' placeholders; PostgreSQL wants $1, $2, ... Quoted text is
// left alone.
std::string Numbered(std::string_view sql) {
  std::string out;
  out.reserve(sql.size() + 16);
  char quote = 0;
  int n = 0;
  for (char c : sql) {
    if (quote != 0) {
      if (c == quote) quote = 0;
      out.push_back(c);
    } else if (c == '\'' || c == '"') {
      quote = c;
      out.push_back(c);
    } else if (c == '?') {
      out += "$" + std::to_string(++n);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

int64_t BigEndian(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  if (n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign-extend
  return static_cast<int64_t>(v);
}

// Decodes binary-format results by column type.
std::vector<SqlRow> Rows(const PGresult* res) {
  std::vector<SqlRow> rows;
  const int n = PQntuples(res), m = PQnfields(res);
  rows.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    SqlRow row;
    row.reserve(static_cast<std::size_t>(m));
    for (int c = 0; c < m; ++c) {
      if (PQgetisnull(res, r, c)) {
        row.emplace_back(std::monostate{});
        continue;
      }
      const char* v = PQgetvalue(res, r, c);
      const int len = PQgetlength(res, r, c);
      switch (PQftype(res, c)) {
        case 20:  // int8
        case 23:  // int4
        case 21:  // int2
          row.emplace_back(BigEndian(v, len));
          break;
        case 16:  // bool
          row.emplace_back(int64_t{v[0] != 0});
          break;
        case 17:  // bytea
          row.emplace_back(Blob{std::string(v, static_cast<std::size_t>(len))});
          break;
        default:  // text, varchar, name, unknown, ...: their binary form is the text
          row.emplace_back(std::string(v, static_cast<std::size_t>(len)));
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

class Connection {
 public:
  explicit Connection(PGconn* conn, bool prepared) : conn_(conn), prepared_(prepared) {}
  Connection(const Connection&) = delete;
  ~Connection() { PQfinish(conn_); }

  bool broken() const { return broken_ || PQstatus(conn_) != CONNECTION_OK; }

  // Runs one statement with $n parameters. `changed` receives the affected row count.
  Result<std::vector<SqlRow>> Run(std::string_view sql, const std::vector<SqlValue>& params,
                                  int* changed = nullptr) {
    std::vector<std::string> text(params.size());
    std::vector<const char*> values(params.size(), nullptr);
    std::vector<int> lengths(params.size(), 0), formats(params.size(), 0);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const SqlValue& p = params[i];
      if (const int64_t* n = std::get_if<int64_t>(&p)) {
        text[i] = std::to_string(*n);
        values[i] = text[i].c_str();
      } else if (const std::string* s = std::get_if<std::string>(&p)) {
        values[i] = s->c_str();
        lengths[i] = static_cast<int>(s->size());
      } else if (const Blob* b = std::get_if<Blob>(&p)) {
        values[i] = b->bytes.data();
        lengths[i] = static_cast<int>(b->bytes.size());
        formats[i] = 1;
      }
    }
    const int n = static_cast<int>(params.size());
    PgResult res;
    if (prepared_) {
      auto it = statements_.find(std::string(sql));
      if (it == statements_.end()) {
        const std::string name = "s" + std::to_string(statements_.size());
        PgResult prep(PQprepare(conn_, name.c_str(), std::string(sql).c_str(), n, nullptr));
        if (PQresultStatus(prep.get()) != PGRES_COMMAND_OK) return Fail(prep.get(), "prepare");
        it = statements_.emplace(std::string(sql), name).first;
      }
      res.reset(PQexecPrepared(conn_, it->second.c_str(), n, values.data(), lengths.data(),
                               formats.data(), 1));
    } else {
      res.reset(PQexecParams(conn_, std::string(sql).c_str(), n, nullptr, values.data(),
                             lengths.data(), formats.data(), 1));
    }
    const ExecStatusType status = PQresultStatus(res.get());
    if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) return Fail(res.get(), "exec");
    if (changed != nullptr) {
      const char* tuples = PQcmdTuples(res.get());
      *changed = (tuples != nullptr && *tuples != '\0') ? std::atoi(tuples) : 0;
    }
    return Rows(res.get());
  }

  // Statements without parameters or results (BEGIN, COMMIT, DDL scripts).
  Status Script(const std::string& sql) {
    PgResult res(PQexec(conn_, sql.c_str()));
    const ExecStatusType status = PQresultStatus(res.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) return Fail(res.get(), "exec");
    return Ok();
  }

  // The SQLSTATE of the last failure ("" if none or the connection broke).
  const std::string& last_sqlstate() const { return sqlstate_; }

 private:
  Error Fail(const PGresult* res, const char* what) {
    const char* state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
    sqlstate_ = state ? state : "";
    std::string message = std::string("postgres ") + what + ": " + PQerrorMessage(conn_);
    while (!message.empty() && message.back() == '\n') message.pop_back();
    if (PQstatus(conn_) != CONNECTION_OK || state == nullptr) {
      broken_ = true;
      return MakeError(Errc::kUnavailable, message);
    }
    if (sqlstate_ == "23505") return MakeError(Errc::kAlreadyExists, message);
    if (sqlstate_ == "40001" || sqlstate_ == "40P01" || sqlstate_ == "55P03" ||
        sqlstate_.rfind("08", 0) == 0 || sqlstate_.rfind("53", 0) == 0 ||
        sqlstate_.rfind("57", 0) == 0) {
      return MakeError(Errc::kUnavailable, message);
    }
    if (sqlstate_ == "XX001" || sqlstate_ == "XX002") return MakeError(Errc::kDataLoss, message);
    return MakeError(Errc::kInvalidArgument, message);
  }

  PGconn* conn_;
  bool prepared_;
  bool broken_ = false;
  std::string sqlstate_;
  std::map<std::string, std::string> statements_;
};

using Pool = store_internal::Pool<Connection>;
using Lent = store_internal::Lent<Connection>;

Result<std::unique_ptr<Connection>> Connect(const PostgresStoreOptions& options) {
  PGconn* conn = PQconnectdb(options.conninfo.c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string message = std::string("postgres connect: ") + PQerrorMessage(conn);
    while (!message.empty() && message.back() == '\n') message.pop_back();
    PQfinish(conn);
    return MakeError(Errc::kUnavailable, message);
  }
  auto c = std::make_unique<Connection>(conn, options.prepared_statements);
  if (options.schema != "public") {
    IDEM_RETURN_IF_ERROR(c->Run("SELECT set_config('search_path', $1, false)", {options.schema}));
  }
  return c;
}

Result<std::optional<Record>> GetRecord(Connection& conn, const ScopeHash& scope) {
  static const std::string sql =
      "SELECT " + std::string(kRecordColumns) + " FROM idem_records WHERE scope_hash = $1";
  IDEM_ASSIGN_OR_RETURN(auto rows, conn.Run(sql, {BytesOf(scope)}));
  if (rows.empty()) return std::optional<Record>();
  IDEM_ASSIGN_OR_RETURN(Record r, RecordFromRow(rows[0]));
  return std::optional<Record>(std::move(r));
}

class PostgresTxn final : public StoreTxn {
 public:
  PostgresTxn(Lent conn, Clock& clock, Random& random)
      : conn_(std::move(conn)), clock_(clock), random_(random) {}
  ~PostgresTxn() override {
    if (!finished_ && !conn_->broken()) (void)conn_->Script("ROLLBACK");
  }

  Status Begin() { return conn_->Script("BEGIN"); }

  Result<ClaimResult> Claim(const ClaimSpec& spec) override {
    static const std::string sql =
        "INSERT INTO idem_records (" + std::string(kRecordColumns) +
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, 'PROCESSING', '', '', 0, NULL, $8, 1, $9, $10, "
        "$11, $12) ON CONFLICT (scope_hash) DO NOTHING";
    const Timestamp now = clock_.Now();
    Record r = store_internal::NewRecord(spec, now, 1, random_);
    int changed = 0;
    IDEM_RETURN_IF_ERROR(conn_->Run(
        sql,
        {BytesOf(spec.scope), spec.tenant, spec.user, spec.route, BytesOf(spec.fingerprint.mac),
         int64_t{spec.fingerprint.rules_version}, int64_t{spec.fingerprint.secret_id},
         BytesOf(r.lease.owner), ToUnixMillis(r.lease.until), ToUnixMillis(now), ToUnixMillis(now),
         ToUnixMillis(r.expires_at)},
        &changed));
    if (changed == 1) return ClaimResult{true, std::move(r)};
    // The conflicting insert has committed (ON CONFLICT waits for it), so this read sees it.
    IDEM_ASSIGN_OR_RETURN(auto existing, GetRecord(*conn_, spec.scope));
    if (!existing) return MakeError(Errc::kUnavailable, "claim: conflicting record vanished");
    return ClaimResult{false, std::move(*existing)};
  }

  Result<Record> Reclaim(const ClaimSpec& spec, int64_t seen_fence) override {
    const Timestamp now = clock_.Now();
    const int64_t now_ms = ToUnixMillis(now);
    Record r = store_internal::NewRecord(spec, now, seen_fence + 1, random_);
    static const std::string fresh_sql =
        "UPDATE idem_records SET tenant = $1, user_id = $2, route = $3, request_hash = $4, "
        "fp_version = $5, secret_id = $6, state = 'PROCESSING', recovery_point = '', "
        "resource_id = '', status_code = 0, response = NULL, owner_token = $7, fence = $8, "
        "lease_until = $9, created_at = $10, updated_at = $10, expires_at = $11 "
        "WHERE scope_hash = $12 AND fence = $13 AND expires_at <= $10 AND state <> 'PROCESSING'";
    int changed = 0;
    IDEM_RETURN_IF_ERROR(
        conn_->Run(fresh_sql,
                   {spec.tenant, spec.user, spec.route, BytesOf(spec.fingerprint.mac),
                    int64_t{spec.fingerprint.rules_version}, int64_t{spec.fingerprint.secret_id},
                    BytesOf(r.lease.owner), r.lease.fence, ToUnixMillis(r.lease.until), now_ms,
                    ToUnixMillis(r.expires_at), BytesOf(spec.scope), seen_fence},
                   &changed));
    if (changed == 0) {
      static const std::string resume_sql =
          "UPDATE idem_records SET state = 'PROCESSING', owner_token = $1, fence = $2, "
          "lease_until = $3, updated_at = $4 WHERE scope_hash = $5 AND fence = $6 AND "
          "(state = 'FAILED_RETRYABLE' OR (state = 'PROCESSING' AND lease_until < $4))";
      IDEM_RETURN_IF_ERROR(
          conn_->Run(resume_sql,
                     {BytesOf(r.lease.owner), r.lease.fence, ToUnixMillis(r.lease.until), now_ms,
                      BytesOf(spec.scope), seen_fence},
                     &changed));
    }
    IDEM_ASSIGN_OR_RETURN(auto current, GetRecord(*conn_, spec.scope));
    return store_internal::ReclaimResult(changed, std::move(current));
  }

  Result<Lease> Renew(const ScopeHash& scope, const Lease& lease, Millis ttl) override {
    const Timestamp now = clock_.Now();
    Lease renewed = lease;
    renewed.until = now + ttl;
    int changed = 0;
    IDEM_RETURN_IF_ERROR(conn_->Run(
        "UPDATE idem_records SET lease_until = $1, updated_at = $2 WHERE scope_hash = $3 AND "
        "owner_token = $4 AND fence = $5 AND state = 'PROCESSING'",
        {ToUnixMillis(renewed.until), ToUnixMillis(now), BytesOf(scope), BytesOf(lease.owner),
         lease.fence},
        &changed));
    if (changed == 0) return Fenced("renew");
    return renewed;
  }

  Status Advance(const ScopeHash& scope, const Lease& lease, std::string_view point,
                 std::string_view resource_id) override {
    int changed = 0;
    IDEM_RETURN_IF_ERROR(conn_->Run(
        "UPDATE idem_records SET recovery_point = $1, "
        "resource_id = CASE WHEN $2 = '' THEN resource_id ELSE $2 END, updated_at = $3 "
        "WHERE scope_hash = $4 AND owner_token = $5 AND fence = $6 AND state = 'PROCESSING'",
        {std::string(point), std::string(resource_id), ToUnixMillis(clock_.Now()), BytesOf(scope),
         BytesOf(lease.owner), lease.fence},
        &changed));
    if (changed == 0) return Fenced("advance");
    return Ok();
  }

  Status Finish(const ScopeHash& scope, const Lease& lease, const Outcome& outcome) override {
    IDEM_CHECK(outcome.state != RecordState::kProcessing);
    SqlValue response =
        outcome.sealed_response.empty() ? SqlValue{} : SqlValue{Blob{outcome.sealed_response}};
    int changed = 0;
    IDEM_RETURN_IF_ERROR(conn_->Run(
        "UPDATE idem_records SET state = $1, status_code = $2, response = $3, "
        "recovery_point = CASE WHEN $4 = '' THEN recovery_point ELSE $4 END, updated_at = $5 "
        "WHERE scope_hash = $6 AND owner_token = $7 AND fence = $8 AND state = 'PROCESSING' "
        // Delivered to listeners when (and only if) the transaction commits.
        "RETURNING pg_notify('idem_finished', encode(scope_hash, 'hex'))",
        {std::string(RecordStateName(outcome.state)), int64_t{outcome.status_code},
         std::move(response), outcome.recovery_point, ToUnixMillis(clock_.Now()), BytesOf(scope),
         BytesOf(lease.owner), lease.fence},
        &changed));
    if (changed == 0) return Fenced("finish");
    return Ok();
  }

  Result<std::optional<Record>> Get(const ScopeHash& scope) override {
    return GetRecord(*conn_, scope);
  }

  Result<int64_t> Count(std::string_view tenant, std::string_view user,
                        std::optional<RecordState> state, int64_t limit) override {
    // Claims of one principal serialise on this lock until their transactions end, so a quota
    // counted here is exact, as it is on SQLite.
    IDEM_RETURN_IF_ERROR(conn_->Run("SELECT pg_advisory_xact_lock(hashtext($1))",
                                    {std::string(tenant) + '\x1f' + std::string(user)}));
    std::vector<SqlValue> params{std::string(tenant), std::string(user)};
    std::string sql =
        "SELECT count(*) FROM (SELECT 1 FROM idem_records WHERE tenant = $1 AND user_id = $2";
    if (state) {
      sql += " AND state = $3 LIMIT $4)";
      params.emplace_back(std::string(RecordStateName(*state)));
    } else {
      sql += " LIMIT $3)";
    }
    sql += " AS bounded";
    params.emplace_back(limit);
    IDEM_ASSIGN_OR_RETURN(auto rows, conn_->Run(sql, params));
    return SingleInteger(rows, "count");
  }

  Result<std::vector<SqlRow>> Exec(std::string_view sql,
                                   const std::vector<SqlValue>& params) override {
    // A failed statement aborts a PostgreSQL transaction; a savepoint keeps this one usable, so
    // the caller can decide from the existing row after a unique violation.
    IDEM_RETURN_IF_ERROR(conn_->Script("SAVEPOINT idem_exec"));
    auto rows = conn_->Run(Numbered(sql), params);
    if (!rows) {
      if (!conn_->broken()) (void)conn_->Script("ROLLBACK TO SAVEPOINT idem_exec");
      return rows;
    }
    IDEM_RETURN_IF_ERROR(conn_->Script("RELEASE SAVEPOINT idem_exec"));
    return rows;
  }

  Status Commit() override {
    IDEM_CHECK(!finished_);
    Status s = conn_->Script("COMMIT");
    if (!s) {
      if (conn_->broken()) {
        // The COMMIT may or may not have reached the server: the outcome is unknown.
        finished_ = true;
        return MakeError(Errc::kDeadlineExceeded,
                         "commit outcome unknown (connection lost): " + s.error().message);
      }
      return s;
    }
    finished_ = true;
    return Ok();
  }

 private:
  Lent conn_;
  Clock& clock_;
  Random& random_;
  bool finished_ = false;
};

// LISTENs on its own connection (not the pool's) on a thread, reconnecting with back-off.
class FinishedListener final : public Subscription {
 public:
  FinishedListener(std::string conninfo, std::function<void(const ScopeHash&)> on_finished)
      : conninfo_(std::move(conninfo)),
        on_finished_(std::move(on_finished)),
        thread_([this] { Run(); }) {}
  ~FinishedListener() override {
    stop_ = true;
    thread_.join();
  }

 private:
  void Run() {
    auto backoff = std::chrono::milliseconds(100);
    while (!stop_) {
      PGconn* conn = PQconnectdb(conninfo_.c_str());
      if (PQstatus(conn) == CONNECTION_OK) {
        PgResult r(PQexec(conn, "LISTEN idem_finished"));
        if (PQresultStatus(r.get()) == PGRES_COMMAND_OK) {
          backoff = std::chrono::milliseconds(100);
          Listen(conn);
        }
      }
      PQfinish(conn);
      for (auto waited = std::chrono::milliseconds(0); waited < backoff && !stop_;
           waited += std::chrono::milliseconds(50)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      backoff = std::min(backoff * 2, std::chrono::milliseconds(5000));
    }
  }

  // Until stopped or the connection fails.
  void Listen(PGconn* conn) {
    while (!stop_) {
      pollfd p{PQsocket(conn), POLLIN, 0};
      if (poll(&p, 1, 200) < 0) return;
      if (PQconsumeInput(conn) == 0) return;
      while (PGnotify* n = PQnotifies(conn)) {
        const std::string_view hex = n->extra != nullptr ? n->extra : "";
        ScopeHash scope{};
        if (hex.size() == 64) {
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
        }
        PQfreemem(n);
      }
      if (PQstatus(conn) != CONNECTION_OK) return;
    }
  }

  std::string conninfo_;
  std::function<void(const ScopeHash&)> on_finished_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class PostgresStore final : public Store {
 public:
  PostgresStore(std::unique_ptr<Pool> pool, PostgresStoreOptions options, Clock& clock,
                Random& random)
      : pool_(std::move(pool)), options_(std::move(options)), clock_(clock), random_(random) {
    caps_.name = "postgres";
    caps_.shared_across_processes = true;
    caps_.durable = true;
    caps_.notifications = true;
  }

  const StoreCapabilities& capabilities() const override { return caps_; }

  Result<std::unique_ptr<Subscription>> SubscribeFinished(
      std::function<void(const ScopeHash&)> on_finished) override {
    return std::unique_ptr<Subscription>(
        std::make_unique<FinishedListener>(options_.conninfo, std::move(on_finished)));
  }

  Result<std::unique_ptr<StoreTxn>> Begin() override {
    for (int attempt = 0;; ++attempt) {
      IDEM_ASSIGN_OR_RETURN(Lent conn, store_internal::Borrow(*pool_, options_.pool_wait));
      auto txn = std::make_unique<PostgresTxn>(std::move(conn), clock_, random_);
      Status begun = txn->Begin();
      if (begun) return std::unique_ptr<StoreTxn>(std::move(txn));
      // A connection that died while idle: nothing was sent, so try a fresh one.
      if (attempt >= options_.max_retries) return std::move(begun).error();
    }
  }

  Result<std::optional<Record>> Read(const ScopeHash& scope) override {
    return Retrying([&](Connection& c) { return GetRecord(c, scope); });
  }

  Result<std::vector<SqlRow>> Query(std::string_view sql,
                                    const std::vector<SqlValue>& params) override {
    const std::string numbered = Numbered(sql);
    return Retrying([&](Connection& c) -> Result<std::vector<SqlRow>> {
      // A read-only transaction makes the server refuse writes.
      IDEM_RETURN_IF_ERROR(c.Script("BEGIN READ ONLY"));
      auto rows = c.Run(numbered, params);
      if (!c.broken()) (void)c.Script(rows ? "COMMIT" : "ROLLBACK");
      if (!rows && c.last_sqlstate() == "25006") {
        return MakeError(Errc::kInvalidArgument, "query: statement is not read-only");
      }
      return rows;
    });
  }

  Result<std::vector<Record>> ListStale(int limit) override {
    static const std::string sql = "SELECT " + std::string(kRecordColumns) +
                                   " FROM idem_records WHERE state = 'PROCESSING' AND "
                                   "lease_until < $1 ORDER BY lease_until LIMIT $2";
    return Retrying([&](Connection& c) -> Result<std::vector<Record>> {
      IDEM_ASSIGN_OR_RETURN(auto rows, c.Run(sql, {ToUnixMillis(clock_.Now()), int64_t{limit}}));
      std::vector<Record> records;
      for (const SqlRow& row : rows) {
        IDEM_ASSIGN_OR_RETURN(Record r, RecordFromRow(row));
        records.push_back(std::move(r));
      }
      return records;
    });
  }

  Result<int> Sweep(int batch) override {
    static const std::string sql =
        "DELETE FROM idem_records WHERE scope_hash IN (SELECT scope_hash FROM idem_records "
        "WHERE expires_at <= $1 AND state <> 'PROCESSING' ORDER BY expires_at LIMIT $2 "
        "FOR UPDATE SKIP LOCKED)";
    return Retrying([&](Connection& c) -> Result<int> {
      int changed = 0;
      IDEM_RETURN_IF_ERROR(c.Run(sql, {ToUnixMillis(clock_.Now()), int64_t{batch}}, &changed));
      return changed;
    });
  }

 private:
  // Runs a single-statement operation (autocommit), retrying serialisation failures, deadlocks
  // and connections that were lost: these statements are idempotent reads or deletes.
  template <typename F>
  auto Retrying(F&& op) -> decltype(op(std::declval<Connection&>())) {
    for (int attempt = 0;; ++attempt) {
      auto lent = store_internal::Borrow(*pool_, options_.pool_wait);
      if (!lent) return std::move(lent).error();
      auto result = op(**lent);
      if (result || result.error().code != Errc::kUnavailable || attempt >= options_.max_retries) {
        return result;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5 << attempt));
    }
  }

  std::unique_ptr<Pool> pool_;
  PostgresStoreOptions options_;
  Clock& clock_;
  Random& random_;
  StoreCapabilities caps_;
};

Status Migrate(Connection& conn, std::string_view component,
               const std::vector<Migration>& migrations, int64_t now_ms) {
  IDEM_ASSIGN_OR_RETURN(auto rows,
                        conn.Run("SELECT coalesce(max(version), 0)::bigint FROM idem_schema "
                                 "WHERE component = $1",
                                 {std::string(component)}));
  IDEM_ASSIGN_OR_RETURN(int64_t current, SingleInteger(rows, "schema version"));
  return store_internal::ApplyMigrations(
      component, migrations, current, [&](const std::string& sql) { return conn.Script(sql); },
      [&](int version) -> Status {
        IDEM_RETURN_IF_ERROR(
            conn.Run("INSERT INTO idem_schema (component, version, applied_at) VALUES ($1, $2, $3)",
                     {std::string(component), int64_t{version}, now_ms}));
        return Ok();
      });
}

// PostgresStoreOptions::apply_migrations = false: checks libidem's schema with reads only.
Status CheckSchema(const PostgresStoreOptions& options) {
  const std::string none = "postgres: the database (schema '" + options.schema +
                           "') has no idem schema; start idemd once to create it";
  PostgresStoreOptions plain = options;
  plain.prepared_statements = false;
  IDEM_ASSIGN_OR_RETURN(auto conn, Connect(plain));
  IDEM_ASSIGN_OR_RETURN(auto tables, conn->Run("SELECT count(*)::bigint FROM pg_tables WHERE "
                                               "schemaname = $1 AND tablename = 'idem_schema'",
                                               {options.schema}));
  IDEM_ASSIGN_OR_RETURN(int64_t found, SingleInteger(tables, "schema table"));
  if (found == 0) return MakeError(Errc::kInvalidArgument, none);
  IDEM_ASSIGN_OR_RETURN(auto rows, conn->Run("SELECT coalesce(max(version), 0)::bigint FROM "
                                             "idem_schema WHERE component = $1",
                                             {std::string(kComponent)}));
  IDEM_ASSIGN_OR_RETURN(int64_t current, SingleInteger(rows, "schema version"));
  if (current == 0) return MakeError(Errc::kInvalidArgument, none);
  const int64_t known = CoreMigrations().back().version;
  if (current > known) {
    return MakeError(Errc::kDataLoss, "postgres: schema of 'idem' is at version " +
                                          std::to_string(current) + ", newer than this build (" +
                                          std::to_string(known) + ")");
  }
  return Ok();
}

bool ValidSchemaName(const std::string& s) {
  return !s.empty() && s.size() <= 63 &&
         s.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
}

}  // namespace

Result<std::unique_ptr<Store>> OpenPostgresStore(const PostgresStoreOptions& options, Clock& clock,
                                                 Random& random) {
  if (options.pool_size < 1 || options.pool_size > 256) {
    return MakeError(Errc::kInvalidArgument, "postgres: pool_size must be 1..256");
  }
  if (!ValidSchemaName(options.schema)) {
    return MakeError(Errc::kInvalidArgument, "postgres: schema must be 1..63 of a-z 0-9 _");
  }
  if (!options.app_migrations.empty() &&
      (options.app_name.empty() || options.app_name == kComponent)) {
    return MakeError(Errc::kInvalidArgument, "postgres: app migrations need an app_name");
  }
  // Migrations first, on a connection of their own, under a database-wide advisory lock.
  if (!options.apply_migrations) {
    IDEM_RETURN_IF_ERROR(CheckSchema(options));
  } else {
    PostgresStoreOptions plain = options;
    plain.schema = "public";
    plain.prepared_statements = false;
    IDEM_ASSIGN_OR_RETURN(auto conn, Connect(plain));
    IDEM_RETURN_IF_ERROR(conn->Run("SELECT pg_advisory_lock($1)", {kMigrationLock}));
    Status migrated = [&]() -> Status {
      if (options.schema != "public") {
        IDEM_RETURN_IF_ERROR(conn->Script("CREATE SCHEMA IF NOT EXISTS " + options.schema));
        IDEM_RETURN_IF_ERROR(
            conn->Run("SELECT set_config('search_path', $1, false)", {options.schema}));
      }
      IDEM_RETURN_IF_ERROR(conn->Script("BEGIN"));
      IDEM_RETURN_IF_ERROR(
          conn->Script("CREATE TABLE IF NOT EXISTS idem_schema (component TEXT NOT NULL, "
                       "version BIGINT NOT NULL, applied_at BIGINT NOT NULL, "
                       "PRIMARY KEY (component, version))"));
      const int64_t now_ms = ToUnixMillis(clock.Now());
      IDEM_RETURN_IF_ERROR(Migrate(*conn, kComponent, CoreMigrations(), now_ms));
      if (!options.app_migrations.empty()) {
        IDEM_RETURN_IF_ERROR(Migrate(*conn, options.app_name, options.app_migrations, now_ms));
      }
      return conn->Script("COMMIT");
    }();
    if (!migrated) (void)conn->Script("ROLLBACK");
    (void)conn->Run("SELECT pg_advisory_unlock($1)", {kMigrationLock});
    if (!migrated) return std::move(migrated).error();
  }
  std::vector<std::unique_ptr<Connection>> conns;
  for (int i = 0; i < options.pool_size; ++i) {
    IDEM_ASSIGN_OR_RETURN(auto conn, Connect(options));
    conns.push_back(std::move(conn));
  }
  auto pool = std::make_unique<Pool>("postgres", std::move(conns),
                                     [options]() { return Connect(options); });
  return std::unique_ptr<Store>(
      std::make_unique<PostgresStore>(std::move(pool), options, clock, random));
}

}  // namespace idem
