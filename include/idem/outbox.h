// include/idem/outbox.h — a transactional outbox: events written in the transaction that makes
// the change they announce, relayed to a broker afterwards (docs/outbox.md).
//
// "Write the row, then publish" loses the event when the process dies between the two; "publish,
// then write" announces a change that never committed. An event added here commits with the
// business writes of the same StoreTxn, or not at all, and a relay publishes it afterwards —
// perhaps twice after a crash, never lost, always under the same id, so that a consumer keyed by
// that id drops the copies.
//
// Each event belongs to an aggregate (a payment id) and has a sequence number within it (1, 2,
// ...), given in the order the aggregate's events commit; its created_at never goes back within
// the aggregate, so reading events by (created_at, aggregate, sequence) keeps each aggregate's
// order. The event id is derived from the aggregate, the event's type and a discriminator (for a
// second event of one type, e.g. the id of a refund): adding the same event again is a no-op that
// returns the event first added.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.h"
#include "idem/result.h"
#include "idem/store.h"

namespace idem {

namespace limits {
inline constexpr std::size_t kOutboxAggregateMaxLength = 255;
inline constexpr std::size_t kOutboxTypeMaxLength = 128;
inline constexpr std::size_t kOutboxDiscriminatorMaxLength = 255;
inline constexpr std::size_t kOutboxPayloadMaxBytes = 256 * 1024;
inline constexpr int kOutboxPageMax = 10'000;
}  // namespace limits

// The outbox's table (idem_outbox), as an application's migrations: open the store with
// AppMigrations{"outbox", OutboxMigrations()} among SchemaOptions::apps.
const std::vector<Migration>& OutboxMigrations();

// What a transaction announces.
struct OutboxEventSpec {
  std::string aggregate;      // e.g. a payment id: 1..kOutboxAggregateMaxLength bytes
  std::string type;           // e.g. "payment.succeeded": 1..kOutboxTypeMaxLength bytes
  std::string discriminator;  // "" for the one event of this type; else what tells them apart
  std::string payload;        // at most kOutboxPayloadMaxBytes
  std::string content_type = "application/json";
  // Called after the transaction committed, when this call wrote the event (not for one the
  // outbox held already, nor when the transaction rolls back): StoreTxn::AfterCommit. For a count
  // of events written that never counts one that did not commit. Empty for none.
  std::function<void()> on_written = nullptr;
};

// An event as the outbox holds it.
struct OutboxEvent {
  std::string id;  // OutboxEventId(aggregate, type, discriminator)
  std::string aggregate;
  std::string type;
  int64_t sequence = 0;  // 1, 2, ... within the aggregate
  std::string payload;
  std::string content_type;
  int64_t created_at_ms = 0;
  std::optional<int64_t> published_at_ms;  // unset until a relay's broker confirmed it
  int64_t publications = 0;                // how often a broker confirmed it (replays count)
};

// "evt_" and 32 hex digits: a SHA-256 of the three parts, separated as a scope's are. The same
// parts give the same id on every instance and every attempt.
std::string OutboxEventId(std::string_view aggregate, std::string_view type,
                          std::string_view discriminator);

// Adds `spec` to `txn`: it commits with the transaction's other writes or not at all. An event of
// this id already in the outbox is left as it is and returned. The sequence number is the
// aggregate's next. Errors: kInvalidArgument (a part out of its bounds); kAlreadyExists (another
// transaction added an event of this aggregate at the same moment: the transaction must be
// retried); the store's.
Result<OutboxEvent> AddOutboxEvent(StoreTxn& txn, const OutboxEventSpec& spec, Timestamp now);

// Unpublished events, oldest first by (created_at, aggregate, sequence), at most `limit`
// (1..kOutboxPageMax).
Result<std::vector<OutboxEvent>> UnpublishedOutboxEvents(Store& store, int limit);

// The events of `aggregate`, in sequence order (an operator's view, a replay).
Result<std::vector<OutboxEvent>> OutboxEventsOf(Store& store, std::string_view aggregate);

// Records in `txn` that a broker confirmed each of `ids` at `now`: the first confirmation sets
// published_at, every one counts a publication. Unknown ids are ignored. (A relay marks in the
// transaction that renews its lease, so a relay that lost it marks nothing.)
Status MarkOutboxPublished(StoreTxn& txn, std::span<const std::string> ids, Timestamp now);

// Makes the published events of `aggregate` unpublished again in `txn`, so that a relay publishes
// them once more, under their ids, in sequence order, with its next pass (an operator's replay for
// a consumer that lost them). Their publications go on counting; published_at is set again by
// the replay's confirmation. Events not yet published are left as they are. Returns how many were
// set back (0 for an aggregate without published events, or one swept past retention).
Result<int64_t> ReplayOutboxEvents(StoreTxn& txn, std::string_view aggregate);
// The age of the oldest unpublished event at `now`, or nullopt when every event is published
// (the relay's lag).
Result<std::optional<Millis>> OldestUnpublishedAge(Store& store, Timestamp now);

// Deletes at most `limit` published events whose publication is older than `before`: a bounded
// delete a sweeper repeats, never a long one. Unpublished events are never deleted. Returns how
// many went.
Result<int64_t> SweepOutbox(Store& store, Timestamp before, int limit);

}  // namespace idem
