// src/core/seal.cc — AES-256-GCM sealing of stored responses.
//
// Sealed format: version (1 byte, 0x01) | key id (4 bytes, big-endian) | nonce (12) |
// ciphertext | tag (16). Additional data: scope hash | key id | version. Each key's contexts are
// keyed once and reused (src/core/idle_list.h).
#include "idem/seal.h"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <map>

#include "src/core/idle_list.h"

namespace idem {
namespace {

constexpr uint8_t kFormatVersion = 1;
constexpr std::size_t kHeaderBytes = 1 + 4;
constexpr std::size_t kNonceBytes = 12;
constexpr std::size_t kTagBytes = 16;

struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

const uint8_t* Bytes(std::string_view s) { return reinterpret_cast<const uint8_t*>(s.data()); }
uint8_t* Bytes(std::string& s) { return reinterpret_cast<uint8_t*>(s.data()); }

// Scope hash | key id | version.
using Aad = std::array<uint8_t, sizeof(ScopeHash) + kHeaderBytes>;
Aad AdditionalData(const ScopeHash& scope, std::string_view header) {
  Aad aad{};
  std::copy(scope.begin(), scope.end(), aad.begin());
  std::copy(header.begin() + 1, header.begin() + kHeaderBytes, aad.begin() + scope.size());
  aad.back() = static_cast<uint8_t>(header[0]);
  return aad;
}

// One key's AES-256-GCM contexts: keyed once (the key schedule and the algorithm's fetch cost more
// than sealing a short response), then given a fresh nonce for each message.
class KeyedCipher {
 public:
  explicit KeyedCipher(std::string key) : key_(std::move(key)) {}

  // A context keyed for encrypting (or decrypting) whose next message uses `nonce`; empty when
  // OpenSSL fails. Give it back with Done once the message is through.
  CipherCtx Take(bool encrypt, const uint8_t* nonce) const {
    CipherCtx ctx = Idle(encrypt).Take();
    if (!ctx) {
      ctx.reset(EVP_CIPHER_CTX_new());
      if (!ctx || EVP_CipherInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, Bytes(key_), nullptr,
                                    encrypt ? 1 : 0) != 1) {
        return CipherCtx();
      }
    }
    // A null cipher and key keep the ones the context holds; the nonce starts a new message.
    if (EVP_CipherInit_ex(ctx.get(), nullptr, nullptr, nullptr, nonce, encrypt ? 1 : 0) != 1) {
      return CipherCtx();
    }
    return ctx;
  }

  // `ctx` finished its message (whether or not it authenticated): the next Take may reuse it.
  void Done(bool encrypt, CipherCtx ctx) const { Idle(encrypt).Give(std::move(ctx)); }

 private:
  IdleList<CipherCtx>& Idle(bool encrypt) const { return encrypt ? encrypting_ : decrypting_; }

  std::string key_;
  mutable IdleList<CipherCtx> encrypting_;
  mutable IdleList<CipherCtx> decrypting_;
};

class AesGcmSealer final : public Sealer {
 public:
  AesGcmSealer(std::map<uint32_t, std::unique_ptr<KeyedCipher>> keys, uint32_t current,
               Random& random, std::size_t max_plaintext)
      : keys_(std::move(keys)), current_(current), random_(random), max_plaintext_(max_plaintext) {}

  Result<std::string> Seal(const ScopeHash& scope, std::string_view plaintext) const override {
    if (plaintext.size() > max_plaintext_) {
      return MakeError(Errc::kTooLarge, "response of " + std::to_string(plaintext.size()) +
                                            " bytes exceeds the stored-response cap of " +
                                            std::to_string(max_plaintext_));
    }
    std::string out(kHeaderBytes + kNonceBytes + plaintext.size() + kTagBytes, '\0');
    out[0] = static_cast<char>(kFormatVersion);
    for (int i = 0; i < 4; ++i) out[1 + i] = static_cast<char>(current_ >> (24 - 8 * i));
    uint8_t* nonce = Bytes(out) + kHeaderBytes;
    random_.Fill(std::span<uint8_t>(nonce, kNonceBytes));
    const Aad aad = AdditionalData(scope, out);
    const KeyedCipher& keyed = *keys_.at(current_);

    CipherCtx ctx = keyed.Take(true, nonce);
    int len = 0;
    uint8_t* ct = nonce + kNonceBytes;
    if (!ctx ||
        EVP_EncryptUpdate(ctx.get(), nullptr, &len, aad.data(), static_cast<int>(aad.size())) !=
            1 ||
        EVP_EncryptUpdate(ctx.get(), ct, &len, Bytes(plaintext),
                          static_cast<int>(plaintext.size())) != 1 ||
        EVP_EncryptFinal_ex(ctx.get(), ct + len, &len) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, ct + plaintext.size()) !=
            1) {
      return MakeError(Errc::kInternal, "AES-256-GCM encryption failed");
    }
    keyed.Done(true, std::move(ctx));
    return out;
  }

  Result<std::string> Open(const ScopeHash& scope, std::string_view sealed) const override {
    if (sealed.size() < kHeaderBytes + kNonceBytes + kTagBytes ||
        static_cast<uint8_t>(sealed[0]) != kFormatVersion) {
      return MakeError(Errc::kDataLoss, "sealed response: truncated or unknown format");
    }
    uint32_t key_id = 0;
    for (int i = 0; i < 4; ++i) key_id = (key_id << 8) | static_cast<uint8_t>(sealed[1 + i]);
    auto key = keys_.find(key_id);
    if (key == keys_.end()) {
      return MakeError(Errc::kDataLoss,
                       "sealed response: key id " + std::to_string(key_id) + " is not configured");
    }
    const Aad aad = AdditionalData(scope, sealed);
    const uint8_t* nonce = Bytes(sealed) + kHeaderBytes;
    const uint8_t* ct = nonce + kNonceBytes;
    const std::size_t ct_len = sealed.size() - kHeaderBytes - kNonceBytes - kTagBytes;
    std::string plain(ct_len, '\0');
    std::array<uint8_t, kTagBytes> tag{};
    std::copy(sealed.end() - kTagBytes, sealed.end(), tag.begin());

    CipherCtx ctx = key->second->Take(false, nonce);
    int len = 0;
    if (!ctx ||
        EVP_DecryptUpdate(ctx.get(), nullptr, &len, aad.data(), static_cast<int>(aad.size())) !=
            1 ||
        EVP_DecryptUpdate(ctx.get(), Bytes(plain), &len, ct, static_cast<int>(ct_len)) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag.data()) != 1) {
      return MakeError(Errc::kDataLoss, "sealed response: authentication failed");
    }
    const bool authentic = EVP_DecryptFinal_ex(ctx.get(), Bytes(plain) + len, &len) == 1;
    key->second->Done(false, std::move(ctx));
    if (!authentic) return MakeError(Errc::kDataLoss, "sealed response: authentication failed");
    return plain;
  }

 private:
  std::map<uint32_t, std::unique_ptr<KeyedCipher>> keys_;
  uint32_t current_;
  Random& random_;
  std::size_t max_plaintext_;
};

}  // namespace

Result<std::unique_ptr<Sealer>> Sealer::Create(std::vector<Secret> keys, uint32_t current_key_id,
                                               Random& random, std::size_t max_plaintext_bytes) {
  IDEM_RETURN_IF_ERROR(ValidateSecrets(keys, current_key_id, 32, 32));
  std::map<uint32_t, std::unique_ptr<KeyedCipher>> by_id;
  for (Secret& k : keys) by_id.emplace(k.id, std::make_unique<KeyedCipher>(std::move(k.bytes)));
  return std::unique_ptr<Sealer>(std::make_unique<AesGcmSealer>(std::move(by_id), current_key_id,
                                                                random, max_plaintext_bytes));
}

}  // namespace idem
