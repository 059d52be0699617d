// src/core/result.cc — names of error codes.
#include "idem/result.h"

namespace idem {

std::string_view ErrcName(Errc code) {
  switch (code) {
    case Errc::kInvalidArgument:
      return "invalid_argument";
    case Errc::kTooLarge:
      return "too_large";
    case Errc::kNotFound:
      return "not_found";
    case Errc::kAlreadyExists:
      return "already_exists";
    case Errc::kFingerprintMismatch:
      return "fingerprint_mismatch";
    case Errc::kFenced:
      return "fenced";
    case Errc::kConflict:
      return "conflict";
    case Errc::kResourceExhausted:
      return "resource_exhausted";
    case Errc::kUnavailable:
      return "unavailable";
    case Errc::kDeadlineExceeded:
      return "deadline_exceeded";
    case Errc::kDataLoss:
      return "data_loss";
    case Errc::kInternal:
      return "internal";
  }
  return "unknown";
}

}  // namespace idem
