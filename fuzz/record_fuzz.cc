// fuzz/record_fuzz.cc — stored responses: the codec (DecodeResponse / EncodeResponse) and the
// sealing around it (Sealer::Seal / Open), fed arbitrary bytes as a store could return them.
//
// Properties: decoding never crashes and refuses with kDataLoss; what decodes re-encodes to the
// same bytes; a response built from the input survives encode → seal → open → decode; opening
// arbitrary bytes is refused with kDataLoss; a sealed response opens only for its own scope and
// not once any byte changed.
#include <fuzzer/FuzzedDataProvider.h>

#include <memory>
#include <string>

#include "fuzz/fuzz.h"
#include "idem/clock.h"
#include "idem/record.h"
#include "idem/seal.h"

namespace {

// Deterministic nonces: a crash found once reproduces.
class CountingRandom final : public idem::Random {
 public:
  void Fill(std::span<uint8_t> out) override {
    for (uint8_t& b : out) b = static_cast<uint8_t>(++counter_ * 0x9d);
  }

 private:
  uint64_t counter_ = 0;
};

std::unique_ptr<idem::Sealer> MakeSealer(idem::Random& random) {
  std::vector<idem::Secret> keys = {idem::Secret{1, std::string(32, '\x01')},
                                    idem::Secret{7, std::string(32, '\x07')}};
  auto sealer = idem::Sealer::Create(std::move(keys), 7, random);
  IDEM_FUZZ_CHECK(sealer.has_value());
  return std::move(*sealer);
}

idem::ScopeHash ScopeOf(uint8_t seed) {
  idem::ScopeHash scope;
  for (std::size_t i = 0; i < scope.size(); ++i) scope[i] = static_cast<uint8_t>(seed + i);
  return scope;
}

void CheckDecode(std::string_view bytes) {
  auto decoded = idem::DecodeResponse(bytes);
  if (!decoded) {
    IDEM_FUZZ_CHECK(decoded.error().code == idem::Errc::kDataLoss);
    return;
  }
  IDEM_FUZZ_CHECK(idem::EncodeResponse(*decoded) == bytes);
}

void CheckOpenArbitrary(const idem::Sealer& sealer, std::string_view bytes) {
  auto opened = sealer.Open(ScopeOf(0), bytes);
  // Forging a tag is out of the fuzzer's reach: anything it makes must be refused.
  IDEM_FUZZ_CHECK(!opened && opened.error().code == idem::Errc::kDataLoss);
}

void CheckRoundTrip(const idem::Sealer& sealer, const uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  idem::StoredResponse response;
  response.status = in.ConsumeIntegral<int>();
  const int headers = in.ConsumeIntegralInRange(0, 64);
  for (int i = 0; i < headers && in.remaining_bytes() > 0; ++i) {
    std::string name = in.ConsumeRandomLengthString(32);
    std::string value = in.ConsumeRandomLengthString(128);
    response.headers.emplace_back(std::move(name), std::move(value));
  }
  const uint8_t scope_seed = in.ConsumeIntegral<uint8_t>();
  const std::size_t flip = in.ConsumeIntegral<uint16_t>();
  response.body = in.ConsumeRemainingBytesAsString();

  const std::string encoded = idem::EncodeResponse(response);
  auto decoded = idem::DecodeResponse(encoded);
  IDEM_FUZZ_CHECK(decoded && *decoded == response);

  const idem::ScopeHash scope = ScopeOf(scope_seed);
  auto sealed = sealer.Seal(scope, encoded);
  if (!sealed) {
    IDEM_FUZZ_CHECK(sealed.error().code == idem::Errc::kTooLarge &&
                    encoded.size() > idem::limits::kSealedResponseMaxBytes);
    return;
  }
  auto opened = sealer.Open(scope, *sealed);
  IDEM_FUZZ_CHECK(opened && *opened == encoded);
  auto elsewhere = sealer.Open(ScopeOf(static_cast<uint8_t>(scope_seed + 1)), *sealed);
  IDEM_FUZZ_CHECK(!elsewhere && elsewhere.error().code == idem::Errc::kDataLoss);
  std::string altered = *sealed;
  altered[flip % altered.size()] ^= 0x20;
  auto tampered = sealer.Open(scope, altered);
  IDEM_FUZZ_CHECK(!tampered && tampered.error().code == idem::Errc::kDataLoss);
  auto truncated = sealer.Open(scope, std::string_view(*sealed).substr(0, flip % sealed->size()));
  IDEM_FUZZ_CHECK(!truncated && truncated.error().code == idem::Errc::kDataLoss);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static CountingRandom random;
  static const std::unique_ptr<idem::Sealer> kSealer = MakeSealer(random);
  const std::string_view bytes = idem::fuzz::AsText(data, size);
  CheckDecode(bytes);
  CheckOpenArbitrary(*kSealer, bytes);
  CheckRoundTrip(*kSealer, data, size);
  return 0;
}
