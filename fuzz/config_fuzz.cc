// fuzz/config_fuzz.cc — idemd's configuration: LoadConfig on the input written to a file (it reads
// only files), with command-line overrides, and ParseSecrets on the input as text.
//
// IDEM_SECRETS is set before the first input, so LoadConfig takes its secrets from there and never
// touches a secrets file: an input naming a path with generate_if_missing writes nothing.
//
// Properties: refusals are kInvalidArgument; an accepted configuration holds every bound LoadConfig
// promises (docs/config.md); accepted secrets hold ValidateSecrets' rules.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz/fuzz.h"
#include "server/idemd/config/config.h"

namespace {

using idem::Millis;

constexpr char kSecrets[] =
    "hmac_current = 1\nseal_current = 2\n"
    "[[hmac]]\nid = 1\nkey = \"1111111111111111111111111111111111111111111111111111111111111111\"\n"
    "[[seal]]\nid = 2\nkey = "
    "\"2222222222222222222222222222222222222222222222222222222222222222\"\n";

std::string* config_path = nullptr;

void CheckSecrets(const idem::idemd::Secrets& s) {
  IDEM_FUZZ_CHECK(idem::ValidateSecrets(s.hmac, s.hmac_current, 32, 0).has_value());
  IDEM_FUZZ_CHECK(idem::ValidateSecrets(s.seal, s.seal_current, 32, 32).has_value());
}

void CheckConfig(const idem::idemd::Config& c) {
  IDEM_FUZZ_CHECK(!c.store.url.empty());
  IDEM_FUZZ_CHECK(c.idempotency.key_min_length >= 1 &&
                  c.idempotency.key_min_length <= c.idempotency.key_max_length &&
                  c.idempotency.key_max_length <= idem::limits::kKeyMaxLength);
  IDEM_FUZZ_CHECK(c.idempotency.lease > Millis(0) && c.idempotency.retention > c.idempotency.lease);
  IDEM_FUZZ_CHECK(c.server.max_body_bytes >= 1 &&
                  c.server.max_body_bytes <= idem::limits::kJsonMaxBytes);
  IDEM_FUZZ_CHECK(c.idempotency.wait_max <= idem::limits::kWaitMax);
  IDEM_FUZZ_CHECK(c.server.max_parked >= 0 && c.server.max_parked <= idem::limits::kParkedCeiling);
  IDEM_FUZZ_CHECK(c.idempotency.max_waiters_per_principal >= 0 &&
                  c.idempotency.max_waiters_per_principal <= idem::limits::kParkedCeiling);
  IDEM_FUZZ_CHECK(c.idempotency.max_processing >= 1 && c.idempotency.max_retained >= 1);
  IDEM_FUZZ_CHECK(c.provider.timeout.count() >= 0 && c.idempotency.lease_margin.count() >= 0);
  IDEM_FUZZ_CHECK(c.idempotency.lease > c.provider.timeout + c.idempotency.lease_margin);
  IDEM_FUZZ_CHECK(c.provider.deduplicates_by_key || c.provider.settle > c.provider.timeout);
  IDEM_FUZZ_CHECK(c.reconciliation.lease >= Millis(100));
  IDEM_FUZZ_CHECK(c.reconciliation.interval.count() == 0 || c.reconciliation.window.count() > 0);
  for (const std::string& currency : c.payments.currencies) IDEM_FUZZ_CHECK(currency.size() == 3);
  for (const auto& p : c.principals) {
    IDEM_FUZZ_CHECK(p.api_key_sha256.size() == 64 && !p.tenant.empty() && !p.user.empty());
    for (char ch : p.api_key_sha256) {
      IDEM_FUZZ_CHECK((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'));
    }
  }
  CheckSecrets(c.secrets.keys);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("IDEM_SECRETS", kSecrets, 1);
  // One scratch file per process (scripts/fuzz points TMPDIR into its scratch directory).
  const char* tmp = std::getenv("TMPDIR");
  std::string dir =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/idem-config-fuzz-XXXXXX";
  IDEM_FUZZ_CHECK(mkdtemp(dir.data()) != nullptr);
  config_path = new std::string(dir + "/idemd.toml");
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(std::filesystem::path(*config_path).parent_path(), ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text = idem::fuzz::AsText(data, size);

  auto secrets = idem::idemd::ParseSecrets(text, "fuzz");
  if (secrets) {
    CheckSecrets(*secrets);
  } else {
    IDEM_FUZZ_CHECK(secrets.error().code == idem::Errc::kInvalidArgument);
  }

  {
    std::ofstream out(*config_path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    IDEM_FUZZ_CHECK(out.good());
  }
  static const std::vector<std::vector<std::string>> kOverrides = {
      {},
      {"--listen", "127.0.0.1:0", "--store", "sqlite:///tmp/x.db"},
      {"--provider", "http://127.0.0.1:1", "--redis", "redis://127.0.0.1:6379"},
      {"--listen", "nowhere"},
  };
  auto config = idem::idemd::LoadConfig(*config_path, kOverrides[size % kOverrides.size()]);
  if (config) {
    CheckConfig(*config);
  } else {
    IDEM_FUZZ_CHECK(config.error().code == idem::Errc::kInvalidArgument);
  }
  return 0;
}
