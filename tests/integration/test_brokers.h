// tests/integration/test_brokers.h — a Redis and a RabbitMQ of one test alone, started and
// stopped by the test (by PID, also when it fails): the brokers of the queue consumers' proof
// (consumer_itest.cc) and of the outbox relay's (outbox_itest.cc).
#pragma once

#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <thread>

#include "tests/integration/idemd_fixture.h"

namespace idem::itest {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A message taken from a RabbitMQ queue: its UTF-8 headers, properties and body.
struct AmqpMessage {
  std::map<std::string, std::string> headers;
  std::string message_id;
  std::string content_type;
  std::string body;
};

// A dead letter as the broker holds it: why, and the message's body.
struct DeadLetter {
  std::string reason;
  std::string body;
};

// The fields of each entry of `stream` on the Redis on loopback `port` (the tests' Redis when
// 0), oldest first.
inline std::vector<std::map<std::string, std::string>> StreamEntries(const std::string& stream,
                                                                     uint16_t port = 0) {
  std::vector<std::map<std::string, std::string>> out;
  RedisReply range = RedisCommand({"XRANGE", stream, "-", "+"}, port);
  if (!range || range->type != REDIS_REPLY_ARRAY) return out;
  for (std::size_t e = 0; e < range->elements; ++e) {
    const redisReply* fields = range->element[e]->element[1];
    std::map<std::string, std::string>& f = out.emplace_back();
    for (std::size_t i = 0; i + 1 < fields->elements; i += 2) {
      f[std::string(fields->element[i]->str, fields->element[i]->len)] =
          std::string(fields->element[i + 1]->str, fields->element[i + 1]->len);
    }
  }
  return out;
}

// The broker of one test alone, durable, so that a restart keeps its messages, and started and
// stopped by the test (by PID, also when it fails).
class TestBroker {
 public:
  virtual ~TestBroker() = default;
  virtual void Start() = 0;  // fails the test (fatally) when it does not come up
  virtual void Restart() = 0;
  // The consumer's source keys: source, url and stream or queue.
  virtual std::string SourceToml() const = 0;
  // Publishes `body` with `headers`; returns the id a dead letter names it by.
  virtual std::string Publish(const std::string& body,
                              const std::vector<std::pair<std::string, std::string>>& headers) {
    return PublishTo("orders", body, headers);
  }
  // The same to another stream or queue (a dead letter made by hand).
  virtual std::string PublishTo(
      const std::string& queue, const std::string& body,
      const std::vector<std::pair<std::string, std::string>>& headers) = 0;
  // Messages neither acknowledged nor quarantined that the broker can tell of (-1: it cannot
  // tell). With every consumer stopped, every such message.
  virtual int64_t Unanswered() = 0;
  // The dead letters by the id of their message.
  virtual std::map<std::string, DeadLetter> DeadLetters() = 0;

  // The [outbox] keys of an idemd whose relay publishes where the consumers read: the stream
  // "orders", or the exchange "payments.events" (once Start has run).
  virtual std::string OutboxToml() const = 0;
  // Routes the relay's exchange to the consumers' queue once they have declared it, and to a
  // queue "audit" that keeps a copy of everything published; nothing to do on Redis, where the
  // relay appends to the consumers' stream. False when the broker refused.
  virtual bool RouteEvents() { return true; }
  // Every copy of an event the relay published, oldest first: its fields (Redis) or its
  // headers (RabbitMQ), `key` the event id among them. Once: RabbitMQ's are taken.
  virtual std::vector<std::map<std::string, std::string>> RelayedCopies() = 0;
};

// A Redis of its own, every write in the append-only file before it is answered: a restart keeps
// the stream, the group and its pending entries.
class RedisBroker final : public TestBroker {
 public:
  explicit RedisBroker(testing::TempDir& dir) : dir_(dir), port_(testing::FreeLoopbackPort()) {}

  void Start() override {
    auto p = testing::ChildProcess::Spawn(
        {"/usr/bin/redis-server", "--bind", "127.0.0.1", "--port", std::to_string(port_), "--save",
         "", "--appendonly", "yes", "--appendfsync", "always", "--dir", dir_.path().string()},
        {}, dir_.path().string(), dir_.File("redis.log"));
    ASSERT_TRUE(p.has_value()) << p.error().message;
    process_.emplace(std::move(*p));
    ASSERT_TRUE(testing::WaitForPort(port_, seconds(10)));
    // The port was free a moment ago; another test's server may have taken it since, and this
    // one exited instead of listening: then another port.
    if (process_->Wait(milliseconds(200)).has_value()) {
      ASSERT_LT(++port_tries_, 5) << "redis-server does not start (redis.log)";
      port_ = testing::FreeLoopbackPort();
      Start();
    }
  }
  void Restart() override {
    process_->Signal(SIGTERM);
    ASSERT_TRUE(process_->Wait(seconds(10)).has_value());
    process_.reset();
    Start();
  }
  std::string SourceToml() const override {
    return "source = \"redis\"\nurl = \"redis://127.0.0.1:" + std::to_string(port_) +
           "\"\nstream = \"orders\"\n";
  }
  std::string PublishTo(const std::string& queue, const std::string& body,
                        const std::vector<std::pair<std::string, std::string>>& headers) override {
    std::vector<std::string> xadd = {"XADD", queue, "*", "body", body};
    for (const auto& [name, value] : headers) xadd.insert(xadd.end(), {name, value});
    RedisReply id = RedisCommand(xadd, port_);
    EXPECT_TRUE(id && id->type == REDIS_REPLY_STRING);
    return id && id->type == REDIS_REPLY_STRING ? std::string(id->str, id->len) : "";
  }
  // The group's pending entries and the entries it has not read yet (XINFO GROUPS' lag).
  int64_t Unanswered() override {
    RedisReply groups = RedisCommand({"XINFO", "GROUPS", "orders"}, port_);
    if (!groups || groups->type != REDIS_REPLY_ARRAY || groups->elements != 1) return -1;
    int64_t pending = -1, lag = -1;
    const redisReply* g = groups->element[0];
    for (std::size_t i = 0; i + 1 < g->elements; i += 2) {
      const std::string name(g->element[i]->str, g->element[i]->len);
      const redisReply* v = g->element[i + 1];
      if (name == "pending" && v->type == REDIS_REPLY_INTEGER) pending = v->integer;
      if (name == "lag" && v->type == REDIS_REPLY_INTEGER) lag = v->integer;
    }
    return pending < 0 || lag < 0 ? -1 : pending + lag;
  }
  // One command on this broker.
  RedisReply Command(const std::vector<std::string>& args) { return RedisCommand(args, port_); }

  std::map<std::string, DeadLetter> DeadLetters() override {
    std::map<std::string, DeadLetter> out;
    for (auto& f : StreamEntries("orders.dead", port_))
      out[f["idem_source_id"]] = {f["idem_reason"], f["body"]};
    return out;
  }
  std::string OutboxToml() const override {
    return "broker = \"redis\"\nurl = \"redis://127.0.0.1:" + std::to_string(port_) +
           "\"\nstream = \"orders\"\n";
  }
  std::vector<std::map<std::string, std::string>> RelayedCopies() override {
    return StreamEntries("orders", port_);
  }

 private:
  testing::TempDir& dir_;
  uint16_t port_;  // fixed once Start has started the server
  int port_tries_ = 0;
  std::optional<testing::ChildProcess> process_;
};

// A RabbitMQ node of its own (Debian's rabbitmq-server, with its own epmd), its queues quorum
// queues on disk: a restart keeps them. Published under publisher confirms.
class RabbitBroker final : public TestBroker {
 public:
  explicit RabbitBroker(testing::TempDir& dir)
      : dir_(dir),
        port_(testing::FreeLoopbackPort()),
        dist_port_(testing::FreeLoopbackPort()),
        epmd_port_(testing::FreeLoopbackPort()),
        node_("idemtest" + std::to_string(port_) + "@localhost") {}
  ~RabbitBroker() override {
    Close();
    StopNode();
    if (epmd_) epmd_->Signal(SIGKILL);
  }

  void Start() override {
    const std::string base = dir_.File("rabbitmq");
    if (!std::filesystem::exists("/usr/sbin/rabbitmq-server")) {
      IDEM_SKIP_OR_FAIL("no /usr/sbin/rabbitmq-server");
    }
    std::filesystem::create_directories(base);
    std::ofstream(base + "/plugins") << "[].\n";
    if (!epmd_) {
      // epmd in the foreground, this test's child: the node finds it on its port and starts none.
      auto epmd = testing::ChildProcess::Spawn(
          {"/usr/bin/epmd", "-port", std::to_string(epmd_port_)}, {}, base, base + "/epmd.log");
      ASSERT_TRUE(epmd.has_value()) << epmd.error().message;
      epmd_.emplace(std::move(*epmd));
      ASSERT_TRUE(testing::WaitForPort(epmd_port_, seconds(10)));
    }
    // Run as root, Debian's wrapper runs the node as user rabbitmq: its directory must be its own.
    // and the test's directory (0700, mkdtemp's) one it may pass through.
    if (::geteuid() == 0) {
      std::filesystem::permissions(dir_.path(), std::filesystem::perms::others_exec,
                                   std::filesystem::perm_options::add);
      ASSERT_EQ(std::system(("chown -R rabbitmq: " + base).c_str()), 0);
    }
    auto node = testing::ChildProcess::Spawn({"/usr/sbin/rabbitmq-server"},
                                             {{"RABBITMQ_NODENAME", node_},
                                              {"RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1"},
                                              {"RABBITMQ_NODE_PORT", std::to_string(port_)},
                                              {"RABBITMQ_DIST_PORT", std::to_string(dist_port_)},
                                              {"ERL_EPMD_PORT", std::to_string(epmd_port_)},
                                              {"RABBITMQ_MNESIA_BASE", base + "/mnesia"},
                                              {"RABBITMQ_LOG_BASE", base + "/log"},
                                              {"RABBITMQ_ENABLED_PLUGINS_FILE", base + "/plugins"},
                                              {"RABBITMQ_PID_FILE", base + "/pid"},
                                              {"HOME", base}},
                                             base, dir_.File("rabbitmq.log"));
    ASSERT_TRUE(node.has_value()) << node.error().message;
    wrapper_.emplace(std::move(*node));
    // The port opens before the node has booted (a quorum queue declared then fails): wait for
    // the line the node logs once it has.
    bool booted = false;
    for (int i = 0; i < 600 && !booted; ++i) {
      std::ifstream log(base + "/log/" + node_ + ".log");
      std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      booted = text.find("Server startup complete", log_seen_) != std::string::npos;
      if (booted) log_seen_ = text.size();
      if (!booted) std::this_thread::sleep_for(milliseconds(100));
    }
    ASSERT_TRUE(booted) << "rabbitmq did not start";
    ASSERT_TRUE(testing::WaitForPort(port_, seconds(10)));
    std::ifstream pid_file(base + "/pid");
    pid_file >> node_pid_;
    ASSERT_GT(node_pid_, 0);
  }
  void Restart() override {
    Close();
    StopNode();
    Start();
  }
  std::string SourceToml() const override {
    return "source = \"rabbitmq\"\nurl = \"amqp://guest:guest@127.0.0.1:" + std::to_string(port_) +
           "/%2f\"\nqueue = \"orders\"\n";
  }
  std::string PublishTo(const std::string& queue, const std::string& body,
                        const std::vector<std::pair<std::string, std::string>>& headers) override {
    if (!Open()) return "";
    // A message published before its queue exists is dropped as unroutable, and confirmed: the
    // first waits until the consumers have declared it.
    for (int i = 0; i < 200 && !queue_seen_; ++i) {
      queue_seen_ = Unanswered() >= 0;
      if (!queue_seen_) std::this_thread::sleep_for(milliseconds(100));
    }
    EXPECT_TRUE(queue_seen_) << "no consumer declared the queue";
    if (!Open()) return "";
    const std::string id = "m-" + std::to_string(++published_);
    std::vector<amqp_table_entry_t> entries;
    for (const auto& [name, value] : headers) {
      amqp_table_entry_t e{};
      e.key = amqp_cstring_bytes(name.c_str());
      e.value.kind = AMQP_FIELD_KIND_UTF8;
      e.value.value.bytes = amqp_cstring_bytes(value.c_str());
      entries.push_back(e);
    }
    amqp_basic_properties_t props{};
    props._flags =
        AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG;
    props.delivery_mode = 2;
    props.message_id = amqp_cstring_bytes(id.c_str());
    props.headers = amqp_table_t{static_cast<int>(entries.size()), entries.data()};
    // Under publisher confirms. A quorum queue refuses a publish now and then (basic.nack: not
    // enqueued), and a channel that got one may refuse the rest: the publisher opens another
    // and sends the message again, as a producer must.
    bool confirmed = false;
    std::string why;
    for (int attempt = 0; attempt < 5 && !confirmed; ++attempt) {
      if (attempt > 0) {
        std::this_thread::sleep_for(milliseconds(50 * attempt));
        Close();
        if (!Open()) return "";
      }
      if (amqp_basic_publish(conn_, 1, amqp_empty_bytes, amqp_cstring_bytes(queue.c_str()), 0, 0,
                             &props, amqp_cstring_bytes(body.c_str())) != AMQP_STATUS_OK) {
        why = "basic.publish failed";
        continue;
      }
      amqp_frame_t frame{};
      timeval timeout{10, 0};
      const int waited = amqp_simple_wait_frame_noblock(conn_, &frame, &timeout);
      confirmed = waited == AMQP_STATUS_OK && frame.frame_type == AMQP_FRAME_METHOD &&
                  frame.payload.method.id == AMQP_BASIC_ACK_METHOD;
      why = waited != AMQP_STATUS_OK                            ? amqp_error_string2(waited)
            : frame.payload.method.id == AMQP_BASIC_NACK_METHOD ? "basic.nack"
                                                                : "another frame";
    }
    EXPECT_TRUE(confirmed) << "rabbitmq did not confirm " << id << ": " << why;
    return id;
  }
  // Deletes `queue` (with what it holds); whether the broker did.
  bool DeleteQueue(const std::string& queue) {
    if (!Open()) return false;
    return amqp_queue_delete(conn_, 1, amqp_cstring_bytes(queue.c_str()), 0, 0) != nullptr;
  }

  // The messages ready in the queue (a passive declare); the unacknowledged ones count only
  // once their consumers have gone.
  int64_t Unanswered() override {
    if (!Open()) return -1;
    amqp_queue_declare_ok_t* ok =
        amqp_queue_declare(conn_, 1, amqp_cstring_bytes("orders"), 1, 0, 0, 0, amqp_empty_table);
    if (ok == nullptr) {
      Close();
      return -1;
    }
    return ok->message_count;
  }
  std::map<std::string, DeadLetter> DeadLetters() override {
    std::map<std::string, DeadLetter> out;
    for (AmqpMessage& m : Take("orders.dead")) {
      // One the broker moved itself (its delivery limit) names neither: its id is its
      // message-id, its reason x-first-death-reason's ("delivery_limit").
      const std::string id =
          m.headers.contains("idem_source_id") ? m.headers["idem_source_id"] : m.message_id;
      out[id] = {m.headers.contains("idem_reason") ? m.headers["idem_reason"]
                                                   : m.headers["x-first-death-reason"],
                 std::move(m.body)};
    }
    return out;
  }
  // Takes every message of `queue` (basic.get, acknowledged as taken), oldest first.
  std::vector<AmqpMessage> Take(const std::string& queue) {
    std::vector<AmqpMessage> out;
    if (!Open()) return out;
    while (true) {
      amqp_rpc_reply_t got =
          amqp_basic_get(conn_, 1, amqp_cstring_bytes(queue.c_str()), /*no_ack=*/1);
      if (got.reply_type != AMQP_RESPONSE_NORMAL || got.reply.id != AMQP_BASIC_GET_OK_METHOD) {
        break;
      }
      amqp_message_t message{};
      if (amqp_read_message(conn_, 1, &message, 0).reply_type != AMQP_RESPONSE_NORMAL) break;
      auto text = [](amqp_bytes_t b) {
        return std::string(static_cast<const char*>(b.bytes), b.len);
      };
      AmqpMessage m;
      for (int i = 0; i < message.properties.headers.num_entries; ++i) {
        const amqp_table_entry_t& e = message.properties.headers.entries[i];
        if (e.value.kind != AMQP_FIELD_KIND_UTF8) continue;
        m.headers[text(e.key)] = text(e.value.value.bytes);
      }
      if (message.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
        m.message_id = text(message.properties.message_id);
      }
      if (message.properties._flags & AMQP_BASIC_CONTENT_TYPE_FLAG) {
        m.content_type = text(message.properties.content_type);
      }
      m.body = text(message.body);
      out.push_back(std::move(m));
      amqp_destroy_message(&message);
    }
    return out;
  }
  std::string OutboxToml() const override {
    return "broker = \"rabbitmq\"\nurl = \"" + Url() + "\"\nexchange = \"payments.events\"\n";
  }
  bool RouteEvents() override {
    return Bind("payments.events", "orders", /*declare_queue=*/false) &&
           Bind("payments.events", "audit");
  }
  std::vector<std::map<std::string, std::string>> RelayedCopies() override {
    std::vector<std::map<std::string, std::string>> out;
    for (AmqpMessage& m : Take("audit")) out.push_back(std::move(m.headers));
    return out;
  }
  // Declares a durable topic exchange and, unless it exists already (`declare_queue` false), a
  // durable queue, and binds the queue to it for every routing key.
  bool Bind(const std::string& exchange, const std::string& queue, bool declare_queue = true) {
    if (!Open()) return false;
    amqp_exchange_declare(conn_, 1, amqp_cstring_bytes(exchange.c_str()),
                          amqp_cstring_bytes("topic"), 0, /*durable=*/1, 0, 0, amqp_empty_table);
    if (amqp_get_rpc_reply(conn_).reply_type != AMQP_RESPONSE_NORMAL) return false;
    if (declare_queue) {
      amqp_queue_declare(conn_, 1, amqp_cstring_bytes(queue.c_str()), 0, /*durable=*/1, 0, 0,
                         amqp_empty_table);
      if (amqp_get_rpc_reply(conn_).reply_type != AMQP_RESPONSE_NORMAL) return false;
    }
    amqp_queue_bind(conn_, 1, amqp_cstring_bytes(queue.c_str()),
                    amqp_cstring_bytes(exchange.c_str()), amqp_cstring_bytes("#"),
                    amqp_empty_table);
    return amqp_get_rpc_reply(conn_).reply_type == AMQP_RESPONSE_NORMAL;
  }
  // Removes the binding Bind made.
  bool Unbind(const std::string& exchange, const std::string& queue) {
    if (!Open()) return false;
    amqp_queue_unbind(conn_, 1, amqp_cstring_bytes(queue.c_str()),
                      amqp_cstring_bytes(exchange.c_str()), amqp_cstring_bytes("#"),
                      amqp_empty_table);
    return amqp_get_rpc_reply(conn_).reply_type == AMQP_RESPONSE_NORMAL;
  }
  std::string Url() const {
    return "amqp://guest:guest@127.0.0.1:" + std::to_string(port_) + "/%2f";
  }

 private:
  bool Open() {
    if (conn_ != nullptr) return true;
    conn_ = amqp_new_connection();
    amqp_socket_t* socket = amqp_tcp_socket_new(conn_);
    timeval timeout{10, 0};
    if (socket == nullptr ||
        amqp_socket_open_noblock(socket, "127.0.0.1", port_, &timeout) != AMQP_STATUS_OK ||
        amqp_login(conn_, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest").reply_type !=
            AMQP_RESPONSE_NORMAL ||
        amqp_channel_open(conn_, 1) == nullptr || amqp_confirm_select(conn_, 1) == nullptr) {
      ADD_FAILURE() << "cannot reach rabbitmq on port " << port_;
      Close();
      return false;
    }
    return true;
  }
  void Close() {
    if (conn_ != nullptr) amqp_destroy_connection(conn_);
    conn_ = nullptr;
  }
  // SIGTERM to the node (by the PID it wrote), then its end.
  void StopNode() {
    if (node_pid_ <= 0) return;
    ::kill(node_pid_, SIGTERM);
    for (int i = 0; i < 300 && ::kill(node_pid_, 0) == 0; ++i) {
      std::this_thread::sleep_for(milliseconds(100));
    }
    ::kill(node_pid_, SIGKILL);
    node_pid_ = 0;
    if (wrapper_) wrapper_->Wait(seconds(10));
    wrapper_.reset();
  }

  testing::TempDir& dir_;
  const uint16_t port_, dist_port_, epmd_port_;
  const std::string node_;
  std::optional<testing::ChildProcess> epmd_;
  std::optional<testing::ChildProcess> wrapper_;
  pid_t node_pid_ = 0;
  std::size_t log_seen_ = 0;  // the node's log up to its last start
  amqp_connection_state_t conn_ = nullptr;
  int64_t published_ = 0;
  bool queue_seen_ = false;
};

}  // namespace idem::itest
