// server/idemd/consumers/rabbitmq.cc — a queue's deliveries, acknowledgements and dead letters on
// one AMQP connection (channel 1 consumes, channel 2 publishes dead letters under confirms).
#include "server/idemd/consumers/rabbitmq.h"

#include <amqp.h>
#include <amqp_tcp_socket.h>

#include <cstring>
#include <functional>
#include <set>

namespace idem::idemd {
namespace {

constexpr amqp_channel_t kConsume = 1;
constexpr amqp_channel_t kPublish = 2;
// Every call's deadline, connecting and logging in included.
constexpr Millis kCallTimeout{5000};
// The longest a Receive waits for a delivery.
constexpr Millis kLongestWait{2000};

timeval Timeval(Millis m) {
  return timeval{static_cast<time_t>(m.count() / 1000),
                 static_cast<suseconds_t>((m.count() % 1000) * 1000)};
}

std::string Text(amqp_bytes_t bytes) {
  return bytes.len == 0 ? std::string()
                        : std::string(static_cast<const char*>(bytes.bytes), bytes.len);
}

amqp_bytes_t Bytes(const std::string& text) {
  return amqp_bytes_t{text.size(), const_cast<char*>(text.data())};  // read, never written
}

// What went wrong in `reply`, or "" when it is a normal one.
std::string ReplyError(const amqp_rpc_reply_t& reply, const char* what) {
  switch (reply.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return "";
    case AMQP_RESPONSE_NONE:
      return std::string(what) + ": no reply";
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      return std::string(what) + ": " + amqp_error_string2(reply.library_error);
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        const auto* close = static_cast<const amqp_channel_close_t*>(reply.reply.decoded);
        return std::string(what) + ": " + std::to_string(close->reply_code) + " " +
               Text(close->reply_text);
      }
      if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        const auto* close = static_cast<const amqp_connection_close_t*>(reply.reply.decoded);
        return std::string(what) + ": " + std::to_string(close->reply_code) + " " +
               Text(close->reply_text);
      }
      return std::string(what) + ": the broker closed the channel";
  }
  return std::string(what) + ": an unknown reply";
}

bool IsNotFound(const amqp_rpc_reply_t& reply) {
  return reply.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
         reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD &&
         static_cast<const amqp_channel_close_t*>(reply.reply.decoded)->reply_code == 404;
}

// A header's value as text, for the key rule and header_fields: strings as they are, integers in
// decimal; nullopt for any other kind.
std::optional<std::string> FieldText(const amqp_field_value_t& v) {
  switch (v.kind) {
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES:
      return Text(v.value.bytes);
    case AMQP_FIELD_KIND_I8:
      return std::to_string(v.value.i8);
    case AMQP_FIELD_KIND_U8:
      return std::to_string(v.value.u8);
    case AMQP_FIELD_KIND_I16:
      return std::to_string(v.value.i16);
    case AMQP_FIELD_KIND_U16:
      return std::to_string(v.value.u16);
    case AMQP_FIELD_KIND_I32:
      return std::to_string(v.value.i32);
    case AMQP_FIELD_KIND_U32:
      return std::to_string(v.value.u32);
    case AMQP_FIELD_KIND_I64:
      return std::to_string(v.value.i64);
    case AMQP_FIELD_KIND_U64:
      return std::to_string(v.value.u64);
    default:
      return std::nullopt;
  }
}

struct Endpoint {
  std::string host;
  int port = 5672;
  std::string user;
  std::string password;
  std::string vhost;
};

Result<Endpoint> ParseAmqpUrl(const std::string& url) {
  std::string buffer = url;  // amqp_parse_url writes into it; the fields point into it
  amqp_connection_info info{};
  if (url.rfind("amqp://", 0) != 0 || amqp_parse_url(buffer.data(), &info) != AMQP_STATUS_OK) {
    return MakeError(Errc::kInvalidArgument,
                     "rabbitmq URL: must be amqp://user:password@host[:port]/vhost");
  }
  return Endpoint{info.host, info.port, info.user, info.password, info.vhost};
}

class RabbitQueue final : public MessageSource {
 public:
  RabbitQueue(const ConsumerRoute& consumer, Endpoint endpoint, MonotonicClock& monotonic,
              bool consume)
      : consumer_(consumer),
        endpoint_(std::move(endpoint)),
        monotonic_(monotonic),
        consume_(consume) {}
  ~RabbitQueue() override { Drop(); }

  Result<std::optional<Delivery>> Receive(Millis wait) override {
    IDEM_RETURN_IF_ERROR(Connected());
    amqp_maybe_release_buffers(conn_);
    timeval timeout = Timeval(std::min(wait, kLongestWait));
    amqp_envelope_t envelope{};
    const amqp_rpc_reply_t reply = amqp_consume_message(conn_, &envelope, &timeout, 0);
    if (reply.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
        reply.library_error == AMQP_STATUS_TIMEOUT) {
      return std::optional<Delivery>();
    }
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
      // A channel or connection closed by the broker (a restart, the queue deleted): its
      // unacknowledged deliveries go back to the queue; connect again.
      const std::string why = ReplyError(reply, "rabbitmq consume");
      Drop();
      return MakeError(Errc::kUnavailable, why);
    }
    Delivery d;
    d.tag = envelope.delivery_tag;
    d.taken_over = envelope.redelivered != 0;
    d.received = monotonic_.Now();
    const amqp_basic_properties_t& p = envelope.message.properties;
    if ((p._flags & AMQP_BASIC_MESSAGE_ID_FLAG) != 0) d.id = Text(p.message_id);
    if ((p._flags & AMQP_BASIC_HEADERS_FLAG) != 0) {
      for (int i = 0; i < p.headers.num_entries; ++i) {
        const amqp_table_entry_t& entry = p.headers.entries[i];
        const std::string name = Text(entry.key);
        std::optional<std::string> value = FieldText(entry.value);
        if (!value) continue;
        if (name == "x-delivery-count") {
          // A quorum queue's count of the earlier deliveries.
          d.deliveries = 1 + std::max<int64_t>(0, std::atoll(value->c_str()));
        } else {
          d.fields.emplace_back(name, std::move(*value));
        }
      }
    }
    d.fields.emplace_back(consumer_.body_field, Text(envelope.message.body));
    amqp_destroy_envelope(&envelope);
    return std::optional<Delivery>(std::move(d));
  }

  Status Ack(const Delivery& delivery) override {
    IDEM_RETURN_IF_ERROR(Connected());
    if (amqp_basic_ack(conn_, kConsume, delivery.tag, 0) != AMQP_STATUS_OK) {
      Drop();
      return MakeError(Errc::kUnavailable, "rabbitmq basic.ack failed");
    }
    return Ok();
  }

  // A delivery stays this connection's until it is answered: nothing to keep.
  Status Keep(const Delivery& /*delivery*/) override { return Ok(); }
  bool TakesOverIdle() const override { return false; }

  Status Release(const Delivery& delivery) override {
    IDEM_RETURN_IF_ERROR(Connected());
    if (amqp_basic_nack(conn_, kConsume, delivery.tag, 0, /*requeue=*/1) != AMQP_STATUS_OK) {
      Drop();  // closing the connection gives it back as well
      return MakeError(Errc::kUnavailable, "rabbitmq basic.nack failed");
    }
    return Ok();
  }

  Status Quarantine(const Delivery& delivery, std::string_view reason,
                    std::string_view detail) override {
    IDEM_RETURN_IF_ERROR(Connected());
    // The dead letter's headers: why, then the message's own (its body is the body).
    std::vector<std::pair<std::string, std::string>> headers = {
        {"idem_source_id", delivery.id},
        {"idem_consumer", consumer_.name},
        {"idem_reason", std::string(reason)},
        {"idem_detail", std::string(detail)},
        {"idem_deliveries", std::to_string(delivery.deliveries)}};
    std::string body;
    for (const auto& [name, value] : delivery.fields) {
      if (name == consumer_.body_field) {
        body = value;
      } else {
        headers.emplace_back(name, value);
      }
    }
    // The broker's confirm before the original goes: a consumer that dies in between leaves the
    // message unacknowledged, and the next delivery quarantines it again (the dead letter names
    // its source id).
    IDEM_RETURN_IF_ERROR(PublishConfirmed(consumer_.dead_letter, headers, delivery.id, body));
    return Ack(delivery);
  }

  // The dead letters, read with basic.get and given back unacknowledged (the connection closes).
  Result<std::vector<DeadLetter>> ListDead(int limit) {
    std::vector<DeadLetter> out;
    auto each = [&](DeadLetter dead, uint64_t /*tag*/, const std::string& /*body*/) {
      out.push_back(std::move(dead));
      return Ok();
    };
    IDEM_RETURN_IF_ERROR(EachDead(limit, each));
    return out;
  }

  // Each chosen dead letter published to the consumer's queue under confirms, then acknowledged;
  // the others given back when the connection closes.
  Result<int64_t> RedriveDead(const std::set<std::string>& ids, int limit) {
    int64_t moved = 0;
    auto each = [&](const DeadLetter& dead, uint64_t tag, const std::string& body) -> Status {
      if (!ids.empty() && !ids.contains(dead.id)) return Ok();
      std::vector<std::pair<std::string, std::string>> headers;
      for (const auto& [name, value] : dead.fields) {
        if (name != consumer_.body_field) headers.emplace_back(name, value);
      }
      IDEM_RETURN_IF_ERROR(PublishConfirmed(consumer_.queue, headers, dead.source_id, body));
      if (amqp_basic_ack(conn_, kConsume, tag, 0) != AMQP_STATUS_OK) {
        Drop();
        return MakeError(Errc::kUnavailable, "rabbitmq basic.ack of a dead letter failed");
      }
      ++moved;
      return Ok();
    };
    if (Status done = EachDead(limit, each); !done) {
      return MakeError(Errc::kUnavailable, done.error().message + " (" + std::to_string(moved) +
                                               " were moved back before)");
    }
    return moved;
  }

  // The queue's ready messages, by a passive declare.
  Result<int64_t> Backlog() override {
    IDEM_RETURN_IF_ERROR(Connected());
    const amqp_queue_declare_ok_t* declared = amqp_queue_declare(
        conn_, kConsume, Bytes(consumer_.queue), /*passive=*/1, 0, 0, 0, amqp_empty_table);
    if (declared == nullptr) {
      const std::string why = ReplyError(amqp_get_rpc_reply(conn_), "rabbitmq queue.declare");
      Drop();
      return MakeError(Errc::kUnavailable, why);
    }
    return int64_t{declared->message_count};
  }

 private:
  // Publishes `body` with `headers` (and message-id `id` when not empty), persistent and
  // mandatory, to `queue` and waits for the broker's confirm. A queue that is gone returns the
  // message (basic.return) rather than dropping it: an error. Any failure drops the connection.
  Status PublishConfirmed(const std::string& queue,
                          const std::vector<std::pair<std::string, std::string>>& headers,
                          const std::string& id, const std::string& body) {
    IDEM_RETURN_IF_ERROR(Connected());
    std::vector<amqp_table_entry_t> entries;
    for (const auto& [name, value] : headers) {
      amqp_table_entry_t entry{};
      entry.key = Bytes(name);
      entry.value.kind = AMQP_FIELD_KIND_UTF8;
      entry.value.value.bytes = Bytes(value);
      entries.push_back(entry);
    }
    amqp_basic_properties_t props{};
    props._flags = AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    props.delivery_mode = 2;  // persistent
    props.headers.num_entries = static_cast<int>(entries.size());
    props.headers.entries = entries.data();
    if (!id.empty()) {
      props._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
      props.message_id = Bytes(id);
    }
    if (amqp_basic_publish(conn_, kPublish, amqp_empty_bytes, Bytes(queue), /*mandatory=*/1,
                           /*immediate=*/0, &props, Bytes(body)) != AMQP_STATUS_OK) {
      Drop();
      return MakeError(Errc::kUnavailable,
                       "rabbitmq: the message to " + queue + " was not published");
    }
    // A returned message comes first (basic.return and its content), then the confirm.
    bool returned = false;
    while (true) {
      timeval timeout = Timeval(kCallTimeout);
      amqp_frame_t frame{};
      const int waited = amqp_simple_wait_frame_noblock(conn_, &frame, &timeout);
      const bool method = waited == AMQP_STATUS_OK && frame.frame_type == AMQP_FRAME_METHOD &&
                          frame.channel == kPublish;
      if (method && frame.payload.method.id == AMQP_BASIC_RETURN_METHOD) {
        amqp_message_t content{};
        if (amqp_read_message(conn_, kPublish, &content, 0).reply_type != AMQP_RESPONSE_NORMAL) {
          Drop();
          return MakeError(Errc::kUnavailable, "rabbitmq: a returned message was cut off");
        }
        amqp_destroy_message(&content);
        returned = true;
        continue;
      }
      if (method && frame.payload.method.id == AMQP_BASIC_ACK_METHOD && !returned) return Ok();
      Drop();
      return MakeError(
          Errc::kUnavailable,
          returned ? "rabbitmq: the queue " + queue + " does not exist (the message came back)"
                   : "rabbitmq: the message to " + queue + " was not confirmed");
    }
  }

  // Takes up to `limit` dead letters with basic.get, unacknowledged, and hands each to `each`
  // with its delivery tag and body; then closes the connection, which gives back what `each`
  // did not acknowledge.
  Status EachDead(int limit,
                  const std::function<Status(DeadLetter, uint64_t, const std::string&)>& each) {
    IDEM_RETURN_IF_ERROR(Connected());
    Status status = Ok();
    for (int n = 0; n < limit && status; ++n) {
      const amqp_rpc_reply_t got =
          amqp_basic_get(conn_, kConsume, Bytes(consumer_.dead_letter), /*no_ack=*/0);
      if (std::string why = ReplyError(got, "rabbitmq basic.get"); !why.empty()) {
        Drop();
        return MakeError(Errc::kUnavailable, why);
      }
      if (got.reply.id != AMQP_BASIC_GET_OK_METHOD) break;  // basic.get-empty: no more
      const uint64_t tag = static_cast<const amqp_basic_get_ok_t*>(got.reply.decoded)->delivery_tag;
      amqp_message_t message{};
      if (amqp_read_message(conn_, kConsume, &message, 0).reply_type != AMQP_RESPONSE_NORMAL) {
        Drop();
        return MakeError(Errc::kUnavailable, "rabbitmq: a dead letter was cut off");
      }
      DeadLetter dead;
      const amqp_basic_properties_t& p = message.properties;
      if ((p._flags & AMQP_BASIC_MESSAGE_ID_FLAG) != 0)
        dead.id = dead.source_id = Text(p.message_id);
      if ((p._flags & AMQP_BASIC_HEADERS_FLAG) != 0) {
        for (int i = 0; i < p.headers.num_entries; ++i) {
          const std::string name = Text(p.headers.entries[i].key);
          std::optional<std::string> value = FieldText(p.headers.entries[i].value);
          if (!value) continue;  // x-death's table, and any other kind
          if (name == "idem_source_id") {
            dead.source_id = *value;
          } else if (name == "idem_reason" || name == "x-first-death-reason") {
            if (dead.reason.empty() || name == "idem_reason") dead.reason = *value;
          } else if (name == "idem_detail") {
            dead.detail = *value;
          } else if (name == "idem_deliveries") {
            dead.deliveries = std::atoll(value->c_str());
          } else if (name.rfind("idem_", 0) != 0 && name.rfind("x-first-death-", 0) != 0 &&
                     name.rfind("x-last-death-", 0) != 0 && name != "x-delivery-count") {
            dead.fields.emplace_back(name, std::move(*value));
          }
        }
      }
      std::string body = Text(message.body);
      dead.fields.emplace_back(consumer_.body_field, body);
      amqp_destroy_message(&message);
      status = each(std::move(dead), tag, body);
    }
    if (conn_ != nullptr) {
      // Closed in order: the acknowledgements sent count; what was not acknowledged goes back.
      amqp_connection_close(conn_, AMQP_REPLY_SUCCESS);
      Drop();
    }
    return status;
  }

  // Connects, declares the queues and starts consuming (unless it is only asked for its
  // backlog), unless connected already.
  Status Connected() {
    if (conn_ != nullptr) return Ok();
    conn_ = amqp_new_connection();
    amqp_socket_t* socket = amqp_tcp_socket_new(conn_);
    timeval timeout = Timeval(kCallTimeout);
    auto fail = [&](const std::string& why) {
      Drop();
      return MakeError(Errc::kUnavailable, why);
    };
    if (socket == nullptr) return fail("rabbitmq: no socket");
    if (const int opened =
            amqp_socket_open_noblock(socket, endpoint_.host.c_str(), endpoint_.port, &timeout);
        opened != AMQP_STATUS_OK) {
      return fail("rabbitmq connect " + endpoint_.host + ":" + std::to_string(endpoint_.port) +
                  ": " + amqp_error_string2(opened));
    }
    amqp_set_rpc_timeout(conn_, &timeout);
    // No heartbeats: rabbitmq-c answers them only inside its calls, and a message in hand may
    // take longer than a heartbeat between two. A consumer that dies closes its socket.
    const amqp_rpc_reply_t login =
        amqp_login(conn_, endpoint_.vhost.c_str(), 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
                   endpoint_.user.c_str(), endpoint_.password.c_str());
    if (std::string why = ReplyError(login, "rabbitmq login"); !why.empty()) return fail(why);
    IDEM_RETURN_IF_ERROR(OpenChannel(kConsume));
    IDEM_RETURN_IF_ERROR(Declare(consumer_.dead_letter, false));
    IDEM_RETURN_IF_ERROR(Declare(consumer_.queue, true));
    if (consume_) {
      amqp_basic_qos(conn_, kConsume, 0, /*prefetch_count=*/1, 0);
      if (std::string why = ReplyError(amqp_get_rpc_reply(conn_), "rabbitmq basic.qos");
          !why.empty()) {
        return fail(why);
      }
      amqp_basic_consume(conn_, kConsume, Bytes(consumer_.queue), amqp_empty_bytes, 0,
                         /*no_ack=*/0, 0, amqp_empty_table);
      if (std::string why = ReplyError(amqp_get_rpc_reply(conn_), "rabbitmq basic.consume");
          !why.empty()) {
        return fail(why);
      }
    }
    IDEM_RETURN_IF_ERROR(OpenChannel(kPublish));
    amqp_confirm_select(conn_, kPublish);
    if (std::string why = ReplyError(amqp_get_rpc_reply(conn_), "rabbitmq confirm.select");
        !why.empty()) {
      return fail(why);
    }
    return Ok();
  }

  Status OpenChannel(amqp_channel_t channel) {
    amqp_channel_open(conn_, channel);
    if (std::string why = ReplyError(amqp_get_rpc_reply(conn_), "rabbitmq channel.open");
        !why.empty()) {
      Drop();
      return MakeError(Errc::kUnavailable, why);
    }
    return Ok();
  }

  // Uses `queue` as it is when it exists (a passive declare); else declares it a durable quorum
  // queue — the consumer's own with a delivery limit that dead-letters, as a last resort, to the
  // dead-letter queue.
  Status Declare(const std::string& queue, bool consumed) {
    amqp_queue_declare(conn_, kConsume, Bytes(queue), /*passive=*/1, 0, 0, 0, amqp_empty_table);
    const amqp_rpc_reply_t passive = amqp_get_rpc_reply(conn_);
    if (passive.reply_type == AMQP_RESPONSE_NORMAL) return Ok();
    if (!IsNotFound(passive)) {
      const std::string why = ReplyError(passive, ("rabbitmq queue.declare " + queue).c_str());
      Drop();
      return MakeError(Errc::kUnavailable, why);
    }
    // The 404 closed the channel: acknowledge the close, then open it again.
    amqp_channel_close_ok_t close_ok{};
    if (amqp_send_method(conn_, kConsume, AMQP_CHANNEL_CLOSE_OK_METHOD, &close_ok) !=
        AMQP_STATUS_OK) {
      Drop();
      return MakeError(Errc::kUnavailable, "rabbitmq: channel.close-ok failed");
    }
    IDEM_RETURN_IF_ERROR(OpenChannel(kConsume));
    const std::string quorum = "quorum";
    std::vector<amqp_table_entry_t> args;
    auto add_text = [&](const char* key, const std::string& value) {
      amqp_table_entry_t e{};
      e.key = amqp_cstring_bytes(key);
      e.value.kind = AMQP_FIELD_KIND_UTF8;
      e.value.value.bytes = Bytes(value);
      args.push_back(e);
    };
    add_text("x-queue-type", quorum);
    const std::string empty;
    if (consumed) {
      amqp_table_entry_t limit{};
      limit.key = amqp_cstring_bytes("x-delivery-limit");
      limit.value.kind = AMQP_FIELD_KIND_I64;
      // Deliveries that only waited on a running execution are no attempts (Consumer::TooOften):
      // the broker steps in only well past what the consumer counts.
      limit.value.value.i64 = 2 * int64_t{consumer_.max_attempts} + 2;
      args.push_back(limit);
      add_text("x-dead-letter-exchange", empty);
      add_text("x-dead-letter-routing-key", consumer_.dead_letter);
    }
    const amqp_table_t table{static_cast<int>(args.size()), args.data()};
    amqp_queue_declare(conn_, kConsume, Bytes(queue), 0, /*durable=*/1, 0, 0, table);
    if (std::string why =
            ReplyError(amqp_get_rpc_reply(conn_), ("rabbitmq queue.declare " + queue).c_str());
        !why.empty()) {
      Drop();
      return MakeError(Errc::kUnavailable, why);
    }
    return Ok();
  }

  // Closes the connection (the broker gives its unacknowledged deliveries back to the queue).
  void Drop() {
    if (conn_ == nullptr) return;
    amqp_destroy_connection(conn_);
    conn_ = nullptr;
  }

  const ConsumerRoute& consumer_;
  const Endpoint endpoint_;
  MonotonicClock& monotonic_;
  const bool consume_;  // false: a source only asked for its Backlog, given no message
  amqp_connection_state_t conn_ = nullptr;
};

// An operator's view of the dead-letter queue, on a connection that takes no message.
class RabbitDeadLetters final : public DeadLetterBox {
 public:
  explicit RabbitDeadLetters(const ConsumerRoute& consumer, Endpoint endpoint)
      : queue_(consumer, std::move(endpoint), SystemMonotonicClock(), /*consume=*/false) {}
  Result<std::vector<DeadLetter>> List(int limit) override { return queue_.ListDead(limit); }
  Result<int64_t> Redrive(const std::set<std::string>& ids, int limit) override {
    return queue_.RedriveDead(ids, limit);
  }

 private:
  RabbitQueue queue_;
};

}  // namespace

Result<std::unique_ptr<DeadLetterBox>> OpenRabbitDeadLetters(const ConsumerRoute& consumer) {
  IDEM_ASSIGN_OR_RETURN(Endpoint endpoint, ParseAmqpUrl(consumer.url));
  return std::unique_ptr<DeadLetterBox>(
      std::make_unique<RabbitDeadLetters>(consumer, std::move(endpoint)));
}

Result<std::unique_ptr<MessageSource>> OpenRabbitQueue(const ConsumerRoute& consumer,
                                                       MonotonicClock& monotonic, bool consume) {
  IDEM_ASSIGN_OR_RETURN(Endpoint endpoint, ParseAmqpUrl(consumer.url));
  return std::unique_ptr<MessageSource>(
      std::make_unique<RabbitQueue>(consumer, std::move(endpoint), monotonic, consume));
}

}  // namespace idem::idemd
