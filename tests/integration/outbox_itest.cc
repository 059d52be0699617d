// tests/integration/outbox_itest.cc — the outbox relay (docs/outbox.md) of a real idemd into a
// real Redis stream (scripts/with-services): each payment's events appended once, in order, and
// marked published only once appended; a broker that is down holds them back; a relay killed
// between the append and the mark appends them again under the same ids, and loses none.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <thread>

#include "tests/integration/idemd_fixture.h"
#include "tests/integration/test_brokers.h"

namespace idem::itest {
namespace {

namespace json = boost::json;
using std::chrono::milliseconds;
using std::chrono::seconds;

// One entry of the stream: its fields.
using Entry = std::map<std::string, std::string>;

std::vector<Entry> Entries(const std::string& stream) { return StreamEntries(stream); }

json::array ParseArray(const std::string& text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  EXPECT_FALSE(ec) << text;
  return !ec && v.is_array() ? v.as_array() : json::array();
}

// Waits until `stream` has at least `n` entries (at most 15 s); returns them.
std::vector<Entry> AwaitEntries(const std::string& stream, std::size_t n) {
  std::vector<Entry> entries;
  for (int i = 0; i < 150; ++i) {
    entries = Entries(stream);
    if (entries.size() >= n) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  return entries;
}

class OutboxTest : public IdemdTest {
 protected:
  void SetUp() override {
    IDEM_NEED_SERVICE(RedisServerUrl(), "IDEM_TEST_REDIS_URL");
    IdemdTest::SetUp();
    stream_ = "outbox-itest-" + std::to_string(testing::FreeLoopbackPort()) + "-" +
              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  void TearDown() override {
    if (!stream_.empty() && !RedisServerUrl().empty()) (void)RedisCommand({"DEL", stream_});
  }
  // [outbox] relaying to `url` (the tests' Redis unless given) every 100 ms, under a lease of
  // a second.
  IdemdOptions Relaying(const std::string& url = "") const {
    IdemdOptions options;
    options.extra_tables = "[outbox]\nbroker = \"redis\"\nurl = \"" +
                           (url.empty() ? RedisServerUrl() : url) + "\"\nstream = \"" + stream_ +
                           "\"\ninterval_ms = 100\nlease_ms = 1000\n";
    return options;
  }
  std::string StoreUrl() { return "sqlite://" + dir_.File("idem.db"); }
  std::vector<OutboxEvent> Unpublished() {
    std::unique_ptr<Store> store = OpenExistingStore(StoreUrl());
    if (store == nullptr) return {};
    auto events = UnpublishedOutboxEvents(*store, 1000);
    EXPECT_TRUE(events.has_value()) << events.error().message;
    return events ? std::move(*events) : std::vector<OutboxEvent>();
  }
  std::string PaidId(const std::string& key, const std::string& order) {
    const http::Response r = Pay(key, Body(order));
    EXPECT_EQ(r.status, 201) << r.body;
    json::object o = ParseObject(r.body);
    return o.contains("id") ? std::string(o["id"].as_string()) : "";
  }

  // `idemctl outbox relay --config config` once another relay's lease is over: a relay killed
  // with its lease held (idemd's, or an earlier idemctl's) keeps it until lease_ms ran out.
  std::pair<int, std::string> RelayWhenFree(const std::string& config) {
    std::pair<int, std::string> ran;
    for (int i = 0; i < 40; ++i) {
      ran = RunIdemctl({"outbox", "relay", "--config", config});
      if (ran.first == 0 || ran.second.find("another relay holds the lease") == std::string::npos) {
        break;
      }
      std::this_thread::sleep_for(milliseconds(250));
    }
    return ran;
  }

  std::string stream_;
};

TEST_F(OutboxTest, EachPaymentsEventsReachTheStreamOnceInOrderAndAreMarkedPublished) {
  StartIdemd(Relaying());
  std::vector<std::string> paid;
  for (int i = 0; i < 5; ++i) {
    paid.push_back(PaidId("outbox-relay-" + std::to_string(i), "ORD-RELAY-" + std::to_string(i)));
  }
  Fault(R"({"fault":"decline","times":1})");
  ASSERT_EQ(Pay("outbox-relay-declined", Body("ORD-RELAY-D")).status, 402);
  // Replays, and the order paid again under another key, announce nothing more.
  ASSERT_EQ(Pay("outbox-relay-0", Body("ORD-RELAY-0")).status, 201);
  ASSERT_EQ(Pay("outbox-relay-other", Body("ORD-RELAY-1")).status, 200);

  std::vector<Entry> entries = AwaitEntries(stream_, 6);
  std::this_thread::sleep_for(milliseconds(500));  // nothing more comes
  entries = Entries(stream_);
  ASSERT_EQ(entries.size(), 6u);
  std::set<std::string> ids;
  std::map<std::string, std::string> type_of;  // payment -> type
  for (const Entry& e : entries) {
    const std::string& payment = e.at("aggregate");
    ids.insert(e.at("key"));
    type_of[payment] = e.at("type");
    EXPECT_EQ(e.at("key"), OutboxEventId(payment, e.at("type"), ""));
    EXPECT_EQ(e.at("sequence"), "1");
    EXPECT_EQ(e.at("content_type"), "application/json");
    json::object payload = ParseObject(e.at("body"));
    EXPECT_EQ(payload["payment"].as_object()["id"].as_string(), payment);
  }
  EXPECT_EQ(ids.size(), 6u) << "an event appended twice";
  for (const std::string& id : paid) EXPECT_EQ(type_of[id], "payment.succeeded") << id;
  EXPECT_EQ(std::count_if(type_of.begin(), type_of.end(),
                          [](const auto& t) { return t.second == "payment.failed"; }),
            1);
  EXPECT_TRUE(Unpublished().empty());
  for (const std::string& id : paid) {
    const std::vector<OutboxEvent> events = OutboxEventsAt(StoreUrl(), id);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_TRUE(events[0].published_at_ms.has_value());
    EXPECT_EQ(events[0].publications, 1);
  }
  const http::Response metrics = Get("/metrics");
  EXPECT_NE(metrics.body.find("\nidem_outbox_published_total 6\n"), std::string::npos)
      << metrics.body;
  // Written once each, after their commits: the replay and the other key's payment add none.
  EXPECT_NE(metrics.body.find("\nidem_outbox_written_total 6\n"), std::string::npos)
      << metrics.body;

  // A payment's later event (a refund by the books, here added as they add it) comes after its
  // first in the stream, with the next sequence number.
  {
    std::unique_ptr<Store> store = OpenExistingStore(StoreUrl());
    ASSERT_NE(store, nullptr);
    auto txn = store->Begin();
    ASSERT_TRUE(txn.has_value());
    OutboxEventSpec refund{paid[0], "payment.refunded", "ch_extra", R"({"refund":{}})"};
    ASSERT_TRUE(AddOutboxEvent(**txn, refund, SystemClock().Now()).has_value());
    ASSERT_TRUE((*txn)->Commit().has_value());
  }
  entries = AwaitEntries(stream_, 7);
  ASSERT_EQ(entries.size(), 7u);
  EXPECT_EQ(entries.back().at("aggregate"), paid[0]);
  EXPECT_EQ(entries.back().at("type"), "payment.refunded");
  EXPECT_EQ(entries.back().at("sequence"), "2");
}

TEST_F(OutboxTest, ABrokerThatIsDownHoldsTheEventsBackAndIdemctlPublishesThemLater) {
  StartIdemd(Relaying("redis://127.0.0.1:" + std::to_string(testing::FreeLoopbackPort())));
  std::vector<std::string> paid;
  for (int i = 0; i < 3; ++i) {
    paid.push_back(PaidId("outbox-down-" + std::to_string(i), "ORD-DOWN-" + std::to_string(i)));
  }
  std::this_thread::sleep_for(milliseconds(600));
  EXPECT_EQ(Unpublished().size(), 3u) << "marked published without a broker";
  KillIdemd();
  // The broker's failure is one line, not one per pass.
  std::ifstream log(dir_.File("idemd.log"));
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  std::size_t lines = 0;
  for (std::size_t at = text.find("outbox relay stopped"); at != std::string::npos;
       at = text.find("outbox relay stopped", at + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u) << text;

  // idemctl's one pass, with the broker back (the same config, its url fixed).
  const std::string config = dir_.File("relay.toml");
  WriteConfig(config, Relaying());
  auto [listed, listed_out] = RunIdemctl({"outbox", "list", "--config", config, "-o", "json"});
  ASSERT_EQ(listed, 0) << listed_out;
  EXPECT_EQ(ParseArray(listed_out).size(), 3u) << listed_out;
  // idemd was killed perhaps in the middle of a pass, its lease held.
  auto [ran, out] = RelayWhenFree(config);
  ASSERT_EQ(ran, 0) << out;
  EXPECT_NE(out.find("3 events published to redis stream " + stream_), std::string::npos) << out;
  const std::vector<Entry> entries = Entries(stream_);
  ASSERT_EQ(entries.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(entries[i].at("aggregate"), paid[i]);
  auto [shown, shown_out] =
      RunIdemctl({"outbox", "list", "--config", config, "--payment", paid[1], "-o", "json"});
  ASSERT_EQ(shown, 0) << shown_out;
  json::array events = ParseArray(shown_out);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(events[0].as_object()["published_at"].is_string()) << shown_out;
  auto [again, again_out] = RunIdemctl({"outbox", "relay", "--config", config});
  ASSERT_EQ(again, 0) << again_out;
  EXPECT_NE(again_out.find("0 events published"), std::string::npos) << again_out;
  EXPECT_EQ(Entries(stream_).size(), 3u);
}

// The same relay to a RabbitMQ exchange (a node of the test's own): each event a message under
// publisher confirms, its message-id the event id, routed by its type; an exchange that no queue
// is bound to returns the messages, and nothing is marked published until one is.
TEST_F(OutboxTest, ARabbitExchangeGetsEachEventOnceInOrderAndAnUnboundOneHoldsThemBack) {
  RabbitBroker broker(dir_);
  ASSERT_NO_FATAL_FAILURE(broker.Start());
  ASSERT_TRUE(broker.Bind("payments.events", "shipping"));
  IdemdOptions options;
  options.extra_tables = "[outbox]\nbroker = \"rabbitmq\"\nurl = \"" + broker.Url() +
                         "\"\nexchange = \"payments.events\"\ninterval_ms = 100\nlease_ms = 1000\n";
  StartIdemd(options);
  std::vector<std::string> paid;
  for (int i = 0; i < 3; ++i) {
    paid.push_back(PaidId("outbox-amqp-" + std::to_string(i), "ORD-AMQP-" + std::to_string(i)));
  }
  Fault(R"({"fault":"decline","times":1})");
  ASSERT_EQ(Pay("outbox-amqp-declined", Body("ORD-AMQP-D")).status, 402);
  std::vector<AmqpMessage> got;
  for (int i = 0; i < 150 && got.size() < 4; ++i) {
    for (AmqpMessage& m : broker.Take("shipping")) got.push_back(std::move(m));
    if (got.size() < 4) std::this_thread::sleep_for(milliseconds(100));
  }
  std::this_thread::sleep_for(milliseconds(500));
  for (AmqpMessage& m : broker.Take("shipping")) got.push_back(std::move(m));
  ASSERT_EQ(got.size(), 4u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i].headers["aggregate"], paid[i]) << "out of order";
    EXPECT_EQ(got[i].headers["type"], "payment.succeeded");
    EXPECT_EQ(got[i].headers["sequence"], "1");
    EXPECT_EQ(got[i].message_id, OutboxEventId(paid[i], "payment.succeeded", ""));
    EXPECT_EQ(got[i].headers["key"], got[i].message_id);
    EXPECT_EQ(got[i].content_type, "application/json");
    json::object payload = ParseObject(got[i].body);
    EXPECT_EQ(payload["payment"].as_object()["id"].as_string(), paid[i]);
  }
  EXPECT_EQ(got[3].headers["type"], "payment.failed");
  EXPECT_TRUE(Unpublished().empty());
  KillIdemd();

  // An exchange no queue is bound to: the broker returns each message, and nothing is marked.
  ASSERT_TRUE(broker.Bind("payments.lonely", "lonely-queue"));
  ASSERT_TRUE(broker.Unbind("payments.lonely", "lonely-queue"));
  const std::string config = dir_.File("lonely.toml");
  IdemdOptions lonely;
  lonely.extra_tables = "[outbox]\nbroker = \"rabbitmq\"\nurl = \"" + broker.Url() +
                        "\"\nexchange = \"payments.lonely\"\nlease_ms = 1000\n";
  WriteConfig(config, lonely);
  StartIdemd();  // no relay of its own
  (void)PaidId("outbox-amqp-lonely", "ORD-AMQP-L");
  auto [ran, out] = RelayWhenFree(config);  // the killed idemd's lease may be held
  EXPECT_EQ(ran, 1) << out;
  EXPECT_NE(out.find("nothing takes the message"), std::string::npos) << out;
  EXPECT_EQ(Unpublished().size(), 1u);
}

// A consumer lost a payment's events: its tenant reads them (GET /v1/payments/{id}/events) and
// replays them (POST …/events/replay), or an operator does (idemctl outbox replay); the relay
// publishes them again under their ids, the other payments' events stay as they are, and
// idem_outbox_republished_total counts the copies. Another tenant's payment is not found.
TEST_F(OutboxTest, APaymentsEventsAreReplayedUnderTheirIdsByItsTenantAndByAnOperator) {
  StartIdemd(Relaying());
  const std::string first = PaidId("outbox-replay-1", "ORD-REPLAY-1");
  const std::string second = PaidId("outbox-replay-2", "ORD-REPLAY-2");
  ASSERT_EQ(AwaitEntries(stream_, 2).size(), 2u);
  std::this_thread::sleep_for(milliseconds(300));  // both marked

  const http::Response listed = Get("/v1/payments/" + first + "/events", kBob);  // same tenant
  ASSERT_EQ(listed.status, 200) << listed.body;
  json::object body = ParseObject(listed.body);
  EXPECT_EQ(body["payment"].as_string(), first);
  ASSERT_EQ(body["events"].as_array().size(), 1u);
  json::object event = body["events"].as_array()[0].as_object();
  EXPECT_EQ(event["id"].as_string(), OutboxEventId(first, "payment.succeeded", ""));
  EXPECT_EQ(event["sequence"].as_int64(), 1);
  EXPECT_TRUE(event["published_at"].is_string()) << listed.body;
  EXPECT_EQ(event["publications"].as_int64(), 1);
  EXPECT_EQ(event["payload"].as_object()["payment"].as_object()["id"].as_string(), first);

  const auto replay = [&](const std::string& id, const std::string& api_key) {
    http::Request req{"POST", "/v1/payments/" + id + "/events/replay", {}, ""};
    req.headers.Set("Authorization", "Bearer " + api_key);
    return Send(std::move(req));
  };
  EXPECT_EQ(replay(first, kCarol).status, 404) << "another tenant's payment";
  EXPECT_EQ(Get("/v1/payments/" + first + "/events", kCarol).status, 404);
  EXPECT_EQ(replay("pay_nope", kAlice).status, 404);
  EXPECT_EQ(Get("/v1/payments/" + first + "/events/replay").status, 405);
  EXPECT_EQ(Entries(stream_).size(), 2u) << "a refused replay published something";

  const http::Response replayed = replay(first, kAlice);
  ASSERT_EQ(replayed.status, 202) << replayed.body;
  EXPECT_EQ(ParseObject(replayed.body)["replayed"].as_int64(), 1);
  std::vector<Entry> entries = AwaitEntries(stream_, 3);
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[2].at("key"), entries[0].at("key")) << "the replay is not the same event";
  EXPECT_EQ(entries[2].at("body"), entries[0].at("body"));
  EXPECT_EQ(entries[1].at("aggregate"), second);

  // The operator's replay, through the same store.
  const std::string config = dir_.File("replay.toml");
  WriteConfig(config, Relaying());
  auto [ran, out] = RunIdemctl({"outbox", "replay", "--config", config, "--payment", second});
  ASSERT_EQ(ran, 0) << out;
  EXPECT_NE(out.find("1 event of " + second + " set back"), std::string::npos) << out;
  entries = AwaitEntries(stream_, 4);
  ASSERT_EQ(entries.size(), 4u);
  EXPECT_EQ(entries[3].at("key"), entries[1].at("key"));
  auto [unknown, unknown_out] =
      RunIdemctl({"outbox", "replay", "--config", config, "--payment", "pay_nope"});
  EXPECT_EQ(unknown, 1) << unknown_out;

  std::this_thread::sleep_for(milliseconds(600));  // passes of the relay: nothing more comes
  EXPECT_EQ(Entries(stream_).size(), 4u) << "a replay published more than once";
  const std::vector<OutboxEvent> events = OutboxEventsAt(StoreUrl(), first);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].publications, 2);
  EXPECT_TRUE(events[0].published_at_ms.has_value());
  const http::Response metrics = Get("/metrics");
  EXPECT_NE(metrics.body.find("\nidem_outbox_republished_total 2\n"), std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("\nidem_outbox_published_total 4\n"), std::string::npos)
      << metrics.body;
}

#if !defined(IDEM_NO_FAILPOINTS)
// Killed after the broker confirmed a page and before it was marked: the next relay appends the
// page again, under the same event ids, and then marks it. Nothing is lost; a consumer keyed by
// the event id drops the copies.
TEST_F(OutboxTest, ARelayKilledBetweenTheAppendAndTheMarkAppendsThePageAgainLosingNothing) {
  for (int i = 0; i < 4; ++i) {
    (void)PaidId("outbox-crash-" + std::to_string(i), "ORD-CRASH-" + std::to_string(i));
  }
  const std::string config = dir_.File("relay.toml");
  WriteConfig(config, Relaying());
  auto [crashed, crash_out] = RunIdemctl({"outbox", "relay", "--config", config},
                                         {{"IDEM_FAILPOINTS", "outbox_after_publish=crash"}});
  EXPECT_EQ(crashed, 86) << crash_out;
  ASSERT_EQ(Entries(stream_).size(), 4u) << "the page was not appended before the crash";
  EXPECT_EQ(Unpublished().size(), 4u) << "marked although the relay died first";
  // Its lease was not given back: the next relay waits it out.
  const std::pair<int, std::string> ran = RelayWhenFree(config);
  ASSERT_EQ(ran.first, 0) << ran.second;
  EXPECT_NE(ran.second.find("4 events published"), std::string::npos) << ran.second;
  const std::vector<Entry> entries = Entries(stream_);
  ASSERT_EQ(entries.size(), 8u);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(entries[i].at("key"), entries[i + 4].at("key"))
        << "the copy is not the same event, in the same order";
  }
  EXPECT_TRUE(Unpublished().empty());
}
#endif

}  // namespace
}  // namespace idem::itest
