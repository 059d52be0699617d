// include/idem/store/sqlite.h — the embedded store: one SQLite file in WAL mode.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "idem/clock.h"
#include "idem/result.h"
#include "idem/store.h"

namespace idem {

inline constexpr int64_t kSqliteWriteCacheBytes = int64_t{64} << 20;
inline constexpr int64_t kSqliteWriteCacheMinBytes = int64_t{1} << 20;
inline constexpr int64_t kSqliteWriteCacheMaxBytes = int64_t{16} << 30;

struct SqliteStoreOptions : SchemaOptions {
  std::string path;  // the database file; created when missing
  // Read connections kept open (snapshot reads run in parallel). Write transactions share one
  // more connection: SQLite admits one writer at a time, so writers queue here in memory.
  int pool_size = 4;
  // How long Begin() and Read() wait for their connection, and how long a connection waits for
  // the database write lock held by another process.
  Millis pool_wait{5000};
  Millis busy_timeout{5000};
  // FULL survives power loss; NORMAL in WAL mode may lose the last commits on power loss but not
  // on a process crash.
  bool synchronous_full = true;
  // Write transactions of this process that may share one commit (group commit): those waiting
  // to write when one finishes run inside the same SQLite transaction, in savepoints, and one
  // COMMIT (one sync) ends them all; each Commit() answers after that COMMIT. 1: each
  // transaction commits alone.
  int max_group = 64;
  // The page cache of the write connection, on which every write of this process runs (SQLite's
  // own default is 2 MiB, which a few thousand records outgrow: each write then reads its index
  // pages from the file again). Memory is taken as pages are read, up to this bound.
  // kSqliteWriteCacheMinBytes..kSqliteWriteCacheMaxBytes.
  int64_t write_cache_bytes = kSqliteWriteCacheBytes;
  // The WAL pages after which a commit checkpoints them into the database file (SQLite's
  // wal_autocheckpoint; its own default is 1,000): fewer, larger checkpoints copy a page written
  // many times over once, at the price of a WAL file up to about this many pages (4 KiB each).
  int wal_autocheckpoint_pages = 10'000;
};

// Opens (creating if needed) the store and applies pending migrations in one IMMEDIATE
// transaction, so processes opening the same file at once apply each migration once.
// `clock` and `random` must outlive the store. Errors: kUnavailable if the file cannot be opened
// or stays locked; kInvalidArgument for bad options or a migration the database rejects, and,
// with apply_migrations false, for a file that does not exist or has no idem schema; kDataLoss
// if the file's schema is newer than this build knows.
Result<std::unique_ptr<Store>> OpenSqliteStore(const SqliteStoreOptions& options, Clock& clock,
                                               Random& random);

}  // namespace idem
