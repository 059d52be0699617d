// src/store/postgres/postgres_internal.h — what the files of the PostgreSQL store share: its
// values (postgres_values.cc), its deadlines (postgres_deadlines.cc) and one connection
// (postgres_connection.cc). Internal to idem_store_postgres.
#pragma once

#include <libpq-fe.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/store/postgres.h"
#include "src/store/sql.h"

namespace idem::postgres_internal {

struct ResultFree {
  void operator()(PGresult* r) const { PQclear(r); }
};
using PgResult = std::unique_ptr<PGresult, ResultFree>;

// ---- Values: parameters go as text (bytes as binary), results come back binary ---------------

// An instant as PostgreSQL reads timestamptz text: "2026-11-30 06:00:00.123+00".
std::string TimestampText(Timestamp t);
// A double as PostgreSQL reads float8 text, NaN and the infinities included, exactly.
std::string DoubleText(double d);
// The rows of a binary-format result, each value decoded by its column's type (see the SqlValue
// table in store.h). Errors: kInvalidArgument for a type idem does not decode (or an infinite
// timestamp); kDataLoss for a malformed value.
Result<std::vector<SqlRow>> Rows(const PGresult* res);

// ---- Deadlines ---------------------------------------------------------------------------------

// How much longer than statement_timeout the client waits for an answer. The server's own cancel
// (SQLSTATE 57014, the connection kept) normally comes first; silence past it means the server
// or the network stopped.
inline constexpr Millis kAnswerGrace{1000};

// I/O deadlines are read from the real monotonic clock: poll() waits in real time, so an injected
// clock could not drive them.
SteadyTime Now();

// Migrations wait without a deadline (keepalives still find a vanished peer).
inline constexpr SteadyTime kNoDeadline = SteadyTime::max();

// Waits until `fd` is ready for `events`, or has an error for libpq to report; false once
// `deadline` has passed.
bool WaitFor(int fd, short events, SteadyTime deadline);

// "250 ms".
std::string MillisText(Millis ms);

// What a connection is for: the server-side bounds of its session (0: none) and how long the
// client waits for the answer to one call (nullopt: without end).
struct Bounds {
  Millis statement{0};
  Millis lock{0};
  Millis idle_in_transaction{0};
  std::optional<Millis> answer;
};

// The pool's connections and the listener's.
Bounds Bounded(const PostgresTimeouts& t);

// ---- One connection --------------------------------------------------------------------------

// A libpq connection in nonblocking mode: every call is sent, then its answer awaited with poll()
// until a deadline, so nothing the server or the network does blocks a caller without end. Used
// by one thread at a time (the pool lends it).
class Connection final : public store_internal::SqlRunner {
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

  // In one round trip (libpq's pipeline mode): every step sent, then one Sync, then the
  // answers. See SqlRunner::RunAll.
  Status RunAll(std::vector<store_internal::SqlStep>& steps) override {
    return PipelineBy(steps, Deadline());
  }

  // Statements without parameters or results (BEGIN, COMMIT, DDL scripts).
  Status Script(const std::string& sql) { return ScriptBy(sql, Deadline()); }
  Status ScriptBy(const std::string& sql, SteadyTime deadline);

  // Waits up to `wait` for notifications and hands the payload of each to `on_notify`. Returns
  // false once the connection failed.
  bool ConsumeNotifications(Millis wait, const std::function<void(std::string_view)>& on_notify);

  // The SQLSTATE of the last failure ("" if none or the connection broke).
  const std::string& LastSqlstate() const { return sqlstate_; }

 private:
  SteadyTime Deadline() const { return answer_timeout_ ? Now() + *answer_timeout_ : kNoDeadline; }

  Result<std::vector<SqlRow>> RunBy(std::string_view sql, const std::vector<SqlValue>& params,
                                    int* changed, bool prepare, SteadyTime deadline);

  Status PipelineBy(std::vector<store_internal::SqlStep>& steps, SteadyTime deadline);

  static bool IsError(const PGresult* r);

  // Writes out what libpq has queued, by `deadline` (`start`: when the call began, for the
  // message of one given up).
  Status Flush(SteadyTime deadline, const char* what, SteadyTime start);
  // The next result by `deadline`: null at the end of one statement's results.
  Result<PgResult> Next(SteadyTime deadline, const char* what, SteadyTime start);
  // One statement's results up to the null that ends them: the first error, else the last.
  Result<PgResult> Collect(SteadyTime deadline, const char* what, SteadyTime start);

  // Sends what the last PQsend* queued and collects its answer by `deadline`: the first error of
  // a script, else its last result. Past the deadline the connection is given up (closed when the
  // pool drops it). No cancel request is sent: libpq's PQcancel waits without a bound for a
  // server that does not answer, and the server's statement_timeout ends the statement anyway.
  Result<PgResult> Await(SteadyTime deadline, const char* what);

  // A connection that failed or was given up earlier (a statement may still be in flight) sends
  // nothing more; the pool replaces it.
  static Error Dropped();

  Error GiveUp(const char* what, SteadyTime start);

  Error Fail(const PGresult* res, const char* what);

  PGconn* conn_;
  bool prepared_;
  std::optional<Millis> answer_timeout_;
  bool broken_ = false;
  bool timed_out_ = false;
  std::string sqlstate_;
  std::map<std::string, std::string> statements_;  // SQL text → its prepared statement's name
  int next_statement_ = 0;
};

// Connects to options.conninfo by `deadline` — TCP, TLS, authentication and the session's
// settings — with TCP keepalives and in nonblocking mode, and sets `bounds` (and the search_path
// of options.schema) on the session. Errors: kUnavailable.
Result<std::unique_ptr<Connection>> Connect(const PostgresStoreOptions& options,
                                            const Bounds& bounds, SteadyTime deadline);

// Business SQL with '?' placeholders, numbered for PostgreSQL after the parameter count is
// checked (a wrong count is the caller's error, worded as on every backend).
Result<std::string> BusinessSql(std::string_view op, std::string_view sql,
                                const std::vector<SqlValue>& params);

}  // namespace idem::postgres_internal
