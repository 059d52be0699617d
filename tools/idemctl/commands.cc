// tools/idemctl/commands.cc — idemctl's commands: pay through the retrying client, read payments
// and operations, inspect records straight from the store, sweep, reconcile, and manage secrets
// and keys. Each prints its result as text or as JSON (one value on one line).
#include "tools/idemctl/commands.h"

#include <boost/json.hpp>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "client/client.h"
#include "idem/engine.h"
#include "idem/key.h"
#include "idem/outbox.h"
#include "server/idemd/config/config.h"
#include "server/idemd/config/store_url.h"
#include "server/idemd/consumers/rabbitmq.h"
#include "server/idemd/consumers/redis_stream.h"
#include "server/idemd/outbox/relay.h"
#include "server/idemd/payments/books.h"
#include "server/idemd/payments/events.h"
#include "server/idemd/payments/table.h"

namespace idem::ctl {
namespace {

namespace json = boost::json;

int Fail(const std::string& what) {
  std::cerr << "idemctl: " << what << "\n";
  return kExitFailed;
}

void PrintJson(const json::value& value) { std::cout << json::serialize(value) << "\n"; }

Result<client::Client> MakeClient(const ServerOptions& server) {
  // main.cc requires the key (from --api-key or IDEM_API_KEY); this guards other callers.
  if (server.api_key.empty()) {
    return MakeError(Errc::kInvalidArgument, "no API key: pass --api-key or set IDEM_API_KEY");
  }
  client::ClientOptions options;
  options.base_url = server.url;
  options.api_key = server.api_key;
  return client::Client::Create(options);
}

// A body as JSON: the parsed value when it is JSON (idemd's bodies are), else the text.
json::value BodyJson(const std::string& body) {
  boost::system::error_code ec;
  json::value parsed = json::parse(body, ec);
  if (ec) return json::string(body);
  return parsed;
}

// Header fields as an object; a name that repeats gets its values joined with ", " (RFC 9110
// §5.3).
json::object HeadersJson(const std::vector<std::pair<std::string, std::string>>& fields) {
  json::object out;
  for (const auto& [name, value] : fields) {
    if (json::value* seen = out.if_contains(name)) {
      seen->as_string().append(", ");
      seen->as_string().append(value);
    } else {
      out[name] = value;
    }
  }
  return out;
}

json::object ResponseJson(int status,
                          const std::vector<std::pair<std::string, std::string>>& headers,
                          const std::string& body) {
  return {{"status", status}, {"headers", HeadersJson(headers)}, {"body", BodyJson(body)}};
}

void PrintResponseText(int status, const std::vector<std::pair<std::string, std::string>>& headers,
                       const std::string& body) {
  std::cout << "HTTP " << status << "\n";
  for (const auto& [name, value] : headers) std::cout << name << ": " << value << "\n";
  std::cout << "\n" << body << "\n";
}

int GetPath(const ServerOptions& server, const std::string& path, Output output) {
  auto c = MakeClient(server);
  if (!c) return Fail(c.error().message);
  auto r = c->Get(path);
  if (!r) return Fail(r.error().message);
  if (output == Output::kJson) {
    PrintJson(ResponseJson(r->status, r->headers.fields, r->body));
  } else {
    PrintResponseText(r->status, r->headers.fields, r->body);
  }
  return r->status < 400 ? kExitDone : kExitIdemdError;
}

struct Opened {
  idemd::Config config;
  std::unique_ptr<Store> store;
};

// The store of an idemd config, opened without migrations: idemd owns the schema (it creates and
// upgrades it under its own lock), so idemctl never creates a store nor migrates one under
// running servers, and needs none of the routes' migrations. Sweeping deletes from the records
// table, which every schema version has.
Result<Opened> OpenFromConfig(const std::string& config_path) {
  Opened o;
  IDEM_ASSIGN_OR_RETURN(o.config, idemd::LoadConfig(config_path, {}));
  idemd::StoreUrlOptions options;
  options.pool_size = 1;
  options.prepared_statements = o.config.store.prepared_statements;
  options.postgres_timeouts = o.config.store.timeouts;
  options.apply_migrations = false;
  IDEM_ASSIGN_OR_RETURN(o.store, idemd::OpenStoreUrl(o.config.store.url, options));
  return o;
}

std::string When(Timestamp t) { return http::Rfc3339(ToUnixMillis(t)); }

void PrintRecordText(const FoundRecord& found, bool show_response) {
  const Record& r = found.record;
  std::cout << "scope_hash      " << ToHex(r.scope) << "\n"
            << "tenant/user     " << r.tenant << "/" << r.user << "\n"
            << "route           " << r.route << "\n"
            << "state           " << RecordStateName(r.state) << "\n"
            << "recovery_point  " << r.recovery_point << "\n"
            << "resource_id     " << r.resource_id << "\n"
            << "status_code     " << r.status_code << "\n"
            << "fence           " << r.lease.fence << "\n"
            << "lease_until     " << When(r.lease.until) << "\n"
            << "created_at      " << When(r.created_at) << "\n"
            << "updated_at      " << When(r.updated_at) << "\n"
            << "expires_at      " << When(r.expires_at) << (found.expired ? " (expired)" : "")
            << "\n"
            << "fingerprint     rules v" << r.fingerprint.rules_version << ", secret "
            << r.fingerprint.secret_id << "\n"
            << "response        "
            << (r.response.empty() ? "none" : std::to_string(r.response.size()) + " sealed bytes")
            << "\n";
  if (show_response && found.response) {
    std::cout << "\n";
    PrintResponseText(found.response->status, found.response->headers, found.response->body);
  }
}

// The same fields as the text, by the same names; "response" only with --show-response and a
// stored answer that could be opened.
json::object RecordJson(const FoundRecord& found, bool show_response) {
  const Record& r = found.record;
  json::object out{
      {"scope_hash", ToHex(r.scope)},
      {"tenant", r.tenant},
      {"user", r.user},
      {"route", r.route},
      {"state", RecordStateName(r.state)},
      {"recovery_point", r.recovery_point},
      {"resource_id", r.resource_id},
      {"status_code", r.status_code},
      {"fence", r.lease.fence},
      {"lease_until", When(r.lease.until)},
      {"created_at", When(r.created_at)},
      {"updated_at", When(r.updated_at)},
      {"expires_at", When(r.expires_at)},
      {"expired", found.expired},
      {"fingerprint",
       {{"rules_version", r.fingerprint.rules_version}, {"secret_id", r.fingerprint.secret_id}}},
      {"sealed_response_bytes", r.response.size()},
  };
  if (show_response && found.response) {
    out["response"] =
        ResponseJson(found.response->status, found.response->headers, found.response->body);
  }
  return out;
}

idemd::Reconciliation MakeReconciliation(const Opened& o, idemd::Provider& provider) {
  return idemd::Reconciliation(*o.store, provider, SystemClock(), SystemRandom(), nullptr,
                               {.refund_duplicates = o.config.reconciliation.refund_duplicates,
                                .refund_orphans = o.config.reconciliation.refund_orphans,
                                .orphan_grace = o.config.reconciliation.orphan_grace,
                                .lease = o.config.reconciliation.lease,
                                .instance = "idemctl@" + idemd::InstanceName()});
}

void PrintFindings(const std::vector<idemd::Finding>& findings) {
  std::printf("%-10s  %-22s  %-28s  %12s  %-3s  %-14s  %-22s  %s\n", "CLASS", "CHARGE", "PAYMENT",
              "AMOUNT", "CUR", "ACTION", "REFUND", "DETAIL");
  for (const idemd::Finding& f : findings) {
    std::printf("%-10s  %-22s  %-28s  %12s  %-3s  %-14s  %-22s  %s\n", f.finding_class.c_str(),
                f.charge_id.c_str(), f.payment_id.c_str(), f.amount.c_str(), f.currency.c_str(),
                f.action.c_str(), f.refund_id.c_str(), f.detail.c_str());
  }
}

// The reconciliation of the config's store and provider. Errors: the config's, the store's, a
// bad provider URL.
struct Books {
  Opened opened;
  std::unique_ptr<idemd::Provider> provider;
};
Result<Books> OpenBooks(const std::string& config_path) {
  Books b;
  IDEM_ASSIGN_OR_RETURN(b.opened, OpenFromConfig(config_path));
  IDEM_ASSIGN_OR_RETURN(b.provider, idemd::MakeHttpProvider(b.opened.config.provider));
  return b;
}

}  // namespace

int Pay(const PayOptions& options) {
  auto c = MakeClient(options.server);
  if (!c) return Fail(c.error().message);
  const std::string body = json::serialize(json::object{{"merchant_order_no", options.order},
                                                        {"amount", options.amount},
                                                        {"currency", options.currency}});
  std::vector<std::pair<std::string, std::string>> headers;
  if (options.async) headers.emplace_back("Prefer", "respond-async");
  auto outcome = c->Post("/v1/payments", body, options.key, headers);
  if (!outcome) return Fail(outcome.error().message);
  std::cerr << "Idempotency-Key: " << outcome->key << " (" << outcome->attempts << " attempt"
            << (outcome->attempts == 1 ? "" : "s") << ")\n";
  const client::Response& r = outcome->response;
  if (options.output == Output::kJson) {
    json::object out = ResponseJson(r.status, r.headers.fields, r.body);
    out["idempotency_key"] = outcome->key;
    out["attempts"] = outcome->attempts;
    PrintJson(out);
  } else {
    PrintResponseText(r.status, r.headers.fields, r.body);
  }
  return r.status < 400 ? kExitDone : kExitIdemdError;
}

int PaymentGet(const GetOptions& options) {
  return GetPath(options.server, "/v1/payments/" + options.id, options.output);
}

int OperationGet(const GetOptions& options) {
  return GetPath(options.server, "/v1/operations/" + options.id, options.output);
}

namespace {

// A config's store with an engine over it, keyed with the config's secrets (to open and seal
// stored answers).
struct WithEngine {
  Opened opened;
  std::unique_ptr<Fingerprinter> fingerprinter;
  std::unique_ptr<Sealer> sealer;
  std::unique_ptr<Engine> engine;
};

Result<WithEngine> OpenEngine(const std::string& config_path) {
  WithEngine w;
  IDEM_ASSIGN_OR_RETURN(w.opened, OpenFromConfig(config_path));
  const idemd::Secrets& secrets = w.opened.config.secrets.keys;
  IDEM_ASSIGN_OR_RETURN(w.fingerprinter, Fingerprinter::Create(secrets.hmac, secrets.hmac_current));
  IDEM_ASSIGN_OR_RETURN(w.sealer,
                        Sealer::Create(secrets.seal, secrets.seal_current, SystemRandom()));
  w.engine = std::make_unique<Engine>(*w.opened.store, *w.fingerprinter, *w.sealer, SystemClock());
  return w;
}

// The record of (tenant, user, route, key); nullopt after saying there is none (kExitNoRecord).
Result<std::optional<FoundRecord>> LookupRecord(Engine& engine, const std::string& tenant,
                                                const std::string& user, const std::string& route,
                                                const std::string& key, Output output) {
  RoutePolicy policy;
  policy.route = route;
  IDEM_ASSIGN_OR_RETURN(std::optional<FoundRecord> found,
                        engine.Lookup(Principal{tenant, user}, policy, key));
  if (!found) {
    // As JSON, standard output stays empty: the exit status says there is nothing to parse.
    (output == Output::kJson ? std::cerr : std::cout)
        << "no record for " << tenant << "/" << user << " " << route << " " << key << "\n";
  }
  return found;
}

void PrintRecord(const FoundRecord& found, bool show_response, Output output) {
  if (output == Output::kJson) {
    PrintJson(RecordJson(found, show_response));
  } else {
    PrintRecordText(found, show_response);
  }
}

// 64 hex digits into a scope hash.
std::optional<ScopeHash> ParseScopeHex(const std::string& hex) {
  ScopeHash scope{};
  if (hex.size() != 2 * scope.size()) return std::nullopt;
  for (std::size_t i = 0; i < scope.size(); ++i) {
    unsigned int byte = 0;
    const char* begin = hex.data() + 2 * i;
    auto [end, error] = std::from_chars(begin, begin + 2, byte, 16);
    if (error != std::errc() || end != begin + 2) return std::nullopt;
    scope[i] = static_cast<uint8_t>(byte);
  }
  return scope;
}

}  // namespace

int RecordInspect(const InspectOptions& options) {
  auto with = OpenEngine(options.config);
  if (!with) return Fail(with.error().message);
  auto found = LookupRecord(*with->engine, options.tenant, options.user, options.route, options.key,
                            options.output);
  if (!found) return Fail(found.error().message);
  if (!*found) return kExitNoRecord;
  PrintRecord(**found, options.show_response, options.output);
  return kExitDone;
}

int RecordHeld(const HeldOptions& options) {
  auto opened = OpenFromConfig(options.config);
  if (!opened) return Fail(opened.error().message);
  auto held = opened->store->ListHeld(options.route, options.limit);
  if (!held) return Fail(held.error().message);
  if (options.output == Output::kJson) {
    json::array records;
    for (const Record& r : *held) {
      FoundRecord found;
      found.record = r;
      records.push_back(RecordJson(found, false));
    }
    PrintJson(records);
    return kExitDone;
  }
  for (const Record& r : *held) {
    std::cout << ToHex(r.scope) << "  " << r.route << "  " << r.tenant << "/" << r.user
              << "  held since " << When(r.updated_at) << ", until " << When(r.expires_at)
              << (r.resource_id.empty() ? "" : "  id " + r.resource_id) << "\n";
  }
  std::cout << held->size() << " held outcome" << (held->size() == 1 ? "" : "s")
            << (options.route.empty() ? "" : " on " + options.route) << "\n";
  return kExitDone;
}

int RecordSettle(const SettleOptions& options) {
  std::optional<StoredResponse> answer;
  if (options.executed) {
    answer = StoredResponse{options.status, {}, {}};
    if (!options.body_file.empty()) {
      std::ifstream in(options.body_file, std::ios::binary);
      if (!in) return Fail("cannot read " + options.body_file);
      answer->body.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      if (in.bad()) return Fail("cannot read " + options.body_file);
    }
    if (!options.content_type.empty()) {
      answer->headers.emplace_back("Content-Type", options.content_type);
    }
  }
  auto with = OpenEngine(options.config);
  if (!with) return Fail(with.error().message);
  Engine& engine = *with->engine;
  Result<std::optional<FoundRecord>> found = std::optional<FoundRecord>();
  if (!options.scope_hex.empty()) {
    const std::optional<ScopeHash> scope = ParseScopeHex(options.scope_hex);
    if (!scope) return Fail("--scope: not a scope hash (64 hex digits): " + options.scope_hex);
    found = engine.Lookup(*scope);
    if (found && !*found) {
      (options.output == Output::kJson ? std::cerr : std::cout)
          << "no record with scope hash " << options.scope_hex << "\n";
    }
  } else {
    found = LookupRecord(engine, options.tenant, options.user, options.route, options.key,
                         options.output);
  }
  if (!found) return Fail(found.error().message);
  if (!*found) return kExitNoRecord;
  auto settled = engine.Settle((*found)->record.scope, answer);
  if (!settled) {
    const Errc code = settled.error().code;
    if (code == Errc::kNotFound) {
      std::cerr << "idemctl: " << settled.error().message << "\n";
      return kExitNoRecord;
    }
    if (code == Errc::kConflict) {
      std::cerr << "idemctl: " << settled.error().message << "\n";
      return kExitNotHeld;
    }
    return Fail(settled.error().message);
  }
  auto now = engine.Lookup(settled->scope);
  if (!now) return Fail(now.error().message);
  if (!*now) return Fail("the settled record is gone (swept meanwhile)");
  PrintRecord(**now, options.executed, options.output);
  return kExitDone;
}

int Sweep(const SweepOptions& options) {
  auto opened = OpenFromConfig(options.config);
  if (!opened) return Fail(opened.error().message);
  // Everything that has expired, in the sweeper's batches.
  // As idemd's sweeper: a payment's retryable record past the send is left to the reconciler.
  auto swept =
      SweepExpired(*opened->store, idemd::PaymentsSentPoints(), std::numeric_limits<int>::max());
  if (!swept) return Fail(swept.error().message);
  if (options.output == Output::kJson) {
    PrintJson(json::object{{"swept", *swept}});
  } else {
    std::cout << "swept " << *swept << " expired records\n";
  }
  return kExitDone;
}

int Reconcile(const ReconcileOptions& options) {
  auto books = OpenBooks(options.config);
  if (!books) return Fail(books.error().message);
  idemd::Reconciliation reconciliation = MakeReconciliation(books->opened, *books->provider);
  const int64_t until = options.until_ms.value_or(ToUnixMillis(SystemClock().Now()));
  auto ran = reconciliation.Run(options.since_ms, until, options.dry_run);
  if (!ran) return Fail(ran.error().message);
  if (options.output == Output::kJson) {
    PrintJson(idemd::ToJson(*ran));
  } else {
    std::printf("%s %s .. %s: %lld charges, %lld matched, %lld pending; %lld refunded%s\n",
                ran->dry_run ? "dry run" : ("run " + ran->run_id).c_str(),
                http::Rfc3339(ran->since_ms).c_str(), http::Rfc3339(ran->until_ms).c_str(),
                static_cast<long long>(ran->charges), static_cast<long long>(ran->matched),
                static_cast<long long>(ran->pending), static_cast<long long>(ran->refunded),
                ran->resumed ? " (resumed)" : "");
    PrintFindings(ran->findings);
  }
  const bool alarming = ran->by_class.count("missing") > 0 || ran->by_class.count("mismatched") > 0;
  return alarming ? kExitReconcileAlarm : kExitDone;
}

int ReconcileReport(const ReportOptions& options) {
  auto books = OpenBooks(options.config);
  if (!books) return Fail(books.error().message);
  idemd::Reconciliation reconciliation = MakeReconciliation(books->opened, *books->provider);
  auto findings = reconciliation.Report(options.since_ms, options.limit);
  if (!findings) return Fail(findings.error().message);
  if (options.output == Output::kJson) {
    json::array out;
    for (const idemd::Finding& f : *findings) out.push_back(idemd::ToJson(f));
    PrintJson(out);
  } else {
    PrintFindings(*findings);
  }
  return kExitDone;
}

namespace {

// The dead-letter box of `options.consumer` in the config, with the consumer it belongs to.
struct Box {
  idemd::Config config;
  std::unique_ptr<idemd::DeadLetterBox> box;
};
Result<Box> OpenDeadLetters(const DeadLetterOptions& options) {
  Box b;
  IDEM_ASSIGN_OR_RETURN(b.config, idemd::LoadConfig(options.config, {}));
  const idemd::ConsumerRoute* consumer = nullptr;
  std::string names;
  for (const idemd::ConsumerRoute& c : b.config.consumers) {
    if (c.name == options.consumer) consumer = &c;
    names += (names.empty() ? "" : ", ") + c.name;
  }
  if (consumer == nullptr) {
    return MakeError(Errc::kNotFound,
                     options.config + " has no consumer " + options.consumer +
                         (names.empty() ? " (it has none)" : " (it has " + names + ")"));
  }
  IDEM_ASSIGN_OR_RETURN(b.box, consumer->IsRabbitMq() ? idemd::OpenRabbitDeadLetters(*consumer)
                                                      : idemd::OpenRedisDeadLetters(*consumer));
  return b;
}

}  // namespace

int DeadLetterList(const DeadLetterOptions& options) {
  auto opened = OpenDeadLetters(options);
  if (!opened) return Fail(opened.error().message);
  auto dead = opened->box->List(options.limit);
  if (!dead) return Fail(dead.error().message);
  if (options.output == Output::kJson) {
    json::array letters;
    for (const idemd::DeadLetter& d : *dead) {
      json::object fields;
      for (const auto& [name, value] : d.fields) fields[name] = value;
      letters.push_back(json::object{{"id", d.id},
                                     {"source_id", d.source_id},
                                     {"reason", d.reason},
                                     {"detail", d.detail},
                                     {"deliveries", d.deliveries},
                                     {"fields", std::move(fields)}});
    }
    PrintJson(letters);
    return kExitDone;
  }
  for (const idemd::DeadLetter& d : *dead) {
    std::cout << (d.id.empty() ? "-" : d.id) << "  " << d.reason << "  from "
              << (d.source_id.empty() ? "-" : d.source_id) << "  after " << d.deliveries
              << " deliveries" << (d.detail.empty() ? "" : ": " + d.detail) << "\n";
  }
  std::cout << dead->size() << " dead letter" << (dead->size() == 1 ? "" : "s") << " of "
            << options.consumer
            << (static_cast<int>(dead->size()) == options.limit
                    ? " (the first " + std::to_string(options.limit) + ")"
                    : "")
            << "\n";
  return kExitDone;
}

int DeadLetterRedrive(const DeadLetterOptions& options) {
  auto opened = OpenDeadLetters(options);
  if (!opened) return Fail(opened.error().message);
  const std::set<std::string> ids(options.ids.begin(), options.ids.end());
  auto moved = opened->box->Redrive(ids, options.limit);
  if (!moved) return Fail(moved.error().message);
  if (options.output == Output::kJson) {
    PrintJson(json::object{{"moved", *moved}});
  } else {
    std::cout << *moved << " dead letter" << (*moved == 1 ? "" : "s") << " of " << options.consumer
              << " moved back\n";
  }
  // Named dead letters that were not found among the first `limit`: said, and a failure.
  if (!ids.empty() && *moved < static_cast<int64_t>(ids.size())) {
    return Fail(std::to_string(ids.size() - static_cast<std::size_t>(*moved)) +
                " of the named dead letters were not found among the first " +
                std::to_string(options.limit));
  }
  return kExitDone;
}

int OutboxList(const OutboxOptions& options) {
  auto opened = OpenFromConfig(options.config);
  if (!opened) return Fail(opened.error().message);
  auto events = options.payment.empty() ? UnpublishedOutboxEvents(*opened->store, options.limit)
                                        : OutboxEventsOf(*opened->store, options.payment);
  if (!events) return Fail(events.error().message);
  if (options.output == Output::kJson) {
    json::array out;
    for (const OutboxEvent& e : *events) out.push_back(idemd::EventJson(e));
    PrintJson(out);
    return kExitDone;
  }
  for (const OutboxEvent& e : *events) {
    std::cout << e.id << "  " << e.aggregate << " #" << e.sequence << "  " << e.type << "  "
              << http::Rfc3339(e.created_at_ms) << "  "
              << (e.published_at_ms ? "published " + http::Rfc3339(*e.published_at_ms)
                                    : std::string("unpublished"))
              << "\n";
  }
  std::cout << events->size() << " event" << (events->size() == 1 ? "" : "s")
            << (options.payment.empty() ? " unpublished" : " of " + options.payment) << "\n";
  return kExitDone;
}

int OutboxReplay(const OutboxOptions& options) {
  auto opened = OpenFromConfig(options.config);
  if (!opened) return Fail(opened.error().message);
  auto events = OutboxEventsOf(*opened->store, options.payment);
  if (!events) return Fail(events.error().message);
  if (events->empty()) return Fail("payment " + options.payment + " has no events to replay");
  auto set_back = idemd::ReplayPaymentEvents(*opened->store, options.payment);
  if (!set_back) return Fail(set_back.error().message);
  if (options.output == Output::kJson) {
    PrintJson(json::object{{"payment", options.payment}, {"replayed", *set_back}});
  } else {
    std::cout << *set_back << " event" << (*set_back == 1 ? "" : "s") << " of " << options.payment
              << " set back to be published again"
              << (opened->config.outbox.broker == "off"
                      ? " (this config relays no events: [outbox] broker is off)"
                      : "")
              << "\n";
  }
  return kExitDone;
}

int OutboxRelay(const OutboxOptions& options) {
  auto opened = OpenFromConfig(options.config);
  if (!opened) return Fail(opened.error().message);
  const idemd::OutboxConfig& outbox = opened->config.outbox;
  if (outbox.broker == "off") {
    return Fail(options.config + " relays no events: set [outbox] broker (docs/outbox.md)");
  }
  auto sink = idemd::OpenEventSink(outbox);
  if (!sink) return Fail(sink.error().message);
  idemd::Relay relay(
      *opened->store, **sink, SystemClock(),
      idemd::RelayOptions{
          .batch = outbox.batch, .lease = outbox.lease, .retention = outbox.retention},
      nullptr);
  auto pass = relay.RunOnce(options.limit);
  if (!pass) return Fail(pass.error().message);
  if (options.output == Output::kJson) {
    PrintJson(json::object{{"published", pass->published}, {"swept", pass->swept}});
  } else {
    std::cout << pass->published << " event" << (pass->published == 1 ? "" : "s")
              << " published to " << (*sink)->Describe() << ", " << pass->swept << " swept\n";
  }
  return kExitDone;
}

int GenSecret() {
  std::cout << idemd::GenerateSecretsToml(SystemRandom());
  return kExitDone;
}

int ApiKeyAdd(const ApiKeyAddOptions& options) {
  std::array<uint8_t, 24> bytes;
  SystemRandom().Fill(bytes);
  const std::string key = "idem_" + ToHex(bytes);
  const std::array<uint8_t, 32> digest = Sha256({key});
  std::ofstream out(options.config, std::ios::app);
  out << "\n[[principals]]\napi_key_sha256 = \"" << ToHex(digest) << "\"\ntenant = \""
      << options.tenant << "\"\nuser = \"" << options.user << "\"\n";
  out.close();
  if (!out) return Fail("cannot append to " + options.config);
  std::cerr << "added " << options.tenant << "/" << options.user << " to " << options.config
            << "; restart idemd to load it. The key is shown once:\n";
  if (options.output == Output::kJson) {
    PrintJson(json::object{{"api_key", key}, {"tenant", options.tenant}, {"user", options.user}});
  } else {
    std::cout << key << "\n";
  }
  return kExitDone;
}

}  // namespace idem::ctl
