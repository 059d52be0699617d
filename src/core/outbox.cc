// src/core/outbox.cc — the transactional outbox's table and its statements (include/idem/outbox.h).
#include "idem/outbox.h"

#include <algorithm>
#include <array>

#include "idem/key.h"

namespace idem {
namespace {

// Columns in the order OutboxEventOf reads them.
constexpr std::string_view kColumns =
    "event_id, aggregate, type, sequence, payload, content_type, created_at, published_at, "
    "publications";

std::string TextOf(const SqlValue& v) {
  const std::string* s = std::get_if<std::string>(&v);
  return s ? *s : std::string();
}

std::optional<int64_t> IntegerOf(const SqlValue& v) {
  const int64_t* n = std::get_if<int64_t>(&v);
  return n ? std::optional<int64_t>(*n) : std::nullopt;
}

Result<OutboxEvent> OutboxEventOf(const SqlRow& row) {
  if (row.size() != 9) return MakeError(Errc::kDataLoss, "idem_outbox: a row of another shape");
  OutboxEvent event;
  event.id = TextOf(row[0]);
  event.aggregate = TextOf(row[1]);
  event.type = TextOf(row[2]);
  event.sequence = IntegerOf(row[3]).value_or(0);
  event.payload = TextOf(row[4]);
  event.content_type = TextOf(row[5]);
  event.created_at_ms = IntegerOf(row[6]).value_or(0);
  event.published_at_ms = IntegerOf(row[7]);
  event.publications = IntegerOf(row[8]).value_or(0);
  return event;
}

Result<std::vector<OutboxEvent>> EventsOf(const std::vector<SqlRow>& rows) {
  std::vector<OutboxEvent> events;
  events.reserve(rows.size());
  for (const SqlRow& row : rows) {
    IDEM_ASSIGN_OR_RETURN(OutboxEvent event, OutboxEventOf(row));
    events.push_back(std::move(event));
  }
  return events;
}

Status CheckPart(std::string_view what, std::string_view value, std::size_t min, std::size_t max) {
  if (value.size() < min || value.size() > max) {
    return MakeError(Errc::kInvalidArgument, "outbox: an event's " + std::string(what) + " has " +
                                                 std::to_string(value.size()) +
                                                 " bytes; it must have " + std::to_string(min) +
                                                 " to " + std::to_string(max));
  }
  if (value.find('\x1f') != std::string_view::npos) {
    return MakeError(Errc::kInvalidArgument,
                     "outbox: an event's " + std::string(what) + " contains 0x1f");
  }
  return Ok();
}

Status CheckPage(int limit) {
  if (limit < 1 || limit > limits::kOutboxPageMax) {
    return MakeError(
        Errc::kInvalidArgument,
        "outbox: a page is 1 to " + std::to_string(limits::kOutboxPageMax) + " events");
  }
  return Ok();
}

}  // namespace

const std::vector<Migration>& OutboxMigrations() {
  // BIGINT Unix milliseconds, portable across SQLite and PostgreSQL. The partial index holds only
  // what the relay still has to publish, so it stays small however long the history is.
  static const std::vector<Migration> kMigrations = {
      {1, R"sql(
CREATE TABLE idem_outbox (
  event_id     TEXT PRIMARY KEY,
  aggregate    TEXT NOT NULL,
  type         TEXT NOT NULL,
  sequence     BIGINT NOT NULL CHECK (sequence >= 1),
  payload      TEXT NOT NULL,
  content_type TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  published_at BIGINT,
  publications BIGINT NOT NULL DEFAULT 0,
  UNIQUE (aggregate, sequence)
);
CREATE INDEX idem_outbox_unpublished ON idem_outbox (created_at, aggregate, sequence)
  WHERE published_at IS NULL;
CREATE INDEX idem_outbox_published ON idem_outbox (published_at)
  WHERE published_at IS NOT NULL;
)sql"},
  };
  return kMigrations;
}

std::string OutboxEventId(std::string_view aggregate, std::string_view type,
                          std::string_view discriminator) {
  std::string input;
  input.reserve(aggregate.size() + type.size() + discriminator.size() + 2);
  input.append(aggregate).push_back('\x1f');
  input.append(type).push_back('\x1f');
  input.append(discriminator);
  return "evt_" + ToHex(Sha256({input}).data(), 16);
}

Result<OutboxEvent> AddOutboxEvent(StoreTxn& txn, const OutboxEventSpec& spec, Timestamp now) {
  IDEM_RETURN_IF_ERROR(
      CheckPart("aggregate", spec.aggregate, 1, limits::kOutboxAggregateMaxLength));
  IDEM_RETURN_IF_ERROR(CheckPart("type", spec.type, 1, limits::kOutboxTypeMaxLength));
  IDEM_RETURN_IF_ERROR(
      CheckPart("discriminator", spec.discriminator, 0, limits::kOutboxDiscriminatorMaxLength));
  IDEM_RETURN_IF_ERROR(CheckPart("content type", spec.content_type, 1, 255));
  if (spec.payload.size() > limits::kOutboxPayloadMaxBytes) {
    return MakeError(Errc::kInvalidArgument,
                     "outbox: an event's payload has " + std::to_string(spec.payload.size()) +
                         " bytes, over " + std::to_string(limits::kOutboxPayloadMaxBytes));
  }
  const std::string id = OutboxEventId(spec.aggregate, spec.type, spec.discriminator);
  const int64_t now_ms = ToUnixMillis(now);
  // One statement in the common case: the aggregate's next number, and a creation time no
  // earlier than its last event's, so that (created_at, aggregate, sequence) orders each
  // aggregate's events by sequence even when the instances' clocks differ. (The WHERE also tells
  // SQLite's parser that ON CONFLICT belongs to the INSERT.)
  IDEM_ASSIGN_OR_RETURN(
      std::vector<SqlRow> inserted,
      txn.Exec("INSERT INTO idem_outbox (event_id, aggregate, type, sequence, payload, "
               "content_type, created_at) "
               "SELECT ?, ?, ?, COALESCE(MAX(sequence), 0) + 1, ?, ?, "
               "CASE WHEN COALESCE(MAX(created_at), 0) > ? THEN MAX(created_at) ELSE ? END "
               "FROM idem_outbox WHERE aggregate = ? "
               "ON CONFLICT (event_id) DO NOTHING RETURNING sequence, created_at",
               {id, spec.aggregate, spec.type, spec.payload, spec.content_type, now_ms, now_ms,
                spec.aggregate}));
  if (inserted.empty()) {
    // This event is in the outbox already: it stays as it was.
    IDEM_ASSIGN_OR_RETURN(
        std::vector<SqlRow> existing,
        txn.Exec("SELECT " + std::string(kColumns) + " FROM idem_outbox WHERE event_id = ?", {id}));
    if (existing.empty()) {
      return MakeError(Errc::kInternal, "outbox: event " + id + " neither added nor found");
    }
    return OutboxEventOf(existing.front());
  }
  if (spec.on_written) txn.AfterCommit(spec.on_written);
  const SqlRow& row = inserted.front();
  OutboxEvent event;
  event.id = id;
  event.aggregate = spec.aggregate;
  event.type = spec.type;
  event.payload = spec.payload;
  event.content_type = spec.content_type;
  event.sequence = row.size() == 2 ? IntegerOf(row[0]).value_or(0) : 0;
  event.created_at_ms = row.size() == 2 ? IntegerOf(row[1]).value_or(now_ms) : now_ms;
  return event;
}

Result<std::vector<OutboxEvent>> UnpublishedOutboxEvents(Store& store, int limit) {
  IDEM_RETURN_IF_ERROR(CheckPage(limit));
  IDEM_ASSIGN_OR_RETURN(std::vector<SqlRow> rows,
                        store.Query("SELECT " + std::string(kColumns) +
                                        " FROM idem_outbox WHERE published_at IS NULL "
                                        "ORDER BY created_at, aggregate, sequence LIMIT ?",
                                    {int64_t{limit}}));
  return EventsOf(rows);
}

Result<std::vector<OutboxEvent>> OutboxEventsOf(Store& store, std::string_view aggregate) {
  IDEM_ASSIGN_OR_RETURN(std::vector<SqlRow> rows,
                        store.Query("SELECT " + std::string(kColumns) +
                                        " FROM idem_outbox WHERE aggregate = ? ORDER BY sequence",
                                    {std::string(aggregate)}));
  return EventsOf(rows);
}

Status MarkOutboxPublished(StoreTxn& txn, std::span<const std::string> ids, Timestamp now) {
  // One statement per 200 ids, not one per id: a page is marked in a round trip or two.
  constexpr std::size_t kIdsPerStatement = 200;
  for (std::size_t from = 0; from < ids.size(); from += kIdsPerStatement) {
    const std::size_t n = std::min(kIdsPerStatement, ids.size() - from);
    std::string sql =
        "UPDATE idem_outbox SET published_at = COALESCE(published_at, ?), "
        "publications = publications + 1 WHERE event_id IN (?";
    for (std::size_t i = 1; i < n; ++i) sql += ", ?";
    sql += ")";
    std::vector<SqlValue> params{ToUnixMillis(now)};
    params.insert(params.end(), ids.begin() + static_cast<std::ptrdiff_t>(from),
                  ids.begin() + static_cast<std::ptrdiff_t>(from + n));
    IDEM_RETURN_IF_ERROR(txn.Exec(sql, params));
  }
  return Ok();
}

Result<int64_t> ReplayOutboxEvents(StoreTxn& txn, std::string_view aggregate) {
  IDEM_ASSIGN_OR_RETURN(
      std::vector<SqlRow> set_back,
      txn.Exec("UPDATE idem_outbox SET published_at = NULL WHERE aggregate = ? AND published_at "
               "IS NOT NULL RETURNING event_id",
               {std::string(aggregate)}));
  return static_cast<int64_t>(set_back.size());
}

Result<std::optional<Millis>> OldestUnpublishedAge(Store& store, Timestamp now) {
  IDEM_ASSIGN_OR_RETURN(
      std::vector<SqlRow> rows,
      store.Query("SELECT MIN(created_at) FROM idem_outbox WHERE published_at IS NULL"));
  const std::optional<int64_t> oldest =
      rows.empty() || rows.front().empty() ? std::nullopt : IntegerOf(rows.front().front());
  if (!oldest) return std::optional<Millis>();
  return std::optional<Millis>(std::max(Millis(0), Millis(ToUnixMillis(now) - *oldest)));
}

Result<int64_t> SweepOutbox(Store& store, Timestamp before, int limit) {
  IDEM_RETURN_IF_ERROR(CheckPage(limit));
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store.Begin());
  IDEM_ASSIGN_OR_RETURN(
      std::vector<SqlRow> gone,
      txn->Exec("DELETE FROM idem_outbox WHERE event_id IN (SELECT event_id FROM idem_outbox "
                "WHERE published_at IS NOT NULL AND published_at < ? ORDER BY published_at "
                "LIMIT ?) RETURNING event_id",
                {ToUnixMillis(before), int64_t{limit}}));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  return static_cast<int64_t>(gone.size());
}

}  // namespace idem
