// server/idemd/consumers/rabbitmq.cc — a queue's deliveries, acknowledgements and dead letters on
// one AMQP connection (channel 1 consumes, channel 2 publishes dead letters under confirms).
#include "server/idemd/consumers/rabbitmq.h"

#include <cstring>
#include <functional>
#include <set>

#include "server/idemd/brokers/amqp.h"

namespace idem::idemd {
namespace {

constexpr amqp_channel_t kConsume = 1;
constexpr amqp_channel_t kPublish = 2;
// Every call's deadline, connecting and logging in included.
constexpr Millis kCallTimeout{5000};
// The longest a Receive waits for a delivery.
constexpr Millis kLongestWait{2000};

using amqp::Bytes;
using amqp::Endpoint;
using amqp::IsNotFound;
using amqp::ReplyError;
using amqp::Text;
using amqp::Timeval;

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
    amqp::Message message;
    message.routing_key = queue;
    message.headers = headers;
    message.message_id = id;
    message.body = body;
    Status published = amqp::PublishConfirmed(conn_, kPublish, message, kCallTimeout);
    if (!published) Drop();
    return published;
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
    IDEM_ASSIGN_OR_RETURN(conn_, amqp::Connect(endpoint_, kCallTimeout));
    auto fail = [&](const std::string& why) {
      Drop();
      return MakeError(Errc::kUnavailable, why);
    };
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
    Status opened = amqp::OpenChannel(conn_, channel);
    if (!opened) Drop();
    return opened;
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
  IDEM_ASSIGN_OR_RETURN(Endpoint endpoint, amqp::ParseUrl(consumer.url));
  return std::unique_ptr<DeadLetterBox>(
      std::make_unique<RabbitDeadLetters>(consumer, std::move(endpoint)));
}

Result<std::unique_ptr<MessageSource>> OpenRabbitQueue(const ConsumerRoute& consumer,
                                                       MonotonicClock& monotonic, bool consume) {
  IDEM_ASSIGN_OR_RETURN(Endpoint endpoint, amqp::ParseUrl(consumer.url));
  return std::unique_ptr<MessageSource>(
      std::make_unique<RabbitQueue>(consumer, std::move(endpoint), monotonic, consume));
}

}  // namespace idem::idemd
