// testing/engine_fixture.h — a gtest fixture with an Engine over a real SQLite file in a fresh
// directory, fake clocks, seeded randomness and fixed test secrets: what a unit test of code over
// the engine needs (the engine itself, the idempotency filter, idemd's handler).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "idem/engine.h"
#include "idem/store/sqlite.h"
#include "testing/fakes.h"

namespace idem::testing {

class EngineFixture : public ::testing::Test {
 protected:
  // The store applies the migrations of `apps` (SchemaOptions::apps). Aborts the test binary if
  // the store or the secrets cannot be made: nothing else would run.
  explicit EngineFixture(std::vector<AppMigrations> apps = {}, uint64_t seed = 7) : random_(seed) {
    SqliteStoreOptions options;
    options.path = dir_.File("idem.db");
    options.apps = std::move(apps);
    auto store = OpenSqliteStore(options, clock_, random_);
    IDEM_CHECK(store.has_value());
    store_ = std::move(*store);
    fingerprinter_ = std::move(*Fingerprinter::Create({{1, std::string(32, 'h')}}, 1));
    sealer_ = std::move(*Sealer::Create({{1, std::string(32, 's')}}, 1, random_));
    engine_ = std::make_unique<Engine>(*store_, *fingerprinter_, *sealer_, clock_);
  }

  TempDir dir_;
  FakeClock clock_;
  FakeMonotonicClock monotonic_;
  SeededRandom random_;
  const Timestamp t0_ = clock_.Now();
  std::unique_ptr<Store> store_;
  std::unique_ptr<Fingerprinter> fingerprinter_;
  std::unique_ptr<Sealer> sealer_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace idem::testing
