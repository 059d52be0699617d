// src/core/outbox_test.cc — the transactional outbox on real stores (a SQLite file, PostgreSQL):
// an event commits with its transaction or not at all, once per id, in order per aggregate, and
// only what was published is swept. Instantiated per backend with the Inbox suite
// (src/core/inbox_suite.h).
#include "idem/outbox.h"

#include <gtest/gtest.h>

#include "src/core/inbox_suite.h"
#include "testing/assert_ok.h"

namespace idem::testing {
namespace {

OutboxEventSpec Event(std::string aggregate, std::string type, std::string discriminator = "") {
  OutboxEventSpec spec;
  spec.aggregate = std::move(aggregate);
  spec.type = std::move(type);
  spec.discriminator = std::move(discriminator);
  spec.payload = R"({"id":")" + spec.aggregate + R"(","type":")" + spec.type + R"("})";
  return spec;
}

// Adds `spec` in a transaction of its own, committed.
Result<OutboxEvent> AddCommitted(Store& store, const OutboxEventSpec& spec, Timestamp now) {
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store.Begin());
  IDEM_ASSIGN_OR_RETURN(OutboxEvent event, AddOutboxEvent(*txn, spec, now));
  IDEM_RETURN_IF_ERROR(txn->Commit());
  return event;
}

// Marks `ids` published in a transaction of their own, committed.
Status Marked(Store& store, std::span<const std::string> ids, Timestamp now) {
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store.Begin());
  IDEM_RETURN_IF_ERROR(MarkOutboxPublished(*txn, ids, now));
  return txn->Commit();
}

std::vector<std::string> Ids(const std::vector<OutboxEvent>& events) {
  std::vector<std::string> ids;
  for (const OutboxEvent& e : events) ids.push_back(e.id);
  return ids;
}

TEST_P(OutboxTest, AnEventCommitsWithTheBusinessWritesOfItsTransactionOrNotAtAll) {
  Store& store = *main_.store;
  const Timestamp now = env_.clock.Now();
  {
    IDEM_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreTxn> txn, store.Begin());
    IDEM_ASSERT_OK(txn->Exec("INSERT INTO inbox_orders (id, amount) VALUES ('o-1', 5)"));
    IDEM_ASSERT_OK(AddOutboxEvent(*txn, Event("o-1", "order.placed"), now));
    // Dropped without a commit: neither the row nor the event.
  }
  IDEM_ASSERT_OK_AND_ASSIGN(auto none, OutboxEventsOf(store, "o-1"));
  EXPECT_TRUE(none.empty());
  IDEM_ASSERT_OK_AND_ASSIGN(auto rows, store.Query("SELECT count(*) FROM inbox_orders"));
  EXPECT_EQ(std::get<int64_t>(rows.at(0).at(0)), 0);

  IDEM_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreTxn> txn, store.Begin());
  IDEM_ASSERT_OK(txn->Exec("INSERT INTO inbox_orders (id, amount) VALUES ('o-1', 5)"));
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent added,
                            AddOutboxEvent(*txn, Event("o-1", "order.placed"), now));
  IDEM_ASSERT_OK(txn->Commit());
  EXPECT_EQ(added.id, OutboxEventId("o-1", "order.placed", ""));
  EXPECT_EQ(added.id.size(), 36u);
  EXPECT_EQ(added.sequence, 1);
  IDEM_ASSERT_OK_AND_ASSIGN(auto events, OutboxEventsOf(store, "o-1"));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].id, added.id);
  EXPECT_EQ(events[0].type, "order.placed");
  EXPECT_EQ(events[0].payload, R"({"id":"o-1","type":"order.placed"})");
  EXPECT_EQ(events[0].content_type, "application/json");
  EXPECT_EQ(events[0].created_at_ms, ToUnixMillis(now));
  EXPECT_FALSE(events[0].published_at_ms.has_value());
  EXPECT_EQ(events[0].publications, 0);
}

TEST_P(OutboxTest, OnWrittenCountsAnEventOnceItCommittedAndOnlyTheCallThatWroteIt) {
  Store& store = *main_.store;
  const Timestamp now = env_.clock.Now();
  int written = 0;
  OutboxEventSpec spec = Event("o-1", "order.placed");
  spec.on_written = [&] { ++written; };
  {
    IDEM_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreTxn> txn, store.Begin());
    IDEM_ASSERT_OK(AddOutboxEvent(*txn, spec, now));
  }  // rolled back: nothing was written
  EXPECT_EQ(written, 0);

  IDEM_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreTxn> txn, store.Begin());
  IDEM_ASSERT_OK(AddOutboxEvent(*txn, spec, now));
  EXPECT_EQ(written, 0) << "counted before its commit";
  IDEM_ASSERT_OK(txn->Commit());
  EXPECT_EQ(written, 1);

  // The same event again is the first one: not written twice, not counted twice.
  IDEM_ASSERT_OK_AND_ASSIGN(txn, store.Begin());
  IDEM_ASSERT_OK(AddOutboxEvent(*txn, spec, now + Millis(5)));
  IDEM_ASSERT_OK(txn->Commit());
  EXPECT_EQ(written, 1);
}

TEST_P(OutboxTest, TheSameEventAddedAgainIsTheFirstAndEachAggregateCountsItsOwn) {
  Store& store = *main_.store;
  const Timestamp t0 = env_.clock.Now();
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent first, AddCommitted(store, Event("p-1", "paid"), t0));
  // A retried transaction adds the same event again, later, with another payload: the first
  // stays as it was.
  OutboxEventSpec again = Event("p-1", "paid");
  again.payload = R"({"other":true})";
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent second, AddCommitted(store, again, t0 + Millis(5)));
  EXPECT_EQ(second.id, first.id);
  EXPECT_EQ(second.sequence, 1);
  EXPECT_EQ(second.payload, first.payload);
  // A second event of one type needs a discriminator of its own; another aggregate starts at 1.
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent refund_a,
                            AddCommitted(store, Event("p-1", "refunded", "ch_1"), t0));
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent refund_b,
                            AddCommitted(store, Event("p-1", "refunded", "ch_2"), t0));
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent other, AddCommitted(store, Event("p-2", "paid"), t0));
  EXPECT_NE(refund_a.id, refund_b.id);
  EXPECT_EQ(refund_a.sequence, 2);
  EXPECT_EQ(refund_b.sequence, 3);
  EXPECT_EQ(other.sequence, 1);
  IDEM_ASSERT_OK_AND_ASSIGN(auto events, OutboxEventsOf(store, "p-1"));
  EXPECT_EQ(Ids(events), (std::vector<std::string>{first.id, refund_a.id, refund_b.id}));
}

TEST_P(OutboxTest, AnInstanceWithASlowClockCannotPutAnAggregatesEventBeforeItsPredecessor) {
  Store& store = *main_.store;
  const Timestamp t0 = env_.clock.Now();
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent a1, AddCommitted(store, Event("a", "one"), t0));
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent b1, AddCommitted(store, Event("b", "one"), t0 + Millis(1)));
  // Written by an instance whose clock is a minute behind: a's second event is still after its
  // first, whatever b does meanwhile.
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent a2,
                            AddCommitted(store, Event("a", "two"), t0 - Millis(60'000)));
  EXPECT_EQ(a2.created_at_ms, a1.created_at_ms);
  IDEM_ASSERT_OK_AND_ASSIGN(auto unpublished, UnpublishedOutboxEvents(store, 10));
  EXPECT_EQ(Ids(unpublished), (std::vector<std::string>{a1.id, a2.id, b1.id}));
  IDEM_ASSERT_OK_AND_ASSIGN(auto page, UnpublishedOutboxEvents(store, 2));
  EXPECT_EQ(Ids(page), (std::vector<std::string>{a1.id, a2.id}));
}

TEST_P(OutboxTest, PublishedOnceConfirmedCountedEveryTimeAndOnlyPublishedEventsAreSwept) {
  Store& store = *main_.store;
  const Timestamp t0 = env_.clock.Now();
  IDEM_ASSERT_OK_AND_ASSIGN(auto none, OldestUnpublishedAge(store, t0));
  EXPECT_FALSE(none.has_value());
  std::vector<OutboxEvent> events;
  for (int i = 0; i < 5; ++i) {
    IDEM_ASSERT_OK_AND_ASSIGN(
        OutboxEvent e, AddCommitted(store, Event("s-" + std::to_string(i), "x"), t0 + Millis(i)));
    events.push_back(e);
  }
  IDEM_ASSERT_OK_AND_ASSIGN(auto lag, OldestUnpublishedAge(store, t0 + Millis(1'000)));
  ASSERT_TRUE(lag.has_value());
  EXPECT_EQ(*lag, Millis(1'000));

  const std::vector<std::string> first_three = {events[0].id, events[1].id, events[2].id,
                                                "evt_unknown"};
  IDEM_ASSERT_OK(Marked(store, first_three, t0 + Millis(100)));
  // A second confirmation (a relay that crashed before it marked, or an operator's replay) keeps
  // the first time and counts.
  const std::vector<std::string> again = {events[0].id};
  IDEM_ASSERT_OK(Marked(store, again, t0 + Millis(900)));
  IDEM_ASSERT_OK_AND_ASSIGN(auto s0, OutboxEventsOf(store, "s-0"));
  ASSERT_EQ(s0.size(), 1u);
  EXPECT_EQ(s0[0].published_at_ms, ToUnixMillis(t0 + Millis(100)));
  EXPECT_EQ(s0[0].publications, 2);
  IDEM_ASSERT_OK_AND_ASSIGN(auto unpublished, UnpublishedOutboxEvents(store, 100));
  EXPECT_EQ(Ids(unpublished), (std::vector<std::string>{events[3].id, events[4].id}));
  IDEM_ASSERT_OK_AND_ASSIGN(lag, OldestUnpublishedAge(store, t0 + Millis(1'000)));
  ASSERT_TRUE(lag.has_value());
  EXPECT_EQ(*lag, Millis(997));

  // Bounded: two of the three published go, then the last, then nothing; the unpublished stay.
  IDEM_ASSERT_OK_AND_ASSIGN(int64_t swept, SweepOutbox(store, t0 + Millis(101), 2));
  EXPECT_EQ(swept, 2);
  IDEM_ASSERT_OK_AND_ASSIGN(swept, SweepOutbox(store, t0 + Millis(101), 2));
  EXPECT_EQ(swept, 1);
  IDEM_ASSERT_OK_AND_ASSIGN(swept, SweepOutbox(store, t0 + Millis(10'000), 100));
  EXPECT_EQ(swept, 0);
  IDEM_ASSERT_OK_AND_ASSIGN(unpublished, UnpublishedOutboxEvents(store, 100));
  EXPECT_EQ(unpublished.size(), 2u);
  IDEM_ASSERT_OK_AND_ASSIGN(s0, OutboxEventsOf(store, "s-0"));
  EXPECT_TRUE(s0.empty());
}

// A replay sets an aggregate's published events back, and only its own: they come again first,
// in sequence order (they are older), beside the aggregate's unpublished event; their
// publications go on counting, and published_at is the replay's confirmation.
TEST_P(OutboxTest, AReplaySetsAnAggregatesPublishedEventsBackInOrder) {
  Store& store = *main_.store;
  const Timestamp t0 = env_.clock.Now();
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent a1, AddCommitted(store, Event("r-a", "one"), t0));
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent b1, AddCommitted(store, Event("r-b", "one"), t0));
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent a2,
                            AddCommitted(store, Event("r-a", "two"), t0 + Millis(1)));
  const std::vector<std::string> first = {a1.id, b1.id, a2.id};
  IDEM_ASSERT_OK(Marked(store, first, t0 + Millis(10)));
  IDEM_ASSERT_OK_AND_ASSIGN(OutboxEvent a3,
                            AddCommitted(store, Event("r-a", "three"), t0 + Millis(20)));

  const auto replay = [&](std::string_view aggregate) -> Result<int64_t> {
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<StoreTxn> txn, store.Begin());
    IDEM_ASSIGN_OR_RETURN(int64_t n, ReplayOutboxEvents(*txn, aggregate));
    IDEM_RETURN_IF_ERROR(txn->Commit());
    return n;
  };
  IDEM_ASSERT_OK_AND_ASSIGN(int64_t n, replay("r-a"));
  EXPECT_EQ(n, 2);
  IDEM_ASSERT_OK_AND_ASSIGN(auto unpublished, UnpublishedOutboxEvents(store, 100));
  EXPECT_EQ(Ids(unpublished), (std::vector<std::string>{a1.id, a2.id, a3.id}));
  IDEM_ASSERT_OK_AND_ASSIGN(n, replay("r-a"));
  EXPECT_EQ(n, 0) << "a replay pending is not counted twice";
  IDEM_ASSERT_OK_AND_ASSIGN(n, replay("r-none"));
  EXPECT_EQ(n, 0);

  IDEM_ASSERT_OK(Marked(store, Ids(unpublished), t0 + Millis(30)));
  IDEM_ASSERT_OK_AND_ASSIGN(auto a, OutboxEventsOf(store, "r-a"));
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0].publications, 2);
  EXPECT_EQ(a[0].published_at_ms, ToUnixMillis(t0 + Millis(30)));
  EXPECT_EQ(a[2].publications, 1);
  IDEM_ASSERT_OK_AND_ASSIGN(auto b, OutboxEventsOf(store, "r-b"));
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].publications, 1) << "another aggregate's event was replayed";
  EXPECT_EQ(b[0].published_at_ms, ToUnixMillis(t0 + Millis(10)));
}

// A page of more ids than one statement marks (200) is marked whole.
TEST_P(OutboxTest, APageOverOneStatementsIdsIsMarkedWhole) {
  Store& store = *main_.store;
  const Timestamp t0 = env_.clock.Now();
  IDEM_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreTxn> txn, store.Begin());
  for (int i = 0; i < 450; ++i) {
    IDEM_ASSERT_OK(AddOutboxEvent(*txn, Event("m-" + std::to_string(i), "x"), t0));
  }
  IDEM_ASSERT_OK(txn->Commit());
  IDEM_ASSERT_OK_AND_ASSIGN(auto page, UnpublishedOutboxEvents(store, 1000));
  ASSERT_EQ(page.size(), 450u);
  IDEM_ASSERT_OK(Marked(store, Ids(page), t0 + Millis(5)));
  IDEM_ASSERT_OK_AND_ASSIGN(page, UnpublishedOutboxEvents(store, 1000));
  EXPECT_TRUE(page.empty()) << page.size() << " left unmarked";
  IDEM_ASSERT_OK_AND_ASSIGN(auto last, OutboxEventsOf(store, "m-449"));
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].publications, 1);
}

TEST_P(OutboxTest, MalformedEventsAndPagesAreRefusedAndWriteNothing) {
  Store& store = *main_.store;
  const Timestamp now = env_.clock.Now();
  OutboxEventSpec big = Event("b", "t");
  big.payload.assign(limits::kOutboxPayloadMaxBytes + 1, 'x');
  for (const OutboxEventSpec& bad :
       {Event("", "t"), Event("a", ""), Event(std::string(256, 'a'), "t"), Event("a\x1f", "t"),
        Event("a", "t", std::string(256, 'd')), big}) {
    IDEM_ASSERT_OK_AND_ASSIGN(std::unique_ptr<StoreTxn> txn, store.Begin());
    auto added = AddOutboxEvent(*txn, bad, now);
    ASSERT_FALSE(added.has_value()) << bad.aggregate.size() << " " << bad.type;
    EXPECT_EQ(added.error().code, Errc::kInvalidArgument);
    IDEM_ASSERT_OK(txn->Commit());
  }
  IDEM_ASSERT_OK_AND_ASSIGN(auto unpublished, UnpublishedOutboxEvents(store, 10));
  EXPECT_TRUE(unpublished.empty());
  for (int limit : {0, -1, limits::kOutboxPageMax + 1}) {
    EXPECT_EQ(UnpublishedOutboxEvents(store, limit).error().code, Errc::kInvalidArgument);
    EXPECT_EQ(SweepOutbox(store, now, limit).error().code, Errc::kInvalidArgument);
  }
}

}  // namespace
}  // namespace idem::testing
