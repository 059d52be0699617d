// tests/integration/idemd_fixture.cc — see idemd_fixture.h.
#include "tests/integration/idemd_fixture.h"

#include <libpq-fe.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <random>

#include "server/idemd/config/store_url.h"

namespace idem::itest {

namespace json = boost::json;

std::string PostgresServerUrl() {
  const char* url = std::getenv("IDEM_TEST_PG_URL");
  return url != nullptr ? url : "";
}

std::string RedisServerUrl() {
  const char* url = std::getenv("IDEM_TEST_REDIS_URL");
  return url != nullptr ? url : "";
}

RedisReply RedisCommand(const std::vector<std::string>& args, uint16_t port) {
  std::string host = "127.0.0.1";
  if (port == 0) {
    const std::string address = RedisServerUrl().substr(std::string("redis://").size());
    const std::size_t colon = address.rfind(':');
    host = address.substr(0, colon);
    port = static_cast<uint16_t>(std::stoi(address.substr(colon + 1)));
  }
  std::unique_ptr<redisContext, void (*)(redisContext*)> c(
      redisConnectWithTimeout(host.c_str(), port, timeval{2, 0}), redisFree);
  if (c == nullptr || c->err != 0) {
    ADD_FAILURE() << "redis: " << (c ? c->errstr : "out of memory");
    return nullptr;
  }
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  RedisReply reply(static_cast<redisReply*>(
      redisCommandArgv(c.get(), static_cast<int>(args.size()), argv.data(), lens.data())));
  if (reply == nullptr || reply->type == REDIS_REPLY_ERROR) {
    ADD_FAILURE() << "redis: " << args[0] << " failed: "
                  << (reply ? std::string(reply->str, reply->len) : std::string(c->errstr));
    return nullptr;
  }
  return reply;
}

std::string PostgresSql(const std::string& sql, std::string* error) {
  PGconn* c = PQconnectdb(PostgresServerUrl().c_str());
  PGresult* r = PQexec(c, sql.c_str());
  const ExecStatusType status = PQresultStatus(r);
  std::string value = status == PGRES_TUPLES_OK && PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "";
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    if (error != nullptr) {
      *error = PQerrorMessage(c);
    } else {
      ADD_FAILURE() << sql << ": " << PQerrorMessage(c);
    }
  }
  PQclear(r);
  PQfinish(c);
  return value;
}

std::string FreshPostgresStoreUrl(std::string* schema_out) {
  static std::mt19937_64 rng(std::random_device{}());
  const std::string schema = "it" + std::to_string(rng() % 1000000000000ULL);
  PostgresSql("CREATE SCHEMA " + schema);
  if (schema_out != nullptr) *schema_out = schema;
  const std::string url = PostgresServerUrl();
  return url + (url.find('?') == std::string::npos ? "?" : "&") + "options=-csearch_path%3D" +
         schema;
}

std::unique_ptr<Store> OpenExistingStore(const std::string& store_url) {
  idemd::StoreUrlOptions options;
  options.pool_size = 1;
  options.apply_migrations = false;
  auto store = idemd::OpenStoreUrl(store_url, options);
  EXPECT_TRUE(store.has_value()) << store.error().message;
  return store ? std::move(*store) : nullptr;
}

std::vector<OutboxEvent> OutboxEventsAt(const std::string& store_url,
                                        const std::string& payment_id) {
  std::unique_ptr<Store> store = OpenExistingStore(store_url);
  if (store == nullptr) return {};
  auto events = OutboxEventsOf(*store, payment_id);
  EXPECT_TRUE(events.has_value()) << events.error().message;
  return events ? std::move(*events) : std::vector<OutboxEvent>();
}

http::Response PayAt(const http::Url& url, const std::string& key, const std::string& body,
                     const std::string& prefer) {
  http::Request req{"POST", "/v1/payments", {}, body};
  req.headers.Set("Authorization", std::string("Bearer ") + kAlice);
  req.headers.Set("Content-Type", "application/json");
  req.headers.Set("Idempotency-Key", key);
  if (!prefer.empty()) req.headers.Set("Prefer", prefer);
  auto r = http::Call(url, std::move(req));
  EXPECT_TRUE(r.has_value());
  return r ? std::move(*r) : http::Response{};
}

void IdemdTest::StartService(const char* path, const std::string& name, const std::string& log,
                             std::optional<testing::ChildProcess>* process, http::Url* url) {
  auto started = testing::ChildProcess::Spawn({path, "--listen", "127.0.0.1:0"}, {},
                                              dir_.path().string(), dir_.File(log));
  ASSERT_TRUE(started.has_value()) << started.error().message;
  process->emplace(std::move(*started));
  auto line = (*process)->WaitForLine(name + " listening on ", std::chrono::seconds(10));
  ASSERT_TRUE(line.has_value()) << line.error().message;
  *url = *http::ParseHttpUrl(*line);
}

void IdemdTest::SetUp() {
  StartService(PROVIDER_SIM_PATH, "provider-sim", "provider.log", &provider_, &provider_url_);
  if (HasFatalFailure()) return;
  testing::SeededRandom random(99);
  secrets_toml_ = "hmac_current = 1\nseal_current = 1\n[[hmac]]\nid = 1\nkey = \"" +
                  std::string(64, 'a') + "\"\n[[seal]]\nid = 1\nkey = \"" + std::string(64, 'b') +
                  "\"\n";
  StartIdemd();
}

void IdemdTest::WriteConfig(const std::string& config, const IdemdOptions& options) {
  std::ofstream out(config);
  out << "[server]\nlisten = \"127.0.0.1:0\"\nread_timeout_ms = 2000\n"
      << "drain_timeout_ms = 5000\n"
      << options.extra_server << "\n"
      << "[store]\nurl = \""
      << (options.store_url.empty() ? "sqlite://" + dir_.File("idem.db") : options.store_url)
      << "\"\n"
      << options.extra_store << "\n"
      << "[provider]\nurl = \"http://127.0.0.1:" << provider_url_.port
      << "\"\ntimeout_ms = " << options.provider_timeout_ms << "\n"
      << "settle_ms = "
      << (options.settle_ms > 0 ? options.settle_ms : options.provider_timeout_ms + 1000) << "\n"
      << options.extra_provider << "\n"
      << "[idempotency]\nlease_ms = " << options.lease_ms
      << "\nlease_margin_ms = " << options.lease_margin_ms
      << "\nreconcile_interval_ms = " << options.reconcile_interval_ms << "\n"
      << options.extra_idempotency << "\n"
      << (options.redis_url.empty() ? "" : "[redis]\nurl = \"" + options.redis_url + "\"\n")
      << options.extra_tables << "\n"
      << "[[principals]]\napi_key_sha256 = "
         "\"86f71c9cb79152ae8c4aff86cd48dbfc35eee594762141f8f00ece58705547e5\"\n"
         "tenant = \"acme\"\nuser = \"alice\"\n"
      << "[[principals]]\napi_key_sha256 = "
         "\"a89d26c5dbc510aabe658da978bf458885cc3b2bc814256dd016fb3341ed9810\"\n"
         "tenant = \"acme\"\nuser = \"bob\"\n"
      << "[[principals]]\napi_key_sha256 = "
         "\"5b2419a10bd09a42bc7aef709d8c7071a0ccbeae04e6e386f76468c91ff5f484\"\n"
         "tenant = \"globex\"\nuser = \"carol\"\n";
}

void IdemdTest::StartIdemd(const IdemdOptions& options) {
  idemd_.reset();
  const std::string config = dir_.File("idemd.toml");
  if (!options.keep_config) WriteConfig(config, options);
  std::map<std::string, std::string> env = options.env;
  env["IDEM_SECRETS"] = secrets_toml_;
  auto idemd = testing::ChildProcess::Spawn({IDEMD_PATH, "--config", config}, env,
                                            dir_.path().string(), dir_.File("idemd.log"));
  ASSERT_TRUE(idemd.has_value()) << idemd.error().message;
  idemd_.emplace(std::move(*idemd));
  auto url = idemd_->WaitForLine("idemd listening on ", std::chrono::seconds(10));
  ASSERT_TRUE(url.has_value()) << url.error().message;
  idemd_url_ = *http::ParseHttpUrl(*url);
}

void IdemdTest::KillIdemd() {
  idemd_->Signal(SIGKILL);
  idemd_->Wait(std::chrono::seconds(5));
  idemd_.reset();
}

http::Response IdemdTest::Send(http::Request request) {
  auto r = http::Call(idemd_url_, std::move(request));
  EXPECT_TRUE(r.has_value()) << r.error().message;
  return r ? *r : http::Response{0, {}, {}};
}

http::Response IdemdTest::Pay(const std::string& key, const std::string& body,
                              const std::string& api_key,
                              const std::vector<std::pair<std::string, std::string>>& headers) {
  http::Request req;
  req.method = "POST";
  req.target = "/v1/payments";
  req.headers.Set("Authorization", "Bearer " + api_key);
  req.headers.Set("Content-Type", "application/json");
  if (!key.empty()) req.headers.Set("Idempotency-Key", key);
  for (const auto& [n, v] : headers) req.headers.Set(n, v);
  req.body = body;
  return Send(std::move(req));
}

http::Response IdemdTest::Get(const std::string& path, const std::string& api_key) {
  http::Request req;
  req.method = "GET";
  req.target = path;
  if (!api_key.empty()) req.headers.Set("Authorization", "Bearer " + api_key);
  return Send(std::move(req));
}

void IdemdTest::Fault(const std::string& json_body) {
  http::Request req{"POST", "/admin/faults", {}, json_body};
  req.headers.Set("Content-Type", "application/json");
  auto r = http::Call(provider_url_, std::move(req));
  ASSERT_TRUE(r.has_value() && r->status == 200) << (r ? r->body : r.error().message);
}

void IdemdTest::ProviderMode(bool ignore_keys) {
  http::Request req{
      "POST",
      "/admin/mode",
      {},
      std::string("{\"ignore_idempotency_keys\":") + (ignore_keys ? "true" : "false") + "}"};
  auto r = http::Call(provider_url_, std::move(req));
  ASSERT_TRUE(r.has_value() && r->status == 200);
}

int64_t IdemdTest::ChargesFor(const std::string& reference) {
  auto r = http::Call(provider_url_, http::Request{"GET", "/admin/stats", {}, {}});
  if (!r) return -1;
  json::object stats = ParseObject(r->body);
  const json::value* n = stats["charges_by_reference"].as_object().if_contains(reference);
  return n ? n->as_int64() : 0;
}

std::pair<int, std::string> IdemdTest::RunIdemctl(std::vector<std::string> argv,
                                                  const std::map<std::string, std::string>& env) {
  argv.insert(argv.begin(), IDEMCTL_PATH);
  std::map<std::string, std::string> all = env;
  all["IDEM_SECRETS"] = secrets_toml_;
  static std::atomic<int> runs{0};
  const std::string errors = dir_.File("idemctl-" + std::to_string(++runs) + ".log");
  auto p = testing::ChildProcess::Spawn(argv, all, dir_.path().string(), errors);
  EXPECT_TRUE(p.has_value());
  if (!p) return {-1, ""};
  std::string out;
  while (auto line = p->WaitForLine("", std::chrono::seconds(30))) out += *line + "\n";
  auto status = p->Wait(std::chrono::seconds(30));
  // What it said on standard error follows, so a failing test shows why.
  std::ifstream err(errors);
  const std::string said((std::istreambuf_iterator<char>(err)), std::istreambuf_iterator<char>());
  if (!said.empty()) out += "[stderr] " + said;
  return {status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, out};
}

std::string IdemdTest::InjectCharge(const std::string& reference, const std::string& amount,
                                    const std::string& currency, const std::string& created_at) {
  json::object body{{"reference", reference}, {"amount", amount}, {"currency", currency}};
  if (!created_at.empty()) body["created_at"] = created_at;
  auto r =
      http::Call(provider_url_, http::Request{"POST", "/admin/charges", {}, json::serialize(body)});
  EXPECT_TRUE(r && r->status == 201) << (r ? r->body : r.error().message);
  return r ? std::string(ParseObject(r->body)["id"].as_string()) : "";
}

int64_t IdemdTest::RefundsOf(const std::string& charge_id) {
  auto r = http::Call(provider_url_, http::Request{"GET", "/admin/stats", {}, {}});
  if (!r) return -1;
  const json::object stats = ParseObject(r->body);
  const json::value* by_charge = stats.if_contains("refunds_by_charge");
  if (by_charge == nullptr || !by_charge->is_object()) return -1;
  const json::value* n = by_charge->as_object().if_contains(charge_id);
  return n ? n->as_int64() : 0;
}

int64_t IdemdTest::TotalCharges() {
  auto r = http::Call(provider_url_, http::Request{"GET", "/admin/stats", {}, {}});
  return r ? ParseObject(r->body)["total"].to_number<int64_t>() : -1;
}

std::string IdemdTest::Body(const std::string& order, const std::string& amount,
                            const std::string& currency) {
  return "{\"merchant_order_no\":\"" + order + "\",\"amount\":" + amount + ",\"currency\":\"" +
         currency + "\"}";
}

json::object IdemdTest::ParseObject(const std::string& text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  EXPECT_FALSE(ec) << text;
  return !ec && v.is_object() ? v.as_object() : json::object{};
}

}  // namespace idem::itest
