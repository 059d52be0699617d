// fuzz/fingerprint_fuzz.cc — the fingerprint input: request facts → MakeCanonicalRequest →
// Fingerprinter::Sign / Verify, with a ring of two HMAC secrets.
//
// Properties: Verify(Sign(x)) holds, also on an instance whose current secret is the other one
// (rotation); Content-Type parameters do not change the fingerprint; moving one byte across a
// field boundary, or flipping a MAC bit, does (the MAC input is length-prefixed); another rules
// version is refused with kInvalidArgument and an unknown secret id with kDataLoss.
#include <fuzzer/FuzzedDataProvider.h>

#include <memory>
#include <string>

#include "fuzz/fuzz.h"
#include "idem/fingerprint.h"

namespace {

using idem::CanonicalRequest;
using idem::Fingerprint;
using idem::Fingerprinter;

std::vector<idem::Secret> Ring() {
  return {idem::Secret{1, std::string(32, '\x11')}, idem::Secret{2, std::string(40, '\x22')}};
}

std::unique_ptr<Fingerprinter> Make(uint32_t current) {
  auto f = Fingerprinter::Create(Ring(), current);
  IDEM_FUZZ_CHECK(f.has_value());
  return std::move(*f);
}

bool Verifies(const Fingerprinter& f, const CanonicalRequest& request, const Fingerprint& fp) {
  auto verdict = f.Verify(request, fp);
  IDEM_FUZZ_CHECK(verdict.has_value());
  return *verdict;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  static const std::unique_ptr<Fingerprinter> kSigner = Make(2);
  static const std::unique_ptr<Fingerprinter> kOld = Make(1);
  static const idem::CanonicalRules kRules = [] {
    idem::CanonicalRules r;  // idemd's payments rules
    r.money_fields = {"amount"};
    r.removed_fields = {"trace_id"};
    r.defaults = {{"description", "\"\""}, {"metadata", "{}"}};
    return r;
  }();

  FuzzedDataProvider in(data, size);
  const std::string method = in.ConsumeRandomLengthString(16);
  const std::string route = in.ConsumeRandomLengthString(64);
  const std::string content_type = in.ConsumeRandomLengthString(64);
  const std::string api_version = in.ConsumeRandomLengthString(8);
  const std::string user = in.ConsumeRandomLengthString(32);
  const std::string body = in.ConsumeRemainingBytesAsString();

  idem::RequestFacts facts{method, route, content_type, api_version, body, user};
  auto request = idem::MakeCanonicalRequest(facts, kRules);
  if (!request) {
    const auto code = request.error().code;
    IDEM_FUZZ_CHECK(code == idem::Errc::kInvalidArgument || code == idem::Errc::kTooLarge);
    return 0;
  }
  IDEM_FUZZ_CHECK(request->content_type == idem::MediaTypeOf(request->content_type));

  const Fingerprint fp = kSigner->Sign(*request);
  IDEM_FUZZ_CHECK(fp.secret_id == 2 && fp.rules_version == kRules.version);
  IDEM_FUZZ_CHECK(Verifies(*kSigner, *request, fp));
  IDEM_FUZZ_CHECK(Verifies(*kOld, *request, fp));
  IDEM_FUZZ_CHECK(Verifies(*kSigner, *request, kOld->Sign(*request)));

  // Parameters of the media type are not part of the request's meaning.
  const std::string with_parameter = content_type + "; charset=utf-8";
  facts.content_type = with_parameter;
  auto same = idem::MakeCanonicalRequest(facts, kRules);
  IDEM_FUZZ_CHECK(same && kSigner->Sign(*same).mac == fp.mac);

  // One byte moved across a field boundary is another request.
  if (!request->method.empty()) {
    CanonicalRequest moved = *request;
    moved.route.insert(moved.route.begin(), moved.method.back());
    moved.method.pop_back();
    IDEM_FUZZ_CHECK(!Verifies(*kSigner, moved, fp));
  }
  if (!request->user.empty()) {
    CanonicalRequest moved = *request;
    moved.body.push_back(moved.user.front());
    moved.user.erase(moved.user.begin());
    IDEM_FUZZ_CHECK(!Verifies(*kSigner, moved, fp));
  }
  Fingerprint flipped = fp;
  flipped.mac[size % flipped.mac.size()] ^= 0x01;
  IDEM_FUZZ_CHECK(!Verifies(*kSigner, *request, flipped));

  Fingerprint other_rules = fp;
  other_rules.rules_version += 1;
  auto refused = kSigner->Verify(*request, other_rules);
  IDEM_FUZZ_CHECK(!refused && refused.error().code == idem::Errc::kInvalidArgument);
  Fingerprint unknown_secret = fp;
  unknown_secret.secret_id = 3;
  auto lost = kSigner->Verify(*request, unknown_secret);
  IDEM_FUZZ_CHECK(!lost && lost.error().code == idem::Errc::kDataLoss);
  return 0;
}
