// server/idemd/brokers/amqp.cc — idemd's shared RabbitMQ plumbing (amqp.h).
#include "server/idemd/brokers/amqp.h"

#include <amqp_tcp_socket.h>

namespace idem::idemd::amqp {

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

Result<Endpoint> ParseUrl(const std::string& url) {
  std::string buffer = url;  // amqp_parse_url writes into it; the fields point into it
  amqp_connection_info info{};
  if (url.rfind("amqp://", 0) != 0 || amqp_parse_url(buffer.data(), &info) != AMQP_STATUS_OK) {
    return MakeError(Errc::kInvalidArgument,
                     "rabbitmq URL: must be amqp://user:password@host[:port]/vhost");
  }
  return Endpoint{info.host, info.port, info.user, info.password, info.vhost};
}

Result<amqp_connection_state_t> Connect(const Endpoint& endpoint, Millis timeout) {
  amqp_connection_state_t conn = amqp_new_connection();
  auto fail = [&](const std::string& why) -> Result<amqp_connection_state_t> {
    amqp_destroy_connection(conn);
    return MakeError(Errc::kUnavailable, why);
  };
  amqp_socket_t* socket = amqp_tcp_socket_new(conn);
  if (socket == nullptr) return fail("rabbitmq: no socket");
  timeval deadline = Timeval(timeout);
  if (const int opened =
          amqp_socket_open_noblock(socket, endpoint.host.c_str(), endpoint.port, &deadline);
      opened != AMQP_STATUS_OK) {
    return fail("rabbitmq connect " + endpoint.host + ":" + std::to_string(endpoint.port) + ": " +
                amqp_error_string2(opened));
  }
  amqp_set_rpc_timeout(conn, &deadline);
  // No heartbeats: rabbitmq-c answers them only inside its calls, and a message in hand may
  // take longer than a heartbeat between two. A process that dies closes its socket.
  const amqp_rpc_reply_t login =
      amqp_login(conn, endpoint.vhost.c_str(), 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
                 endpoint.user.c_str(), endpoint.password.c_str());
  if (std::string why = ReplyError(login, "rabbitmq login"); !why.empty()) return fail(why);
  return conn;
}

Status OpenChannel(amqp_connection_state_t conn, amqp_channel_t channel) {
  amqp_channel_open(conn, channel);
  if (std::string why = ReplyError(amqp_get_rpc_reply(conn), "rabbitmq channel.open");
      !why.empty()) {
    return MakeError(Errc::kUnavailable, why);
  }
  return Ok();
}

Status PublishConfirmed(amqp_connection_state_t conn, amqp_channel_t channel,
                        const Message& message, Millis timeout) {
  std::vector<amqp_table_entry_t> entries;
  for (const auto& [name, value] : message.headers) {
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
  if (!message.message_id.empty()) {
    props._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
    props.message_id = Bytes(message.message_id);
  }
  if (!message.content_type.empty()) {
    props._flags |= AMQP_BASIC_CONTENT_TYPE_FLAG;
    props.content_type = Bytes(message.content_type);
  }
  const std::string where =
      message.exchange.empty() ? message.routing_key : "exchange " + message.exchange;
  if (amqp_basic_publish(conn, channel, Bytes(message.exchange), Bytes(message.routing_key),
                         /*mandatory=*/1, /*immediate=*/0, &props,
                         Bytes(message.body)) != AMQP_STATUS_OK) {
    return MakeError(Errc::kUnavailable,
                     "rabbitmq: the message to " + where + " was not published");
  }
  // A returned message comes first (basic.return and its content), then the confirm.
  bool returned = false;
  while (true) {
    timeval deadline = Timeval(timeout);
    amqp_frame_t frame{};
    const int waited = amqp_simple_wait_frame_noblock(conn, &frame, &deadline);
    const bool method = waited == AMQP_STATUS_OK && frame.frame_type == AMQP_FRAME_METHOD &&
                        frame.channel == channel;
    if (method && frame.payload.method.id == AMQP_BASIC_RETURN_METHOD) {
      amqp_message_t content{};
      if (amqp_read_message(conn, channel, &content, 0).reply_type != AMQP_RESPONSE_NORMAL) {
        return MakeError(Errc::kUnavailable, "rabbitmq: a returned message was cut off");
      }
      amqp_destroy_message(&content);
      returned = true;
      continue;
    }
    if (method && frame.payload.method.id == AMQP_BASIC_ACK_METHOD && !returned) return Ok();
    return MakeError(Errc::kUnavailable,
                     returned ? "rabbitmq: nothing takes the message to " + where +
                                    " (it came back: no such queue, or no queue bound)"
                              : "rabbitmq: the message to " + where + " was not confirmed");
  }
}

}  // namespace idem::idemd::amqp
