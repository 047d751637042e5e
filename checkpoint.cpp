// checkpoint.cpp: the checkpoint file format (a model's configuration, parameters, Adam's moments and the
// training state, with a checksum): save, load, average, and the parameters' hash. The format itself is
// in NOTES.md ("Training (§5) and checkpoints (§6)"); the interface in transformer.h.
#include "transformer.h"
#include "tokenizer.h"  // write_file_atomically

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

// Every configuration field with its name, in file order: the one list that save, load and
// config_difference share.
template <typename C, typename Visit> static void config_fields(C& c, Visit visit) {
  visit("N", c.N), visit("D", c.D), visit("F", c.F), visit("H", c.H), visit("V", c.V), visit("max_len", c.max_len);
  visit("p_drop", c.p_drop), visit("p_attn", c.p_attn), visit("p_relu", c.p_relu), visit("eps_ls", c.eps_ls);
  visit("ls_form", c.ls_form), visit("ln_eps", c.ln_eps), visit("pre_ln", c.pre_ln), visit("warmup", c.warmup);
  visit("lr_scale", c.lr_scale), visit("beta1", c.beta1), visit("beta2", c.beta2), visit("adam_eps", c.adam_eps);
  visit("clip_norm", c.clip_norm);
}

std::string config_difference(const Config& a, const Config& b) {
  std::vector<std::string> names, av, bv;
  auto text = [](double x) {
    char s[32];
    std::snprintf(s, sizeof s, "%.17g", x);
    return std::string(s);
  };
  config_fields(a, [&](const char* name, const auto& x) { names.push_back(name), av.push_back(text((double)x)); });
  config_fields(b, [&](const char*, const auto& x) { bv.push_back(text((double)x)); });
  for (size_t i = 0; i < names.size(); ++i)
    if (av[i] != bv[i]) return names[i] + " " + av[i] + " vs " + bv[i];
  return "";
}

static constexpr char kCheckpointMagic[8] = {'T', 'R', 'A', 'N', 'S', 'F', 'M', 'R'};
static constexpr uint32_t kCheckpointVersion = 1;

static uint64_t fnv1a64(uint64_t h, const void* data, size_t n) {
  const unsigned char* p = (const unsigned char*)data;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

void checkpoint_save(const std::string& path, const Transformer<float>& m, uint64_t vocab_hash, const TrainState* train) {
  std::string buf(kCheckpointMagic, 8);
  auto put = [&](const auto& x) { buf.append((const char*)&x, sizeof x); };
  put(kCheckpointVersion);
  config_fields(m.cfg, [&](const char*, const auto& x) { put(x); });
  put(vocab_hash);
  put(m.step);
  put(m.seed);
  const uint8_t has_adam = train != nullptr;
  put(has_adam);
  const TrainState none;
  const TrainState& t = train ? *train : none;
  put(t.epoch), put(t.batch), put(t.elapsed), put(t.tokens);
  const uint64_t n = m.params.size();
  put(n);
  auto put_array = [&](const std::vector<float>& v) { buf.append((const char*)v.data(), v.size() * sizeof(float)); };
  put_array(m.params);
  if (has_adam) put_array(m.adam_m), put_array(m.adam_v);
  put(fnv1a64(0xCBF29CE484222325ull, buf.data(), buf.size()));
  write_file_atomically(path, buf);  // a crash never leaves half a checkpoint under its name
}

std::unique_ptr<Transformer<float>> checkpoint_load(const std::string& path, CheckpointMeta* meta) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot read checkpoint " + path + ": " + std::strerror(errno));
  std::string buf;
  char chunk[1 << 16];
  for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) buf.append(chunk, n);
  std::fclose(f);
  size_t at = 0;
  auto truncated = [&]() { return std::runtime_error(path + ": truncated checkpoint (" + std::to_string(buf.size()) + " bytes)"); };
  auto get = [&](auto& x) {
    if (at + sizeof x > buf.size()) throw truncated();
    std::memcpy(&x, buf.data() + at, sizeof x);
    at += sizeof x;
  };
  if (buf.size() < 8 || std::memcmp(buf.data(), kCheckpointMagic, 8) != 0) throw std::runtime_error(path + ": not a checkpoint of this program");
  at = 8;
  uint32_t version;
  get(version);
  if (version != kCheckpointVersion)
    throw std::runtime_error(path + ": checkpoint format version " + std::to_string(version) + ", this program reads version " +
                             std::to_string(kCheckpointVersion));
  Config c;
  config_fields(c, [&](const char* name, auto& x) {
    using Field = std::decay_t<decltype(x)>;
    if constexpr (std::is_same_v<Field, bool> || std::is_enum_v<Field>) {  // read as bytes, checked before use
      typename std::conditional_t<std::is_enum_v<Field>, std::underlying_type<Field>, std::common_type<uint8_t>>::type raw;
      get(raw);
      if (raw != 0 && raw != 1) throw std::runtime_error(path + ": not a checkpoint of this program (" + name + " is " + std::to_string(raw) + ")");
      x = static_cast<Field>(raw);
    } else {
      get(x);
    }
  });
  CheckpointMeta mt;
  long step;
  uint64_t seed, n;
  uint8_t has_adam;
  get(mt.vocab_hash), get(step), get(seed), get(has_adam);
  get(mt.train.epoch), get(mt.train.batch), get(mt.train.elapsed), get(mt.train.tokens);
  get(n);
  const size_t arrays = has_adam ? 3 : 1;
  if (n > buf.size() || at + arrays * n * sizeof(float) + sizeof(uint64_t) != buf.size()) throw truncated();
  uint64_t stored;
  std::memcpy(&stored, buf.data() + buf.size() - sizeof stored, sizeof stored);
  if (stored != fnv1a64(0xCBF29CE484222325ull, buf.data(), buf.size() - sizeof stored))
    throw std::runtime_error(path + ": checksum mismatch (the checkpoint is corrupt)");
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  if (has_adam > 1 || step < 0 || mt.train.epoch < 0 || mt.train.batch < 0 || mt.train.tokens < 0 || !(mt.train.elapsed >= 0))
    throw std::runtime_error(path + ": not a checkpoint of this program (impossible training state)");
  // The configuration's size is checked before anything is allocated, so a header cannot ask for more
  // memory than the file holds: the embedding (V x D) and every layer's D x D and D x F weights are each
  // part of the n parameters, and there are N layers; then the exact count.
  const bool fits = (uint64_t)c.N <= n && (uint64_t)c.V * c.D <= n && (uint64_t)c.D * c.D <= n && (uint64_t)c.D * c.F <= n;
  if (!fits || parameter_layout<float>(c, nullptr, nullptr, nullptr) != n)
    throw std::runtime_error(path + ": parameter count does not match its configuration");
  auto m = std::make_unique<Transformer<float>>(c, seed);
  auto get_array = [&](std::vector<float>& v, bool adam_v) {
    std::memcpy(v.data(), buf.data() + at, n * sizeof(float));
    at += n * sizeof(float);
    for (float x : v)
      if (!std::isfinite(x) || (adam_v && x < 0))
        throw std::runtime_error(path + ": a parameter or optimizer value is " + std::to_string(x) + " (the checkpoint is corrupt)");
  };
  get_array(m->params, false);
  if (has_adam) get_array(m->adam_m, false), get_array(m->adam_v, true);
  m->step = step;
  mt.step = step;
  mt.has_adam = has_adam;
  if (meta) *meta = mt;
  return m;
}

int checkpoint_average(const std::vector<std::string>& paths, const std::string& out) {
  if (paths.empty()) throw std::invalid_argument("checkpoint averaging needs at least one checkpoint");
  CheckpointMeta first;
  std::unique_ptr<Transformer<float>> avg = checkpoint_load(paths[0], &first);
  std::vector<double> sum(avg->params.begin(), avg->params.end());
  for (size_t i = 1; i < paths.size(); ++i) {
    CheckpointMeta meta;
    std::unique_ptr<Transformer<float>> m = checkpoint_load(paths[i], &meta);
    std::string diff = config_difference(avg->cfg, m->cfg);
    if (!diff.empty()) throw std::runtime_error(paths[i] + ": another configuration than " + paths[0] + " (" + diff + ")");
    if (meta.vocab_hash != first.vocab_hash) throw std::runtime_error(paths[i] + ": another vocabulary than " + paths[0]);
    for (size_t j = 0; j < sum.size(); ++j) sum[j] += m->params[j];
    avg->step = std::max(avg->step, m->step);
  }
  for (size_t j = 0; j < sum.size(); ++j) avg->params[j] = (float)(sum[j] / paths.size());
  checkpoint_save(out, *avg, first.vocab_hash, nullptr);
  return (int)paths.size();
}

uint64_t parameter_hash(Transformer<float>& m) {
  transformer_download(m);
  return fnv1a64(0xCBF29CE484222325ull, m.params.data(), m.params.size() * sizeof(float));
}
