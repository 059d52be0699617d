// src/store/redis/redis_cache_itest.cc — the store contract suite on Redis + SQLite and Redis +
// PostgreSQL (services from scripts/with-services), and the cache's own rules: it serves warm
// replays, never outlives a record's expiry, and falls back to the database when Redis fails;
// and the in-flight markers: placed once, removed only by their owner, a hint to the engine.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <thread>

#include "idem/engine.h"
#include "idem/store/postgres.h"
#include "idem/store/redis.h"
#include "idem/store/sqlite.h"
#include "src/store/redis/redis_client.h"
#include "testing/fakes.h"
#include "testing/process.h"
#include "testing/services.h"
#include "testing/store_contract.h"

namespace idem::testing {
namespace {

std::string Env(const char* name) { return ServiceUrl(name); }

#define REQUIRE_SERVICE(variable) IDEM_NEED_SERVICE(Env(variable), variable)

std::string Fresh(const char* prefix) {
  static std::mt19937_64 rng(std::random_device{}());
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
  return buf;
}

RedisCacheOptions CacheOptions(const std::string& prefix) {
  RedisCacheOptions o;
  o.url = Env("IDEM_TEST_REDIS_URL");
  o.key_prefix = prefix;
  return o;
}

// Per test: one key prefix (and one PostgreSQL schema), shared by every instance it opens.
struct PerTest {
  std::string prefix = Fresh("idem:test:");
  std::string schema = Fresh("r");
};

StoreFactory RedisOver(const std::string& backend) {
  auto per_test = std::make_shared<std::map<const StoreTestEnv*, PerTest>>();
  return StoreFactory{
      "RedisOver" + backend,
      [=](StoreTestEnv& env) -> Result<std::unique_ptr<Store>> {
        PerTest& names = (*per_test)[&env];
        std::unique_ptr<Store> inner;
        if (backend == "Sqlite") {
          SqliteStoreOptions o;
          o.path = env.dir.File("idem.db");
          IDEM_ASSIGN_OR_RETURN(inner,
                                OpenSqliteStore(WithContractTables(o), env.clock, env.random));
        } else {
          PostgresStoreOptions o;
          o.conninfo = Env("IDEM_TEST_PG_URL");
          o.schema = names.schema;
          o.pool_size = 4;
          IDEM_ASSIGN_OR_RETURN(inner,
                                OpenPostgresStore(WithContractTables(o), env.clock, env.random));
        }
        return WrapWithRedisCache(std::move(inner), CacheOptions(names.prefix), env.clock);
      },
      backend == "Sqlite" ? std::vector<std::string>{"IDEM_TEST_REDIS_URL"}
                          : std::vector<std::string>{"IDEM_TEST_REDIS_URL", "IDEM_TEST_PG_URL"}};
}

INSTANTIATE_TEST_SUITE_P(Redis, StoreContractTest,
                         ::testing::Values(RedisOver("Sqlite"), RedisOver("Postgres")),
                         FactoryName);

class RedisCacheTest : public ::testing::Test {
 protected:
  // A SQLite store wrapped with the cache, and the markers of the same client; `raw` keeps a
  // handle on the database itself.
  void Open(RedisCacheOptions options, Millis busy_timeout = Millis(5000)) {
    SqliteStoreOptions o;
    o.path = env_.dir.File("idem.db");
    o.busy_timeout = busy_timeout;
    raw_ = std::move(*OpenSqliteStore(o, env_.clock, env_.random));
    RedisFastPath fast = std::move(*OpenRedisFastPath(
        std::move(*OpenSqliteStore(o, env_.clock, env_.random)), options, env_.clock, env_.random));
    cached_ = std::move(fast.store);
    markers_ = std::move(fast.markers);
  }

  // A finished record for `key`, written through the database.
  ClaimSpec Finished(const std::string& key, Millis retention = Millis(60000)) {
    ClaimSpec spec;
    spec.scope = *Scope{"acme", "alice", "r", key}.Hash();
    spec.tenant = "acme";
    spec.user = "alice";
    spec.route = "r";
    spec.retention = retention;
    auto txn = std::move(*raw_->Begin());
    Record r = txn->Claim(spec)->record;
    EXPECT_TRUE(txn->Finish(spec.scope, r.lease, {RecordState::kSucceeded, 201, "sealed", "done"})
                    .has_value());
    EXPECT_TRUE(txn->Commit().has_value());
    return spec;
  }

  // The cache of another process on the same database and Redis, its clock `clock`, with an LRU
  // of its own or none.
  std::unique_ptr<Store> OpenOther(const std::string& prefix, Clock& clock, bool lru = false) {
    RedisCacheOptions options = CacheOptions(prefix);
    if (!lru) options.lru_entries = 0;
    SqliteStoreOptions o;
    o.path = env_.dir.File("idem.db");
    return std::move(*WrapWithRedisCache(std::move(*OpenSqliteStore(o, env_.clock, env_.random)),
                                         options, clock));
  }

  void DeleteFromDatabase(const ScopeHash& scope) {
    auto txn = std::move(*raw_->Begin());
    ASSERT_TRUE(txn->Exec("DELETE FROM idem_records WHERE scope_hash = ?",
                          {Blob{std::string(reinterpret_cast<const char*>(scope.data()), 32)}})
                    .has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }

  StoreTestEnv env_;
  std::unique_ptr<Store> raw_;
  std::unique_ptr<Store> cached_;
  std::unique_ptr<InFlightMarkers> markers_;
};

// Raw access to the test's Redis, to look at markers without going through the code under test.
class RawRedis {
 public:
  RawRedis() {
    const std::string rest = Env("IDEM_TEST_REDIS_URL").substr(std::string("redis://").size());
    const std::size_t colon = rest.rfind(':');
    ctx_ = redisConnect(rest.substr(0, colon).c_str(), std::stoi(rest.substr(colon + 1)));
  }
  ~RawRedis() { redisFree(ctx_); }
  RawRedis(const RawRedis&) = delete;
  RawRedis& operator=(const RawRedis&) = delete;

  bool Exists(const std::string& key) {
    Reply r = Run({"EXISTS", key});
    return r != nullptr && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
  }
  void Set(const std::string& key, const std::string& value, Millis ttl) {
    Run({"SET", key, value, "PX", std::to_string(ttl.count())});
  }
  std::optional<std::string> Get(const std::string& key) {
    Reply r = Run({"GET", key});
    if (r == nullptr || r->type != REDIS_REPLY_STRING) return std::nullopt;
    return std::string(r->str, r->len);
  }

 private:
  struct ReplyFree {
    void operator()(redisReply* r) const { freeReplyObject(r); }
  };
  using Reply = std::unique_ptr<redisReply, ReplyFree>;
  Reply Run(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    return Reply(static_cast<redisReply*>(
        redisCommandArgv(ctx_, static_cast<int>(args.size()), argv.data(), lens.data())));
  }

  redisContext* ctx_;
};

TEST_F(RedisCacheTest, WarmReplaysAreServedFromTheLruAndFromRedis) {
  REQUIRE_SERVICE("IDEM_TEST_REDIS_URL");
  const std::string prefix = Fresh("idem:test:");
  Open(CacheOptions(prefix));
  const ClaimSpec spec = Finished("warm-key-0001");
  ASSERT_TRUE((*cached_->Read(spec.scope)).has_value());  // fills both caches
  DeleteFromDatabase(spec.scope);
  auto from_lru = cached_->Read(spec.scope);
  ASSERT_TRUE(from_lru.has_value() && from_lru->has_value()) << "served by the LRU";
  EXPECT_EQ((*from_lru)->response, "sealed");

  // A second process (no LRU) finds it in Redis.
  auto other = OpenOther(prefix, env_.clock);
  auto from_redis = other->Read(spec.scope);
  ASSERT_TRUE(from_redis.has_value() && from_redis->has_value()) << "served by Redis";
  EXPECT_EQ((*from_redis)->state, RecordState::kSucceeded);
}

TEST_F(RedisCacheTest, ACachedRecordIsNeverUsedPastItsExpiry) {
  REQUIRE_SERVICE("IDEM_TEST_REDIS_URL");
  const std::string prefix = Fresh("idem:test:");
  Open(CacheOptions(prefix));
  const Millis retention(400);
  const ClaimSpec spec = Finished("expiry-key-0001", retention);
  ASSERT_TRUE((*cached_->Read(spec.scope)).has_value());
  // An entry lives for what the store said the record had left, in real time, measured by
  // Redis and the monotonic clock: past the expiry the key starts a new operation in the
  // database...
  std::this_thread::sleep_for(retention + Millis(100));
  env_.clock.Advance(retention);
  ClaimSpec next = spec;
  next.fingerprint.mac.fill(7);
  {
    auto txn = std::move(*raw_->Begin());
    Record old = *(*txn->Get(spec.scope));
    ASSERT_TRUE(txn->Reclaim(next, old.lease.fence).has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  // ...and neither the LRU nor Redis, which held the old finished record, answers for it.
  auto read = cached_->Read(spec.scope);
  ASSERT_TRUE(read.has_value() && read->has_value());
  EXPECT_EQ((*read)->state, RecordState::kProcessing);
  EXPECT_EQ((*read)->fingerprint.mac, next.fingerprint.mac);
  auto other = OpenOther(prefix, env_.clock);
  read = other->Read(spec.scope);
  ASSERT_TRUE(read.has_value() && read->has_value());
  EXPECT_EQ((*read)->state, RecordState::kProcessing) << "Redis kept the entry past its expiry";
}

// A cached record comes back with the store's time moved on by the time it spent in the cache
// (Record::observed_at), the time the engine judges its expiry by: whatever an instance's wall
// clock says, a cache hit is live no longer than the store said it had left (2 % less:
// cache::kSlowClockPpm).
TEST_F(RedisCacheTest, ACacheHitCarriesTheStoresTimeMovedOn) {
  REQUIRE_SERVICE("IDEM_TEST_REDIS_URL");
  const std::string prefix = Fresh("idem:test:");
  Open(CacheOptions(prefix));
  const ClaimSpec spec = Finished("observed-key-0001");
  auto first = cached_->Read(spec.scope);
  ASSERT_TRUE(first.has_value() && first->has_value());
  EXPECT_EQ((*first)->observed_at, env_.clock.Now()) << "a miss is the store's own read";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto from_lru = cached_->Read(spec.scope);
  ASSERT_TRUE(from_lru.has_value() && from_lru->has_value());
  auto other = OpenOther(prefix, env_.clock);
  auto from_redis = other->Read(spec.scope);
  ASSERT_TRUE(from_redis.has_value() && from_redis->has_value());
  for (const Record* r : {&**from_lru, &**from_redis}) {
    const Millis moved = std::chrono::duration_cast<Millis>(r->observed_at - (*first)->observed_at);
    EXPECT_GE(moved, Millis(250)) << "the time in the cache was not counted";
    EXPECT_LT(moved, Millis(30000));
    EXPECT_GT(r->expires_at, r->observed_at);
  }
}

// An instance whose clock runs an hour behind the store's keeps no entry alive past its expiry:
// neither its LRU nor the Redis entry it wrote outlives what the store said the record had left.
TEST_F(RedisCacheTest, AClockRunningBehindKeepsNoEntryAlive) {
  REQUIRE_SERVICE("IDEM_TEST_REDIS_URL");
  const std::string prefix = Fresh("idem:test:");
  Open(CacheOptions(prefix));
  FakeClock behind(env_.clock.Now() - Millis(3'600'000));
  auto skewed = OpenOther(prefix, behind, /*lru=*/true);
  auto reader = OpenOther(prefix, behind);
  const Millis retention(400);
  const ClaimSpec spec = Finished("skew-key-0001", retention);
  ASSERT_TRUE((*skewed->Read(spec.scope)).has_value());  // cached by the skewed instance
  std::this_thread::sleep_for(retention + Millis(100));
  env_.clock.Advance(retention);
  DeleteFromDatabase(spec.scope);  // the sweeper's work, by the store's clock
  EXPECT_FALSE((*skewed->Read(spec.scope)).has_value()) << "the LRU served an expired record";
  EXPECT_FALSE((*reader->Read(spec.scope)).has_value()) << "Redis served an expired record";
}

TEST_F(RedisCacheTest, UnfinishedRecordsAreNotCached) {
  REQUIRE_SERVICE("IDEM_TEST_REDIS_URL");
  Open(CacheOptions(Fresh("idem:test:")));
  ClaimSpec spec;
  spec.scope = *Scope{"acme", "alice", "r", "running-key-1"}.Hash();
  spec.tenant = "acme";
  spec.user = "alice";
  spec.route = "r";
  {
    auto txn = std::move(*raw_->Begin());
    ASSERT_TRUE(txn->Claim(spec)->claimed);
    ASSERT_TRUE(txn->Commit().has_value());
  }
  ASSERT_TRUE((*cached_->Read(spec.scope)).has_value());
  DeleteFromDatabase(spec.scope);
  EXPECT_FALSE((*cached_->Read(spec.scope)).has_value()) << "a PROCESSING record was cached";
}

// A cache entry answers only for its own scope: another scope's record planted under a key (a
// bug, a copied entry, someone with access to Redis) is a miss, counted as a fallback, and is
// never kept in the LRU.
TEST_F(RedisCacheTest, ACachedRecordAnswersOnlyForItsOwnScope) {
  REQUIRE_SERVICE("IDEM_TEST_REDIS_URL");
  const std::string prefix = Fresh("idem:test:");
  std::atomic<int> fallbacks{0};
  RedisCacheOptions options = CacheOptions(prefix);
  options.on_fallback = [&] { ++fallbacks; };
  Open(options);
  const ClaimSpec x = Finished("scope-x-key-1");
  ASSERT_TRUE((*cached_->Read(x.scope)).has_value());  // X's entry is in Redis now
  RawRedis redis;
  const std::optional<std::string> entry = redis.Get(prefix + ToHex(x.scope));
  ASSERT_TRUE(entry.has_value());
  const ScopeHash y = *Scope{"acme", "alice", "r", "scope-y-key-1"}.Hash();
  redis.Set(prefix + ToHex(y), *entry, Millis(60000));

  for (bool lru : {true, false}) {
    RedisCacheOptions fresh = options;  // another process: nothing in its LRU yet
    fresh.lru_entries = lru ? 100 : 0;
    SqliteStoreOptions o;
    o.path = env_.dir.File("idem.db");
    auto other = std::move(*WrapWithRedisCache(
        std::move(*OpenSqliteStore(o, env_.clock, env_.random)), fresh, env_.clock));
    const int before = fallbacks.load();
    for (int i = 0; i < 2; ++i) {  // the second read would come from the LRU
      auto read = other->Read(y);
      ASSERT_TRUE(read.has_value()) << read.error().message;
      EXPECT_FALSE(read->has_value())
          << "Y has no record; X's was served for it (lru " << lru << ", read " << i << ")";
    }
    EXPECT_GE(fallbacks.load(), before + 1) << "the mismatch was not counted";
    auto own = other->Read(x.scope);
    ASSERT_TRUE(own.has_value() && own->has_value());
    EXPECT_EQ((*own)->scope, x.scope);
  }
}

TEST_F(RedisCacheTest, ARedisThatIsDownFallsBackToTheDatabase) {
  std::atomic<int> fallbacks{0};
  RedisCacheOptions options;
  options.url = "redis://127.0.0.1:1";  // nothing listens there
  options.lru_entries = 0;
  options.on_fallback = [&] { ++fallbacks; };
  Open(options);
  const ClaimSpec spec = Finished("down-key-0001");
  auto read = cached_->Read(spec.scope);
  ASSERT_TRUE(read.has_value()) << read.error().message;
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ((*read)->state, RecordState::kSucceeded);
  EXPECT_GE(fallbacks.load(), 1);
}

TEST_F(RedisCacheTest, MarkersArePlacedReleasedByTheirOwnerAndExpire) {
  REQUIRE_SERVICE("IDEM_TEST_REDIS_URL");
  const std::string prefix = Fresh("idem:test:");
  Open(CacheOptions(prefix));
  const ScopeHash scope = *Scope{"acme", "alice", "r", "preclaim-key-1"}.Hash();
  const std::string key = prefix + "lock:" + ToHex(scope);
  RawRedis redis;
  InFlight mine;
  mine.fingerprint.mac.fill(3);
  mine.fingerprint.secret_id = 9;
  mine.expires_at = env_.clock.Now() + Millis(60000);
  Placement first = markers_->Place(scope, mine, Millis(30000));
  ASSERT_TRUE(first.token.has_value()) << "first places it";
  EXPECT_FALSE(first.held.has_value());
  Placement second = markers_->Place(scope, InFlight{}, Millis(30000));
  EXPECT_FALSE(second.token.has_value());
  ASSERT_TRUE(second.held.has_value()) << "a second sees the holder";
  EXPECT_EQ(second.held->fingerprint.mac, mine.fingerprint.mac);
  EXPECT_EQ(second.held->fingerprint.secret_id, 9u);
  EXPECT_GT(second.held->lease_left, Millis(25000)) << "by Redis's clock";
  EXPECT_LE(second.held->lease_left, Millis(30000));
  EXPECT_EQ(second.held->expires_at, mine.expires_at);

  // Only the holder's token removes it; an identical marker placed again has another token.
  markers_->Release(scope, first.token->substr(0, first.token->size() - 1) + "x");
  EXPECT_TRUE(redis.Exists(key)) << "a wrong token released the marker";
  markers_->Release(scope, *first.token);
  EXPECT_FALSE(redis.Exists(key)) << "its own token did not";
  Placement again = markers_->Place(scope, mine, Millis(30000));
  ASSERT_TRUE(again.token.has_value());
  EXPECT_NE(*again.token, *first.token);
  markers_->Release(scope, *first.token);
  EXPECT_TRUE(redis.Exists(key)) << "a stale token released its successor's marker";
  markers_->Release(scope, *again.token);

  EXPECT_TRUE(markers_->Place(scope, mine, Millis(100)).token.has_value()) << "released";
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_TRUE(markers_->Place(scope, mine, Millis(100)).token.has_value()) << "expired";
}

// The engine turns a concurrent duplicate away on the marker alone — here while the database is
// locked by another process and could not have answered — but never a request that differs.
TEST_F(RedisCacheTest, EngineTurnsAwayDuplicatesBeforeTheDatabase) {
  REQUIRE_SERVICE("IDEM_TEST_REDIS_URL");
  Open(CacheOptions(Fresh("idem:test:")), Millis(100));
  auto fingerprinter = std::move(*Fingerprinter::Create({{1, std::string(32, 'h')}}, 1));
  auto sealer = std::move(*Sealer::Create({{1, std::string(32, 's')}}, 1, env_.random));
  Engine engine(*cached_, *fingerprinter, *sealer, env_.clock, markers_.get());
  RoutePolicy policy;
  policy.route = "payments.create";
  auto request = [](const char* body) {
    Request r;
    r.principal = {"acme", "alice"};
    r.key_header = "engine-dup-key-1";
    r.method = "POST";
    r.content_type = "application/json";
    r.body = body;
    return r;
  };
  auto first = engine.Start(policy, request(R"({"a":1})"));
  ASSERT_TRUE(first.has_value()) << first.error().message;
  ASSERT_EQ(first->kind, Decision::Kind::kExecute);
  EXPECT_TRUE(first->ticket.marker.has_value()) << "the executor holds its marker";

  auto lock = raw_->Begin();  // another process holds the write lock now
  ASSERT_TRUE(lock.has_value());
  // Past the snapshot read (which would answer both from the record): the marker decides.
  auto dup = engine.Start(policy, request(R"({"a":1})"), {}, nullptr, /*read_first=*/false);
  ASSERT_TRUE(dup.has_value()) << dup.error().message;
  EXPECT_EQ(dup->kind, Decision::Kind::kInProgress);
  EXPECT_EQ(dup->key_expires, first->key_expires);
  auto other = engine.Start(policy, request(R"({"a":2})"), {}, nullptr, /*read_first=*/false);
  ASSERT_FALSE(other.has_value()) << "a different request must reach the database";
  EXPECT_EQ(other.error().code, Errc::kUnavailable);
  lock->reset();

  // Once finished, the marker is gone and the retry is a replay.
  ASSERT_TRUE(engine.Finish(first->ticket, RecordState::kSucceeded, {201, {}, "done"}).has_value());
  auto replay = engine.Start(policy, request(R"({"a":1})"));
  ASSERT_TRUE(replay.has_value());
  EXPECT_EQ(replay->kind, Decision::Kind::kReplay);
}

// Only the request that placed a marker removes it: a request that differs (422), a duplicate
// that the database answered and the takeover loop's takeover leave a running executor's marker in
// place. (Before markers had owners, each of the three deleted it.)
TEST_F(RedisCacheTest, OnlyTheExecutorReleasesItsMarker) {
  REQUIRE_SERVICE("IDEM_TEST_REDIS_URL");
  const std::string prefix = Fresh("idem:test:");
  Open(CacheOptions(prefix));
  auto fingerprinter = std::move(*Fingerprinter::Create({{1, std::string(32, 'h')}}, 1));
  // Another instance already signs with the next secret (a rotation in progress): its duplicate
  // does not match the marker's fingerprint byte for byte, so the database answers it.
  auto rotated_fingerprinter =
      std::move(*Fingerprinter::Create({{1, std::string(32, 'h')}, {2, std::string(32, 'i')}}, 2));
  auto sealer = std::move(*Sealer::Create({{1, std::string(32, 's')}}, 1, env_.random));
  Engine engine(*cached_, *fingerprinter, *sealer, env_.clock, markers_.get());
  Engine rotated(*cached_, *rotated_fingerprinter, *sealer, env_.clock, markers_.get());
  RoutePolicy policy;
  policy.route = "payments.create";
  RawRedis redis;
  auto request = [](const std::string& key, const char* body) {
    Request r;
    r.principal = {"acme", "alice"};
    r.key_header = key;
    r.method = "POST";
    r.content_type = "application/json";
    r.body = body;
    return r;
  };
  auto marker_of = [&](const std::string& key) {
    return prefix + "lock:" + ToHex(*Scope{"acme", "alice", policy.route, key}.Hash());
  };
  // An executor of `key` holds the marker while `intrude` runs; it is still there afterwards,
  // and the executor's finish removes it.
  auto check = [&](const std::string& key, const std::function<void()>& intrude) {
    auto executor = engine.Start(policy, request(key, R"({"a":1})"));
    ASSERT_TRUE(executor.has_value()) << executor.error().message;
    ASSERT_EQ(executor->kind, Decision::Kind::kExecute);
    ASSERT_TRUE(redis.Exists(marker_of(key))) << "the executor placed its marker";
    intrude();
    EXPECT_TRUE(redis.Exists(marker_of(key)))
        << key << ": another request deleted the executor's marker";
    ASSERT_TRUE(
        engine.Finish(executor->ticket, RecordState::kSucceeded, {201, {}, "done"}).has_value());
    EXPECT_FALSE(redis.Exists(marker_of(key))) << key << ": the executor releases its own marker";
  };

  check("marker-mismatch-key", [&] {
    auto mismatch = engine.Start(policy, request("marker-mismatch-key", R"({"a":2})"));
    ASSERT_FALSE(mismatch.has_value());
    EXPECT_EQ(mismatch.error().code, Errc::kFingerprintMismatch);
  });
  check("marker-duplicate-key", [&] {
    auto duplicate = rotated.Start(policy, request("marker-duplicate-key", R"({"a":1})"));
    ASSERT_TRUE(duplicate.has_value()) << duplicate.error().message;
    EXPECT_EQ(duplicate->kind, Decision::Kind::kInProgress);
  });

  // The takeover loop takes a stalled execution over without a marker of its own; finishing it
  // must not delete the marker (here the stalled executor's, still in Redis).
  const std::string stalled_key = "marker-stalled-key";
  auto stalled = engine.Start(policy, request(stalled_key, R"({"a":1})"));
  ASSERT_TRUE(stalled.has_value() && stalled->kind == Decision::Kind::kExecute);
  env_.clock.Advance(policy.lease + Millis(1));
  auto stale = engine.ListStale(policy, 10);
  ASSERT_TRUE(stale.has_value());
  ASSERT_EQ(stale->size(), 1u);
  auto takeover = engine.TakeOver(policy, stale->at(0));
  ASSERT_TRUE(takeover.has_value()) << takeover.error().message;
  EXPECT_FALSE(takeover->marker.has_value());
  ASSERT_TRUE(engine.Finish(*takeover, RecordState::kSucceeded, {201, {}, "done"}).has_value());
  EXPECT_TRUE(redis.Exists(marker_of(stalled_key)))
      << "the reconciler deleted a marker it did not place";
}

// The rest period after a failure runs on the injected monotonic clock: no Redis call until it
// has passed (at its value minus 1 ms), calls again once it has. Needs no Redis: nothing listens.
TEST(RedisCacheOptions, RestsForRestAfterFailureByTheInjectedClock) {
  FakeClock clock;
  FakeMonotonicClock monotonic;
  SeededRandom random(1);
  TempDir dir;
  SqliteStoreOptions o;
  o.path = dir.File("idem.db");
  int fallbacks = 0;
  RedisCacheOptions options;
  options.url = "redis://127.0.0.1:1";  // nothing listens there
  options.lru_entries = 0;
  options.rest_after_failure = Millis(2500);
  options.monotonic = &monotonic;
  options.on_fallback = [&] { ++fallbacks; };
  auto cached = WrapWithRedisCache(std::move(*OpenSqliteStore(o, clock, random)), options, clock);
  ASSERT_TRUE(cached.has_value()) << cached.error().message;
  const ScopeHash scope = *Scope{"acme", "alice", "r", "rest-key-0001"}.Hash();
  ASSERT_TRUE((*cached)->Read(scope).has_value());
  EXPECT_EQ(fallbacks, 1) << "the first read tries Redis and falls back";
  monotonic.Advance(options.rest_after_failure - Millis(1));
  ASSERT_TRUE((*cached)->Read(scope).has_value());
  EXPECT_EQ(fallbacks, 1) << "still resting: Redis is not tried";
  monotonic.Advance(Millis(1));
  ASSERT_TRUE((*cached)->Read(scope).has_value());
  EXPECT_EQ(fallbacks, 2) << "rested: Redis is tried again";
}

TEST(RedisCacheOptions, RejectsMalformedUrls) {
  FakeClock clock;
  SeededRandom random(1);
  TempDir dir;
  SqliteStoreOptions o;
  o.path = dir.File("idem.db");
  for (const char* url : {"http://x:1", "redis://", "redis://host:port", "redis://h:999999",
                          "rediss://h:6380", "redis://user@h", "redis://h/db", "redis://h/1?x=1"}) {
    RedisCacheOptions options;
    options.url = url;
    auto wrapped =
        WrapWithRedisCache(std::move(*OpenSqliteStore(o, clock, random)), options, clock);
    ASSERT_FALSE(wrapped.has_value()) << url;
    EXPECT_EQ(wrapped.error().code, Errc::kInvalidArgument);
    auto fast =
        OpenRedisFastPath(std::move(*OpenSqliteStore(o, clock, random)), options, clock, random);
    ASSERT_FALSE(fast.has_value()) << url;
    EXPECT_EQ(fast.error().code, Errc::kInvalidArgument);
  }
}

TEST(RedisUrl, ReadsTheUserPasswordDatabaseAndAnIpv6Host) {
  using redis_internal::ParseRedisUrl;
  auto plain = ParseRedisUrl("redis://cache.internal");
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->host, "cache.internal");
  EXPECT_EQ(plain->port, 6379);
  EXPECT_EQ(plain->password, "");
  EXPECT_EQ(plain->database, 0);

  auto managed = ParseRedisUrl("redis://:s%40cret%2F1@10.0.0.7:6380/2");
  ASSERT_TRUE(managed.has_value()) << managed.error().message;
  EXPECT_EQ(managed->host, "10.0.0.7");
  EXPECT_EQ(managed->port, 6380);
  EXPECT_EQ(managed->user, "");
  EXPECT_EQ(managed->password, "s@cret/1") << "percent-decoded";
  EXPECT_EQ(managed->database, 2);

  auto acl = ParseRedisUrl("redis://idem:pw@[::1]:7000/");
  ASSERT_TRUE(acl.has_value()) << acl.error().message;
  EXPECT_EQ(acl->host, "::1") << "without brackets, as connecting takes it";
  EXPECT_EQ(acl->port, 7000);
  EXPECT_EQ(acl->user, "idem");
  EXPECT_EQ(acl->password, "pw");

  auto tls = ParseRedisUrl("rediss://cache:6380");
  ASSERT_FALSE(tls.has_value());
  EXPECT_NE(tls.error().message.find("TLS"), std::string::npos) << tls.error().message;
}

// A Redis that wants a password (an ACL user, as managed Redis services have) and a database
// number: with the URL's credentials the markers work and land in that database; with a wrong
// password every call falls back, and nothing is written.
TEST(RedisUrl, ConnectionsLogInAndSelectTheDatabase) {
  const uint16_t port = FreeLoopbackPort();
  TempDir dir;
  auto server =
      ChildProcess::Spawn({"/usr/bin/redis-server", "--bind", "127.0.0.1", "--port",
                           std::to_string(port), "--save", "", "--appendonly", "no", "--user",
                           "default", "off", "--user", "idem", "on", ">p@ss/word", "~*", "+@all"},
                          {}, dir.path().string(), dir.File("redis.log"));
  ASSERT_TRUE(server.has_value()) << server.error().message;
  ASSERT_TRUE(WaitForPort(port, std::chrono::seconds(10)));

  FakeClock clock;
  SeededRandom random(7);
  SqliteStoreOptions sqlite;
  sqlite.path = dir.File("idem.db");
  const ScopeHash scope = *Scope{"acme", "alice", "r", "auth-key-1"}.Hash();
  InFlight mine;
  mine.expires_at = clock.Now() + Millis(60000);
  std::vector<std::string> health;  // what on_health reported, in order
  auto open = [&](const std::string& url, int* fallbacks) {
    RedisCacheOptions options;
    options.url = url;
    options.timeout = Millis(1000);
    options.rest_after_failure = Millis(1);
    options.on_fallback = [fallbacks] { ++*fallbacks; };
    options.on_health = [&health](std::string_view failure) { health.emplace_back(failure); };
    auto fast = OpenRedisFastPath(std::move(*OpenSqliteStore(sqlite, clock, random)), options,
                                  clock, random);
    EXPECT_TRUE(fast.has_value()) << url;
    return std::move(fast->markers);
  };
  // What database 3 holds, looked at as the ACL user, without the code under test.
  auto keys_in_3 = [&]() -> long long {
    redisContext* c = redisConnect("127.0.0.1", port);
    auto* auth = static_cast<redisReply*>(redisCommand(c, "AUTH idem %s", "p@ss/word"));
    freeReplyObject(auth);
    auto* select = static_cast<redisReply*>(redisCommand(c, "SELECT 3"));
    freeReplyObject(select);
    auto* size = static_cast<redisReply*>(redisCommand(c, "DBSIZE"));
    const long long n = size != nullptr && size->type == REDIS_REPLY_INTEGER ? size->integer : -1;
    freeReplyObject(size);
    redisFree(c);
    return n;
  };

  const std::string base = "127.0.0.1:" + std::to_string(port) + "/3";
  int refused = 0;
  auto wrong = open("redis://idem:nope@" + base, &refused);
  EXPECT_FALSE(wrong->Place(scope, mine, Millis(30000)).token.has_value());
  EXPECT_EQ(refused, 1) << "a refused AUTH is a fallback";
  EXPECT_EQ(keys_in_3(), 0);
  ASSERT_EQ(health.size(), 1u) << "the failure is reported";
  EXPECT_NE(health[0].find("AUTH refused"), std::string::npos) << health[0];
  EXPECT_EQ(health[0].find("nope"), std::string::npos) << "the password is never in it";
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(wrong->Place(scope, mine, Millis(30000)).token.has_value());
  EXPECT_EQ(health.size(), 1u) << "reported once while it keeps failing";

  int fallbacks = 0;
  auto markers = open("redis://idem:p%40ss%2Fword@" + base, &fallbacks);
  auto placed = markers->Place(scope, mine, Millis(30000));
  ASSERT_TRUE(placed.token.has_value()) << "logged in";
  EXPECT_EQ(fallbacks, 0);
  EXPECT_EQ(keys_in_3(), 1) << "the marker is in database 3";
  EXPECT_TRUE(markers->Place(scope, mine, Millis(30000)).held.has_value());
  EXPECT_EQ(health.size(), 1u) << "a client that never failed reports nothing";

  // The refused password becomes valid: the failing client logs in and reports it.
  redisContext* admin = redisConnect("127.0.0.1", port);
  freeReplyObject(redisCommand(admin, "AUTH idem %s", "p@ss/word"));
  freeReplyObject(redisCommand(admin, "ACL SETUSER idem >nope"));
  redisFree(admin);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(wrong->Place(scope, mine, Millis(30000)).held.has_value());
  ASSERT_EQ(health.size(), 2u);
  EXPECT_EQ(health[1], "") << "answering again";
}

}  // namespace
}  // namespace idem::testing
