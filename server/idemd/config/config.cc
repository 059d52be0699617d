// server/idemd/config/config.cc — LoadConfig: the file, the IDEMD_* environment over it, the flags
// over both, the keys read by their table (keys.cc), the bounds between keys, then the secrets.
#include "server/idemd/config/config.h"

#include <sched.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <utility>

#include "http/log.h"
#include "server/idemd/config/keys.h"
#include "server/idemd/consumers/consumer_config.h"
#include "server/idemd/gateway/route_config.h"

namespace idem::idemd {
namespace {

Error Bad(const std::string& origin, const std::string& what) {
  return MakeError(Errc::kInvalidArgument, origin + ": " + what);
}

Result<std::vector<Secret>> ReadSecretArray(const toml::table& t, const char* name,
                                            const std::string& origin) {
  std::vector<Secret> out;
  const toml::array* array = t[name].as_array();
  if (array == nullptr) return Bad(origin, std::string("missing [[") + name + "]] entries");
  for (const toml::node& entry : *array) {
    const toml::table* e = entry.as_table();
    if (e == nullptr) return Bad(origin, std::string(name) + " entries must be tables");
    auto id = (*e)["id"].value<int64_t>();
    auto key = (*e)["key"].value<std::string>();
    if (!id || !key || *id < 0 || *id > 0xffffffffLL) {
      return Bad(origin, std::string(name) + " entries need an id and a hex key");
    }
    auto bytes = DecodeHex(*key);
    if (!bytes) return Bad(origin, std::string(name) + " key " + std::to_string(*id) + ": not hex");
    out.push_back(Secret{static_cast<uint32_t>(*id), std::move(*bytes)});
  }
  return out;
}

// toml++ reports errors by exception or by value depending on how it was built; either way
// they become a Result here.
Result<toml::table> ParseToml(std::string_view text, const std::string& origin, bool is_file) {
#if TOML_EXCEPTIONS
  try {
    return is_file ? toml::parse_file(origin) : toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    return Bad(origin, std::string(e.description()) + " at " + where.str());
  }
#else
  toml::parse_result parsed = is_file ? toml::parse_file(origin) : toml::parse(text, origin);
  if (!parsed) {
    std::ostringstream where;
    where << parsed.error().source().begin;
    return Bad(origin, std::string(parsed.error().description()) + " at " + where.str());
  }
  return std::move(parsed).table();
#endif
}

}  // namespace

Result<Secrets> ParseSecrets(std::string_view toml_text, const std::string& origin) {
  IDEM_ASSIGN_OR_RETURN(const toml::table t, ParseToml(toml_text, origin, false));
  Secrets s;
  auto hmac_current = t["hmac_current"].value<int64_t>();
  auto seal_current = t["seal_current"].value<int64_t>();
  if (!hmac_current || !seal_current)
    return Bad(origin, "hmac_current and seal_current are required");
  s.hmac_current = static_cast<uint32_t>(*hmac_current);
  s.seal_current = static_cast<uint32_t>(*seal_current);
  IDEM_ASSIGN_OR_RETURN(s.hmac, ReadSecretArray(t, "hmac", origin));
  IDEM_ASSIGN_OR_RETURN(s.seal, ReadSecretArray(t, "seal", origin));
  if (auto st = ValidateSecrets(s.hmac, s.hmac_current, 32, 0); !st)
    return Bad(origin, "hmac: " + st.error().message);
  if (auto st = ValidateSecrets(s.seal, s.seal_current, 32, 32); !st)
    return Bad(origin, "seal: " + st.error().message);
  return s;
}

std::string GenerateSecretsToml(Random& random) {
  auto fresh = [&] {
    std::array<uint8_t, 32> bytes;
    random.Fill(bytes);
    return ToHex(bytes);
  };
  return "# Development secrets for idemd, generated once. Never commit this file.\n"
         "hmac_current = 1\nseal_current = 1\n\n[[hmac]]\nid = 1\nkey = \"" +
         fresh() + "\"\n\n[[seal]]\nid = 1\nkey = \"" + fresh() + "\"\n";
}

int IoThreadsPerCpu() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0) {
    return std::min(CPU_COUNT(&allowed), kIoThreadsCeiling);
  }
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kIoThreadsCeiling);
}

Millis LongestTimeout(const Config& config) {
  Millis longest = std::max({config.provider.timeout, config.idempotency.wait_max,
                             config.store.timeouts.statement, config.store.timeouts.lock,
                             config.gateway.unmatched_timeout});
  for (const GatewayRoute& route : config.gateway.routes)
    longest = std::max(longest, route.timeout);
  for (const ConsumerRoute& consumer : config.consumers)
    longest = std::max(longest, consumer.target.timeout);
  return longest;
}

namespace {

// Every key of the file must be one LoadConfig reads (ConfigKeys): a misspelt key would
// otherwise leave its setting at the default without a word. [[routes]] entries are checked by
// their reader, which names the route.
Status CheckKnownKeys(const toml::table& t, const std::string& origin) {
  const std::map<std::string, Kind>& known = ConfigKeys();
  auto unknown = [&](const std::string& name, const toml::node& n) {
    // A key of an earlier version says what replaced it.
    const std::string replaced =
        name == "provider.5xx_means_nothing_charged"
            ? " (replaced by provider.nothing_charged_statuses: the 5xx statuses the provider "
              "documents as \"nothing was charged\", e.g. [503]; docs/config.md)"
            : "";
    return Bad(origin + ":" + std::to_string(n.source().begin.line),
               "unknown key " + name + replaced);
  };
  auto check_table = [&](const toml::table& table, const std::string& prefix) -> Status {
    for (const auto& [key, node] : table) {
      const std::string name = prefix + "." + std::string(key.str());
      if (!known.contains(name)) return unknown(name, node);
    }
    return Ok();
  };
  for (const auto& [key, node] : t) {
    const std::string section(key.str());
    if (section == "routes" || section == "consumers") continue;  // their readers check them
    const auto first = known.lower_bound(section + ".");
    if (first == known.end() || first->first.rfind(section + ".", 0) != 0) {
      return unknown(section, node);
    }
    if (const toml::table* table = node.as_table()) {
      IDEM_RETURN_IF_ERROR(check_table(*table, section));
    } else if (const toml::array* array = node.as_array()) {
      for (const toml::node& entry : *array) {
        if (const toml::table* element = entry.as_table()) {
          IDEM_RETURN_IF_ERROR(check_table(*element, section));
        }
      }
    } else {
      return Bad(origin + ":" + std::to_string(node.source().begin.line),
                 section + " must be a table");
    }
  }
  return Ok();
}

// IDEMD_<SECTION>_<KEY> (upper case) sets section.key over the file, typed as the key is: an
// integer, true/false, a string as it is, or a list separated by commas. Keys of [[principals]]
// and [[routes]] entries have none. An IDEMD_ variable that names no key is an error. `from_env`
// gets "section.key" → the variable, for each key set.
Status ApplyEnvironment(toml::table& t, std::map<std::string, std::string>& from_env) {
  std::map<std::string, std::pair<std::string, Kind>> by_variable;
  for (const ConfigKey& key : ConfigKeyTable()) {
    const std::string name = key.Name();
    std::string variable = "IDEMD_" + name;
    for (char& ch : variable) {
      ch = ch == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    }
    by_variable[variable] = {name, key.kind};
  }
  for (char** env = environ; *env != nullptr; ++env) {
    const std::string_view entry(*env);
    if (entry.rfind("IDEMD_", 0) != 0) continue;
    const std::size_t eq = entry.find('=');
    const std::string variable(entry.substr(0, eq));
    const std::string value(eq == std::string_view::npos ? "" : entry.substr(eq + 1));
    auto it = by_variable.find(variable);
    if (it == by_variable.end()) {
      return Bad("environment", variable + " names no configuration key (docs/config.md)");
    }
    if (value.empty()) continue;  // as if unset: an empty template line changes nothing
    const std::string& name = it->second.first;
    const std::size_t dot = name.find('.');
    const std::string section = name.substr(0, dot);
    if (!t.contains(section)) t.insert(section, toml::table{});
    toml::table* table = t[section].as_table();
    if (table == nullptr) return Bad("environment", variable + ": " + section + " is not a table");
    const std::string key = name.substr(dot + 1);
    from_env[name] = variable;
    switch (it->second.second) {
      case Kind::kString:
        table->insert_or_assign(key, value);
        break;
      case Kind::kBoolean:
        if (value != "true" && value != "false") {
          return Bad("environment", variable + " must be true or false");
        }
        table->insert_or_assign(key, value == "true");
        break;
      case Kind::kInteger: {
        int64_t n = 0;
        const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
        if (ec != std::errc() || end != value.data() + value.size()) {
          return Bad("environment", variable + " must be an integer");
        }
        table->insert_or_assign(key, n);
        break;
      }
      case Kind::kArray: {
        toml::array list;
        std::string_view rest(value);
        while (!rest.empty()) {
          const std::size_t comma = rest.find(',');
          std::string_view element = rest.substr(0, comma);
          while (!element.empty() && element.front() == ' ') element.remove_prefix(1);
          while (!element.empty() && element.back() == ' ') element.remove_suffix(1);
          list.push_back(std::string(element));
          rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
        }
        table->insert_or_assign(key, std::move(list));
        break;
      }
    }
  }
  return Ok();
}

// The principals, each with a tenant, a user and the SHA-256 of its API key (lower-case hex).
Status ReadPrincipals(const toml::table& t, const std::string& origin,
                      std::vector<PrincipalEntry>& out) {
  const toml::array* principals = t["principals"].as_array();
  if (principals == nullptr) return Ok();
  for (const toml::node& n : *principals) {
    const toml::table* p = n.as_table();
    if (p == nullptr) return Bad(origin, "[[principals]] entries must be tables");
    PrincipalEntry e;
    e.api_key_sha256 = (*p)["api_key_sha256"].value_or(std::string());
    e.tenant = (*p)["tenant"].value_or(std::string());
    e.user = (*p)["user"].value_or(std::string());
    if (e.api_key_sha256.size() != 64 || !DecodeHex(e.api_key_sha256) || e.tenant.empty() ||
        e.user.empty()) {
      return Bad(origin, "each [[principals]] needs api_key_sha256 (64 hex), tenant and user");
    }
    for (char& ch : e.api_key_sha256) ch = static_cast<char>(std::tolower(ch));
    out.push_back(std::move(e));
  }
  return Ok();
}

// --listen, --store, --redis and --provider, each with its value, over the file.
Status ApplyFlags(const std::vector<std::string>& overrides, Config& c) {
  for (std::size_t i = 0; i < overrides.size(); ++i) {
    const std::string& flag = overrides[i];
    if (i + 1 >= overrides.size()) return Bad("command line", flag + " needs a value");
    const std::string& value = overrides[++i];
    if (flag == "--listen") {
      auto address = http::ParseListenAddress(value);
      if (!address) return Bad("--listen", address.error().message);
      c.server.host = address->host;
      c.server.port = address->port;
    } else if (flag == "--store") {
      c.store.url = value;
    } else if (flag == "--redis") {
      c.redis.url = value;
    } else if (flag == "--provider") {
      c.provider.url = value;
    } else {
      return Bad("command line", "unknown flag " + flag);
    }
  }
  return Ok();
}

// The bounds that hold between keys (each key's own are the table's, ReadConfigKeys).
Status CheckBetweenKeys(const Config& c, const std::string& o) {
  const IdempotencyConfig& idempotency = c.idempotency;
  const ProviderConfig& provider = c.provider;
  if (c.reconciliation.interval.count() > 0 && c.reconciliation.window.count() == 0) {
    return Bad(o, "reconciliation.window_ms must be positive when interval_ms is");
  }
  if (c.outbox.broker != "off") {
    if (c.outbox.url.empty())
      return Bad(o, "outbox.broker = \"" + c.outbox.broker + "\" needs outbox.url");
    if (c.outbox.broker == "redis" && c.outbox.stream.empty()) {
      return Bad(o, "outbox.broker = \"redis\" needs outbox.stream");
    }
    if (c.outbox.broker == "rabbitmq" && c.outbox.exchange.empty()) {
      return Bad(o, "outbox.broker = \"rabbitmq\" needs outbox.exchange");
    }
  }
  if (c.gateway.forward_unmatched && c.gateway.unmatched_upstream.empty()) {
    return Bad(o, "gateway.unmatched = \"forward\" needs gateway.upstream");
  }
  for (const GatewayRoute& r : c.gateway.routes) {
    if (r.lease <= r.timeout + idempotency.lease_margin) {
      // As for charges: a request is forwarded only under a lease that covers the whole exchange
      // (AdvanceBeforeCall), so a shorter one would refuse every forward (503).
      return BadRoute(o, r.line, r.name,
                      "lease_ms (" + std::to_string(r.lease.count()) +
                          ") must be longer than timeout_ms (" + std::to_string(r.timeout.count()) +
                          ") + idempotency.lease_margin_ms (" +
                          std::to_string(idempotency.lease_margin.count()) +
                          "): a request is forwarded only under a lease that covers the exchange");
    }
  }
  for (const ConsumerRoute& consumer : c.consumers) {
    IDEM_RETURN_IF_ERROR(CheckConsumerTiming(consumer, o));
    const GatewayRoute& r = consumer.target;
    // A payments target's lease is idempotency.lease_ms, checked against the provider's timeout.
    if (!consumer.IsPayments() && r.lease <= r.timeout + idempotency.lease_margin) {
      return Bad(o + ":" + std::to_string(consumer.line),
                 "[[consumers]] " + consumer.name + ": target.lease_ms (" +
                     std::to_string(r.lease.count()) + ") must be longer than target.timeout_ms (" +
                     std::to_string(r.timeout.count()) + ") + idempotency.lease_margin_ms (" +
                     std::to_string(idempotency.lease_margin.count()) +
                     "): a message is forwarded only under a lease that covers the exchange");
    }
    if (consumer.concurrency > idempotency.max_processing) {
      return Bad(o + ":" + std::to_string(consumer.line),
                 "[[consumers]] " + consumer.name + ": concurrency (" +
                     std::to_string(consumer.concurrency) +
                     ") is more than idempotency.max_processing (" +
                     std::to_string(idempotency.max_processing) +
                     "): the consumer's own records would refuse each other");
    }
  }
  if (!c.store.listen_url.empty() && !c.store.notifications) {
    return Bad(o, "store.listen_url has no use with store.notifications = false: nothing listens");
  }
  if (!c.store.listen_url.empty()) {
    auto postgres = [](const std::string& url) {
      return url.rfind("postgresql://", 0) == 0 || url.rfind("postgres://", 0) == 0;
    };
    if (!postgres(c.store.url) || !postgres(c.store.listen_url)) {
      return Bad(o,
                 "store.listen_url is for a PostgreSQL store: both it and store.url must be "
                 "postgresql:// URLs");
    }
  }
  if (idempotency.key_max_length < idempotency.key_min_length) {
    return Bad(o, "idempotency key lengths must satisfy 1 <= min <= max <= 255");
  }
  if (idempotency.retention <= idempotency.lease) {
    return Bad(o, "lease must be positive and shorter than retention");
  }
  if (auto bounds = ValidatePostgresTimeouts(c.store.timeouts); !bounds) {
    return Bad(o, "[store] " + bounds.error().message);
  }
  if (idempotency.lease <= provider.timeout + idempotency.lease_margin) {
    // A charge is sent only under a lease that outlasts the whole call; a shorter lease could be
    // taken over while the charge is out, and with a provider that ignores keys, charge twice.
    return Bad(o, "idempotency.lease_ms (" + std::to_string(idempotency.lease.count()) +
                      ") must be longer than provider.timeout_ms (" +
                      std::to_string(provider.timeout.count()) +
                      ") + idempotency.lease_margin_ms (" +
                      std::to_string(idempotency.lease_margin.count()) +
                      "): a charge is sent only under a lease that covers the whole call");
  }
  if (!provider.deduplicates_by_key &&
      provider.settle <= idempotency.lease_margin + provider.timeout) {
    // Counted from sent_at: a charge leaves up to the margin after it (Payments::Execute) and
    // may be out for the whole timeout; a shorter window ends while the call may still be out.
    return Bad(o, "provider.settle_ms (" + std::to_string(provider.settle.count()) +
                      ") must be longer than idempotency.lease_margin_ms (" +
                      std::to_string(idempotency.lease_margin.count()) +
                      ") + provider.timeout_ms (" + std::to_string(provider.timeout.count()) +
                      ") unless provider.deduplicates_by_key is true");
  }
  return Ok();
}

}  // namespace

Result<Config> LoadConfig(const std::string& path, const std::vector<std::string>& overrides) {
  Config c;
  IDEM_ASSIGN_OR_RETURN(toml::table t, ParseToml({}, path, true));
  const std::string& o = path;
  IDEM_RETURN_IF_ERROR(CheckKnownKeys(t, o));
  std::map<std::string, std::string> from_env;
  IDEM_RETURN_IF_ERROR(ApplyEnvironment(t, from_env));
  IDEM_RETURN_IF_ERROR(ReadConfigKeys(t, o, from_env, c));
  IDEM_RETURN_IF_ERROR(ReadPrincipals(t, o, c.principals));
  IDEM_RETURN_IF_ERROR(ReadGatewayRoutes(t, o, c.gateway.routes));
  IDEM_RETURN_IF_ERROR(ReadConsumers(t, o, c.consumers));
  IDEM_RETURN_IF_ERROR(ApplyFlags(overrides, c));
  if (c.store.url.empty()) c.store.url = kDefaultStoreUrl;
  for (ConsumerRoute& consumer : c.consumers) {
    if (!consumer.IsPayments()) continue;
    // Each message a payment: under the payments route's lease and retention, its call the
    // provider's.
    consumer.target.lease = c.idempotency.lease;
    consumer.target.retention = c.idempotency.retention;
    consumer.target.timeout = c.provider.timeout;
  }
  IDEM_RETURN_IF_ERROR(CheckBetweenKeys(c, o));
  if (c.server.io_threads == 0) c.server.io_threads = IoThreadsPerCpu();

  // Secrets: environment first, then the file (generated for development when asked to).
  SecretsConfig& secrets = c.secrets;
  if (const char* env = std::getenv("IDEM_SECRETS"); env != nullptr && *env != '\0') {
    IDEM_ASSIGN_OR_RETURN(secrets.keys, ParseSecrets(env, "IDEM_SECRETS"));
  } else {
    if (secrets.file.empty()) return Bad(o, "no secrets: set IDEM_SECRETS or secrets.file");
    std::filesystem::path file = secrets.file;
    if (!std::filesystem::exists(file)) {
      if (!secrets.generate_if_missing) {
        return Bad(o, "secrets file " + secrets.file + " does not exist");
      }
      std::error_code ec;
      if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
      std::ofstream out(file);
      out << GenerateSecretsToml(SystemRandom());
      out.close();
      if (!out) return Bad(o, "cannot write secrets file " + secrets.file);
      ::chmod(file.c_str(), 0600);
    }
    std::ifstream in(file);
    std::stringstream text;
    text << in.rdbuf();
    IDEM_ASSIGN_OR_RETURN(secrets.keys, ParseSecrets(text.str(), secrets.file));
  }
  return c;
}

}  // namespace idem::idemd
