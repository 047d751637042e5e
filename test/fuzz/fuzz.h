// Shared by the libFuzzer targets (test/fuzz/*.cpp, `make fuzz`): a property that fails prints what it
// saw and aborts, which libFuzzer reports as a crash and saves the input that caused it.
#pragma once
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#define FUZZ_CHECK(ok, ...)                                                \
  do {                                                                     \
    if (!(ok)) {                                                           \
      std::fprintf(stderr, "fuzz property failed: %s\n  ", #ok);           \
      std::fprintf(stderr, __VA_ARGS__);                                   \
      std::fputc('\n', stderr);                                            \
      std::abort();                                                        \
    }                                                                      \
  } while (0)

// Where a target writes the file a loader reads: one per process (fuzzing jobs may run side by side), in
// memory (/dev/shm), where the fsync of checkpoint_save costs nothing.
inline std::string scratch_file(const char* what) {
  return "/dev/shm/fuzz-" + std::string(what) + "-" + std::to_string(getpid());
}
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The offset of the first byte that does not begin a well-formed UTF-8 sequence (RFC 3629, Table 3:
// no overlong forms, no surrogates, nothing above U+10FFFF), or std::string::npos. Written from the
// RFC, independently of utf8proc, so that the tokenizer's validation is checked against it.
inline size_t first_invalid_utf8(const std::string& s) {
  auto in = [](unsigned char c, int lo, int hi) { return c >= lo && c <= hi; };
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = s[i];
    const size_t left = s.size() - i;
    auto cont = [&](size_t k, int lo = 0x80, int hi = 0xBF) { return k < left && in(s[i + k], lo, hi); };
    size_t n = 0;
    if (b < 0x80) n = 1;
    else if (in(b, 0xC2, 0xDF) && cont(1)) n = 2;
    else if (b == 0xE0 && cont(1, 0xA0, 0xBF) && cont(2)) n = 3;
    else if ((in(b, 0xE1, 0xEC) || in(b, 0xEE, 0xEF)) && cont(1) && cont(2)) n = 3;
    else if (b == 0xED && cont(1, 0x80, 0x9F) && cont(2)) n = 3;
    else if (b == 0xF0 && cont(1, 0x90, 0xBF) && cont(2) && cont(3)) n = 4;
    else if (in(b, 0xF1, 0xF3) && cont(1) && cont(2) && cont(3)) n = 4;
    else if (b == 0xF4 && cont(1, 0x80, 0x8F) && cont(2) && cont(3)) n = 4;
    if (n == 0) return i;
    i += n;
  }
  return std::string::npos;
}
