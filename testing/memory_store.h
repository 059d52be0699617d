// testing/memory_store.h — the in-memory Store: a reference model of the SQL stores' records, for
// tests and the deterministic simulator. Never for production: nothing survives the process.
//
// It mirrors every statement of src/store/sql.cc — the same conditions, effects and Errc — as a
// SQLite store opened with the same Clock and Random would: every time it writes or compares is
// clock.Now() of that call, every record it returns carries that time as observed_at, and the
// owner tokens of claims are drawn from `random` in the same order. Write transactions serialise
// like SQLite's BEGIN IMMEDIATE (one at a time; Begin waits for the write lock and gives up with
// kUnavailable), work on a private overlay that Commit applies at once, and roll back when dropped
// uncommitted; reads (Store::Read, ListStale) see committed records only. It runs no SQL:
// capabilities().business_sql is false, and Exec and Query answer kInvalidArgument.
//
// A model agrees with the SQL only as far as the tests that compare them reach (the contract
// suite, and the differential test in memory_store_test.cc): nothing is proven by it alone.
#pragma once

#include <memory>
#include <optional>

#include "idem/clock.h"
#include "idem/store.h"

namespace idem::testing {

// How long Begin and Sweep wait for the write lock before kUnavailable (a SQLite store's
// pool_wait).
inline constexpr Millis kMemoryStoreLockWait{5000};

// The records and the write lock several memory stores may share: stores opened on one
// MemoryData are instances of one database (the suite's "second process"). It lives as long as
// a store or a transaction on it does.
struct MemoryData;
std::shared_ptr<MemoryData> NewMemoryData(Millis lock_wait = kMemoryStoreLockWait);

// What the memory store checks before every write of `after` over `before` (nullopt: an insert)
// at `now`, its clock's time of the operation: Ok for a transition of the state machine
// (IsLegalTransition; an insert is PROCESSING), else kInternal naming the transition. The
// operation then answers that error and writes nothing: such a write is a bug of this model (the
// contract suite runs every legal path through it), never of its caller.
Status CheckTransition(const std::optional<Record>& before, const Record& after, Timestamp now);

// A store on `data`. Borrows `clock` and `random`, which must outlive it and its transactions.
std::unique_ptr<Store> MakeMemoryStore(std::shared_ptr<MemoryData> data, Clock& clock,
                                       Random& random);
// A store on data of its own.
std::unique_ptr<Store> MakeMemoryStore(Clock& clock, Random& random);

}  // namespace idem::testing
