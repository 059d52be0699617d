// server/idemd/config/store_url.cc — scheme → backend.
#include "server/idemd/config/store_url.h"

#include <filesystem>

#include "idem/store/postgres.h"
#include "idem/store/sqlite.h"

namespace idem::idemd {

Result<std::unique_ptr<Store>> OpenStoreUrl(const std::string& url,
                                            const StoreUrlOptions& options) {
  constexpr std::string_view kSqlite = "sqlite://";
  if (url.rfind(kSqlite, 0) == 0) {
    SqliteStoreOptions sqlite;
    sqlite.path = url.substr(kSqlite.size());
    sqlite.pool_size = options.pool_size;
    sqlite.write_cache_bytes = options.sqlite_cache_bytes;
    sqlite.apply_migrations = options.apply_migrations;
    sqlite.apps = options.apps;
    const std::filesystem::path parent = std::filesystem::path(sqlite.path).parent_path();
    std::error_code ec;
    if (!parent.empty() && options.apply_migrations) {
      std::filesystem::create_directories(parent, ec);
    }
    return OpenSqliteStore(sqlite, SystemClock(), SystemRandom());
  }
  if (url.rfind("postgresql://", 0) == 0 || url.rfind("postgres://", 0) == 0) {
    PostgresStoreOptions postgres;
    postgres.conninfo = url;
    postgres.pool_size = options.pool_size;
    postgres.prepared_statements = options.prepared_statements;
    postgres.notifications = options.notifications;
    postgres.listen_conninfo = options.listen_url;
    postgres.timeouts = options.postgres_timeouts;
    postgres.apply_migrations = options.apply_migrations;
    postgres.apps = options.apps;
    return OpenPostgresStore(postgres, SystemRandom());
  }
  return MakeError(Errc::kInvalidArgument, "store URL must start with sqlite:// or postgresql://");
}

}  // namespace idem::idemd
