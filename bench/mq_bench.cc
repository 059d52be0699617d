// bench/mq_bench.cc — idem-mq-bench: the broker side of scripts/bench --consumers. It reads the
// [[consumers]] entry of an idemd config (the one idemd runs with) and, through idemd's own
// broker adapters (server/idemd/consumers: OpenRedisStream, OpenRabbitQueue):
//
//   publish CONFIG --messages N --keys K --prefix P
//       creates the stream's group or declares the queue as idemd would, then publishes N
//       messages of K distinct keys P-0 … P-(K-1) (the other N - K repeat a key with its
//       payload), pipelined: Redis XADDs in batches, RabbitMQ under publisher confirms in
//       batches; checks the broker holds N.
//   drain CONFIG --messages N [--timeout-s S]
//       the ceiling: the consumer's concurrency of threads, each with a source of its own as in
//       idemd, taking and acknowledging each message one by one (Receive, Ack) and doing nothing
//       else, until N are acknowledged; timed from the first delivery to the last ack.
//   watch CONFIG --messages N --metrics URL [--keys K] [--timeout-s S]
//       idemd's run: polls the broker every few ms until a message has been taken (a Redis
//       group's lag, a queue's ready count below N), then until idemd's /metrics counts N
//       messages answered (idem_consumer_messages_total of the consumer, counted after each
//       ack); checks the broker holds nothing unacknowledged and, with K, that idemd answered
//       every message as executed or duplicate, exactly K executed.
//   check --upstream URL --keys K --prefix P
//       asks upstream-sim what it executed (GET /admin/executions, then GET /status/KEY of each
//       operation for its body's business key): every key P-i executed exactly once, nothing
//       else. Exit status 1 otherwise.
//
// Each prints one JSON object on stdout; exit status 1 on any failure, 2 for a usage error.
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <hiredis/hiredis.h>
#include <toml++/toml.h>

#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "http/async.h"
#include "http/client.h"
#include "idem/clock.h"
#include "server/idemd/consumers/consumer_config.h"
#include "server/idemd/consumers/rabbitmq.h"
#include "server/idemd/consumers/redis_stream.h"
#include "src/store/redis/redis_client.h"

namespace idem {
namespace {

using idemd::ConsumerRoute;
using idemd::Delivery;
using idemd::MessageSource;
using Steady = std::chrono::steady_clock;

constexpr int kBatch = 500;  // messages per pipelined batch
constexpr auto kPoll = std::chrono::milliseconds(5);

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "idem-mq-bench: %s\n", why.c_str());
  std::exit(1);
}

double Seconds(Steady::duration d) { return std::chrono::duration<double>(d).count(); }

struct Args {
  std::string command;
  std::string config;
  int64_t messages = 0;
  int64_t keys = 0;
  std::string prefix = "m";
  std::string metrics;
  std::string upstream;
  double timeout_s = 600;
};

[[noreturn]] void Usage() {
  std::fprintf(
      stderr,
      "usage: idem-mq-bench publish CONFIG --messages N --keys K --prefix P\n"
      "       idem-mq-bench drain CONFIG --messages N [--timeout-s S]\n"
      "       idem-mq-bench watch CONFIG --messages N --metrics URL [--keys K] [--timeout-s S]\n"
      "       idem-mq-bench check --upstream URL --keys K --prefix P\n");
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  if (argc < 2) Usage();
  Args a;
  a.command = argv[1];
  int i = 2;
  if (a.command != "check") {
    if (argc < 3) Usage();
    a.config = argv[2];
    i = 3;
  }
  for (; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Usage();
    const std::string value = argv[++i];
    if (flag == "--messages") {
      a.messages = std::stoll(value);
    } else if (flag == "--keys") {
      a.keys = std::stoll(value);
    } else if (flag == "--prefix") {
      a.prefix = value;
    } else if (flag == "--metrics") {
      a.metrics = value;
    } else if (flag == "--upstream") {
      a.upstream = value;
    } else if (flag == "--timeout-s") {
      a.timeout_s = std::stod(value);
    } else {
      Usage();
    }
  }
  return a;
}

// The config's first [[consumers]] entry, read as idemd reads it.
ConsumerRoute ReadConsumer(const std::string& path) {
  toml::table file;
  try {
    file = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    Die(path + ": " + std::string(e.description()));
  }
  std::vector<ConsumerRoute> consumers;
  if (Status read = idemd::ReadConsumers(file, path, consumers); !read) Die(read.error().message);
  if (consumers.empty()) Die(path + ": no [[consumers]] entry");
  return consumers.front();
}

// A source of `consumer` as idemd opens one for its thread `i`.
std::unique_ptr<MessageSource> Open(const ConsumerRoute& consumer, const std::string& me) {
  auto source = consumer.IsRabbitMq()
                    ? idemd::OpenRabbitQueue(consumer, SystemMonotonicClock())
                    : idemd::OpenRedisStream(consumer, me, SystemMonotonicClock());
  if (!source) Die(source.error().message);
  return std::move(*source);
}

// ---- Redis, directly (hiredis): pipelined XADD and the group's state ----------------------------

struct RedisFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
using RedisContext = std::unique_ptr<redisContext, RedisFree>;

redis_internal::Reply RedisCommand(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  redis_internal::Reply r(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
  if (r == nullptr) Die("redis: " + args[0] + ": " + std::string(c->errstr));
  return r;
}

RedisContext ConnectRedis(const ConsumerRoute& consumer) {
  auto endpoint = redis_internal::ParseRedisUrl(consumer.url);
  if (!endpoint) Die(endpoint.error().message);
  RedisContext c(redisConnect(endpoint->host.c_str(), endpoint->port));
  if (c == nullptr || c->err != 0) Die("redis: cannot connect to " + consumer.url);
  auto must = [&c](const std::vector<std::string>& args) {
    redis_internal::Reply r = RedisCommand(c.get(), args);
    if (r->type == REDIS_REPLY_ERROR) Die("redis: " + args[0] + " refused");
  };
  if (!endpoint->password.empty()) {
    if (endpoint->user.empty()) {
      must({"AUTH", endpoint->password});
    } else {
      must({"AUTH", endpoint->user, endpoint->password});
    }
  }
  if (endpoint->database != 0) must({"SELECT", std::to_string(endpoint->database)});
  return c;
}

struct GroupState {
  int64_t lag = -1;      // entries not yet delivered to the group (-1: unknown)
  int64_t pending = -1;  // delivered, not acknowledged
};

GroupState RedisGroup(redisContext* c, const ConsumerRoute& consumer) {
  GroupState out;
  redis_internal::Reply r = RedisCommand(c, {"XINFO", "GROUPS", consumer.stream});
  if (r->type != REDIS_REPLY_ARRAY) return out;  // no stream yet
  for (std::size_t g = 0; g < r->elements; ++g) {
    const redisReply* group = r->element[g];
    if (group->type != REDIS_REPLY_ARRAY) continue;
    std::string name;
    GroupState state;
    for (std::size_t i = 0; i + 1 < group->elements; i += 2) {
      const std::string field(group->element[i]->str, group->element[i]->len);
      const redisReply* value = group->element[i + 1];
      if (field == "name" && value->type == REDIS_REPLY_STRING) name.assign(value->str, value->len);
      if (field == "lag" && value->type == REDIS_REPLY_INTEGER) state.lag = value->integer;
      if (field == "pending" && value->type == REDIS_REPLY_INTEGER) state.pending = value->integer;
    }
    if (name == consumer.group) return state;
  }
  return out;
}

// ---- RabbitMQ, directly (rabbitmq-c): publishing under confirms, and the queue's count ----------

class Amqp {
 public:
  explicit Amqp(const ConsumerRoute& consumer) {
    std::string buffer = consumer.url;
    amqp_connection_info info{};
    if (amqp_parse_url(buffer.data(), &info) != AMQP_STATUS_OK) Die("bad URL " + consumer.url);
    conn_ = amqp_new_connection();
    amqp_socket_t* socket = amqp_tcp_socket_new(conn_);
    timeval timeout{5, 0};
    if (socket == nullptr ||
        amqp_socket_open_noblock(socket, info.host, info.port, &timeout) != AMQP_STATUS_OK ||
        amqp_login(conn_, info.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, info.user,
                   info.password)
                .reply_type != AMQP_RESPONSE_NORMAL ||
        amqp_channel_open(conn_, 1) == nullptr) {
      Die("rabbitmq: cannot reach " + consumer.url);
    }
  }
  ~Amqp() {
    amqp_connection_close(conn_, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(conn_);
  }
  Amqp(const Amqp&) = delete;
  Amqp& operator=(const Amqp&) = delete;

  amqp_connection_state_t Connection() const { return conn_; }

  // The queue's ready messages (a passive declare; unacknowledged ones are not counted).
  int64_t Ready(const std::string& queue) {
    amqp_queue_declare_ok_t* ok = amqp_queue_declare(conn_, 1, amqp_cstring_bytes(queue.c_str()), 1,
                                                     0, 0, 0, amqp_empty_table);
    if (ok == nullptr) Die("rabbitmq: queue " + queue + " is not there");
    return ok->message_count;
  }

 private:
  amqp_connection_state_t conn_ = nullptr;
};

// ---- publish -----------------------------------------------------------------------------------

struct Message {
  std::string id;
  std::string body;
};

// N messages of K keys: each key once, then N - K repeats of keys chosen at random (the same
// payload), spread through the sequence by a shuffle with a fixed seed.
std::vector<Message> Messages(const Args& a) {
  std::vector<int64_t> keys;
  keys.reserve(static_cast<std::size_t>(a.messages));
  std::mt19937_64 random(42);
  for (int64_t k = 0; k < a.keys; ++k) keys.push_back(k);
  for (int64_t i = a.keys; i < a.messages; ++i) {
    keys.push_back(static_cast<int64_t>(random() % static_cast<uint64_t>(a.keys)));
  }
  std::shuffle(keys.begin(), keys.end(), random);
  std::vector<Message> out;
  out.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const int64_t k = keys[i];
    out.push_back({a.prefix + "-msg-" + std::to_string(i),
                   "{\"order\":\"" + a.prefix + "-" + std::to_string(k) +
                       "\",\"amount\":" + std::to_string(100 + k % 900) + "}"});
  }
  return out;
}

void PublishRedis(const ConsumerRoute& consumer, const std::vector<Message>& messages) {
  RedisContext c = ConnectRedis(consumer);
  for (std::size_t start = 0; start < messages.size(); start += kBatch) {
    const std::size_t end = std::min(messages.size(), start + kBatch);
    for (std::size_t i = start; i < end; ++i) {
      const char* argv[] = {"XADD", consumer.stream.c_str(), "*", consumer.body_field.c_str(),
                            messages[i].body.c_str()};
      const size_t lens[] = {4, consumer.stream.size(), 1, consumer.body_field.size(),
                             messages[i].body.size()};
      if (redisAppendCommandArgv(c.get(), 5, argv, lens) != REDIS_OK) Die("redis: XADD");
    }
    for (std::size_t i = start; i < end; ++i) {
      void* raw = nullptr;
      if (redisGetReply(c.get(), &raw) != REDIS_OK) Die("redis: XADD: " + std::string(c->errstr));
      redis_internal::Reply r(static_cast<redisReply*>(raw));
      if (r == nullptr || r->type == REDIS_REPLY_ERROR) Die("redis: XADD refused");
    }
  }
  redis_internal::Reply len = RedisCommand(c.get(), {"XLEN", consumer.stream});
  const GroupState group = RedisGroup(c.get(), consumer);
  if (len->integer != static_cast<long long>(messages.size()) ||
      group.lag != static_cast<int64_t>(messages.size())) {
    Die("redis: the stream holds " + std::to_string(len->integer) + " entries, the group's lag " +
        std::to_string(group.lag) + ", not " + std::to_string(messages.size()));
  }
}

void PublishRabbit(const ConsumerRoute& consumer, const std::vector<Message>& messages) {
  Amqp amqp(consumer);
  amqp_connection_state_t conn = amqp.Connection();
  if (amqp_confirm_select(conn, 1) == nullptr) Die("rabbitmq: confirm.select");
  uint64_t tag = 0;
  for (std::size_t start = 0; start < messages.size(); start += kBatch) {
    const std::size_t end = std::min(messages.size(), start + kBatch);
    for (std::size_t i = start; i < end; ++i) {
      amqp_basic_properties_t props{};
      props._flags =
          AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG;
      props.delivery_mode = 2;  // persistent
      props.message_id = amqp_cstring_bytes(messages[i].id.c_str());
      props.content_type = amqp_cstring_bytes("application/json");
      if (amqp_basic_publish(conn, 1, amqp_empty_bytes, amqp_cstring_bytes(consumer.queue.c_str()),
                             /*mandatory=*/1, 0, &props,
                             amqp_cstring_bytes(messages[i].body.c_str())) != AMQP_STATUS_OK) {
        Die("rabbitmq: basic.publish failed");
      }
      ++tag;
    }
    // The confirms of the batch: basic.ack (multiple or not) up to its last tag.
    uint64_t confirmed = tag - (end - start);
    while (confirmed < tag) {
      amqp_frame_t frame{};
      timeval timeout{30, 0};
      if (amqp_simple_wait_frame_noblock(conn, &frame, &timeout) != AMQP_STATUS_OK) {
        Die("rabbitmq: no confirm");
      }
      if (frame.frame_type != AMQP_FRAME_METHOD) continue;
      if (frame.payload.method.id == AMQP_BASIC_ACK_METHOD) {
        const auto* ack = static_cast<const amqp_basic_ack_t*>(frame.payload.method.decoded);
        confirmed = ack->multiple != 0 ? ack->delivery_tag : std::max(confirmed, ack->delivery_tag);
      } else if (frame.payload.method.id == AMQP_BASIC_NACK_METHOD ||
                 frame.payload.method.id == AMQP_BASIC_RETURN_METHOD) {
        Die("rabbitmq: a message was refused or returned unroutable");
      }
    }
    amqp_maybe_release_buffers(conn);
  }
  const int64_t ready = amqp.Ready(consumer.queue);
  if (ready != static_cast<int64_t>(messages.size())) {
    Die("rabbitmq: the queue holds " + std::to_string(ready) + ", not " +
        std::to_string(messages.size()));
  }
}

int Publish(const Args& a) {
  if (a.keys < 1 || a.messages < a.keys) Die("publish: need 1 <= --keys <= --messages");
  const ConsumerRoute consumer = ReadConsumer(a.config);
  {
    // The group (from the stream's beginning) or the queue, made as idemd makes them: one
    // Receive of a source on the empty broker, which takes nothing.
    std::unique_ptr<MessageSource> source = Open(consumer, "idem-mq-bench-publish");
    auto got = source->Receive(Millis(1));
    if (!got) Die(got.error().message);
    if (got->has_value()) Die("the broker already holds messages: use a new stream or queue");
  }
  const std::vector<Message> messages = Messages(a);
  const auto start = Steady::now();
  if (consumer.IsRabbitMq()) {
    PublishRabbit(consumer, messages);
  } else {
    PublishRedis(consumer, messages);
  }
  const double s = Seconds(Steady::now() - start);
  boost::json::object out{{"published", a.messages},
                          {"keys", a.keys},
                          {"seconds", s},
                          {"per_second", static_cast<double>(a.messages) / s}};
  std::printf("%s\n", boost::json::serialize(out).c_str());
  return 0;
}

// ---- drain: the ceiling ------------------------------------------------------------------------

// Whether the broker holds nothing unacknowledged (a queue: nothing ready; its unacknowledged
// messages cannot be counted without the management plugin).
bool BrokerEmpty(const ConsumerRoute& consumer, std::string* state) {
  if (consumer.IsRabbitMq()) {
    Amqp amqp(consumer);
    const int64_t ready = amqp.Ready(consumer.queue);
    *state = "ready " + std::to_string(ready);
    return ready == 0;
  }
  RedisContext c = ConnectRedis(consumer);
  const GroupState g = RedisGroup(c.get(), consumer);
  *state = "lag " + std::to_string(g.lag) + ", pending " + std::to_string(g.pending);
  return g.lag == 0 && g.pending == 0;
}

int Drain(const Args& a) {
  const ConsumerRoute consumer = ReadConsumer(a.config);
  const int threads = consumer.concurrency;
  std::atomic<int64_t> acked{0};
  std::atomic<int64_t> failures{0};
  std::atomic<int64_t> first_ns{INT64_MAX};
  std::atomic<int64_t> last_ns{0};
  const auto origin = Steady::now();
  const auto deadline = origin + std::chrono::duration_cast<Steady::duration>(
                                     std::chrono::duration<double>(a.timeout_s));
  auto since = [&origin] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Steady::now() - origin).count();
  };
  // Each thread opens its source first, then all start at once.
  std::atomic<int> ready{0};
  std::vector<std::thread> workers;
  for (int i = 0; i < threads; ++i) {
    workers.emplace_back([&, i] {
      std::unique_ptr<MessageSource> source =
          Open(consumer, "idem-mq-bench-drain/" + std::to_string(i));
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      while (acked.load() < a.messages && Steady::now() < deadline) {
        auto got = source->Receive(Millis(200));
        if (!got) {
          failures.fetch_add(1);
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        if (!got->has_value()) continue;
        const int64_t now = since();
        int64_t seen = first_ns.load();
        while (now < seen && !first_ns.compare_exchange_weak(seen, now)) {
        }
        const Delivery& d = **got;
        if (Status told = source->Ack(d); !told) {
          failures.fetch_add(1);  // delivered again later
          continue;
        }
        acked.fetch_add(1);
        const int64_t done = since();
        int64_t last = last_ns.load();
        while (done > last && !last_ns.compare_exchange_weak(last, done)) {
        }
      }
    });
  }
  for (std::thread& t : workers) t.join();
  std::string state;
  const bool empty = BrokerEmpty(consumer, &state);
  const double s = static_cast<double>(last_ns.load() - first_ns.load()) / 1e9;
  const bool ok = acked.load() == a.messages && empty;
  boost::json::object out{{"messages", acked.load()},
                          {"seconds", s},
                          {"per_second", s > 0 ? static_cast<double>(acked.load()) / s : 0.0},
                          {"concurrency", threads},
                          {"broker_failures", failures.load()},
                          {"broker", state},
                          {"ok", ok}};
  std::printf("%s\n", boost::json::serialize(out).c_str());
  if (!ok) {
    std::fprintf(stderr, "idem-mq-bench: drained %lld of %lld; broker: %s\n",
                 static_cast<long long>(acked.load()), static_cast<long long>(a.messages),
                 state.c_str());
  }
  return ok ? 0 : 1;
}

// ---- watch: idemd's run ------------------------------------------------------------------------

// idem_consumer_messages_total of `name` by outcome, from idemd's /metrics; nullopt when it did
// not answer.
std::optional<std::map<std::string, int64_t>> Outcomes(const http::Url& url,
                                                       const std::string& name) {
  auto answer = http::Call(url, {"GET", url.base_path + "/metrics", {}, ""},
                           {.max_response_bytes = 16 << 20});
  if (!answer || answer->status != 200) return std::nullopt;
  std::map<std::string, int64_t> out;
  const std::string prefix = "idem_consumer_messages_total{";
  const std::string mine = "consumer=\"" + name + "\"";
  std::size_t at = 0;
  const std::string& text = answer->body;
  while ((at = text.find(prefix, at)) != std::string::npos) {
    const std::size_t eol = text.find('\n', at);
    const std::string line = text.substr(at, eol == std::string::npos ? eol : eol - at);
    at = eol == std::string::npos ? text.size() : eol;
    if (line.find(mine) == std::string::npos) continue;
    const std::size_t o = line.find("outcome=\"");
    const std::size_t sp = line.rfind(' ');
    if (o == std::string::npos || sp == std::string::npos) continue;
    const std::size_t q = line.find('"', o + 9);
    out[line.substr(o + 9, q - o - 9)] += static_cast<int64_t>(std::stod(line.substr(sp + 1)));
  }
  return out;
}

int Watch(const Args& a) {
  const ConsumerRoute consumer = ReadConsumer(a.config);
  auto url = http::ParseHttpUrl(a.metrics);
  if (!url) Die("--metrics: " + url.error().message);
  const auto deadline = Steady::now() + std::chrono::duration_cast<Steady::duration>(
                                            std::chrono::duration<double>(a.timeout_s));
  std::optional<Amqp> amqp;
  RedisContext redis;
  if (consumer.IsRabbitMq()) {
    amqp.emplace(consumer);
  } else {
    redis = ConnectRedis(consumer);
  }
  // How many messages the broker still holds for the consumer to take (lag; ready), and whether
  // the broker's own view says every one has been acknowledged.
  auto untaken = [&](bool* acked_out) {
    if (amqp) {
      const int64_t ready = amqp->Ready(consumer.queue);
      *acked_out = false;  // a queue's unacknowledged messages are not counted: ask idemd
      return ready;
    }
    const GroupState g = RedisGroup(redis.get(), consumer);
    *acked_out = g.lag == 0 && g.pending == 0;
    return g.lag < 0 ? a.messages : g.lag;
  };
  bool all_acked = false;
  while (untaken(&all_acked) >= a.messages) {
    if (Steady::now() > deadline) Die("watch: no message was taken");
    std::this_thread::sleep_for(kPoll);
  }
  const auto first = Steady::now();
  // Until the broker has nothing left to hand out, then until idemd has answered every message.
  while (untaken(&all_acked) > 0) {
    if (Steady::now() > deadline) Die("watch: the broker still holds messages");
    std::this_thread::sleep_for(kPoll);
  }
  std::map<std::string, int64_t> outcomes;
  while (true) {
    if (all_acked || amqp) {
      auto got = Outcomes(*url, consumer.name);
      if (got) {
        int64_t sum = 0;
        for (const auto& [outcome, n] : *got) sum += n;
        if (sum >= a.messages) {
          outcomes = *got;
          break;
        }
      }
    }
    if (Steady::now() > deadline) Die("watch: idemd did not answer every message in time");
    std::this_thread::sleep_for(kPoll);
    if (!amqp) (void)untaken(&all_acked);
  }
  const auto last = Steady::now();
  std::string state;
  const bool empty = BrokerEmpty(consumer, &state);
  int64_t sum = 0;
  boost::json::object by_outcome;
  for (const auto& [outcome, n] : outcomes) {
    by_outcome[outcome] = n;
    sum += n;
  }
  const double s = Seconds(last - first);
  // With --keys: every message answered as executed or as a duplicate (none held, quarantined
  // or retried), one executed per key. What the upstream executed (check) decides exactly-once.
  const auto count = [&outcomes](const char* outcome) {
    auto it = outcomes.find(outcome);
    return it == outcomes.end() ? int64_t{0} : it->second;
  };
  const bool as_expected = a.keys == 0 || (count("executed") + count("duplicate") == a.messages &&
                                           count("executed") == a.keys);
  const bool ok = sum == a.messages && empty && as_expected;
  boost::json::object out{{"messages", sum},
                          {"seconds", s},
                          {"per_second", static_cast<double>(sum) / s},
                          {"concurrency", consumer.concurrency},
                          {"outcomes", by_outcome},
                          {"broker", state},
                          {"ok", ok}};
  std::printf("%s\n", boost::json::serialize(out).c_str());
  return ok ? 0 : 1;
}

// ---- check: exactly once -----------------------------------------------------------------------

http::Async<int> CheckAll(http::ClientPool& pool, const http::Url& url, const Args& a) {
  const http::CallOptions options{.max_response_bytes = 256 << 20};
  // Each request a named local: a temporary inside a co_await expression is destroyed twice by
  // GCC 12.
  http::Request question{"GET", url.base_path + "/admin/executions", {}, ""};
  auto executions = co_await pool.Call(std::move(question), options);
  if (!executions || executions->status != 200) Die("upstream-sim: /admin/executions failed");
  const boost::json::object counts = boost::json::parse(executions->body).as_object();
  std::map<std::string, int64_t> runs;  // business key → executions
  int64_t operations = 0;
  for (const auto& [upstream_key, n] : counts.at("keys").as_object()) {
    ++operations;
    http::Request ask{"GET", url.base_path + "/status/" + std::string(upstream_key), {}, ""};
    auto status = co_await pool.Call(std::move(ask), options);
    if (!status || status->status != 200) {
      Die("upstream-sim: /status/" + std::string(upstream_key) + " failed");
    }
    const boost::json::object answer = boost::json::parse(status->body).as_object();
    const boost::json::object body = boost::json::parse(answer.at("body").as_string()).as_object();
    runs[std::string(body.at("order").as_string())] += n.as_int64();
  }
  int64_t once = 0;
  int64_t missing = 0;
  int64_t more = 0;
  std::string example;
  for (int64_t k = 0; k < a.keys; ++k) {
    const std::string key = a.prefix + "-" + std::to_string(k);
    auto it = runs.find(key);
    const int64_t n = it == runs.end() ? 0 : it->second;
    if (n == 1) {
      ++once;
    } else {
      (n == 0 ? missing : more) += 1;
      if (example.empty()) example = key + " executed " + std::to_string(n) + " times";
    }
    if (it != runs.end()) runs.erase(it);
  }
  const int64_t foreign = static_cast<int64_t>(runs.size());
  const bool ok = once == a.keys && foreign == 0;
  boost::json::object out{{"keys", a.keys},
                          {"exactly_once", once},
                          {"never", missing},
                          {"more_than_once", more},
                          {"other_keys", foreign},
                          {"operations", operations},
                          {"total", counts.at("total").as_int64()},
                          {"ok", ok}};
  if (!example.empty()) out["example"] = example;
  std::printf("%s\n", boost::json::serialize(out).c_str());
  co_return ok ? 0 : 1;
}

int Check(const Args& a) {
  auto url = http::ParseHttpUrl(a.upstream);
  if (!url) Die("--upstream: " + url.error().message);
  auto pool = http::ClientPool::Make(*url);
  if (!pool) Die(pool.error().message);
  return http::RunSync(CheckAll(**pool, *url, a));
}

}  // namespace
}  // namespace idem

int main(int argc, char** argv) {
  const idem::Args a = idem::Parse(argc, argv);
  if (a.command == "publish") return idem::Publish(a);
  if (a.command == "drain") return idem::Drain(a);
  if (a.command == "watch") return idem::Watch(a);
  if (a.command == "check") return idem::Check(a);
  idem::Usage();
}
