// bench/outbox_bench.cc — idem-outbox-bench: the outbox relay's throughput beside its broker's
// own, for scripts/bench --outbox (docs/outbox.md).
//
//   idem-outbox-bench --store URL --broker redis|rabbitmq --url URL [--events N] [--batch B]
//
// Writes N events (two per aggregate, 100 per transaction) to the outbox of the store at URL
// (created if needed; its earlier events deleted), then times, on the same machine:
//   relay    idemd's relay (server/idemd/outbox: Relay::RunOnce, pages of B, under its lease)
//            publishing all N and marking each page in the store;
//   ceiling  the same sink (the same broker code, connection and pages) publishing the same N
//            events from memory: what the broker takes with nothing else in the way.
// The Redis stream is idem.bench.events (deleted before each run); on RabbitMQ the topic
// exchange idem.bench.events with a queue idem.bench.events.q bound to it (declared, purged).
// Checks that the relay published every event once and left none unpublished. Prints one JSON
// object; exit status 1 on any failure, 2 for a usage error.
#include <amqp.h>
#include <hiredis/hiredis.h>

#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "idem/clock.h"
#include "idem/outbox.h"
#include "server/idemd/brokers/amqp.h"
#include "server/idemd/config/config.h"
#include "server/idemd/config/store_url.h"
#include "server/idemd/outbox/relay.h"
#include "src/store/redis/redis_client.h"

namespace idem {
namespace {

using Steady = std::chrono::steady_clock;

constexpr const char* kStream = "idem.bench.events";
constexpr const char* kQueue = "idem.bench.events.q";
constexpr Millis kTimeout{10'000};

int Fail(const std::string& what) {
  std::fprintf(stderr, "idem-outbox-bench: %s\n", what.c_str());
  return 1;
}

double Seconds(Steady::duration d) { return std::chrono::duration<double>(d).count(); }

struct Args {
  std::string store, broker, url;
  int events = 10'000;  // at most kOutboxPageMax: the ceiling's events are read at once
  int batch = 100;
};

// An empty stream (Redis), or a declared exchange with a bound, purged queue (RabbitMQ).
Status ResetBroker(const Args& a) {
  if (a.broker == "redis") {
    IDEM_ASSIGN_OR_RETURN(redis_internal::Endpoint endpoint, redis_internal::ParseRedisUrl(a.url));
    IDEM_ASSIGN_OR_RETURN(auto conn, redis_internal::ConnectRedis(endpoint, kTimeout));
    const std::vector<std::string_view> del = {"DEL", kStream};
    if (conn->Command(del) == nullptr) {
      return MakeError(Errc::kUnavailable, "redis: DEL: " + conn->LastError());
    }
    return Ok();
  }
  namespace amqp = idemd::amqp;
  IDEM_ASSIGN_OR_RETURN(amqp::Endpoint endpoint, amqp::ParseUrl(a.url));
  IDEM_ASSIGN_OR_RETURN(amqp_connection_state_t conn, amqp::Connect(endpoint, kTimeout));
  Status done = [&]() -> Status {
    IDEM_RETURN_IF_ERROR(amqp::OpenChannel(conn, 1));
    const auto checked = [&](const char* what) -> Status {
      const amqp_rpc_reply_t reply = amqp_get_rpc_reply(conn);
      if (reply.reply_type == AMQP_RESPONSE_NORMAL) return Ok();
      return MakeError(Errc::kUnavailable, amqp::ReplyError(reply, what));
    };
    amqp_exchange_declare(conn, 1, amqp_cstring_bytes(kStream), amqp_cstring_bytes("topic"), 0,
                          /*durable=*/1, 0, 0, amqp_empty_table);
    IDEM_RETURN_IF_ERROR(checked("exchange.declare"));
    amqp_queue_declare(conn, 1, amqp_cstring_bytes(kQueue), 0, /*durable=*/1, 0, 0,
                       amqp_empty_table);
    IDEM_RETURN_IF_ERROR(checked("queue.declare"));
    amqp_queue_bind(conn, 1, amqp_cstring_bytes(kQueue), amqp_cstring_bytes(kStream),
                    amqp_cstring_bytes("#"), amqp_empty_table);
    IDEM_RETURN_IF_ERROR(checked("queue.bind"));
    amqp_queue_purge(conn, 1, amqp_cstring_bytes(kQueue));
    return checked("queue.purge");
  }();
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
  return done;
}

int Run(const Args& a) {
  idemd::StoreUrlOptions options;
  options.pool_size = 2;
  options.apps = {{"outbox", OutboxMigrations()}};
  auto store = idemd::OpenStoreUrl(a.store, options);
  if (!store) return Fail("store: " + store.error().message);
  {
    auto txn = (*store)->Begin();
    if (!txn || !(*txn)->Exec("DELETE FROM idem_outbox") || !(*txn)->Commit()) {
      return Fail("store: cannot empty idem_outbox");
    }
  }
  // The events: two per aggregate, as a payment's outcome and a refund would be.
  const Timestamp now = SystemClock().Now();
  for (int from = 0; from < a.events; from += 100) {
    auto txn = (*store)->Begin();
    if (!txn) return Fail("store: " + txn.error().message);
    for (int i = from; i < std::min(from + 100, a.events); ++i) {
      const std::string aggregate = "pay_bench_" + std::to_string(i / 2);
      OutboxEventSpec spec{aggregate, i % 2 == 0 ? "payment.succeeded" : "payment.refunded",
                           i % 2 == 0 ? "" : "ch_" + std::to_string(i),
                           R"({"type":"bench","payment":{"id":")" + aggregate +
                               R"(","amount":"100.00","currency":"CNY","status":"succeeded"}})"};
      if (auto added = AddOutboxEvent(**txn, spec, now); !added) {
        return Fail("store: " + added.error().message);
      }
    }
    if (Status committed = (*txn)->Commit(); !committed) {
      return Fail("store: " + committed.error().message);
    }
  }
  auto written = UnpublishedOutboxEvents(**store, a.events);
  if (!written) return Fail("store: " + written.error().message);
  const std::vector<OutboxEvent>& events = *written;
  if (events.size() != static_cast<std::size_t>(a.events)) return Fail("events were not written");

  idemd::OutboxConfig config;
  config.broker = a.broker;
  config.url = a.url;
  config.stream = kStream;
  config.exchange = kStream;
  config.batch = a.batch;

  // The ceiling: the sink alone, the same pages from memory.
  if (Status reset = ResetBroker(a); !reset) return Fail(reset.error().message);
  auto ceiling_sink = idemd::OpenEventSink(config);
  if (!ceiling_sink) return Fail(ceiling_sink.error().message);
  const Steady::time_point ceiling_began = Steady::now();
  for (std::size_t from = 0; from < events.size(); from += static_cast<std::size_t>(a.batch)) {
    const std::span<const OutboxEvent> page(
        events.data() + from, std::min(events.size() - from, static_cast<std::size_t>(a.batch)));
    std::optional<Error> error;
    if ((*ceiling_sink)->Publish(page, &error) != page.size()) {
      return Fail("ceiling: " + (error ? error->message : std::string("not confirmed")));
    }
  }
  const double ceiling_s = Seconds(Steady::now() - ceiling_began);

  // The relay: the store's events, paged, published and marked under its lease.
  if (Status reset = ResetBroker(a); !reset) return Fail(reset.error().message);
  auto sink = idemd::OpenEventSink(config);
  if (!sink) return Fail(sink.error().message);
  idemd::Relay relay(**store, **sink, SystemClock(), idemd::RelayOptions{.batch = a.batch},
                     nullptr);
  const Steady::time_point relay_began = Steady::now();
  auto pass = relay.RunOnce(a.events);
  const double relay_s = Seconds(Steady::now() - relay_began);
  if (!pass) return Fail("relay: " + pass.error().message);
  auto left = UnpublishedOutboxEvents(**store, 1);
  if (pass->published != a.events || !left || !left->empty()) {
    return Fail("relay: published " + std::to_string(pass->published) + " of " +
                std::to_string(a.events));
  }

  boost::json::object out{{"store", a.store.rfind("sqlite:", 0) == 0 ? "sqlite" : "postgresql"},
                          {"broker", a.broker},
                          {"events", a.events},
                          {"batch", a.batch},
                          {"relay_s", relay_s},
                          {"ceiling_s", ceiling_s},
                          {"relay_events_per_s", a.events / relay_s},
                          {"ceiling_events_per_s", a.events / ceiling_s},
                          {"ratio", ceiling_s / relay_s}};
  std::printf("%s\n", boost::json::serialize(out).c_str());
  return 0;
}

}  // namespace
}  // namespace idem

int main(int argc, char** argv) {
  idem::Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--store") {
      a.store = value;
    } else if (flag == "--broker") {
      a.broker = value;
    } else if (flag == "--url") {
      a.url = value;
    } else if (flag == "--events") {
      a.events = std::atoi(value.c_str());
    } else if (flag == "--batch") {
      a.batch = std::atoi(value.c_str());
    } else {
      argc = 0;
    }
  }
  if (argc % 2 != 1 || a.store.empty() || a.url.empty() ||
      (a.broker != "redis" && a.broker != "rabbitmq") || a.events < 2 ||
      a.events > idem::limits::kOutboxPageMax || a.batch < 1 ||
      a.batch > idem::limits::kOutboxPageMax) {
    std::fprintf(stderr,
                 "usage: idem-outbox-bench --store URL --broker redis|rabbitmq --url URL "
                 "[--events 2..10000] [--batch 1..10000]\n");
    return 2;
  }
  return idem::Run(a);
}
