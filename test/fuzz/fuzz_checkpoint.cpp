// fuzz_checkpoint: the checkpoint loader (checkpoint_load) on truncated, bit-flipped, foreign files and
// headers that declare huge sizes. It must refuse with one line or load; it never crashes, hangs, or
// allocates more than the file holds (libFuzzer's -malloc_limit_mb catches a large allocation). The
// checksum guards the file, so each input is tried twice: as it is, and with its last 8 bytes replaced
// by the checksum of the rest, which reaches every check past the checksum. A checkpoint that loads must
// hold a valid configuration and finite parameters, save and load back bit for bit, and decode.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../../transformer.h"
#include "fuzz.h"

static uint64_t fnv1a64(const std::string& s) {  // the checksum checkpoint_save writes (NOTES.md, "Checkpoints")
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

static void try_load(const std::string& path, const std::string& bytes) {
  write_file(path, bytes);
  CheckpointMeta meta;
  std::unique_ptr<Transformer<float>> m;
  try {
    m = checkpoint_load(path, &meta);
  } catch (const std::exception& e) {
    const std::string error = e.what();
    FUZZ_CHECK(!error.empty() && error.find('\n') == std::string::npos, "the error is not one line: \"%s\"", e.what());
    return;
  }
  m->cfg.validate();  // throws (and so crashes the target) when the loader let a bad configuration through
  for (float x : m->params) FUZZ_CHECK(std::isfinite(x), "a parameter is %g", x);
  const std::string saved = path + ".saved";
  TrainState st = meta.train;
  checkpoint_save(saved, *m, meta.vocab_hash, meta.has_adam ? &st : nullptr);
  CheckpointMeta meta2;
  auto back = checkpoint_load(saved, &meta2);
  FUZZ_CHECK(back->params == m->params && back->adam_m == m->adam_m && back->adam_v == m->adam_v &&
                 config_difference(back->cfg, m->cfg).empty() && meta2.step == meta.step,
             "save and load changed the checkpoint");
  // a source that fits the model with its </s> (max_len may be as small as 2): longer ones are refused
  const int words = std::min(2, m->cfg.max_len - 1);
  const std::vector<std::vector<int>> src = {std::vector<int>(words, kEosId + 1)};
  const std::vector<Hypothesis> out = greedy_decode(*m, src, 3);
  FUZZ_CHECK(out.size() == 1 && (int)out[0].tokens.size() <= max_output_length(m->cfg, words, 3), "decoding ran past its limit");
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = scratch_file("checkpoint");
  std::string bytes((const char*)data, size);
  try_load(path, bytes);
  if (size >= 8) {
    const uint64_t sum = fnv1a64(bytes.substr(0, size - 8));
    std::memcpy(&bytes[size - 8], &sum, 8);
    try_load(path, bytes);
  }
  return 0;
}
