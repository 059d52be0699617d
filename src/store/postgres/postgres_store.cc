// src/store/postgres/postgres_store.cc — the PostgreSQL Store: libpq in nonblocking mode with a
// deadline on every call, a bounded pool that replaces lost connections, optional per-connection
// prepared statements, typed binary results, migrations under an advisory lock, SQLSTATE-aware
// errors, a readiness ping on a connection of its own. The SQL text and the record operations
// are the shared ones of src/store/sql.h.
#include <libpq-fe.h>
#include <poll.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "idem/store/postgres.h"
#include "src/store/pool.h"
#include "src/store/sql.h"

namespace idem {
namespace {

using store_internal::RecordSql;
using store_internal::SqlRunner;
using store_internal::SqlTxn;
using store_internal::StoreTime;

// pg_advisory_xact_lock key for migrations: "idem" in ASCII.
constexpr int64_t kMigrationLock = 0x6964656d;

const RecordSql& Sql() {
  static const RecordSql kSql(store_internal::PostgresDialect());
  return kSql;
}

struct ResultFree {
  void operator()(PGresult* r) const { PQclear(r); }
};
using PgResult = std::unique_ptr<PGresult, ResultFree>;

// ---- Values: parameters go as text (bytes as binary), results come back binary ---------------

uint64_t BigEndian(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

int64_t SignedBigEndian(const char* p, int n) {
  uint64_t v = BigEndian(p, n);
  if (n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign-extend
  return static_cast<int64_t>(v);
}

// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01 UTC).
constexpr int64_t kPostgresEpochMicros = 946'684'800'000'000;

// An instant as PostgreSQL reads timestamptz text: "2026-11-30 06:00:00.123+00".
std::string TimestampText(Timestamp t) {
  const int64_t ms = ToUnixMillis(t);
  const int64_t seconds = ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000);
  const std::time_t tt = static_cast<std::time_t>(seconds);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02d %02d:%02d:%02d.%03d+00", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms - seconds * 1000));
  return buf;
}

std::string DoubleText(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", d);
  return buf;
}

// numeric's binary form: ndigits, weight, sign, dscale (int16 each), then base-10000 digits.
Result<std::string> NumericText(const char* p, int len) {
  if (len < 8) return MakeError(Errc::kDataLoss, "numeric value is truncated");
  const int ndigits = static_cast<int>(SignedBigEndian(p, 2));
  const int weight = static_cast<int>(SignedBigEndian(p + 2, 2));
  const uint64_t sign = BigEndian(p + 4, 2);
  const int dscale = static_cast<int>(SignedBigEndian(p + 6, 2));
  if (ndigits < 0 || dscale < 0 || len != 8 + 2 * ndigits) {
    return MakeError(Errc::kDataLoss, "numeric value is malformed");
  }
  if (sign == 0xC000) return std::string("NaN");
  if (sign == 0xD000) return std::string("Infinity");
  if (sign == 0xF000) return std::string("-Infinity");
  auto digit = [&](int i) -> int {
    return i >= 0 && i < ndigits ? static_cast<int>(SignedBigEndian(p + 8 + 2 * i, 2)) : 0;
  };
  std::string out = sign == 0x4000 ? "-" : "";
  if (weight < 0) {
    out += "0";
  } else {
    for (int i = 0; i <= weight; ++i) {
      char group[8];
      std::snprintf(group, sizeof group, i == 0 ? "%d" : "%04d", digit(i));
      out += group;
    }
  }
  if (dscale > 0) {
    std::string fraction;
    for (int i = weight + 1; static_cast<int>(fraction.size()) < dscale; ++i) {
      char group[8];
      std::snprintf(group, sizeof group, "%04d", digit(i));
      fraction += group;
    }
    out += "." + fraction.substr(0, static_cast<std::size_t>(dscale));
  }
  return out;
}

// One binary-format result value of type `oid` (see the SqlValue table in store.h).
Result<SqlValue> Decode(Oid oid, const char* v, int len, int column) {
  switch (oid) {
    case 16:  // bool
      return SqlValue{int64_t{v[0] != 0}};
    case 20:  // int8
    case 21:  // int2
    case 23:  // int4
      return SqlValue{SignedBigEndian(v, len)};
    case 700: {  // float4
      const uint32_t bits = static_cast<uint32_t>(BigEndian(v, 4));
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return SqlValue{static_cast<double>(f)};
    }
    case 701: {  // float8
      const uint64_t bits = BigEndian(v, 8);
      double d;
      std::memcpy(&d, &bits, sizeof d);
      return SqlValue{d};
    }
    case 1700: {  // numeric: exact, as decimal text
      IDEM_ASSIGN_OR_RETURN(std::string text, NumericText(v, len));
      return SqlValue{std::move(text)};
    }
    case 18:    // "char"
    case 19:    // name
    case 25:    // text
    case 114:   // json
    case 705:   // unknown (an untyped literal)
    case 1042:  // bpchar
    case 1043:  // varchar
      return SqlValue{std::string(v, static_cast<std::size_t>(len))};
    case 3802:  // jsonb: a version byte, then the text
      if (len < 1 || v[0] != 1) return MakeError(Errc::kDataLoss, "jsonb value is malformed");
      return SqlValue{std::string(v + 1, static_cast<std::size_t>(len - 1))};
    case 2950: {  // uuid
      if (len != 16) return MakeError(Errc::kDataLoss, "uuid value is malformed");
      std::string text = ToHex(reinterpret_cast<const uint8_t*>(v), 16);
      for (std::size_t at : {8, 13, 18, 23}) text.insert(at, "-");
      return SqlValue{std::move(text)};
    }
    case 17:  // bytea
      return SqlValue{Blob{std::string(v, static_cast<std::size_t>(len))}};
    case 1114:    // timestamp (read as UTC)
    case 1184: {  // timestamptz
      const int64_t micros = SignedBigEndian(v, 8);
      if (micros == INT64_MAX || micros == INT64_MIN) {
        return MakeError(Errc::kInvalidArgument,
                         "column " + std::to_string(column) + " holds an infinite timestamp");
      }
      const int64_t unix_micros = micros + kPostgresEpochMicros;
      const int64_t ms = unix_micros >= 0 ? unix_micros / 1000 : -((-unix_micros + 999) / 1000);
      return SqlValue{FromUnixMillis(ms)};
    }
    case 2278:  // void (pg_notify, pg_advisory_xact_lock)
      return SqlValue{std::monostate{}};
    default:
      return MakeError(Errc::kInvalidArgument,
                       "column " + std::to_string(column) + " has a type (oid " +
                           std::to_string(oid) +
                           ") that idem does not decode; cast it to text, bigint, double "
                           "precision, numeric, bytea or timestamptz");
  }
}

Result<std::vector<SqlRow>> Rows(const PGresult* res) {
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
      IDEM_ASSIGN_OR_RETURN(SqlValue value, Decode(PQftype(res, c), PQgetvalue(res, r, c),
                                                   PQgetlength(res, r, c), c));
      row.push_back(std::move(value));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// ---- Deadlines ---------------------------------------------------------------------------------

// How much longer than statement_timeout the client waits for an answer. The server's own cancel
// (SQLSTATE 57014, the connection kept) normally comes first; silence past it means the server
// or the network stopped.
constexpr Millis kAnswerGrace{1000};

// I/O deadlines are read from the real monotonic clock: poll() waits in real time, so an injected
// clock could not drive them.
SteadyTime Now() { return SystemMonotonicClock().Now(); }

// Migrations wait without a deadline (keepalives still find a vanished peer).
constexpr SteadyTime kNoDeadline = SteadyTime::max();

// Waits until `fd` is ready for `events`, or has an error for libpq to report; false once
// `deadline` has passed.
bool WaitFor(int fd, short events, SteadyTime deadline) {
  if (fd < 0) return true;  // no socket: libpq reports why
  for (;;) {
    int timeout_ms = -1;
    if (deadline != kNoDeadline) {
      const Millis left = std::chrono::ceil<Millis>(deadline - Now());
      if (left.count() <= 0) return false;
      timeout_ms = static_cast<int>(std::min<int64_t>(left.count(), INT_MAX));
    }
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, timeout_ms);
    if (n > 0 || (n < 0 && errno != EINTR)) return true;
  }
}

std::string MillisText(Millis ms) { return std::to_string(ms.count()) + " ms"; }

// What a connection is for: the server-side bounds of its session (0: none) and how long the
// client waits for the answer to one call (nullopt: without end).
struct Bounds {
  Millis statement{0};
  Millis lock{0};
  Millis idle_in_transaction{0};
  std::optional<Millis> answer;
};

// The pool's connections and the listener's.
Bounds Bounded(const PostgresTimeouts& t) {
  return Bounds{t.statement, t.lock, t.idle_in_transaction, t.statement + kAnswerGrace};
}

// ---- One connection --------------------------------------------------------------------------

// A libpq connection in nonblocking mode: every call is sent, then its answer awaited with poll()
// until a deadline, so nothing the server or the network does blocks a caller without end.
class Connection final : public SqlRunner {
 public:
  Connection(PGconn* conn, bool prepared, std::optional<Millis> answer_timeout)
      : conn_(conn), prepared_(prepared), answer_timeout_(answer_timeout) {}
  Connection(const Connection&) = delete;
  // Nonblocking: closing never waits for the server.
  ~Connection() override { PQfinish(conn_); }

  bool Broken() const { return broken_ || PQstatus(conn_) != CONNECTION_OK; }

  // Whether a call timed out since ClearTimedOut: the server cancelled it (statement or lock
  // timeout), or the client stopped waiting for its answer. Not worth retrying at once.
  bool TimedOut() const { return timed_out_; }
  void ClearTimedOut() { timed_out_ = false; }

  Result<std::vector<SqlRow>> Run(std::string_view sql, const std::vector<SqlValue>& params,
                                  int* changed) override {
    return RunBy(sql, params, changed, prepared_, Deadline());
  }

  // Runs `sql` (parameters bound, never prepared) by `deadline`.
  Result<std::vector<SqlRow>> RunOnceBy(std::string_view sql, const std::vector<SqlValue>& params,
                                        SteadyTime deadline) {
    return RunBy(sql, params, nullptr, false, deadline);
  }

  // Statements without parameters or results (BEGIN, COMMIT, DDL scripts).
  Status Script(const std::string& sql) { return ScriptBy(sql, Deadline()); }
  Status ScriptBy(const std::string& sql, SteadyTime deadline) {
    if (broken_) return Dropped();
    if (PQsendQuery(conn_, sql.c_str()) == 0) return Fail(nullptr, "exec");
    IDEM_ASSIGN_OR_RETURN(PgResult res, Await(deadline, "exec"));
    const ExecStatusType status = PQresultStatus(res.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) return Fail(res.get(), "exec");
    return Ok();
  }

  // Waits up to `wait` for notifications and hands the payload of each to `on_notify`. Returns
  // false once the connection failed.
  bool ConsumeNotifications(Millis wait, const std::function<void(std::string_view)>& on_notify) {
    WaitFor(PQsocket(conn_), POLLIN, Now() + wait);
    if (PQconsumeInput(conn_) == 0) return false;
    while (PGnotify* n = PQnotifies(conn_)) {
      on_notify(n->extra != nullptr ? n->extra : "");
      PQfreemem(n);
    }
    return PQstatus(conn_) == CONNECTION_OK;
  }

  // The SQLSTATE of the last failure ("" if none or the connection broke).
  const std::string& LastSqlstate() const { return sqlstate_; }

 private:
  SteadyTime Deadline() const { return answer_timeout_ ? Now() + *answer_timeout_ : kNoDeadline; }

  Result<std::vector<SqlRow>> RunBy(std::string_view sql, const std::vector<SqlValue>& params,
                                    int* changed, bool prepare, SteadyTime deadline) {
    if (broken_) return Dropped();
    std::vector<std::string> text(params.size());
    std::vector<const char*> values(params.size(), nullptr);
    std::vector<int> lengths(params.size(), 0), formats(params.size(), 0);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const SqlValue& p = params[i];
      if (const int64_t* n = std::get_if<int64_t>(&p)) {
        text[i] = std::to_string(*n);
      } else if (const double* d = std::get_if<double>(&p)) {
        text[i] = DoubleText(*d);
      } else if (const Timestamp* t = std::get_if<Timestamp>(&p)) {
        text[i] = TimestampText(*t);
      } else if (const std::string* s = std::get_if<std::string>(&p)) {
        values[i] = s->c_str();
        lengths[i] = static_cast<int>(s->size());
        continue;
      } else if (const Blob* b = std::get_if<Blob>(&p)) {
        values[i] = b->bytes.data();
        lengths[i] = static_cast<int>(b->bytes.size());
        formats[i] = 1;
        continue;
      } else {
        continue;  // NULL
      }
      values[i] = text[i].c_str();
    }
    const int n = static_cast<int>(params.size());
    const std::string statement(sql);
    int sent = 0;
    if (prepare) {
      auto it = statements_.find(statement);
      if (it == statements_.end()) {
        const std::string name = "s" + std::to_string(statements_.size());
        if (PQsendPrepare(conn_, name.c_str(), statement.c_str(), n, nullptr) == 0) {
          return Fail(nullptr, "prepare");
        }
        IDEM_ASSIGN_OR_RETURN(PgResult prep, Await(deadline, "prepare"));
        if (PQresultStatus(prep.get()) != PGRES_COMMAND_OK) return Fail(prep.get(), "prepare");
        it = statements_.emplace(statement, name).first;
      }
      sent = PQsendQueryPrepared(conn_, it->second.c_str(), n, values.data(), lengths.data(),
                                 formats.data(), 1);
    } else {
      sent = PQsendQueryParams(conn_, statement.c_str(), n, nullptr, values.data(), lengths.data(),
                               formats.data(), 1);
    }
    if (sent == 0) return Fail(nullptr, "exec");
    IDEM_ASSIGN_OR_RETURN(PgResult res, Await(deadline, "exec"));
    const ExecStatusType status = PQresultStatus(res.get());
    if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) return Fail(res.get(), "exec");
    if (changed != nullptr) {
      const char* tuples = PQcmdTuples(res.get());
      *changed = (tuples != nullptr && *tuples != '\0') ? std::atoi(tuples) : 0;
    }
    return Rows(res.get());
  }

  static bool IsError(const PGresult* r) {
    const ExecStatusType status = PQresultStatus(r);
    return status == PGRES_FATAL_ERROR || status == PGRES_BAD_RESPONSE;
  }

  // Sends what the last PQsend* queued and collects its answer by `deadline`: the first error of
  // a script, else its last result. Past the deadline the connection is given up (closed when the
  // pool drops it). No cancel request is sent: libpq's PQcancel waits without a bound for a
  // server that does not answer, and the server's statement_timeout ends the statement anyway.
  Result<PgResult> Await(SteadyTime deadline, const char* what) {
    const SteadyTime start = Now();
    for (;;) {
      const int flushed = PQflush(conn_);
      if (flushed == 0) break;
      if (flushed < 0) return Fail(nullptr, what);
      if (!WaitFor(PQsocket(conn_), POLLIN | POLLOUT, deadline)) return GiveUp(what, start);
      if (PQconsumeInput(conn_) == 0) return Fail(nullptr, what);
    }
    PgResult kept;
    for (;;) {
      while (PQisBusy(conn_) != 0) {
        if (!WaitFor(PQsocket(conn_), POLLIN, deadline)) return GiveUp(what, start);
        if (PQconsumeInput(conn_) == 0) return Fail(nullptr, what);
      }
      PgResult next(PQgetResult(conn_));
      if (next == nullptr) break;
      if (kept == nullptr || !IsError(kept.get())) kept = std::move(next);
    }
    if (kept == nullptr) return Fail(nullptr, what);
    return kept;
  }

  // A connection that failed or was given up earlier (a statement may still be in flight) sends
  // nothing more; the pool replaces it.
  static Error Dropped() {
    return MakeError(Errc::kUnavailable, "postgres: the connection failed earlier");
  }

  Error GiveUp(const char* what, SteadyTime start) {
    broken_ = true;
    timed_out_ = true;
    sqlstate_.clear();
    return MakeError(Errc::kUnavailable,
                     std::string("postgres ") + what + ": no answer within " +
                         MillisText(std::chrono::duration_cast<Millis>(Now() - start)) +
                         "; the connection is dropped");
  }

  Error Fail(const PGresult* res, const char* what) {
    const char* state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
    sqlstate_ = state ? state : "";
    const char* detail = res != nullptr && *PQresultErrorMessage(res) != '\0'
                             ? PQresultErrorMessage(res)
                             : PQerrorMessage(conn_);
    std::string message = std::string("postgres ") + what + ": " + detail;
    while (!message.empty() && message.back() == '\n') message.pop_back();
    if (PQstatus(conn_) != CONNECTION_OK || state == nullptr) {
      broken_ = true;
      return MakeError(Errc::kUnavailable, message);
    }
    if (sqlstate_ == "23505") return MakeError(Errc::kAlreadyExists, message);
    // 57014: cancelled (statement_timeout); 55P03: lock_timeout.
    if (sqlstate_ == "57014" || sqlstate_ == "55P03") timed_out_ = true;
    if (sqlstate_ == "40001" || sqlstate_ == "40P01" || sqlstate_ == "55P03" ||
        sqlstate_.rfind("08", 0) == 0 || sqlstate_.rfind("53", 0) == 0 ||
        sqlstate_.rfind("57", 0) == 0) {
      return MakeError(Errc::kUnavailable, message);
    }
    if (sqlstate_ == "54000") return MakeError(Errc::kTooLarge, message);
    if (sqlstate_ == "XX001" || sqlstate_ == "XX002") return MakeError(Errc::kDataLoss, message);
    return MakeError(Errc::kInvalidArgument, message);
  }

  PGconn* conn_;
  bool prepared_;
  std::optional<Millis> answer_timeout_;
  bool broken_ = false;
  bool timed_out_ = false;
  std::string sqlstate_;
  std::map<std::string, std::string> statements_;
};

using Pool = store_internal::Pool<Connection>;
using Lent = store_internal::Lent<Connection>;

// Connects to options.conninfo by `deadline` — TCP, TLS, authentication and the session's
// settings — with TCP keepalives and in nonblocking mode, and sets `bounds` (and the search_path
// of options.schema) on the session. Errors: kUnavailable.
Result<std::unique_ptr<Connection>> Connect(const PostgresStoreOptions& options,
                                            const Bounds& bounds, SteadyTime deadline) {
  const PostgresTimeouts& t = options.timeouts;
  const std::string idle = std::to_string(t.keepalives_idle.count());
  const std::string interval = std::to_string(t.keepalives_interval.count());
  const std::string count = std::to_string(t.keepalives_count);
  // The conninfo comes first, so the keywords after it replace its own values.
  const char* const keywords[] = {"dbname",           "keepalives",
                                  "keepalives_idle",  "keepalives_interval",
                                  "keepalives_count", nullptr};
  const char* const values[] = {options.conninfo.c_str(), "1",           idle.c_str(),
                                interval.c_str(),         count.c_str(), nullptr};
  const SteadyTime start = Now();
  PGconn* conn = PQconnectStartParams(keywords, values, /*expand_dbname=*/1);
  if (conn == nullptr) return MakeError(Errc::kUnavailable, "postgres connect: out of memory");
  auto fail = [&](std::string why) -> Error {
    while (!why.empty() && why.back() == '\n') why.pop_back();
    PQfinish(conn);
    return MakeError(Errc::kUnavailable, "postgres connect: " + why);
  };
  // As the libpq manual says: poll for writing first, then as PQconnectPoll asks.
  PostgresPollingStatusType polling = PGRES_POLLING_WRITING;
  while (polling != PGRES_POLLING_OK) {
    if (polling == PGRES_POLLING_FAILED || PQstatus(conn) == CONNECTION_BAD) {
      return fail(PQerrorMessage(conn));
    }
    if (!WaitFor(PQsocket(conn), polling == PGRES_POLLING_READING ? POLLIN : POLLOUT, deadline)) {
      return fail("no connection within " +
                  MillisText(std::chrono::duration_cast<Millis>(Now() - start)));
    }
    polling = PQconnectPoll(conn);
  }
  if (PQsetnonblocking(conn, 1) != 0) return fail(PQerrorMessage(conn));
  auto c = std::make_unique<Connection>(conn, options.prepared_statements, bounds.answer);
  // One round trip for every setting of the session. synchronous_commit is on whatever the
  // server's or the role's default: a commit acknowledged before it is durable (and, with
  // synchronous replicas, replicated) could be lost after its charge left (docs/deploy.md).
  std::string sql =
      "SELECT set_config('statement_timeout', $1, false), set_config('lock_timeout', $2, false), "
      "set_config('idle_in_transaction_session_timeout', $3, false), "
      "set_config('synchronous_commit', 'on', false)";
  std::vector<SqlValue> params = {std::to_string(bounds.statement.count()),
                                  std::to_string(bounds.lock.count()),
                                  std::to_string(bounds.idle_in_transaction.count())};
  if (options.schema != "public") {
    sql += ", set_config('search_path', $4, false)";
    params.emplace_back(options.schema);
  }
  auto set = c->RunOnceBy(sql, params, deadline);
  if (!set) return MakeError(Errc::kUnavailable, "postgres connect: " + set.error().message);
  return c;
}

// Business SQL with '?' placeholders, numbered for PostgreSQL after the parameter count is
// checked (a wrong count is the caller's error, worded as on every backend).
Result<std::string> BusinessSql(std::string_view op, std::string_view sql,
                                const std::vector<SqlValue>& params) {
  int count = 0;
  std::string numbered = store_internal::Numbered(sql, &count);
  IDEM_RETURN_IF_ERROR(store_internal::CheckParameterCount(op, count, params.size()));
  return numbered;
}

// ---- Transaction ---------------------------------------------------------------------------

// A pooled connection inside BEGIN (READ COMMITTED): claims conflict on the primary key, which
// waits for the other inserter; quota counts take a per-principal advisory lock.
class PostgresSession final : public store_internal::LentSession<Connection> {
 public:
  using LentSession::LentSession;

  Result<std::vector<SqlRow>> Exec(std::string_view sql,
                                   const std::vector<SqlValue>& params) override {
    IDEM_ASSIGN_OR_RETURN(std::string numbered, BusinessSql("sql", sql, params));
    // A failed statement aborts a PostgreSQL transaction; a savepoint keeps this one usable, so
    // the caller can decide from the existing row after a unique violation.
    IDEM_RETURN_IF_ERROR(conn_->Script("SAVEPOINT idem_exec"));
    auto rows = conn_->Run(numbered, params, nullptr);
    if (!rows) {
      if (!conn_->Broken()) (void)conn_->Script("ROLLBACK TO SAVEPOINT idem_exec");
      return rows;
    }
    IDEM_RETURN_IF_ERROR(conn_->Script("RELEASE SAVEPOINT idem_exec"));
    return rows;
  }

  Status LockPrincipal(std::string_view tenant, std::string_view user) override {
    std::string principal = std::string(tenant) + '\x1f' + std::string(user);
    // Held until the transaction ends: the claim's second quota count needs no second statement.
    if (principal == locked_) return Ok();
    IDEM_RETURN_IF_ERROR(conn_->Run(Sql().lock_principal, {principal}, nullptr));
    locked_ = std::move(principal);
    return Ok();
  }

  Status Commit() override { return CommitOnce(); }

  // Whether BEGIN (or a later statement) timed out rather than finding the connection dead.
  bool TimedOut() const { return conn_->TimedOut(); }

 private:
  std::string locked_;  // the principal whose advisory lock this transaction holds
};

// LISTENs on its own connection (not the pool's) on a thread, reconnecting with back-off. Its
// connection has the pool's bounds and keepalives, so a vanished server is noticed and left.
class FinishedListener final : public Subscription {
 public:
  FinishedListener(PostgresStoreOptions options, std::function<void(const ScopeHash&)> on_finished)
      : options_(std::move(options)),
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
    caps_.notifications = true;
  }

  const StoreCapabilities& capabilities() const override { return caps_; }

  Result<std::unique_ptr<Subscription>> SubscribeFinished(
      std::function<void(const ScopeHash&)> on_finished) override {
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
      std::unique_lock lock(ping_mu_);
      if (!ping_cv_.wait_until(lock, deadline, [&] { return !pinging_; })) {
        return MakeError(Errc::kUnavailable,
                         "postgres ping: no answer within " + MillisText(timeout));
      }
      pinging_ = true;
    }
    struct Done {
      PostgresStore* store;
      ~Done() {
        {
          std::lock_guard lock(store->ping_mu_);
          store->pinging_ = false;
        }
        store->ping_cv_.notify_one();
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

  Result<std::unique_ptr<StoreTxn>> Begin() override {
    for (int attempt = 0;; ++attempt) {
      IDEM_ASSIGN_OR_RETURN(Lent conn, store_internal::Borrow(*pool_, options_.pool_wait));
      conn->ClearTimedOut();
      auto session = std::make_unique<PostgresSession>(std::move(conn));
      Status begun = session->Begin("BEGIN");
      if (begun) {
        return std::unique_ptr<StoreTxn>(
            std::make_unique<SqlTxn>(std::move(session), Sql(), time_, random_));
      }
      // A connection that died while idle: nothing was sent, so try a fresh one. One that timed
      // out met a stalled server, which another attempt would only wait for again.
      if (attempt >= options_.max_retries || session->TimedOut()) {
        return std::move(begun).error();
      }
    }
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
  std::mutex ping_mu_;
  std::condition_variable ping_cv_;
  bool pinging_ = false;              // guarded by ping_mu_
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
        *conn, Sql(), [&](const std::string& sql) { return conn->Script(sql); }, options.app_name,
        options.app_migrations, clock.Now());
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
  IDEM_RETURN_IF_ERROR(
      store_internal::CheckAppName("postgres", options.app_name, options.app_migrations));
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
