// tools/idemctl/main.cc — the idem command line: pay through the retrying client, read payments
// and operations, inspect records straight from the store, sweep, and manage secrets and keys.
#include <openssl/sha.h>

#include <boost/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "client/client.h"
#include "idem/engine.h"
#include "idem/failpoint.h"
#include "server/idemd/config.h"
#include "server/idemd/reconciliation.h"
#include "server/idemd/routes.h"
#include "server/idemd/store_url.h"

namespace {

using namespace idem;

constexpr const char* kUsage = R"(usage: idemctl COMMAND [options]

Against a running idemd (--url, default $IDEM_URL or http://127.0.0.1:8080;
--api-key, default $IDEM_API_KEY):
  pay --order NO --amount A --currency C [--key K] [--async]
                                  one payment; the key is reused on every retry
  payment get ID
  operation get KEY

On the store of an idemd config (--config FILE):
  record inspect --tenant T --user U --key K [--route R] [--show-response]
  sweep                           delete expired finished records now
  reconcile --since T [--until T] [--dry-run] [-o json]
                                  reconcile the provider's charges created in [T, until) (RFC 3339;
                                  until defaults to now) with the payments: report what does not
                                  match, refund duplicates (docs/reconciliation.md). A dry run
                                  writes and refunds nothing.
  reconcile report [--since T] [--limit N] [-o json]
                                  the findings so far, newest first

Exit status: 0 done; 1 failed; 2 usage; 3 idemd answered an error; 4 no such record;
5 reconcile found a missing or mismatched payment (a person must look).

Set-up:
  gen-secret                      print a fresh secrets file (TOML) for IDEM_SECRETS
  apikey add --config FILE --tenant T --user U
                                  create an API key, add its SHA-256 to the config, print it once
)";

struct Args {
  std::vector<std::string> words;
  std::map<std::string, std::string> flags;

  std::string Flag(const std::string& name, const std::string& fallback = "") const {
    auto it = flags.find(name);
    return it == flags.end() ? fallback : it->second;
  }
  bool Has(const std::string& name) const { return flags.count(name) > 0; }
};

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) == 0) {
      const bool boolean = s == "--async" || s == "--show-response" || s == "--dry-run";
      a.flags[s.substr(2)] = (!boolean && i + 1 < argc) ? argv[++i] : "true";
    } else if (s == "-o" && i + 1 < argc) {
      a.flags["o"] = argv[++i];
    } else {
      a.words.push_back(s);
    }
  }
  return a;
}

std::string Env(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

int Fail(const std::string& what) {
  std::cerr << "idemctl: " << what << "\n";
  return 1;
}

Result<client::Client> MakeClient(const Args& a) {
  client::ClientOptions options;
  options.base_url = a.Flag("url", Env("IDEM_URL", "http://127.0.0.1:8080"));
  options.api_key = a.Flag("api-key", Env("IDEM_API_KEY", ""));
  if (options.api_key.empty()) {
    return MakeError(Errc::kInvalidArgument, "no API key: pass --api-key or set IDEM_API_KEY");
  }
  return client::Client::Create(options);
}

void Print(const http::Response& r) {
  std::cout << "HTTP " << r.status << "\n";
  for (const auto& [name, value] : r.headers.fields) std::cout << name << ": " << value << "\n";
  std::cout << "\n" << r.body << "\n";
}

int Pay(const Args& a) {
  for (const char* required : {"order", "amount", "currency"}) {
    if (!a.Has(required)) return Fail(std::string("pay needs --") + required);
  }
  auto c = MakeClient(a);
  if (!c) return Fail(c.error().message);
  const std::string body =
      boost::json::serialize(boost::json::object{{"merchant_order_no", a.Flag("order")},
                                                 {"amount", a.Flag("amount")},
                                                 {"currency", a.Flag("currency")}});
  std::vector<std::pair<std::string, std::string>> headers;
  if (a.Has("async")) headers.emplace_back("Prefer", "respond-async");
  auto outcome = c->Post("/v1/payments", body, a.Flag("key"), headers);
  if (!outcome) return Fail(outcome.error().message);
  std::cerr << "Idempotency-Key: " << outcome->key << " (" << outcome->attempts << " attempt"
            << (outcome->attempts == 1 ? "" : "s") << ")\n";
  Print(outcome->response);
  return outcome->response.status < 400 ? 0 : 3;
}

int GetPath(const Args& a, const std::string& path) {
  auto c = MakeClient(a);
  if (!c) return Fail(c.error().message);
  auto r = c->Get(path);
  if (!r) return Fail(r.error().message);
  Print(*r);
  return r->status < 400 ? 0 : 3;
}

struct Opened {
  idemd::Config config;
  std::unique_ptr<Store> store;
};

// The store of an idemd config, opened without migrations: idemd owns the schema (it creates and
// upgrades it under its own lock), so idemctl never creates a store nor migrates one under
// running servers, and needs none of the routes' migrations. Sweeping deletes from the records
// table, which every schema version has.
Result<Opened> OpenFromConfig(const Args& a) {
  if (!a.Has("config")) return MakeError(Errc::kInvalidArgument, "--config FILE is required");
  Opened o;
  IDEM_ASSIGN_OR_RETURN(o.config, idemd::LoadConfig(a.Flag("config"), {}));
  idemd::StoreUrlOptions options;
  options.pool_size = 1;
  options.prepared_statements = o.config.store_prepared_statements;
  options.postgres_timeouts = o.config.store_timeouts;
  options.apply_migrations = false;
  IDEM_ASSIGN_OR_RETURN(o.store, idemd::OpenStoreUrl(o.config.store_url, options));
  return o;
}

int Inspect(const Args& a) {
  for (const char* required : {"tenant", "user", "key"}) {
    if (!a.Has(required)) return Fail(std::string("record inspect needs --") + required);
  }
  auto opened = OpenFromConfig(a);
  if (!opened) return Fail(opened.error().message);
  const idemd::Secrets& secrets = opened->config.secrets;
  auto fingerprinter = Fingerprinter::Create(secrets.hmac, secrets.hmac_current);
  if (!fingerprinter) return Fail(fingerprinter.error().message);
  auto sealer = Sealer::Create(secrets.seal, secrets.seal_current, SystemRandom());
  if (!sealer) return Fail(sealer.error().message);
  Engine engine(*opened->store, **fingerprinter, **sealer, SystemClock());
  const Principal principal{a.Flag("tenant"), a.Flag("user")};
  RoutePolicy policy;
  policy.route = a.Flag("route", std::string(idemd::kPaymentsCreateRoute));
  auto found = engine.Lookup(principal, policy, a.Flag("key"));
  if (!found) return Fail(found.error().message);
  if (!*found) {
    std::cout << "no record for " << principal.tenant << "/" << principal.user << " "
              << policy.route << " " << a.Flag("key") << "\n";
    return 4;
  }
  const Record& r = (*found)->record;
  auto when = [](Timestamp t) { return http::Rfc3339(ToUnixMillis(t)); };
  std::cout << "scope_hash      " << ToHex(r.scope) << "\n"
            << "tenant/user     " << r.tenant << "/" << r.user << "\n"
            << "route           " << r.route << "\n"
            << "state           " << RecordStateName(r.state) << "\n"
            << "recovery_point  " << r.recovery_point << "\n"
            << "resource_id     " << r.resource_id << "\n"
            << "status_code     " << r.status_code << "\n"
            << "fence           " << r.lease.fence << "\n"
            << "lease_until     " << when(r.lease.until) << "\n"
            << "created_at      " << when(r.created_at) << "\n"
            << "updated_at      " << when(r.updated_at) << "\n"
            << "expires_at      " << when(r.expires_at) << ((*found)->expired ? " (expired)" : "")
            << "\n"
            << "fingerprint     rules v" << r.fingerprint.rules_version << ", secret "
            << r.fingerprint.secret_id << "\n"
            << "response        "
            << (r.response.empty() ? "none" : std::to_string(r.response.size()) + " sealed bytes")
            << "\n";
  if (a.Has("show-response") && (*found)->response) {
    const StoredResponse& stored = *(*found)->response;
    std::cout << "\nHTTP " << stored.status << "\n";
    for (const auto& [n, v] : stored.headers) std::cout << n << ": " << v << "\n";
    std::cout << "\n" << stored.body << "\n";
  }
  return 0;
}

int Sweep(const Args& a) {
  auto opened = OpenFromConfig(a);
  if (!opened) return Fail(opened.error().message);
  // Everything that has expired, in the sweeper's batches.
  auto swept = SweepExpired(*opened->store, std::numeric_limits<int>::max());
  if (!swept) return Fail(swept.error().message);
  std::cout << "swept " << *swept << " expired records\n";
  return 0;
}

idemd::Reconciliation MakeReconciliation(const Opened& o, idemd::Provider& provider) {
  return idemd::Reconciliation(*o.store, provider, SystemClock(), SystemRandom(), nullptr,
                               {.refund_duplicates = o.config.refund_duplicates,
                                .refund_orphans = o.config.refund_orphans,
                                .orphan_grace = o.config.orphan_grace,
                                .lease = o.config.books_lease,
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

Result<int64_t> TimeFlag(const Args& a, const std::string& name, int64_t fallback) {
  if (!a.Has(name)) return fallback;
  auto ms = http::ParseRfc3339(a.Flag(name));
  if (!ms) {
    return MakeError(Errc::kInvalidArgument,
                     "--" + name + " must be an RFC 3339 time, e.g. 2026-11-30T00:00:00Z");
  }
  return *ms;
}

int Reconcile(const Args& a) {
  const bool json_out = a.Flag("o") == "json";
  if (a.Has("o") && !json_out) return Fail("-o takes json");
  auto opened = OpenFromConfig(a);
  if (!opened) return Fail(opened.error().message);
  auto provider = idemd::MakeHttpProvider(opened->config.provider_url,
                                          idemd::ProviderOptionsOf(opened->config));
  if (!provider) return Fail(provider.error().message);
  idemd::Reconciliation books = MakeReconciliation(*opened, **provider);
  if (a.words.size() > 1) {  // reconcile report
    auto since = TimeFlag(a, "since", 0);
    if (!since) return Fail(since.error().message);
    const int limit = std::atoi(a.Flag("limit", "100").c_str());
    if (limit < 1 || limit > 100000) return Fail("--limit takes 1..100000");
    auto findings = books.Report(*since, limit);
    if (!findings) return Fail(findings.error().message);
    if (json_out) {
      boost::json::array out;
      for (const idemd::Finding& f : *findings) out.push_back(idemd::ToJson(f));
      std::cout << boost::json::serialize(out) << "\n";
    } else {
      PrintFindings(*findings);
    }
    return 0;
  }
  if (!a.Has("since")) return Fail("reconcile needs --since (RFC 3339)");
  auto since = TimeFlag(a, "since", 0);
  if (!since) return Fail(since.error().message);
  auto until = TimeFlag(a, "until", ToUnixMillis(SystemClock().Now()));
  if (!until) return Fail(until.error().message);
  auto ran = books.Run(*since, *until, a.Has("dry-run"));
  if (!ran) return Fail(ran.error().message);
  if (json_out) {
    std::cout << boost::json::serialize(idemd::ToJson(*ran)) << "\n";
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
  return alarming ? 5 : 0;
}

int ApiKeyAdd(const Args& a) {
  for (const char* required : {"config", "tenant", "user"}) {
    if (!a.Has(required)) return Fail(std::string("apikey add needs --") + required);
  }
  auto valid = [](const std::string& s) {
    return !s.empty() && s.size() <= 64 &&
           s.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-_") == std::string::npos;
  };
  if (!valid(a.Flag("tenant")) || !valid(a.Flag("user"))) {
    return Fail("tenant and user: 1..64 of a-z 0-9 - _");
  }
  std::array<uint8_t, 24> bytes;
  SystemRandom().Fill(bytes);
  const std::string key = "idem_" + ToHex(bytes);
  std::array<uint8_t, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), digest.data());
  std::ofstream out(a.Flag("config"), std::ios::app);
  out << "\n[[principals]]\napi_key_sha256 = \"" << ToHex(digest) << "\"\ntenant = \""
      << a.Flag("tenant") << "\"\nuser = \"" << a.Flag("user") << "\"\n";
  out.close();
  if (!out) return Fail("cannot append to " + a.Flag("config"));
  std::cerr << "added " << a.Flag("tenant") << "/" << a.Flag("user") << " to " << a.Flag("config")
            << "; restart idemd to load it. The key is shown once:\n";
  std::cout << key << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  // Tests make a reconciliation crash at a step, as idemd's do (include/idem/failpoint.h).
  if (const char* spec = std::getenv("IDEM_FAILPOINTS"); spec != nullptr && *spec != '\0') {
    if (auto armed = ArmFailpoints(spec); !armed) return Fail(armed.error().message);
  }
  const auto& w = a.words;
  auto is = [&](std::initializer_list<const char*> words) {
    if (w.size() < words.size()) return false;
    std::size_t i = 0;
    for (const char* word : words) {
      if (w[i++] != word) return false;
    }
    return true;
  };
  if (is({"pay"})) return Pay(a);
  if (is({"payment", "get"}) && w.size() == 3) return GetPath(a, "/v1/payments/" + w[2]);
  if (is({"operation", "get"}) && w.size() == 3) return GetPath(a, "/v1/operations/" + w[2]);
  if (is({"record", "inspect"})) return Inspect(a);
  if (is({"sweep"})) return Sweep(a);
  if (is({"reconcile", "report"}) && w.size() == 2) return Reconcile(a);
  if (is({"reconcile"}) && w.size() == 1) return Reconcile(a);
  if (is({"gen-secret"})) {
    std::cout << idemd::GenerateSecretsToml(SystemRandom());
    return 0;
  }
  if (is({"apikey", "add"})) return ApiKeyAdd(a);
  std::cerr << kUsage;
  return w.empty() || a.Has("help") ? 0 : 2;
}
