// include/idem/store/sqlite.h — the embedded store: one SQLite file in WAL mode.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "include/idem/clock.h"
#include "include/idem/result.h"
#include "include/idem/store.h"

namespace idem {

struct SqliteStoreOptions {
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
  // The application's own migrations, applied after libidem's under `app_name`.
  std::string app_name;
  std::vector<Migration> app_migrations;
  // false: opening writes nothing — the file is not created and no migration runs (app_migrations
  // are ignored). The open only checks, on a read-only connection, that libidem's schema exists
  // and is not newer than this build; an older one is used as it is. For tools that read a store
  // some idemd owns (idemctl). The store's own write calls still write.
  bool apply_migrations = true;
};

// Opens (creating if needed) the store and applies pending migrations in one IMMEDIATE
// transaction, so processes opening the same file at once apply each migration once.
// `clock` and `random` must outlive the store. Errors: kUnavailable if the file cannot be opened
// or stays locked; kInvalidArgument for bad options or a migration the database rejects, and,
// without apply_migrations, for a file that is missing or has no idem schema ("... has no idem
// schema; start idemd once to create it"); kDataLoss if the file's schema is newer than this
// build knows.
Result<std::unique_ptr<Store>> OpenSqliteStore(const SqliteStoreOptions& options, Clock& clock,
                                               Random& random);

}  // namespace idem
