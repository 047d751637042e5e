// The Transformer of "Attention Is All You Need" on the CPU, forward and backward, written to be read beside
// the paper: the reference that the gradient checks run in double and the GPU path (gpu/) is tested against.
// In the paper's order: the sub-layers (namespace cpu: §3.2 attention, §3.3 FFN, §3.1 LayerNorm and the
// residual, §3.4 embeddings, §5.4 the loss, §5.3 Adam), then the model, its passes over the stacks, training.
// Not here: decoding (decoding.cuh), checkpoints (checkpoint.cpp), the GPU path (gpu/). The dimension legend
// and the conventions are at the top of transformer.h.
#include "transformer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include <sys/resource.h>  // getrlimit
#include <unistd.h>        // sysconf

#include "fastexp.h"  // cpu::exp_shifted, exp over a float row (log_softmax's, over the vocabulary)
#include "gemm.h"     // cpu::gemm<float>, the fast form of the matrix product (the template below is the reference)

// ---- configuration ---------------------------------------------------------------------------------

void Config::validate() const {
  auto need = [](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("invalid config: ") + what);
  };
  need(N >= 1, "layers must be >= 1");
  need(D >= 2 && D % 2 == 0, "d_model must be even and >= 2 (sinusoids come in pairs)");
  need(H >= 1 && D % H == 0, "d_model must be divisible by heads");
  need(F >= 1, "d_ff must be >= 1");
  need(V >= 5, "vocabulary must hold the 4 special tokens and at least one more");
  need(max_len >= 2, "max length must be >= 2");
  need(p_drop >= 0 && p_drop < 1 && p_attn >= 0 && p_attn < 1 && p_relu >= 0 && p_relu < 1,
       "dropout probabilities must be in [0, 1)");
  need(eps_ls >= 0 && eps_ls < 1, "label smoothing must be in [0, 1)");
  need(ln_eps >= 1e-12 && ln_eps <= 1, "LayerNorm epsilon must be in [1e-12, 1]");  // (1e-6 here, 1e-5 in PyTorch)
  need(warmup >= 1, "warmup steps must be >= 1");
  need(lr_scale > 0 && std::isfinite(lr_scale), "learning-rate scale must be > 0");
  need(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "Adam's betas must be in [0, 1)");
  need(adam_eps > 0 && std::isfinite(adam_eps), "Adam's epsilon must be > 0");
  need(clip_norm >= 0 && std::isfinite(clip_norm), "clip norm must be >= 0 (0 = off)");
}

Config config_preset(const std::string& name) {
  Config c;  // the defaults are the base model of Table 3
  if (name == "base") return c;
  if (name == "big") {  // Table 3, big
    c.D = 1024, c.F = 4096, c.H = 16, c.p_drop = 0.3;
    return c;
  }
  // [DEVIATION] "small", "multi30k" and "tiny" are not in the paper: smaller models for Multi30k and for a CPU
  if (name == "small") {  // Multi30k-sized: the PyTorch reference's model and schedule (../shared/bench)
    c.N = 3, c.D = 256, c.F = 1024, c.H = 8, c.p_drop = 0.2, c.warmup = 1000, c.lr_scale = 2;
    return c;
  }
  if (name == "multi30k") {  // Wu et al. 2021's Transformer-tiny for Multi30k: peak rate 2.5 / sqrt(128 * 2000) = 4.9e-3
    c.N = 4, c.D = 128, c.F = 256, c.H = 4, c.p_drop = 0.3, c.warmup = 2000, c.lr_scale = 2.5;
    return c;
  }
  if (name == "tiny") {  // the built-in number corpus on two CPU cores
    c.N = 2, c.D = 64, c.F = 256, c.H = 4, c.warmup = 400, c.max_len = 64;
    return c;
  }
  throw std::invalid_argument("unknown config '" + name + "' (choose tiny, multi30k, small, base or big)");
}

// ---- parameters ----------------------------------------------------------------------------------

template <typename T>
size_t parameter_layout(const Config& c, T* base, Weights<T>* w, std::vector<TensorInfo>* table) {
  size_t total = 0;
  auto add = [&](const std::string& name, std::vector<int> shape, Init init) -> T* {
    size_t n = 1;
    for (int d : shape) n *= (size_t)d;
    if (table) table->push_back({name, shape, total, n, init});
    T* p = base ? base + total : nullptr;
    total += n;
    return p;
  };
  auto attention = [&](const std::string& p) {
    AttentionWeights<T> a;
    a.wq = add(p + ".wq", {c.D, c.D}, Init::xavier_uniform);
    a.wk = add(p + ".wk", {c.D, c.D}, Init::xavier_uniform);
    a.wv = add(p + ".wv", {c.D, c.D}, Init::xavier_uniform);
    a.wo = add(p + ".wo", {c.D, c.D}, Init::xavier_uniform);
    return a;
  };
  auto norm = [&](const std::string& p) {
    return NormWeights<T>{add(p + ".g", {c.D}, Init::ones), add(p + ".b", {c.D}, Init::zeros)};
  };
  auto ffn = [&](const std::string& p) {
    FfnWeights<T> f;
    f.w1 = add(p + ".w1", {c.D, c.F}, Init::xavier_uniform);
    f.b1 = add(p + ".b1", {c.F}, Init::zeros);
    f.w2 = add(p + ".w2", {c.F, c.D}, Init::xavier_uniform);
    f.b2 = add(p + ".b2", {c.D}, Init::zeros);
    return f;
  };
  Weights<T> v;
  v.emb = add("emb", {c.V, c.D}, Init::embedding_normal);
  for (int l = 0; l < c.N; ++l) {
    std::string p = "enc." + std::to_string(l);
    EncoderLayerWeights<T> e;
    e.self = attention(p + ".self");
    e.ln1 = norm(p + ".ln1");
    e.ffn = ffn(p + ".ffn");
    e.ln2 = norm(p + ".ln2");
    v.enc.push_back(e);
  }
  v.enc_final = c.pre_ln ? norm("enc.final_ln") : NormWeights<T>{nullptr, nullptr};
  for (int l = 0; l < c.N; ++l) {
    std::string p = "dec." + std::to_string(l);
    DecoderLayerWeights<T> d;
    d.self = attention(p + ".self");
    d.ln1 = norm(p + ".ln1");
    d.cross = attention(p + ".cross");
    d.ln2 = norm(p + ".ln2");
    d.ffn = ffn(p + ".ffn");
    d.ln3 = norm(p + ".ln3");
    v.dec.push_back(d);
  }
  v.dec_final = c.pre_ln ? norm("dec.final_ln") : NormWeights<T>{nullptr, nullptr};
  if (w) *w = v;
  return total;
}

long Batch::target_tokens() const {
  long n = 0;
  for (int id : tgt_out) n += id != kPadId;
  return n;
}

Batch make_batch(const std::vector<const std::vector<int>*>& src, const std::vector<const std::vector<int>*>& tgt) {
  if (!tgt.empty() && tgt.size() != src.size()) throw std::invalid_argument("make_batch: source and target counts differ");
  Batch b;
  b.B = (int)src.size();
  for (const auto* x : src) b.S = std::max(b.S, (int)x->size() + 1);
  for (const auto* y : tgt) b.T = std::max(b.T, (int)y->size() + 1);
  b.src.assign((size_t)b.B * b.S, kPadId);
  b.tgt_in.assign((size_t)b.B * b.T, kPadId);
  b.tgt_out.assign((size_t)b.B * b.T, kPadId);
  for (int i = 0; i < b.B; ++i) {
    int* s = &b.src[(size_t)i * b.S];
    std::copy(src[i]->begin(), src[i]->end(), s);
    s[src[i]->size()] = kEosId;
    if (tgt.empty()) continue;
    const std::vector<int>& y = *tgt[i];
    int* in = &b.tgt_in[(size_t)i * b.T];
    int* out = &b.tgt_out[(size_t)i * b.T];
    in[0] = kBosId;
    std::copy(y.begin(), y.end(), in + 1);
    std::copy(y.begin(), y.end(), out);
    out[y.size()] = kEosId;
  }
  return b;
}

// ---- random numbers and dropout masks ------------------------------------------------------------


DropoutKey dropout_key(uint64_t seed, long step, uint32_t site, double p) {
  return {dropout_site_stream(dropout_step_stream(seed, step), site), p, nullptr, site};
}


// Dropout sites: one id per (stack, layer, place, batch of the step), so no two masks in a step coincide.
// The first batch of a step (micro 0) has the ids of a step of one batch.
enum DropoutPlace : uint32_t { kEmbedding, kSelfOut, kSelfWeights, kCrossOut, kCrossWeights, kFfnOut, kFfnRelu };
static uint32_t dropout_micro_site(int micro) { return (uint32_t)micro << 17; }
static uint32_t dropout_site(int stack, int layer, DropoutPlace place, int micro) {
  return dropout_micro_site(micro) + ((uint32_t)stack * 4096u + (uint32_t)layer) * 16u + place;
}

// ---- §3.5 positional encoding, Eq. 3 -------------------------------------------------------------


// [Eq. 3, §5.3] lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), times a scale factor
double learning_rate(long step, int D, int warmup, double scale) {
  // BEGIN SOLUTION task=learning_rate points=3
  double s = (double)std::max(step, 1L);
  return scale * std::pow((double)D, -0.5) * std::min(std::pow(s, -0.5), s * std::pow((double)warmup, -1.5));
  // END SOLUTION
}

namespace cpu {

// ---- matrix products -----------------------------------------------------------------------------

// Blocked as BLAS libraries do, so that each element loaded is used many times: a (KC x NC) block of
// op(B) is packed into NR-wide column panels, an MR-row panel of op(A) beside it, and each MR x NR tile of
// C accumulates in registers over the block's KC terms. The threads share the packing of B and split the
// tiles. Every element of C sums its K terms in the same order whatever the number of threads.
//
// Under SANITIZE=1 this one function is left uninstrumented (UNSANITIZED): instrumented, its inner loop ran
// 30 times slower (20 tiny-model steps: 67 s of CPU against 2.3 s plain, 8.2 s with gemm exempt), which
// made the sanitized suite take most of an hour. Its indexing is held to exact values by gradcheck and
// model_golden, and every buffer it is given is still checked where it is allocated, filled and read.
#ifdef __SANITIZE_ADDRESS__
#define UNSANITIZED __attribute__((no_sanitize("address", "undefined")))
#else
#define UNSANITIZED
#endif
template <typename T>
UNSANITIZED void gemm(bool ta, bool tb, int M, int N, int K, const T* A, int lda, const T* B, int ldb, T* C, int ldc,
                      bool accumulate) {
  constexpr int MR = 6, NR = 16, KC = 256, NC = 1024;
  if (!accumulate)
    for (int i = 0; i < M; ++i) std::fill(C + (size_t)i * ldc, C + (size_t)i * ldc + N, T(0));
  if (M == 0 || N == 0 || K == 0) return;
  auto a_at = [&](int i, int k) { return ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]; };  // op(A)(i, k)
  auto b_at = [&](int k, int j) { return tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]; };  // op(B)(k, j)
  std::vector<T> bpack((size_t)std::min(KC, K) * ((std::min(NC, N) + NR - 1) / NR * NR));
#pragma omp parallel if ((long)M * N * K > 100000)
  {
    T apack[KC * MR];
    for (int k0 = 0; k0 < K; k0 += KC) {
      const int kc = std::min(KC, K - k0);
      for (int j0 = 0; j0 < N; j0 += NC) {
        const int nc = std::min(NC, N - j0), panels = (nc + NR - 1) / NR;
        // panel p holds op(B)(k0 + k, j0 + p NR + c) at [(p kc + k) NR + c], zero past column N
#pragma omp for schedule(static)
        for (int p = 0; p < panels; ++p) {
          T* dst = bpack.data() + (size_t)p * kc * NR;
          const int jb = j0 + p * NR, w = std::min(NR, N - jb);
          for (int k = 0; k < kc; ++k)
            for (int c = 0; c < NR; ++c) dst[k * NR + c] = c < w ? b_at(k0 + k, jb + c) : T(0);
        }
        // the tiles, row panel by row panel: a thread's tiles are consecutive, so it packs each row panel
        // of op(A) it needs once, as apack[k MR + r] = op(A)(i0 + r, k0 + k)
        const int row_panels = (M + MR - 1) / MR;
        int packed = -1;
#pragma omp for schedule(static)
        for (int tile = 0; tile < row_panels * panels; ++tile) {
          const int ip = tile / panels, p = tile % panels, i0 = ip * MR, h = std::min(MR, M - i0);
          if (ip != packed) {
            for (int k = 0; k < kc; ++k)
              for (int r = 0; r < MR; ++r) apack[k * MR + r] = r < h ? a_at(i0 + r, k0 + k) : T(0);
            packed = ip;
          }
          const T* bp = bpack.data() + (size_t)p * kc * NR;
          T acc[MR][NR] = {};
          for (int k = 0; k < kc; ++k)
            for (int r = 0; r < MR; ++r)
#pragma omp simd
              for (int c = 0; c < NR; ++c) acc[r][c] += apack[k * MR + r] * bp[k * NR + c];
          const int jb = j0 + p * NR, w = std::min(NR, N - jb);
          for (int r = 0; r < h; ++r)
            for (int c = 0; c < w; ++c) C[(size_t)(i0 + r) * ldc + jb + c] += acc[r][c];
        }
      }
    }
  }
}

// Sums over the rows of a row-major matrix (bias and LayerNorm gradients) go this many columns at a time.
constexpr int kColumns = 64;

template <typename T>
void linear_forward(T* out, const T* in, const T* w, const T* b, int M, int I, int O) {
  gemm(false, false, M, O, I, in, I, w, O, out, O, false);  // out = in @ w
  if (b) {
#pragma omp parallel for if ((long)M * O > 100000)
    for (int i = 0; i < M; ++i)
      for (int o = 0; o < O; ++o) out[(size_t)i * O + o] += b[o];
  }
}

template <typename T>
void linear_backward(T* din, T* dw, T* db, const T* dout, const T* in, const T* w, int M, int I, int O) {
  // BEGIN SOLUTION task=linear_backward points=6
  // forward was: out = in @ w + b; so now: din += dout @ w^T, dw += in^T @ dout, db += sum_rows dout
  if (din) gemm(false, true, M, I, O, dout, O, w, O, din, I, true);
  if (dw) gemm(true, false, I, O, M, in, I, dout, O, dw, O, true);
  if (db) {  // kColumns columns at a time, row by row: contiguous reads, each column summed in row order
#pragma omp parallel for if ((long)M * O > 100000)
    for (int o0 = 0; o0 < O; o0 += kColumns) {
      const int w = std::min(kColumns, O - o0);
      T s[kColumns] = {};
      for (int i = 0; i < M; ++i)
        for (int c = 0; c < w; ++c) s[c] += dout[(size_t)i * O + o0 + c];
      for (int c = 0; c < w; ++c) db[o0 + c] += s[c];
    }
  }
  // END SOLUTION
}

// ---- §5.4 dropout ----------------------------------------------------------------------------------

// [hot loop] keep[i] = dropout_keeps(key, first + i) for i < n. The hash's 64-bit multiplies vectorise only
// with AVX-512DQ (6x faster than scalar here) or, less well, AVX2 (1.6x); the loop is compiled for each and
// the widest the CPU has runs (the build itself targets any x86-64).
__attribute__((always_inline)) inline void keep_mask_loop(uint64_t stream, uint64_t threshold, size_t first, size_t n,
                                                          uint8_t* __restrict keep) {
  for (size_t i = 0; i < n; ++i) keep[i] = (mix64(stream ^ (first + i)) >> 40) >= threshold;
}
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl"))) static void keep_mask_avx512(uint64_t s, uint64_t t, size_t first,
                                                                                         size_t n, uint8_t* keep) {
  keep_mask_loop(s, t, first, n, keep);
}
__attribute__((target("avx2"))) static void keep_mask_avx2(uint64_t s, uint64_t t, size_t first, size_t n, uint8_t* keep) {
  keep_mask_loop(s, t, first, n, keep);
}
#endif
static void keep_mask_plain(uint64_t s, uint64_t t, size_t first, size_t n, uint8_t* keep) { keep_mask_loop(s, t, first, n, keep); }

static void dropout_keep_mask(const DropoutKey& key, size_t first, size_t n, uint8_t* keep) {
  using Loop = void (*)(uint64_t, uint64_t, size_t, size_t, uint8_t*);
#if defined(__x86_64__) || defined(__i386__)
  static const Loop loop = __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
                                   __builtin_cpu_supports("avx512vl")
                               ? keep_mask_avx512
                           : __builtin_cpu_supports("avx2") ? keep_mask_avx2
                                                            : keep_mask_plain;
#else
  static const Loop loop = keep_mask_plain;
#endif
  if (key.p == 0) std::memset(keep, 1, n);  // every element kept: no hash needed
  else loop(key.stream, dropout_threshold(key.p), first, n, keep);
}

// f(i, kept) for every element i < n of a dropout site (kept: dropout_keeps(key, i)), the masks made a
// chunk at a time by the loop above; threaded over the chunks. The sites multiply by `kept ? scale : 0`
// rather than choose between x scale and 0: the same for every finite x (a dropped inf or NaN gives NaN),
// and a choice between two constants vectorises where a choice between a product and 0 was a branch
// taken at random (the feed-forward network's gradient pass spent 5.6% of a step on it).
template <typename F> void for_each_dropout(const DropoutKey& key, size_t n, F f) {
  constexpr size_t kChunk = 4096;
  const long chunks = (long)((n + kChunk - 1) / kChunk);
#pragma omp parallel for if (n > 100000) schedule(static)
  for (long c = 0; c < chunks; ++c) {
    uint8_t keep[kChunk];
    const size_t first = (size_t)c * kChunk, len = std::min(kChunk, n - first);
    dropout_keep_mask(key, first, len, keep);
    const F site = f;  // this thread's copy: its captures stay in registers, and the loop vectorises
    for (size_t i = 0; i < len; ++i) site(first + i, keep[i] != 0);
  }
}

template <typename T> void dropout_forward(T* out, const T* in, DropoutKey key, size_t n) {
  if (key.p == 0) {
    if (out != in) std::memcpy(out, in, n * sizeof(T));
    return;
  }
  const T scale = T(dropout_scale(key));
  for_each_dropout(key, n, [=](size_t i, bool kept) { out[i] = in[i] * (kept ? scale : T(0)); });
}

template <typename T> void dropout_backward(T* din, const T* dout, DropoutKey key, size_t n) {
  // forward was: out = in * keep / (1 - p); so now: din += dout * keep / (1 - p)
  const T scale = T(dropout_scale(key));
  for_each_dropout(key, n, [=](size_t i, bool kept) { din[i] += dout[i] * (kept ? scale : T(0)); });
}

// ---- §3.2 attention --------------------------------------------------------------------------------

template <typename T>
void attention_forward(T* ctx, T* p, const T* q, const T* k, const T* v, const uint8_t* key_valid,
                       bool causal, DropoutKey drop, int B, int Lq, int Lk, int D, int H) {
  const int Dk = D / H;
  const T scale = T(1) / std::sqrt(T(Dk));
  const T keep_scale = T(dropout_scale(drop));
  // a team only where the work pays for waking it (NOTES.md, "OpenMP on shared cores"): a decoding step's
  // attention is a query a row, tens of thousands of multiply-adds at the number corpus's d_model 64
#pragma omp parallel for collapse(2) schedule(static) if ((long)B * H * Lq * Lk * Dk > 100000)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < Lq; ++i) {
        // [§3.2.3] a key is visible unless it is padding or (causal) in the future; masked scores are
        // -inf before the softmax, i.e. exactly zero weight after it.
        auto visible = [&](int j) { return key_valid[(size_t)b * Lk + j] && (!causal || j <= i); };
        const size_t row = (((size_t)b * H + h) * Lq + i) * Lk;
        T* pr = p + row;
        const T* qi = q + ((size_t)b * Lq + i) * D + h * Dk;
        // [Eq. 1] scores = q_i . k_j / sqrt(Dk)
        T mx = -std::numeric_limits<T>::infinity();
        for (int j = 0; j < Lk; ++j) {
          if (!visible(j)) continue;
          const T* kj = k + ((size_t)b * Lk + j) * D + h * Dk;
          T s = 0;
#pragma omp simd reduction(+ : s)
          for (int d = 0; d < Dk; ++d) s += qi[d] * kj[d];
          pr[j] = s * scale;
          mx = std::max(mx, pr[j]);
        }
        // softmax over the visible keys; a row with none stays all zero (defined output, zero gradient)
        T sum = 0;
        for (int j = 0; j < Lk; ++j) {
          if (!visible(j)) {
            pr[j] = 0;
            continue;
          }
          pr[j] = std::exp(pr[j] - mx);
          sum += pr[j];
        }
        if (sum > 0)
          for (int j = 0; j < Lk; ++j) pr[j] /= sum;
        // ctx_i = sum_j dropout(p_ij) v_j
        T* ci = ctx + ((size_t)b * Lq + i) * D + h * Dk;
        for (int d = 0; d < Dk; ++d) ci[d] = 0;
        for (int j = 0; j < Lk; ++j) {
          T wgt = pr[j];
          if (drop.p > 0) wgt = dropout_keeps(drop, row + j) ? wgt * keep_scale : T(0);
          if (wgt == 0) continue;
          const T* vj = v + ((size_t)b * Lk + j) * D + h * Dk;
          for (int d = 0; d < Dk; ++d) ci[d] += wgt * vj[d];
        }
      }
}

template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dctx, const T* p, const T* q, const T* k, const T* v,
                        DropoutKey drop, int B, int Lq, int Lk, int D, int H) {
  // BEGIN SOLUTION task=attention_backward points=10
  const int Dk = D / H;
  const T scale = T(1) / std::sqrt(T(Dk));
  const T keep_scale = T(1.0 / (1.0 - drop.p));
  // Each (b, h) owns its columns of dq, dk, dv: no two threads write the same element.
#pragma omp parallel for collapse(2) schedule(static) if ((long)B * H * Lq * Lk * Dk > 100000)
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      static thread_local std::vector<T> scratch;  // this thread's: no allocation once it has grown
      if (scratch.size() < 2 * (size_t)Lk) scratch.resize(2 * (size_t)Lk);
      T *dpr = scratch.data(), *keep = dpr + Lk;  // (Lk) each: dL/dp'_ij, and keep_ij / (1 - p)
      for (int i = 0; i < Lq; ++i) {
        const size_t row = (((size_t)b * H + h) * Lq + i) * Lk;
        const T* pr = p + row;
        const T* dci = dctx + ((size_t)b * Lq + i) * D + h * Dk;
        for (int j = 0; j < Lk; ++j) keep[j] = drop.p > 0 ? (dropout_keeps(drop, row + j) ? keep_scale : T(0)) : T(1);
        // forward was: ctx_i = sum_j p'_ij v_j with p'_ij = p_ij keep_ij
        // so now: dv_j += p'_ij dctx_i and dp_ij = keep_ij (dctx_i . v_j)
        T rowdot = 0;
        for (int j = 0; j < Lk; ++j) {
          if (pr[j] == 0) { dpr[j] = 0; continue; }
          const T* vj = v + ((size_t)b * Lk + j) * D + h * Dk;
          T* dvj = dv + ((size_t)b * Lk + j) * D + h * Dk;
          T s = 0;
          for (int d = 0; d < Dk; ++d) {
            s += dci[d] * vj[d];
            dvj[d] += pr[j] * keep[j] * dci[d];
          }
          dpr[j] = s * keep[j];
          rowdot += dpr[j] * pr[j];
        }
        // forward was: p_i = softmax(s_i); so now: ds_ij = p_ij (dp_ij - sum_l p_il dp_il)
        // forward was: s_ij = scale q_i . k_j; so now: dq_i += scale ds_ij k_j, dk_j += scale ds_ij q_i
        const T* qi = q + ((size_t)b * Lq + i) * D + h * Dk;
        T* dqi = dq + ((size_t)b * Lq + i) * D + h * Dk;
        for (int j = 0; j < Lk; ++j) {
          if (pr[j] == 0) continue;
          const T ds = pr[j] * (dpr[j] - rowdot) * scale;
          const T* kj = k + ((size_t)b * Lk + j) * D + h * Dk;
          T* dkj = dk + ((size_t)b * Lk + j) * D + h * Dk;
          for (int d = 0; d < Dk; ++d) {
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
          }
        }
      }
    }
  // END SOLUTION
}

template <typename T>
void multihead_attention_forward(T* out, const AttentionActs<T>& a, const T* xq, const T* xkv,
                                 const AttentionWeights<T>& w, const uint8_t* key_valid, bool causal,
                                 DropoutKey drop, int B, int Lq, int Lk, int D, int H) {
  // [§3.2.2] Q = xq Wq, K = xkv Wk, V = xkv Wv (all heads at once: head i is a block of columns)
  linear_forward(a.q, xq, w.wq, (const T*)nullptr, B * Lq, D, D);
  linear_forward(a.k, xkv, w.wk, (const T*)nullptr, B * Lk, D, D);
  linear_forward(a.v, xkv, w.wv, (const T*)nullptr, B * Lk, D, D);
  attention_forward(a.ctx, a.p, a.q, a.k, a.v, key_valid, causal, drop, B, Lq, Lk, D, H);
  linear_forward(out, a.ctx, w.wo, (const T*)nullptr, B * Lq, D, D);  // Concat(heads) W^O
}

template <typename T>
void multihead_attention_backward(T* dxq, T* dxkv, const AttentionWeights<T>& dw, const T* dout,
                                  const AttentionActs<T>& a, const AttentionActs<T>& s, const T* xq,
                                  const T* xkv, const AttentionWeights<T>& w, DropoutKey drop, int B, int Lq,
                                  int Lk, int D, int H) {
  // BEGIN SOLUTION task=multihead_attention_backward points=6
  // s holds scratch for dq, dk, dv, dctx; the forward call list, in reverse
  std::fill(s.ctx, s.ctx + (size_t)B * Lq * D, T(0));
  std::fill(s.q, s.q + (size_t)B * Lq * D, T(0));
  std::fill(s.k, s.k + (size_t)B * Lk * D, T(0));
  std::fill(s.v, s.v + (size_t)B * Lk * D, T(0));
  linear_backward(s.ctx, dw.wo, (T*)nullptr, dout, a.ctx, w.wo, B * Lq, D, D);
  attention_backward(s.q, s.k, s.v, s.ctx, a.p, a.q, a.k, a.v, drop, B, Lq, Lk, D, H);
  linear_backward(dxkv, dw.wv, (T*)nullptr, s.v, xkv, w.wv, B * Lk, D, D);
  linear_backward(dxkv, dw.wk, (T*)nullptr, s.k, xkv, w.wk, B * Lk, D, D);
  linear_backward(dxq, dw.wq, (T*)nullptr, s.q, xq, w.wq, B * Lq, D, D);
  // END SOLUTION
}

// ---- §3.3 position-wise feed-forward network -------------------------------------------------------

template <typename T>
void ffn_forward(T* out, const FfnActs<T>& a, const T* in, const FfnWeights<T>& w, DropoutKey relu_drop,
                 int M, int D, int F) {
  // [Eq. 2] FFN(x) = max(0, x W1 + b1) W2 + b2
  linear_forward(a.hpre, in, w.w1, w.b1, M, D, F);
  const size_t n = (size_t)M * F;
#pragma omp parallel for if (n > 100000)
  for (size_t i = 0; i < n; ++i) a.h[i] = a.hpre[i] > 0 ? a.hpre[i] : T(0);
  dropout_forward(a.h, a.h, relu_drop, n);
  linear_forward(out, a.h, w.w2, w.b2, M, F, D);
}

template <typename T>
void ffn_backward(T* din, const FfnWeights<T>& dw, T* dh, const T* dout, const FfnActs<T>& a, const T* in,
                  const FfnWeights<T>& w, DropoutKey relu_drop, int M, int D, int F) {
  // BEGIN SOLUTION task=ffn_backward points=6
  const size_t n = (size_t)M * F;
  std::fill(dh, dh + n, T(0));
  linear_backward(dh, dw.w2, dw.b2, dout, a.h, w.w2, M, F, D);
  // forward was: h = dropout(max(0, hpre)); so now: dhpre = dropout'(dh) where hpre > 0. The ReLU gate
  // and the dropout scale are both per element, so one pass applies them in place.
  const T scale = relu_drop.p > 0 ? T(1.0 / (1.0 - relu_drop.p)) : T(1);
  const T* hpre = a.hpre;
  for_each_dropout(relu_drop, n, [=](size_t i, bool kept) {
    const bool pass = (hpre[i] > 0) & kept;  // & rather than &&: no branch, so the loop vectorises
    dh[i] *= pass ? scale : T(0);
  });
  linear_backward(din, dw.w1, dw.b1, dh, in, w.w1, M, D, F);
  // END SOLUTION
}

// ---- §3.1 LayerNorm and the residual connection ----------------------------------------------------

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* in, const T* g, const T* b, int M, int D,
                       double eps) {
#pragma omp parallel for if ((long)M * D > 100000)
  for (int i = 0; i < M; ++i) {
    const T* x = in + (size_t)i * D;
    T mu = 0, var = 0;
    for (int d = 0; d < D; ++d) mu += x[d];
    mu /= D;
    for (int d = 0; d < D; ++d) var += (x[d] - mu) * (x[d] - mu);
    var /= D;  // biased variance, as LayerNorm defines it
    const T rs = T(1) / std::sqrt(var + T(eps));
    T* y = out + (size_t)i * D;
    for (int d = 0; d < D; ++d) y[d] = (x[d] - mu) * rs * g[d] + b[d];
    mean[i] = mu;
    rstd[i] = rs;
  }
}

template <typename T>
void layernorm_backward(T* din, T* dg, T* db, const T* dout, const T* in, const T* g, const T* mean,
                        const T* rstd, int M, int D) {
  // BEGIN SOLUTION task=layernorm_backward points=8
  // forward was: xhat = (x - mean) * rstd, y = xhat * g + b
  // so now: dg += sum_rows dy xhat, db += sum_rows dy, and with dxhat = dy g:
  //         dx += rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))   (derivation in NOTES.md)
#pragma omp parallel for if ((long)M * D > 100000)
  for (int i = 0; i < M; ++i) {
    const T* x = in + (size_t)i * D;
    const T* dy = dout + (size_t)i * D;
    T mean_dxhat = 0, mean_dxhat_xhat = 0;
    for (int d = 0; d < D; ++d) {
      T xhat = (x[d] - mean[i]) * rstd[i];
      mean_dxhat += dy[d] * g[d];
      mean_dxhat_xhat += dy[d] * g[d] * xhat;
    }
    mean_dxhat /= D;
    mean_dxhat_xhat /= D;
    T* dx = din + (size_t)i * D;
    for (int d = 0; d < D; ++d) {
      T xhat = (x[d] - mean[i]) * rstd[i];
      dx[d] += rstd[i] * (dy[d] * g[d] - mean_dxhat - xhat * mean_dxhat_xhat);
    }
  }
#pragma omp parallel for if ((long)M * D > 100000)
  for (int d0 = 0; d0 < D; d0 += kColumns) {  // as the bias gradient in linear_backward
    const int w = std::min(kColumns, D - d0);
    T sg[kColumns] = {}, sb[kColumns] = {};
    for (int i = 0; i < M; ++i)
      for (int c = 0; c < w; ++c) {
        T dy = dout[(size_t)i * D + d0 + c];
        sg[c] += dy * (in[(size_t)i * D + d0 + c] - mean[i]) * rstd[i];
        sb[c] += dy;
      }
    for (int c = 0; c < w; ++c) dg[d0 + c] += sg[c], db[d0 + c] += sb[c];
  }
  // END SOLUTION
}

// [§3.1, §5.4] The residual connection around a sub-layer, dropout on the sub-layer's output y included:
// out = x + Dropout(y) (y is left as it is). The GPU does it in one pass.
template <typename T> void residual_dropout_forward(T* out, const T* x, const T* y, DropoutKey drop, size_t n) {
  const T scale = T(dropout_scale(drop));
  for_each_dropout(drop, n, [=](size_t i, bool kept) { out[i] = x[i] + y[i] * (kept ? scale : T(0)); });
}

// Post-LN's sub-layer end: sum = x + Dropout(y), out = LayerNorm(sum) [§3.1]. The GPU does it in one
// pass per row.
template <typename T>
void residual_dropout_layernorm_forward(T* out, T* sum, T* mean, T* rstd, const T* x, const T* y, DropoutKey drop, const T* g,
                                        const T* b, int M, int D, double eps) {
  residual_dropout_forward(sum, x, y, drop, (size_t)M * D);
  layernorm_forward(out, mean, rstd, sum, g, b, M, D, eps);
}

// Their backwards, each the GPU's one pass:
//   residual_dropout_backward:           dx += dout,  dy += Dropout'(dout)
//   residual_dropout_layernorm_backward: with dsum = LayerNorm's input gradient (in the scratch `dsum`),
//                                        dx += dsum,  dy += Dropout'(dsum),  dg and db += LayerNorm's
template <typename T> void residual_dropout_backward(T* dx, T* dy, const T* dout, DropoutKey drop, size_t n) {
  // BEGIN SOLUTION task=sublayer_connection_backward points=6
  const T scale = T(dropout_scale(drop));
  for_each_dropout(drop, n, [=](size_t i, bool kept) {
    dx[i] += dout[i];
    dy[i] += dout[i] * (kept ? scale : T(0));
  });
  // END SOLUTION
}

template <typename T>
void residual_dropout_layernorm_backward(T* dx, T* dy, T* dg, T* db, T* dsum, const T* dout, const T* sum, const T* g,
                                         const T* mean, const T* rstd, DropoutKey drop, int M, int D) {
  // BEGIN SOLUTION task=sublayer_connection_backward points=6
  const size_t n = (size_t)M * D;
  std::fill(dsum, dsum + n, T(0));
  layernorm_backward(dsum, dg, db, dout, sum, g, mean, rstd, M, D);
  residual_dropout_backward(dx, dy, dsum, drop, n);
  // END SOLUTION
}

// ---- §3.4 embeddings and the pre-softmax projection (one shared matrix) ----------------------------

// [§3.4] the embedding weights are multiplied by sqrt(d_model); [§3.5] then PE is added. The L positions'
// encodings are computed once for the B rows (the sines and powers were 2.4% of a training step when each
// row computed its own).
template <typename T>
void embedding_forward(T* out, const int* ids, const T* emb, int B, int L, int D, int first_pos) {
  static thread_local std::vector<T> table;  // the calling thread's; its team shares it through pe
  table.resize((size_t)L * D);
  T* pe = table.data();  // (L, D)
#pragma omp parallel for if ((long)L * D > 10000)
  for (int t = 0; t < L; ++t)
    for (int d = 0; d < D; ++d) pe[(size_t)t * D + d] = T(positional_encoding(first_pos + t, d, D));
  const T sqrt_d = std::sqrt(T(D));
#pragma omp parallel for collapse(2) if ((long)B * L * D > 100000)
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < L; ++t) {
      T* o = out + ((size_t)b * L + t) * D;
      const T* e = emb + (size_t)ids[(size_t)b * L + t] * D;
      for (int d = 0; d < D; ++d) o[d] = e[d] * sqrt_d + pe[(size_t)t * D + d];
    }
}

template <typename T>
void embedding_backward(T* demb, const T* dout, const int* ids, int B, int L, int D) {
  // BEGIN SOLUTION task=embedding_backward points=4
  // forward was: out[b,t] = emb[id] sqrt(D) + PE; so now: demb[id] += dout[b,t] sqrt(D). Serial: two
  // positions with the same token add into the same row.
  const T sqrt_d = std::sqrt(T(D));
  for (size_t r = 0; r < (size_t)B * L; ++r) {
    T* de = demb + (size_t)ids[r] * D;
    const T* g = dout + r * D;
    for (int d = 0; d < D; ++d) de[d] += g[d] * sqrt_d;
  }
  // END SOLUTION
}

template <typename T>
void output_projection_forward(T* logits, const T* y, const T* emb, int M, int D, int V) {
  gemm(false, true, M, V, D, y, D, emb, D, logits, V, false);  // logits = y @ emb^T
}

template <typename T>
void output_projection_backward(T* dy, T* demb, const T* dlogits, const T* y, const T* emb, int M, int D,
                                int V) {
  // BEGIN SOLUTION task=output_projection_backward points=4
  // forward was: logits = y @ emb^T; so now: dy += dlogits @ emb, demb += dlogits^T @ y
  gemm(false, false, M, D, V, dlogits, V, emb, D, dy, D, true);
  gemm(true, false, V, D, M, dlogits, V, y, D, demb, D, true);
  // END SOLUTION
}

// ---- §5.4 label-smoothed cross-entropy -------------------------------------------------------------

// The smoothed target distribution: q_target on the target class, q_other on every other class.
static void smoothing_weights(double eps, LabelSmoothing form, int V, double* q_target, double* q_other) {
  if (form == LabelSmoothing::uniform_all) {
    *q_other = eps / V;
    *q_target = 1 - eps + eps / V;
  } else {
    *q_other = eps / (V - 1);
    *q_target = 1 - eps;
  }
}

template <typename T>
double label_smoothed_xent_forward(T* lse, const T* logits, const int* targets, int M, int V, double eps,
                                   LabelSmoothing form, int pad) {
  double qt, qo;
  smoothing_weights(eps, form, V, &qt, &qo);
  double total = 0;
  long n = 0;
#pragma omp parallel for reduction(+ : total, n) if ((long)M * V > 100000)
  for (int i = 0; i < M; ++i) {
    const T* z = logits + (size_t)i * V;
    T mx = z[0], s = 0, zsum = 0;
#pragma omp simd reduction(max : mx)
    for (int v = 1; v < V; ++v) mx = std::max(mx, z[v]);
    // the exps to this thread's scratch row first, then summed (as log_softmax(): a sum carried across
    // the calls waited on memory)
    static thread_local std::vector<T> e;
    if (e.size() < (size_t)V) e.resize(V);
    for (int v = 0; v < V; ++v) e[v] = std::exp(z[v] - mx);
#pragma omp simd reduction(+ : s, zsum)
    for (int v = 0; v < V; ++v) s += e[v], zsum += z[v];
    lse[i] = mx + std::log(s);
    if (targets[i] == pad) continue;
    // -sum_v q_v log softmax(z)_v = lse - sum_v q_v z_v   (sum_v q_v = 1)
    total += (double)lse[i] - (qo * (double)zsum + (qt - qo) * (double)z[targets[i]]);
    n += 1;
  }
  return n ? total / n : 0.0;
}

template <typename T>
void label_smoothed_xent_backward(T* dlogits, const T* logits, const T* lse, const int* targets, int M, int V,
                                  double eps, LabelSmoothing form, int pad) {
  // BEGIN SOLUTION task=label_smoothed_xent_backward points=6
  double qt, qo;
  smoothing_weights(eps, form, V, &qt, &qo);
  long n = 0;
  for (int i = 0; i < M; ++i) n += targets[i] != pad;
  if (n == 0) return;
  const T inv_n = T(1.0 / n);
  // forward was: loss = mean_i (lse_i - sum_v q_v z_iv); so now: dz_iv += (softmax(z_i)_v - q_v) / n
#pragma omp parallel for if ((long)M * V > 100000)
  for (int i = 0; i < M; ++i) {
    if (targets[i] == pad) continue;
    const T* z = logits + (size_t)i * V;
    T* dz = dlogits + (size_t)i * V;
    for (int v = 0; v < V; ++v) dz[v] += (std::exp(z[v] - lse[i]) - T(qo)) * inv_n;
    dz[targets[i]] -= T(qt - qo) * inv_n;
  }
  // END SOLUTION
}

// ---- §5.3 optimizer --------------------------------------------------------------------------------

template <typename T>
void adam_update(T* params, const T* grads, T* m, T* v, size_t n, double lr, double beta1, double beta2,
                 double eps, long t) {
  // BEGIN SOLUTION task=adam_update points=5
  const double c1 = 1 - std::pow(beta1, (double)t), c2 = 1 - std::pow(beta2, (double)t);
  // [DEVIATION] A moment below the smallest normal T is stored as zero. A parameter that gets no gradient
  // (in the feed-forward networks, the weights of a hidden unit whose ReLU never passes) has its moments
  // decay by beta1 and beta2 each step until they are subnormal, and x86 computes with subnormals many
  // times slower. What is dropped moves the parameter by less than lr * 1.2e-38 / eps (float).
#pragma omp parallel for if (n > 100000)
  for (size_t i = 0; i < n; ++i) {
    m[i] = normal_or_zero<T>(beta1 * m[i] + (1 - beta1) * grads[i]);
    v[i] = normal_or_zero<T>(beta2 * v[i] + (1 - beta2) * (double)grads[i] * grads[i]);
    const double mhat = m[i] / c1, vhat = v[i] / c2;
    params[i] -= T(lr * mhat / (std::sqrt(vhat) + eps));
  }
  // END SOLUTION
}

template <typename T> double grad_norm(const T* grads, size_t n) {
  // blocks of a fixed size, added in a fixed order: the same bits whatever the number of threads (a
  // reduction clause adds the threads' sums in the order they finish), so ranks clip alike
  const size_t block = 65536, blocks = (n + block - 1) / block;
  std::vector<double> part(blocks);
#pragma omp parallel for if (n > 100000)
  for (size_t b = 0; b < blocks; ++b) {
    double s = 0;
    for (size_t i = b * block; i < std::min(n, (b + 1) * block); ++i) s += (double)grads[i] * grads[i];
    part[b] = s;
  }
  return std::sqrt(std::accumulate(part.begin(), part.end(), 0.0));
}

template <typename T> void scale_grads(T* grads, size_t n, double factor) {
#pragma omp parallel for if (n > 100000)
  for (size_t i = 0; i < n; ++i) grads[i] = T(grads[i] * factor);
}

template <typename T> void clip_grad_norm(T* grads, size_t n, double max_norm) {
  const double norm = grad_norm(grads, n);
  if (norm > max_norm) scale_grads(grads, n, max_norm / norm);
}

// ---- §6 decoding's own operations --------------------------------------------------------------------

template <typename T> void log_softmax(T* out, const T* logits, int M, int V) {
#pragma omp parallel for schedule(static) if ((long)M * V > 100000)
  for (int r = 0; r < M; ++r) {
    const T* z = logits + (size_t)r * V;
    T* o = out + (size_t)r * V;
    T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
    for (int v = 0; v < V; ++v) mx = std::max(mx, z[v]);
    // exp in T's precision (a float exp is several times faster than a double one: it was 22% of beam
    // search's time; in float, vectorised by fastexp.h), written to this thread's scratch (out may be
    // logits) and then summed in double (a sum carried across the calls waited on memory each time)
    static thread_local std::vector<T> e;
    if (e.size() < (size_t)V) e.resize(V);
    if constexpr (std::is_same_v<T, float>) exp_shifted(e.data(), z, mx, V);
    else
      for (int v = 0; v < V; ++v) e[v] = std::exp(z[v] - mx);
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; ++v) sum += e[v];
    const double lse = mx + std::log(sum);
#pragma omp simd
    for (int v = 0; v < V; ++v) o[v] = T((double)z[v] - lse);
  }
}

template <typename T>
void copy_rows(T* dst, size_t dst_stride, const T* src, size_t src_stride, const int* index, int rows, size_t width) {
#pragma omp parallel for if ((long)rows * width > 100000)
  for (int r = 0; r < rows; ++r) std::copy_n(src + (size_t)(index ? index[r] : r) * src_stride, width, dst + (size_t)r * dst_stride);
}

}  // namespace cpu

// ---- the model ---------------------------------------------------------------------------------------

template <typename T>
Transformer<T>::Transformer(const Config& c, uint64_t seed_) : cfg(c), seed(seed_) {
  cfg.validate();
  size_t n = parameter_layout<T>(cfg, nullptr, nullptr, &table);
  params.assign(n, T(0));
  grads.assign(n, T(0));
  adam_m.assign(n, T(0));
  adam_v.assign(n, T(0));
  parameter_layout<T>(cfg, params.data(), &W, nullptr);
  parameter_layout<T>(cfg, grads.data(), &G, nullptr);
  transformer_init(*this, seed);
}

// A stream of uniform numbers in [0, 1) from one seed.
struct Rng {
  uint64_t state;
  double uniform() { return (double)(mix64(state++) >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {  // Box-Muller
    double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
  }
};

template <typename T> void transformer_init(Transformer<T>& m, uint64_t seed) {
  Rng rng{mix64(seed ^ 0x5EEDull)};
  for (const TensorInfo& t : m.table) {
    T* p = m.params.data() + t.offset;
    for (size_t i = 0; i < t.size; ++i) {
      switch (t.init) {
        case Init::xavier_uniform: {  // Glorot & Bengio: U(-a, a), a = sqrt(6 / (fan_in + fan_out)), as fairseq
          double a = std::sqrt(6.0 / (t.shape[0] + t.shape[1]));
          p[i] = T((2 * rng.uniform() - 1) * a);
          break;
        }
        case Init::embedding_normal:  // N(0, D^-0.5), as tensor2tensor
          p[i] = T(rng.normal() * std::pow((double)m.cfg.D, -0.5));
          break;
        case Init::ones: p[i] = T(1); break;
        case Init::zeros: p[i] = T(0); break;
      }
    }
  }
  std::fill(m.adam_m.begin(), m.adam_m.end(), T(0));
  std::fill(m.adam_v.begin(), m.adam_v.end(), T(0));
  m.step = 0;
}

// Carves the activation arena for one batch shape: called once to count, once to point. half_width is the
// seam for a device whose pass keeps some buffers only at half the width (16 bits: gpu/model.cuh,
// GpuModel::keep_bf16_twins says which and why): those take half the bytes, and the FFN's pre-activations and
// their gradient's scratch, which such a pass never writes, are left out (null). The CPU carves every buffer whole.
template <typename T>
static size_t carve_activations(Activations<T>& a, const Config& c, int B, int S, int Tl, T* base, bool half_width = false) {
  size_t used = 0;
  auto take = [&](size_t n) -> T* {  // each buffer 64 elements aligned (256 bytes in fp32: vector loads, a half)
    T* p = base ? base + used : nullptr;
    used += (n + 63) / 64 * 64;
    return p;
  };
  auto take_half = [&](size_t n) { return take(half_width ? (n + 1) / 2 : n); };  // n elements, at half width
  const size_t D = c.D, H = c.H, Ms = (size_t)B * S, Mt = (size_t)B * Tl, Mmax = std::max(Ms, Mt);
  auto sublayer = [&](size_t M) {
    SublayerActs<T> s{};
    s.norm = c.pre_ln ? take(M * D) : nullptr;
    s.y = take(M * D);
    s.sum = c.pre_ln ? nullptr : take(M * D);
    s.out = take(M * D);
    s.mean = take(M);
    s.rstd = take(M);
    return s;
  };
  auto attention = [&](size_t Lq, size_t Lk) {
    return AttentionActs<T>{take_half(B * Lq * D), take_half(B * Lk * D), take_half(B * Lk * D), take(B * H * Lq * Lk),
                            take_half(B * Lq * D)};
  };
  auto ffn = [&](size_t M) { return FfnActs<T>{half_width ? nullptr : take(M * c.F), take_half(M * c.F)}; };
  auto stack = [&](size_t M) {
    StackActs<T> s{};
    s.x0 = take(M * D);
    if (c.pre_ln) s.final_ln = sublayer(M);
    return s;
  };
  a.enc = stack(Ms);
  a.enc_layers.assign(c.N, {});
  for (auto& l : a.enc_layers) {
    l.self_sub = sublayer(Ms);
    l.self = attention(S, S);
    l.ffn_sub = sublayer(Ms);
    l.ffn = ffn(Ms);
  }
  a.dec = stack(Mt);
  a.dec_layers.assign(c.N, {});
  for (auto& l : a.dec_layers) {
    l.self_sub = sublayer(Mt);
    l.self = attention(Tl, Tl);
    l.cross_sub = sublayer(Mt);
    l.cross = attention(Tl, S);
    l.ffn_sub = sublayer(Mt);
    l.ffn = ffn(Mt);
  }
  a.enc.out = c.pre_ln ? a.enc.final_ln.out : a.enc_layers.back().ffn_sub.out;
  a.dec.out = c.pre_ln ? a.dec.final_ln.out : a.dec_layers.back().ffn_sub.out;
  a.logits = take_half(Mt * c.V);
  a.lse = take(Mt);
  a.d_stream[0] = take(Mmax * D);
  a.d_stream[1] = take(Mmax * D);
  a.d_enc_out = take(Ms * D);
  a.d_sum = take(Mmax * D);
  a.d_sub = take(Mmax * D);
  a.d_norm = take(Mmax * D);
  a.d_attn = AttentionActs<T>{take(Mmax * D), take(Mmax * D), take(Mmax * D), nullptr, take(Mmax * D)};
  a.dh = half_width ? nullptr : take(Mmax * c.F);
  a.dlogits = take_half(Mt * c.V);
  return used;
}

// Checks a batch against the model: shape, lengths, token ids. A message is made only for a failure (one
// made for every token id was most of a training step's allocations).
static void validate_batch(const Config& c, const Batch& batch) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("invalid batch: " + what); };
  if (batch.B < 1 || batch.S < 1 || batch.T < 1) fail("empty batch");
  if (batch.S > c.max_len || batch.T > c.max_len)
    fail("length " + std::to_string(std::max(batch.S, batch.T)) + " exceeds max_len " + std::to_string(c.max_len));
  if (batch.src.size() != (size_t)batch.B * batch.S) fail("src is not B x S");
  if (batch.tgt_in.size() != (size_t)batch.B * batch.T || batch.tgt_out.size() != batch.tgt_in.size())
    fail("tgt_in/tgt_out are not B x T");
  for (const auto* ids : {&batch.src, &batch.tgt_in, &batch.tgt_out})
    for (int id : *ids)
      if (id < 0 || id >= c.V) fail("token id " + std::to_string(id) + " outside the vocabulary");
}

// Carves the arena for a batch's shape (growing it when needed) and marks its real tokens; `base`
// allocates n elements and returns where they start (a host vector, or device memory). half_width: as
// carve_activations.
template <typename T, typename Allocate>
static void prepare_activations(Activations<T>& a, const Config& c, const Batch& batch, Allocate allocate, bool half_width = false) {
  if (a.batch != batch.B || a.src_len != batch.S || a.tgt_len != batch.T || a.half_width != half_width) {
    const size_t need = carve_activations<T>(a, c, batch.B, batch.S, batch.T, nullptr, half_width);
    carve_activations<T>(a, c, batch.B, batch.S, batch.T, allocate(need), half_width);
    a.batch = batch.B, a.src_len = batch.S, a.tgt_len = batch.T, a.half_width = half_width;
  }
  a.src_valid.resize(batch.src.size());
  a.tgt_valid.resize(batch.tgt_in.size());
  for (size_t i = 0; i < batch.src.size(); ++i) a.src_valid[i] = batch.src[i] != kPadId;
  for (size_t i = 0; i < batch.tgt_in.size(); ++i) a.tgt_valid[i] = batch.tgt_in[i] != kPadId;
}

// The operations a pass runs, on one device. The model code below is written once, against Ops: CpuOps
// forwards to namespace cpu; GpuOps (gpu/model.cuh) to namespace gpu, with the same names.
#define TRANSFORMER_OPS(X)                                                                                       \
  X(embedding_forward) X(embedding_backward) X(dropout_forward) X(dropout_backward) X(layernorm_forward)        \
  X(layernorm_backward) X(residual_dropout_forward) X(residual_dropout_layernorm_forward)                       \
  X(residual_dropout_backward) X(residual_dropout_layernorm_backward) X(multihead_attention_forward)            \
  X(multihead_attention_backward) X(ffn_forward) X(ffn_backward) X(output_projection_forward)                   \
  X(output_projection_backward) X(label_smoothed_xent_forward) X(label_smoothed_xent_backward)                  \
  X(scale_grads) X(linear_forward) X(attention_forward) X(log_softmax) X(copy_rows)
#define CPU_OP(name) \
  template <typename... A> static auto name(A&&... args) { return cpu::name(std::forward<A>(args)...); }
struct CpuOps {
  TRANSFORMER_OPS(CPU_OP)
  // n elements of this device's memory: Buffer<T>(n), left uninitialised (decoding writes every element
  // before reading it, and the pages of a K/V cache's capacity that it never reaches are never touched)
  template <typename T> class Buffer {
   public:
    Buffer() = default;
    explicit Buffer(size_t n) : p_(new T[n]) {}
    T* data() { return p_.get(); }
    const T* data() const { return p_.get(); }

   private:
    std::unique_ptr<T[]> p_;
  };
  template <typename T> static void zero(T* p, size_t n) { std::fill(p, p + n, T(0)); }
  template <typename T> static void copy(T* dst, const T* src, size_t n) { std::copy(src, src + n, dst); }
  // between the host and this device (decoding's tokens and masks in, log-probabilities out)
  template <typename T> static void upload(T* dst, const T* src, size_t n) { std::copy_n(src, n, dst); }
  template <typename T> static void download(T* dst, const T* src, size_t n) { std::copy_n(src, n, dst); }
};

// What one forward and backward pass reads and writes, all on one device.
template <typename T> struct Pass {
  const Config& c;
  const Weights<T>& W;                   // parameters
  const Weights<T>& G;                   // their gradients (backward adds into them)
  Activations<T>& a;                     // what forward saves, and backward's scratch
  const int *src, *tgt_in, *tgt_out;     // (B,S) (B,T) (B,T)
  const uint8_t *src_valid, *tgt_valid;  // (B,S) (B,T): 1 for real tokens
  int B, S, Tl;  // batch, source length, target length
  uint64_t seed;
  long step;  // dropout masks are keyed by (seed, step, micro)
  int micro;  // which of the step's batches this is (gradient accumulation, data parallelism)
  bool train;
  const DropoutStep* dropout_step = nullptr;  // on the GPU: (step, micro)'s part of the keys in device memory
};

// The pass of a model on the CPU over a batch (after prepare_activations).
template <typename T> static Pass<T> host_pass(Transformer<T>& m, const Batch& b, bool train) {
  return Pass<T>{m.cfg, m.W, m.G, m.acts, b.src.data(), b.tgt_in.data(), b.tgt_out.data(), m.acts.src_valid.data(),
                 m.acts.tgt_valid.data(), b.B, b.S, b.T, m.seed, m.step, m.micro, train};
}

// [§3.1, §5.4] The residual connection around each sub-layer, with dropout on the sub-layer's output:
//   post-LN (the paper): out = LayerNorm(x + Dropout(Sublayer(x)))
//   pre-LN (option):     out = x + Dropout(Sublayer(LayerNorm(x)))
// `sublayer(in, y)` writes the sub-layer's output y for input in.
template <typename Ops, typename T, typename Sublayer>
static void sublayer_connection_forward(const SublayerActs<T>& a, const T* x, const NormWeights<T>& ln,
                                        const Config& c, DropoutKey drop, int M, Sublayer sublayer) {
  const size_t n = (size_t)M * c.D;
  if (c.pre_ln) {
    Ops::layernorm_forward(a.norm, a.mean, a.rstd, x, ln.g, ln.b, M, c.D, c.ln_eps);
    sublayer(a.norm, a.y);
    Ops::residual_dropout_forward(a.out, x, a.y, drop, n);
  } else {
    sublayer(x, a.y);
    Ops::residual_dropout_layernorm_forward(a.out, a.sum, a.mean, a.rstd, x, a.y, drop, ln.g, ln.b, M, c.D, c.ln_eps);
  }
}

// The same, backward: dx += d out / d x . dout. `sublayer_backward(in, dy, din)` adds the sub-layer's
// input gradient into din.
template <typename Ops, typename T, typename SublayerBackward>
static void sublayer_connection_backward(T* dx, const NormWeights<T>& dln, const T* dout, const SublayerActs<T>& a,
                                         const T* x, const NormWeights<T>& ln, const Activations<T>& s,
                                         const Config& c, DropoutKey drop, int M, SublayerBackward sublayer_backward) {
  // BEGIN SOLUTION task=sublayer_connection_backward points=6
  const size_t n = (size_t)M * c.D;
  Ops::zero(s.d_sub, n);
  if (c.pre_ln) {
    Ops::residual_dropout_backward(dx, s.d_sub, dout, drop, n);
    Ops::zero(s.d_norm, n);
    sublayer_backward(a.norm, s.d_sub, s.d_norm);
    Ops::layernorm_backward(dx, dln.g, dln.b, s.d_norm, x, ln.g, a.mean, a.rstd, M, c.D);
  } else {
    Ops::residual_dropout_layernorm_backward(dx, s.d_sub, dln.g, dln.b, s.d_sum, dout, a.sum, ln.g, a.mean, a.rstd, drop, M,
                                             c.D);
    sublayer_backward(x, s.d_sub, dx);
  }
  // END SOLUTION
}

template <typename T> static DropoutKey drop_at(const Pass<T>& p, int stack, int layer, DropoutPlace place) {
  const Config& c = p.c;
  double prob = place == kSelfWeights || place == kCrossWeights ? c.p_attn : place == kFfnRelu ? c.p_relu : c.p_drop;
  DropoutKey key = dropout_key(p.seed, p.step, dropout_site(stack, layer, place, p.micro), p.train ? prob : 0.0);
  if (p.dropout_step) key.step = p.dropout_step, key.site = dropout_site(stack, layer, place, 0);  // micro read with the step
  return key;
}

// [§3.1] Encoder: N layers of (self-attention, FFN) over the embedded source.
template <typename Ops, typename T> static void encoder_forward(const Pass<T>& p) {
  const Config& c = p.c;
  Activations<T>& a = p.a;
  const int B = p.B, S = p.S, M = B * S;
  Ops::embedding_forward(a.enc.x0, p.src, p.W.emb, B, S, c.D);
  Ops::dropout_forward(a.enc.x0, a.enc.x0, drop_at(p, 0, 0, kEmbedding), (size_t)M * c.D);
  const T* x = a.enc.x0;
  for (int l = 0; l < c.N; ++l) {
    const EncoderLayerWeights<T>& w = p.W.enc[l];
    const EncoderLayerActs<T>& L = a.enc_layers[l];
    const DropoutKey attn_drop = drop_at(p, 0, l, kSelfWeights);
    sublayer_connection_forward<Ops>(L.self_sub, x, w.ln1, c, drop_at(p, 0, l, kSelfOut), M, [&](const T* in, T* y) {
      Ops::multihead_attention_forward(y, L.self, in, in, w.self, p.src_valid, false, attn_drop, B, S, S, c.D, c.H);
    });
    const DropoutKey relu_drop = drop_at(p, 0, l, kFfnRelu);
    sublayer_connection_forward<Ops>(L.ffn_sub, L.self_sub.out, w.ln2, c, drop_at(p, 0, l, kFfnOut), M,
                                     [&](const T* in, T* y) { Ops::ffn_forward(y, L.ffn, in, w.ffn, relu_drop, M, c.D, c.F); });
    x = L.ffn_sub.out;
  }
  if (c.pre_ln)
    Ops::layernorm_forward(a.enc.final_ln.out, a.enc.final_ln.mean, a.enc.final_ln.rstd, x, p.W.enc_final.g,
                           p.W.enc_final.b, M, c.D, c.ln_eps);
}

// [§3.1] Decoder: N layers of (masked self-attention, encoder-decoder attention, FFN).
template <typename Ops, typename T> static void decoder_forward(const Pass<T>& p) {
  const Config& c = p.c;
  Activations<T>& a = p.a;
  const int B = p.B, S = p.S, Tl = p.Tl, M = B * Tl;
  Ops::embedding_forward(a.dec.x0, p.tgt_in, p.W.emb, B, Tl, c.D);
  Ops::dropout_forward(a.dec.x0, a.dec.x0, drop_at(p, 1, 0, kEmbedding), (size_t)M * c.D);
  const T* x = a.dec.x0;
  for (int l = 0; l < c.N; ++l) {
    const DecoderLayerWeights<T>& w = p.W.dec[l];
    const DecoderLayerActs<T>& L = a.dec_layers[l];
    const DropoutKey self_drop = drop_at(p, 1, l, kSelfWeights);
    sublayer_connection_forward<Ops>(L.self_sub, x, w.ln1, c, drop_at(p, 1, l, kSelfOut), M, [&](const T* in, T* y) {
      Ops::multihead_attention_forward(y, L.self, in, in, w.self, p.tgt_valid, true, self_drop, B, Tl, Tl, c.D, c.H);
    });
    const DropoutKey cross_drop = drop_at(p, 1, l, kCrossWeights);
    sublayer_connection_forward<Ops>(L.cross_sub, L.self_sub.out, w.ln2, c, drop_at(p, 1, l, kCrossOut), M,
                                     [&](const T* in, T* y) {
                                       Ops::multihead_attention_forward(y, L.cross, in, a.enc.out, w.cross, p.src_valid,
                                                                        false, cross_drop, B, Tl, S, c.D, c.H);
                                     });
    const DropoutKey relu_drop = drop_at(p, 1, l, kFfnRelu);
    sublayer_connection_forward<Ops>(L.ffn_sub, L.cross_sub.out, w.ln3, c, drop_at(p, 1, l, kFfnOut), M,
                                     [&](const T* in, T* y) { Ops::ffn_forward(y, L.ffn, in, w.ffn, relu_drop, M, c.D, c.F); });
    x = L.ffn_sub.out;
  }
  if (c.pre_ln)
    Ops::layernorm_forward(a.dec.final_ln.out, a.dec.final_ln.mean, a.dec.final_ln.rstd, x, p.W.dec_final.g,
                           p.W.dec_final.b, M, c.D, c.ln_eps);
}

// The whole model, forward: encoder, decoder, [§3.4] the shared projection, [§5.4] the smoothed loss.
template <typename Ops, typename T> static double forward_pass(const Pass<T>& p) {
  encoder_forward<Ops>(p);
  decoder_forward<Ops>(p);
  const Config& c = p.c;
  const int M = p.B * p.Tl;
  Ops::output_projection_forward(p.a.logits, p.a.dec.out, p.W.emb, M, c.D, c.V);
  return Ops::label_smoothed_xent_forward(p.a.lse, p.a.logits, p.tgt_out, M, c.V, c.eps_ls, c.ls_form, kPadId);
}

// Backward through a stack's optional final LayerNorm and its layers: on entry d_stream[*cur] holds the
// gradient of the stack's output; on return it holds the gradient of x0 (after embedding dropout).
template <typename Ops, typename T, typename LayerBackward>
static void stack_backward(const Pass<T>& p, const StackActs<T>& st, const NormWeights<T>& w_final,
                           const NormWeights<T>& g_final, const T* last_layer_out, int M, int* cur,
                           LayerBackward layer_backward) {
  const Config& c = p.c;
  Activations<T>& a = p.a;
  if (c.pre_ln) {
    T* dnext = a.d_stream[1 - *cur];
    Ops::zero(dnext, (size_t)M * c.D);
    Ops::layernorm_backward(dnext, g_final.g, g_final.b, a.d_stream[*cur], last_layer_out, w_final.g,
                            st.final_ln.mean, st.final_ln.rstd, M, c.D);
    *cur = 1 - *cur;
  }
  for (int l = c.N - 1; l >= 0; --l) layer_backward(l);
}

// The whole model, backward: the forward call list in reverse.
template <typename Ops, typename T> static void backward_pass(const Pass<T>& p) {
  const Config& c = p.c;
  Activations<T>& a = p.a;
  const int B = p.B, S = p.S, Tl = p.Tl, Ms = B * S, Mt = B * Tl;
  const size_t nt = (size_t)Mt * c.D, ns = (size_t)Ms * c.D;

  // loss and output projection
  Ops::zero(a.dlogits, (size_t)Mt * c.V);
  Ops::label_smoothed_xent_backward(a.dlogits, a.logits, a.lse, p.tgt_out, Mt, c.V, c.eps_ls, c.ls_form, kPadId);
  int cur = 0;
  Ops::zero(a.d_stream[0], nt);
  Ops::output_projection_backward(a.d_stream[0], p.G.emb, a.dlogits, a.dec.out, p.W.emb, Mt, c.D, c.V);

  // decoder, layers in reverse; each sub-layer connection maps d_stream[cur] to d_stream[1 - cur]
  Ops::zero(a.d_enc_out, ns);
  auto step_back = [&](size_t n, auto&& connection) {
    T* dx = a.d_stream[1 - cur];
    Ops::zero(dx, n);
    connection(dx, a.d_stream[cur]);
    cur = 1 - cur;
  };
  stack_backward<Ops>(p, a.dec, p.W.dec_final, p.G.dec_final, a.dec_layers.back().ffn_sub.out, Mt, &cur, [&](int l) {
    const DecoderLayerWeights<T>& w = p.W.dec[l];
    const DecoderLayerWeights<T>& g = p.G.dec[l];
    const DecoderLayerActs<T>& L = a.dec_layers[l];
    const T* x = l == 0 ? a.dec.x0 : a.dec_layers[l - 1].ffn_sub.out;
    const DropoutKey relu_drop = drop_at(p, 1, l, kFfnRelu);
    step_back(nt, [&](T* dx, const T* dout) {
      sublayer_connection_backward<Ops>(dx, g.ln3, dout, L.ffn_sub, L.cross_sub.out, w.ln3, a, c, drop_at(p, 1, l, kFfnOut), Mt,
                                        [&](const T* in, const T* dy, T* din) {
                                          Ops::ffn_backward(din, g.ffn, a.dh, dy, L.ffn, in, w.ffn, relu_drop, Mt, c.D, c.F);
                                        });
    });
    const DropoutKey cross_drop = drop_at(p, 1, l, kCrossWeights);
    step_back(nt, [&](T* dx, const T* dout) {
      sublayer_connection_backward<Ops>(dx, g.ln2, dout, L.cross_sub, L.self_sub.out, w.ln2, a, c, drop_at(p, 1, l, kCrossOut), Mt,
                                        [&](const T* in, const T* dy, T* din) {
                                          Ops::multihead_attention_backward(din, a.d_enc_out, g.cross, dy, L.cross, a.d_attn, in,
                                                                            a.enc.out, w.cross, cross_drop, B, Tl, S, c.D, c.H);
                                        });
    });
    const DropoutKey self_drop = drop_at(p, 1, l, kSelfWeights);
    step_back(nt, [&](T* dx, const T* dout) {
      sublayer_connection_backward<Ops>(dx, g.ln1, dout, L.self_sub, x, w.ln1, a, c, drop_at(p, 1, l, kSelfOut), Mt,
                                        [&](const T* in, const T* dy, T* din) {
                                          Ops::multihead_attention_backward(din, din, g.self, dy, L.self, a.d_attn, in, in, w.self,
                                                                            self_drop, B, Tl, Tl, c.D, c.H);
                                        });
    });
  });
  // target embedding: forward was x0 = dropout(emb[tgt_in] sqrt(D) + PE)
  Ops::zero(a.d_sub, nt);
  Ops::dropout_backward(a.d_sub, a.d_stream[cur], drop_at(p, 1, 0, kEmbedding), nt);
  Ops::embedding_backward(p.G.emb, a.d_sub, p.tgt_in, B, Tl, c.D);

  // encoder: its output's gradient is the sum over the decoder's cross-attentions
  cur = 0;
  Ops::copy(a.d_stream[0], a.d_enc_out, ns);
  stack_backward<Ops>(p, a.enc, p.W.enc_final, p.G.enc_final, a.enc_layers.back().ffn_sub.out, Ms, &cur, [&](int l) {
    const EncoderLayerWeights<T>& w = p.W.enc[l];
    const EncoderLayerWeights<T>& g = p.G.enc[l];
    const EncoderLayerActs<T>& L = a.enc_layers[l];
    const T* x = l == 0 ? a.enc.x0 : a.enc_layers[l - 1].ffn_sub.out;
    const DropoutKey relu_drop = drop_at(p, 0, l, kFfnRelu);
    step_back(ns, [&](T* dx, const T* dout) {
      sublayer_connection_backward<Ops>(dx, g.ln2, dout, L.ffn_sub, L.self_sub.out, w.ln2, a, c, drop_at(p, 0, l, kFfnOut), Ms,
                                        [&](const T* in, const T* dy, T* din) {
                                          Ops::ffn_backward(din, g.ffn, a.dh, dy, L.ffn, in, w.ffn, relu_drop, Ms, c.D, c.F);
                                        });
    });
    const DropoutKey attn_drop = drop_at(p, 0, l, kSelfWeights);
    step_back(ns, [&](T* dx, const T* dout) {
      sublayer_connection_backward<Ops>(dx, g.ln1, dout, L.self_sub, x, w.ln1, a, c, drop_at(p, 0, l, kSelfOut), Ms,
                                        [&](const T* in, const T* dy, T* din) {
                                          Ops::multihead_attention_backward(din, din, g.self, dy, L.self, a.d_attn, in, in, w.self,
                                                                            attn_drop, B, S, S, c.D, c.H);
                                        });
    });
  });
  // source embedding
  Ops::zero(a.d_sub, ns);
  Ops::dropout_backward(a.d_sub, a.d_stream[cur], drop_at(p, 0, 0, kEmbedding), ns);
  Ops::embedding_backward(p.G.emb, a.d_sub, p.src, B, S, c.D);
}

// [§5.3] Clipping (when configured, [DEVIATION]) and one Adam step over the flat buffers on the CPU; a
// model on the GPU does the same in GpuModel::update.
template <typename T> static void optimizer_step(Transformer<T>& m, double lr) {
  const Config& c = m.cfg;
  if (c.clip_norm > 0) cpu::clip_grad_norm(m.grads.data(), m.grads.size(), c.clip_norm);  // [DEVIATION] the paper has none
  cpu::adam_update(m.params.data(), m.grads.data(), m.adam_m.data(), m.adam_v.data(), m.params.size(), lr, c.beta1, c.beta2,
                   c.adam_eps, m.step);
}

// The CPU's arena is a host vector.
template <typename T> static void prepare_host(Transformer<T>& m, const Batch& batch) {
  validate_batch(m.cfg, batch);
  prepare_activations(m.acts, m.cfg, batch, [&](size_t n) {
    if (m.acts.arena.size() < n) m.acts.arena.assign(n, T(0));
    return m.acts.arena.data();
  });
}

template <typename T> double transformer_forward(Transformer<T>& m, const Batch& batch, bool train) {
  if (m.device) return m.device->forward(batch, train);
  prepare_host(m, batch);
  return forward_pass<CpuOps>(host_pass(m, batch, train));
}

template <typename T> void transformer_backward(Transformer<T>& m, const Batch& batch, bool train) {
  if (m.device) return m.device->backward(batch, train);
  backward_pass<CpuOps>(host_pass(m, batch, train));
}

template <typename T> void zero_grad(Transformer<T>& m) {
  if (m.device) return m.device->zero_grad();
  std::fill(m.grads.begin(), m.grads.end(), T(0));
}

template <typename T> void scale_gradients(Transformer<T>& m, double factor) {
  if (m.device) return m.device->scale_grads(factor);
  CpuOps::scale_grads(m.grads.data(), m.grads.size(), factor);
}

template <typename T> T* gradient_data(Transformer<T>& m) {
  if constexpr (std::is_same_v<T, float>)
    if (m.device) return m.device->grads_data();
  return m.grads.data();
}

// The buffer holds, after batch i, the sum of n_j * g_j over j <= i divided by n_i (g_j: batch j's mean-loss
// gradient, n_j its target tokens): before batch i adds g_i it is rescaled by n_{i-1} / n_i, and at the end
// by n_last / tokens. A step of one batch over all the step's tokens is scaled by nothing: the same
// numbers as a step without accumulation.
template <typename T>
double accumulate_gradients(Transformer<T>& m, const std::vector<const Batch*>& batches, const std::vector<int>& micro,
                            long tokens, bool read_loss) {
  zero_grad(m);
  double loss = 0;
  long last = 0;
  size_t final_batch = 0;  // the last with target tokens
  for (size_t i = 0; i < batches.size(); ++i)
    if (batches[i]->target_tokens()) final_batch = i;
  for (size_t i = 0; i < batches.size(); ++i) {
    const long n = batches[i]->target_tokens();
    if (n == 0) continue;
    m.micro = micro[i];
    if (!m.device) loss += transformer_forward(m, *batches[i], true) * ((double)n / tokens);  // n / tokens is 1 exactly for one batch
    else {  // the losses summed on the device and read once, after the last forward (or later, from the ring
            // of losses, step_loss_sums): the host then queues the last backward and the update while the GPU runs them
      m.device->forward_in_step(*batches[i]);
      if (i == final_batch && read_loss) loss = m.device->step_loss_sum() / tokens;
    }
    if (last) scale_gradients(m, (double)last / n);
    transformer_backward(m, *batches[i], true);
    last = n;
  }
  m.micro = 0;
  if (last && last != tokens) scale_gradients(m, (double)last / tokens);
  return m.device && !read_loss ? NAN : loss;
}

template <typename T> double transformer_update(Transformer<T>& m) {
  const Config& c = m.cfg;
  m.step += 1;
  const double lr = learning_rate(m.step, c.D, c.warmup, c.lr_scale);
  if (m.device) m.device->update(lr);
  else optimizer_step(m, lr);
  return lr;
}

// ---- memory: what training takes and what is available (decoding_bytes is beside start_decoding) ----

size_t training_bytes(const Config& c, int B, int S, int T) {
  Activations<float> a;
  return sizeof(float) * (4 * parameter_layout<float>(c, nullptr, nullptr, nullptr) + carve_activations<float>(a, c, B, S, T, nullptr));
}

size_t available_memory() {
  size_t available = SIZE_MAX;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kb;
  while (meminfo >> key >> kb)
    if (key == "MemAvailable:") available = kb * 1024;
    else meminfo.ignore(1 << 10, '\n');
  struct rlimit limit;
  std::ifstream status("/proc/self/statm");
  size_t pages = 0;
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY && (status >> pages)) {
    const size_t used = pages * (size_t)sysconf(_SC_PAGESIZE);
    available = std::min(available, limit.rlim_cur > used ? (size_t)limit.rlim_cur - used : 0);
  }
  return available;
}

// ---- the rest of this translation unit ----------------------------------------------------------------
// §6 decoding and the GPU path run the passes above through Ops (decoding on either device, GpuModel with
// GpuOps), so they are compiled here, each from its own file, as llm.c's train_gpt2.cu includes llmc/*.cuh.
#include "decoding.cuh"

// ---- instantiation -----------------------------------------------------------------------------------
// The templates are defined here and used elsewhere for float (training) and double (gradient checks).
// Explicitly instantiating each function would repeat every signature; taking the addresses in an
// explicitly instantiated function instantiates them all here instead.
template <typename T> std::vector<const void*> instantiate_for() {
  return {
      (const void*)&parameter_layout<T>, (const void*)&transformer_init<T>, (const void*)&transformer_forward<T>,
      (const void*)&transformer_backward<T>, (const void*)&zero_grad<T>, (const void*)&transformer_update<T>,
      (const void*)&accumulate_gradients<T>, (const void*)&gradient_data<T>, (const void*)&scale_gradients<T>,
      (const void*)&cpu::gemm<T>, (const void*)&cpu::embedding_forward<T>, (const void*)&cpu::embedding_backward<T>,
      (const void*)&cpu::dropout_forward<T>, (const void*)&cpu::dropout_backward<T>, (const void*)&cpu::linear_forward<T>,
      (const void*)&cpu::linear_backward<T>, (const void*)&cpu::attention_forward<T>, (const void*)&cpu::attention_backward<T>,
      (const void*)&cpu::multihead_attention_forward<T>, (const void*)&cpu::multihead_attention_backward<T>,
      (const void*)&cpu::ffn_forward<T>, (const void*)&cpu::ffn_backward<T>, (const void*)&cpu::layernorm_forward<T>,
      (const void*)&cpu::layernorm_backward<T>, (const void*)&cpu::residual_dropout_backward<T>,
      (const void*)&cpu::residual_dropout_forward<T>, (const void*)&cpu::residual_dropout_layernorm_forward<T>,
      (const void*)&cpu::residual_dropout_layernorm_backward<T>,
      (const void*)&cpu::output_projection_forward<T>, (const void*)&cpu::output_projection_backward<T>,
      (const void*)&cpu::label_smoothed_xent_forward<T>, (const void*)&cpu::label_smoothed_xent_backward<T>,
      (const void*)&cpu::adam_update<T>, (const void*)&cpu::grad_norm<T>, (const void*)&cpu::scale_grads<T>,
      (const void*)&cpu::clip_grad_norm<T>,
      (const void*)&cpu::log_softmax<T>, (const void*)&cpu::copy_rows<T>,
      (const void*)&greedy_decode<T>, (const void*)&beam_search<T>, (const void*)&decoder_logprobs<T>,
  };
}
template std::vector<const void*> instantiate_for<float>();
template std::vector<const void*> instantiate_for<double>();
template struct Transformer<float>;
template struct Transformer<double>;

#include "gpu/model.cuh"  // the GPU path where TRANSFORMER_CUDA is set; else the device calls that say there is none
