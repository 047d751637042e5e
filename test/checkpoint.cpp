// checkpoint: the checkpoint file (transformer.h, "checkpoints"): a round trip keeps the configuration,
// every parameter, Adam's state, the step, seed and training state (the run's id and options too) bit for
// bit; a version-1 file (test/fuzz/corpus/checkpoint/tiny_adam.bin, the argument's folder) still loads;
// averaging (§6) gives the element-wise mean, of one run's checkpoints only; a corrupted, truncated,
// extended, foreign or other-version file, a directory and /dev/zero are refused with a message (the last
// two without reading them whole), and so is one whose checksum is right but whose header declares sizes
// the file does not hold or a configuration out of range (an infinite LayerNorm epsilon).
// Usage: checkpoint CORPUS_DIR
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <unistd.h>

#include "../transformer.h"
#include "check.h"

static std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
static void spit(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// true when `call` fails with a message containing `expect`
template <typename Call> static bool fails_with(Call call, const std::string& expect) {
  try {
    call();
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).find(expect) != std::string::npos) return true;
    std::fprintf(stderr, "message '%s' lacks '%s'\n", e.what(), expect.c_str());
  }
  return false;
}
// true when loading fails with a message containing `expect`
static bool refused(const std::string& path, const std::string& expect) {
  return fails_with([&] { checkpoint_load(path, nullptr); }, expect);
}

int main(int argc, char** argv) {
  Checker ck("checkpoint");
  if (argc != 2) {
    std::fprintf(stderr, "usage: checkpoint CORPUS_DIR (test/fuzz/corpus/checkpoint)\n");
    return 1;
  }
  Config c = config_preset("tiny");
  c.V = 50, c.N = 1, c.pre_ln = true;
  Transformer<float> a(c, 7), b(c, 8);
  for (size_t i = 0; i < a.params.size(); ++i) a.adam_m[i] = 0.5f * i, a.adam_v[i] = 1.0f / (1 + i);
  a.step = 123;
  TrainState st{4, 17, 12.5, 9999, 0x1234567890ABCDEFull, 2048, 60};
  const std::string p = "checkpoint_test_a.bin", q = "checkpoint_test_b.bin", r = "checkpoint_test_avg.bin", bad = "checkpoint_test_bad.bin";
  checkpoint_save(p, a, 0xABCDEF, &st);
  CheckpointMeta meta;
  auto back = checkpoint_load(p, &meta);
  ck.expect(config_difference(back->cfg, a.cfg).empty(), "configuration changed: %s", config_difference(back->cfg, a.cfg).c_str());
  ck.expect(back->params == a.params && back->adam_m == a.adam_m && back->adam_v == a.adam_v, "parameters or Adam state changed");
  ck.expect(back->step == 123 && back->seed == 7 && meta.step == 123 && meta.has_adam, "step or seed changed");
  ck.expect(meta.vocab_hash == 0xABCDEF, "vocabulary hash changed");
  ck.expect(meta.train.epoch == 4 && meta.train.batch == 17 && meta.train.elapsed == 12.5 && meta.train.tokens == 9999, "training state changed");
  ck.expect(meta.train.run == st.run && meta.train.batch_tokens == 2048 && meta.train.merges == 60, "the run's id or options changed");
  const CheckpointMeta head = checkpoint_meta(p);
  ck.expect(head.train.run == st.run && head.step == 123 && head.has_adam, "checkpoint_meta reads the header");
  CheckpointMeta old_meta;
  const std::string old = std::string(argv[1]) + "/tiny_adam.bin";  // written by version 1 of the format
  try {
    auto m = checkpoint_load(old, &old_meta);
    ck.expect(old_meta.has_adam && old_meta.train.run == 0 && old_meta.train.batch_tokens == 0 && old_meta.train.merges == -1,
              "a version-1 checkpoint loads, its run unknown");
  } catch (const std::runtime_error& e) {
    ck.expect(false, "a version-1 checkpoint loads: %s", e.what());
  }

  // [§6] averaging
  b.step = 200;
  checkpoint_save(q, b, 0xABCDEF, &st);
  ck.expect(checkpoint_average({p, q}, r) == 2, "averaged two checkpoints");
  CheckpointMeta avg_meta;
  auto avg = checkpoint_load(r, &avg_meta);
  for (size_t i = 0; i < a.params.size(); ++i)
    ck.close(avg->params[i], ((double)a.params[i] + b.params[i]) / 2, 1e-7, 1e-12, "averaged parameter");  // rounding to float: <= 2^-24
  ck.expect(!avg_meta.has_adam && avg_meta.step == 200, "the average has no Adam state and the newest step");
  Config other = c;
  other.pre_ln = false;
  Transformer<float> o(other, 1);
  checkpoint_save(bad, o, 0xABCDEF, nullptr);
  const auto average_with_bad = [&] { checkpoint_average({p, bad}, r); };
  ck.expect(fails_with(average_with_bad, "pre_ln"), "averaging checkpoints of different configurations is refused, naming the field");
  checkpoint_save(bad, b, 0x123, nullptr);
  ck.expect(fails_with(average_with_bad, "vocabulary"), "averaging checkpoints of different vocabularies is refused");
  TrainState other_run = st;
  other_run.run += 1;
  checkpoint_save(bad, b, 0xABCDEF, &other_run);
  ck.expect(fails_with(average_with_bad, "another run"), "averaging checkpoints of two runs is refused");

  // bad files
  const std::string good = slurp(p);
  ck.expect(refused("no_such_checkpoint.bin", "cannot read"), "a missing file");
  spit(bad, good.substr(0, good.size() / 2));
  ck.expect(refused(bad, "truncated checkpoint (" + std::to_string(good.size() / 2) + " bytes, its header declares " +
                             std::to_string(good.size()) + ")"), "a truncated file");
  spit(bad, good + "appended");
  ck.expect(refused(bad, std::to_string(good.size()) + " bytes of checkpoint, as its header declares, then 8 more"), "bytes after the end");
  ck.expect(refused(".", "a directory, not a checkpoint"), "a directory");
  alarm(10);  // read whole, /dev/zero never ends: the test dies here
  ck.expect(refused("/dev/zero", "not a checkpoint"), "/dev/zero, refused after its first bytes");
  alarm(0);
  spit(bad, good.substr(0, 20));
  ck.expect(refused(bad, "truncated"), "a file cut inside the header");
  std::string flipped = good;
  flipped[good.size() / 2] ^= 1;
  spit(bad, flipped);
  ck.expect(refused(bad, "checksum"), "a flipped bit");
  spit(bad, "PK\x03\x04 this is a zip file, not a checkpoint at all.......");
  ck.expect(refused(bad, "not a checkpoint"), "a foreign file");
  std::string version = good;
  version[8] = 99;
  spit(bad, version);
  ck.expect(refused(bad, "version 99"), "another format version");
  spit(bad, "");
  ck.expect(refused(bad, "not a checkpoint"), "an empty file");
  // Headers that pass the checksum (resealed here) but lie: the loader must refuse them before it
  // allocates anything (fuzz_checkpoint tries many more). Offsets: magic 8, version 4, then N, D, F, H, V
  // (int32 each), max_len, 5 doubles, ls_form (int32), ln_eps, pre_ln (1 byte).
  auto resealed = [&](std::string b) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i + 8 < b.size(); ++i) h = (h ^ (unsigned char)b[i]) * 0x100000001B3ull;
    std::memcpy(&b[b.size() - 8], &h, 8);
    return b;
  };
  auto with_int = [&](size_t at, int32_t v) {
    std::string b = good;
    std::memcpy(&b[at], &v, 4);
    return resealed(b);
  };
  spit(bad, resealed(good));
  ck.expect(checkpoint_load(bad, nullptr)->params == a.params, "resealing an unchanged file keeps it loadable");
  spit(bad, with_int(16, 1 << 20));  // D = 2^20: an embedding of V x 2^20 floats the file does not hold
  ck.expect(refused(bad, "parameter count does not match"), "a header declaring d_model 2^20");
  spit(bad, with_int(12, 1 << 30));  // N = 2^30 layers
  ck.expect(refused(bad, "parameter count does not match"), "a header declaring 2^30 layers");
  spit(bad, with_int(16, -4));
  ck.expect(refused(bad, "d_model"), "a negative d_model");
  const size_t ln_eps_at = 12 + 6 * 4 + 4 * 8 + 4;
  for (double eps : {(double)INFINITY, (double)NAN, 0.0, 10.0}) {
    std::string b = good;
    std::memcpy(&b[ln_eps_at], &eps, sizeof eps);
    spit(bad, resealed(b));
    ck.expect(refused(bad, "LayerNorm epsilon must be in [1e-12, 1]"), "a LayerNorm epsilon of %g", eps);
  }
  const size_t ls_form_at = 12 + 6 * 4 + 4 * 8;
  spit(bad, with_int(ls_form_at, 7));
  ck.expect(refused(bad, "ls_form is 7"), "an unknown label-smoothing form");
  std::string pre_ln = good;
  pre_ln[ls_form_at + 4 + 8] = 2;  // a bool holding 2
  spit(bad, resealed(pre_ln));
  ck.expect(refused(bad, "pre_ln is 2"), "a bool that is neither 0 nor 1");
  std::string nan_param = good;
  const float nan = NAN;
  std::memcpy(&nan_param[good.size() - 8 - 3 * a.params.size() * sizeof(float)], &nan, sizeof nan);
  spit(bad, resealed(nan_param));
  ck.expect(refused(bad, "is nan"), "a NaN parameter");
  ck.expect(config_difference(c, c).empty() && config_difference(c, other) == "pre_ln 1 vs 0", "config_difference names the field");
  for (const std::string& f : {p, q, r, bad}) std::remove(f.c_str());
  return ck.finish();
}
