// src/store/sql.cc — the records' SQL text and the record operations every SQL backend shares.
#include "src/store/sql.h"

#include <algorithm>

#include "idem/limits.h"

namespace idem::store_internal {
namespace {

constexpr std::string_view kComponent = "idem";

// The records table's columns, in the order RecordFromRow reads them.
constexpr std::string_view kRecordColumns =
    "scope_hash, tenant, user_id, route, request_hash, fp_version, secret_id, state, "
    "recovery_point, resource_id, status_code, response, owner_token, fence, lease_until, "
    "created_at, updated_at, expires_at, sent_at";

// libidem's schema, one entry per version, in a template: {int} and {bytes} are the dialect's
// type names, {table_options} its options for the records table. Never edit an applied entry;
// append a new one.
const std::vector<Migration>& SchemaTemplate() {
  static const std::vector<Migration> kTemplate = {
      {1, R"sql(
CREATE TABLE idem_records (
  scope_hash     {bytes} PRIMARY KEY,
  tenant         TEXT NOT NULL,
  user_id        TEXT NOT NULL,
  route          TEXT NOT NULL,
  request_hash   {bytes} NOT NULL,
  fp_version     {int} NOT NULL,
  secret_id      {int} NOT NULL,
  state          TEXT NOT NULL
                 CHECK (state IN ('PROCESSING','SUCCEEDED','FAILED_FINAL','FAILED_RETRYABLE')),
  recovery_point TEXT NOT NULL DEFAULT '',
  resource_id    TEXT NOT NULL DEFAULT '',
  status_code    {int} NOT NULL DEFAULT 0,
  response       {bytes},
  owner_token    {bytes} NOT NULL,
  fence          {int} NOT NULL,
  lease_until    {int} NOT NULL,
  created_at     {int} NOT NULL,
  updated_at     {int} NOT NULL,
  expires_at     {int} NOT NULL
){table_options};
CREATE INDEX idem_records_quota ON idem_records (tenant, user_id, state);
CREATE INDEX idem_records_expiry ON idem_records (expires_at);
)sql"},
      // The takeover loop's scan of one route's expired leases: PROCESSING records, and retryable
      // failures (those past a send are listed too; which points those are is the route's, so
      // the point is a filter, not part of the index). PostgreSQL stores made before the schema
      // had one text have an index on lease_until alone, which this replaces.
      {2, R"sql(
DROP INDEX IF EXISTS idem_records_stale;
CREATE INDEX idem_records_stale_by_route ON idem_records (route, lease_until)
  WHERE state IN ('PROCESSING', 'FAILED_RETRYABLE');
)sql"},
      // When a request last left (Record::sent_at): updated_at moves with every renewal.
      {3, R"sql(
ALTER TABLE idem_records ADD COLUMN sent_at {int} NOT NULL DEFAULT 0;
)sql"},
      // Each principal's number of records, kept by the database on every insert and delete, so
      // the retained-keys quota reads one row however long the history (counting the records
      // read up to max_retained index entries per claim). The triggers come first: on
      // PostgreSQL creating them locks out writers until the count below has committed.
      {4, R"sql(
CREATE TABLE idem_retained (
  tenant  TEXT NOT NULL,
  user_id TEXT NOT NULL,
  records {int} NOT NULL,
  PRIMARY KEY (tenant, user_id)
){table_options};
{retained_triggers}
INSERT INTO idem_retained (tenant, user_id, records)
  SELECT tenant, user_id, count(*) FROM idem_records GROUP BY tenant, user_id;
)sql"},
      // A claim's insert counts in idem_retained as it commits (where the dialect says so).
      {5, R"sql(
{retained_insert_at_commit}
)sql"},
      // Held outcomes, for an operator to list and settle (Store::ListHeld): few, and never in
      // the way of the records' other indexes.
      {6, R"sql(
CREATE INDEX idem_records_held ON idem_records (updated_at)
  WHERE state = 'FAILED_FINAL' AND recovery_point = 'outcome_unknown';
)sql"},
  };
  return kTemplate;
}

std::string ReplaceAll(std::string text, std::string_view from, std::string_view to) {
  for (std::size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

std::string RenderSchema(const Dialect& d, std::string text) {
  text = ReplaceAll(std::move(text), "{int}", d.integer_type);
  text = ReplaceAll(std::move(text), "{bytes}", d.bytes_type);
  text = ReplaceAll(std::move(text), "{retained_triggers}", d.retained_triggers);
  text = ReplaceAll(std::move(text), "{retained_insert_at_commit}", d.retained_insert_at_commit);
  return ReplaceAll(std::move(text), "{table_options}", d.record_table_options);
}

// A statement for `d`: {now} becomes the dialect's time of the statement (one parameter at each
// occurrence, bound by SqlTxn::Now), and '?' placeholders take the dialect's form.
std::string Render(const Dialect& d, std::string_view sql) {
  std::string text = ReplaceAll(std::string(sql), "{now}", d.now);
  return d.numbered_placeholders ? Numbered(text) : text;
}

template <std::size_t N>
Status CopyBytes(const SqlValue& v, std::array<uint8_t, N>* out, const char* column) {
  const Blob* b = std::get_if<Blob>(&v);
  if (b == nullptr || b->bytes.size() != N) {
    return MakeError(Errc::kDataLoss, std::string("record column ") + column + " is malformed");
  }
  std::copy(b->bytes.begin(), b->bytes.end(), out->begin());
  return Ok();
}

// A record row is its columns followed by the store's time of the statement that read it.
// Errors: kDataLoss for a row that is not a record.
Result<Record> RecordFromRow(const SqlRow& row) {
  if (row.size() != 20) return MakeError(Errc::kDataLoss, "record row has the wrong shape");
  auto text = [&](std::size_t i) -> std::string {
    const std::string* s = std::get_if<std::string>(&row[i]);
    return s ? *s : std::string();
  };
  auto integer = [&](std::size_t i) -> int64_t {
    const int64_t* n = std::get_if<int64_t>(&row[i]);
    return n ? *n : 0;
  };
  Record r;
  IDEM_RETURN_IF_ERROR(CopyBytes(row[0], &r.scope, "scope_hash"));
  r.tenant = text(1);
  r.user = text(2);
  r.route = text(3);
  IDEM_RETURN_IF_ERROR(CopyBytes(row[4], &r.fingerprint.mac, "request_hash"));
  r.fingerprint.rules_version = static_cast<uint32_t>(integer(5));
  r.fingerprint.secret_id = static_cast<uint32_t>(integer(6));
  IDEM_ASSIGN_OR_RETURN(r.state, ParseRecordState(text(7)));
  r.recovery_point = text(8);
  r.resource_id = text(9);
  r.status_code = static_cast<int>(integer(10));
  if (const Blob* b = std::get_if<Blob>(&row[11])) r.response = b->bytes;
  IDEM_RETURN_IF_ERROR(CopyBytes(row[12], &r.lease.owner, "owner_token"));
  r.lease.fence = integer(13);
  r.lease.until = FromUnixMillis(integer(14));
  r.created_at = FromUnixMillis(integer(15));
  r.updated_at = FromUnixMillis(integer(16));
  r.expires_at = FromUnixMillis(integer(17));
  r.sent_at = FromUnixMillis(integer(18));
  r.observed_at = FromUnixMillis(integer(19));
  return r;
}

Error Fenced(const char* op) {
  return MakeError(Errc::kFenced,
                   std::string(op) + ": lease lost (owner token or fence no longer match)");
}

Result<std::vector<Record>> Records(const std::vector<SqlRow>& rows) {
  std::vector<Record> records;
  records.reserve(rows.size());
  for (const SqlRow& row : rows) {
    IDEM_ASSIGN_OR_RETURN(Record r, RecordFromRow(row));
    records.push_back(std::move(r));
  }
  return records;
}

Result<int64_t> SchemaVersion(SqlRunner& conn, const RecordSql& sql, std::string_view component) {
  IDEM_ASSIGN_OR_RETURN(auto rows, conn.Run(sql.schema_version, {std::string(component)}, nullptr));
  return SingleInteger(rows, "schema version");
}

int64_t Newest(const std::vector<Migration>& migrations) {
  int64_t newest = 0;
  for (const Migration& m : migrations) newest = std::max<int64_t>(newest, m.version);
  return newest;
}

Error NewerSchema(std::string_view component, int64_t current, int64_t known) {
  return MakeError(Errc::kDataLoss, "schema of '" + std::string(component) + "' is at version " +
                                        std::to_string(current) + ", newer than this build (" +
                                        std::to_string(known) + ")");
}

// Applies the migrations of `component` newer than the database's, in order.
Status Migrate(SqlRunner& conn, const RecordSql& sql,
               const std::function<Status(const std::string&)>& script, std::string_view component,
               const std::vector<Migration>& migrations, Timestamp now) {
  IDEM_ASSIGN_OR_RETURN(int64_t current, SchemaVersion(conn, sql, component));
  const int64_t known = Newest(migrations);
  if (current > known) return NewerSchema(component, current, known);
  for (const Migration& m : migrations) {
    if (m.version <= current) continue;
    if (Status s = script(m.sql); !s) {
      return MakeError(Errc::kInvalidArgument, "migration " + std::string(component) + " v" +
                                                   std::to_string(m.version) + ": " +
                                                   s.error().message);
    }
    IDEM_RETURN_IF_ERROR(conn.Run(sql.schema_insert,
                                  {std::string(component), int64_t{m.version}, ToUnixMillis(now)},
                                  nullptr));
  }
  return Ok();
}

}  // namespace

const Dialect& SqliteDialect() {
  // INTEGER is SQLite's 64-bit integer; WITHOUT ROWID keys the table on scope_hash itself.
  // The store's time is the caller's clock: a SQLite file is used from one machine.
  static const Dialect kDialect{"sqlite", "INTEGER", "BLOB", " WITHOUT ROWID", false, "", "", "?",
                                R"sql(
CREATE TRIGGER idem_retained_insert AFTER INSERT ON idem_records BEGIN
  INSERT INTO idem_retained (tenant, user_id, records) VALUES (NEW.tenant, NEW.user_id, 1)
    ON CONFLICT (tenant, user_id) DO UPDATE SET records = records + 1;
END;
CREATE TRIGGER idem_retained_delete AFTER DELETE ON idem_records BEGIN
  UPDATE idem_retained SET records = records - 1
    WHERE tenant = OLD.tenant AND user_id = OLD.user_id;
END;
)sql",
                                // One writer at a time: nothing to gain from counting later.
                                "-- the insert trigger stays as migration 4 made it", false,
                                // BEGIN IMMEDIATE already holds the database's write lock.
                                ""};
  return kDialect;
}

const Dialect& PostgresDialect(bool notify_finished) {
  static const Dialect kDialect{
      "postgres", "BIGINT", "BYTEA", "", true, " FOR UPDATE SKIP LOCKED",
      // Delivered to listeners when (and only if) the transaction commits.
      " RETURNING pg_notify('idem_finished', encode(scope_hash, 'hex'))",
      // The database's clock when the statement arrived, shared by every instance; a bound
      // value replaces it only for a store opened with a clock of its own (tests).
      "COALESCE(?::bigint, floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint)",
      // A sweep's DELETE updates each principal's count once, taking the counters' locks in
      // one order, so sweepers of several instances cannot deadlock on them.
      R"sql(
CREATE FUNCTION idem_retained_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO idem_retained AS r (tenant, user_id, records) VALUES (NEW.tenant, NEW.user_id, 1)
    ON CONFLICT (tenant, user_id) DO UPDATE SET records = r.records + 1;
  RETURN NULL;
END $$;
CREATE FUNCTION idem_retained_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM idem_retained r
    WHERE (r.tenant, r.user_id) IN (SELECT tenant, user_id FROM gone)
    ORDER BY r.tenant, r.user_id FOR UPDATE;
  UPDATE idem_retained r SET records = r.records - g.n
    FROM (SELECT tenant, user_id, count(*) AS n FROM gone GROUP BY tenant, user_id) g
    WHERE r.tenant = g.tenant AND r.user_id = g.user_id;
  RETURN NULL;
END $$;
CREATE TRIGGER idem_retained_insert AFTER INSERT ON idem_records
  FOR EACH ROW EXECUTE FUNCTION idem_retained_insert();
CREATE TRIGGER idem_retained_delete AFTER DELETE ON idem_records
  REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION idem_retained_delete();
)sql",
      // Fired immediately, the insert trigger took the principal's counter row at a claim's first
      // statement and held it to the commit: every claim of one principal waited for the whole of
      // the one before. Deferred, it runs as the claim commits, under the principal's lock
      // (count_any_locked), which the quota count takes last. (A record inserted and deleted in one
      // transaction of a principal without a counter row leaves it one too high: a quota only
      // ever errs towards refusing.)
      R"sql(
DROP TRIGGER idem_retained_insert ON idem_records;
CREATE CONSTRAINT TRIGGER idem_retained_insert AFTER INSERT ON idem_records
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION idem_retained_insert();
)sql",
      true,
      // Claims of one principal on several connections (or instances) serialise their quota
      // counts on the principal's counter row, until their transactions end: the upsert waits for
      // the row's holder, then reads (and locks) the row's latest version, the count the holder
      // committed. It makes the row of a principal that has none yet, so a principal's first
      // claims serialise too. A row lock and nothing else: no advisory lock, nothing a
      // distributed PostgreSQL lacks (the row lives on the tenant's shard).
      "INSERT INTO idem_retained AS r (tenant, user_id, records) VALUES (?, ?, 0) "
      "ON CONFLICT (tenant, user_id) DO UPDATE SET records = r.records RETURNING records"};
  static const Dialect kQuiet = [] {
    Dialect quiet = kDialect;
    quiet.on_finish = "";
    return quiet;
  }();
  return notify_finished ? kDialect : kQuiet;
}

std::string Numbered(std::string_view sql, int* count) {
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
  if (count != nullptr) *count = n;
  return out;
}

Status CheckParameterCount(std::string_view op, int expected, std::size_t got) {
  if (static_cast<std::size_t>(expected) == got) return Ok();
  return MakeError(Errc::kInvalidArgument, std::string(op) + ": statement takes " +
                                               std::to_string(expected) + " parameters, got " +
                                               std::to_string(got));
}

RecordSql::RecordSql(const Dialect& d) : dialect(d) {
  for (const Migration& m : SchemaTemplate())
    migrations.push_back({m.version, RenderSchema(d, m.sql)});
  const std::string columns(kRecordColumns);
  create_schema_table = RenderSchema(
      d,
      "CREATE TABLE IF NOT EXISTS idem_schema (component TEXT NOT NULL, version {int} NOT NULL, "
      "applied_at {int} NOT NULL, PRIMARY KEY (component, version))");
  schema_version =
      Render(d, "SELECT coalesce(max(version), 0) FROM idem_schema WHERE component = ?");
  schema_insert =
      Render(d, "INSERT INTO idem_schema (component, version, applied_at) VALUES (?, ?, ?)");
  // Every time a statement writes or compares is {now}, the store's time of that statement, and
  // every record a statement returns comes with it (Record::observed_at): instances whose own
  // clocks disagree still decide a lease, an expiry or a settle window by one clock.
  const std::string returning = " RETURNING " + columns + ", {now}";
  get = Render(d, "SELECT " + columns + ", {now} FROM idem_records WHERE scope_hash = ?");
  claim =
      Render(d, "INSERT INTO idem_records (" + columns +
                    ") VALUES (?, ?, ?, ?, ?, ?, ?, 'PROCESSING', '', '', 0, NULL, ?, ?, "
                    "{now} + ?, {now}, {now}, {now} + ?, 0) ON CONFLICT (scope_hash) DO NOTHING" +
                    returning);
  // An expired, finished record starts a new operation: all columns from the spec. An expired
  // PROCESSING record is still unresolved (a charge may have left) and is only taken over.
  reclaim_fresh =
      Render(d,
             "UPDATE idem_records SET tenant = ?, user_id = ?, route = ?, request_hash = ?, "
             "fp_version = ?, secret_id = ?, state = 'PROCESSING', recovery_point = '', "
             "resource_id = '', status_code = 0, response = NULL, owner_token = ?, fence = ?, "
             "lease_until = {now} + ?, created_at = {now}, updated_at = {now}, "
             "expires_at = {now} + ?, sent_at = 0 "
             "WHERE scope_hash = ? AND fence = ? AND expires_at <= {now} AND "
             "state <> 'PROCESSING'");
  // A takeover of an expired lease, or a retry after a retryable failure: the same operation,
  // kept for at least a full retention from now (never shortened), so an outcome reached after
  // a late resume is replayable for as long as a fresh one.
  reclaim_resume =
      Render(d,
             "UPDATE idem_records SET state = 'PROCESSING', owner_token = ?, fence = ?, "
             "lease_until = {now} + ?, updated_at = {now}, "
             "expires_at = CASE WHEN expires_at < {now} + ? THEN {now} + ? ELSE expires_at END "
             "WHERE scope_hash = ? AND fence = ? AND "
             "(state = 'FAILED_RETRYABLE' OR (state = 'PROCESSING' AND lease_until < {now}))");
  renew = Render(d,
                 "UPDATE idem_records SET lease_until = {now} + ?, updated_at = {now} "
                 "WHERE scope_hash = ? AND owner_token = ? AND fence = ? AND "
                 "state = 'PROCESSING' RETURNING lease_until");
  // The advances return the record they wrote, which this transaction then reads without a
  // statement (SqlTxn::Get).
  advance =
      Render(d,
             "UPDATE idem_records SET recovery_point = ?, "
             "resource_id = CASE WHEN ? = '' THEN resource_id ELSE ? END, updated_at = {now} "
             "WHERE scope_hash = ? AND owner_token = ? AND fence = ? AND state = 'PROCESSING'" +
                 returning);
  // The step before an external call: the lease must still run when the call's deadline (and
  // the margin) has passed, so no takeover can happen while the call may be out.
  advance_covered =
      Render(d,
             "UPDATE idem_records SET recovery_point = ?, updated_at = {now}, sent_at = {now} "
             "WHERE scope_hash = ? AND owner_token = ? AND fence = ? AND state = 'PROCESSING' AND "
             "lease_until >= {now} + ?" +
                 returning);
  finish = Render(
      d,
      "UPDATE idem_records SET state = ?, status_code = ?, response = ?, "
      "recovery_point = CASE WHEN ? = '' THEN recovery_point ELSE ? END, updated_at = {now}, "
      "expires_at = CASE WHEN expires_at <= {now} THEN {now} + ? ELSE expires_at END "
      "WHERE scope_hash = ? AND owner_token = ? AND fence = ? AND state = 'PROCESSING'" +
          std::string(d.on_finish));
  // Only a held outcome, and only the one the operator looked at (its fence).
  settle = Render(d,
                  "UPDATE idem_records SET state = ?, status_code = ?, response = ?, "
                  "recovery_point = ?, fence = fence + 1, updated_at = {now} "
                  "WHERE scope_hash = ? AND fence = ? AND state = 'FAILED_FINAL' AND "
                  "recovery_point = 'outcome_unknown' AND expires_at > {now}");
  // One row, whatever the history (migration 4); capped at the limit by SqlTxn::Count.
  count_any = Render(d,
                     "SELECT coalesce((SELECT records FROM idem_retained WHERE tenant = ? AND "
                     "user_id = ?), 0)");
  count_any_locked = d.count_any_locked.empty() ? std::string() : Render(d, d.count_any_locked);
  // Bounded by LIMIT, so a quota check costs at most the quota's index entries.
  count_state = Render(d,
                       "SELECT count(*) FROM (SELECT 1 FROM idem_records WHERE tenant = ? AND "
                       "user_id = ? AND state = ? LIMIT ?) AS bounded");
  // The state term repeats the partial index's predicate word for word: SQLite uses a partial
  // index only for a query with that very term. The sent points fill a fixed number of slots
  // (unused ones repeat '', the point of a fresh claim, which is never past a send).
  std::string sent_slots;
  for (std::size_t i = 0; i < limits::kMaxSentPoints; ++i) sent_slots += i == 0 ? "?" : ", ?";
  list_stale = Render(d, "SELECT " + columns +
                             ", {now} FROM idem_records WHERE route = ? AND "
                             "state IN ('PROCESSING', 'FAILED_RETRYABLE') AND lease_until < {now} "
                             "AND (state = 'PROCESSING' OR (recovery_point <> '' AND "
                             "recovery_point IN (" +
                             sent_slots + "))) ORDER BY lease_until LIMIT ?");
  // The WHERE repeats the partial index's (idem_records_held); ? = '' lists every route.
  list_held = Render(d, "SELECT " + columns +
                            ", {now} FROM idem_records WHERE state = 'FAILED_FINAL' AND "
                            "recovery_point = 'outcome_unknown' AND expires_at > {now} AND "
                            "(CAST(? AS TEXT) = '' OR route = ?) ORDER BY updated_at LIMIT ?");
  sweep =
      Render(d,
             "DELETE FROM idem_records WHERE scope_hash IN (SELECT scope_hash FROM "
             "idem_records WHERE expires_at <= {now} AND state <> 'PROCESSING' AND NOT "
             "(state = 'FAILED_RETRYABLE' AND recovery_point <> '' AND recovery_point IN (" +
                 sent_slots + ")) ORDER BY expires_at LIMIT ?" + std::string(d.sweep_lock) + ")");
  // The WHERE is the partial index's own (idem_records_stale_by_route), which SQLite uses only
  // when the query repeats it.
  census_unfinished = Render(d,
                             "SELECT state, count(*), min(created_at), {now}, route FROM "
                             "idem_records WHERE state IN ('PROCESSING', 'FAILED_RETRYABLE') "
                             "GROUP BY state, route");
  census_retained = Render(d,
                           "SELECT CAST(COALESCE(sum(records), 0) AS BIGINT), {now} "
                           "FROM idem_retained");
}

// ---- SqlTxn ----------------------------------------------------------------------------------

SqlTxn::SqlTxn(std::unique_ptr<TxnSession> session, const RecordSql& sql, StoreTime time,
               Random& random)
    : session_(std::move(session)), sql_(sql), time_(time), random_(random) {}

Result<int> SqlTxn::Change(const std::string& sql, const std::vector<SqlValue>& params) {
  int changed = 0;
  IDEM_RETURN_IF_ERROR(session_->Run(sql, params, &changed));
  return changed;
}

Result<ClaimResult> SqlTxn::Claim(const ClaimSpec& spec) {
  OwnerToken owner;
  random_.Fill(owner);
  const SqlValue now = time_.Param();
  IDEM_ASSIGN_OR_RETURN(
      auto rows,
      session_->Run(sql_.claim,
                    {BytesOf(spec.scope), spec.tenant, spec.user, spec.route,
                     BytesOf(spec.fingerprint.mac), int64_t{spec.fingerprint.rules_version},
                     int64_t{spec.fingerprint.secret_id}, BytesOf(owner), int64_t{1}, now,
                     spec.lease_ttl.count(), now, now, now, spec.retention.count(), now},
                    nullptr));
  if (!rows.empty()) {
    IDEM_ASSIGN_OR_RETURN(Record r, RecordFromRow(rows[0]));
    inserted_.emplace_back(spec.tenant, spec.user);
    written_ = r;
    return ClaimResult{true, std::move(r)};
  }
  // The conflicting insert has committed (the insert waited for it), so this read sees it,
  // unless a sweeper deleted it in between: worth another try.
  IDEM_ASSIGN_OR_RETURN(auto existing, Get(spec.scope));
  if (!existing) return MakeError(Errc::kUnavailable, "claim: conflicting record vanished");
  return ClaimResult{false, std::move(*existing)};
}

Result<Record> SqlTxn::Reclaim(const ClaimSpec& spec, int64_t seen_fence) {
  written_.reset();
  OwnerToken owner;
  random_.Fill(owner);
  const int64_t fence = seen_fence + 1;
  const SqlValue now = time_.Param();
  IDEM_ASSIGN_OR_RETURN(
      int changed,
      Change(sql_.reclaim_fresh,
             {spec.tenant, spec.user, spec.route, BytesOf(spec.fingerprint.mac),
              int64_t{spec.fingerprint.rules_version}, int64_t{spec.fingerprint.secret_id},
              BytesOf(owner), fence, now, spec.lease_ttl.count(), now, now, now,
              spec.retention.count(), BytesOf(spec.scope), seen_fence, now}));
  if (changed == 0) {
    // Kept for at least a full retention from now.
    IDEM_ASSIGN_OR_RETURN(changed, Change(sql_.reclaim_resume,
                                          {BytesOf(owner), fence, now, spec.lease_ttl.count(), now,
                                           now, spec.retention.count(), now, spec.retention.count(),
                                           BytesOf(spec.scope), seen_fence, now}));
  }
  IDEM_ASSIGN_OR_RETURN(std::optional<Record> current, Get(spec.scope));
  if (!current) return MakeError(Errc::kNotFound, "reclaim: record is gone");
  if (changed == 0) {
    return MakeError(Errc::kConflict, "reclaim: record moved on (fence " +
                                          std::to_string(current->lease.fence) + ", state " +
                                          std::string(RecordStateName(current->state)) + ")");
  }
  return std::move(*current);
}

Result<Lease> SqlTxn::Renew(const ScopeHash& scope, const Lease& lease, Millis ttl) {
  written_.reset();
  const SqlValue now = time_.Param();
  IDEM_ASSIGN_OR_RETURN(auto rows, session_->Run(sql_.renew,
                                                 {now, ttl.count(), now, BytesOf(scope),
                                                  BytesOf(lease.owner), lease.fence},
                                                 nullptr));
  if (rows.empty()) return Fenced("renew");
  IDEM_ASSIGN_OR_RETURN(int64_t until_ms, SingleInteger(rows, "renew"));
  Lease renewed = lease;
  renewed.until = FromUnixMillis(until_ms);
  return renewed;
}

Status SqlTxn::Advance(const ScopeHash& scope, const Lease& lease, std::string_view point,
                       std::string_view resource_id) {
  IDEM_RETURN_IF_ERROR(CheckProgress(point, resource_id));
  written_.reset();
  IDEM_ASSIGN_OR_RETURN(auto rows,
                        session_->Run(sql_.advance,
                                      {std::string(point), std::string(resource_id),
                                       std::string(resource_id), time_.Param(), BytesOf(scope),
                                       BytesOf(lease.owner), lease.fence, time_.Param()},
                                      nullptr));
  if (rows.empty()) return Fenced("advance");
  return Wrote(rows[0]);
}

Status SqlTxn::Wrote(const SqlRow& row) {
  IDEM_ASSIGN_OR_RETURN(Record r, RecordFromRow(row));
  written_ = std::move(r);
  return Ok();
}

Status SqlTxn::AdvanceCovered(const ScopeHash& scope, const Lease& lease, std::string_view point,
                              Millis must_cover) {
  IDEM_RETURN_IF_ERROR(CheckProgress(point, {}));
  written_.reset();
  const SqlValue now = time_.Param();
  IDEM_ASSIGN_OR_RETURN(
      auto rows, session_->Run(sql_.advance_covered,
                               {std::string(point), now, now, BytesOf(scope), BytesOf(lease.owner),
                                lease.fence, now, must_cover.count(), now},
                               nullptr));
  if (!rows.empty()) return Wrote(rows[0]);
  // Nothing matched: a lost lease (stop) or a held one that ends too soon (renew, or give up).
  IDEM_ASSIGN_OR_RETURN(std::optional<Record> current, Get(scope));
  if (current && current->state == RecordState::kProcessing &&
      current->lease.owner == lease.owner && current->lease.fence == lease.fence) {
    const Millis left =
        std::chrono::duration_cast<Millis>(current->lease.until - current->observed_at);
    return MakeError(Errc::kConflict, "advance: the lease ends in " + std::to_string(left.count()) +
                                          " ms, before the call it must cover would (" +
                                          std::to_string(must_cover.count()) + " ms); renew first");
  }
  return Fenced("advance");
}

Status SqlTxn::Finish(const ScopeHash& scope, const Lease& lease, const Outcome& outcome) {
  IDEM_CHECK(outcome.state != RecordState::kProcessing);
  IDEM_RETURN_IF_ERROR(CheckProgress(outcome.recovery_point, {}));
  written_.reset();
  SqlValue response =
      outcome.sealed_response.empty() ? SqlValue{} : SqlValue{Blob{outcome.sealed_response}};
  const SqlValue now = time_.Param();
  IDEM_ASSIGN_OR_RETURN(
      int changed,
      Change(sql_.finish,
             {std::string(RecordStateName(outcome.state)), int64_t{outcome.status_code},
              std::move(response), outcome.recovery_point, outcome.recovery_point, now, now, now,
              outcome.retention.count(), BytesOf(scope), BytesOf(lease.owner), lease.fence}));
  if (changed == 0) return Fenced("finish");
  return Ok();
}

Status SqlTxn::Settle(const ScopeHash& scope, int64_t seen_fence, const Outcome& outcome) {
  IDEM_RETURN_IF_ERROR(CheckSettlement(outcome));
  written_.reset();
  SqlValue response =
      outcome.sealed_response.empty() ? SqlValue{} : SqlValue{Blob{outcome.sealed_response}};
  IDEM_ASSIGN_OR_RETURN(int changed,
                        Change(sql_.settle, {std::string(RecordStateName(outcome.state)),
                                             int64_t{outcome.status_code}, std::move(response),
                                             outcome.recovery_point, time_.Param(), BytesOf(scope),
                                             seen_fence, time_.Param()}));
  if (changed == 1) return Ok();
  IDEM_ASSIGN_OR_RETURN(std::optional<Record> now, Get(scope));
  return SettleRefused(now, seen_fence);
}

Result<std::optional<Record>> SqlTxn::Get(const ScopeHash& scope) {
  // The record this transaction's last record statement wrote is what a read would find: the
  // write holds it (its row lock, or SQLite's one writer) until the transaction ends. Its time is
  // that statement's.
  if (written_ && written_->scope == scope) return std::optional<Record>(*written_);
  return GetRecord(*session_, sql_, time_, scope);
}

Result<SqlTxn::Counts> SqlTxn::Counted(std::string_view tenant, std::string_view user,
                                       bool retained, std::optional<SqlStep> state_count) {
  // Claims of one principal serialise on its lock until their transactions end, so a quota
  // counted after the claim's own write is exact across processes. The locking count comes first
  // in the round trip, and the state count is a statement of its own, whose snapshot is taken once
  // the lock is held.
  std::string principal = std::string(tenant) + '\x1f' + std::string(user);
  const bool lock = !sql_.count_any_locked.empty() && principal != locked_;
  std::vector<SqlStep> steps;
  if (lock || retained) {
    steps.emplace_back(lock ? sql_.count_any_locked : sql_.count_any, AnyParams(tenant, user));
  }
  if (state_count) steps.push_back(std::move(*state_count));
  IDEM_RETURN_IF_ERROR(session_->RunAll(steps));
  if (lock) locked_ = std::move(principal);
  Counts out;
  std::size_t i = 0;
  if (lock || retained) {
    IDEM_ASSIGN_OR_RETURN(out.retained, SingleInteger(steps[i++].rows, "count"));
  }
  if (state_count) {
    IDEM_ASSIGN_OR_RETURN(out.state, SingleInteger(steps[i].rows, "count"));
  }
  return out;
}

std::vector<SqlValue> SqlTxn::AnyParams(std::string_view tenant, std::string_view user) {
  return {std::string(tenant), std::string(user)};
}

int64_t SqlTxn::Retained(std::string_view tenant, std::string_view user, int64_t counted,
                         int64_t limit) const {
  if (sql_.dialect.retained_counted_at_commit) {
    counted += std::count_if(inserted_.begin(), inserted_.end(),
                             [&](const auto& p) { return p.first == tenant && p.second == user; });
  }
  return limit < 0 ? counted : std::min(counted, limit);  // as LIMIT reads a negative one
}

Result<int64_t> SqlTxn::Count(std::string_view tenant, std::string_view user,
                              std::optional<RecordState> state, int64_t limit) {
  if (!state) {
    IDEM_ASSIGN_OR_RETURN(Counts n, Counted(tenant, user, true, std::nullopt));
    return Retained(tenant, user, n.retained, limit);
  }
  IDEM_ASSIGN_OR_RETURN(Counts n, Counted(tenant, user, false,
                                          SqlStep{sql_.count_state,
                                                  {std::string(tenant), std::string(user),
                                                   std::string(RecordStateName(*state)), limit}}));
  return n.state;
}

Result<StoreTxn::QuotaCounts> SqlTxn::CountQuota(std::string_view tenant, std::string_view user,
                                                 int64_t processing_limit, int64_t retained_limit) {
  IDEM_ASSIGN_OR_RETURN(
      Counts n,
      Counted(tenant, user, true,
              SqlStep{sql_.count_state,
                      {std::string(tenant), std::string(user),
                       std::string(RecordStateName(RecordState::kProcessing)), processing_limit}}));
  return QuotaCounts{n.state, Retained(tenant, user, n.retained, retained_limit)};
}

Result<std::vector<SqlRow>> SqlTxn::Exec(std::string_view sql,
                                         const std::vector<SqlValue>& params) {
  written_.reset();  // business SQL may write any table
  return session_->Exec(sql, params);
}

Status SqlTxn::Commit() {
  IDEM_CHECK(!committed_);
  IDEM_RETURN_IF_ERROR(session_->Commit());
  committed_ = true;
  for (const auto& fn : after_commit_) fn();
  return Ok();
}

// ---- Outside transactions --------------------------------------------------------------------

Result<std::optional<Record>> GetRecord(SqlRunner& conn, const RecordSql& sql, StoreTime time,
                                        const ScopeHash& scope) {
  IDEM_ASSIGN_OR_RETURN(auto rows, conn.Run(sql.get, {time.Param(), BytesOf(scope)}, nullptr));
  if (rows.empty()) return std::optional<Record>();
  IDEM_ASSIGN_OR_RETURN(Record r, RecordFromRow(rows[0]));
  return std::optional<Record>(std::move(r));
}

namespace {

// Appends `sent_points` to `params` in limits::kMaxSentPoints slots (unused ones ''). Errors:
// kInvalidArgument for too many, or an empty one.
Status AppendSentPoints(std::string_view op, const std::vector<std::string>& sent_points,
                        std::vector<SqlValue>& params) {
  if (sent_points.size() > limits::kMaxSentPoints) {
    return MakeError(Errc::kInvalidArgument, std::string(op) + ": more than " +
                                                 std::to_string(limits::kMaxSentPoints) +
                                                 " recovery points past the send");
  }
  for (std::size_t i = 0; i < limits::kMaxSentPoints; ++i) {
    if (i < sent_points.size() && sent_points[i].empty()) {
      return MakeError(Errc::kInvalidArgument,
                       std::string(op) + ": an empty recovery point is no send");
    }
    params.emplace_back(i < sent_points.size() ? sent_points[i] : std::string());
  }
  return Ok();
}

}  // namespace

Result<std::vector<Record>> ListStaleRecords(SqlRunner& conn, const RecordSql& sql,
                                             std::string_view route,
                                             const std::vector<std::string>& sent_points,
                                             StoreTime time, int limit) {
  const SqlValue now = time.Param();
  std::vector<SqlValue> params{now, std::string(route), now};
  IDEM_RETURN_IF_ERROR(AppendSentPoints("list stale", sent_points, params));
  params.emplace_back(int64_t{limit});
  IDEM_ASSIGN_OR_RETURN(auto rows, conn.Run(sql.list_stale, params, nullptr));
  return Records(rows);
}

Result<std::vector<Record>> ListHeldRecords(SqlRunner& conn, const RecordSql& sql,
                                            std::string_view route, StoreTime time, int limit) {
  IDEM_ASSIGN_OR_RETURN(auto rows, conn.Run(sql.list_held,
                                            {time.Param(), time.Param(), std::string(route),
                                             std::string(route), int64_t{limit}},
                                            nullptr));
  return Records(rows);
}

Result<int> SweepRecords(SqlRunner& conn, const RecordSql& sql, StoreTime time, int batch,
                         const std::vector<std::string>& sent_points) {
  std::vector<SqlValue> params{time.Param()};
  IDEM_RETURN_IF_ERROR(AppendSentPoints("sweep", sent_points, params));
  params.emplace_back(int64_t{batch});
  int changed = 0;
  IDEM_RETURN_IF_ERROR(conn.Run(sql.sweep, params, &changed));
  return changed;
}

Result<RecordCensus> CensusRecords(SqlRunner& conn, const RecordSql& sql, StoreTime time) {
  auto integer = [](const SqlValue& v) -> std::optional<int64_t> {
    const int64_t* n = std::get_if<int64_t>(&v);
    return n != nullptr ? std::optional<int64_t>(*n) : std::nullopt;
  };
  RecordCensus census;
  IDEM_ASSIGN_OR_RETURN(auto rows, conn.Run(sql.census_unfinished, {time.Param()}, nullptr));
  for (const SqlRow& row : rows) {
    const std::string* state = row.size() == 5 ? std::get_if<std::string>(&row[0]) : nullptr;
    const std::optional<int64_t> count = row.size() == 5 ? integer(row[1]) : std::nullopt;
    const std::string* route = row.size() == 5 ? std::get_if<std::string>(&row[4]) : nullptr;
    if (state == nullptr || !count || route == nullptr) {
      return MakeError(Errc::kDataLoss, "census: malformed row");
    }
    if (*state == "PROCESSING") {
      census.processing += *count;
      census.processing_by_route[*route] = *count;
      const std::optional<int64_t> oldest = integer(row[2]);
      const std::optional<int64_t> now = integer(row[3]);
      if (oldest && now) {
        const Millis age(std::max<int64_t>(0, *now - *oldest));
        census.oldest_processing_age = std::max(census.oldest_processing_age.value_or(age), age);
      }
    } else {
      census.failed_retryable += *count;
    }
  }
  IDEM_ASSIGN_OR_RETURN(rows, conn.Run(sql.census_retained, {time.Param()}, nullptr));
  const std::optional<int64_t> retained =
      rows.size() == 1 && !rows[0].empty() ? integer(rows[0][0]) : std::nullopt;
  if (!retained) return MakeError(Errc::kDataLoss, "census: malformed count of records");
  census.retained = *retained;
  return census;
}

Status MigrateAll(SqlRunner& conn, const RecordSql& sql,
                  const std::function<Status(const std::string&)>& script,
                  const std::vector<AppMigrations>& apps, Timestamp now) {
  IDEM_RETURN_IF_ERROR(script(sql.create_schema_table));
  IDEM_RETURN_IF_ERROR(Migrate(conn, sql, script, kComponent, sql.migrations, now));
  for (const AppMigrations& app : apps) {
    IDEM_RETURN_IF_ERROR(Migrate(conn, sql, script, app.name, app.migrations, now));
  }
  return Ok();
}

Status CheckSchema(SqlRunner& conn, const RecordSql& sql) {
  auto current = SchemaVersion(conn, sql, kComponent);
  // A database without the schema table rejects the query (kInvalidArgument); a busy or
  // unreachable one is reported as it is.
  if (!current && current.error().code != Errc::kInvalidArgument) return std::move(current).error();
  if (!current || *current == 0) {
    return MakeError(Errc::kInvalidArgument,
                     "the database has no idem schema; start idemd once to create it");
  }
  const int64_t known = Newest(sql.migrations);
  if (*current > known) return NewerSchema(kComponent, *current, known);
  return Ok();
}

Status CheckAppNames(std::string_view backend, const std::vector<AppMigrations>& apps) {
  for (std::size_t i = 0; i < apps.size(); ++i) {
    const std::string& name = apps[i].name;
    const bool taken =
        std::any_of(apps.begin(), apps.begin() + static_cast<std::ptrdiff_t>(i),
                    [&](const AppMigrations& before) { return before.name == name; });
    if (name.empty() || name == kComponent || taken) {
      return MakeError(Errc::kInvalidArgument,
                       std::string(backend) +
                           ": each application's migrations need a name of their own, not 'idem' "
                           "(got '" +
                           name + "')");
    }
  }
  return Ok();
}

Result<int64_t> SingleInteger(const std::vector<SqlRow>& rows, const char* what) {
  if (rows.size() == 1 && rows[0].size() == 1) {
    if (const int64_t* n = std::get_if<int64_t>(&rows[0][0])) return *n;
  }
  return MakeError(Errc::kDataLoss, std::string(what) + ": expected one integer");
}

}  // namespace idem::store_internal
