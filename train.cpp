// ./train: trains the Transformer on Multi30k (data/multi30k, `make data`) or, without it, on the
// built-in corpus of English and German number words (data/numbers.h). §5 of the paper: batches of
// similar length (§5.1), Adam with the Eq. 3 schedule (§5.3), dropout and label smoothing (§5.4);
// validation with the decoding and BLEU of ./translate; checkpoints, resuming and averaging (§6).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "bleu.h"
#include "data/numbers.h"
#include "parallel.h"
#include "svg.h"
#include "tokenizer.h"
#include "transformer.h"

namespace {

constexpr uint64_t kNumberCorpusSeed = 20170612;  // the corpus is fixed; --seed varies the model

struct Options {
  std::string data, src = "en", tgt = "de", config, out, vocab;
  std::map<std::string, std::string> overrides;  // --layers 4 etc., applied over the preset
  int merges = -1;           // -1: 8000 on Multi30k, 60 on the number corpus
  // -1 below: the default, which may depend on the corpus and the preset (apply_defaults)
  int batch_tokens = -1;     // 4096 (small and up), 2048 (multi30k), 1024 (tiny)
  long epochs = -1, max_steps = -1;
  double time_limit = -1;    // seconds; -1: none (Multi30k), 175 (number corpus)
  std::string device;  // "": cuda when a GPU is present, else cpu
  uint64_t seed = 1;
  bool resume = false, overwrite = false, bpe_only = false, quiet = false;
  std::string precision;  // "": default_precision() on the GPU
  double checkpoint_minutes = -1;  // 10; 0: one checkpoint at the end of every epoch (--checkpoint-every epoch)
  int patience = -1;               // validations without a better validation loss before stopping; 0: never
  int keep = -1, average = -1;     // 5 and 0 (none)
  long val_every = -1;       // steps; -1: once per epoch
  int val_sentences = -1;    // -1: all (number corpus), 500 (Multi30k)
  int test_sentences = -1;   // -1: all
  int log_every = 1;
  int accumulate = -1;              // batches per rank whose gradients one optimizer step sums: 1 (4 in multi30k)
  double collective_timeout = 600;  // seconds a rank waits for the others in an all-reduce
  long check_every = 100;           // steps between checks that every rank holds the same parameters
  std::string batches_out;          // write the batches trained on here (a peer replays them: make bench)
  std::set<std::string> given;      // the options on the command line (the others are defaults)
};

int g_rank = 0;  // this process's rank (data parallelism): rank 0 alone prints

[[noreturn]] void fail(const std::string& msg) { fail_on_rank(g_rank, msg); }

void usage() {
  std::printf(
      "usage: ./train [options]\n"
      "Trains on Multi30k when data/multi30k has it (`make data`), else on the built-in number corpus.\n"
      "data\n"
      "  --data DIR|numbers     corpus folder (DIR/train.SRC, val, test_2016_flickr) or the built-in corpus\n"
      "                         (default: data/multi30k if present, else numbers)\n"
      "  --src L --tgt L        languages (default en, de)\n"
      "  --vocab FILE           use this BPE vocabulary instead of learning one\n"
      "  --merges N             BPE merges to learn (default 8000 on Multi30k, 60 on numbers)\n"
      "  --bpe-only             learn (or load) the vocabulary, then print how each stdin line splits\n"
      "model (--config, then overrides)\n"
      "  --config NAME          tiny | small | multi30k | base | big (default small on Multi30k, tiny on numbers);\n"
      "                         multi30k is a whole recipe: 4+4 layers, d_model 128, steps of 4 x 2048 tokens, at most\n"
      "                         8000 steps, a checkpoint each epoch, --patience 10, --average 10\n"
      "  --layers N --d-model D --d-ff F --heads H --max-len L\n"
      "  --dropout P            residual and embedding dropout [§5.4]\n"
      "  --label-smoothing E    [§5.4] (default 0.1)\n"
      "  --pre-ln               LayerNorm inside the residual branch (default: post-LN, as §3.1)\n"
      "training\n"
      "  --batch-tokens N       source and target tokens per batch, each (default 4096; 1024 for tiny; 2048 for\n"
      "                         multi30k) [§5.1]\n"
      "  --accumulate K         sum the gradients of K batches before each optimizer step (default 1; 4 for\n"
      "                         multi30k): a step then takes K x ranks batches, its loss normalised by all\n"
      "                         their target tokens\n"
      "  --warmup N --lr-scale S  Eq. 3 schedule (default: the preset's)\n"
      "  --clip-norm C          global gradient-norm clipping [DEVIATION] (default off)\n"
      "  --epochs N --max-steps N --time-limit SECONDS   stop at the first reached (default: 40 epochs on\n"
      "                         Multi30k; 8000 steps for multi30k; 175 s on numbers)\n"
      "  --device cpu|cuda      (default: cuda when a GPU is present, else cpu)\n"
      "  --precision fp32|tf32|bf16  the GPU's matrix products: fp32 (the reference), TF32 or bf16 tensor\n"
      "                         cores (mixed precision: fp32 parameters, gradients and Adam; in both,\n"
      "                         attention's products TF32 where d_k is a multiple of 16) (default bf16 on\n"
      "                         a GPU that has it, else fp32)\n"
      "  --seed N               initialisation, dropout and batch order (default 1)\n"
      "  --out DIR              run folder: vocab.bpe, ckpt-*.bin, model.bin, log.csv, curves.svg\n"
      "                         (default runs/multi30k-SRC-TGT or runs/numbers)\n"
      "  --resume               continue from DIR/model.bin (same options as the first run; the vocabulary,\n"
      "                         --batch-tokens and --merges are the run's)\n"
      "  --overwrite            start a new run in a DIR that holds one, deleting its checkpoints, log and\n"
      "                         vocabulary (without --resume or --overwrite, such a DIR is refused)\n"
      "  --checkpoint-every M|epoch  minutes between checkpoints, or one at the end of every epoch (default\n"
      "                         10 minutes; epoch for multi30k; one is also written at the end)\n"
      "  --patience N           stop when N validations in a row bring no lower validation loss (default off;\n"
      "                         10 for multi30k)\n"
      "  --keep K               checkpoints kept (default 5, or --average's N; 10 for multi30k)\n"
      "  --average N            [§6] at the end, write DIR/averaged.bin, the mean of the last N checkpoints\n"
      "                         (default none; 10 for multi30k)\n"
      "  --val-every N          steps between validations (default: once per epoch)\n"
      "  --val-sentences N      validation sentences decoded for BLEU (default all on numbers, 500 on Multi30k)\n"
      "  --test-sentences N     test sentences decoded for BLEU at the end (default all; 0: none, the test loss\n"
      "                         alone, which is always over all)\n"
      "  --log-every N          steps between lines of log.csv (default 1)\n"
      "  --quiet                no progress line\n"
      "  --batches-out FILE     write the model's shape and every batch trained on (token ids) to FILE, for\n"
      "                         another implementation to train on the same batches (make bench's PyTorch peer)\n"
      "data parallelism: mpirun -np N ./train ... (a build with MPI; NCCL between GPUs)\n"
      "  --collective-timeout S seconds a rank waits for the others in an all-reduce before it stops (default\n"
      "                         600; it must cover rank 0's validation and checkpoints)\n"
      "  --check-every N        steps between checks that every rank holds the same parameters (default 100)\n");
}

long to_long(const std::string& flag, const std::string& v, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || errno || x < lo || x > hi)
    fail(flag + " needs an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'");
  return x;
}

double to_double(const std::string& flag, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || !(x >= lo && x <= hi)) {
    char range[64];
    std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
    fail(flag + " needs a number in " + range + ", got '" + v + "'");
  }
  return x;
}

bool is_dir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
bool is_file(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Options parse(int argc, char** argv) {
  Options o;
  static const char* const kOverrides[] = {"--layers", "--d-model", "--d-ff", "--heads", "--max-len", "--dropout",
                                           "--label-smoothing", "--warmup", "--lr-scale", "--clip-norm"};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(a + " needs a value (see --help)");
      return argv[++i];
    };
    o.given.insert(a);
    if (a == "-h" || a == "--help") usage(), std::exit(0);
    else if (a == "--data") o.data = value();
    else if (a == "--src") o.src = value();
    else if (a == "--tgt") o.tgt = value();
    else if (a == "--vocab") o.vocab = value();
    else if (a == "--merges") o.merges = (int)to_long(a, value(), 0, 1000000);
    else if (a == "--bpe-only") o.bpe_only = true;
    else if (a == "--config") o.config = value();
    else if (std::find(std::begin(kOverrides), std::end(kOverrides), a) != std::end(kOverrides)) o.overrides[a] = value();
    else if (a == "--pre-ln") o.overrides[a] = "1";
    else if (a == "--batch-tokens") o.batch_tokens = (int)to_long(a, value(), 16, 10000000);
    else if (a == "--epochs") o.epochs = to_long(a, value(), 1, 1000000);
    else if (a == "--max-steps") o.max_steps = to_long(a, value(), 1, LONG_MAX);
    else if (a == "--time-limit") o.time_limit = to_double(a, value(), 1, 1e9);
    else if (a == "--device") o.device = value();
    else if (a == "--precision") o.precision = value();
    else if (a == "--seed") o.seed = (uint64_t)to_long(a, value(), 0, LONG_MAX);
    else if (a == "--out") o.out = value();
    else if (a == "--resume") o.resume = true;
    else if (a == "--overwrite") o.overwrite = true;
    else if (a == "--checkpoint-every") {
      const std::string v = value();
      o.checkpoint_minutes = v == "epoch" ? 0 : to_double(a, v, 0.001, 1e6);
    } else if (a == "--patience") o.patience = (int)to_long(a, value(), 1, 1000000);
    else if (a == "--keep") o.keep = (int)to_long(a, value(), 1, 1000);
    else if (a == "--average") o.average = (int)to_long(a, value(), 1, 1000);
    else if (a == "--val-every") o.val_every = to_long(a, value(), 1, LONG_MAX);
    else if (a == "--val-sentences") o.val_sentences = (int)to_long(a, value(), 0, 10000000);
    else if (a == "--test-sentences") o.test_sentences = (int)to_long(a, value(), 0, 10000000);
    else if (a == "--log-every") o.log_every = (int)to_long(a, value(), 1, 1000000);
    else if (a == "--quiet") o.quiet = true;
    else if (a == "--batches-out") o.batches_out = value();
    else if (a == "--accumulate") o.accumulate = (int)to_long(a, value(), 1, 4096);
    else if (a == "--collective-timeout") o.collective_timeout = to_double(a, value(), 0.1, 1e7);
    else if (a == "--check-every") o.check_every = to_long(a, value(), 1, LONG_MAX);
    else fail("unknown option '" + a + "' (see --help)");
  }
  if (!o.device.empty() && o.device != "cpu" && o.device != "cuda") fail("--device must be cpu or cuda, got '" + o.device + "'");
  if (o.resume && o.overwrite) fail("--resume continues the run in --out, --overwrite starts a new one there: give one of them");
  if (o.given.count("--merges") && !o.vocab.empty()) fail("--merges learns a vocabulary, --vocab gives one: give one of them");
  return o;
}

std::string preset_name(const Options& o, bool numbers) { return !o.config.empty() ? o.config : numbers ? "tiny" : "small"; }

// [DEVIATION] The multi30k recipe's decoding: the beam size and length penalty that ./translate --tune chose
// on Multi30k's validation set (NOTES.md, "The Multi30k recipe"), where §6 has beam 4 and alpha 0.6 (also
// chosen on its development set).
DecodeOptions recipe_decoding() {
  DecodeOptions d;
  d.beam = 5, d.alpha = 1.5;
  return d;
}

// The defaults the command line left open. The multi30k preset is a whole recipe (Wu et al. 2021's
// Transformer-tiny on Multi30k): besides its model it trains on about 8,000 tokens a step for at most 8,000
// steps, checkpoints every epoch, stops after 10 epochs without a lower validation loss, and averages the
// last 10 epoch checkpoints. [DEVIATION] §5.2 trains for a fixed number of steps and §6 averages the last
// 5 checkpoints, written at 10-minute intervals.
void apply_defaults(Options& o, const Config& cfg, bool numbers) {
  const bool recipe = preset_name(o, numbers) == "multi30k";
  auto open = [&](auto& v, auto plain, auto in_recipe) {
    if (v < 0) v = recipe ? in_recipe : plain;
  };
  // [DEVIATION] §5.1's batches hold about 25,000 source and 25,000 target tokens; Multi30k is small
  open(o.batch_tokens, cfg.D <= 64 ? 1024 : 4096, 2048);  // in the recipe 4 batches a step (faster than one of 8192)
  open(o.accumulate, 1, 4);
  if (o.time_limit < 0 && numbers && o.epochs < 0 && o.max_steps < 0) o.time_limit = 175;
  open(o.epochs, numbers ? 1000000L : 40L, 1000000L);
  open(o.max_steps, -1L, 8000L);
  open(o.checkpoint_minutes, 10.0, 0.0);
  open(o.patience, 0, 10);
  open(o.keep, std::max(5, o.average), std::max(10, o.average));
  open(o.average, 0, std::min(10, o.keep));
  if (o.val_sentences < 0) o.val_sentences = 500;
  if (o.average > o.keep) fail("--average " + std::to_string(o.average) + " needs --keep of at least as many checkpoints");
}

Config build_config(const Options& o, bool numbers) {
  Config c;
  try {
    c = config_preset(preset_name(o, numbers));
  } catch (const std::invalid_argument& e) {
    fail(std::string("--config: ") + e.what());
  }
  for (const auto& [flag, v] : o.overrides) {
    if (flag == "--layers") c.N = (int)to_long(flag, v, 1, 64);
    else if (flag == "--d-model") c.D = (int)to_long(flag, v, 1, 65536);
    else if (flag == "--d-ff") c.F = (int)to_long(flag, v, 1, 1 << 20);
    else if (flag == "--heads") c.H = (int)to_long(flag, v, 1, 1024);
    else if (flag == "--max-len") c.max_len = (int)to_long(flag, v, 2, 1 << 16);
    else if (flag == "--dropout") c.p_drop = to_double(flag, v, 0, 0.99);
    else if (flag == "--label-smoothing") c.eps_ls = to_double(flag, v, 0, 0.99);
    else if (flag == "--warmup") c.warmup = (int)to_long(flag, v, 1, 100000000);
    else if (flag == "--lr-scale") c.lr_scale = to_double(flag, v, 1e-9, 1e9);
    else if (flag == "--clip-norm") c.clip_norm = to_double(flag, v, 0, 1e9);
    else if (flag == "--pre-ln") c.pre_ln = true;
  }
  return c;
}

// ---- data -------------------------------------------------------------------------------------------

struct Split {
  std::vector<std::string> src, tgt;  // text
  std::string src_name, tgt_name;     // where it came from, for messages
};
struct Corpus {
  bool numbers = false;
  std::string description;
  Split train, val, test;
};

Corpus load_corpus(const Options& o) {
  Corpus c;
  std::string dir = o.data;
  if (dir.empty()) dir = is_file("data/multi30k/train." + o.src) ? "data/multi30k" : "numbers";
  if (dir == "numbers") {
    if (o.given.count("--src") || o.given.count("--tgt"))
      fail(std::string("--src and --tgt choose a corpus folder's languages; the built-in corpus is English -> German") +
           (o.data.empty() ? " (data/multi30k/train." + o.src + " is missing: `make data`, or give --data DIR)" : ""));
    c.numbers = true;
    NumberCorpus n = number_corpus(kNumberCorpusSeed, 30000, 500, 500);
    for (auto [split, pairs] : {std::pair{&c.train, &n.train}, std::pair{&c.val, &n.val}, std::pair{&c.test, &n.test}}) {
      for (const NumberPair& p : *pairs) split->src.push_back(p.en), split->tgt.push_back(p.de);
      split->src_name = "numbers (English)", split->tgt_name = "numbers (German)";
    }
    c.description = "the built-in corpus of number words, English -> German (30000/500/500 pairs)";
    if (o.data.empty()) c.description += "; for Multi30k run `make data`, then ./train again";
    return c;
  }
  if (!is_dir(dir)) fail("--data " + dir + ": no such folder (run `make data`, or use --data numbers)");
  for (auto [split, name] : {std::pair{&c.train, "train"}, std::pair{&c.val, "val"}, std::pair{&c.test, "test_2016_flickr"}}) {
    split->src_name = dir + "/" + name + "." + o.src;
    split->tgt_name = dir + "/" + name + "." + o.tgt;
    try {
      split->src = read_text_lines(split->src_name);
      split->tgt = read_text_lines(split->tgt_name);
    } catch (const std::runtime_error& e) {
      fail(std::string(e.what()) + " (run `make data`)");
    }
    for (auto [lines, name] : {std::pair{&split->src, &split->src_name}, std::pair{&split->tgt, &split->tgt_name}})
      for (size_t i = 0; i < lines->size(); ++i) {
        try {
          Tokenizer::normalise((*lines)[i]);
        } catch (const InvalidUtf8& e) {
          fail(*name + ":" + std::to_string(i + 1) + ": " + e.what());
        }
      }
    if (split->src.size() != split->tgt.size())
      fail(split->src_name + " has " + std::to_string(split->src.size()) + " lines but " + split->tgt_name + " has " +
           std::to_string(split->tgt.size()));
    if (split->src.empty()) fail(split->src_name + " is empty");
  }
  c.description = "Multi30k " + o.src + " -> " + o.tgt + " from " + dir + " (" + std::to_string(c.train.src.size()) + "/" +
                  std::to_string(c.val.src.size()) + "/" + std::to_string(c.test.src.size()) + " pairs)";
  return c;
}

struct Pair {
  std::vector<int> src, tgt;
  size_t line;  // 0-based line in the split
};

// Encodes a split; pairs with an empty side or too long for the model are skipped and counted.
std::vector<Pair> encode_split(const Split& s, const Tokenizer& tok, int max_len, long* empty, long* too_long) {
  std::vector<Pair> out;
  for (size_t i = 0; i < s.src.size(); ++i) {
    Pair p;
    p.line = i;
    p.src = tok.encode(s.src[i]);  // the text is valid UTF-8: load_corpus checked every line
    p.tgt = tok.encode(s.tgt[i]);
    if (p.src.empty() || p.tgt.empty()) {
      ++*empty;
      continue;
    }
    if ((int)p.src.size() + 1 > max_len || (int)p.tgt.size() + 1 > max_len) {
      ++*too_long;
      continue;
    }
    out.push_back(std::move(p));
  }
  return out;
}

// [§5.1] "Sentence pairs were batched together by approximate sequence length": sorted by length, then cut
// into batches of at most `tokens` source and `tokens` target positions (padding included).
std::vector<std::vector<int>> length_batches(const std::vector<Pair>& pairs, int tokens) {
  std::vector<int> order(pairs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return std::make_pair(pairs[a].src.size(), pairs[a].tgt.size()) < std::make_pair(pairs[b].src.size(), pairs[b].tgt.size());
  });
  std::vector<std::vector<int>> batches;
  std::vector<int> cur;
  size_t S = 0, T = 0;
  for (int i : order) {
    size_t s = std::max(S, pairs[i].src.size() + 1), t = std::max(T, pairs[i].tgt.size() + 1);
    if (!cur.empty() && (s * (cur.size() + 1) > (size_t)tokens || t * (cur.size() + 1) > (size_t)tokens)) {
      batches.push_back(cur);
      cur.clear();
      s = pairs[i].src.size() + 1, t = pairs[i].tgt.size() + 1;
    }
    cur.push_back(i);
    S = s, T = t;
  }
  if (!cur.empty()) batches.push_back(cur);
  return batches;
}

Batch to_batch(const std::vector<Pair>& pairs, const std::vector<int>& idx) {
  std::vector<const std::vector<int>*> s, t;
  for (int i : idx) s.push_back(&pairs[i].src), t.push_back(&pairs[i].tgt);
  return make_batch(s, t);
}

// --batches-out: what another implementation needs to train the same model on the same batches. A first
// line gives the model (Config's fields as NAME=VALUE); then each batch is a line "batch STEP B S T"
// followed by its src (B x S), tgt_in and tgt_out (B x T) ids, one line each, row by row, kPadId padding.
void write_model_line(std::ostream& f, const Config& c) {
  f << "model N=" << c.N << " D=" << c.D << " F=" << c.F << " H=" << c.H << " V=" << c.V << " max_len=" << c.max_len
    << " p_drop=" << c.p_drop << " p_attn=" << c.p_attn << " p_relu=" << c.p_relu << " eps_ls=" << c.eps_ls
    << " ln_eps=" << c.ln_eps << " pre_ln=" << c.pre_ln << " warmup=" << c.warmup << " lr_scale=" << c.lr_scale
    << " beta1=" << c.beta1 << " beta2=" << c.beta2 << " adam_eps=" << c.adam_eps << " pad=" << kPadId << "\n";
}
void write_batch(std::ostream& f, long step, const Batch& b) {
  f << "batch " << step << " " << b.B << " " << b.S << " " << b.T << "\n";
  for (const std::vector<int>* ids : {&b.src, &b.tgt_in, &b.tgt_out}) {
    for (size_t i = 0; i < ids->size(); ++i) f << (i ? " " : "") << (*ids)[i];
    f << "\n";
  }
}

// The batches' order in an epoch: a Fisher-Yates shuffle keyed by (seed, epoch), so a resumed run
// sees exactly the order the uninterrupted run would have.
std::vector<int> epoch_order(size_t n, uint64_t seed, long epoch) {
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  const uint64_t key = mix64(mix64(seed ^ 0xBA7C4E5ull) ^ (uint64_t)epoch);
  for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[mix64(key + i) % i]);
  return order;
}

// ---- evaluation -------------------------------------------------------------------------------------

struct Evaluation {
  double loss = NAN, bleu = NAN, exact = NAN;  // exact: % of sentences translated exactly
  int sentences = 0;
  // Exact match on the number corpus, whose German side is one word: BLEU's 2- to 4-grams do not exist
  // there, so its BLEU would be 0 by definition and is not measured (NaN); BLEU otherwise.
  std::string summary(const char* option) const {  // option: the one that chose how many are decoded
    char b[128];
    if (sentences == 0) return std::string("no sentences decoded (") + option + " 0)";
    if (!std::isnan(exact)) std::snprintf(b, sizeof b, "exact match %.1f%% on %d sentences (greedy)", exact, sentences);
    else std::snprintf(b, sizeof b, "greedy BLEU %.2f on %d sentences", bleu, sentences);
    return b;
  }
};

// Loss over a split (dropout off), then greedy translations of its first `decode` sentences, scored with
// sacreBLEU's BLEU against the original text, or exact match on the number corpus.
Evaluation evaluate(Transformer<float>& m, const std::vector<Pair>& pairs, const Split& text, const Tokenizer& tok, int tokens,
                    int decode, bool exact) {
  Evaluation e;
  double sum = 0;
  long n = 0;
  for (const auto& idx : length_batches(pairs, tokens)) {
    Batch b = to_batch(pairs, idx);
    const long k = b.target_tokens();
    sum += transformer_forward(m, b, false) * k;
    n += k;
  }
  e.loss = n ? sum / n : NAN;
  const size_t count = std::min(pairs.size(), (size_t)decode);
  if (count == 0) return e;
  std::vector<std::vector<int>> src;
  for (size_t i = 0; i < count; ++i) src.push_back(pairs[i].src);
  std::vector<std::string> hyps, refs;
  long right = 0;
  for (size_t at = 0; at < count; at += 64) {
    std::vector<std::vector<int>> chunk(src.begin() + at, src.begin() + std::min(count, at + 64));
    std::vector<Hypothesis> out = greedy_decode(m, chunk, 50);
    for (size_t j = 0; j < out.size(); ++j) {
      hyps.push_back(tok.decode(out[j].tokens));
      refs.push_back(text.tgt[pairs[at + j].line]);
      right += hyps.back() == Tokenizer::normalise(refs.back());
    }
  }
  e.sentences = (int)count;
  if (exact) e.exact = 100.0 * right / count;
  else e.bleu = corpus_bleu(hyps, refs).score;
  return e;
}

// ---- the log and its picture ------------------------------------------------------------------------

struct LogRow {
  long step;
  double epoch, loss, lr, tok_per_s, val_loss, val_bleu, val_exact;
};

std::string fmt(double x, const char* f = "%.6g") {
  if (std::isnan(x)) return "";
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

// Round tick values from 0 to at least `top`: steps of 1, 2 or 5 times a power of ten, at most `most` + 1 ticks.
std::vector<double> nice_ticks(double top, int most) {
  if (!(top > 0)) top = 1;
  double step = std::pow(10.0, std::floor(std::log10(top / most)));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (top / (step * f) <= most) {
      step *= f;
      break;
    }
  std::vector<double> ticks;
  for (int k = 0; ticks.empty() || ticks.back() < top * (1 - 1e-9); ++k) ticks.push_back(k * step);
  return ticks;
}

// The run's curves, drawn by hand: a panel of training and validation loss, a panel of validation BLEU
// or exact match, each against steps. Validation is measured now and then: its values are points, joined
// from one measurement to the next. A series never measured (BLEU on the number corpus, validation before
// the first one) is not drawn and not in the legend; a panel with nothing measured is left out.
void write_curves_svg(const std::string& path, const std::vector<LogRow>& rows) {
  if (rows.empty()) return;
  struct Series { const char* name; const char* colour; double LogRow::*field; bool points; };
  struct Panel { const char* title; const char* unit; std::vector<Series> series; };
  std::vector<Panel> panels;
  for (Panel p : {Panel{"loss", "loss per target token", {{"training loss", "#1f77b4", &LogRow::loss, false},
                                                          {"validation loss", "#d62728", &LogRow::val_loss, true}}},
                  Panel{"validation", "%", {{"BLEU", "#2ca02c", &LogRow::val_bleu, true},
                                            {"exact match", "#9467bd", &LogRow::val_exact, true}}}}) {
    std::vector<Series> measured;
    for (const Series& s : p.series)
      if (std::any_of(rows.begin(), rows.end(), [&](const LogRow& r) { return !std::isnan(r.*s.field); })) measured.push_back(s);
    p.series = measured;
    if (!p.series.empty()) panels.push_back(p);
  }
  const double W = 760, PH = 300, L = 90, R = 50, T = 50, B = 60;  // canvas width, panel height, plot margins
  const double fs = 12, title_fs = 14;
  long last_step = 1;
  for (const LogRow& r : rows) last_step = std::max(last_step, r.step);
  const std::vector<double> xticks = nice_ticks((double)last_step, 6);
  auto x = [&](double step) { return L + (W - L - R) * step / xticks.back(); };
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + svg_number(W) + "\" height=\"" +
                    svg_number(PH * panels.size()) + "\" font-family=\"DejaVu Sans, sans-serif\">\n"
                    "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t k = 0; k < panels.size(); ++k) {
    const Panel& p = panels[k];
    const double y0 = PH * k, bottom = y0 + PH - B;
    double vmax = 0;
    for (const Series& s : p.series)
      for (const LogRow& r : rows)
        if (!std::isnan(r.*s.field)) vmax = std::max(vmax, r.*s.field);
    const std::vector<double> yticks = nice_ticks(vmax, 5);
    auto y = [&](double v) { return bottom - (PH - T - B) * v / yticks.back(); };
    // title, then the legend on the same line
    out += svg_text(L, y0 + 24, title_fs, p.title, "start", true);
    double at = L + svg_text_width(p.title, title_fs, true) + 30;
    for (const Series& s : p.series) {
      out += "<line x1=\"" + svg_number(at) + "\" y1=\"" + svg_number(y0 + 20) + "\" x2=\"" + svg_number(at + 20) + "\" y2=\"" +
             svg_number(y0 + 20) + "\" stroke=\"" + s.colour + "\" stroke-width=\"2\"/>\n";
      if (s.points) out += "<circle cx=\"" + svg_number(at + 10) + "\" cy=\"" + svg_number(y0 + 20) + "\" r=\"3\" fill=\"" + s.colour + "\"/>\n";
      out += svg_text(at + 26, y0 + 24, fs, s.name, "start", false, false, s.colour);
      at += 26 + svg_text_width(s.name, fs) + 20;
    }
    // axes: a frame, grid lines at the ticks, tick labels, axis labels
    out += "<rect x=\"" + svg_number(L) + "\" y=\"" + svg_number(y0 + T) + "\" width=\"" + svg_number(W - L - R) + "\" height=\"" +
           svg_number(PH - T - B) + "\" fill=\"none\" stroke=\"#888\"/>\n";
    for (double v : yticks) {
      out += "<line x1=\"" + svg_number(L) + "\" y1=\"" + svg_number(y(v)) + "\" x2=\"" + svg_number(W - R) + "\" y2=\"" +
             svg_number(y(v)) + "\" stroke=\"#ddd\"/>\n";
      out += svg_text(L - 8, y(v) + fs * 0.35, fs, svg_number(v), "end");
    }
    for (double s : xticks) {
      out += "<line x1=\"" + svg_number(x(s)) + "\" y1=\"" + svg_number(bottom) + "\" x2=\"" + svg_number(x(s)) + "\" y2=\"" +
             svg_number(bottom + 4) + "\" stroke=\"#888\"/>\n";
      out += svg_text(x(s), bottom + 6 + fs, fs, svg_number(s), "middle");
    }
    out += svg_text((L + W - R) / 2, bottom + 12 + 2 * fs + 6, fs, "step", "middle");
    out += svg_text(L - 8 - 5 * fs - 8, (y0 + T + bottom) / 2, fs, p.unit, "middle", false, true);
    // the series: a line through every measured value; validation values also as points
    for (const Series& s : p.series) {
      std::string pts, dots;
      for (const LogRow& r : rows) {
        const double v = r.*s.field;
        if (std::isnan(v)) continue;
        pts += svg_number(x((double)r.step)) + "," + svg_number(y(v)) + " ";
        if (s.points)
          dots += "<circle data-series=\"" + std::string(s.name) + "\" data-step=\"" + std::to_string(r.step) + "\" cx=\"" +
                  svg_number(x((double)r.step)) + "\" cy=\"" + svg_number(y(v)) + "\" r=\"3\" fill=\"" + s.colour + "\"/>\n";
      }
      out += "<polyline data-series=\"" + std::string(s.name) + "\" fill=\"none\" stroke=\"" + s.colour +
             "\" stroke-width=\"1.5\" points=\"" + pts + "\"/>\n" + dots;
    }
  }
  out += "</svg>\n";
  try {
    write_file_atomically(path, out);
  } catch (const std::runtime_error& e) {
    fail(e.what());
  }
}

// ---- checkpoints in the run folder --------------------------------------------------------------------

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("ckpt-", 0) == 0 && n.size() > 9 && n.compare(n.size() - 4, 4, ".bin") == 0) names.push_back(dir + "/" + n);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());  // ckpt-%010ld.bin: by step
  return names;
}

// The checkpoints of run `run` in DIR, oldest first: those whose header names its id. Another run's, copied
// in, are neither pruned nor averaged; a file that cannot be read is not known to be this run's.
std::vector<std::string> run_checkpoints(const std::string& dir, uint64_t run) {
  std::vector<std::string> mine;
  for (const std::string& path : list_checkpoints(dir)) {
    try {
      if (checkpoint_meta(path).train.run == run) mine.push_back(path);
    } catch (const std::runtime_error&) {
    }
  }
  return mine;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// Writes DIR/ckpt-STEP.bin, points DIR/model.bin at it, keeps the newest `keep`. Each step is atomic (a
// checkpoint is renamed into place complete, model.bin is replaced by a rename), so a process killed at
// any moment leaves model.bin pointing at a whole checkpoint. A write that fails (a full disk) stops
// training with one line; model.bin and the checkpoints before are left as they were.
std::string save_checkpoint(const std::string& dir, Transformer<float>& m, uint64_t vocab_hash, const TrainState& st, int keep,
                            const std::string& last_good) {
  transformer_download(m);
  if (!all_finite(m.params)) fail("a parameter is not finite at step " + std::to_string(m.step) + ": training stopped; the checkpoints written before are kept");
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-%010ld.bin", m.step);
  const std::string path = dir + "/" + name;
  try {
    checkpoint_save(path, m, vocab_hash, &st);
  } catch (const std::runtime_error& e) {
    fail(std::string(e.what()) + "; training stopped, " + (last_good.empty() ? "no checkpoint of this run was written"
                                                                               : "the last good checkpoint (" + last_good + ") is kept"));
  }
  const std::string link = dir + "/model.bin", tmp = link + ".tmp";
  std::remove(tmp.c_str());
  if (symlink(name, tmp.c_str()) != 0 || std::rename(tmp.c_str(), link.c_str()) != 0)
    fail("cannot update " + link + ": " + std::strerror(errno));
  // This run's oldest beyond `keep` go, never the one model.bin now names: after a resume from an earlier
  // checkpoint, newer names left by the killed run may sort after it.
  std::vector<std::string> all = run_checkpoints(dir, st.run);
  for (size_t i = 0; i + keep < all.size(); ++i)
    if (all[i] != path) std::remove(all[i].c_str());
  if (DIR* d = opendir(dir.c_str())) {  // what a write killed half-way left: ckpt-*.bin.tmp
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("ckpt-", 0) == 0 && n.size() > 8 && n.compare(n.size() - 8, 8, ".bin.tmp") == 0) std::remove((dir + "/" + n).c_str());
    }
    closedir(d);
  }
  return path;
}

// SIGINT (Ctrl-C) and SIGTERM (what `kill`, a batch scheduler such as SLURM, or `docker stop` sends) stop
// training at the end of the step, with a checkpoint. Signals after the first wait for that checkpoint
// (a quick second Ctrl-C once cost it); SIGQUIT (Ctrl-\) and SIGKILL still end the process at once.
volatile std::sig_atomic_t interrupted = 0;  // the first signal's number
void on_interrupt(int sig) {
  if (!interrupted) interrupted = sig;
}
void stop_on_signals(const Ranks& ranks) {
  struct sigaction sa = {};
  sa.sa_handler = on_interrupt;
  sa.sa_flags = SA_RESTART;  // a checkpoint's write goes on
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  if (ranks.size == 1) sigaction(SIGTERM, &sa, nullptr);  // under mpirun, SIGTERM is the launcher ending every rank (parallel.h)
}

std::string clock_text(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  char b[32];
  long t = (long)s;
  if (t >= 3600) std::snprintf(b, sizeof b, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else std::snprintf(b, sizeof b, "%02ld:%02ld", t / 60, t % 60);
  return b;
}

// libgomp's waiting threads spin for about 300,000 rounds at every barrier before they sleep. On a
// machine whose two cores are shared with other programs, a spinning thread holds the core its partner
// needs, and training ran 3 to 10 times slower (measured: 100 tiny-model steps in 43 s instead of 15 s
// beside three busy processes), while 10,000 rounds cost nothing on an idle machine (300 steps in 12 s
// either way). The runtime reads GOMP_SPINCOUNT when it loads, before main, so the program sets it and
// starts itself again, once (same process id). Setting OMP_WAIT_POLICY or GOMP_SPINCOUNT turns this off.
void limit_openmp_spinning(char** argv) {
#ifdef _OPENMP
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;
  setenv("GOMP_SPINCOUNT", "10000", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then train as we are
#endif
}

// ---- the run's stages -------------------------------------------------------------------------------

// What the stages of a run share: the options (the stages fill in what they leave open), the corpus and
// its encoded splits, the vocabulary, the model with its training state, the batches and log.csv's rows.
struct Run {
  Ranks& ranks;
  Options o;
  Corpus corpus;
  Config cfg;
  long step_batches = 0;  // a step's batches, over every rank
  Tokenizer tok;
  std::vector<Pair> train, val, test;
  std::unique_ptr<Transformer<float>> model;
  TrainState st;
  std::vector<std::vector<int>> batches;  // an epoch's, each the indices of its training pairs
  std::vector<LogRow> rows;
  Run(Ranks& ranks, Options options) : ranks(ranks), o(std::move(options)) {}
  std::string vocab_path() const { return o.out + "/vocab.bpe"; }
  std::string csv_path() const { return o.out + "/log.csv"; }
};

// The command line's options, checked before any work; ranks other than 0 print nothing.
Options command_line(int argc, char** argv, Ranks& ranks) {
  Options o = parse(argc, argv);
  ranks.timeout_s = o.collective_timeout;
  if (ranks.rank != 0) {  // rank 0 alone prints, validates and writes the run folder
    o.quiet = true;
    if (!std::freopen("/dev/null", "w", stdout)) fail("cannot open /dev/null");
  }
  std::signal(SIGXFSZ, SIG_IGN);  // past a file-size limit (ulimit -f) a write fails with EFBIG instead of killing us
  if (o.device.empty()) o.device = gpu_available() && !gpu_emulated() ? "cuda" : "cpu";
  if (!o.precision.empty()) {  // a name parse_precision knows, for a GPU run
    try {
      parse_precision(o.precision);
    } catch (const std::runtime_error& e) {
      fail(e.what());
    }
    if (o.device != "cuda") fail("--precision is a GPU option: it needs --device cuda");
  }
  return o;
}

// The corpus, then what depends on it: the model's configuration, the run folder and the other defaults.
void configure(Run& r) {
  Options& o = r.o;
  r.corpus = load_corpus(o);
  r.cfg = build_config(o, r.corpus.numbers);
  if (o.out.empty()) o.out = r.corpus.numbers ? "runs/numbers" : "runs/multi30k-" + o.src + "-" + o.tgt;
  if (o.merges < 0) o.merges = r.corpus.numbers ? 60 : 8000;
  apply_defaults(o, r.cfg, r.corpus.numbers);
  // a step's batches, over every rank: each has its own dropout masks (dropout_site's 15 bits of micro)
  r.step_batches = (long)r.ranks.size * o.accumulate;
  if (r.step_batches > 32768) fail("--accumulate " + std::to_string(o.accumulate) + " times " + std::to_string(r.ranks.size) +
                                   " ranks is more than 32768 batches a step");
}

// One process per run folder: an exclusive flock on DIR/.lock, held until the process ends (the kernel
// releases it when the process dies, SIGKILL included). The file holds the holder's process id, which a
// second ./train names.
void lock_run_folder(const std::string& dir) {
  const std::string path = dir + "/.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) fail("cannot write to --out " + dir + ": " + path + ": " + std::strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char pid[32];
    const ssize_t n = pread(fd, pid, sizeof pid, 0);
    fail("--out " + dir + " is in use by another ./train (process " + (n > 0 ? std::string(pid, n) : std::string("id unknown")) +
         "): one run per folder; wait for it to end, or choose another --out");
  }
  const std::string me = std::to_string(getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, me.data(), me.size(), 0) != (ssize_t)me.size())
    fail("cannot write " + path + ": " + std::strerror(errno));
}  // (fd stays open: the lock lasts as long as the process)

bool is_there(const std::string& p) {  // a file, a folder or a link (dangling too)
  struct stat st;
  return lstat(p.c_str(), &st) == 0;
}

// What a run left in DIR that a new run would replace ("" when nothing): model.bin, the checkpoints and the
// log, then its vocabulary. A vocabulary alone is no run (one may be put there for --vocab, or a run
// stopped before its first checkpoint): start_run_folder keeps it when it is the new run's, else refuses.
std::string run_contents(const std::string& dir) {
  std::string found;
  auto add = [&](bool there, const std::string& what) {
    if (there) found += (found.empty() ? "" : ", ") + what;
  };
  const size_t checkpoints = list_checkpoints(dir).size();
  add(is_there(dir + "/model.bin"), "model.bin");
  add(checkpoints > 0, std::to_string(checkpoints) + " checkpoint" + (checkpoints == 1 ? "" : "s"));
  add(is_file(dir + "/log.csv"), "log.csv");
  add(!found.empty() && is_file(dir + "/vocab.bpe"), "vocab.bpe");
  return found;
}

// The run folder, made and locked; a run in it is continued (--resume), replaced (--overwrite) or refused.
// Nothing in it is written until every check of the run has passed (start_run_folder).
void make_run_folder(const Run& r) {
  const Options& o = r.o;
  if (o.bpe_only || r.ranks.rank != 0) return;
  if (o.resume && !is_dir(o.out)) fail("--resume: --out " + o.out + " holds no run to resume (no such folder): leave out --resume to start one");
  for (size_t at = 0; at != std::string::npos;) {  // mkdir -p
    at = o.out.find('/', at + 1);
    mkdir(o.out.substr(0, at).c_str(), 0777);
  }
  if (!is_dir(o.out) || access(o.out.c_str(), W_OK) != 0) fail("cannot write to --out " + o.out + ": " + std::strerror(errno));
  lock_run_folder(o.out);
  const std::string contents = run_contents(o.out);
  if (o.resume && !is_there(o.out + "/model.bin"))
    fail("--resume: --out " + o.out + " holds no checkpoint to resume from" +
         (contents.empty() ? ": leave out --resume to start a run" : " (" + contents + "): --overwrite starts the run over"));
  if (!o.resume && !o.overwrite && !contents.empty())
    fail("--out " + o.out + " holds a run (" + contents + "): --resume continues it, --overwrite starts a new one in its place "
         "(deleting those), or choose another --out");
}

// the vocabulary: the run's when resuming (--vocab may only name the same), given, or learned on the
// training text (§5.1)
Tokenizer vocabulary(const Run& r) {
  const Options& o = r.o;
  try {
    if (o.resume) {
      Tokenizer run = Tokenizer::load(r.vocab_path());
      if (!o.vocab.empty() && Tokenizer::load(o.vocab).hash() != run.hash())
        fail("--resume: --vocab " + o.vocab + " is not the run's vocabulary (" + r.vocab_path() + "), which a resume keeps: leave --vocab out");
      return run;
    }
    if (!o.vocab.empty()) return Tokenizer::load(o.vocab);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> text = r.corpus.train.src;
    text.insert(text.end(), r.corpus.train.tgt.begin(), r.corpus.train.tgt.end());
    Tokenizer tok = Tokenizer::learn(text, o.merges);
    std::printf("BPE: %d merges learned on the training text (source and target) in %.1f s: vocabulary of %d\n",
                tok.merge_count(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), tok.vocab_size());
    return tok;
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

// --bpe-only: how each line of stdin splits
void print_pieces(const Tokenizer& tok) {
  try {
    for (const std::string& line : read_text_lines("-")) {
      std::string out;
      for (const std::string& p : tok.pieces(line)) out += (out.empty() ? "" : " ") + p;
      std::printf("%s\n", out.c_str());
    }
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

// Every check passed (this one the last): a new run's folder gets its vocabulary (and the recipe's decoding
// defaults), after --overwrite has deleted what the run before left there; a vocabulary already there is
// kept when it is this run's and refused otherwise; a resumed run's folder keeps its own.
void start_run_folder(const Run& r) {
  const Options& o = r.o;
  if (r.ranks.rank != 0 || o.resume) return;
  const std::string contents = run_contents(o.out);
  bool same_vocabulary = false;
  if (contents.empty() && is_file(r.vocab_path())) {
    try {
      same_vocabulary = Tokenizer::load(r.vocab_path()).hash() == r.tok.hash();
    } catch (const std::runtime_error&) {  // not a vocabulary this program reads: another
    }
    if (!same_vocabulary && !o.overwrite)
      fail("--out " + o.out + " holds another vocabulary than this run's (" + r.vocab_path() + "): --overwrite replaces it, "
           "or choose another --out");
  }
  if (!contents.empty()) {  // (--overwrite: make_run_folder refused it otherwise)
    for (const std::string& p : list_checkpoints(o.out)) std::remove(p.c_str());
    for (const char* name : {"model.bin", "averaged.bin", "log.csv", "curves.svg", "decoding.txt", "vocab.bpe"})
      std::remove((o.out + "/" + name).c_str());
    std::printf("--overwrite: deleted the run in %s (%s)\n", o.out.c_str(), contents.c_str());
  }
  try {
    if (!same_vocabulary) r.tok.save(r.vocab_path());  // the run folder holds its vocabulary
    if (preset_name(o, r.corpus.numbers) == "multi30k")  // and ./translate's beam and alpha
      save_decoding_defaults(o.out + "/decoding.txt", recipe_decoding(),
                             "the multi30k recipe's beam and length penalty, chosen on Multi30k's validation set (NOTES.md)");
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

// The configuration completed by the vocabulary, and the splits encoded with it.
void encode_data(Run& r) {
  r.cfg.V = r.tok.vocab_size();
  try {
    r.cfg.validate();
  } catch (const std::invalid_argument& e) {
    fail(std::string("configuration: ") + e.what());
  }
  long empty = 0, too_long = 0, skipped_eval = 0;
  r.train = encode_split(r.corpus.train, r.tok, r.cfg.max_len, &empty, &too_long);
  r.val = encode_split(r.corpus.val, r.tok, r.cfg.max_len, &skipped_eval, &skipped_eval);
  r.test = encode_split(r.corpus.test, r.tok, r.cfg.max_len, &skipped_eval, &skipped_eval);
  if (r.train.empty()) fail("no training pairs left after skipping empty and over-long ones");
  std::printf("data: %s\n", r.corpus.description.c_str());
  std::printf("data: %zu training pairs (skipped %ld with an empty side, %ld longer than %d tokens)\n", r.train.size(), empty,
              too_long, r.cfg.max_len - 1);
}

// A run's id: random, never 0 (a version-1 checkpoint's, whose run is unknown).
uint64_t new_run_id() {
  std::random_device device;
  const uint64_t id = mix64(((uint64_t)device() << 32 | device()) ^ (uint64_t)std::chrono::system_clock::now().time_since_epoch().count());
  return id ? id : 1;
}

// What a resume keeps of the run, from its checkpoint (version 2; a version-1 checkpoint does not say): its
// --batch-tokens, where the command line is silent, and its vocabulary's --merges. Given otherwise, they are refused.
void keep_run_options(Run& r) {
  Options& o = r.o;
  const TrainState& t = r.st;
  if (t.batch_tokens > 0 && o.given.count("--batch-tokens") && o.batch_tokens != t.batch_tokens)
    fail("--resume: the run trains on batches of --batch-tokens " + std::to_string(t.batch_tokens) + ": leave the option out, or give that");
  if (t.batch_tokens > 0) o.batch_tokens = (int)t.batch_tokens;
  if (o.given.count("--merges") && t.run != 0 && o.merges != t.merges)
    fail("--resume: the run keeps its vocabulary (" + r.vocab_path() + ", " +
         (t.merges < 0 ? std::string("given with --vocab") : "--merges " + std::to_string(t.merges)) + "): leave --merges out");
}

// the model: new, or resumed
void build_model(Run& r) {
  Options& o = r.o;
  if (o.resume) {
    CheckpointMeta meta;
    try {
      r.model = checkpoint_load(o.out + "/model.bin", &meta);
    } catch (const std::exception& e) {
      fail(std::string("--resume: ") + e.what());
    }
    if (!meta.has_adam) fail("--resume: " + o.out + "/model.bin has no optimizer state (an averaged model?)");
    if (meta.vocab_hash != r.tok.hash()) fail("--resume: the checkpoint was trained with another vocabulary than " + r.vocab_path());
    std::string diff = config_difference(r.model->cfg, r.cfg);
    if (!diff.empty()) fail("--resume: the checkpoint has another configuration (" + diff + ")");
    if (r.model->seed != o.seed) fail("--resume: the checkpoint was trained with --seed " + std::to_string(r.model->seed));
    r.st = meta.train;
    keep_run_options(r);
    std::printf("resumed from %s at step %ld (epoch %ld, batch %ld)\n", (o.out + "/model.bin").c_str(), r.model->step, r.st.epoch, r.st.batch);
  } else {
    r.model = std::make_unique<Transformer<float>>(r.cfg, o.seed);
    r.st.run = new_run_id();
    r.st.merges = o.vocab.empty() ? o.merges : -1;
  }
  r.st.batch_tokens = o.batch_tokens;
  if (o.device == "cuda") {
    try {
      r.ranks.choose_gpu();
      transformer_to_device(*r.model, Device::cuda);
      const Precision p = o.precision.empty() ? default_precision() : parse_precision(o.precision);
      set_precision(p);
      o.precision = precision_name(p);
    } catch (const std::runtime_error& e) {
      fail(e.what());
    }
  }
}

void make_batches(Run& r) {
  const Options& o = r.o;
  r.batches = length_batches(r.train, o.batch_tokens);
  std::printf("batches: %zu per epoch, about %d source and %d target tokens each [§5.1]; run folder %s\n", r.batches.size(),
              o.batch_tokens, o.batch_tokens, o.out.c_str());
  if (r.step_batches > 1)
    std::printf("steps: %ld batches each (%d rank%s x --accumulate %d), the loss normalised by all their target tokens; "
                "the schedule counts steps [Eq. 3]%s\n", r.step_batches, r.ranks.size, r.ranks.size > 1 ? "s" : "", o.accumulate,
                r.ranks.size == 1 ? "" : o.device == "cuda" && !gpu_emulated() ? "; gradients summed with NCCL" : "; gradients summed with MPI");
  if (r.st.batch >= (long)r.batches.size())
    fail("--resume: the checkpoint stopped after batch " + std::to_string(r.st.batch) + " of an epoch, but this run has " +
         std::to_string(r.batches.size()) + " batches per epoch: resume with the first run's --batch-tokens");
}

// Memory, known before the first step: the largest batch's step must fit (on the CPU; the GPU path says
// so itself when it runs out). Then one step on that batch, without an update, measures the peak.
void measure_memory(Run& r) {
  const Options& o = r.o;
  const Config& cfg = r.cfg;
  Transformer<float>& m = *r.model;
  size_t need = 0, largest = 0;
  for (size_t i = 0; i < r.batches.size(); ++i) {
    size_t S = 0, T = 0;
    for (int p : r.batches[i]) S = std::max(S, r.train[p].src.size() + 1), T = std::max(T, r.train[p].tgt.size() + 1);
    const size_t bytes = training_bytes(cfg, (int)r.batches[i].size(), (int)S, (int)T);
    if (bytes > need) need = bytes, largest = i;
  }
  const size_t available = available_memory();
  if (o.device == "cpu" && need > available)
    fail("a batch of --batch-tokens " + std::to_string(o.batch_tokens) + " needs " + std::to_string(need >> 20) +
         " MB for the parameters, Adam's state and the activations, but " + std::to_string(available >> 20) +
         " MB are available: lower --batch-tokens (or --max-len)");
  {
    const Batch b = to_batch(r.train, r.batches[largest]);
    zero_grad(m);
    transformer_forward(m, b, true);
    transformer_backward(m, b, true);
    synchronize_device(m);
  }
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
#ifdef __APPLE__
  const double peak_mb = usage.ru_maxrss / 1048576.0;  // bytes on macOS
#else
  const double peak_mb = usage.ru_maxrss / 1024.0;  // kilobytes on Linux
#endif
  // on the CPU, the matrix product's kernel (gemm.h): the instruction set it runs
  const std::string products = o.device == "cuda" ? " (" + gpu_name() + ", " + o.precision + " products)"
                                                  : std::string(" (") + cpu::gemm_kernel_name(cpu::gemm_best_kernel()) + " products)";
  std::printf("model: N=%d D=%d F=%d H=%d V=%d, %s, %.2fM parameters, dropout %.2f, label smoothing %.2f, device %s%s; "
              "peak %smemory %.0f MB (a step on the largest batch)\n",
              cfg.N, cfg.D, cfg.F, cfg.H, cfg.V, cfg.pre_ln ? "pre-LN" : "post-LN", m.params.size() / 1e6, cfg.p_drop, cfg.eps_ls,
              o.device.c_str(), products.c_str(), o.device == "cuda" ? "host " : "", peak_mb);
}

// the log: rows of an interrupted run before the resume point are kept
void read_log(Run& r) {
  if (!r.o.resume) return;
  std::ifstream in(r.csv_path());
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    LogRow row{};
    double v[8];
    std::string cell;
    size_t at = 0;
    for (int k = 0; k < 8; ++k) {
      size_t comma = line.find(',', at);
      cell = line.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      v[k] = cell.empty() ? NAN : std::atof(cell.c_str());
      at = comma == std::string::npos ? line.size() : comma + 1;
    }
    row = {(long)v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
    if (row.step <= r.model->step) r.rows.push_back(row);
  }
}

void write_log(const Run& r) {  // log.csv and its picture, each replaced atomically
  std::string csv = "step,epoch,loss,lr,tokens_per_s,val_loss,val_bleu,val_exact_match\n";
  for (const LogRow& row : r.rows)
    csv += std::to_string(row.step) + "," + fmt(row.epoch, "%.4f") + "," + fmt(row.loss, "%.17g") + "," + fmt(row.lr, "%.6g") + "," +
           fmt(row.tok_per_s, "%.0f") + "," + fmt(row.val_loss, "%.17g") + "," + fmt(row.val_bleu, "%.2f") + "," + fmt(row.val_exact, "%.2f") + "\n";
  try {
    write_file_atomically(r.csv_path(), csv);
  } catch (const std::runtime_error& e) {
    fail(e.what());
  }
  write_curves_svg(r.o.out + "/curves.svg", r.rows);
}

// ---- the training loop ------------------------------------------------------------------------------

// The loop's state beside the run's: its clocks, the progress line's and log.csv's windows, the newest
// checkpoint, --patience's count and the steps whose losses are still on the GPU.
struct Training {
  using Clock = std::chrono::steady_clock;
  Run& r;
  Transformer<float>& m;
  const Options& o;
  const bool tty;
  const Clock::time_point start = Clock::now();
  const double elapsed0;
  const long first_step;
  Clock::time_point last_checkpoint = Clock::now(), last_print = Clock::now() - std::chrono::hours(1);
  long step_limit;
  double window_tokens = 0, window_seconds = 0;  // the progress line's: since the last one printed
  double log_tokens = 0, log_seconds = 0;        // log.csv's: since its last row (--log-every)
  std::string last_good;  // the newest complete checkpoint: on a resume, the one model.bin names
  // --patience: the best validation loss so far, and the validations since (rebuilt from log.csv on a resume,
  // which holds each loss to the last bit: one rounded to fewer digits could compare below the next)
  double best_val = INFINITY;
  long best_step = 0, stale = 0;
  // Each step's loss. On a GPU (one process) it stays on the device until something needs it: a validation,
  // the progress line, a checkpoint (which writes log.csv), the stop, or kLossRing unread steps. Then every
  // unread step's is read in one copy (step_loss_sums), checked in order, so a NaN is still named by its
  // step and found before a checkpoint could keep it, and written into its log row. Elsewhere each step's
  // loss is read and checked at once.
  // A step's clock then stops when the host has queued it, not when the GPU has run it: the unread steps'
  // rate is taken when their losses are read (the GPU done with them), over the time since the first of
  // them started, and written into their log rows; the progress line adds the wait to its time. The run's
  // first step is read at once, so that its start-up is its own row's and not spread over 64 rows.
  const bool defer_loss;
  std::vector<std::pair<long, long>> unread;  // (step, its target tokens)
  Clock::time_point unread_start;             // when the first unread step started
  double unread_host_seconds = 0;             // the unread steps' clocks, summed
  double read_rate = NAN;                     // target tokens/s of the steps read last
  double loss = NAN;                          // the last step's, once read
  long loss_reads = 0, steps_run = 0;         // reported at the stop
  std::ofstream batches_out;

  explicit Training(Run& run);
  double elapsed() const { return elapsed0 + std::chrono::duration<double>(Clock::now() - start).count(); }
  void note_validation(long step, double val_loss);
  void validate(LogRow& row);
  std::string stop_reason();
  void check_same_parameters();
  void check_loss(long step, double x);
  void read_losses();
  double take_step(const std::vector<int>& order);
  void progress(double epoch, double lr, Clock::time_point now, bool stopping);
  std::string run();
  void finish(const std::string& reason);
};

Training::Training(Run& run)
    : r(run), m(*run.model), o(run.o), tty(isatty(fileno(stderr)) && !run.o.quiet), elapsed0(run.st.elapsed), first_step(m.step),
      defer_loss(m.device && run.ranks.size == 1) {
  const long steps_per_epoch = ((long)r.batches.size() + r.step_batches - 1) / r.step_batches;
  const long total_steps = o.epochs * steps_per_epoch;
  step_limit = o.max_steps > 0 ? std::min(o.max_steps, total_steps) : total_steps;
  if (o.resume) {
    char target[512];
    const ssize_t n = readlink((o.out + "/model.bin").c_str(), target, sizeof target - 1);
    last_good = n > 0 ? o.out + "/" + std::string(target, n) : o.out + "/model.bin";
  }
  for (const LogRow& row : r.rows)
    if (!std::isnan(row.val_loss)) note_validation(row.step, row.val_loss);
  check_same_parameters();
  if (!o.batches_out.empty() && r.ranks.rank == 0) {
    batches_out.open(o.batches_out);
    write_model_line(batches_out, m.cfg);
    if (!batches_out) fail("cannot write " + o.batches_out);
  }
}

void Training::note_validation(long step, double val_loss) {
  if (val_loss < best_val) best_val = val_loss, best_step = step, stale = 0;
  else stale += 1;
}

void Training::validate(LogRow& row) {  // rank 0's; the others wait for it in the next all-reduce
  Evaluation e = evaluate(m, r.val, r.corpus.val, r.tok, o.batch_tokens, o.val_sentences, r.corpus.numbers);
  row.val_loss = e.loss, row.val_bleu = e.bleu, row.val_exact = e.exact;
  note_validation(m.step, e.loss);
  if (tty) std::fprintf(stderr, "\r\033[K");
  std::printf("validation at step %ld: loss %.4f, %s\n", m.step, e.loss, e.summary("--val-sentences").c_str());
  std::fflush(stdout);
}

// Every rank stops at the same step: rank 0's clock decides, and Ctrl-C on any rank stops them all.
std::string Training::stop_reason() {
  static const char* const kReasons[] = {"", "interrupted (Ctrl-C)", "--max-steps reached", "--epochs reached", "--time-limit reached", ""};
  long code = interrupted ? 1 : 0;
  if (!code && o.max_steps > 0 && m.step >= o.max_steps) code = 2;
  else if (!code && r.st.epoch >= o.epochs) code = 3;  // (not in steps: a resume may take another number a step)
  else if (!code && o.time_limit > 0 && elapsed() >= o.time_limit) code = 4;
  else if (!code && o.patience > 0 && stale >= o.patience) code = 5;  // (rank 0's validations)
  if (r.ranks.size > 1) {  // rank 0's reason, or an interruption anywhere
    const long shared = r.ranks.sum(r.ranks.rank == 0 ? code : (code == 1 ? 8 : 0), "the stop decision", m.step);
    code = shared % 8 ? shared % 8 : shared ? 1 : 0;
    interrupted = interrupted || code == 1;
  }
  if (code == 5)
    return "--patience " + std::to_string(o.patience) + " reached (the best validation loss, " + fmt(best_val, "%.4f") +
           " at step " + std::to_string(best_step) + ", not bettered in " + std::to_string(stale) + " validations)";
  return code == 1 && interrupted == SIGTERM ? "interrupted (SIGTERM)" : kReasons[code];
}

void Training::check_same_parameters() {
  if (r.ranks.size > 1 && !r.ranks.same(parameter_hash(m), "the parameter hash", m.step))
    fail("the ranks hold different parameters at step " + std::to_string(m.step) + ": training stopped");
}

void Training::check_loss(long step, double x) {
  if (std::isfinite(x)) return;
  if (tty) std::fprintf(stderr, "\n");
  fail("the loss is " + (std::isnan(x) ? std::string("NaN") : std::to_string(x)) + " at step " + std::to_string(step) + ": training stopped; the last good checkpoint (" +
       (last_good.empty() ? "none written in this run" : last_good) + ") is kept. Try a lower --lr-scale or a longer --warmup");
}

void Training::read_losses() {
  if (unread.empty()) return;
  const std::vector<double> sums = m.device->step_loss_sums(unread.front().first, (long)unread.size());
  ++loss_reads;
  const double seconds = std::chrono::duration<double>(Clock::now() - unread_start).count();
  double tokens = 0;
  for (const auto& u : unread) tokens += (double)u.second;
  read_rate = tokens / seconds;
  window_seconds += std::max(0.0, seconds - unread_host_seconds);  // the wait for the GPU
  unread_host_seconds = 0;
  for (size_t i = 0; i < unread.size(); ++i) check_loss(unread[i].first, loss = sums[i] / unread[i].second);
  for (auto row = r.rows.rbegin(); row != r.rows.rend() && row->step >= unread.front().first; ++row) {  // the rows that wait for theirs
    row->loss = sums[row->step - unread.front().first] / unread[row->step - unread.front().first].second;
    row->tok_per_s = read_rate;
  }
  unread.clear();
}

// One optimizer step on the epoch's next batches; returns its learning rate.
double Training::take_step(const std::vector<int>& order) {
  const auto t0 = Clock::now();
  if (unread.empty()) unread_start = t0;
  // the step's batches: the next step_batches of the epoch's order; this rank takes every size-th
  const long count = std::min(r.step_batches, (long)r.batches.size() - r.st.batch);
  std::vector<Batch> mine;
  std::vector<int> micro;
  long tokens = 0;
  for (long j = 0; j < count; ++j) {
    const std::vector<int>& idx = r.batches[order[r.st.batch + j]];
    for (int p : idx) tokens += (long)r.train[p].tgt.size() + 1;  // Batch::target_tokens, before the batch is made
    if (j % r.ranks.size == r.ranks.rank) mine.push_back(to_batch(r.train, idx)), micro.push_back((int)j);
  }
  std::vector<const Batch*> mine_ptrs;
  for (const Batch& b : mine) mine_ptrs.push_back(&b);
  const double share = accumulate_gradients(m, mine_ptrs, micro, tokens, !defer_loss);
  if (!defer_loss) check_loss(m.step + 1, loss = r.ranks.sum(share, "the loss", m.step + 1));
  r.ranks.sum_gradients(gradient_data(m), m.params.size(), (bool)m.device, m.step + 1);
  const double lr = transformer_update(m);
  if (defer_loss) unread.push_back({m.step, tokens});
  ++steps_run;
  r.st.batch += count;
  r.st.tokens += tokens;
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  if (batches_out.is_open()) {  // after the step's clock stopped
    for (const Batch& b : mine) write_batch(batches_out, m.step, b);
    if (!batches_out.flush()) fail("cannot write " + o.batches_out);
  }
  window_tokens += tokens, window_seconds += dt;
  if (defer_loss) unread_host_seconds += dt;
  if ((long)unread.size() == kLossRing || steps_run == 1) read_losses();  // the first step's time (kernel
                                                                          // loading, allocations) its own
  log_tokens += tokens, log_seconds += dt;
  return lr;
}

// progress: in place on a terminal (at most 10 a second), a plain line every 10 s otherwise
void Training::progress(double epoch, double lr, Clock::time_point now, bool stopping) {
  if (!o.quiet && (now - last_print > (tty ? std::chrono::milliseconds(100) : std::chrono::seconds(10)) || stopping)) {
    read_losses();
    const double el = elapsed();
    double eta = (step_limit - m.step) * (el - elapsed0) / std::max(1L, m.step - first_step);
    if (o.time_limit > 0) eta = std::min(eta, o.time_limit - el);
    std::fprintf(stderr, "%sstep %ld | epoch %.2f | loss %.4f | lr %.2e | %.0f tok/s | %s elapsed | ETA %s%s", tty ? "\r\033[K" : "",
                 m.step, epoch, loss, lr, window_tokens / window_seconds, clock_text(el).c_str(), clock_text(eta).c_str(), tty ? "" : "\n");
    last_print = now;
    window_tokens = window_seconds = 0;
  }
}

// Trains until a reason to stop, which it returns (every rank the same).
std::string Training::run() {
  std::string reason = stop_reason();
  while (reason.empty()) {
    const std::vector<int> order = epoch_order(r.batches.size(), o.seed, r.st.epoch);
    for (; r.st.batch < (long)r.batches.size() && reason.empty(); ) {
      const double lr = take_step(order);
      LogRow row{m.step, r.st.epoch + (double)r.st.batch / r.batches.size(), NAN, lr, log_tokens / log_seconds, NAN, NAN, NAN};
      const bool epoch_end = r.st.batch == (long)r.batches.size();
      if (r.ranks.rank == 0 && (o.val_every > 0 ? m.step % o.val_every == 0 : epoch_end)) {
        read_losses();  // no validation of a model whose loss went NaN
        validate(row);
      }
      if (m.step % o.log_every == 0 || !std::isnan(row.val_loss)) {
        row.loss = unread.empty() ? loss : NAN;  // NaN while the step's loss is unread: read_losses fills it in
        if (defer_loss && unread.empty()) row.tok_per_s = read_rate;  // read in this step, with its rate
        r.rows.push_back(row);
        log_tokens = log_seconds = 0;
      }
      if (epoch_end) r.st.epoch += 1, r.st.batch = 0;
      if (m.step % o.check_every == 0) check_same_parameters();
      reason = stop_reason();
      const auto now = Clock::now();
      progress(row.epoch, lr, now, !reason.empty());
      const bool checkpoint_due = o.checkpoint_minutes > 0 ? std::chrono::duration<double>(now - last_checkpoint).count() > o.checkpoint_minutes * 60
                                                           : epoch_end;
      if (r.ranks.rank == 0 && checkpoint_due && reason.empty()) {
        read_losses();
        r.st.elapsed = elapsed();
        last_good = save_checkpoint(o.out, m, r.tok.hash(), r.st, o.keep, last_good);
        write_log(r);
        last_checkpoint = now;
      }
    }
  }
  read_losses();
  if (tty) std::fprintf(stderr, "\n");
  check_same_parameters();
  return reason;
}

// The end, on rank 0: the summary, the last checkpoint, the final validation and the log, then (unless
// interrupted) the averaged checkpoint and the test split's figures.
void Training::finish(const std::string& reason) {
  TrainState& st = r.st;
  st.elapsed = elapsed();
  std::printf("stopped: %s at step %ld (epoch %.2f) after %s\n", reason.c_str(), m.step, st.epoch + (double)st.batch / r.batches.size(),
              clock_text(st.elapsed).c_str());
  if (defer_loss)
    std::printf("losses: read from the GPU %ld time%s in %ld steps (when a validation, the progress line, a checkpoint or the stop "
                "needed them)\n", loss_reads, loss_reads == 1 ? "" : "s", steps_run);
  last_good = save_checkpoint(o.out, m, r.tok.hash(), st, o.keep, last_good);
  if (!interrupted && (r.rows.empty() || std::isnan(r.rows.back().val_loss))) {  // the final figures on the validation split
    LogRow row{m.step, st.epoch + (double)st.batch / r.batches.size(), NAN, NAN, NAN, NAN, NAN, NAN};
    if (!r.rows.empty()) row.loss = r.rows.back().loss, row.lr = r.rows.back().lr, row.tok_per_s = r.rows.back().tok_per_s;
    validate(row);
    r.rows.push_back(row);
  }
  write_log(r);
  std::printf("checkpoint %s (%s/model.bin), log %s, curves %s/curves.svg\n", last_good.c_str(), o.out.c_str(), r.csv_path().c_str(), o.out.c_str());
  if (interrupted) return;
  std::signal(SIGINT, SIG_DFL);  // all is written: a signal during the averaging and the test figures ends at once
  if (r.ranks.size == 1) std::signal(SIGTERM, SIG_DFL);

  if (o.average > 0) {  // [§6] average this run's last checkpoints
    const std::vector<std::string> mine = run_checkpoints(o.out, st.run);
    const std::vector<std::string> last(mine.end() - std::min((size_t)o.average, mine.size()), mine.end());
    const size_t others = list_checkpoints(o.out).size() - mine.size();
    try {
      int n = checkpoint_average(last, o.out + "/averaged.bin");
      std::printf("averaged the last %d checkpoints of this run into %s/averaged.bin [§6]%s\n", n, o.out.c_str(),
                  others ? (" (" + std::to_string(others) + " of another run left out)").c_str() : "");
    } catch (const std::exception& e) {
      fail(e.what());
    }
  }
  Evaluation e = evaluate(m, r.test, r.corpus.test, r.tok, o.batch_tokens, o.test_sentences, r.corpus.numbers);
  std::printf("test: loss %.4f, %s\n", e.loss, e.summary("--test-sentences").c_str());
}

}  // namespace

int main(int argc, char** argv) {
  limit_openmp_spinning(argv);
  // Progress goes to stderr, everything else to stdout, line by line, so that a log captured with
  // `./train > log 2>&1` holds every line in the order it was printed.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Ranks ranks(&argc, &argv);  // one rank unless started by mpirun (parallel.h)
  g_rank = ranks.rank;
  Run r(ranks, command_line(argc, argv, ranks));
  configure(r);
  make_run_folder(r);
  r.tok = vocabulary(r);
  if (r.o.bpe_only) {
    print_pieces(r.tok);
    return 0;
  }
  encode_data(r);
  build_model(r);
  make_batches(r);
  measure_memory(r);
  read_log(r);
  start_run_folder(r);
  stop_on_signals(ranks);
  Training t(r);
  const std::string reason = t.run();
  if (ranks.rank == 0) t.finish(reason);
  return 0;
}
