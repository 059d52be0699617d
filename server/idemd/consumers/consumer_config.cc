// server/idemd/consumers/consumer_config.cc — [[consumers]] entries into ConsumerRoutes, and back.
#include "server/idemd/consumers/consumer_config.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "http/message.h"
#include "idem/limits.h"
#include "server/idemd/config/config.h"
#include "server/idemd/gateway/route_config.h"

namespace idem::idemd {
namespace {

Error BadConsumer(const std::string& origin, int64_t line, const std::string& name,
                  const std::string& what) {
  return MakeError(Errc::kInvalidArgument, origin + ":" + std::to_string(line) + ": [[consumers]]" +
                                               (name.empty() ? "" : " " + name) + ": " + what);
}

bool NameChars(const std::string& text, bool colon) {
  return std::all_of(text.begin(), text.end(), [colon](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-' || (colon && ch == ':');
  });
}

std::string KeyRule(const ConsumerRoute& c) {
  switch (c.key_source) {
    case KeySource::kField:
      return "field:" + c.key_name;
    case KeySource::kJson:
      return "json:" + c.key_name;
    case KeySource::kBrokerId:
      return "id";
  }
  return "id";
}

Result<ConsumerRoute> ReadConsumer(const toml::table& t, const std::string& origin) {
  ConsumerRoute c;
  c.line = t.source().begin.line;
  if (auto name = t["name"].value<std::string>()) c.name = *name;
  auto bad = [&](const std::string& what) { return BadConsumer(origin, c.line, c.name, what); };
  if (std::string problem = RouteNameProblem(c.name); !problem.empty()) return bad(problem);
  if (const toml::node* tenant = t.get("payments_tenant")) {
    auto text = tenant->value<std::string>();
    // "" is no tenant: the target is [consumers.target] (as --check-config prints it).
    if (!text || text->size() > limits::kPrincipalMaxLength || !NameChars(*text, false)) {
      return BadConsumer(origin, tenant->source().begin.line, c.name,
                         "payments_tenant: must be 0.." +
                             std::to_string(limits::kPrincipalMaxLength) +
                             " characters of A-Z a-z 0-9 . _ -");
    }
    c.payments_tenant = *text;
  }
  const toml::table* target = t["target"].as_table();
  if (c.IsPayments()) {
    if (t.contains("target")) {
      return bad(
          "payments_tenant makes idemd's payments operation the target: it takes no "
          "[consumers.target]");
    }
    // The payments route's request, under its lease and retention (LoadConfig sets them).
    c.target.name = c.name;
    c.target.method = "POST";
    c.target.pattern = "/v1/payments";
    c.target.json_body = true;
  } else if (target == nullptr) {
    return bad(
        "needs a [consumers.target] table (the request each message becomes), or "
        "payments_tenant (each message a payment of that tenant)");
  } else {
    IDEM_ASSIGN_OR_RETURN(c.target, ReadConsumerTarget(*target, origin, c.name));
  }
  bool dead_letter_set = false;
  for (const auto& [key, node] : t) {
    const std::string k(key.str());
    auto at = [&, line = node.source().begin.line](const std::string& what) {
      return BadConsumer(origin, line, c.name, k + ": " + what);
    };
    if (k == "name" || k == "target" || k == "payments_tenant") continue;
    if (k == "source") {
      auto text = node.value<std::string>();
      if (!text || (*text != "redis" && *text != "rabbitmq")) {
        return at("must be \"redis\" (a Redis stream) or \"rabbitmq\" (a RabbitMQ queue)");
      }
      c.source = *text;
    } else if (k == "url") {
      auto text = node.value<std::string>();
      if (!text || (text->rfind("redis://", 0) != 0 && text->rfind("amqp://", 0) != 0) ||
          text->size() > 1024) {
        return at(
            "must be redis://[[user]:password@]host[:port][/database] or "
            "amqp://user:password@host[:port]/vhost");
      }
      c.url = *text;
    } else if (k == "stream" || k == "queue" || k == "group" || k == "body_field" ||
               k == "dead_letter") {
      auto text = node.value<std::string>();
      // "" names no stream (a RabbitMQ source's, as printed) or no queue (a Redis source's).
      const bool unset = text && text->empty() && (k == "stream" || k == "queue");
      if (!text || (text->empty() && !unset) || text->size() > kMaxStreamNameLength ||
          !NameChars(*text, true)) {
        return at("must be 1.." + std::to_string(kMaxStreamNameLength) +
                  " characters of A-Z a-z 0-9 . _ - :");
      }
      (k == "stream"       ? c.stream
       : k == "queue"      ? c.queue
       : k == "group"      ? c.group
       : k == "body_field" ? c.body_field
                           : c.dead_letter) = *text;
      dead_letter_set = dead_letter_set || k == "dead_letter";
    } else if (k == "header_fields") {
      const toml::array* array = node.as_array();
      if (array == nullptr || array->size() > kMaxRouteListEntries) {
        return at("must be an array of at most " + std::to_string(kMaxRouteListEntries) +
                  " field names");
      }
      for (const toml::node& n : *array) {
        std::string field = http::ToLower(n.value<std::string>().value_or(""));
        const bool ok = !field.empty() && field.size() <= 64 &&
                        std::all_of(field.begin(), field.end(), [](unsigned char ch) {
                          return std::isalnum(ch) != 0 || ch == '-' || ch == '_';
                        });
        if (!ok) return at("must hold header names of at most 64 letters, digits, - and _");
        if (IsUnforwardableHeader(field) || field == "content-type") {
          return at("'" + field + "' is never forwarded from a message");
        }
        c.header_fields.push_back(std::move(field));
      }
    } else if (k == "key") {
      auto text = node.value<std::string>();
      const std::string rule = text.value_or("");
      if (rule == "id") {
        c.key_source = KeySource::kBrokerId;
        c.key_name.clear();
      } else if (rule.rfind("field:", 0) == 0 && rule.size() > 6 && rule.size() <= 261 &&
                 NameChars(rule.substr(6), true)) {
        c.key_source = KeySource::kField;
        c.key_name = rule.substr(6);
      } else if (rule.rfind("json:/", 0) == 0 && rule.size() <= 261) {
        c.key_source = KeySource::kJson;
        c.key_name = rule.substr(5);
      } else {
        return at(
            "must be \"field:NAME\" (a field of the message), \"json:/pointer\" (a member of "
            "its JSON body) or \"id\" (the broker's id)");
      }
    } else if (k == "max_attempts" || k == "concurrency" || k == "redeliver_after_ms") {
      auto value = node.value<int64_t>();
      const int64_t min = k == "redeliver_after_ms" ? 100 : 1;
      const int64_t max = k == "max_attempts"  ? kMaxConsumerAttempts
                          : k == "concurrency" ? kMaxConsumerConcurrency
                                               : 86'400'000;
      if (!node.is_integer() || !value || *value < min || *value > max) {
        return at("must be an integer " + std::to_string(min) + ".." + std::to_string(max));
      }
      if (k == "max_attempts") {
        c.max_attempts = static_cast<int>(*value);
      } else if (k == "concurrency") {
        c.concurrency = static_cast<int>(*value);
      } else {
        c.redeliver_after = Millis(*value);
      }
    } else {
      return at("unknown key");
    }
  }
  const std::string scheme = c.IsRabbitMq() ? "amqp://" : "redis://";
  if (c.url.rfind(scheme, 0) != 0) {
    return bad(c.IsRabbitMq() ? "needs url = \"amqp://user:password@host:port/vhost\""
                              : "needs url = \"redis://host:port\"");
  }
  if (c.IsRabbitMq() ? !c.stream.empty() : !c.queue.empty()) {
    return bad(c.IsRabbitMq() ? "stream is a Redis source's; a RabbitMQ source names its queue"
                              : "queue is a RabbitMQ source's; a Redis source names its stream");
  }
  if (c.Source().empty()) {
    return bad(c.IsRabbitMq() ? "needs queue = \"NAME\"" : "needs stream = \"NAME\"");
  }
  if (!dead_letter_set) c.dead_letter = c.Source() + ".dead";
  if (c.dead_letter == c.Source()) {
    return bad("dead_letter must be another " + std::string(c.IsRabbitMq() ? "queue" : "stream") +
               " than the consumer's");
  }
  if (c.key_source == KeySource::kField && c.key_name == c.body_field) {
    return bad("key names the body_field: the key must be a field of its own");
  }
  return c;
}

toml::array Strings(const std::vector<std::string>& values) {
  toml::array out;
  for (const std::string& v : values) out.push_back(v);
  return out;
}

}  // namespace

Status CheckConsumerTiming(const ConsumerRoute& c, const std::string& origin) {
  auto bad = [&](const std::string& what) { return BadConsumer(origin, c.line, c.name, what); };
  // A payments target runs under the payments' lease and retention.
  const std::string lease = c.IsPayments() ? "idempotency.lease_ms" : "target.lease_ms";
  const std::string retention = c.IsPayments() ? "idempotency.retention_ms" : "target.retention_ms";
  if (c.redeliver_after <= c.target.lease) {
    return bad("redeliver_after_ms (" + std::to_string(c.redeliver_after.count()) +
               ") must be longer than " + lease + " (" + std::to_string(c.target.lease.count()) +
               "): a message is never taken from a consumer whose lease still runs");
  }
  if (c.target.retention < c.RedeliveryHorizon()) {
    return bad(retention + " (" + std::to_string(c.target.retention.count()) +
               ") is shorter than the redelivery horizon, max_attempts x (redeliver_after_ms + " +
               lease + ") = " + std::to_string(c.RedeliveryHorizon().count()) +
               " ms: a message delivered again after its record expired would execute again. "
               "Raise " +
               retention + ", or lower max_attempts or redeliver_after_ms");
  }
  return Ok();
}

Status ReadConsumers(const toml::table& t, const std::string& origin,
                     std::vector<ConsumerRoute>& out) {
  const toml::node* node = t.get("consumers");
  if (node == nullptr) return Ok();
  const toml::array* consumers = node->as_array();
  if (consumers == nullptr || consumers->size() > kMaxConsumers) {
    return MakeError(Errc::kInvalidArgument,
                     origin + ": consumers must be [[consumers]] tables, at most " +
                         std::to_string(kMaxConsumers));
  }
  for (const toml::node& n : *consumers) {
    const toml::table* table = n.as_table();
    if (table == nullptr) {
      return MakeError(Errc::kInvalidArgument, origin + ": [[consumers]] entries must be tables");
    }
    IDEM_ASSIGN_OR_RETURN(ConsumerRoute consumer, ReadConsumer(*table, origin));
    for (const ConsumerRoute& before : out) {
      if (before.name == consumer.name) {
        return BadConsumer(origin, consumer.line, consumer.name,
                           "name already used at line " + std::to_string(before.line));
      }
    }
    out.push_back(std::move(consumer));
  }
  return Ok();
}

toml::table ConsumerTable(const ConsumerRoute& c) {
  toml::table out{
      {"name", c.name},
      {"source", c.source},
      {"url", RedactedUrl(c.url)},
      {"stream", c.stream},
      {"queue", c.queue},
      {"group", c.group},
      {"body_field", c.body_field},
      {"header_fields", Strings(c.header_fields)},
      {"key", KeyRule(c)},
      {"dead_letter", c.dead_letter},
      {"max_attempts", int64_t{c.max_attempts}},
      {"redeliver_after_ms", int64_t{c.redeliver_after.count()}},
      {"concurrency", int64_t{c.concurrency}},
      {"payments_tenant", c.payments_tenant},
      {"target", TargetTable(c.target)},
  };
  // A payments target has no table of its own: payments_tenant names it.
  if (c.IsPayments()) out.erase("target");
  return out;
}

}  // namespace idem::idemd
