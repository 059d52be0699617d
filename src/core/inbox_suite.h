// src/core/inbox_suite.h — the Inbox's and the outbox's tests over every SQL store: the suite
// (inbox_test.cc) is an object library, and each backend's test binary instantiates it with one
// line, as the store contract suite is instantiated (testing/store_contract.h).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "idem/engine.h"
#include "idem/inbox.h"
#include "idem/store.h"
#include "testing/fakes.h"

namespace idem::testing {

// The business tables of the suite's handlers, applied as the migrations of the application
// "inbox_test": inbox_orders(id TEXT PRIMARY KEY, amount BIGINT), the rows of Process's
// handlers, and inbox_shipments(id TEXT PRIMARY KEY, downstream_key TEXT, by TEXT), the rows of
// ProcessWithCalls's.
AppMigrations InboxTestTables();

// What one test gives a backend: its clock (the stores run on it, so a test moves leases past
// their end), its randomness and a directory of its own.
struct InboxEnv {
  FakeClock clock;
  SeededRandom random{23};
  TempDir dir;
};

struct InboxBackend {
  std::string name;
  // Opens a store on this test's data with InboxTestTables; called again, another instance
  // (other connections) on the same data, as a second process would.
  std::function<Result<std::unique_ptr<Store>>(InboxEnv& env)> open;
  // The environment variables naming the services `open` needs: unset, the tests are skipped,
  // or fail under IDEM_REQUIRE_SERVICES (testing/services.h).
  std::vector<std::string> services = {};
};

inline void PrintTo(const InboxBackend& backend, std::ostream* os) { *os << backend.name; }
inline std::string InboxBackendName(const ::testing::TestParamInfo<InboxBackend>& info) {
  return info.param.name;
}

// An Engine and an Inbox (consumer group "billing", consumer "orders") over the backend's store;
// the tests are in inbox_test.cc.
class InboxTest : public ::testing::TestWithParam<InboxBackend> {
 protected:
  // Another instance of the store, with an engine and an inbox of its own: a second consumer
  // process of the same group.
  struct Consumer {
    std::unique_ptr<Store> store;
    std::unique_ptr<Engine> engine;
    std::optional<Inbox> inbox;
  };

  void SetUp() override;
  // A consumer on a store instance of its own (GetParam().open), with `policy`. Fails the test
  // (fatally, from the caller's ASSERT_NO_FATAL_FAILURE) when it cannot be made.
  void OpenConsumer(Consumer& consumer, const InboxPolicy& policy);

  InboxPolicy policy_ = InboxPolicy::For("billing", "orders");
  InboxEnv env_;
  std::unique_ptr<Fingerprinter> fingerprinter_;
  std::unique_ptr<Sealer> sealer_;
  Consumer main_;
};

// The transactional outbox (include/idem/outbox.h) on the same stores, whose `open` applies
// OutboxMigrations too; the tests are in outbox_test.cc.
class OutboxTest : public InboxTest {};

}  // namespace idem::testing
