// tests/integration/security_itest.cc — security properties of idemd held against real processes
// (idemd, provider-sim, Redis, PostgreSQL):
//   - nothing a client sent or was answered, no API key, no secret is stored in plaintext in idem's
//     records table (SQLite, PostgreSQL) or in Redis (cache entries and in-flight markers) — but
//     the payment id a record refers to (resource_id, by design; see ExpectNothingAtRest);
//   - idemd's log and idemctl's standard error carry no API key, secret, idempotency key or body;
//   - another principal's credentials read, replay and probe nothing of a principal's records;
//   - payment ids are random, not counted;
//   - a principal flooding idemd with fresh keys is throttled (429) without hurting the others.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "idem/key.h"
#include "idem/mutex.h"
#include "tests/integration/idemd_fixture.h"

namespace idem::itest {
namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

std::string RandomHex(std::size_t bytes) {
  static std::mt19937_64 rng(std::random_device{}());
  static Mutex mu;
  MutexLock lock(mu);
  std::string out;
  constexpr const char* kDigits = "0123456789abcdef";
  for (std::size_t i = 0; i < bytes; ++i) {
    const auto b = static_cast<unsigned>(rng() & 0xff);
    out += kDigits[b >> 4];
    out += kDigits[b & 0xf];
  }
  return out;
}

std::string FromHex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return out;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Printable form of bytes for a failure message.
std::string Printable(std::string_view bytes, std::size_t max = 160) {
  std::string out;
  for (char c : bytes.substr(0, max)) {
    out += std::isprint(static_cast<unsigned char>(c)) ? c : '.';
  }
  return bytes.size() > max ? out + "..." : out;
}

// Something that must be found nowhere, as raw bytes.
struct Needle {
  std::string what;  // for the failure message
  std::string bytes;
};

// Every needle found in `haystack`, as "what [needle] in \"context\"".
std::vector<std::string> Find(std::string_view haystack, const std::vector<Needle>& needles) {
  std::vector<std::string> hits;
  for (const Needle& n : needles) {
    if (n.bytes.empty()) continue;
    const std::size_t at = haystack.find(n.bytes);
    if (at == std::string_view::npos) continue;
    const std::size_t from = at > 40 ? at - 40 : 0;
    hits.push_back(n.what + " [" + Printable(n.bytes, 64) + "] in \"" +
                   Printable(haystack.substr(from, n.bytes.size() + 80)) + "\"");
  }
  return hits;
}

std::string Join(const std::vector<std::string>& hits) {
  std::string out;
  for (const std::string& h : hits) out += (out.empty() ? "" : "\n  ") + h;
  return out;
}

// ---- What is at rest ---------------------------------------------------------------------------

struct Cell {
  std::string column;
  std::string bytes;  // text as it is, blobs as raw bytes, numbers in decimal
};
using DumpRow = std::vector<Cell>;

std::string CellBytes(const SqlValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return *s;
  if (const auto* b = std::get_if<Blob>(&v)) return b->bytes;
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return std::to_string(*d);
  if (const auto* t = std::get_if<Timestamp>(&v)) return std::to_string(ToUnixMillis(*t));
  return "";
}

// Every row and column of `table`, through the store API (no migrations: the store idemd made).
std::vector<DumpRow> DumpTable(const std::string& store_url, const std::string& table) {
  std::unique_ptr<Store> store = OpenExistingStore(store_url);
  if (store == nullptr) return {};
  const bool sqlite = store_url.rfind("sqlite://", 0) == 0;
  auto names =
      sqlite ? store->Query("SELECT name FROM pragma_table_info('" + table + "') ORDER BY cid")
             : store->Query(
                   "SELECT column_name::text FROM information_schema.columns WHERE "
                   "table_name::text = ? AND table_schema = current_schema() "
                   "ORDER BY ordinal_position",
                   {table});
  EXPECT_TRUE(names.has_value()) << names.error().message;
  auto rows = store->Query("SELECT * FROM " + table);
  EXPECT_TRUE(rows.has_value()) << rows.error().message;
  if (!names || !rows) return {};
  std::vector<DumpRow> out;
  for (const SqlRow& row : *rows) {
    EXPECT_EQ(row.size(), names->size());
    DumpRow cells;
    for (std::size_t c = 0; c < row.size(); ++c) {
      cells.push_back({c < names->size() ? CellBytes((*names)[c][0]) : "?", CellBytes(row[c])});
    }
    out.push_back(std::move(cells));
  }
  return out;
}

// A string or integer field of a JSON answer ("" / -1 when absent).
std::string Str(const http::Response& r, const char* field) {
  json::object o = IdemdTest::ParseObject(r.body);
  const json::value* v = o.if_contains(field);
  return v != nullptr && v->is_string() ? std::string(v->as_string()) : "";
}
int64_t Int(const http::Response& r, const char* field) {
  json::object o = IdemdTest::ParseObject(r.body);
  const json::value* v = o.if_contains(field);
  return v != nullptr && v->is_int64() ? v->as_int64() : -1;
}

std::string Column(const DumpRow& row, const std::string& name) {
  for (const Cell& c : row) {
    if (c.column == name) return c.bytes;
  }
  ADD_FAILURE() << "no column " << name;
  return "";
}

struct RedisEntry {
  std::string key;
  std::string type;
  std::string value;  // GET of a string; the members of other types, concatenated
};

// Every key in the Redis on `port` and its value as raw bytes.
std::vector<RedisEntry> DumpRedis(uint16_t port) {
  std::vector<RedisEntry> out;
  auto command = [&](const std::vector<std::string>& args) { return RedisCommand(args, port); };
  auto flatten = [](const redisReply* r) {
    std::string all;
    for (std::size_t i = 0; i < r->elements; ++i) {
      if (r->element[i]->str != nullptr) all.append(r->element[i]->str, r->element[i]->len);
      all += '\n';
    }
    return all;
  };
  std::string cursor = "0";
  std::vector<std::string> keys;
  do {
    RedisReply scan = command({"SCAN", cursor, "COUNT", "1000"});
    if (!scan || scan->type != REDIS_REPLY_ARRAY || scan->elements != 2) {
      ADD_FAILURE() << "SCAN failed";
      break;
    }
    cursor.assign(scan->element[0]->str, scan->element[0]->len);
    for (std::size_t i = 0; i < scan->element[1]->elements; ++i) {
      const redisReply* k = scan->element[1]->element[i];
      keys.emplace_back(k->str, k->len);
    }
  } while (cursor != "0");
  for (const std::string& key : keys) {
    RedisEntry e{key, "", ""};
    RedisReply type = command({"TYPE", key});
    if (type && type->str != nullptr) e.type.assign(type->str, type->len);
    RedisReply value;
    if (e.type == "string") {
      value = command({"GET", key});
    } else if (e.type == "hash") {
      value = command({"HGETALL", key});
    } else if (e.type == "list") {
      value = command({"LRANGE", key, "0", "-1"});
    } else if (e.type == "set") {
      value = command({"SMEMBERS", key});
    } else if (e.type == "zset") {
      value = command({"ZRANGE", key, "0", "-1"});
    } else if (e.type != "none") {  // gone since the scan: nothing to read
      value = command({"DUMP", key});
    }
    if (value && value->type == REDIS_REPLY_STRING) e.value.assign(value->str, value->len);
    if (value && value->type == REDIS_REPLY_ARRAY) e.value = flatten(value.get());
    out.push_back(std::move(e));
  }
  return out;
}

// ---- PostgreSQL --------------------------------------------------------------------------------

// ---- The fixture -------------------------------------------------------------------------------

// What a workload sent and was answered: what must be found nowhere at rest.
struct Workload {
  std::vector<Needle> needles;
  std::vector<std::string> payment_ids;
  std::vector<std::string> keys;  // idempotency keys sent
  // Redis and the records while a payment was in flight (its in-flight marker, PROCESSING).
  std::vector<RedisEntry> redis_in_flight;
  std::vector<DumpRow> records_in_flight;
};

class SecurityTest : public IdemdTest {
 public:
  void SetUp() override {
    IdemdTest::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    // Secrets of this test's own, random, so a copy of them anywhere is recognisable (the
    // fixture's are repeated letters).
    hmac_hex_ = RandomHex(32);
    seal_hex_ = RandomHex(32);
    secrets_toml_ = "hmac_current = 1\nseal_current = 1\n[[hmac]]\nid = 1\nkey = \"" + hmac_hex_ +
                    "\"\n[[seal]]\nid = 1\nkey = \"" + seal_hex_ + "\"\n";
    StartIdemd(Roomy({}));
  }

  // Timing with room for a slow provider answer (1.2 s) on a loaded machine.
  static IdemdOptions Roomy(IdemdOptions o) {
    o.lease_ms = 5000;
    o.provider_timeout_ms = 3000;
    return o;
  }

  // A Redis of this test's own, so every key in it is idemd's. True when it runs; otherwise the
  // test is skipped (no redis-server, failed under IDEM_REQUIRE_SERVICES) or has failed, and the
  // caller returns.
  [[nodiscard]] bool StartRedis() {
    SpawnRedis();
    return !HasFatalFailure() && !IsSkipped();
  }

  void SpawnRedis() {
    if (!std::filesystem::exists("/usr/bin/redis-server")) {
      IDEM_SKIP_OR_FAIL("no /usr/bin/redis-server");
    }
    redis_port_ = testing::FreeLoopbackPort();
    auto p = testing::ChildProcess::Spawn(
        {"/usr/bin/redis-server", "--bind", "127.0.0.1", "--port", std::to_string(redis_port_),
         "--save", "", "--appendonly", "no"},
        {}, dir_.path().string(), dir_.File("redis.log"));
    ASSERT_TRUE(p.has_value()) << p.error().message;
    redis_.emplace(std::move(*p));
    ASSERT_TRUE(testing::WaitForPort(redis_port_, 10s));
    redis_url_ = "redis://127.0.0.1:" + std::to_string(redis_port_);
  }

  // Every API key this test knows, the wrong ones it sends included, and the secrets in every
  // spelling: hex (either case) and raw bytes.
  std::vector<Needle> CredentialNeedles() const {
    std::vector<Needle> n = {{"alice's API key", kAlice},
                             {"bob's API key", kBob},
                             {"carol's API key", kCarol},
                             {"a wrong API key", kWrongKey},
                             {"a near miss of alice's API key", kNearMissKey}};
    for (const auto& [name, hex] :
         {std::pair{"HMAC secret", hmac_hex_}, {"seal secret", seal_hex_}}) {
      n.push_back({std::string(name) + " (hex)", hex});
      n.push_back({std::string(name) + " (HEX)", Upper(hex)});
      n.push_back({std::string(name) + " (raw)", FromHex(hex)});
    }
    // Whatever else the secrets text holds as a key.
    static const std::regex kKey("key = \"([0-9a-fA-F]+)\"");
    for (std::sregex_iterator it(secrets_toml_.begin(), secrets_toml_.end(), kKey), end; it != end;
         ++it) {
      n.push_back({"a key of IDEM_SECRETS", (*it)[1].str()});
    }
    return n;
  }

  static std::string PaymentBody(const std::string& order, const std::string& amount,
                                 const std::string& currency) {
    return json::serialize(
        json::object{{"merchant_order_no", order},
                     {"amount", amount},
                     {"currency", currency},
                     {"description", "SECRET-MARKER description of " + order},
                     {"metadata", json::object{{"note", "SECRET-MARKER-METADATA"},
                                               {"customer_email", "jane.roe.secret@example.com"}}},
                     {"trace_id", "SECRET-MARKER-TRACE"}});
  }

  // Payments, replays, a 422, a decline, an invalid body, reads, a respond-async payment and one
  // slow payment, during which Redis and the records are read. Everything the requests carried
  // and the answers said becomes a needle.
  Workload RunWorkload() {
    Workload w;
    const std::string tag = RandomHex(4);
    auto key = [&](const std::string& name) {
      w.keys.push_back("sec-" + name + "-" + tag);
      return w.keys.back();
    };
    auto remember = [&](const std::string& what, const http::Response& r) {
      w.needles.push_back({what + " body", r.body});
      json::object o = ParseObject(r.body);
      for (const char* field :
           {"id", "merchant_order_no", "amount", "provider_charge_id", "created_at", "detail"}) {
        const json::value* v = o.if_contains(field);
        if (v == nullptr || !v->is_string()) continue;
        const std::string text(v->as_string());
        // A whole-number amount (JPY) could occur by chance in the decimal text of a stored
        // time; it is looked for as the JSON string it is.
        const bool digits = text.find_first_not_of("0123456789") == std::string::npos;
        w.needles.push_back({what + " " + field, digits ? "\"" + text + "\"" : text});
        if (std::string_view(field) == "id") w.payment_ids.push_back(text);
      }
    };
    w.needles.push_back({"the marker of request bodies", "SECRET-MARKER"});
    w.needles.push_back({"a customer e-mail of request metadata", "jane.roe.secret@example.com"});

    // alice: a payment, its replay, the same key with another amount (422).
    const std::string k1 = key("alice-first");
    const std::string b1 = PaymentBody("ORD-SECRET-MARKER-123", "4321.99", "CNY");
    http::Response first = Pay(k1, b1);
    EXPECT_EQ(first.status, 201) << first.body;
    remember("alice's payment", first);
    http::Response replay = Pay(k1, b1);
    EXPECT_EQ(replay.status, 201);
    EXPECT_EQ(replay.body, first.body);
    EXPECT_EQ(replay.headers.Get("idempotent-replayed").value_or(""), "true");
    EXPECT_EQ(Pay(k1, PaymentBody("ORD-SECRET-MARKER-123", "4321.98", "CNY")).status, 422);
    w.needles.push_back({"the amount of the 422", "4321.98"});
    // A decline, final, and its replay.
    Fault(R"({"fault":"decline","times":1})");
    const std::string k2 = key("alice-declined");
    const std::string b2 = PaymentBody("ORD-SECRET-MARKER-DECLINED", "777.77", "USD");
    http::Response declined = Pay(k2, b2);
    EXPECT_EQ(declined.status, 402) << declined.body;
    remember("the decline", declined);
    EXPECT_EQ(Pay(k2, b2).headers.Get("idempotent-replayed").value_or(""), "true");
    w.needles.push_back({"the declined amount", "777.77"});
    // An invalid body (never stored, checked all the same).
    EXPECT_EQ(
        Pay(key("alice-invalid"), PaymentBody("ORD-SECRET-MARKER-INVALID!", "-5.00", "CNY")).status,
        400);
    // bob and carol, each with a replay; carol in JPY.
    const std::string kb = key("bob-first");
    const std::string bb = PaymentBody("ORD-SECRET-MARKER-BOB", "1234.56", "EUR");
    http::Response bobs = Pay(kb, bb, kBob);
    EXPECT_EQ(bobs.status, 201) << bobs.body;
    remember("bob's payment", bobs);
    EXPECT_EQ(Pay(kb, bb, kBob).body, bobs.body);
    const std::string kc = key("carol-first");
    const std::string bc = PaymentBody("ORD-SECRET-MARKER-CAROL", "98765", "JPY");
    http::Response carols = Pay(kc, bc, kCarol);
    EXPECT_EQ(carols.status, 201) << carols.body;
    remember("carol's payment", carols);
    EXPECT_EQ(Pay(kc, bc, kCarol).body, carols.body);
    // bob pays alice's order under a key of his: the tenant's existing payment (200).
    http::Response existing = Pay(key("bob-existing"), b1, kBob);
    EXPECT_EQ(existing.status, 200) << existing.body;
    remember("the existing payment", existing);
    // Reads.
    for (const std::string& id : w.payment_ids) (void)Get("/v1/payments/" + id);
    EXPECT_EQ(Get("/v1/operations/" + k1).status, 200);
    EXPECT_EQ(Get("/v1/operations/" + kc, kCarol).status, 200);
    // respond-async: 202 at once, the operation shows the answer.
    const std::string ka = key("alice-async");
    http::Response accepted = Pay(ka, PaymentBody("ORD-SECRET-MARKER-ASYNC", "31.41", "EUR"),
                                  kAlice, {{"Prefer", "respond-async"}});
    EXPECT_EQ(accepted.status, 202) << accepted.body;
    w.needles.push_back({"the async amount", "31.41"});
    for (int i = 0; i < 100; ++i) {
      http::Response op = Get("/v1/operations/" + ka);
      json::object o = ParseObject(op.body);
      if (o.contains("response")) {
        const json::value& resp = o["response"];
        const std::string text =
            resp.is_string() ? std::string(resp.as_string()) : json::serialize(resp);
        remember("the async payment", http::Response{201, {}, text});
        break;
      }
      std::this_thread::sleep_for(50ms);
    }
    // A payment in flight: its record is PROCESSING and, with Redis, its marker is set.
    Fault(R"({"fault":"slow","delay_ms":1200,"times":1})");  // within the provider timeout
    const std::string ks = key("alice-slow");
    http::Response slow;
    std::thread executor(
        [&] { slow = Pay(ks, PaymentBody("ORD-SECRET-MARKER-SLOW", "55.55", "CNY")); });
    std::this_thread::sleep_for(400ms);
    if (redis_port_ != 0) w.redis_in_flight = DumpRedis(redis_port_);
    w.records_in_flight = DumpTable(store_url_, "idem_records");
    executor.join();
    EXPECT_EQ(slow.status, 201) << slow.body;
    remember("the slow payment", slow);
    EXPECT_EQ(Pay(ks, PaymentBody("ORD-SECRET-MARKER-SLOW", "55.55", "CNY")).body, slow.body);
    w.needles.push_back({"the slow amount", "55.55"});
    w.needles.push_back({"alice's amount", "4321.99"});
    w.needles.push_back({"bob's amount", "1234.56"});
    for (const std::string& k : w.keys) w.needles.push_back({"the idempotency key", k});
    for (const Needle& n : CredentialNeedles()) w.needles.push_back(n);
    return w;
  }

  // Nothing of `w` in idem_records (every column; resource_id may hold the payment id it refers
  // to, see below) or in Redis (every key and value; a cache entry may hold its record's
  // resource_id once).
  void ExpectNothingAtRest(const Workload& w) {
    const std::set<std::string> ids(w.payment_ids.begin(), w.payment_ids.end());
    ASSERT_GE(ids.size(), 5u) << "the workload made payments";
    // The payments table, the business's own data, is excluded; it serves as a control: the
    // same scan over it finds what it holds.
    const std::vector<DumpRow> payments = DumpTable(store_url_, "payments");
    std::string all_payments;
    for (const DumpRow& row : payments)
      for (const Cell& c : row) all_payments += c.bytes + "\n";
    EXPECT_FALSE(Find(all_payments, w.needles).empty()) << "the scan finds plaintext";

    // THE ONE ALLOWANCE. resource_id is the record's reference to its payment row
    // (docs/design.md, the records table): the payment id in plaintext, by design, in the records
    // table and in the Redis cache entries that copy the record (with its tenant and user). The
    // payment id is part of every answer, so this is plaintext of a response at rest; it is
    // allowed only as the whole value of that column, and once in the cache entry of the same
    // record. Anything else of an answer — order, amount, charge id, body — fails, and so does a
    // payment id anywhere else.
    std::map<std::string, std::string> resource_of;  // hex scope hash -> resource_id
    auto scan_records = [&](const std::vector<DumpRow>& rows, const std::string& when) {
      for (const DumpRow& row : rows) {
        const std::string scope =
            Lower(ToHex(reinterpret_cast<const uint8_t*>(Column(row, "scope_hash").data()),
                        Column(row, "scope_hash").size()));
        for (const Cell& c : row) {
          if (c.column == "resource_id" && (c.bytes.empty() || ids.count(c.bytes) > 0)) {
            resource_of[scope] = c.bytes;
            continue;
          }
          if (auto hits = Find(c.bytes, w.needles); !hits.empty()) {
            ADD_FAILURE() << "idem_records (" << when << "), record " << scope << ", column "
                          << c.column << " holds plaintext:\n  " << Join(hits);
          }
        }
      }
    };
    const std::vector<DumpRow> records = DumpTable(store_url_, "idem_records");
    // One record per key but the invalid body's (rejected input never creates one).
    ASSERT_EQ(records.size(), w.keys.size() - 1);
    int sealed = 0;
    for (const DumpRow& row : records) {
      if (!Column(row, "response").empty()) ++sealed;
    }
    EXPECT_GE(sealed, 6) << "finished records hold a (sealed) response";
    scan_records(records, "after the workload");
    ASSERT_FALSE(w.records_in_flight.empty());
    EXPECT_TRUE(std::any_of(w.records_in_flight.begin(), w.records_in_flight.end(),
                            [](const DumpRow& r) { return Column(r, "state") == "PROCESSING"; }))
        << "a record was read while its payment was in flight";
    scan_records(w.records_in_flight, "while a payment was in flight");

    if (redis_port_ == 0) return;
    std::vector<RedisEntry> entries = DumpRedis(redis_port_);
    const std::size_t after = entries.size();
    entries.insert(entries.end(), w.redis_in_flight.begin(), w.redis_in_flight.end());
    int cached = 0;
    int markers = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const RedisEntry& e = entries[i];
      const std::string when = i < after ? "after the workload" : "while a payment was in flight";
      if (auto hits = Find(e.key, w.needles); !hits.empty()) {
        ADD_FAILURE() << "Redis key (" << when << ") " << Printable(e.key)
                      << " holds plaintext:\n  " << Join(hits);
      }
      std::string value = e.value;
      constexpr std::string_view kRecordPrefix = "idem:rec:";
      if (e.key.rfind("idem:rec:lock:", 0) == 0) {
        ++markers;
      } else if (e.key.rfind(kRecordPrefix, 0) == 0) {
        ++cached;
        auto it = resource_of.find(Lower(e.key.substr(kRecordPrefix.size())));
        if (it != resource_of.end() && !it->second.empty()) {
          const std::size_t at = value.find(it->second);
          if (at != std::string::npos) value.erase(at, it->second.size());
        }
      }
      if (auto hits = Find(value, w.needles); !hits.empty()) {
        ADD_FAILURE() << "Redis value (" << when << ", " << e.type << ") of " << Printable(e.key)
                      << " holds plaintext:\n  " << Join(hits);
      }
    }
    EXPECT_GE(cached, 3) << "replays were cached in Redis";
    EXPECT_GE(markers, 1) << "the in-flight payment's marker was seen";
  }

  // Stops idemd with SIGTERM (it drains and logs its last lines) and returns its log.
  std::string StopIdemdAndReadLog() {
    idemd_->Signal(SIGTERM);
    EXPECT_TRUE(idemd_->Wait(10s).has_value());
    idemd_.reset();
    return ReadFile(dir_.File("idemd.log"));
  }

  static constexpr const char* kWrongKey = "dev-acme-mallory-0badc0ffee5eed";
  static constexpr const char* kNearMissKey = "dev-acme-alice-7f3c9a1f";

  std::string hmac_hex_;
  std::string seal_hex_;
  std::string store_url_;  // where the records are; set by each test
  uint16_t redis_port_ = 0;
  std::string redis_url_;
  std::optional<testing::ChildProcess> redis_;
};

// ---- 1. Nothing in plaintext at rest -----------------------------------------------------------

TEST_F(SecurityTest, NothingInPlaintextAtRestInSqliteOrRedis) {
  if (!StartRedis()) return;
  store_url_ = "sqlite://" + dir_.File("idem.db");
  StartIdemd(Roomy({.redis_url = redis_url_}));
  const Workload w = RunWorkload();
  ExpectNothingAtRest(w);
}

class SecurityPostgresTest : public SecurityTest {
 public:
  void SetUp() override {
    IDEM_NEED_SERVICE(PostgresServerUrl(), "IDEM_TEST_PG_URL");
    SecurityTest::SetUp();
  }
};

TEST_F(SecurityPostgresTest, NothingInPlaintextAtRestInPostgresOrRedis) {
  if (!StartRedis()) return;
  store_url_ = FreshPostgresStoreUrl();
  StartIdemd(Roomy({.store_url = store_url_, .redis_url = redis_url_}));
  const Workload w = RunWorkload();
  ExpectNothingAtRest(w);
}

// ---- 2. No secret, API key or idempotency key in logs ------------------------------------------

TEST_F(SecurityTest, LogsCarryNoSecretsApiKeysIdempotencyKeysOrBodies) {
  store_url_ = "sqlite://" + dir_.File("idem.db");
  Workload w = RunWorkload();
  // 401s: a wrong key, a near miss of a real one, a real one in the wrong scheme, on every route.
  const std::string tag = RandomHex(4);
  const std::string k401 = "sec-log-unauthorized-" + tag;
  w.keys.push_back(k401);
  int unauthorized = 0;
  for (const char* wrong : {kWrongKey, kNearMissKey}) {
    EXPECT_EQ(Pay(k401, PaymentBody("ORD-SECRET-MARKER-401", "10.00", "CNY"), wrong).status, 401);
    EXPECT_EQ(Get("/v1/payments/" + w.payment_ids[0], wrong).status, 401);
    EXPECT_EQ(Get("/v1/operations/" + w.keys[0], wrong).status, 401);
    unauthorized += 3;
  }
  http::Request basic{"GET", "/v1/operations/" + w.keys[0], {}, {}};
  basic.headers.Set("Authorization", std::string("Basic ") + kBob);
  EXPECT_EQ(Send(std::move(basic)).status, 401);
  ++unauthorized;
  // 400s: malformed keys, which must not be logged either.
  const std::string bad_key = "sec log bad key " + tag;
  EXPECT_EQ(Pay(bad_key, PaymentBody("ORD-SECRET-MARKER-400", "10.00", "CNY")).status, 400);
  w.needles.push_back({"a malformed idempotency key", bad_key});
  // Reads of other principals' records and a 404 for an unknown payment.
  EXPECT_EQ(Get("/v1/operations/" + w.keys[0], kCarol).status, 404);
  EXPECT_EQ(Get("/v1/payments/pay_" + RandomHex(12), kBob).status, 404);
  w.needles.push_back({"the idempotency key of the 401s", k401});

  // idemctl against idemd and on its store: payments (one 422), reads, a 401, a 404, an inspect.
  const std::string url = "http://127.0.0.1:" + std::to_string(idemd_url_.port);
  const std::string kctl = "sec-ctl-key-" + tag;
  w.needles.push_back({"idemctl's idempotency key", kctl});
  auto [paid, paid_out] =
      RunIdemctl({"pay", "--url", url, "--api-key", kAlice, "--order", "ORD-SECRET-MARKER-CTL",
                  "--amount", "42.42", "--currency", "CNY", "--key", kctl});
  EXPECT_EQ(paid, 0) << paid_out;
  EXPECT_EQ(
      RunIdemctl({"pay", "--url", url, "--api-key", kAlice, "--order", "ORD-SECRET-MARKER-CTL",
                  "--amount", "42.43", "--currency", "CNY", "--key", kctl})
          .first,
      3);
  EXPECT_EQ(
      RunIdemctl({"payment", "get", w.payment_ids[0], "--url", url}, {{"IDEM_API_KEY", kAlice}})
          .first,
      0);
  EXPECT_EQ(RunIdemctl({"operation", "get", kctl, "--url", url, "--api-key", kAlice}).first, 0);
  EXPECT_EQ(RunIdemctl({"operation", "get", kctl, "--url", url, "--api-key", kBob}).first, 3);
  EXPECT_EQ(
      RunIdemctl({"payment", "get", w.payment_ids[0], "--url", url, "--api-key", kWrongKey}).first,
      3);
  EXPECT_EQ(RunIdemctl({"record", "inspect", "--config", dir_.File("idemd.toml"), "--tenant",
                        "acme", "--user", "alice", "--key", kctl, "--show-response"})
                .first,
            0);

  // idemd's log: every line, the drain's included.
  const std::string log = StopIdemdAndReadLog();
  int lines_401 = 0;
  int lines_422 = 0;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("\"status\":401") != std::string::npos) ++lines_401;
    if (line.find("\"status\":422") != std::string::npos) ++lines_422;
  }
  EXPECT_GE(lines_401, unauthorized) << "the log has a line per request:\n" << log;
  EXPECT_GE(lines_422, 2) << log;
  // Every line carries its time to the millisecond, which may be a payment's created_at or hold
  // an amount's digits ("12:39:55.556Z" holds 55.55): times are no secret, so each line's own is
  // left out of the search, and so is the created_at needle (it stays for the stores at rest).
  std::vector<Needle> log_needles = w.needles;
  std::erase_if(log_needles, [](const Needle& n) { return n.what.ends_with(" created_at"); });
  std::string untimed;
  std::istringstream timed(log);
  for (std::string line; std::getline(timed, line);) {
    constexpr std::string_view kTime = "{\"time\":\"";
    if (line.starts_with(kTime)) {
      const std::size_t end = line.find('"', kTime.size());
      if (end != std::string::npos) line.erase(kTime.size(), end - kTime.size());
    }
    untimed += line + "\n";
  }
  if (auto hits = Find(untimed, log_needles); !hits.empty()) {
    ADD_FAILURE() << "idemd.log (" << dir_.File("idemd.log") << "):\n  " << Join(hits);
  }

  // idemctl's standard error (the fixture keeps one file per run). `pay` tells the user the key it
  // used — "Idempotency-Key: K (N attempts)", documented in the README — so that line may hold
  // the idempotency key; nothing else may.
  static const std::regex kKeyLine(R"(^Idempotency-Key: \S+ \(\d+ attempts?\)$)");
  int files = 0;
  int key_lines = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("idemctl-", 0) != 0) continue;
    ++files;
    std::istringstream err(ReadFile(entry.path().string()));
    for (std::string line; std::getline(err, line);) {
      std::vector<Needle> needles = w.needles;
      if (std::regex_match(line, kKeyLine)) {
        ++key_lines;
        std::erase_if(needles, [&](const Needle& n) { return n.bytes == kctl; });
      }
      if (auto hits = Find(line, needles); !hits.empty())
        ADD_FAILURE() << name << ":\n  " << Join(hits);
    }
  }
  EXPECT_EQ(files, 7);
  EXPECT_EQ(key_lines, 2) << "pay printed the key it used";
}

// ---- 3. Another principal's credentials read and replay nothing --------------------------------

// idemd --check-config prints the configuration in effect for an operator to read or paste: never
// a secret, never a password of a URL, whether it came from the file or the environment.
TEST_F(SecurityTest, CheckConfigPrintsTheEffectiveConfigWithoutSecretsOrPasswords) {
  const std::string config = dir_.File("check.toml");
  WriteConfig(config, {.redis_url = "redis://:redis-pw-7f3e@127.0.0.1:6379/2"});
  auto run = [&](std::vector<std::string> argv, std::map<std::string, std::string> env) {
    argv.insert(argv.begin(), IDEMD_PATH);
    env["IDEM_SECRETS"] = secrets_toml_;
    auto p = testing::ChildProcess::Spawn(argv, env, dir_.path().string(), dir_.File("check.log"));
    EXPECT_TRUE(p.has_value());
    std::string out;
    while (auto line = p->WaitForLine("", 10s)) out += *line + "\n";
    auto status = p->Wait(10s);
    return std::pair{status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, out};
  };
  const auto [status, printed] =
      run({"--config", config, "--check-config"},
          {{"IDEMD_STORE_URL", "postgresql://idem:pg-pw-91c2@db.internal/idem"},
           {"IDEMD_PROVIDER_TIMEOUT_MS", "1200"}});
  EXPECT_EQ(status, 0) << printed;
  EXPECT_NE(printed.find("url = 'postgresql://idem:REDACTED@db.internal/idem'"), std::string::npos)
      << "the environment's store URL, redacted:\n"
      << printed;
  EXPECT_NE(printed.find("url = 'redis://:REDACTED@127.0.0.1:6379/2'"), std::string::npos)
      << printed;
  EXPECT_NE(printed.find("timeout_ms = 1200"), std::string::npos) << printed;
  std::vector<Needle> needles = CredentialNeedles();
  needles.push_back({"the store's password", "pg-pw-91c2"});
  needles.push_back({"Redis's password", "redis-pw-7f3e"});
  const std::vector<std::string> hits = Find(printed, needles);
  EXPECT_TRUE(hits.empty()) << Join(hits);

  const auto [bad_status, bad_printed] =
      run({"--config", config, "--check-config"}, {{"IDEMD_STORE_POOL_SIZE", "0"}});
  EXPECT_EQ(bad_status, 1) << "an invalid config fails the check";
  EXPECT_EQ(bad_printed, "") << "and prints nothing to use";

  const auto [version_status, version] = run({"--version"}, {});
  EXPECT_EQ(version_status, 0);
  EXPECT_TRUE(std::regex_search(version, std::regex("^idemd [0-9]+\\.[0-9]+\\.[0-9]+\n$")))
      << version;

  // --help is the manual page's source (packaging/man): every flag, the environment, signals.
  const auto [help_status, help] = run({"--help"}, {});
  EXPECT_EQ(help_status, 0);
  for (const char* named :
       {"--config FILE", "--check-config", "--listen ADDRESS:PORT", "--store URL", "--redis URL",
        "--provider URL", "--version", "IDEM_SECRETS", "IDEMD_<SECTION>_<KEY>", "SIGTERM", "SIGHUP",
        "Exit status:"}) {
    EXPECT_NE(help.find(named), std::string::npos) << named << " is not in --help:\n" << help;
  }
}

TEST_F(SecurityTest, OtherPrincipalsReadAndReplayNothing) {
  if (!StartRedis()) return;  // replays served from the cache and markers too
  store_url_ = "sqlite://" + dir_.File("idem.db");
  StartIdemd(Roomy({.redis_url = redis_url_}));
  const std::string tag = RandomHex(4);
  const std::string order = "ORD-XP-A-" + tag;
  const std::string k1 = "sec-xp-paid-" + tag;
  const std::string b1 = Body(order, "\"4321.99\"");
  http::Response mine = Pay(k1, b1);
  ASSERT_EQ(mine.status, 201) << mine.body;
  ASSERT_EQ(Pay(k1, b1).headers.Get("idempotent-replayed").value_or(""), "true");  // cached
  const std::string id = Str(mine, "id");
  const std::string charge = Str(mine, "provider_charge_id");
  ASSERT_FALSE(id.empty() || charge.empty()) << mine.body;
  http::Response read = Get("/v1/payments/" + id);
  ASSERT_EQ(read.status, 200);
  ASSERT_EQ(Get("/v1/operations/" + k1).status, 200);
  Fault(R"({"fault":"decline","times":1})");
  const std::string k2 = "sec-xp-declined-" + tag;
  const std::string b2 = Body("ORD-XP-D-" + tag, "\"77.77\"");
  ASSERT_EQ(Pay(k2, b2).status, 402);
  ASSERT_EQ(Pay(k2, b2).headers.Get("idempotent-replayed").value_or(""), "true");

  // Nothing of alice's payment in an answer to someone else: body or any header.
  // (`sent_order`: the request carried alice's order number itself.)
  auto leaks = [&](const http::Response& r, bool other_tenant, bool sent_order = false) {
    std::string all = r.body;
    for (const auto& [n, v] : r.headers.fields) all += "\n" + n + ": " + v;
    std::vector<Needle> needles = {
        {"alice's payment id", id}, {"alice's charge id", charge}, {"alice's user name", "alice"}};
    if (!sent_order) needles.push_back({"alice's order", order});
    if (other_tenant) needles.push_back({"alice's tenant", "acme"});
    return Find(all, needles);
  };
  auto header_names = [](const http::Response& r) {
    std::set<std::string> names;
    for (const auto& [n, v] : r.headers.fields) {
      if (n != "date" && n != "x-request-id") names.insert(n);
    }
    return names;
  };

  // GET /v1/payments/{id}: another tenant's payment is 404, exactly as an unknown one.
  http::Response theirs = Get("/v1/payments/" + id, kCarol);
  http::Response unknown = Get("/v1/payments/pay_" + RandomHex(12), kCarol);
  EXPECT_EQ(theirs.status, 404);
  EXPECT_EQ(theirs.body, unknown.body);
  EXPECT_EQ(header_names(theirs), header_names(unknown));
  EXPECT_EQ(leaks(theirs, true), std::vector<std::string>{});
  // Payments belong to the tenant (CONTRACT.md: "200, or 404 — also for another tenant's
  // payment"; one payment per tenant and order): bob, alice's colleague, reads it.
  http::Response colleague = Get("/v1/payments/" + id, kBob);
  EXPECT_EQ(colleague.status, 200);
  EXPECT_EQ(colleague.body, read.body);

  // GET /v1/operations/{key}: the caller's own record only; another's key is 404, exactly as a
  // key never used, without the record's expiry.
  for (const char* other : {kBob, kCarol}) {
    for (const std::string& k : {k1, k2}) {
      http::Response op = Get("/v1/operations/" + k, other);
      http::Response never = Get("/v1/operations/sec-xp-never-" + RandomHex(4), other);
      EXPECT_EQ(op.status, 404) << k;
      EXPECT_EQ(op.body, never.body);
      EXPECT_EQ(header_names(op), header_names(never));
      EXPECT_FALSE(op.headers.Get("idempotency-key-expires").has_value());
      EXPECT_EQ(leaks(op, other == kCarol), std::vector<std::string>{});
    }
  }

  // POST with alice's key and body under carol's credentials: a new operation of globex, never
  // alice's stored answer.
  http::Response carol_pays = Pay(k1, b1, kCarol);
  EXPECT_EQ(carol_pays.status, 201) << carol_pays.body;
  EXPECT_NE(carol_pays.body, mine.body);
  EXPECT_FALSE(carol_pays.headers.Get("idempotent-replayed").has_value());
  EXPECT_EQ(leaks(carol_pays, true, true), std::vector<std::string>{});
  http::Response carol_declined = Pay(k2, b2, kCarol);
  EXPECT_EQ(carol_declined.status, 201) << "executed for carol, not alice's 402 replayed";
  EXPECT_FALSE(carol_declined.headers.Get("idempotent-replayed").has_value());
  EXPECT_EQ(leaks(carol_declined, true), std::vector<std::string>{});

  // Under bob's: a new operation of bob's too. It meets the tenant's order, so the contract's
  // row "already paid under another key" answers (200 with the tenant's payment) — not alice's
  // 201 replayed; for the declined order, 409 order-conflict — not alice's 402 replayed.
  http::Response bob_pays = Pay(k1, b1, kBob);
  EXPECT_EQ(bob_pays.status, 200) << bob_pays.body;
  EXPECT_FALSE(bob_pays.headers.Get("idempotent-replayed").has_value());
  http::Response bob_declined = Pay(k2, b2, kBob);
  EXPECT_EQ(bob_declined.status, 409) << bob_declined.body;
  EXPECT_FALSE(bob_declined.headers.Get("idempotent-replayed").has_value());
  EXPECT_EQ(Str(bob_declined, "type"), "urn:idem:problem:order-conflict");
  // Each has a record of their own under the key; alice's is unchanged.
  EXPECT_EQ(Int(Get("/v1/operations/" + k1, kBob), "status_code"), 200);
  EXPECT_EQ(Int(Get("/v1/operations/" + k1, kCarol), "status_code"), 201);
  EXPECT_EQ(Int(Get("/v1/operations/" + k1), "status_code"), 201);
  EXPECT_EQ(Pay(k1, b1).body, mine.body);

  // Another principal reusing the key with another body is a new operation, never 422: the
  // answer must not tell whether someone else used the key.
  for (const char* other : {kBob, kCarol}) {
    const std::string k3 = "sec-xp-reused-" + RandomHex(4);
    ASSERT_EQ(Pay(k3, Body("ORD-XP-K3-" + RandomHex(4))).status, 201);
    http::Response reused = Pay(k3, Body("ORD-XP-K3-OTHER-" + RandomHex(4)), other);
    EXPECT_EQ(reused.status, 201) << reused.body;
    EXPECT_EQ(leaks(reused, other == kCarol), std::vector<std::string>{});
  }

  // While alice's payment runs (its marker in Redis, its record PROCESSING), the same key under
  // other credentials is not "in progress": bob's other order and carol's same body execute.
  Fault(R"({"fault":"slow","delay_ms":1200,"times":1})");  // within the provider timeout
  const std::string k4 = "sec-xp-running-" + tag;
  const std::string b4 = Body("ORD-XP-RUN-" + tag);
  http::Response running;
  std::thread executor([&] { running = Pay(k4, b4); });
  std::this_thread::sleep_for(300ms);
  http::Response bob_running = Pay(k4, Body("ORD-XP-RUN-BOB-" + tag), kBob);
  http::Response carol_running = Pay(k4, b4, kCarol);
  http::Response bob_op = Get("/v1/operations/" + k4, kBob);
  executor.join();
  EXPECT_EQ(running.status, 201);
  EXPECT_EQ(bob_running.status, 201) << bob_running.body;
  EXPECT_EQ(carol_running.status, 201) << carol_running.body;
  EXPECT_EQ(Int(bob_op, "status_code"), 201) << "bob sees his own record";
  const std::string running_id = Str(running, "id");
  ASSERT_FALSE(running_id.empty());
  for (const http::Response* r : {&bob_running, &carol_running}) {
    EXPECT_EQ(r->body.find(running_id), std::string::npos);
  }
}

// ---- 4. Payment ids are unguessable ------------------------------------------------------------

TEST_F(SecurityTest, PaymentIdsAreRandomNotCounted) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 25;
  std::vector<std::string> ids;
  Mutex mu;
  const std::string tag = RandomHex(4);
  // Two runs of idemd on the same store: a seeded or counting generator repeats after a restart.
  for (int run = 0; run < 2; ++run) {
    if (run == 1) StartIdemd();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, run, t] {
        for (int i = 0; i < kPerThread; ++i) {
          const std::string n =
              std::to_string(run) + "-" + std::to_string(t) + "-" + std::to_string(i) + "-" + tag;
          http::Response r = Pay("sec-ids-" + n, Body("ORD-IDS-" + n), t % 2 ? kCarol : kAlice);
          EXPECT_EQ(r.status, 201) << r.body;
          if (r.status != 201) continue;
          const std::string id = Str(r, "id");
          EXPECT_EQ(r.headers.Get("location").value_or(""), "/v1/payments/" + id);
          MutexLock lock(mu);
          ids.push_back(id);
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  ASSERT_EQ(ids.size(), 200u);
  static const std::regex kShape("pay_[0-9a-f]{24,}");
  std::set<std::string> distinct;
  std::set<std::string> prefixes;
  for (const std::string& id : ids) {
    EXPECT_TRUE(std::regex_match(id, kShape)) << id << ": pay_ and at least 96 bits in hex";
    distinct.insert(id);
    prefixes.insert(id.substr(4, 4));
  }
  EXPECT_EQ(distinct.size(), ids.size()) << "every id differs";
  EXPECT_GT(prefixes.size(), 100u) << "the first 16 bits vary as random bits do";
  // No two ids share a long run of leading or trailing digits, as ids counted up (in any part)
  // would: for 200 random ids, 8 equal hex digits happen with probability ~5e-6.
  auto longest_common = [](std::vector<std::string> s) {
    std::sort(s.begin(), s.end());
    std::size_t longest = 0;
    for (std::size_t i = 1; i < s.size(); ++i) {
      std::size_t n = 0;
      while (n < s[i].size() && n < s[i - 1].size() && s[i][n] == s[i - 1][n]) ++n;
      longest = std::max(longest, n);
    }
    return longest;
  };
  std::vector<std::string> digits;
  std::vector<std::string> reversed;
  for (const std::string& id : distinct) {
    digits.push_back(id.substr(4));
    reversed.emplace_back(id.rbegin(), id.rend() - 4);
  }
  EXPECT_LT(longest_common(digits), 8u) << "a common prefix";
  EXPECT_LT(longest_common(reversed), 8u) << "a common suffix";
}

// ---- 5. Key flooding ---------------------------------------------------------------------------

TEST_F(SecurityTest, KeyFloodIsThrottledWithoutHurtingOthers) {
  constexpr int kRetained = 20;
  StartIdemd({.extra_idempotency = "max_retained = 20\nmax_processing = 5"});
  const std::string tag = RandomHex(4);
  std::atomic<bool> stop{false};
  std::atomic<int> flood_429{0};
  std::atomic<int> flood_201{0};
  std::atomic<int> sent{0};
  Mutex mu;
  std::vector<std::string> odd;  // anything but 201 / 429, or a 429 without Retry-After
  std::vector<std::string> flood_keys;
  std::vector<std::thread> flooders;
  for (int t = 0; t < 4; ++t) {
    flooders.emplace_back([&, t] {
      for (int i = 0; !stop; ++i) {
        const std::string n = std::to_string(t) + "-" + std::to_string(i) + "-" + tag;
        const std::string key = "sec-flood-" + n;
        http::Response r = Pay(key, Body("ORD-FLOOD-" + n));
        ++sent;
        MutexLock lock(mu);
        if (r.status == 201) {
          ++flood_201;
          flood_keys.push_back(key);
        } else if (r.status == 429) {
          ++flood_429;
          const std::string after(r.headers.Get("retry-after").value_or(""));
          if (after.empty() || after.find_first_not_of("0123456789") != std::string::npos ||
              Str(r, "type") != "urn:idem:problem:quota-exceeded") {
            odd.push_back("429 with Retry-After '" + after + "': " + r.body);
          }
        } else {
          odd.push_back(std::to_string(r.status) + ": " + r.body);
        }
      }
    });
  }
  // Once the flood is over its quota, the others pay, all of them, while it goes on.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (flood_429 == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_GT(flood_429, 0) << "the flood was throttled";
  std::vector<std::thread> others;
  std::atomic<int> others_201{0};
  std::vector<std::string> others_failed;
  struct Other {
    const char* api_key;
    const char* name;
    int count;
  };
  const int sent_before = sent;
  for (const Other& o : {Other{kBob, "bob", 10}, Other{kCarol, "carol", 5}}) {
    others.emplace_back([&, api_key = o.api_key, name = o.name, count = o.count] {
      for (int i = 0; i < count; ++i) {
        const std::string n = std::string(name) + "-" + std::to_string(i) + "-" + tag;
        http::Response r = Pay("sec-other-" + n, Body("ORD-OTHER-" + n), api_key);
        if (r.status == 201) {
          ++others_201;
        } else {
          MutexLock lock(mu);
          others_failed.push_back(std::string(name) + ": " + std::to_string(r.status) + " " +
                                  r.body);
        }
      }
    });
  }
  for (auto& t : others) t.join();
  const int sent_during = sent - sent_before;
  stop = true;
  for (auto& t : flooders) t.join();
  EXPECT_EQ(others_201, 15);
  EXPECT_EQ(others_failed, std::vector<std::string>{});
  EXPECT_EQ(odd, std::vector<std::string>{});
  EXPECT_GT(sent_during, 0) << "the flood went on meanwhile";
  EXPECT_LE(flood_201, kRetained) << "at most max_retained keys of the flood were taken";
  EXPECT_GT(flood_201, 0);
  EXPECT_EQ(TotalCharges(), flood_201 + 15) << "a 429 charges nothing";
  // Over its quota, the flooder's own retries still replay.
  ASSERT_FALSE(flood_keys.empty());
  http::Response again = Pay(flood_keys[0], Body("ORD-FLOOD-" + flood_keys[0].substr(10)));
  EXPECT_EQ(again.status, 201) << again.body;
  EXPECT_EQ(again.headers.Get("idempotent-replayed").value_or(""), "true");
  EXPECT_EQ(Pay("sec-flood-after-" + tag, Body("ORD-FLOOD-AFTER-" + tag)).status, 429);
  std::printf("flood: %d requests, %d x 201, %d x 429\n", sent.load(), flood_201.load(),
              flood_429.load());
}

}  // namespace
}  // namespace idem::itest
