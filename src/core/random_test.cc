// src/core/random_test.cc — SystemRandom: small fills come from a block of RAND_bytes' output per
// thread; no byte may be given twice, neither within a process nor across a fork().
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <set>
#include <thread>
#include <vector>

#include "idem/clock.h"

namespace idem {
namespace {

using Piece = std::array<uint8_t, 16>;

Piece Draw() {
  Piece piece{};
  SystemRandom().Fill(piece);
  return piece;
}

TEST(SystemRandom, SmallFillsNeverRepeatAcrossBlocksAndThreads) {
  // 16-byte pieces repeating by chance: never in practice. A block handed out twice, or a
  // thread's block shared with another, would repeat at once.
  std::vector<Piece> drawn(20000);
  std::vector<Piece> other(20000);
  std::thread t([&] {
    for (auto& piece : other) piece = Draw();
  });
  for (auto& piece : drawn) piece = Draw();
  t.join();
  std::set<Piece> seen(drawn.begin(), drawn.end());
  seen.insert(other.begin(), other.end());
  EXPECT_EQ(seen.size(), drawn.size() + other.size());
}

TEST(SystemRandom, OddSizesAndLargeFillsAreFilledCompletely) {
  // Sizes that do not divide the block, and one larger than a small fill: none left as zeros.
  for (const std::size_t size : {1u, 3u, 7u, 12u, 63u, 64u, 65u, 200u, 5000u}) {
    std::vector<uint8_t> nonzero(size, 0);
    for (int i = 0; i < 64; ++i) {
      std::vector<uint8_t> bytes(size, 0);
      SystemRandom().Fill(bytes);
      for (std::size_t j = 0; j < size; ++j) nonzero[j] |= bytes[j];
    }
    for (std::size_t j = 0; j < size; ++j) {
      ASSERT_NE(nonzero[j], 0) << "byte " << j << " of a " << size << "-byte fill stayed zero";
    }
  }
}

TEST(SystemRandom, AChildAfterForkDrawsBytesTheParentNeverGives) {
  (void)Draw();  // this thread's block now holds bytes not given yet
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const Piece piece = Draw();
    const bool sent =
        write(fds[1], piece.data(), piece.size()) == static_cast<ssize_t>(piece.size());
    _exit(sent ? 0 : 1);
  }
  close(fds[1]);
  Piece from_child{};
  const ssize_t got = read(fds[0], from_child.data(), from_child.size());
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_EQ(got, static_cast<ssize_t>(from_child.size()));
  // Had the child kept the parent's block, its first piece would be the parent's next one.
  std::set<Piece> parent;
  for (int i = 0; i < 200; ++i) parent.insert(Draw());
  EXPECT_EQ(parent.count(from_child), 0u);
}

}  // namespace
}  // namespace idem
