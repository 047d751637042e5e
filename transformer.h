// The Transformer of "Attention Is All You Need" (Vaswani et al., 2017): the interface of transformer.cu.
//
// Dimension legend (the paper's symbols):
//   B batch (sentences)   S source length   T target length   L either of them
//   D d_model             F d_ff            H heads           Dk = D / H (= d_v)
//   V shared vocabulary   N layers per stack                  M = B * L rows of a (B, L, D) tensor
//
// Conventions:
//   - Tensors are row-major; a (B, L, D) tensor is B*L rows of D numbers.
//   - Linear maps are x @ W with W stored (in, out). Attention heads h uses columns h*Dk .. (h+1)*Dk-1.
//   - Forward/backward pairs share a name stem and argument order: outputs, saved activations, inputs,
//     weights, sizes. Every backward ADDS into its input and parameter gradients; callers zero first.
//   - The CPU functions (namespace cpu) are the definition; they are templated on the scalar type
//     (float to train, double to check gradients).
#pragma once
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>  // the course handout's stubs throw std::logic_error
#include <string>
#include <utility>
#include <vector>

// Functions that the CPU and the GPU share, character for character (the dropout hash, the positional
// encoding): compiled for both when nvcc compiles them.
#ifdef __CUDACC__
#define HOST_DEVICE __host__ __device__
#else
#define HOST_DEVICE
#endif

// The special tokens' fixed ids (the tokenizer gives them the same ones).
constexpr int kPadId = 0;  // <pad>
constexpr int kBosId = 2;  // <s>: the decoder's first input
constexpr int kEosId = 3;  // </s>: ends the source and is the last token the decoder predicts

// Which target distribution label smoothing uses (§5.4; the paper does not say).
enum class LabelSmoothing {
  uniform_all,   // q = (1 - eps) onehot + eps / V on every class (PyTorch's label_smoothing)
  others_only,   // q = 1 - eps on the target, eps / (V - 1) on every other class (tensor2tensor)
};

struct Config {
  int N = 6, D = 512, F = 2048, H = 8;  // Table 3, base
  int V = 8000;                          // shared BPE vocabulary (§3.4)
  int max_len = 256;                     // longest sequence, <s> and </s> included
  double p_drop = 0.1;   // [§5.4] residual dropout and dropout on embedding + PE sums
  double p_attn = 0.0;   // dropout on attention weights: tensor2tensor has it, the paper is silent
  double p_relu = 0.0;   // dropout after the FFN's ReLU: likewise
  double eps_ls = 0.1;   // [§5.4] label smoothing
  LabelSmoothing ls_form = LabelSmoothing::others_only;
  double ln_eps = 1e-6;  // LayerNorm epsilon (tensor2tensor's; the paper is silent)
  bool pre_ln = false;   // false: the paper's post-LN, LayerNorm(x + Sublayer(x)) [§3.1]
  // [Eq. 3, §5.3] optimizer and schedule
  int warmup = 4000;
  double lr_scale = 1.0;
  double beta1 = 0.9, beta2 = 0.98, adam_eps = 1e-9;
  double clip_norm = 0.0;  // [DEVIATION] global gradient-norm clipping when > 0; off by default

  int Dk() const { return D / H; }
  void validate() const;  // throws std::invalid_argument naming the bad field
};

// Presets: "base" and "big" (Table 3), "small" (quick runs on Multi30k), "multi30k" (the Multi30k recipe's
// 4+4-layer, d_model 128 model), "tiny" (toy task on a CPU).
Config config_preset(const std::string& name);

// ---- parameters: one buffer, one table of named tensors ----------------------------------------------
enum class Init { xavier_uniform, embedding_normal, ones, zeros };
struct TensorInfo {
  std::string name;
  std::vector<int> shape;
  size_t offset, size;
  Init init;
};

template <typename T> struct AttentionWeights { T *wq, *wk, *wv, *wo; };        // each (D, D)
template <typename T> struct NormWeights { T *g, *b; };                          // each (D)
template <typename T> struct FfnWeights { T *w1, *b1, *w2, *b2; };              // (D,F) (F) (F,D) (D)
template <typename T> struct EncoderLayerWeights {
  AttentionWeights<T> self; NormWeights<T> ln1; FfnWeights<T> ffn; NormWeights<T> ln2;
};
template <typename T> struct DecoderLayerWeights {
  AttentionWeights<T> self; NormWeights<T> ln1; AttentionWeights<T> cross; NormWeights<T> ln2;
  FfnWeights<T> ffn; NormWeights<T> ln3;
};
template <typename T> struct Weights {
  T* emb;  // (V, D): source embedding, target embedding and pre-softmax projection [§3.4]
  std::vector<EncoderLayerWeights<T>> enc;
  std::vector<DecoderLayerWeights<T>> dec;
  NormWeights<T> enc_final, dec_final;  // pre-LN only
};

// The one place that lays parameters out: fills `table` (when non-null) and, when base is non-null,
// points `w` into base. Returns the total element count.
template <typename T>
size_t parameter_layout(const Config& cfg, T* base, Weights<T>* w, std::vector<TensorInfo>* table);

// ---- a batch of sentence pairs -----------------------------------------------------------------------
struct Batch {
  int B = 0, S = 0, T = 0;
  std::vector<int> src;      // (B, S) source ids, padded with cfg.pad
  std::vector<int> tgt_in;   // (B, T) <s> y1 .. y_{m}, padded
  std::vector<int> tgt_out;  // (B, T) y1 .. y_m </s>, padded: what each position must predict
  long target_tokens() const;  // positions of tgt_out that are not padding
};

// The model's view of a sentence pair (x, y), both BPE ids without specials: source x1..xn </s>,
// decoder input <s> y1..ym, decoder target y1..ym </s>. Packs pairs into one padded batch; tgt may be
// empty (a batch of sources only, for decoding). Training and decoding both go through here.
Batch make_batch(const std::vector<const std::vector<int>*>& src, const std::vector<const std::vector<int>*>& tgt);

// ---- random numbers: one counter-based hash for everything -------------------------------------------
// SplitMix64's step and finaliser: a bijective mix of 64 bits. Dropout masks, initialisation, the
// number corpus and the epoch shuffles all draw from it, so every run is reproducible on any platform
// (no std:: distributions, whose output varies between libraries).
inline HOST_DEVICE uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// ---- dropout: masks from a counter-based hash, reproducible anywhere ----------------------------------
// What changes from one forward to the next in a dropout key, kept in device memory for CUDA graphs: the
// step's part of the hash (dropout_step_stream) and the batch's part of the site (its index in the step).
struct DropoutStep {
  uint64_t stream = 0;
  uint32_t micro_site = 0;
};
struct DropoutKey {
  uint64_t stream = 0;  // hash of (seed, step, site); element i is kept when hash(stream, i) >= p
  double p = 0;         // drop probability; 0 disables the site
  // A step replayed from a CUDA graph keeps the key it was captured with, so when `step` is set, the
  // kernel makes stream = hash(step->stream, site + step->micro_site) itself (gpu's at_step); site is
  // then the site's id in the step's first batch.
  const DropoutStep* step = nullptr;
  uint32_t site = 0;
};
inline HOST_DEVICE uint64_t dropout_step_stream(uint64_t seed, long step) { return mix64(mix64(seed) ^ (uint64_t)step); }
inline HOST_DEVICE uint64_t dropout_site_stream(uint64_t step_stream, uint32_t site) { return mix64(step_stream ^ site); }
DropoutKey dropout_key(uint64_t seed, long step, uint32_t site, double p);
// Element i of a dropout site is kept when a 24-bit uniform from hash(stream, i) is >= p: u = (h >> 40) /
// 2^24 >= p, i.e. (h >> 40) >= ceil(p 2^24), both sides exact (an integer compare, which vectorises).
inline HOST_DEVICE uint64_t dropout_threshold(double p) { return (uint64_t)ceil(p * 16777216.0); }
inline HOST_DEVICE bool dropout_keeps(const DropoutKey& key, size_t i) {
  return (mix64(key.stream ^ (uint64_t)i) >> 40) >= dropout_threshold(key.p);
}
// [§5.4] What a kept element is multiplied by (inverted dropout): 1 / (1 - p), 1 when the site is off.
inline HOST_DEVICE double dropout_scale(const DropoutKey& key) { return key.p > 0 ? 1.0 / (1.0 - key.p) : 1.0; }

// [DEVIATION] Adam's moments (adam_update(), CPU and GPU): one below the smallest normal T is stored as zero.
template <typename T> inline HOST_DEVICE T normal_or_zero(double x) {
  const T y = T(x);  // as T would store it; then a choice between two T values, which vectorises
  return fabs(y) < (sizeof(T) == sizeof(float) ? FLT_MIN : DBL_MIN) ? T(0) : y;
}

// ---- activations saved by forward ------------------------------------------------------------------
template <typename T> struct AttentionActs { T *q, *k, *v, *p, *ctx; };  // (B,Lq,D) (B,Lk,D)x2 (B,H,Lq,Lk) (B,Lq,D)
template <typename T> struct SublayerActs {
  T* norm;    // pre-LN: LayerNorm(x), the sublayer's input (B, L, D)
  T* y;       // sublayer output after dropout (B, L, D)
  T* sum;     // post-LN: x + y, LayerNorm's input (B, L, D)
  T* out;     // the connection's output (B, L, D)
  T *mean, *rstd;  // LayerNorm statistics (B*L)
};
template <typename T> struct FfnActs { T *hpre, *h; };  // (M, F) before ReLU (on the GPU before its bias; in bf16 not written), after ReLU (+ dropout)
template <typename T> struct EncoderLayerActs {
  SublayerActs<T> self_sub; AttentionActs<T> self; SublayerActs<T> ffn_sub; FfnActs<T> ffn;
};
template <typename T> struct DecoderLayerActs {
  SublayerActs<T> self_sub; AttentionActs<T> self; SublayerActs<T> cross_sub; AttentionActs<T> cross;
  SublayerActs<T> ffn_sub; FfnActs<T> ffn;
};
template <typename T> struct StackActs {
  T* x0;  // embeddings * sqrt(D) + PE, after dropout (B, L, D)
  SublayerActs<T> final_ln;  // pre-LN only: out, mean, rstd
  T* out;                    // the stack's output (B, L, D)
};
template <typename T> struct Activations {
  std::vector<T> arena;  // one allocation for everything below
  int batch = 0, src_len = 0, tgt_len = 0;  // the shape the arena is carved for
  bool half_width = false;                    // carved for a half-width pass (carve_activations)
  std::vector<uint8_t> src_valid, tgt_valid;  // (B,S) (B,T): 1 for real tokens, 0 for padding
  StackActs<T> enc, dec;
  std::vector<EncoderLayerActs<T>> enc_layers;
  std::vector<DecoderLayerActs<T>> dec_layers;
  T *logits, *lse;  // (B, T, V) and (B*T) log-sum-exp of each row
  // backward scratch
  T *d_stream[2];          // gradient of the residual stream, ping-ponged layer by layer (B, L, D)
  T *d_enc_out;            // gradient of the encoder output, summed over the cross-attentions (B, S, D)
  T *d_sum, *d_sub, *d_norm;  // inside a sublayer connection (B, L, D)
  AttentionActs<T> d_attn;  // dq, dk, dv, dctx (p unused)
  T *dh, *dlogits;          // (B*L, F) and (B, T, V)
};

// ---- decoding's options and results (§6; the functions are below) -------------------------------------
struct DecodeOptions {
  int beam = 4;          // [§6] beam size
  double alpha = 0.6;    // [§6] length penalty lp(Y) = ((5 + |Y|) / 6)^alpha
  int max_extra = 50;    // [§6] output length <= source length + max_extra
  int n_best = 1;        // hypotheses returned per sentence (<= beam)
};
struct Hypothesis {
  std::vector<int> tokens;  // without <s> and </s>
  double logprob = 0;       // log P(Y | X), </s> included when finished
  double score = 0;         // logprob / lp(Y), |Y| counting </s>
  bool finished = false;    // ended with </s> (false: stopped at the length limit)
};

// ---- the model ---------------------------------------------------------------------------------------
constexpr long kLossRing = 64;  // steps whose losses a device keeps (DeviceModel::step_loss_sums)
// A model's state on an accelerator (gpu/model.cuh implements it): the parameters,
// gradients and Adam state as single device buffers, and a device activation arena. While a model has
// one, transformer_forward, transformer_backward, zero_grad, transformer_update and decoding run there.
struct DeviceModel {
  virtual ~DeviceModel() = default;
  virtual double forward(const Batch& batch, bool train) = 0;
  // accumulate_gradients' forward of a step's batch: its loss summed over its target tokens is added to the
  // step's on the device, which step_loss_sum reads (once a step); zero_grad zeroes it
  virtual void forward_in_step(const Batch& batch) = 0;
  virtual double step_loss_sum() = 0;
  // The summed losses of steps first .. first + count - 1, in one read: the update keeps each step's in a
  // ring of the last kLossRing steps, so that training can read them when it needs them, not every step
  virtual std::vector<double> step_loss_sums(long first, long count) = 0;
  virtual void backward(const Batch& batch, bool train) = 0;
  virtual void zero_grad() = 0;
  virtual void scale_grads(double factor) = 0;
  virtual float* grads_data() = 0;
  virtual void update(double lr) = 0;  // clipping when configured, and Adam at the model's step
  virtual void download() = 0;         // parameters and Adam state into the host buffers
  virtual void synchronize() = 0;      // waits until the queued work is done
  // [§6] decoding on the device: what greedy_decode, beam_search and decoder_logprobs do
  virtual std::vector<Hypothesis> greedy_decode(const std::vector<std::vector<int>>& src, int max_extra) = 0;
  virtual std::vector<std::vector<Hypothesis>> beam_search(const std::vector<std::vector<int>>& src,
                                                           const DecodeOptions& opt) = 0;
  virtual std::vector<float> decoder_logprobs(const std::vector<int>& src, const std::vector<int>& y) = 0;
};

template <typename T> struct Transformer {
  Config cfg;
  std::vector<TensorInfo> table;
  std::vector<T> params, grads, adam_m, adam_v;  // one allocation each, laid out by parameter_layout
  Weights<T> W, G;                                // views into params and grads
  long step = 0;                                  // optimizer steps taken
  int micro = 0;                                  // which batch of the step runs (accumulate_gradients)
  uint64_t seed = 0;                              // for dropout masks
  Activations<T> acts;
  std::unique_ptr<DeviceModel> device;            // null: the CPU (see transformer_to_device)

  Transformer(const Config& cfg, uint64_t seed);  // initialised as described in NOTES.md
  Transformer(const Transformer&) = delete;       // W and G point into this object's buffers
  Transformer& operator=(const Transformer&) = delete;
};

template <typename T> void transformer_init(Transformer<T>& m, uint64_t seed);
// Loss of one batch (mean label-smoothed cross-entropy over real target tokens); `train` turns dropout
// on, with masks keyed by (m.seed, m.step). Saves what transformer_backward needs.
template <typename T> double transformer_forward(Transformer<T>& m, const Batch& batch, bool train);
// Gradient of that loss, ADDED into m.grads.
template <typename T> void transformer_backward(Transformer<T>& m, const Batch& batch, bool train);
template <typename T> void zero_grad(Transformer<T>& m);
// [Eq. 3, §5.3] one Adam step with the scheduled learning rate; returns the learning rate used.
template <typename T> double transformer_update(Transformer<T>& m);
// [§5.1] One step's gradient over several batches (gradient accumulation; under data parallelism, this
// rank's share of the step): zeroes m.grads, then leaves there the gradient of the batches' summed loss
// divided by `tokens` (the target tokens of the whole step, every rank's batches included), so that K
// batches of n tokens give the gradient of one batch of K*n. micro[i] is batch i's index in the step (its
// dropout masks). Returns the batches' share of the step's loss: their summed loss over `tokens` (a step of
// one batch: its mean loss, to the bit). On a device, read_loss false reads nothing and returns NaN: the
// loss stays there until step_loss_sums reads it (summed, not yet over `tokens`).
template <typename T>
double accumulate_gradients(Transformer<T>& m, const std::vector<const Batch*>& batches, const std::vector<int>& micro,
                            long tokens, bool read_loss = true);
// m.grads, where they live: the host buffer, or the device's while the model is on one (for an all-reduce)
template <typename T> T* gradient_data(Transformer<T>& m);
template <typename T> void scale_gradients(Transformer<T>& m, double factor);

// [Eq. 3, §5.3] lrate = scale * D^-0.5 * min(step^-0.5, step * warmup^-1.5)
double learning_rate(long step, int D, int warmup, double scale);
// [§3.5] PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)):
// the pair (2i, 2i+1) shares one frequency.
inline HOST_DEVICE double positional_encoding(int pos, int i, int D) {
  // BEGIN SOLUTION task=positional_encoding points=3
  double angle = pos / pow(10000.0, (double)(i - i % 2) / D);
  return i % 2 == 0 ? sin(angle) : cos(angle);
  // END SOLUTION
}

// ---- decoding (§6): greedy and beam search with per-layer K/V caches -----------------------------------
// Sources are BPE ids without specials (make_batch appends </s>); outputs are ids without <s> and </s>.
// Sentences and their beams are decoded together, one decoder step for all of them at a time: the
// decoder self-attention keys and values of earlier positions are cached and grow by one position a
// step, the encoder-decoder keys and values are computed once per sentence. Dropout is off. Decoding
// runs where the model is: on the GPU, with the caches there, after transformer_to_device.
// [§6] GNMT's length penalty
double length_penalty(int length, double alpha);
// Longest output for a source of n tokens: n + max_extra, within the model's max_len.
int max_output_length(const Config& cfg, int source_tokens, int max_extra);
// Greedy decoding: the most probable token at each step, until </s> or the length limit.
template <typename T>
std::vector<Hypothesis> greedy_decode(Transformer<T>& m, const std::vector<std::vector<int>>& src, int max_extra);
// Beam search: the n_best hypotheses per source, best score first. Each step keeps the `beam` best
// extensions of the live hypotheses; those ending in </s> are finished. A sentence stops once no live
// hypothesis can beat its n_best-th finished one (log-probabilities only fall, lp grows at most to
// lp(limit)), or at the length limit, where live hypotheses are finished as they stand.
template <typename T>
std::vector<std::vector<Hypothesis>> beam_search(Transformer<T>& m, const std::vector<std::vector<int>>& src,
                                                 const DecodeOptions& opt);
// A run folder's decoding defaults: decoding.txt beside its checkpoints holds a beam size and a length
// penalty, chosen on the validation set (./translate --tune) or the recipe's (./train --config multi30k);
// ./translate uses them where its command line is silent. Lines "beam K" and "alpha A"; '#' comments.
void save_decoding_defaults(const std::string& path, const DecodeOptions& d, const std::string& comment);
// Sets the beam and alpha the file names: false when there is no file; std::runtime_error naming the
// file and line when it cannot be read or a line is not one of the two.
bool load_decoding_defaults(const std::string& path, DecodeOptions* d);
// log P(y | x) of every position of a given output, through the incremental decoder (y ids without
// specials; </s> appended): row t holds the log-probabilities (V) of the token after y_1..y_t.
template <typename T>
std::vector<T> decoder_logprobs(Transformer<T>& m, const std::vector<int>& src, const std::vector<int>& y);

// ---- checkpoints -----------------------------------------------------------------------------------------
// A binary file (NOTES.md, "Checkpoints"): magic "TRANSFMR", format version, the configuration, the
// vocabulary hash, the step and seed, where training stood (with version 2, the run's id and the options a
// resume must keep), the parameters and (optionally) Adam's m and v, then an FNV-1a checksum of everything
// before it. Written to a temporary file, flushed, synced and renamed, so a crash never leaves a
// half-written checkpoint under the real name. Version 1 files (without the run's fields) still load.
struct TrainState {
  long epoch = 0;        // epochs completed
  long batch = 0;        // batches of the current epoch done (the epoch's order comes from the seed)
  double elapsed = 0;    // seconds of training so far
  long tokens = 0;       // target tokens trained on so far
  uint64_t run = 0;      // the run's id, drawn at its start: --average and --keep take only its checkpoints (0: version 1)
  long batch_tokens = 0; // the run's --batch-tokens (0: unknown, version 1)
  long merges = -1;      // the BPE merges the run asked for (-1: a vocabulary given with --vocab, or version 1)
};
struct CheckpointMeta {
  uint64_t vocab_hash = 0;
  long step = 0;
  bool has_adam = false;  // false: parameters only (an averaged model)
  TrainState train;
};
// Throws std::runtime_error with one line when the file cannot be written.
void checkpoint_save(const std::string& path, const Transformer<float>& m, uint64_t vocab_hash, const TrainState* train);
// Throws std::runtime_error with one line: missing, a directory, not a checkpoint, another version, a size
// other than its header declares, bad checksum, invalid configuration, values not finite. Reads the header
// first and then only the size it declares (checked against a regular file's size before anything more).
std::unique_ptr<Transformer<float>> checkpoint_load(const std::string& path, CheckpointMeta* meta);
// The header alone (not checked by the checksum, which covers the whole file): what a run folder's listing
// needs of each checkpoint. Throws as checkpoint_load.
CheckpointMeta checkpoint_meta(const std::string& path);
// [§6] The mean of several checkpoints' parameters (same configuration and vocabulary), saved without
// Adam state; returns the number averaged.
int checkpoint_average(const std::vector<std::string>& paths, const std::string& out);
// Names the first field in which two configurations differ ("" when they are the same).
std::string config_difference(const Config& a, const Config& b);

// ---- memory: what a run will take, known before it allocates -------------------------------------------
// Bytes to train a model of this configuration on a batch of B sentences of S source and T target
// positions: the parameters, their gradients, Adam's m and v, and the activation arena (floats).
size_t training_bytes(const Config& c, int B, int S, int T);
// Bytes decoding takes on the CPU for `sources` sentences of up to S tokens with `rows` hypotheses of up
// to `capacity` positions: the encoder's activations, the K/V caches and a step's scratch.
size_t decoding_bytes(const Config& c, int sources, int S, int capacity, int rows);
// Bytes this process can still allocate: the system's available memory (MemAvailable), or less under an
// address-space limit (ulimit -v).
size_t available_memory();

// ---- the sub-layers on the CPU: the reference definitions ---------------------------------------------
namespace cpu {

// C (M,N) = op(A) op(B) [+ C]; op(A) is (M,K), A^T when ta; op(B) is (K,N), B^T when tb; row-major with
// leading dimensions lda, ldb, ldc (cuBLAS's gemm, transposed to row-major).
template <typename T>
void gemm(bool ta, bool tb, int M, int N, int K, const T* A, int lda, const T* B, int ldb, T* C, int ldc,
          bool accumulate);
// The float product has a fast form (gemm.h): a register-tile kernel for the instruction set the CPU
// has, chosen at run time. gemm_with runs a given kernel (the tests and benchmarks try each one).
template <>
void gemm<float>(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C,
                 int ldc, bool accumulate);
enum class GemmKernel { automatic, avx512, avx2, neon, generic };
const char* gemm_kernel_name(GemmKernel k);
bool gemm_kernel_supported(GemmKernel k);  // this build has the kernel and this CPU runs it
GemmKernel gemm_best_kernel();             // what automatic chooses
void gemm_with(GemmKernel k, bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
               float* C, int ldc, bool accumulate);
// Decoding multiplies the same weights by a few rows at every step, where packing op(B) for each product
// costs more than the product itself. PackedOperands packs the op(B) operands it is given once, for one
// kernel; while it lives, gemm_with with that kernel (and gemm<float>, when it is the automatic one) on the
// thread that made it reads them from there: the same sums in the same order, identical results. The
// operands must not change while it lives. A scope on the stack: made and destroyed on one thread, the
// innermost first (each restores the one active before it).
struct GemmOperand {
  bool tb;
  int N, K;  // op(B) is (K, N)
  const float* B;
  int ldb;
  bool operator==(const GemmOperand& o) const { return tb == o.tb && N == o.N && K == o.K && B == o.B && ldb == o.ldb; }
};
class PackedOperands {
 public:
  explicit PackedOperands(const std::vector<GemmOperand>& operands, GemmKernel k = GemmKernel::automatic);
  ~PackedOperands();
  PackedOperands(const PackedOperands&) = delete;
  PackedOperands& operator=(const PackedOperands&) = delete;
  // the packed copy of op(B) for kernel k, or null when this does not hold it
  const float* find(GemmKernel k, const GemmOperand& op) const;

 private:
  GemmKernel kernel_;
  std::vector<std::pair<GemmOperand, std::unique_ptr<float, void (*)(void*)>>> packed_;
  const PackedOperands* previous_;  // the one that was active on this thread before
};

// [§3.4, §3.5] out = emb[ids] * sqrt(D) + PE; position t of each row is first_pos + t (decoding embeds
// one position at a time)
template <typename T>
void embedding_forward(T* out /*(B,L,D)*/, const int* ids /*(B,L)*/, const T* emb /*(V,D)*/, int B, int L,
                       int D, int first_pos = 0);
template <typename T>
void embedding_backward(T* demb /*(V,D)*/, const T* dout /*(B,L,D)*/, const int* ids /*(B,L)*/, int B,
                        int L, int D);

// [§5.4] out = in * keep / (1 - p), keep from the hash; out may alias in.
template <typename T> void dropout_forward(T* out, const T* in, DropoutKey key, size_t n);
template <typename T> void dropout_backward(T* din, const T* dout, DropoutKey key, size_t n);

// out (M,O) = in (M,I) @ w (I,O) + b (O); b may be null
template <typename T>
void linear_forward(T* out, const T* in, const T* w, const T* b, int M, int I, int O);
template <typename T>
void linear_backward(T* din, T* dw, T* db, const T* dout, const T* in, const T* w, int M, int I, int O);

// [Eq. 1, §3.2.1] ctx = softmax(Q K^T / sqrt(Dk)) V per head, keys masked by key_valid (and causally:
// query i sees keys j <= i); p saves the softmax before attention dropout.
template <typename T>
void attention_forward(T* ctx /*(B,Lq,D)*/, T* p /*(B,H,Lq,Lk)*/, const T* q /*(B,Lq,D)*/,
                       const T* k /*(B,Lk,D)*/, const T* v /*(B,Lk,D)*/, const uint8_t* key_valid /*(B,Lk)*/,
                       bool causal, DropoutKey drop, int B, int Lq, int Lk, int D, int H);
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dctx, const T* p,
                        const T* q, const T* k, const T* v, DropoutKey drop, int B, int Lq, int Lk, int D,
                        int H);

// [§3.2.2] MultiHead(xq, xkv) = Concat(head_1..head_H) W^O, head_i = Attention(xq Wq_i, xkv Wk_i, xkv Wv_i)
template <typename T>
void multihead_attention_forward(T* out /*(B,Lq,D)*/, const AttentionActs<T>& a, const T* xq, const T* xkv,
                                 const AttentionWeights<T>& w, const uint8_t* key_valid, bool causal,
                                 DropoutKey drop, int B, int Lq, int Lk, int D, int H);
template <typename T>
void multihead_attention_backward(T* dxq, T* dxkv, const AttentionWeights<T>& dw, const T* dout,
                                  const AttentionActs<T>& a, const AttentionActs<T>& scratch,
                                  const T* xq, const T* xkv, const AttentionWeights<T>& w, DropoutKey drop,
                                  int B, int Lq, int Lk, int D, int H);

// [Eq. 2, §3.3] FFN(x) = max(0, x W1 + b1) W2 + b2
template <typename T>
void ffn_forward(T* out /*(M,D)*/, const FfnActs<T>& a, const T* in /*(M,D)*/, const FfnWeights<T>& w,
                 DropoutKey relu_drop, int M, int D, int F);
template <typename T>
void ffn_backward(T* din, const FfnWeights<T>& dw, T* dh_scratch /*(M,F)*/, const T* dout,
                  const FfnActs<T>& a, const T* in, const FfnWeights<T>& w, DropoutKey relu_drop, int M,
                  int D, int F);

// [§3.1] LayerNorm(x) = (x - mean) / sqrt(var + eps) * g + b over the last dimension
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* in, const T* g, const T* b, int M, int D,
                       double eps);
template <typename T>
void layernorm_backward(T* din, T* dg, T* db, const T* dout, const T* in, const T* g, const T* mean,
                        const T* rstd, int M, int D);

// [§3.1] out = x + Dropout(y): the residual connection around a sub-layer, its dropout included (y unchanged).
template <typename T> void residual_dropout_forward(T* out, const T* x, const T* y, DropoutKey drop, size_t n);
// Post-LN's end of a sub-layer: sum = x + Dropout(y), out = LayerNorm(sum) with its mean and rstd.
template <typename T>
void residual_dropout_layernorm_forward(T* out, T* sum, T* mean, T* rstd, const T* x, const T* y, DropoutKey drop, const T* g,
                                        const T* b, int M, int D, double eps);
// Their backwards: dx += dout, dy += Dropout'(dout); post-LN, the same of LayerNorm's input gradient
// (computed into the scratch dsum (M, D)), and dg, db += LayerNorm's parameter gradients.
template <typename T> void residual_dropout_backward(T* dx, T* dy, const T* dout, DropoutKey drop, size_t n);
template <typename T>
void residual_dropout_layernorm_backward(T* dx, T* dy, T* dg, T* db, T* dsum, const T* dout, const T* sum, const T* g,
                                         const T* mean, const T* rstd, DropoutKey drop, int M, int D);

// [§3.4] logits (M,V) = y (M,D) @ emb^T: the pre-softmax projection shares the embedding matrix
template <typename T>
void output_projection_forward(T* logits, const T* y, const T* emb, int M, int D, int V);
template <typename T>
void output_projection_backward(T* dy, T* demb, const T* dlogits, const T* y, const T* emb, int M, int D,
                                int V);

// [§5.4] mean over non-pad positions of -sum_v q_v log softmax(logits)_v; saves lse (M)
template <typename T>
double label_smoothed_xent_forward(T* lse, const T* logits, const int* targets, int M, int V, double eps,
                                   LabelSmoothing form, int pad);
template <typename T>
void label_smoothed_xent_backward(T* dlogits, const T* logits, const T* lse, const int* targets, int M,
                                  int V, double eps, LabelSmoothing form, int pad);

// [§5.3] Adam with bias correction, over one flat buffer; t is the 1-based step.
template <typename T>
void adam_update(T* params, const T* grads, T* m, T* v, size_t n, double lr, double beta1, double beta2,
                 double eps, long t);
template <typename T> double grad_norm(const T* grads, size_t n);
template <typename T> void scale_grads(T* grads, size_t n, double factor);
// [DEVIATION] optional: grads scaled by max_norm / ||grads|| when that is below 1 (the paper has no clipping)
template <typename T> void clip_grad_norm(T* grads, size_t n, double max_norm);

// [§6] Decoding's two operations of its own (inference only: nothing is trained through them).
// out (M,V) = log softmax(logits) row by row; out may be logits.
template <typename T> void log_softmax(T* out, const T* logits, int M, int V);
// Row r of dst (rows `dst_stride` apart) = row index[r] of src (rows `src_stride` apart), or row r when
// index is null; `width` elements a row. Appends to and reorders the K/V caches.
template <typename T>
void copy_rows(T* dst, size_t dst_stride, const T* src, size_t src_stride, const int* index, int rows, size_t width);

}  // namespace cpu

// ---- the GPU path (CUDA kernels and cuBLAS) ----------------------------------------------------------------
// True when this build has the CUDA path and a GPU is present (an emulated one counts: see gpu_emulated).
bool gpu_available();
// True when the GPU is cuda_emulator.h's, run on the CPU for testing (make EMU=1): the programs then choose
// --device cpu unless asked for cuda.
bool gpu_emulated();
// The GPU's name as the runtime gives it ("" without a CUDA path or GPU), for the programs' model line.
std::string gpu_name();
// The GPU's matrix products: fp32 (pedantic: the reference, which the parity tests hold to the CPU), TF32
// (SGEMM on the tensor cores: 10-bit mantissas in the products) or bf16 (mixed precision: bf16 operands on
// the tensor cores, fp32 sums; the parameters, gradients, Adam and everything outside the products stay
// fp32). set_precision throws std::runtime_error without a GPU, or for bf16 on a GPU without it.
enum class Precision { fp32, tf32, bf16 };
const char* precision_name(Precision p);
Precision parse_precision(const std::string& name);  // "fp32", "tf32" or "bf16"; anything else throws
Precision default_precision();                       // bf16 on a GPU that has it (compute capability 8.0+), else fp32
void set_precision(Precision p);
// Whether the GPU's training step replays CUDA graphs (on by default): the forward and the backward of
// each batch shape are captured once (the second time the shape comes; the first runs op by op, so that
// every buffer the step needs exists before a capture, where nothing may be allocated) and replayed after,
// one launch each. Target and source lengths are then rounded up to a multiple of 8 (at most max_len),
// so that few shapes exist. Off: every operation is its own launch, at the batch's own shape.
void set_cuda_graphs(bool on);
enum class Device { cpu, cuda };
// Moves training to a device: to cuda, one upload of the parameters, gradients and Adam state (throws
// std::runtime_error when this build has no CUDA path or no GPU is present); to cpu, one download.
void transformer_to_device(Transformer<float>& m, Device d);
// Copies the parameters and Adam state from the device into m's host buffers (before a checkpoint or
// CPU decoding); nothing to do on the CPU.
void transformer_download(Transformer<float>& m);
// FNV-1a of the parameters' bytes, wherever they live (data parallelism: every rank must hold the same).
uint64_t parameter_hash(Transformer<float>& m);
// Waits until the model's device has done the work queued so far (for timing); nothing to do on the CPU.
void synchronize_device(Transformer<float>& m);

#ifdef TRANSFORMER_CUDA  // set by the Makefile when nvcc compiles transformer.cu
// The same operations as namespace cpu, with the same names and argument order, in float on device
// pointers. They are tested against the CPU, op by op (test/parity_gpu.cpp). Calls are asynchronous on
// one stream except where a value comes back to the host (the loss, the gradient norm). Every CUDA and
// cuBLAS call is checked: a failure throws std::runtime_error naming the file, line and error.
namespace gpu {
// device memory
float* alloc(size_t n);  // out of memory: the message names --batch-tokens
int* alloc_ints(size_t n);
uint8_t* alloc_bytes(size_t n);
void release(void* p);
void upload(float* dst, const float* src, size_t n);
void upload(int* dst, const int* src, size_t n);
void upload(uint8_t* dst, const uint8_t* src, size_t n);
void download(float* dst, const float* src, size_t n);
void fill(float* p, float value, size_t n);
// A fill with zeros that waits for the next op (a model's backward: zero a gradient, then add into it): an
// op that adds into exactly these n floats writes 0 + x there instead, and no fill is launched; before any
// other GPU work (a launch, a product, a copy) the fills still waiting are launched.
void defer_zero_fill(float* p, size_t n);
void launch_deferred_fills();
void drop_deferred_fills();  // forgets them (a backward that throws): nothing is filled
void synchronize();

// A bf16 copy of the n floats at p (the parameters), which adam_update keeps current and the products read
// in bf16 precision; bf16_copy gives its elements (for the tests).
void keep_bf16_copy(const float* p, size_t n);
void drop_bf16_copy(const float* p);
std::vector<float> bf16_copy(const float* p, size_t n);
// An activation with a bf16 twin (a model's training step in bf16): where it starts, its floats, and
// whether its producer writes the twin alone, without the fp32 values (nothing reads those in that step);
// such a twin lives in the fp32 buffer's own storage, the first half of its bytes (all that a bf16 arena
// carves for it: the n floats past p are a name, and past their first half lies another buffer).
struct Bf16Twin {
  const float* p;
  size_t n;
  bool alone = false;
};
// The activations that have a bf16 twin now, which their producers (a kernel of ours, or for attention's
// q, k and v a product) write and the products or the attention kernels read; bf16_copy gives a twin's
// elements (for the tests).
std::vector<Bf16Twin> bf16_twins();
// Gives the activations listed their twins, those alone in their own buffers and the others one after another
// in storage (device memory, bf16_twin_storage(twins) elements of 2 bytes), replacing those set before; an
// empty list drops them (a model's training step; the tests).
void set_bf16_twins(const std::vector<Bf16Twin>& twins, void* storage);
size_t bf16_twin_storage(const std::vector<Bf16Twin>& twins);
// In bf16 precision the operands are rounded to bf16 (a parameter's copy is used where it has one).
void gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
          bool accumulate);
void embedding_forward(float* out, const int* ids, const float* emb, int B, int L, int D, int first_pos = 0);
void embedding_backward(float* demb, const float* dout, const int* ids, int B, int L, int D);
void dropout_forward(float* out, const float* in, DropoutKey key, size_t n);
void dropout_backward(float* din, const float* dout, DropoutKey key, size_t n);
void linear_forward(float* out, const float* in, const float* w, const float* b, int M, int I, int O);
void linear_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w, int M, int I, int O);
// In bf16 precision, where q, k and v have bf16 twins (all three), the attention reads the twins and not their
// fp32 values, and the backward reads dctx in bf16 too (its twin where it has one, else rounded on its way in).
void attention_forward(float* ctx, float* p, const float* q, const float* k, const float* v, const uint8_t* key_valid,
                       bool causal, DropoutKey drop, int B, int Lq, int Lk, int D, int H);
void attention_backward(float* dq, float* dk, float* dv, const float* dctx, const float* p, const float* q, const float* k,
                        const float* v, DropoutKey drop, int B, int Lq, int Lk, int D, int H);
void multihead_attention_forward(float* out, const AttentionActs<float>& a, const float* xq, const float* xkv,
                                 const AttentionWeights<float>& w, const uint8_t* key_valid, bool causal, DropoutKey drop,
                                 int B, int Lq, int Lk, int D, int H);
void multihead_attention_backward(float* dxq, float* dxkv, const AttentionWeights<float>& dw, const float* dout,
                                  const AttentionActs<float>& a, const AttentionActs<float>& scratch, const float* xq,
                                  const float* xkv, const AttentionWeights<float>& w, DropoutKey drop, int B, int Lq, int Lk,
                                  int D, int H);
void ffn_forward(float* out, const FfnActs<float>& a, const float* in, const FfnWeights<float>& w, DropoutKey relu_drop,
                 int M, int D, int F);
void ffn_backward(float* din, const FfnWeights<float>& dw, float* dh_scratch, const float* dout, const FfnActs<float>& a,
                  const float* in, const FfnWeights<float>& w, DropoutKey relu_drop, int M, int D, int F);
void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* g, const float* b, int M, int D,
                       double eps);
void layernorm_backward(float* din, float* dg, float* db, const float* dout, const float* in, const float* g,
                        const float* mean, const float* rstd, int M, int D);
void residual_dropout_forward(float* out, const float* x, const float* y, DropoutKey drop, size_t n);
void residual_dropout_layernorm_forward(float* out, float* sum, float* mean, float* rstd, const float* x, const float* y,
                                        DropoutKey drop, const float* g, const float* b, int M, int D, double eps);
void residual_dropout_backward(float* dx, float* dy, const float* dout, DropoutKey drop, size_t n);
// one pass per row; dsum is unused (the CPU's scratch)
void residual_dropout_layernorm_backward(float* dx, float* dy, float* dg, float* db, float* dsum, const float* dout,
                                         const float* sum, const float* g, const float* mean, const float* rstd, DropoutKey drop,
                                         int M, int D);
// Where the logits have a bf16 twin listed alone (a bf16 model's passes), the product writes only the twin and
// the loss's passes below read it.
void output_projection_forward(float* logits, const float* y, const float* emb, int M, int D, int V);
void output_projection_backward(float* dy, float* demb, const float* dlogits, const float* y, const float* emb, int M, int D,
                                int V);
// The softmax and the loss fused: one pass over the logits per row; targets on the device. Under a
// CUDA graph's capture nothing is read back: it returns NaN, and last_loss() reads the loss after a replay.
double label_smoothed_xent_forward(float* lse, const float* logits, const int* targets, int M, int V, double eps,
                                   LabelSmoothing form, int pad);
double last_loss();  // the mean loss the last label_smoothed_xent_forward computed (one read from the device)
void add_step_loss(double* step_sum);  // *step_sum (device) += that loss summed over its tokens (nothing read)
void label_smoothed_xent_backward(float* dlogits, const float* logits, const float* lse, const int* targets, int M, int V,
                                  double eps, LabelSmoothing form, int pad);
// Adam's step t, read by its kernel from device memory (a CUDA graph of the update serves every step): the
// rate (Eq. 3) and the bias corrections 1 - beta1^t and 1 - beta2^t.
struct AdamStep {
  double lr, c1, c2;
  long t;  // the step, which also names its slot in the ring of losses (keep_step_loss)
};
AdamStep adam_step(double lr, double beta1, double beta2, long t);
void adam_update(float* params, const float* grads, float* m, float* v, size_t n, const AdamStep* step, double beta1, double beta2,
                 double eps);
void clip_grad_norm(float* grads, size_t n, double max_norm);  // the decision made on the device: nothing is read back
// ring[t % kLossRing] = *step_sum, with t read from the step (device memory): the update keeps its step's loss
void keep_step_loss(double* ring, const double* step_sum, const AdamStep* step);
void scale_grads(float* grads, size_t n, double factor);
void log_softmax(float* out, const float* logits, int M, int V);
void copy_rows(float* dst, size_t dst_stride, const float* src, size_t src_stride, const int* index, int rows, size_t width);
}  // namespace gpu
#endif
