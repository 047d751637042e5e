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
#include <sys/stat.h>
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
static constexpr uint32_t kCheckpointVersion = 2;  // 2 added the run's id, --batch-tokens and --merges; 1 still loads

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
  put(t.run), put(t.batch_tokens), put(t.merges);
  const uint64_t n = m.params.size();
  put(n);
  auto put_array = [&](const std::vector<float>& v) { buf.append((const char*)v.data(), v.size() * sizeof(float)); };
  put_array(m.params);
  if (has_adam) put_array(m.adam_m), put_array(m.adam_v);
  put(fnv1a64(0xCBF29CE484222325ull, buf.data(), buf.size()));
  write_file_atomically(path, buf);  // a crash never leaves half a checkpoint under its name
}

namespace {

// A checkpoint file read only as far as the loader asks: the header, then the size the header declares.
// A directory, /dev/zero or a large file of something else costs a few bytes, not the whole file.
struct CheckpointFile {
  const std::string& path;
  FILE* f;
  long long size = -1;  // a regular file's size; -1 for a pipe or a device, read until the size declared
  std::string buf;      // what has been read, from the start
  explicit CheckpointFile(const std::string& p) : path(p), f(std::fopen(p.c_str(), "rb")) {
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0) throw std::runtime_error("cannot read checkpoint " + path + ": " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) {
      std::fclose(f);
      throw std::runtime_error(path + ": a directory, not a checkpoint (give a file such as " + path + "/model.bin)");
    }
    if (S_ISREG(st.st_mode)) size = st.st_size;
  }
  ~CheckpointFile() { std::fclose(f); }
  CheckpointFile(const CheckpointFile&) = delete;
  CheckpointFile& operator=(const CheckpointFile&) = delete;
  std::runtime_error truncated(uint64_t declared) const {
    return std::runtime_error(path + ": truncated checkpoint (" + std::to_string(size >= 0 ? (uint64_t)size : buf.size()) +
                              " bytes" + (declared ? ", its header declares " + std::to_string(declared) : "") + ")");
  }
  // Reads until `buf` holds n bytes, a chunk at a time: memory grows with what the file holds, whatever n
  // says. False when the file ends first.
  bool fill(uint64_t n) {
    while (buf.size() < n) {
      const size_t want = (size_t)std::min<uint64_t>(n - buf.size(), 1 << 20), at = buf.size();
      buf.resize(at + want);
      const size_t got = std::fread(&buf[at], 1, want, f);
      buf.resize(at + got);
      if (got == 0) return false;
    }
    return true;
  }
  void need(uint64_t n, uint64_t declared = 0) {
    if (!fill(n)) throw truncated(declared);
  }
  // The whole checkpoint, `declared` bytes by its header: a regular file's size is checked before reading
  // on; a pipe is read to that size and must end there.
  void read_all(uint64_t declared) {
    if (size >= 0 && (uint64_t)size < declared) throw truncated(declared);
    const auto extra = [&](const std::string& more) {
      return std::runtime_error(path + ": " + std::to_string(declared) + " bytes of checkpoint, as its header declares, then " + more +
                                " (something was appended, or it is not a checkpoint of this program)");
    };
    if (size >= 0 && (uint64_t)size > declared) throw extra(std::to_string((uint64_t)size - declared) + " more");
    if (size >= 0) buf.reserve(declared);
    need(declared, declared);
    if (std::fgetc(f) != EOF) throw extra("more");
  }
};

struct Header {
  Config c;
  CheckpointMeta meta;
  uint64_t seed = 0, n = 0;  // n: the parameter count
  uint64_t bytes = 0;        // the whole file's, as the header declares it (saturated at UINT64_MAX)
};

// The magic, the version and the header's fields; the enum and bool fields read as bytes and checked.
Header read_header(CheckpointFile& in) {
  const std::string& path = in.path;
  size_t at = 0;
  auto get = [&](auto& x) {
    in.need(at + sizeof x);
    std::memcpy(&x, in.buf.data() + at, sizeof x);
    at += sizeof x;
  };
  if (!in.fill(8) || std::memcmp(in.buf.data(), kCheckpointMagic, 8) != 0) throw std::runtime_error(path + ": not a checkpoint of this program");
  at = 8;
  uint32_t version;
  get(version);
  if (version != 1 && version != kCheckpointVersion)
    throw std::runtime_error(path + ": checkpoint format version " + std::to_string(version) + ", this program reads versions 1 to " +
                             std::to_string(kCheckpointVersion));
  Header h;
  config_fields(h.c, [&](const char* name, auto& x) {
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
  CheckpointMeta& mt = h.meta;
  uint8_t has_adam;
  get(mt.vocab_hash), get(mt.step), get(h.seed), get(has_adam);
  if (has_adam > 1) throw std::runtime_error(path + ": not a checkpoint of this program (has_adam is " + std::to_string(has_adam) + ")");
  mt.has_adam = has_adam;
  get(mt.train.epoch), get(mt.train.batch), get(mt.train.elapsed), get(mt.train.tokens);
  if (version >= 2) get(mt.train.run), get(mt.train.batch_tokens), get(mt.train.merges);
  get(h.n);
  const uint64_t arrays = has_adam ? 3 : 1, room = UINT64_MAX - at - sizeof(uint64_t);
  h.bytes = h.n > room / (arrays * sizeof(float)) ? UINT64_MAX : at + arrays * h.n * sizeof(float) + sizeof(uint64_t);
  return h;
}

}  // namespace

CheckpointMeta checkpoint_meta(const std::string& path) {
  CheckpointFile in(path);
  return read_header(in).meta;
}

std::unique_ptr<Transformer<float>> checkpoint_load(const std::string& path, CheckpointMeta* meta) {
  CheckpointFile in(path);
  Header h = read_header(in);
  const size_t at = in.buf.size();  // where the parameters start
  in.read_all(h.bytes);
  const std::string& buf = in.buf;
  uint64_t stored;
  std::memcpy(&stored, buf.data() + buf.size() - sizeof stored, sizeof stored);
  if (stored != fnv1a64(0xCBF29CE484222325ull, buf.data(), buf.size() - sizeof stored))
    throw std::runtime_error(path + ": checksum mismatch (the checkpoint is corrupt)");
  const Config& c = h.c;
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  const TrainState& t = h.meta.train;
  if (h.meta.step < 0 || t.epoch < 0 || t.batch < 0 || t.tokens < 0 || !(t.elapsed >= 0 && std::isfinite(t.elapsed)) ||
      t.batch_tokens < 0 || t.merges < -1)
    throw std::runtime_error(path + ": not a checkpoint of this program (impossible training state)");
  // The configuration's size is checked before anything is allocated: the embedding (V x D) and every
  // layer's D x D and D x F weights are each part of the n parameters, and there are N layers; then the
  // exact count.
  const uint64_t n = h.n;
  const bool fits = (uint64_t)c.N <= n && (uint64_t)c.V * c.D <= n && (uint64_t)c.D * c.D <= n && (uint64_t)c.D * c.F <= n;
  if (!fits || parameter_layout<float>(c, nullptr, nullptr, nullptr) != n)
    throw std::runtime_error(path + ": parameter count does not match its configuration");
  auto m = std::make_unique<Transformer<float>>(c, h.seed);
  size_t from = at;
  auto get_array = [&](std::vector<float>& v, bool adam_v) {
    std::memcpy(v.data(), buf.data() + from, n * sizeof(float));
    from += n * sizeof(float);
    for (float x : v)
      if (!std::isfinite(x) || (adam_v && x < 0))
        throw std::runtime_error(path + ": a parameter or optimizer value is " + std::to_string(x) + " (the checkpoint is corrupt)");
  };
  get_array(m->params, false);
  if (h.meta.has_adam) get_array(m->adam_m, false), get_array(m->adam_v, true);
  m->step = h.meta.step;
  if (meta) *meta = h.meta;
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
    if (meta.train.run != first.train.run) throw std::runtime_error(paths[i] + ": another run than " + paths[0]);
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
