// src/store/redis/redis_cache_itest.cc — the store contract suite on Redis + SQLite and Redis +
// PostgreSQL (services from scripts/with-services), and the cache's own rules: it serves warm
// replays, never outlives a record's expiry, and falls back to the database when Redis fails.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <thread>

#include "include/idem/engine.h"
#include "include/idem/store/postgres.h"
#include "include/idem/store/redis.h"
#include "include/idem/store/sqlite.h"
#include "testing/fakes.h"
#include "testing/store_contract.h"

namespace idem::testing {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

#define REQUIRE_SERVICE(var)                                       \
  do {                                                             \
    if (Env(var).empty()) {                                        \
      if (std::getenv("IDEM_REQUIRE_SERVICES") != nullptr) {       \
        FAIL() << var << " is not set (run through scripts/test)"; \
      }                                                            \
      GTEST_SKIP() << var << " is not set";                        \
    }                                                              \
  } while (false)

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
      "RedisOver" + backend, [=](StoreTestEnv& env) -> Result<std::unique_ptr<Store>> {
        if (Env("IDEM_TEST_REDIS_URL").empty()) {
          return MakeError(Errc::kUnavailable, "IDEM_TEST_REDIS_URL is not set");
        }
        PerTest& names = (*per_test)[&env];
        std::unique_ptr<Store> inner;
        if (backend == "Sqlite") {
          SqliteStoreOptions o;
          o.path = env.dir.File("idem.db");
          IDEM_ASSIGN_OR_RETURN(inner,
                                OpenSqliteStore(WithContractTables(o), env.clock, env.random));
        } else {
          if (Env("IDEM_TEST_PG_URL").empty()) {
            return MakeError(Errc::kUnavailable, "IDEM_TEST_PG_URL is not set");
          }
          PostgresStoreOptions o;
          o.conninfo = Env("IDEM_TEST_PG_URL");
          o.schema = names.schema;
          o.pool_size = 4;
          IDEM_ASSIGN_OR_RETURN(inner,
                                OpenPostgresStore(WithContractTables(o), env.clock, env.random));
        }
        return WrapWithRedisCache(std::move(inner), CacheOptions(names.prefix), env.clock);
      }};
}

INSTANTIATE_TEST_SUITE_P(Redis, StoreContractTest,
                         ::testing::Values(RedisOver("Sqlite"), RedisOver("Postgres")),
                         FactoryName);

class RedisCacheTest : public ::testing::Test {
 protected:
  // A SQLite store wrapped with the cache; `raw` keeps a handle on the database itself.
  void Open(RedisCacheOptions options) {
    SqliteStoreOptions o;
    o.path = env_.dir.File("idem.db");
    raw_ = std::move(*OpenSqliteStore(o, env_.clock, env_.random));
    cached_ = std::move(*WrapWithRedisCache(std::move(*OpenSqliteStore(o, env_.clock, env_.random)),
                                            options, env_.clock));
  }

  // A finished record for `key`, written through the database.
  ClaimSpec Finished(const std::string& key) {
    ClaimSpec spec;
    spec.scope = *Scope{"acme", "alice", "r", key}.Hash();
    spec.tenant = "acme";
    spec.user = "alice";
    spec.route = "r";
    spec.retention = Millis(60000);
    auto txn = std::move(*raw_->Begin());
    Record r = txn->Claim(spec)->record;
    EXPECT_TRUE(txn->Finish(spec.scope, r.lease, {RecordState::kSucceeded, 201, "sealed", "done"})
                    .has_value());
    EXPECT_TRUE(txn->Commit().has_value());
    return spec;
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
  RedisCacheOptions no_lru = CacheOptions(prefix);
  no_lru.lru_entries = 0;
  SqliteStoreOptions o;
  o.path = env_.dir.File("idem.db");
  auto other = std::move(*WrapWithRedisCache(
      std::move(*OpenSqliteStore(o, env_.clock, env_.random)), no_lru, env_.clock));
  auto from_redis = other->Read(spec.scope);
  ASSERT_TRUE(from_redis.has_value() && from_redis->has_value()) << "served by Redis";
  EXPECT_EQ((*from_redis)->state, RecordState::kSucceeded);
}

TEST_F(RedisCacheTest, ACachedRecordIsNeverUsedPastItsExpiry) {
  REQUIRE_SERVICE("IDEM_TEST_REDIS_URL");
  Open(CacheOptions(Fresh("idem:test:")));
  const ClaimSpec spec = Finished("expiry-key-0001");
  ASSERT_TRUE((*cached_->Read(spec.scope)).has_value());
  // Past the expiry the key starts a new operation in the database...
  env_.clock.Advance(Millis(60000));
  ClaimSpec next = spec;
  next.fingerprint.mac.fill(7);
  {
    auto txn = std::move(*raw_->Begin());
    Record old = *(*txn->Get(spec.scope));
    ASSERT_TRUE(txn->Reclaim(next, old.lease.fence).has_value());
    ASSERT_TRUE(txn->Commit().has_value());
  }
  // ...and the cache, which still holds the old finished record, must not answer for it.
  auto read = cached_->Read(spec.scope);
  ASSERT_TRUE(read.has_value() && read->has_value());
  EXPECT_EQ((*read)->state, RecordState::kProcessing);
  EXPECT_EQ((*read)->fingerprint.mac, next.fingerprint.mac);
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

TEST_F(RedisCacheTest, PreclaimMarksReleasesAndExpires) {
  REQUIRE_SERVICE("IDEM_TEST_REDIS_URL");
  Open(CacheOptions(Fresh("idem:test:")));
  const ScopeHash scope = *Scope{"acme", "alice", "r", "preclaim-key-1"}.Hash();
  InFlight mine;
  mine.fingerprint.mac.fill(3);
  mine.fingerprint.secret_id = 9;
  mine.lease_until = env_.clock.Now() + Millis(30000);
  mine.expires_at = env_.clock.Now() + Millis(60000);
  EXPECT_FALSE(cached_->Preclaim(scope, mine, Millis(30000)).has_value()) << "first takes it";
  auto held = cached_->Preclaim(scope, InFlight{}, Millis(30000));
  ASSERT_TRUE(held.has_value()) << "a second sees the holder";
  EXPECT_EQ(held->fingerprint.mac, mine.fingerprint.mac);
  EXPECT_EQ(held->fingerprint.secret_id, 9u);
  EXPECT_EQ(held->lease_until, mine.lease_until);
  EXPECT_EQ(held->expires_at, mine.expires_at);
  cached_->ReleasePreclaim(scope);
  EXPECT_FALSE(cached_->Preclaim(scope, mine, Millis(100)).has_value()) << "released";
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_FALSE(cached_->Preclaim(scope, mine, Millis(100)).has_value()) << "expired";
}

// The engine turns a concurrent duplicate away on the marker alone — here while the database is
// locked by another process and could not have answered — but never a request that differs.
TEST_F(RedisCacheTest, EngineTurnsAwayDuplicatesBeforeTheDatabase) {
  REQUIRE_SERVICE("IDEM_TEST_REDIS_URL");
  SqliteStoreOptions o;
  o.path = env_.dir.File("idem.db");
  o.busy_timeout = Millis(100);
  raw_ = std::move(*OpenSqliteStore(o, env_.clock, env_.random));
  cached_ = std::move(*WrapWithRedisCache(std::move(*OpenSqliteStore(o, env_.clock, env_.random)),
                                          CacheOptions(Fresh("idem:test:")), env_.clock));
  auto fingerprinter = std::move(*Fingerprinter::Create({{1, std::string(32, 'h')}}, 1));
  auto sealer = std::move(*Sealer::Create({{1, std::string(32, 's')}}, 1, env_.random));
  Engine engine(*cached_, *fingerprinter, *sealer, env_.clock);
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

  auto lock = raw_->Begin();  // another process holds the write lock now
  ASSERT_TRUE(lock.has_value());
  auto dup = engine.Start(policy, request(R"({"a":1})"));
  ASSERT_TRUE(dup.has_value()) << dup.error().message;
  EXPECT_EQ(dup->kind, Decision::Kind::kInProgress);
  EXPECT_EQ(dup->key_expires, first->key_expires);
  auto other = engine.Start(policy, request(R"({"a":2})"));
  ASSERT_FALSE(other.has_value()) << "a different request must reach the database";
  EXPECT_EQ(other.error().code, Errc::kUnavailable);
  lock->reset();

  // Once finished, the marker is gone and the retry is a replay.
  ASSERT_TRUE(engine.Finish(first->ticket, RecordState::kSucceeded, {201, {}, "done"}).has_value());
  auto replay = engine.Start(policy, request(R"({"a":1})"));
  ASSERT_TRUE(replay.has_value());
  EXPECT_EQ(replay->kind, Decision::Kind::kReplay);
}

TEST(RedisCacheOptions, RejectsMalformedUrls) {
  FakeClock clock;
  SeededRandom random(1);
  TempDir dir;
  SqliteStoreOptions o;
  o.path = dir.File("idem.db");
  for (const char* url : {"http://x:1", "redis://", "redis://host:port", "redis://h:999999"}) {
    RedisCacheOptions options;
    options.url = url;
    auto wrapped =
        WrapWithRedisCache(std::move(*OpenSqliteStore(o, clock, random)), options, clock);
    ASSERT_FALSE(wrapped.has_value()) << url;
    EXPECT_EQ(wrapped.error().code, Errc::kInvalidArgument);
  }
}

}  // namespace
}  // namespace idem::testing
