// src/core/fingerprint.cc — HMAC-SHA-256 fingerprints with OpenSSL's EVP_MAC.
//
// Keying HMAC costs two SHA-256 blocks and fetching the algorithm costs more than hashing a 1 KiB
// body, so each secret's keyed context is built once; used contexts are re-initialised and reused
// (src/core/idle_list.h).
#include "idem/fingerprint.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <map>
#include <vector>

#include "src/core/idle_list.h"

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

// One secret's keyed HMAC context, and idle copies ready for use. Duplicating a keyed context
// costs several allocations; re-initialising a used one with its own key costs none.
class KeyedMac {
 public:
  explicit KeyedMac(MacCtx keyed) : keyed_(std::move(keyed)) {}

  std::array<uint8_t, 32> Mac(std::string_view input) const {
    MacCtx ctx = idle_.Take();
    if (!ctx) ctx.reset(EVP_MAC_CTX_dup(keyed_.get()));
    IDEM_CHECK(ctx != nullptr);
    IDEM_CHECK(EVP_MAC_update(ctx.get(), reinterpret_cast<const uint8_t*>(input.data()),
                              input.size()) == 1);
    std::array<uint8_t, 32> out{};
    std::size_t len = 0;
    IDEM_CHECK(EVP_MAC_final(ctx.get(), out.data(), &len, out.size()) == 1 && len == out.size());
    // A null key re-initialises the context with the key it already holds.
    IDEM_CHECK(EVP_MAC_init(ctx.get(), nullptr, 0, nullptr) == 1);
    idle_.Give(std::move(ctx));
    return out;
  }

 private:
  MacCtx keyed_;
  mutable IdleList<MacCtx> idle_;
};

class HmacFingerprinter final : public Fingerprinter {
 public:
  HmacFingerprinter(std::map<uint32_t, std::unique_ptr<KeyedMac>> keyed, uint32_t current)
      : keyed_(std::move(keyed)), current_(current) {}

  Fingerprint Sign(const CanonicalRequest& request) const override {
    Fingerprint fp;
    fp.rules_version = request.rules_version;
    fp.secret_id = current_;
    fp.mac = keyed_.at(current_)->Mac(Input(request));
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
    auto mac = it->second->Mac(Input(request));
    return CRYPTO_memcmp(mac.data(), stored.mac.data(), mac.size()) == 0;
  }

 private:
  // The MAC input in one buffer, so it goes to OpenSSL in one update: each update passes through
  // the provider's dispatch, which costs more than copying a short field.
  static std::string Input(const CanonicalRequest& r) {
    const std::string version = std::to_string(r.rules_version);
    const std::string_view fields[] = {version,       r.method, r.route, r.content_type,
                                       r.api_version, r.body,   r.user};
    std::size_t total = 0;
    for (std::string_view f : fields) total += 4 + f.size();
    std::string input;
    input.reserve(total);
    for (std::string_view f : fields) AppendField(input, f);
    if (!r.target.empty()) AppendField(input, r.target);  // none: the input as before it existed
    return input;
  }

  std::map<uint32_t, std::unique_ptr<KeyedMac>> keyed_;
  uint32_t current_;
};

}  // namespace

std::string MediaTypeOf(std::string_view content_type) {
  std::string_view media = content_type.substr(0, content_type.find(';'));
  auto space = [](char c) { return c == ' ' || c == '\t'; };  // HTTP's optional white space
  while (!media.empty() && space(media.front())) media.remove_prefix(1);
  while (!media.empty() && space(media.back())) media.remove_suffix(1);
  std::string lower(media);
  for (char& c : lower) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return lower;
}

Result<CanonicalRequest> MakeCanonicalRequest(const RequestFacts& facts,
                                              const CanonicalRules& rules) {
  std::string body;
  if (rules.opaque_body) {
    if (facts.body.size() > rules.max_bytes) {
      return MakeError(Errc::kTooLarge,
                       "body longer than " + std::to_string(rules.max_bytes) + " bytes");
    }
    body = std::string(facts.body);
  } else {
    IDEM_ASSIGN_OR_RETURN(body, Canonicalize(facts.body, rules));
  }
  return CanonicalRequest{rules.version,
                          std::string(facts.method),
                          std::string(facts.route),
                          MediaTypeOf(facts.content_type),
                          std::string(facts.api_version),
                          std::move(body),
                          std::string(facts.user),
                          std::string(facts.target)};
}

Result<std::unique_ptr<Fingerprinter>> Fingerprinter::Create(std::vector<Secret> secrets,
                                                             uint32_t current_secret_id) {
  IDEM_RETURN_IF_ERROR(ValidateSecrets(secrets, current_secret_id, 32, 0));
  EVP_MAC* hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (hmac == nullptr) return MakeError(Errc::kInternal, "OpenSSL has no HMAC");
  std::map<uint32_t, std::unique_ptr<KeyedMac>> keyed;
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
    keyed.emplace(s.id, std::make_unique<KeyedMac>(std::move(ctx)));
  }
  EVP_MAC_free(hmac);
  return std::unique_ptr<Fingerprinter>(
      std::make_unique<HmacFingerprinter>(std::move(keyed), current_secret_id));
}

}  // namespace idem
