// testing/fakes.cc — temporary directories for tests.
#include "testing/fakes.h"

#include <stdlib.h>

#include "idem/result.h"

namespace idem::testing {

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "idem-test-XXXXXX").string();
  IDEM_CHECK(mkdtemp(pattern.data()) != nullptr);
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace idem::testing
