// server/idemd/config/store_url.h — a store from a URL: sqlite:///abs/path.db,
// sqlite://rel/path.db, or postgresql://user@host:port/db (any libpq URI or connection string after
// the scheme).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "idem/store.h"
#include "idem/store/postgres.h"
#include "idem/store/sqlite.h"

namespace idem::idemd {

struct StoreUrlOptions {
  int pool_size = 4;
  // SQLite only: the write connection's page cache (SqliteStoreOptions::write_cache_bytes).
  int64_t sqlite_cache_bytes = kSqliteWriteCacheBytes;
  // PostgreSQL only: server-side prepared statements (off behind PgBouncer transaction pooling).
  bool prepared_statements = true;
  // PostgreSQL only: completion notifications (PostgresStoreOptions::notifications).
  bool notifications = true;
  // PostgreSQL only: where the completion listener connects; empty: the store's URL.
  std::string listen_url;
  // PostgreSQL only: the bounds on every call to the server.
  PostgresTimeouts postgres_timeouts;
  // true: create the store if needed and apply libidem's and the application's migrations
  // (idemd). false: write nothing on open; the store must already have a current schema
  // (idemctl). See SqliteStoreOptions::apply_migrations.
  bool apply_migrations = true;
  std::vector<AppMigrations> apps;  // SchemaOptions::apps
};

// Opens the store at `url`. Errors: kInvalidArgument for an unknown scheme; the backend's errors
// otherwise (OpenSqliteStore, OpenPostgresStore).
Result<std::unique_ptr<Store>> OpenStoreUrl(const std::string& url, const StoreUrlOptions& options);

}  // namespace idem::idemd
