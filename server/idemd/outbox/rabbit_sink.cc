// server/idemd/outbox/rabbit_sink.cc — the outbox relay's RabbitMQ exchange (relay.h).
#include <string>

#include "server/idemd/brokers/amqp.h"
#include "server/idemd/outbox/relay.h"

namespace idem::idemd {
namespace {

constexpr amqp_channel_t kChannel = 1;
// Every call's deadline, connecting and each confirm included.
constexpr Millis kCallTimeout{5000};

class RabbitEventSink final : public EventSink {
 public:
  RabbitEventSink(amqp::Endpoint endpoint, std::string exchange, std::string routing_key)
      : endpoint_(std::move(endpoint)),
        exchange_(std::move(exchange)),
        routing_key_(std::move(routing_key)) {}
  ~RabbitEventSink() override { Drop(); }

  std::size_t Publish(std::span<const OutboxEvent> events, std::optional<Error>* error) override {
    if (Status connected = Connected(); !connected) {
      *error = std::move(connected).error();
      return 0;
    }
    // One at a time, each confirmed before the next leaves: an event is never confirmed after
    // one that was not, so each payment's events arrive in order.
    for (std::size_t i = 0; i < events.size(); ++i) {
      const OutboxEvent& e = events[i];
      amqp::Message message;
      message.exchange = exchange_;
      message.routing_key = routing_key_.empty() ? e.type : routing_key_;
      // The event id is the message-id, and the `key` header idemd's queue consumers read by
      // default.
      message.headers = {{"key", e.id},
                         {"type", e.type},
                         {"aggregate", e.aggregate},
                         {"sequence", std::to_string(e.sequence)}};
      message.message_id = e.id;
      message.content_type = e.content_type;
      message.body = e.payload;
      if (Status published = amqp::PublishConfirmed(conn_, kChannel, message, kCallTimeout);
          !published) {
        Drop();
        *error = std::move(published).error();
        return i;
      }
    }
    return events.size();
  }

  std::string Describe() const override { return "rabbitmq exchange " + exchange_; }

 private:
  // Connects, checks that the exchange exists (a passive declare: idemd declares no exchange of
  // an operator's) and turns confirms on, unless connected already.
  Status Connected() {
    if (conn_ != nullptr) return Ok();
    IDEM_ASSIGN_OR_RETURN(conn_, amqp::Connect(endpoint_, kCallTimeout));
    Status ready = [&]() -> Status {
      IDEM_RETURN_IF_ERROR(amqp::OpenChannel(conn_, kChannel));
      amqp_exchange_declare(conn_, kChannel, amqp::Bytes(exchange_), amqp::Bytes(std::string()),
                            /*passive=*/1, 0, 0, 0, amqp_empty_table);
      const amqp_rpc_reply_t declared = amqp_get_rpc_reply(conn_);
      if (amqp::IsNotFound(declared)) {
        return MakeError(Errc::kUnavailable, "rabbitmq: the exchange " + exchange_ +
                                                 " does not exist (declare it, and bind the "
                                                 "queues of the events' consumers)");
      }
      if (std::string why = amqp::ReplyError(declared, "rabbitmq exchange.declare"); !why.empty()) {
        return MakeError(Errc::kUnavailable, why);
      }
      amqp_confirm_select(conn_, kChannel);
      if (std::string why = amqp::ReplyError(amqp_get_rpc_reply(conn_), "rabbitmq confirm.select");
          !why.empty()) {
        return MakeError(Errc::kUnavailable, why);
      }
      return Ok();
    }();
    if (!ready) Drop();
    return ready;
  }

  void Drop() {
    if (conn_ == nullptr) return;
    amqp_destroy_connection(conn_);
    conn_ = nullptr;
  }

  const amqp::Endpoint endpoint_;
  const std::string exchange_;
  const std::string routing_key_;
  amqp_connection_state_t conn_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<EventSink>> OpenRabbitEventSink(const std::string& url,
                                                       const std::string& exchange,
                                                       const std::string& routing_key) {
  if (exchange.empty()) return MakeError(Errc::kInvalidArgument, "outbox: the exchange is empty");
  IDEM_ASSIGN_OR_RETURN(amqp::Endpoint endpoint, amqp::ParseUrl(url));
  return std::unique_ptr<EventSink>(
      new RabbitEventSink(std::move(endpoint), exchange, routing_key));
}

}  // namespace idem::idemd
