// bench/pgbench_script.cc — idem-pgbench-script: prints a pgbench script of the database work of
// one first execution on PostgreSQL, made of the very statement texts idemd runs (RecordSql for the
// PostgreSQL dialect, src/store/sql.cc), so the PostgreSQL ceiling of scripts/bench cannot drift
// from the store. Each statement's '$n' placeholders become pgbench variables; nothing else of its
// text changes.
//
//   idem-pgbench-script --defines FILE > first_execution.sql
//   pgbench -n -M prepared -c 8 -j 2 -T 30 $(cat FILE) -f first_execution.sql DBURL
//
// The script is the two transactions of a first execution, in idemd's order (Engine::Start with
// the payments hook, which makes the covered advance before the provider call; Engine::Finish),
// with the store's round trips: statements the store sends together (SqlRunner::RunAll, libpq's
// pipeline mode) are one pgbench pipeline (\startpipeline ... \endpipeline, one Sync):
//   claim:      [BEGIN; claim] advance to `claimed`; covered advance to `charge_sent`;
//               [count retained, locking the principal's counter row; count PROCESSING] COMMIT
// (the engine's read back after the hook is answered from the record the covered advance
// returned: SqlTxn::Get runs no statement for it)
//   completion: [BEGIN; finish SUCCEEDED with the sealed 201] COMMIT
// Left out: idemd's own business rows (the payments insert and update and the outbox event, each
// a round trip of its own with its savepoint), which are not libidem's statements; the ceiling is
// therefore a little higher than the work idemd really does per request.
//
// Values: the scope hash is a fresh random integer per run of the script (its decimal text as the
// bytea, unique like a real hash); the request hash, owner token and sealed response have their
// real sizes (the response is a payment answer sealed with a throwaway key). {now}, which idemd
// binds to NULL so the database's clock decides, is bound to the time the script was generated:
// pgbench cannot bind a NULL. String values do not fit a pgbench script (\set takes numbers
// only), so they go to --defines FILE as pgbench -D options, one per line.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/clock.h"
#include "idem/key.h"
#include "idem/limits.h"
#include "idem/record.h"
#include "idem/seal.h"
#include "server/idemd/routes.h"
#include "src/store/sql.h"

namespace {

using namespace idem;

constexpr const char* kUsage =
    "usage: idem-pgbench-script --defines FILE [--lease-ms N] [--retention-ms N]\n"
    "         [--max-processing N] [--provider-timeout-ms N] [--lease-margin-ms N]\n"
    "Prints a pgbench script of one first execution's statements (src/store/sql.cc, PostgreSQL)\n"
    "and writes the pgbench -D options it needs to FILE, one per line.\n";

struct Settings {
  std::string defines_path;
  int64_t lease_ms = limits::kDefaultLease.count();
  int64_t retention_ms = limits::kDefaultRetention.count();
  int64_t max_processing = limits::kMaxProcessingPerPrincipal;
  int64_t provider_timeout_ms = 5000;
  int64_t lease_margin_ms = limits::kDefaultLeaseMargin.count();
};

// `sql` (numbered placeholders) with $1..$n replaced by ":" + names[i - 1]; quoted text is left
// alone. Exits when the statement takes another number of parameters than `names` gives: the
// statement changed and this tool must learn its new binding.
std::string WithVariables(std::string_view op, std::string_view sql,
                          const std::vector<std::string>& names) {
  std::string out;
  char quote = 0;
  std::size_t used = 0;
  for (std::size_t i = 0; i < sql.size(); ++i) {
    const char c = sql[i];
    if (quote != 0) {
      if (c == quote) quote = 0;
      out.push_back(c);
      continue;
    }
    if (c == '\'' || c == '"') {
      quote = c;
      out.push_back(c);
      continue;
    }
    if (c == '$' && i + 1 < sql.size() && sql[i + 1] >= '1' && sql[i + 1] <= '9') {
      std::size_t n = 0;
      while (i + 1 < sql.size() && sql[i + 1] >= '0' && sql[i + 1] <= '9') {
        n = n * 10 + static_cast<std::size_t>(sql[++i] - '0');
      }
      if (n > names.size()) {
        std::fprintf(stderr, "idem-pgbench-script: %.*s uses $%zu, but only %zu are bound here\n",
                     static_cast<int>(op.size()), op.data(), n, names.size());
        std::exit(1);
      }
      used = std::max(used, n);
      out += ":" + names[n - 1];
      continue;
    }
    out.push_back(c);
  }
  if (used != names.size()) {
    std::fprintf(stderr, "idem-pgbench-script: %.*s takes %zu parameters, %zu are bound here\n",
                 static_cast<int>(op.size()), op.data(), used, names.size());
    std::exit(1);
  }
  return out + ";";
}

bool ParseArgs(int argc, char** argv, Settings& s) {
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "--help" || name == "-h") return false;
    if (i + 1 >= argc) return false;
    const std::string value = argv[++i];
    if (name == "--defines") {
      s.defines_path = value;
      continue;
    }
    char* end = nullptr;
    const long long n = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || n < 0) return false;
    if (name == "--lease-ms") {
      s.lease_ms = n;
    } else if (name == "--max-processing") {
      s.max_processing = n;
    } else if (name == "--retention-ms") {
      s.retention_ms = n;
    } else if (name == "--provider-timeout-ms") {
      s.provider_timeout_ms = n;
    } else if (name == "--lease-margin-ms") {
      s.lease_margin_ms = n;
    } else {
      return false;
    }
  }
  return !s.defines_path.empty();
}

// A payment's 201 as idemd stores it (EncodeResponse, then sealed): the real size of the
// response column. The field values are made up; their lengths are those of idemd's.
std::string SealedPaymentAnswer(const ScopeHash& scope) {
  const std::string id = "pay_0123456789abcdef01234567";
  const StoredResponse created{
      201,
      {{"Content-Type", "application/json"}, {"Location", "/v1/payments/" + id}},
      R"({"id":")" + id +
          R"(","merchant_order_no":"lg0123abcd-0-123456","amount":"100.00","currency":"CNY",)"
          R"("status":"succeeded","provider_charge_id":"ch_0123456789abcdef01234567",)"
          R"("created_at":"2026-01-01T00:00:00.000Z"})"};
  auto sealer = Sealer::Create({{1, std::string(32, 's')}}, 1, SystemRandom());
  if (!sealer) {
    std::fprintf(stderr, "idem-pgbench-script: %s\n", sealer.error().message.c_str());
    std::exit(1);
  }
  auto sealed = (*sealer)->Seal(scope, EncodeResponse(created));
  if (!sealed) {
    std::fprintf(stderr, "idem-pgbench-script: %s\n", sealed.error().message.c_str());
    std::exit(1);
  }
  return *sealed;
}

std::string Bytea(std::string_view bytes) {
  return "\\x" + ToHex(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  if (!ParseArgs(argc, argv, s)) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const store_internal::RecordSql sql(store_internal::PostgresDialect());
  if (sql.count_any_locked.empty()) {
    std::fputs("idem-pgbench-script: the PostgreSQL dialect has no principal lock\n", stderr);
    return 1;
  }

  ScopeHash some_scope{};
  SystemRandom().Fill(some_scope);
  std::array<uint8_t, 32> request_hash{};
  SystemRandom().Fill(request_hash);
  OwnerToken owner{};
  SystemRandom().Fill(owner);

  // String values: pgbench -D name=value.
  const std::vector<std::pair<std::string, std::string>> defines = {
      {"tenant", "acme"},
      {"user_id", "alice"},
      {"route", std::string(idemd::kPaymentsCreateRoute)},
      {"request_hash", Bytea(std::string_view(reinterpret_cast<const char*>(request_hash.data()),
                                              request_hash.size()))},
      {"owner", Bytea(std::string_view(reinterpret_cast<const char*>(owner.data()), owner.size()))},
      {"processing", std::string(RecordStateName(RecordState::kProcessing))},
      {"succeeded", std::string(RecordStateName(RecordState::kSucceeded))},
      {"claimed", "claimed"},
      {"charge_sent", "charge_sent"},
      {"done", "done"},
      {"payment_id", "pay_0123456789abcdef01234567"},
      {"response", Bytea(SealedPaymentAnswer(some_scope))},
  };
  for (const auto& [name, value] : defines) {
    if (value.find('\n') != std::string::npos) {
      std::fprintf(stderr, "idem-pgbench-script: -D %s holds a newline\n", name.c_str());
      return 1;
    }
  }
  std::ofstream out(s.defines_path, std::ios::trunc);
  for (const auto& [name, value] : defines) out << "-D" << name << "=" << value << "\n";
  out.close();
  if (!out) {
    std::fprintf(stderr, "idem-pgbench-script: cannot write %s\n", s.defines_path.c_str());
    return 1;
  }

  const int64_t now_ms = ToUnixMillis(SystemClock().Now());
  std::printf(
      "-- A first execution's record statements as idemd runs them on PostgreSQL, generated by\n"
      "-- idem-pgbench-script from src/store/sql.cc (see bench/pgbench_script.cc). Run with the\n"
      "-- -D options it wrote, and -M prepared as idemd prepares its statements.\n");
  // Numbers: \set.
  std::printf("\\set scope random(1, 9223372036854775807)\n");
  std::printf("\\set now %lld\n", static_cast<long long>(now_ms));
  std::printf("\\set fp_version 1\n\\set secret_id 1\n\\set fence 1\n\\set status 201\n");
  std::printf("\\set lease_ttl %lld\n", static_cast<long long>(s.lease_ms));
  std::printf("\\set retention %lld\n", static_cast<long long>(s.retention_ms));
  std::printf("\\set processing_limit %lld\n", static_cast<long long>(s.max_processing + 1));
  std::printf("\\set must_cover %lld\n",
              static_cast<long long>(s.provider_timeout_ms + s.lease_margin_ms));

  // Bindings in the order of SqlTxn (src/store/sql.cc).
  std::printf("\\startpipeline\nBEGIN;\n");
  std::printf("%s\n", WithVariables("claim", sql.claim,
                                    {"scope", "tenant", "user_id", "route", "request_hash",
                                     "fp_version", "secret_id", "owner", "fence", "now",
                                     "lease_ttl", "now", "now", "now", "retention", "now"})
                          .c_str());
  std::printf("\\endpipeline\n");
  std::printf("%s\n", WithVariables("advance", sql.advance,
                                    {"claimed", "payment_id", "payment_id", "now", "scope", "owner",
                                     "fence", "now"})
                          .c_str());
  std::printf("%s\n", WithVariables("advance covered", sql.advance_covered,
                                    {"charge_sent", "now", "now", "scope", "owner", "fence", "now",
                                     "must_cover", "now"})
                          .c_str());
  // Last, as Engine::Start counts (the lock is held from here to the commit): both counts in one
  // round trip, the locking one first (SqlTxn::CountQuota). SqlTxn caps the retained count itself:
  // the statement takes no limit.
  std::printf(
      "\\startpipeline\n%s\n",
      WithVariables("count any locked", sql.count_any_locked, {"tenant", "user_id"}).c_str());
  std::printf("%s\n", WithVariables("count state", sql.count_state,
                                    {"tenant", "user_id", "processing", "processing_limit"})
                          .c_str());
  std::printf("\\endpipeline\nCOMMIT;\n");

  std::printf("\\startpipeline\nBEGIN;\n");
  std::printf("%s\n", WithVariables("finish", sql.finish,
                                    {"succeeded", "status", "response", "done", "done", "now",
                                     "now", "now", "retention", "scope", "owner", "fence"})
                          .c_str());
  std::printf("\\endpipeline\nCOMMIT;\n");
  return 0;
}
