// server/idemd/store_url.h — a store from a URL: sqlite:///abs/path.db, sqlite://rel/path.db, or
// postgresql://user@host:port/db (any libpq URI or connection string after the scheme).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "include/idem/store.h"

namespace idem::idemd {

// Opens the store and applies libidem's and the application's migrations.
// Errors: kInvalidArgument for an unknown scheme; the backend's errors otherwise.
// `prepared_statements` applies to PostgreSQL only.
Result<std::unique_ptr<Store>> OpenStoreUrl(const std::string& url, int pool_size,
                                            const std::string& app_name,
                                            const std::vector<Migration>& app_migrations,
                                            bool prepared_statements = true);

}  // namespace idem::idemd
