// server/idemd/store_url.cc — scheme → backend.
#include "server/idemd/store_url.h"

#include <filesystem>

#include "include/idem/store/postgres.h"
#include "include/idem/store/sqlite.h"

namespace idem::idemd {

Result<std::unique_ptr<Store>> OpenStoreUrl(const std::string& url, int pool_size,
                                            const std::string& app_name,
                                            const std::vector<Migration>& app_migrations,
                                            bool prepared_statements) {
  constexpr std::string_view kSqlite = "sqlite://";
  if (url.rfind(kSqlite, 0) == 0) {
    SqliteStoreOptions options;
    options.path = url.substr(kSqlite.size());
    options.pool_size = pool_size;
    options.app_name = app_name;
    options.app_migrations = app_migrations;
    const std::filesystem::path parent = std::filesystem::path(options.path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    return OpenSqliteStore(options, SystemClock(), SystemRandom());
  }
  if (url.rfind("postgresql://", 0) == 0 || url.rfind("postgres://", 0) == 0) {
    PostgresStoreOptions options;
    options.conninfo = url;
    options.pool_size = pool_size;
    options.prepared_statements = prepared_statements;
    options.app_name = app_name;
    options.app_migrations = app_migrations;
    return OpenPostgresStore(options, SystemClock(), SystemRandom());
  }
  return MakeError(Errc::kInvalidArgument,
                   "store URL must start with sqlite:// or postgresql://, got '" + url + "'");
}

}  // namespace idem::idemd
