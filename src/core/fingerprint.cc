// src/core/fingerprint.cc — HMAC-SHA-256 fingerprints with OpenSSL's EVP_MAC.
//
// Keying HMAC costs two SHA-256 blocks and fetching the algorithm costs more than hashing a 1 KiB
// body, so each secret's keyed context is built once and duplicated per call.
#include "include/idem/fingerprint.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <map>

namespace idem {
namespace {

struct MacCtxFree {
  void operator()(EVP_MAC_CTX* ctx) const { EVP_MAC_CTX_free(ctx); }
};
using MacCtx = std::unique_ptr<EVP_MAC_CTX, MacCtxFree>;

// Length-prefixed, so no two different field tuples share a MAC input.
void AppendField(std::string& input, std::string_view field) {
  const auto n = static_cast<uint32_t>(field.size());
  const char len[4] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16),
                       static_cast<char>(n >> 8), static_cast<char>(n)};
  input.append(len, sizeof len);
  input.append(field);
}

class HmacFingerprinter final : public Fingerprinter {
 public:
  HmacFingerprinter(std::map<uint32_t, MacCtx> keyed, uint32_t current)
      : keyed_(std::move(keyed)), current_(current) {}

  Fingerprint Sign(const CanonicalRequest& request) const override {
    Fingerprint fp;
    fp.rules_version = request.rules_version;
    fp.secret_id = current_;
    fp.mac = Mac(*keyed_.at(current_), request);
    return fp;
  }

  Result<bool> Verify(const CanonicalRequest& request, const Fingerprint& stored) const override {
    if (request.rules_version != stored.rules_version) {
      return MakeError(Errc::kInvalidArgument, "fingerprint: rules version differs");
    }
    auto it = keyed_.find(stored.secret_id);
    if (it == keyed_.end()) {
      return MakeError(
          Errc::kDataLoss,
          "fingerprint: secret id " + std::to_string(stored.secret_id) + " is not configured");
    }
    auto mac = Mac(*it->second, request);
    return CRYPTO_memcmp(mac.data(), stored.mac.data(), mac.size()) == 0;
  }

 private:
  static std::array<uint8_t, 32> Mac(const EVP_MAC_CTX& keyed, const CanonicalRequest& r) {
    const std::string version = std::to_string(r.rules_version);
    const std::string_view fields[] = {version,       r.method, r.route, r.content_type,
                                       r.api_version, r.body,   r.user};
    // One buffer and one update: each EVP_MAC_update goes through the provider's dispatch, which
    // costs more than copying a short field.
    std::size_t total = 0;
    for (std::string_view f : fields) total += 4 + f.size();
    std::string input;
    input.reserve(total);
    for (std::string_view f : fields) AppendField(input, f);

    MacCtx ctx(EVP_MAC_CTX_dup(&keyed));
    IDEM_CHECK(ctx != nullptr);
    IDEM_CHECK(EVP_MAC_update(ctx.get(), reinterpret_cast<const uint8_t*>(input.data()),
                              input.size()) == 1);
    std::array<uint8_t, 32> out{};
    std::size_t len = 0;
    IDEM_CHECK(EVP_MAC_final(ctx.get(), out.data(), &len, out.size()) == 1 && len == out.size());
    return out;
  }

  std::map<uint32_t, MacCtx> keyed_;
  uint32_t current_;
};

}  // namespace

Result<CanonicalRequest> MakeCanonicalRequest(const RequestFacts& facts,
                                              const CanonicalRules& rules) {
  IDEM_ASSIGN_OR_RETURN(std::string body, Canonicalize(facts.body, rules));
  return CanonicalRequest{rules.version,
                          std::string(facts.method),
                          std::string(facts.route),
                          std::string(facts.content_type),
                          std::string(facts.api_version),
                          std::move(body),
                          std::string(facts.user)};
}

Result<std::unique_ptr<Fingerprinter>> Fingerprinter::Create(std::vector<Secret> secrets,
                                                             uint32_t current_secret_id) {
  IDEM_RETURN_IF_ERROR(ValidateSecrets(secrets, current_secret_id, 32, 0));
  EVP_MAC* hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (hmac == nullptr) return MakeError(Errc::kInternal, "OpenSSL has no HMAC");
  std::map<uint32_t, MacCtx> keyed;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  for (const Secret& s : secrets) {
    MacCtx ctx(EVP_MAC_CTX_new(hmac));
    if (!ctx || EVP_MAC_init(ctx.get(), reinterpret_cast<const uint8_t*>(s.bytes.data()),
                             s.bytes.size(), params) != 1) {
      EVP_MAC_free(hmac);
      return MakeError(Errc::kInternal, "OpenSSL could not key HMAC-SHA-256");
    }
    keyed.emplace(s.id, std::move(ctx));
  }
  EVP_MAC_free(hmac);
  return std::unique_ptr<Fingerprinter>(
      std::make_unique<HmacFingerprinter>(std::move(keyed), current_secret_id));
}

}  // namespace idem
