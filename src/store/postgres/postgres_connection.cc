// src/store/postgres/postgres_connection.cc — one libpq connection of the PostgreSQL store:
// nonblocking, a deadline on every call, SQLSTATE-aware errors; and how one is made.
#include <libpq-fe.h>
#include <poll.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "src/store/postgres/postgres_internal.h"

namespace idem::postgres_internal {

Status Connection::ScriptBy(const std::string& sql, SteadyTime deadline) {
  if (broken_) return Dropped();
  if (PQsendQuery(conn_, sql.c_str()) == 0) return Fail(nullptr, "exec");
  IDEM_ASSIGN_OR_RETURN(PgResult res, Await(deadline, "exec"));
  const ExecStatusType status = PQresultStatus(res.get());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) return Fail(res.get(), "exec");
  return Ok();
}

bool Connection::ConsumeNotifications(Millis wait,
                                      const std::function<void(std::string_view)>& on_notify) {
  WaitFor(PQsocket(conn_), POLLIN, Now() + wait);
  if (PQconsumeInput(conn_) == 0) return false;
  while (PGnotify* n = PQnotifies(conn_)) {
    on_notify(n->extra != nullptr ? n->extra : "");
    PQfreemem(n);
  }
  return PQstatus(conn_) == CONNECTION_OK;
}

namespace {

// Parameters as libpq takes them: numbers and times as text, bytes as binary; they point into
// the SqlValues bound, which must outlive them.
struct Bound {
  explicit Bound(const std::vector<SqlValue>& params)
      : text(params.size()),
        values(params.size(), nullptr),
        lengths(params.size(), 0),
        formats(params.size(), 0) {
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
  }
  int Count() const { return static_cast<int>(values.size()); }

  std::vector<std::string> text;
  std::vector<const char*> values;
  std::vector<int> lengths, formats;
};

}  // namespace

Result<std::vector<SqlRow>> Connection::RunBy(std::string_view sql,
                                              const std::vector<SqlValue>& params, int* changed,
                                              bool prepare, SteadyTime deadline) {
  std::vector<store_internal::SqlStep> steps(1);
  steps[0].sql = sql;
  steps[0].params = params;
  steps[0].preparable = prepare;
  IDEM_RETURN_IF_ERROR(PipelineBy(steps, deadline));
  if (changed != nullptr) *changed = steps[0].changed;
  return std::move(steps[0].rows);
}

Status Connection::PipelineBy(std::vector<store_internal::SqlStep>& steps, SteadyTime deadline) {
  if (broken_) return Dropped();
  const SteadyTime start = Now();
  if (PQenterPipelineMode(conn_) == 0) return Fail(nullptr, "pipeline");
  // What was sent, in order: each step, after the preparation of its statement where this
  // connection has not prepared it yet (a prepared statement outlives any transaction).
  struct Sent {
    store_internal::SqlStep* step;  // null: a preparation
    std::string prepared;           // the statement a preparation names
  };
  std::vector<Sent> sent;
  sent.reserve(steps.size() * 2);
  for (store_internal::SqlStep& step : steps) {
    const Bound bound(step.params);
    const std::string statement(step.sql);
    int ok = 0;
    if (prepared_ && step.preparable) {
      auto it = statements_.find(statement);
      if (it == statements_.end()) {
        it = statements_.emplace(statement, "s" + std::to_string(next_statement_++)).first;
        if (PQsendPrepare(conn_, it->second.c_str(), statement.c_str(), bound.Count(), nullptr) ==
            0) {
          statements_.erase(it);
          return Fail(nullptr, "prepare");
        }
        sent.push_back({nullptr, statement});
      }
      ok = PQsendQueryPrepared(conn_, it->second.c_str(), bound.Count(), bound.values.data(),
                               bound.lengths.data(), bound.formats.data(), 1);
    } else {
      ok = PQsendQueryParams(conn_, statement.c_str(), bound.Count(), nullptr, bound.values.data(),
                             bound.lengths.data(), bound.formats.data(), 1);
    }
    // A pipeline that could not be sent whole leaves the connection in no state to reuse.
    if (ok == 0) return Fail(nullptr, "exec");
    sent.push_back({&step, {}});
  }
  if (PQpipelineSync(conn_) == 0) return Fail(nullptr, "exec");
  IDEM_RETURN_IF_ERROR(Flush(deadline, "exec", start));
  // Every result is read, those the server skipped after a failure included, so the connection
  // comes out of the pipeline ready for the next call; the first failure is the answer.
  std::optional<Error> failed;
  for (const Sent& s : sent) {
    const char* what = s.step == nullptr ? "prepare" : "exec";
    IDEM_ASSIGN_OR_RETURN(PgResult res, Collect(deadline, what, start));
    const ExecStatusType status = PQresultStatus(res.get());
    if (status == PGRES_PIPELINE_ABORTED) {
      if (s.step == nullptr) statements_.erase(s.prepared);
      continue;
    }
    if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
      if (s.step == nullptr) statements_.erase(s.prepared);
      if (!failed) failed = Fail(res.get(), what);
      if (broken_) return std::move(*failed);
      continue;
    }
    if (s.step == nullptr || failed) continue;
    const char* tuples = PQcmdTuples(res.get());
    s.step->changed = (tuples != nullptr && *tuples != '\0') ? std::atoi(tuples) : 0;
    auto rows = Rows(res.get());
    if (!rows) {
      failed = std::move(rows).error();
      continue;
    }
    s.step->rows = std::move(*rows);
  }
  IDEM_ASSIGN_OR_RETURN(PgResult sync, Next(deadline, "exec", start));
  if (sync == nullptr || PQresultStatus(sync.get()) != PGRES_PIPELINE_SYNC ||
      PQexitPipelineMode(conn_) == 0) {
    broken_ = true;
    return MakeError(Errc::kUnavailable, "postgres exec: the pipeline did not end as sent");
  }
  if (failed) return std::move(*failed);
  return Ok();
}

bool Connection::IsError(const PGresult* r) {
  const ExecStatusType status = PQresultStatus(r);
  return status == PGRES_FATAL_ERROR || status == PGRES_BAD_RESPONSE;
}

Status Connection::Flush(SteadyTime deadline, const char* what, SteadyTime start) {
  for (;;) {
    const int flushed = PQflush(conn_);
    if (flushed == 0) return Ok();
    if (flushed < 0) return Fail(nullptr, what);
    if (!WaitFor(PQsocket(conn_), POLLIN | POLLOUT, deadline)) return GiveUp(what, start);
    if (PQconsumeInput(conn_) == 0) return Fail(nullptr, what);
  }
}

Result<PgResult> Connection::Next(SteadyTime deadline, const char* what, SteadyTime start) {
  while (PQisBusy(conn_) != 0) {
    if (!WaitFor(PQsocket(conn_), POLLIN, deadline)) return GiveUp(what, start);
    if (PQconsumeInput(conn_) == 0) return Fail(nullptr, what);
  }
  return PgResult(PQgetResult(conn_));
}

Result<PgResult> Connection::Await(SteadyTime deadline, const char* what) {
  const SteadyTime start = Now();
  IDEM_RETURN_IF_ERROR(Flush(deadline, what, start));
  return Collect(deadline, what, start);
}

Result<PgResult> Connection::Collect(SteadyTime deadline, const char* what, SteadyTime start) {
  PgResult kept;
  for (;;) {
    IDEM_ASSIGN_OR_RETURN(PgResult next, Next(deadline, what, start));
    if (next == nullptr) break;
    if (kept == nullptr || !IsError(kept.get())) kept = std::move(next);
  }
  if (kept == nullptr) return Fail(nullptr, what);
  return kept;
}

Error Connection::Dropped() {
  return MakeError(Errc::kUnavailable, "postgres: the connection failed earlier");
}

Error Connection::GiveUp(const char* what, SteadyTime start) {
  broken_ = true;
  timed_out_ = true;
  sqlstate_.clear();
  return MakeError(Errc::kUnavailable,
                   std::string("postgres ") + what + ": no answer within " +
                       MillisText(std::chrono::duration_cast<Millis>(Now() - start)) +
                       "; the connection is dropped");
}

Error Connection::Fail(const PGresult* res, const char* what) {
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

Result<std::string> BusinessSql(std::string_view op, std::string_view sql,
                                const std::vector<SqlValue>& params) {
  int count = 0;
  std::string numbered = store_internal::Numbered(sql, &count);
  IDEM_RETURN_IF_ERROR(store_internal::CheckParameterCount(op, count, params.size()));
  return numbered;
}

}  // namespace idem::postgres_internal
