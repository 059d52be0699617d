// include/idem/store/postgres.h — the scale-out store: PostgreSQL through libpq.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "include/idem/clock.h"
#include "include/idem/result.h"
#include "include/idem/store.h"

namespace idem {

struct PostgresStoreOptions {
  // libpq connection string or URI: "postgresql://user@host:port/db".
  std::string conninfo;
  // Schema holding idem's tables (created if missing). Anything but "public" is selected with a
  // per-connection search_path, which PgBouncer's transaction pooling does not carry: use
  // "public" (or a role default search_path) behind PgBouncer.
  std::string schema = "public";
  // Connections kept open; at most this many transactions run at once in this process.
  int pool_size = 8;
  Millis pool_wait{5000};
  // Server-side prepared statements per connection. Turn off behind PgBouncer in transaction
  // pooling mode (before 1.21), which cannot route a prepared statement to its connection.
  bool prepared_statements = true;
  // Statement-level retries of serialisation failures and deadlocks outside explicit
  // transactions (reads, sweeps), and of connections lost before a statement was sent.
  int max_retries = 3;
  std::string app_name;
  std::vector<Migration> app_migrations;
  // false: opening writes nothing — no schema is created and no migration runs (app_migrations
  // are ignored). The open only reads that libidem's schema exists in `schema` and is not newer
  // than this build; an older one is used as it is. For tools that read a store some idemd owns
  // (idemctl). The store's own write calls still write.
  bool apply_migrations = true;
};

// Connects, then applies pending migrations under a PostgreSQL advisory lock, so instances that
// start at once apply each migration once. `clock` and `random` must outlive the store.
// Errors: kUnavailable if the server cannot be reached; kInvalidArgument for bad options or a
// migration the server rejects, and, without apply_migrations, for a schema with no idem tables
// ("... has no idem schema; start idemd once to create it"); kDataLoss if the schema is newer
// than this build.
Result<std::unique_ptr<Store>> OpenPostgresStore(const PostgresStoreOptions& options, Clock& clock,
                                                 Random& random);

}  // namespace idem
