// testing/store_contract.h — the store contract suite: every Store backend passes it unchanged.
//
// A backend's test file instantiates it with one line:
//   INSTANTIATE_TEST_SUITE_P(Sqlite, StoreContractTest, ::testing::Values(SqliteFactory()), ...);
// Backend differences reach the suite only through StoreCapabilities.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "idem/store.h"
#include "testing/fakes.h"

namespace idem::testing {

// What one test gives a factory: its clock, its randomness and a directory of its own.
struct StoreTestEnv {
  FakeClock clock;
  SeededRandom random{42};
  TempDir dir;
};

// The business tables the suite writes to, in SQL every backend accepts: contract_business(k
// TEXT PRIMARY KEY, v TEXT NOT NULL), and contract_types with a column of each type SqlValue
// decodes. A factory applies them as the migrations of the application "contract".
const std::vector<Migration>& ContractMigrations();
inline constexpr const char* kContractAppName = "contract";

// `options` (a backend's options struct) with the suite's tables as its application migrations.
template <typename Options>
Options WithContractTables(Options options) {
  options.apps = {{kContractAppName, ContractMigrations()}};
  return options;
}

// The lease and retention of the suite's claims (Spec).
inline constexpr Millis kContractLease{30000};
inline constexpr Millis kContractRetention{3600 * 1000};

// A claim of `key` for tenant/user on route "payments.create", with a fingerprint of `fp_byte`s,
// the suite's lease and retention.
ClaimSpec ContractSpec(const std::string& key, const std::string& tenant = "acme",
                       const std::string& user = "alice", uint8_t fp_byte = 1);

struct StoreFactory {
  std::string name;
  // Opens a store on this test's data. Called again, it opens another instance (other
  // connections) on the same data, as a second process would.
  std::function<Result<std::unique_ptr<Store>>(StoreTestEnv& env)> open;
  // The environment variables naming the services `open` needs (IDEM_TEST_PG_URL, ...). When one
  // is not set, every test is skipped, or fails under IDEM_REQUIRE_SERVICES (testing/services.h).
  std::vector<std::string> services = {};
};

// gtest prints parameters of failing tests with this.
inline void PrintTo(const StoreFactory& factory, std::ostream* os) { *os << factory.name; }

class StoreContractTest : public ::testing::TestWithParam<StoreFactory> {
 protected:
  void SetUp() override;
  std::unique_ptr<Store> Open();

  StoreTestEnv env_;
  std::unique_ptr<Store> store_;
};

// Names parameterised instances after their factory.
std::string FactoryName(const ::testing::TestParamInfo<StoreFactory>& info);

}  // namespace idem::testing
