// parity_gpu: every GPU operation (namespace gpu) against its CPU definition (namespace cpu), forward and
// backward, in fp32 with TF32 off, on random inputs with odd sizes, padding and causal masks, a fully
// masked row and dropout on. Outputs are poisoned with NaN before each GPU run so an unwritten element
// is caught; gradients start from the same random values on both sides, so "backward adds" is checked.
// Tolerance: relative error <= 1e-5 against max(|cpu|, floor), the floor 0.1 or, for a whole tensor, its
// RMS where that is larger: the inputs are O(1), and two fp32 sums of the same terms in another order
// (cuBLAS's fused multiply-adds, the CPU's SIMD reductions) differ by ~1e-7 of the terms' size, which a
// smaller floor would count against values that cancel to near zero. (Measured on the CPU: fp32 against
// double over the whole model's step, floor 1e-4 puts ~200 of 6188 gradient elements over 1e-5, floor 0.1
// none, worst 1.8e-6. Multi-head attention's dxq, RMS 1.1, has an element that cancels to -0.040 from
// three chained products: 1.1e-6 apart, 1.1e-5 of 0.1 but 1.0e-6 of the RMS.)
// Runs on the GPU, or on the emulated GPU of cuda_emulator.h in the emulated builds (build/emu/test/parity_gpu,
// which make check runs on every machine, and build/grade/test/parity_gpu, the quick suite's); exits 77 when
// the build has no CUDA path or no GPU is present.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "../transformer.h"
#include "check.h"
#ifdef TRANSFORMER_EMULATED_GPU
#include "cuda_emulator.h"  // its counts: the products read a parameter's bf16 copy
#endif

#ifndef TRANSFORMER_CUDA
int main() {
  std::printf("parity_gpu: this build has no CUDA path (built with CPU=1 or without nvcc): skipped\n");
  return 77;
}
#else

namespace {

constexpr double kTol = 1e-5, kFloor = 0.1;

struct Rand {
  uint64_t s;
  float uniform(float lo = -1, float hi = 1) { return lo + (hi - lo) * (float)((mix64(s++) >> 40) * (1.0 / 16777216.0)); }
  std::vector<float> vec(size_t n, float lo = -1, float hi = 1) {
    std::vector<float> v(n);
    for (float& x : v) x = uniform(lo, hi);
    return v;
  }
};

std::vector<float> zeros(size_t n) { return std::vector<float>(n); }

// A host vector and its device copy.
struct Buf {
  std::vector<float> h;
  float* d = nullptr;
  explicit Buf(std::vector<float> v) : h(std::move(v)), d(gpu::alloc(h.size())) { gpu::upload(d, h.data(), h.size()); }
  Buf(const Buf&) = delete;
  ~Buf() { gpu::release(d); }
  void poison() { gpu::fill(d, NAN, h.size()); }  // for outputs the op must overwrite
  std::vector<float> get() const {
    std::vector<float> o(h.size());
    gpu::synchronize();
    gpu::download(o.data(), d, o.size());
    return o;
  }
};

// Adam's step t (beta1 0.9, beta2 0.98) in device memory, where gpu::adam_update reads it; released by the caller
static gpu::AdamStep* device_adam_step(double lr, long t) {
  const gpu::AdamStep s = gpu::adam_step(lr, 0.9, 0.98, t);
  auto* d = (gpu::AdamStep*)gpu::alloc_bytes(sizeof s);
  gpu::upload((uint8_t*)d, (const uint8_t*)&s, sizeof s);
  return d;
}

struct Report {
  Checker& ck;
  // compares the device copy of b with its host copy (the CPU result), relative to max(|cpu|, floor, RMS)
  void same(const Buf& b, const std::string& what, double floor = kFloor) {
    std::vector<float> g = b.get();
    double sq = 0;
    for (float x : b.h) sq += (double)x * x;
    if (!b.h.empty()) floor = std::fmax(floor, std::sqrt(sq / b.h.size()));
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double err = std::fabs((double)g[i] - b.h[i]) / std::fmax(std::fabs((double)b.h[i]), floor);
      if (!(err <= worst)) worst = err, at = i;  // NaN counts as the worst
    }
    std::printf("  %-44s max rel err %.3g (tol %.0e, floor %.0e)\n", what.c_str(), worst, kTol, floor);
    ck.close(g.empty() ? 0 : g[at], g.empty() ? 0 : b.h[at], kTol, kTol * floor, (what + "[" + std::to_string(at) + "]").c_str());
  }
};

// bf16 as the tensor cores read it: to nearest, ties to even, written out independently of the GPU code.
float bf16_round(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return x;
  const uint32_t low = b & 0xffffu;
  b &= 0xffff0000u;
  if (low > 0x8000u || (low == 0x8000u && (b & 0x10000u))) b += 0x10000u;
  std::memcpy(&x, &b, 4);
  return x;
}
std::vector<float> bf16_rounded(std::vector<float> v) {
  for (float& x : v) x = bf16_round(x);
  return v;
}
// TF32 as __float_to_tf32 rounds before the tensor cores read it: a 10-bit mantissa, to nearest, ties away
// from zero.
std::vector<float> tf32_rounded(std::vector<float> v) {
  for (float& x : v) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    if ((b & 0x7f800000u) != 0x7f800000u) b = (b + 0x1000u) & ~0x1fffu;
    std::memcpy(&x, &b, 4);
  }
  return v;
}

// How many elements of a and b differ in their bits (a difference in length counts one more).
size_t differing_bits(const std::vector<float>& a, const std::vector<float>& b) {
  size_t differ = a.size() != b.size();
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return differ;
}

// Of the n floats at x (device memory poisoned first: NaN), how many past a twin alone there (its first n / 2,
// rounded up) were written: a producer that writes the fp32 values beside a twin alone writes them.
size_t written_past_twin(const float* x, size_t n) {
  std::vector<float> f(n);
  gpu::synchronize();
  gpu::download(f.data(), x, n);
  size_t written = 0;
  for (size_t i = (n + 1) / 2; i < n; ++i) written += !std::isnan(f[i]);
  return written;
}

// An op's output x of n elements with its bf16 twin listed alone, as in a training step, against x written in
// fp32 and rounded into scratch: run(alone, &written) runs the op one way or the other and returns all its
// outputs, and written_past_twin of x (x poisoned first). The outputs must have the same bits, and x must not
// be written with its twin alone (all of that part apart).
template <typename Run> void same_with_twin_alone(Checker& ck, const char* op, const char* x, size_t n, Run run) {
  size_t written_alone, written_apart;
  const std::vector<float> alone = run(true, &written_alone), apart = run(false, &written_apart);
  const size_t past = n - (n + 1) / 2;
  const size_t differ = differing_bits(alone, apart);
  std::printf("  %-44s %zu of %zu outputs differ in their bits; %s written past its twin: %zu of %zu elements (apart: %zu)\n",
              (std::string("bf16 ") + op + ", " + x + "'s twin alone").c_str(), differ, alone.size(), x, written_alone, past, written_apart);
  ck.expect(differ == 0, "bf16 %s with %s's twin alone: %zu of %zu outputs differ from %s rounded apart", op, x, differ, alone.size(), x);
  ck.expect(written_alone == 0 && written_apart == past,
            "bf16 %s: %s written past its twin at %zu of %zu elements with its twin alone (want 0), %zu apart (want all)", op, x,
            written_alone, past, written_apart);
}

// bf16 (or TF32) precision against the fp32 CPU: an element's error relative to the larger of itself and the
// tensor's RMS (a product's rounding error scales with its terms, not with a sum that cancels to zero).
void same_bf16(Checker& ck, const std::vector<float>& got, const std::vector<float>& want, double tol, const std::string& what) {
  double squares = 0, worst = 0;
  for (float w : want) squares += (double)w * w;
  const double rms = want.empty() ? 0 : std::sqrt(squares / want.size());
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs((double)got[i] - want[i]) / std::fmax(std::fabs((double)want[i]), rms);
    if (!(err <= worst)) worst = err, at = i;
  }
  std::printf("  %-44s max err %.3g of max(|x|, rms) (bound %.0e)\n", what.c_str(), worst, tol);
  ck.close(got.empty() ? 0 : got[at], got.empty() ? 0 : want[at], tol, tol * rms, (what + "[" + std::to_string(at) + "]").c_str());
}

// The batch padded to lengths S and T (the shape a CUDA-graph step rounds it up to).
Batch padded(const Batch& b, int S, int T) {
  Batch p;
  p.B = b.B, p.S = S, p.T = T;
  p.src.assign((size_t)b.B * S, kPadId), p.tgt_in.assign((size_t)b.B * T, kPadId), p.tgt_out.assign((size_t)b.B * T, kPadId);
  for (int i = 0; i < b.B; ++i)
    for (int t = 0; t < std::max(b.S, b.T); ++t) {
      if (t < b.S) p.src[(size_t)i * S + t] = b.src[(size_t)i * b.S + t];
      if (t < b.T) p.tgt_in[(size_t)i * T + t] = b.tgt_in[(size_t)i * b.T + t], p.tgt_out[(size_t)i * T + t] = b.tgt_out[(size_t)i * b.T + t];
    }
  return p;
}

// A batch of n random pairs, source i of 3 + 2i tokens, target i of len_t - i.
Batch random_batch(Rand& r, int n, int len_t, int V) {
  std::vector<std::vector<int>> src(n), tgt(n);
  std::vector<const std::vector<int>*> ps, pt;
  for (int i = 0; i < n; ++i) {
    src[i].resize(3 + 2 * i), tgt[i].resize(len_t - i);
    for (int& id : src[i]) id = 4 + (int)(r.uniform(0, 1) * (V - 4)) % (V - 4);
    for (int& id : tgt[i]) id = 4 + (int)(r.uniform(0, 1) * (V - 4)) % (V - 4);
    ps.push_back(&src[i]), pt.push_back(&tgt[i]);
  }
  return make_batch(ps, pt);
}

}  // namespace

int main() {
  if (!gpu_available()) {
    std::printf("parity_gpu: no GPU present: skipped\n");
    return 77;
  }
  std::printf("parity_gpu: on %s\n", gpu_name().c_str());
  set_precision(Precision::fp32);
  Checker ck("parity_gpu");
  Report rep{ck};
  Rand r{2024};
  const int B = 3, Lq = 7, Lk = 5, D = 12, H = 3, F = 20, V = 37, M = B * Lq;
  const DropoutKey drop = dropout_key(5, 11, 3, 0.1), none{};

  // gemm, every transpose combination, overwrite and accumulate
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (int acc = 0; acc < 2; ++acc) {
        const int m = 13, n = 9, k = 11;
        Buf A(r.vec((size_t)m * k)), Bm(r.vec((size_t)k * n)), C(r.vec((size_t)m * n));
        if (!acc) C.poison();
        cpu::gemm<float>(ta, tb, m, n, k, A.h.data(), ta ? m : k, Bm.h.data(), tb ? k : n, C.h.data(), n, acc);
        gpu::gemm(ta, tb, m, n, k, A.d, ta ? m : k, Bm.d, tb ? k : n, C.d, n, acc);
        rep.same(C, "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " acc=" + std::to_string(acc));
      }

  // embeddings
  {
    std::vector<int> ids(M);
    for (int& id : ids) id = (int)(r.uniform(0, 1) * V) % V;
    ids[1] = ids[0];  // a repeated token: its gradient rows add
    int* dids = gpu::alloc_ints(M);
    gpu::upload(dids, ids.data(), M);
    Buf emb(r.vec((size_t)V * D)), out(zeros((size_t)M * D)), dout(r.vec((size_t)M * D)), demb(r.vec((size_t)V * D));
    out.poison();
    cpu::embedding_forward(out.h.data(), ids.data(), emb.h.data(), B, Lq, D);
    gpu::embedding_forward(out.d, dids, emb.d, B, Lq, D);
    rep.same(out, "embedding_forward");
    out.poison();
    cpu::embedding_forward(out.h.data(), ids.data(), emb.h.data(), M, 1, D, 5);  // decoding: one position, t = 5
    gpu::embedding_forward(out.d, dids, emb.d, M, 1, D, 5);
    rep.same(out, "embedding_forward (first_pos 5)");
    cpu::embedding_backward(demb.h.data(), dout.h.data(), ids.data(), B, Lq, D);
    gpu::embedding_backward(demb.d, dout.d, dids, B, Lq, D);
    rep.same(demb, "embedding_backward");
    // the loss's product adds to demb on the weight gradients' stream; the embedding's backward, right after
    // it with no synchronisation between, adds to demb too: it must wait for the product
    Rand own{7};  // (draws of their own: the later tests' draws stay as they were)
    Buf dlogits(own.vec((size_t)M * V)), y(own.vec((size_t)M * D)), dy(zeros((size_t)M * D));
    cpu::output_projection_backward(dy.h.data(), demb.h.data(), dlogits.h.data(), y.h.data(), emb.h.data(), M, D, V);
    gpu::output_projection_backward(dy.d, demb.d, dlogits.d, y.d, emb.d, M, D, V);
    cpu::embedding_backward(demb.h.data(), dout.h.data(), ids.data(), B, Lq, D);
    gpu::embedding_backward(demb.d, dout.d, dids, B, Lq, D);
    rep.same(demb, "embedding_backward after the loss's product");
    gpu::release(dids);
  }

  // dropout: the same masks
  {
    const size_t n = 1001;
    Buf in(r.vec(n)), out(zeros(n)), dout(r.vec(n)), din(r.vec(n));
    out.poison();
    cpu::dropout_forward(out.h.data(), in.h.data(), drop, n);
    gpu::dropout_forward(out.d, in.d, drop, n);
    rep.same(out, "dropout_forward (p = 0.1)");
    cpu::dropout_backward(din.h.data(), dout.h.data(), drop, n);
    gpu::dropout_backward(din.d, dout.d, drop, n);
    rep.same(din, "dropout_backward (p = 0.1)");
  }

  // linear maps
  {
    const int I = 11, O = 7;
    Buf in(r.vec((size_t)M * I)), w(r.vec((size_t)I * O)), b(r.vec(O)), out(zeros((size_t)M * O));
    Buf dout(r.vec((size_t)M * O)), din(r.vec((size_t)M * I)), dw(r.vec((size_t)I * O)), db(r.vec(O));
    out.poison();
    cpu::linear_forward(out.h.data(), in.h.data(), w.h.data(), b.h.data(), M, I, O);
    gpu::linear_forward(out.d, in.d, w.d, b.d, M, I, O);
    rep.same(out, "linear_forward");
    cpu::linear_backward(din.h.data(), dw.h.data(), db.h.data(), dout.h.data(), in.h.data(), w.h.data(), M, I, O);
    gpu::linear_backward(din.d, dw.d, db.d, dout.d, in.d, w.d, M, I, O);
    rep.same(din, "linear_backward din");
    rep.same(dw, "linear_backward dw");
    rep.same(db, "linear_backward db");
  }

  // The weight gradients' products (linear_backward's dw and db) run on a stream of their own, and the emulated
  // GPU runs them as late as the main stream's waits let it (a product whose operands changed before it ran is
  // an error). Each op below overwrites an operand of theirs right after them, with no synchronisation between:
  // it must wait for them, and they must give the gradients of the operands as they were.
  {
    const size_t n = (size_t)M * D;
    Rand own{8};  // (draws of their own: the later tests' draws stay as they were)
    Buf w(own.vec((size_t)D * D)), x(own.vec(n)), y(own.vec(n)), dx(zeros(n)), dy(zeros(n)), p(own.vec((size_t)B * H * Lq * Lq, 0, 1)),
        mean(own.vec(M)), rstd(own.vec(M, 1, 2)), g(own.vec(D)), dgs(zeros(D)), dbs(zeros(D));
    const auto overwritten = [&](const std::string& what, auto overwrite) {
      Buf in(own.vec(n)), dout(own.vec(n)), din(zeros(n)), dw(own.vec((size_t)D * D)), db(own.vec(D));
#ifdef TRANSFORMER_EMULATED_GPU
      const size_t before = emu::counts().on_branches;
#endif
      cpu::linear_backward(din.h.data(), dw.h.data(), db.h.data(), dout.h.data(), in.h.data(), w.h.data(), M, D, D);
      gpu::linear_backward(din.d, dw.d, db.d, dout.d, in.d, w.d, M, D, D);
      overwrite(in.d, dout.d);
      rep.same(dw, "weight gradients' stream: dw, then " + what);
      rep.same(db, "weight gradients' stream: db, then " + what);
#ifdef TRANSFORMER_EMULATED_GPU
      ck.expect(emu::counts().on_branches == before + 2, "weight gradients' stream: dw's and db's products ran on it (emulated)");
#endif
    };
    overwritten("a product over dout", [&](float* in, float* dout) { gpu::gemm(false, false, M, D, D, in, D, w.d, D, dout, D, false); });
    overwritten("a fill of in", [&](float* in, float*) { gpu::fill(in, 0, n); });
    overwritten("dropout_backward adding into dout", [&](float*, float* dout) { gpu::dropout_backward(dout, x.d, drop, n); });
    overwritten("the residual's backward adding into dout (dy)",
                [&](float*, float* dout) { gpu::residual_dropout_backward(dx.d, dout, x.d, drop, n); });
    overwritten("the residual + LayerNorm backward adding into dout (dy)", [&](float*, float* dout) {
      gpu::residual_dropout_layernorm_backward(dx.d, dout, dgs.d, dbs.d, nullptr, x.d, x.d, g.d, mean.d, rstd.d, drop, M, D);
    });
    overwritten("attention_backward adding into in (dq)", [&](float* in, float*) {
      gpu::attention_backward(in, dx.d, dy.d, y.d, p.d, x.d, x.d, x.d, none, B, Lq, Lq, D, H);
    });
  }

  // attention: padding mask with a fully masked sentence, causal mask, dropout on the weights; head dimension 4
  // (one 16-byte group of a tile's row), and 3 with dropout (a group padded with zeros)
  for (int causal = 0; causal < 2; ++causal)
    for (int dropped = 0; dropped < 2; ++dropped) {
      const int lk = causal ? Lq : Lk;
      std::vector<uint8_t> valid((size_t)B * lk, 1);
      valid[(size_t)0 * lk + lk - 1] = 0;                          // padding at the end of sentence 0
      for (int j = 0; j < lk; ++j) valid[(size_t)2 * lk + j] = 0;  // sentence 2: every key masked
      uint8_t* dvalid = gpu::alloc_bytes(valid.size());
      gpu::upload(dvalid, valid.data(), valid.size());
      const DropoutKey key = dropped ? drop : none;
      const int heads = dropped ? D / 3 : H;
      Buf q(r.vec((size_t)B * Lq * D)), k(r.vec((size_t)B * lk * D)), v(r.vec((size_t)B * lk * D));
      Buf ctx(zeros((size_t)B * Lq * D)), p(zeros((size_t)B * heads * Lq * lk));
      Buf dctx(r.vec((size_t)B * Lq * D)), dq(r.vec((size_t)B * Lq * D)), dk(r.vec((size_t)B * lk * D)), dv(r.vec((size_t)B * lk * D));
      ctx.poison(), p.poison();
      const std::string tag = std::string(causal ? " causal" : " padding") + (dropped ? " dropout" : "") + " Dk " + std::to_string(D / heads);
      cpu::attention_forward(ctx.h.data(), p.h.data(), q.h.data(), k.h.data(), v.h.data(), valid.data(), causal, key, B, Lq, lk, D, heads);
      gpu::attention_forward(ctx.d, p.d, q.d, k.d, v.d, dvalid, causal, key, B, Lq, lk, D, heads);
      rep.same(ctx, "attention_forward ctx" + tag);
      rep.same(p, "attention_forward p" + tag);
      const std::vector<float> dq_before = dq.h;
      cpu::attention_backward(dq.h.data(), dk.h.data(), dv.h.data(), dctx.h.data(), p.h.data(), q.h.data(), k.h.data(), v.h.data(),
                              key, B, Lq, lk, D, heads);
      gpu::attention_backward(dq.d, dk.d, dv.d, dctx.d, p.d, q.d, k.d, v.d, key, B, Lq, lk, D, heads);
      rep.same(dq, "attention_backward dq" + tag);
      rep.same(dk, "attention_backward dk" + tag);
      rep.same(dv, "attention_backward dv" + tag);
      if (causal) {
        // The first query sees one key (or none, sentence 2): its weight is 1, so dL/ds = p (dp - sum_l p_l dp_l)
        // is exactly 0 and dq's first row gets exactly nothing, on both sides. A row sum formed otherwise (as
        // dctx . ctx, equal in exact arithmetic) leaves a rounding error there, which Adam turns into steps of
        // the learning rate's size on parameters whose gradient is 0.
        const std::vector<float> gq = dq.get();
        double worst = 0;
        for (int b = 0; b < B; ++b)
          for (int c = 0; c < D; ++c) {
            const size_t at = (size_t)b * Lq * D + c;  // query 0 of sentence b, column c
            worst = std::fmax(worst, std::fmax(std::fabs((double)gq[at] - dq_before[at]), std::fabs((double)dq.h[at] - dq_before[at])));
          }
        std::printf("  %-44s max change %.3g (must be 0)\n", ("attention_backward dq of one key" + tag).c_str(), worst);
        ck.expect(worst == 0, "attention_backward%s: the first query's dq changed by %.3g (GPU or CPU); its one visible key gives dL/ds = 0",
                  tag.c_str(), worst);
      }
      gpu::release(dvalid);
    }

  // long rows: 70 queries and Dk = 100, each more than one of the kernels' tiles of 32 (Dk: 4 sums a lane; the
  // largest head dimension, whose tiles and staging areas take 46,720 bytes of the 48 KiB of shared memory: the
  // next, 101, would take 49,792), over 100 keys (the backward's query and key tiles' blocks) and over 32 (the
  // backward's one block a head, over 3 query tiles, in 63,744 bytes of shared memory: its limit raised);
  // padding and dropout
  for (const int lk : {100, 32}) {
    const int b2 = 2, lq = 70, d2 = 300, h2 = 3;
    const std::string shape = " (70 x " + std::to_string(lk) + ", Dk 100)";
    std::vector<uint8_t> valid((size_t)b2 * lk, 1);
    for (int j = lk - 7; j < lk; ++j) valid[j] = 0;  // sentence 0 ends in 7 padding positions
    uint8_t* dvalid = gpu::alloc_bytes(valid.size());
    gpu::upload(dvalid, valid.data(), valid.size());
    Buf q(r.vec((size_t)b2 * lq * d2)), k(r.vec((size_t)b2 * lk * d2)), v(r.vec((size_t)b2 * lk * d2));
    Buf ctx(zeros((size_t)b2 * lq * d2)), p(zeros((size_t)b2 * h2 * lq * lk));
    Buf dctx(r.vec((size_t)b2 * lq * d2)), dq(r.vec((size_t)b2 * lq * d2)), dk(r.vec((size_t)b2 * lk * d2)),
        dv(r.vec((size_t)b2 * lk * d2));
    ctx.poison(), p.poison();
    cpu::attention_forward(ctx.h.data(), p.h.data(), q.h.data(), k.h.data(), v.h.data(), valid.data(), false, drop, b2, lq, lk, d2, h2);
    gpu::attention_forward(ctx.d, p.d, q.d, k.d, v.d, dvalid, false, drop, b2, lq, lk, d2, h2);
    rep.same(ctx, "attention_forward ctx" + shape);
    rep.same(p, "attention_forward p" + shape);
    cpu::attention_backward(dq.h.data(), dk.h.data(), dv.h.data(), dctx.h.data(), p.h.data(), q.h.data(), k.h.data(), v.h.data(),
                            drop, b2, lq, lk, d2, h2);
    gpu::attention_backward(dq.d, dk.d, dv.d, dctx.d, p.d, q.d, k.d, v.d, drop, b2, lq, lk, d2, h2);
    rep.same(dq, "attention_backward dq" + shape);
    rep.same(dk, "attention_backward dk" + shape);
    rep.same(dv, "attention_backward dv" + shape);
    gpu::release(dvalid);
  }

  // no queries (Lq 0), over keys that fit one tile and over two, and on the tensor cores (TF32, Dk 16): dk and dv
  // get nothing added, and no thread returns with its copies of the keys or values in flight (the emulated GPU
  // refuses that)
  for (const auto& [lk, D, H, tf32] : {std::tuple{5, D, H, false}, std::tuple{40, D, H, false}, std::tuple{5, 32, 2, true}}) {
    set_precision(tf32 ? Precision::tf32 : Precision::fp32);
    Buf unused(zeros(1)), k(r.vec((size_t)B * lk * D)), v(r.vec((size_t)B * lk * D)), dk(r.vec((size_t)B * lk * D)),
        dv(r.vec((size_t)B * lk * D));
    float* u = unused.h.data();
    cpu::attention_backward(u, dk.h.data(), dv.h.data(), u, u, u, k.h.data(), v.h.data(), none, B, 0, lk, D, H);
    gpu::attention_backward(unused.d, dk.d, dv.d, unused.d, unused.d, unused.d, k.d, v.d, none, B, 0, lk, D, H);
    const std::string tag = " (no queries, " + std::to_string(lk) + " keys" + (tf32 ? ", TF32, Dk 16)" : ")");
    rep.same(dk, "attention_backward dk" + tag);
    rep.same(dv, "attention_backward dv" + tag);
  }
  // no keys (Lk 0): no row has a visible key, so ctx is 0, in fp32 and on the tensor cores (TF32, Dk 16), where no
  // warp may store its sums over the queries' tile while another's copies into it are still in flight
  for (const auto& [D, H, tf32] : {std::tuple{D, H, false}, std::tuple{32, 2, true}}) {
    set_precision(tf32 ? Precision::tf32 : Precision::fp32);
    Buf q(r.vec((size_t)B * Lq * D)), ctx(zeros((size_t)B * Lq * D)), unused(zeros(1));
    ctx.poison();
    float* u = unused.h.data();
    cpu::attention_forward(ctx.h.data(), u, q.h.data(), u, u, nullptr, false, none, B, Lq, 0, D, H);
    gpu::attention_forward(ctx.d, unused.d, q.d, unused.d, unused.d, nullptr, false, none, B, Lq, 0, D, H);
    rep.same(ctx, std::string("attention_forward ctx (no keys") + (tf32 ? ", TF32, Dk 16)" : ")"));
  }
  set_precision(Precision::fp32);

  {  // a head dimension past what the shared memory holds (100) is refused before anything runs
    bool refused = false;
    try {
      gpu::attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, false, none, 1, 1, 1, 101, 1);
    } catch (const std::invalid_argument&) {
      refused = true;
    }
    ck.expect(refused, "attention_forward with a head dimension of 101 is refused");
  }

  // multi-head attention (cross: Lq queries, Lk keys)
  {
    std::vector<uint8_t> valid((size_t)B * Lk, 1);
    valid[Lk - 1] = 0;
    uint8_t* dvalid = gpu::alloc_bytes(valid.size());
    gpu::upload(dvalid, valid.data(), valid.size());
    Buf xq(r.vec((size_t)M * D)), xkv(r.vec((size_t)B * Lk * D)), wq(r.vec(D * D)), wk(r.vec(D * D)), wv(r.vec(D * D)), wo(r.vec(D * D));
    Buf aq(zeros((size_t)M * D)), ak(zeros((size_t)B * Lk * D)), av(zeros((size_t)B * Lk * D)),
        ap(zeros((size_t)B * H * Lq * Lk)), actx(zeros((size_t)M * D)), out(zeros((size_t)M * D));
    Buf sq(zeros((size_t)M * D)), sk(zeros((size_t)B * Lk * D)), sv(zeros((size_t)B * Lk * D)),
        sctx(zeros((size_t)M * D));
    Buf dout(r.vec((size_t)M * D)), dxq(r.vec((size_t)M * D)), dxkv(r.vec((size_t)B * Lk * D));
    Buf dwq(r.vec(D * D)), dwk(r.vec(D * D)), dwv(r.vec(D * D)), dwo(r.vec(D * D));
    for (Buf* b : {&aq, &ak, &av, &ap, &actx, &out, &sq, &sk, &sv, &sctx}) b->poison();
    auto host = [](Buf& a, Buf& b, Buf& c, Buf& d) { return AttentionWeights<float>{a.h.data(), b.h.data(), c.h.data(), d.h.data()}; };
    auto dev = [](Buf& a, Buf& b, Buf& c, Buf& d) { return AttentionWeights<float>{a.d, b.d, c.d, d.d}; };
    AttentionActs<float> ha{aq.h.data(), ak.h.data(), av.h.data(), ap.h.data(), actx.h.data()}, da{aq.d, ak.d, av.d, ap.d, actx.d};
    AttentionActs<float> hs{sq.h.data(), sk.h.data(), sv.h.data(), nullptr, sctx.h.data()}, ds{sq.d, sk.d, sv.d, nullptr, sctx.d};
    cpu::multihead_attention_forward(out.h.data(), ha, xq.h.data(), xkv.h.data(), host(wq, wk, wv, wo), valid.data(), false, drop, B, Lq, Lk, D, H);
    gpu::multihead_attention_forward(out.d, da, xq.d, xkv.d, dev(wq, wk, wv, wo), dvalid, false, drop, B, Lq, Lk, D, H);
    rep.same(out, "multihead_attention_forward");
    cpu::multihead_attention_backward(dxq.h.data(), dxkv.h.data(), host(dwq, dwk, dwv, dwo), dout.h.data(), ha, hs, xq.h.data(),
                                      xkv.h.data(), host(wq, wk, wv, wo), drop, B, Lq, Lk, D, H);
    gpu::multihead_attention_backward(dxq.d, dxkv.d, dev(dwq, dwk, dwv, dwo), dout.d, da, ds, xq.d, xkv.d, dev(wq, wk, wv, wo), drop, B,
                                      Lq, Lk, D, H);
    rep.same(dxq, "multihead_attention_backward dxq");
    rep.same(dxkv, "multihead_attention_backward dxkv");
    for (auto [b, name] : {std::pair{&dwq, "dWq"}, std::pair{&dwk, "dWk"}, std::pair{&dwv, "dWv"}, std::pair{&dwo, "dWo"}})
      rep.same(*b, std::string("multihead_attention_backward ") + name);
    gpu::release(dvalid);
  }

  // FFN with ReLU dropout; and with 150 rows of 300 hidden units, whose b1 gradient the backward's gate pass
  // sums in blocks of 64 rows and 256 columns (3 x 2 blocks, the last of each partial)
  Rand rf{13};  // the larger FFN's own numbers: the cases after it get the inputs they had before it came
  for (auto [M, F, r] : {std::tuple<int, int, Rand&>{M, F, r}, std::tuple<int, int, Rand&>{150, 300, rf}}) {
    const std::string tag = M == 150 ? " (150 x 300)" : "";
    Buf in(r.vec((size_t)M * D)), w1(r.vec((size_t)D * F)), b1(r.vec(F)), w2(r.vec((size_t)F * D)), b2(r.vec(D));
    Buf hpre(zeros((size_t)M * F)), h(zeros((size_t)M * F)), out(zeros((size_t)M * D));
    Buf dout(r.vec((size_t)M * D)), din(r.vec((size_t)M * D)), dh(zeros((size_t)M * F));
    Buf dw1(r.vec((size_t)D * F)), db1(r.vec(F)), dw2(r.vec((size_t)F * D)), db2(r.vec(D));
    hpre.poison(), h.poison(), out.poison(), dh.poison();
    cpu::ffn_forward(out.h.data(), FfnActs<float>{hpre.h.data(), h.h.data()}, in.h.data(),
                     FfnWeights<float>{w1.h.data(), b1.h.data(), w2.h.data(), b2.h.data()}, drop, M, D, F);
    gpu::ffn_forward(out.d, FfnActs<float>{hpre.d, h.d}, in.d, FfnWeights<float>{w1.d, b1.d, w2.d, b2.d}, drop, M, D, F);
    rep.same(out, "ffn_forward" + tag);
    cpu::ffn_backward(din.h.data(), FfnWeights<float>{dw1.h.data(), db1.h.data(), dw2.h.data(), db2.h.data()}, dh.h.data(),
                      dout.h.data(), FfnActs<float>{hpre.h.data(), h.h.data()}, in.h.data(),
                      FfnWeights<float>{w1.h.data(), b1.h.data(), w2.h.data(), b2.h.data()}, drop, M, D, F);
    gpu::ffn_backward(din.d, FfnWeights<float>{dw1.d, db1.d, dw2.d, db2.d}, dh.d, dout.d, FfnActs<float>{hpre.d, h.d}, in.d,
                      FfnWeights<float>{w1.d, b1.d, w2.d, b2.d}, drop, M, D, F);
    rep.same(din, "ffn_backward din" + tag);
    for (auto [b, name] : {std::pair{&dw1, "dW1"}, std::pair{&db1, "db1"}, std::pair{&dw2, "dW2"}, std::pair{&db2, "db2"}})
      rep.same(*b, std::string("ffn_backward ") + name + tag);
  }

  // LayerNorm (the backward's groups of lanes take 4 rows each, strided over the grid: a block takes 32 rows
  // where a warp takes a row, 67 rows of 300 in three, and 70 rows of 1024 in three, whose warps' column sums
  // take 64 KiB of shared memory, more than a launch gets without asking; 128 rows at 8 lanes a row and 64 at
  // 16: 21 rows of 12 and 37 of 65 in one block, 150 of 64 and 70 of 128 in two), the residual. All cases
  // but 21 x 12 and 67 x 300 draw their values from a generator of their own, so that the tests after them
  // see the values they always saw: the wide case's, drawn from r, moved the whole model's test below to a
  // gradient near Adam's epsilon (5.1e-8 on the CPU, 4.7e-8 on the GPU, within the gradients' tolerance),
  // where the first step, lr g / (|g| + eps), moves with it: the parameter after Adam came out 6e-5 apart.
  Rand wide{1024};
  // (the fused residual + LayerNorm kernels and LayerNorm's backward give a row 8 lanes up to width 64, 16 up
  // to 128, else a warp: row_lanes; widths 12 and 64, 65 and 128, then 300 and 1024 take each)
  for (auto [rows, width] : {std::pair<int, int>{M, D}, {150, 64}, {37, 65}, {70, 128}, {67, 300}, {70, 1024}}) {
    const std::string tag = " (" + std::to_string(rows) + " x " + std::to_string(width) + ")";
    Rand& values = width == D || width == 300 ? r : wide;
    Buf in(values.vec((size_t)rows * width, -3, 5)), g(values.vec(width, 0.5, 1.5)), b(values.vec(width)),
        out(zeros((size_t)rows * width));
    Buf mean(zeros(rows)), rstd(zeros(rows)), dout(values.vec((size_t)rows * width)), din(values.vec((size_t)rows * width)),
        dg(values.vec(width)), db(values.vec(width));
    out.poison(), mean.poison(), rstd.poison();
    cpu::layernorm_forward(out.h.data(), mean.h.data(), rstd.h.data(), in.h.data(), g.h.data(), b.h.data(), rows, width, 1e-6);
    gpu::layernorm_forward(out.d, mean.d, rstd.d, in.d, g.d, b.d, rows, width, 1e-6);
    rep.same(out, "layernorm_forward" + tag);
    rep.same(mean, "layernorm_forward mean" + tag);
    rep.same(rstd, "layernorm_forward rstd" + tag);
    cpu::layernorm_backward(din.h.data(), dg.h.data(), db.h.data(), dout.h.data(), in.h.data(), g.h.data(), mean.h.data(), rstd.h.data(), rows, width);
    gpu::layernorm_backward(din.d, dg.d, db.d, dout.d, in.d, g.d, mean.d, rstd.d, rows, width);
    rep.same(din, "layernorm_backward din" + tag);
    // dg and db are column sums over the rows: fp32 sums of `rows` O(1) terms in another order differ by
    // ~rows x 1e-7 absolute (measured: 2.0e-6 on a dg of -0.036 over 67 rows), so the floor grows with them
    const double sum_floor = kFloor * std::max(1, rows / 10);
    rep.same(dg, "layernorm_backward dg" + tag, sum_floor);
    rep.same(db, "layernorm_backward db" + tag, sum_floor);
    Buf x(values.vec((size_t)rows * width, -3, 5)), y(values.vec((size_t)rows * width)), sum(zeros((size_t)rows * width));
    out.poison(), mean.poison(), rstd.poison(), sum.poison();
    cpu::residual_dropout_layernorm_forward(out.h.data(), sum.h.data(), mean.h.data(), rstd.h.data(), x.h.data(), y.h.data(), drop,
                                            g.h.data(), b.h.data(), rows, width, 1e-6);
    gpu::residual_dropout_layernorm_forward(out.d, sum.d, mean.d, rstd.d, x.d, y.d, drop, g.d, b.d, rows, width, 1e-6);
    rep.same(out, "residual_dropout_layernorm_forward" + tag);
    rep.same(sum, "residual_dropout_layernorm_forward sum" + tag);
    rep.same(mean, "residual_dropout_layernorm_forward mean" + tag);
    rep.same(rstd, "residual_dropout_layernorm_forward rstd" + tag);
    for (DropoutKey key : {none, drop}) {  // its backward adds into gradients that hold values already
      const std::string with = tag + (key.p > 0 ? " (p = 0.1)" : " (no dropout)");
      Buf dx(values.vec((size_t)rows * width)), dy(values.vec((size_t)rows * width)), dgs(values.vec(width)), dbs(values.vec(width));
      Buf dsum(zeros((size_t)rows * width));  // the CPU's scratch
      cpu::residual_dropout_layernorm_backward(dx.h.data(), dy.h.data(), dgs.h.data(), dbs.h.data(), dsum.h.data(),
                                               dout.h.data(), sum.h.data(), g.h.data(), mean.h.data(), rstd.h.data(), key, rows,
                                               width);
      gpu::residual_dropout_layernorm_backward(dx.d, dy.d, dgs.d, dbs.d, dsum.d, dout.d, sum.d, g.d, mean.d, rstd.d, key, rows,
                                               width);
      rep.same(dx, "residual_dropout_layernorm_backward dx" + with);
      rep.same(dy, "residual_dropout_layernorm_backward dy" + with);
      rep.same(dgs, "residual_dropout_layernorm_backward dg" + with, sum_floor);
      rep.same(dbs, "residual_dropout_layernorm_backward db" + with, sum_floor);
    }
  }
  {
    const size_t n = (size_t)M * D;
    Buf x(r.vec(n)), y(r.vec(n)), sum(zeros(n)), dout(r.vec(n)), dx(r.vec(n)), dy(r.vec(n));
    for (DropoutKey key : {none, drop}) {
      const std::string tag = key.p > 0 ? " (p = 0.1)" : " (no dropout)";
      sum.poison();
      cpu::residual_dropout_forward(sum.h.data(), x.h.data(), y.h.data(), key, n);
      gpu::residual_dropout_forward(sum.d, x.d, y.d, key, n);
      rep.same(sum, "residual_dropout_forward" + tag);
      rep.same(y, "residual_dropout_forward leaves y" + tag);
    }
    for (DropoutKey key : {none, drop}) {
      const std::string tag = key.p > 0 ? " (p = 0.1)" : " (no dropout)";
      cpu::residual_dropout_backward(dx.h.data(), dy.h.data(), dout.h.data(), key, n);
      gpu::residual_dropout_backward(dx.d, dy.d, dout.d, key, n);
      rep.same(dx, "residual_dropout_backward dx" + tag);
      rep.same(dy, "residual_dropout_backward dy" + tag);
    }
  }

  // the output projection and the label-smoothed cross-entropy (both smoothing forms), padding ignored
  for (LabelSmoothing form : {LabelSmoothing::others_only, LabelSmoothing::uniform_all}) {
    Buf y(r.vec((size_t)M * D)), emb(r.vec((size_t)V * D)), logits(zeros((size_t)M * V)), lse(zeros(M));
    Buf dlogits(zeros((size_t)M * V)), dy(r.vec((size_t)M * D)), demb(r.vec((size_t)V * D));
    std::vector<int> targets(M);
    for (int i = 0; i < M; ++i) targets[i] = i % 5 == 4 ? kPadId : 1 + (int)(r.uniform(0, 1) * (V - 1)) % (V - 1);
    int* dt = gpu::alloc_ints(M);
    gpu::upload(dt, targets.data(), M);
    logits.poison(), lse.poison();
    cpu::output_projection_forward(logits.h.data(), y.h.data(), emb.h.data(), M, D, V);
    gpu::output_projection_forward(logits.d, y.d, emb.d, M, D, V);
    rep.same(logits, "output_projection_forward");
    gpu::upload(logits.d, logits.h.data(), logits.h.size());  // the loss ops see identical logits
    const double lc = cpu::label_smoothed_xent_forward(lse.h.data(), logits.h.data(), targets.data(), M, V, 0.1, form, kPadId);
    const double lg = gpu::label_smoothed_xent_forward(lse.d, logits.d, dt, M, V, 0.1, form, kPadId);
    const std::string f = form == LabelSmoothing::others_only ? " (others_only)" : " (uniform_all)";
    std::printf("  %-44s %.9g vs %.9g\n", ("label_smoothed_xent_forward loss" + f).c_str(), lg, lc);
    ck.close(lg, lc, kTol, kTol * kFloor, ("label_smoothed_xent_forward loss" + f).c_str());
    rep.same(lse, "label_smoothed_xent_forward lse" + f);
    std::fill(dlogits.h.begin(), dlogits.h.end(), 0.f);
    gpu::fill(dlogits.d, 0, dlogits.h.size());
    cpu::label_smoothed_xent_backward(dlogits.h.data(), logits.h.data(), lse.h.data(), targets.data(), M, V, 0.1, form, kPadId);
    gpu::label_smoothed_xent_backward(dlogits.d, logits.d, lse.d, dt, M, V, 0.1, form, kPadId);
    rep.same(dlogits, "label_smoothed_xent_backward" + f);
    gpu::upload(dlogits.d, dlogits.h.data(), dlogits.h.size());
    cpu::output_projection_backward(dy.h.data(), demb.h.data(), dlogits.h.data(), y.h.data(), emb.h.data(), M, D, V);
    gpu::output_projection_backward(dy.d, demb.d, dlogits.d, y.d, emb.d, M, D, V);
    rep.same(dy, "output_projection_backward dy" + f);
    rep.same(demb, "output_projection_backward demb" + f);
    gpu::release(dt);
  }

  // The loss over 1000 logits a row, where a lane reads 4 batches of 8 (the last partial) and its largest
  // logit grows from batch to batch (rising rows), falls (falling rows) or stays (flat ones), and where each
  // of the backward's 256 threads reads one batch, 3 or 4 of its 8; and over 20, where 12 lanes read none.
  // Its own numbers: the cases after it get the inputs they had before it came.
  Rand rx{29};
  for (int Vx : {1000, 20}) {
    const int Mx = 7;
    std::vector<float> z = rx.vec((size_t)Mx * Vx, -4, 4);
    for (int i = 0; i < Mx; ++i)
      for (int v = 0; v < Vx; ++v) z[(size_t)i * Vx + v] += (i % 3 == 0 ? 0.05f : i % 3 == 1 ? -0.05f : 0.f) * v;
    Buf logits(z), lse(zeros(Mx));
    std::vector<int> targets(Mx);
    for (int i = 0; i < Mx; ++i) targets[i] = i == 5 ? kPadId : 1 + (int)(rx.uniform(0, 1) * (Vx - 1)) % (Vx - 1);
    int* dt = gpu::alloc_ints(Mx);
    gpu::upload(dt, targets.data(), Mx);
    lse.poison();
    const std::string f = " (" + std::to_string(Vx) + " logits a row)";
    const double lc = cpu::label_smoothed_xent_forward(lse.h.data(), logits.h.data(), targets.data(), Mx, Vx, 0.1,
                                                       LabelSmoothing::others_only, kPadId);
    const double lg = gpu::label_smoothed_xent_forward(lse.d, logits.d, dt, Mx, Vx, 0.1, LabelSmoothing::others_only, kPadId);
    std::printf("  %-44s %.9g vs %.9g\n", ("label_smoothed_xent_forward loss" + f).c_str(), lg, lc);
    ck.close(lg, lc, kTol, kTol * kFloor, ("label_smoothed_xent_forward loss" + f).c_str());
    rep.same(lse, "label_smoothed_xent_forward lse" + f);
    Buf dlogits(rx.vec((size_t)Mx * Vx));  // added to: the backward reads it with the logits
    cpu::label_smoothed_xent_backward(dlogits.h.data(), logits.h.data(), lse.h.data(), targets.data(), Mx, Vx, 0.1,
                                      LabelSmoothing::others_only, kPadId);
    gpu::label_smoothed_xent_backward(dlogits.d, logits.d, lse.d, dt, Mx, Vx, 0.1, LabelSmoothing::others_only, kPadId);
    rep.same(dlogits, "label_smoothed_xent_backward" + f);
    gpu::release(dt);
  }

  // Adam (Eq. 3's learning rate computed on the host, read from device memory), clipping by the gradient
  // norm (a norm below max_norm: nothing changes; above: scaled down to it), scaling
  {
    const size_t n = 4099;
    Buf p(r.vec(n)), g(r.vec(n)), m(r.vec(n, -0.1f, 0.1f)), v(r.vec(n, 0, 0.1f));
    const double lr = learning_rate(7, 512, 4000, 1.0);
    gpu::AdamStep* step = device_adam_step(lr, 7);
    cpu::adam_update(p.h.data(), g.h.data(), m.h.data(), v.h.data(), n, lr, 0.9, 0.98, 1e-9, 7);
    gpu::adam_update(p.d, g.d, m.d, v.d, n, step, 0.9, 0.98, 1e-9);
    gpu::release(step);
    rep.same(p, "adam_update params");
    rep.same(m, "adam_update m");
    rep.same(v, "adam_update v");
    const double norm = cpu::grad_norm(g.h.data(), n);
    Buf again(g.h);
    for (double max_norm : {2 * norm, norm / 2}) {
      cpu::clip_grad_norm(g.h.data(), n, max_norm);
      gpu::clip_grad_norm(g.d, n, max_norm);
      rep.same(g, std::string("clip_grad_norm, the norm ") + (max_norm > norm ? "below" : "above") + " max_norm");
    }
    ck.close(cpu::grad_norm(g.h.data(), n), norm / 2, kTol, 0, "clip_grad_norm: the norm after clipping");
    // no atomics in the norm: clipping the same gradients again gives the same bits in any order of blocks
    gpu::clip_grad_norm(again.d, n, norm / 2);
    ck.expect(again.get() == g.get(), "clip_grad_norm: another run gives other bits");
    cpu::scale_grads(g.h.data(), n, 0.37);
    gpu::scale_grads(g.d, n, 0.37);
    rep.same(g, "scale_grads");
  }

  // Zero fills deferred (gpu::defer_zero_fill), as a model's backward zeroes a gradient and adds into it:
  // each op that adds into exactly a deferred range writes 0 + x there, the same bits as after the fill
  // launched at once, and (emulated GPU) no fill is launched. A range an op only reads, or that is not
  // exactly its output, is filled before the op runs: the same bits, one fill launched.
  {
    Rand rz{11};  // its own numbers: the cases after it get the inputs they had before it came
    const size_t n = (size_t)M * D, nk = (size_t)B * Lk * D;
    // each run starts every output from its host values, then fills `zeroed` (buffer, floats) at once or
    // deferred, then runs the op; the two runs' outputs must have the same bits
    const auto deferral = [&](const std::string& what, std::vector<std::pair<Buf*, size_t>> zeroed, std::vector<Buf*> outputs,
                              size_t fills_want, auto op) {
      std::vector<float> runs[2];
      [[maybe_unused]] size_t fills = 0;  // counted on the emulated GPU
      for (int deferred = 0; deferred < 2; ++deferred) {
        for (Buf* b : outputs) gpu::upload(b->d, b->h.data(), b->h.size());
#ifdef TRANSFORMER_EMULATED_GPU
        emu::reset_counts();
#endif
        for (auto [b, count] : zeroed) deferred ? gpu::defer_zero_fill(b->d, count) : gpu::fill(b->d, 0, count);
        op();
        for (const Buf* b : outputs) {  // (a download launches the fills still waiting)
          const std::vector<float> v = b->get();
          runs[deferred].insert(runs[deferred].end(), v.begin(), v.end());
        }
#ifdef TRANSFORMER_EMULATED_GPU
        const auto& launches = emu::counts().launches;
        fills = launches.count("fill_kernel") ? launches.at("fill_kernel") : 0;
#endif
      }
      const size_t differ = differing_bits(runs[0], runs[1]);
#ifdef TRANSFORMER_EMULATED_GPU
      std::printf("  %-44s %zu of %zu outputs differ in their bits; %zu fills launched (want %zu)\n", ("deferred fills: " + what).c_str(),
                  differ, runs[0].size(), fills, fills_want);
      ck.expect(fills == fills_want, "deferred fills: %s launched %zu fills (want %zu)", what.c_str(), fills, fills_want);
#else
      std::printf("  %-44s %zu of %zu outputs differ in their bits\n", ("deferred fills: " + what).c_str(), differ, runs[0].size());
#endif
      ck.expect(differ == 0, "deferred fills: %s: %zu of %zu outputs differ from the fill launched at once", what.c_str(), differ,
                runs[0].size());
    };
    Buf dout(rz.vec(n)), in(rz.vec(n, -3, 5)), g(rz.vec(D, 0.5, 1.5)), mean(rz.vec(M)), rstd(rz.vec(M, 0.5, 2));
    Buf dx(rz.vec(n)), dy(rz.vec(n)), dg(rz.vec(D)), db(rz.vec(D)), dsum(zeros(n));
    deferral("dropout_backward", {{&dx, n}}, {&dx}, 0, [&] { gpu::dropout_backward(dx.d, dout.d, drop, n); });
    deferral("residual_dropout_backward", {{&dx, n}, {&dy, n}}, {&dx, &dy}, 0,
             [&] { gpu::residual_dropout_backward(dx.d, dy.d, dout.d, drop, n); });
    deferral("residual_dropout_layernorm_backward", {{&dx, n}, {&dy, n}}, {&dx, &dy, &dg, &db}, 0, [&] {
      gpu::residual_dropout_layernorm_backward(dx.d, dy.d, dg.d, db.d, dsum.d, dout.d, in.d, g.d, mean.d, rstd.d, drop, M, D);
    });
    deferral("layernorm_backward", {{&dx, n}}, {&dx, &dg, &db}, 0,
             [&] { gpu::layernorm_backward(dx.d, dg.d, db.d, dout.d, in.d, g.d, mean.d, rstd.d, M, D); });
    // The FFN's output bias deferred (its second product's, defer_bias_add): the residual connection, post-LN
    // and pre-LN, adds it as it reads the FFN's output, with (emulated GPU) no pass of its own; the same bits
    // as the FFN's output read back first, which launches the bias's pass, then the residual op.
    {
      Buf w1(rz.vec((size_t)D * F)), b1(rz.vec(F)), w2(rz.vec((size_t)F * D)), b2(rz.vec(D)), hpre(zeros((size_t)M * F)),
          h(zeros((size_t)M * F)), y(zeros(n)), out(zeros(n)), sum(zeros(n)), mu(zeros(M)), rs(zeros(M));
      const FfnWeights<float> w{w1.d, b1.d, w2.d, b2.d};
      for (int pre_ln = 0; pre_ln < 2; ++pre_ln) {
        std::vector<float> runs[2];
        [[maybe_unused]] size_t passes[2] = {};  // add_bias_kernel's launches, counted on the emulated GPU
        for (int taken = 0; taken < 2; ++taken) {
#ifdef TRANSFORMER_EMULATED_GPU
          emu::reset_counts();
#endif
          gpu::ffn_forward(y.d, FfnActs<float>{hpre.d, h.d}, in.d, w, drop, M, D, F);
          if (!taken) runs[0] = y.get();  // y with its bias: the download launches the pass still waiting
          if (pre_ln) gpu::residual_dropout_forward(out.d, in.d, y.d, drop, n);
          else gpu::residual_dropout_layernorm_forward(out.d, sum.d, mu.d, rs.d, in.d, y.d, drop, g.d, db.d, M, D, 1e-6);
          for (const Buf* b : {&out, &sum, &mu, &rs}) {
            const std::vector<float> v = b->get();
            runs[taken].insert(runs[taken].end(), v.begin(), v.end());
          }
#ifdef TRANSFORMER_EMULATED_GPU  // (after the downloads: a pass left waiting would be launched by them, and counted)
          const auto& launches = emu::counts().launches;
          passes[taken] = launches.count("add_bias_kernel") ? launches.at("add_bias_kernel") : 0;
#endif
        }
        runs[0].erase(runs[0].begin(), runs[0].begin() + n);  // (y itself: the taken run leaves it without the bias)
        ck.expect(runs[0].size() == runs[1].size(), "deferred bias: the two runs read back %zu and %zu floats", runs[0].size(), runs[1].size());
        const size_t differ = differing_bits(runs[0], runs[1]);
        const std::string what = std::string("deferred bias: ffn_forward, ") + (pre_ln ? "residual_dropout_forward" : "residual_dropout_layernorm_forward");
        std::printf("  %-44s %zu of %zu outputs differ in their bits; bias passes %zu taken, %zu not (want 0, 1)\n", what.c_str(), differ,
                    runs[1].size(), passes[1], passes[0]);
        ck.expect(differ == 0, "%s: %zu of %zu outputs differ from the bias added by its own pass", what.c_str(), differ, runs[1].size());
#ifdef TRANSFORMER_EMULATED_GPU
        ck.expect(passes[1] == 0 && passes[0] == 1, "%s: %zu bias passes where taken (want 0), %zu where not (want 1)", what.c_str(),
                  passes[1], passes[0]);
#endif
      }
    }
    {  // dropped (a backward that throws): nothing filled, and nothing left for the op after to take
      Buf din(dx.h);
      cpu::dropout_backward(din.h.data(), dout.h.data(), drop, n);
      gpu::defer_zero_fill(din.d, n);
      gpu::drop_deferred_fills();
      gpu::dropout_backward(din.d, dout.d, drop, n);
      rep.same(din, "dropout_backward after a dropped fill (adds)");
    }
    // not taken: a range the op reads (dout), one that is not all of the op's output (dx less a float)
    deferral("an input of dropout_backward", {{&dout, n}}, {&dx, &dout}, 1, [&] { gpu::dropout_backward(dx.d, dout.d, drop, n); });
    gpu::upload(dout.d, dout.h.data(), n);  // that case left it zeroed: the ops below read its values
    deferral("residual_dropout_backward, dx less a float", {{&dx, n - 1}, {&dy, n}}, {&dx, &dy}, 1,
             [&] { gpu::residual_dropout_backward(dx.d, dy.d, dout.d, drop, n); });
    {  // the loss (padding's rows written 0), the output projection
      std::vector<int> targets(M);
      for (int i = 0; i < M; ++i) targets[i] = i % 5 == 4 ? kPadId : 1 + (int)(rz.uniform(0, 1) * (V - 1)) % (V - 1);
      int* dt = gpu::alloc_ints(M);
      gpu::upload(dt, targets.data(), M);
      Buf logits(rz.vec((size_t)M * V, -4, 4)), lse(zeros(M)), dlogits(rz.vec((size_t)M * V)), y(rz.vec(n)), emb(rz.vec((size_t)V * D)),
          demb(rz.vec((size_t)V * D));
      gpu::label_smoothed_xent_forward(lse.d, logits.d, dt, M, V, 0.1, LabelSmoothing::others_only, kPadId);
      deferral("label_smoothed_xent_backward", {{&dlogits, (size_t)M * V}}, {&dlogits}, 0, [&] {
        gpu::label_smoothed_xent_backward(dlogits.d, logits.d, lse.d, dt, M, V, 0.1, LabelSmoothing::others_only, kPadId);
      });
      deferral("output_projection_backward", {{&dy, n}}, {&dy, &demb}, 0,
               [&] { gpu::output_projection_backward(dy.d, demb.d, dlogits.d, y.d, emb.d, M, D, V); });
      gpu::release(dt);
    }
    {  // the sub-layers (pre-LN: their input's gradient is zeroed, then theirs added)
      Buf w1(rz.vec((size_t)D * F)), b1(rz.vec(F)), w2(rz.vec((size_t)F * D)), b2(rz.vec(D)), hpre(zeros((size_t)M * F)),
          h(zeros((size_t)M * F)), out(zeros(n)), dh(zeros((size_t)M * F));
      Buf dw1(rz.vec((size_t)D * F)), db1(rz.vec(F)), dw2(rz.vec((size_t)F * D)), db2(rz.vec(D));
      const FfnWeights<float> w{w1.d, b1.d, w2.d, b2.d}, dw{dw1.d, db1.d, dw2.d, db2.d};
      gpu::ffn_forward(out.d, FfnActs<float>{hpre.d, h.d}, in.d, w, drop, M, D, F);
      deferral("ffn_backward", {{&dx, n}}, {&dx, &dw1, &db1, &dw2, &db2}, 0,
               [&] { gpu::ffn_backward(dx.d, dw, dh.d, dout.d, FfnActs<float>{hpre.d, h.d}, in.d, w, drop, M, D, F); });
      std::vector<uint8_t> valid((size_t)B * std::max(Lq, Lk), 1);
      valid[Lk - 1] = 0;
      uint8_t* dvalid = gpu::alloc_bytes(valid.size());
      gpu::upload(dvalid, valid.data(), valid.size());
      Buf xkv(rz.vec(nk)), wq(rz.vec(D * D)), wk(rz.vec(D * D)), wv(rz.vec(D * D)), wo(rz.vec(D * D));
      Buf dwq(rz.vec(D * D)), dwk(rz.vec(D * D)), dwv(rz.vec(D * D)), dwo(rz.vec(D * D)), dxkv(rz.vec(nk));
      const AttentionWeights<float> aw{wq.d, wk.d, wv.d, wo.d}, daw{dwq.d, dwk.d, dwv.d, dwo.d};
      for (int cross = 0; cross < 2; ++cross) {
        const int Lkv = cross ? Lk : Lq;
        const size_t nkv = (size_t)B * Lkv * D;
        Buf aq(zeros(n)), ak(zeros(nkv)), av(zeros(nkv)), ap(zeros((size_t)B * H * Lq * Lkv)), actx(zeros(n));
        Buf sq(zeros(n)), sk(zeros(nkv)), sv(zeros(nkv)), sctx(zeros(n));
        const AttentionActs<float> a{aq.d, ak.d, av.d, ap.d, actx.d}, sa{sq.d, sk.d, sv.d, nullptr, sctx.d};
        const float* kv = cross ? xkv.d : in.d;
        gpu::multihead_attention_forward(out.d, a, in.d, kv, aw, dvalid, !cross, drop, B, Lq, Lkv, D, H);
        const auto backward = [&] {
          gpu::multihead_attention_backward(dx.d, cross ? dxkv.d : dx.d, daw, dout.d, a, sa, in.d, kv, aw, drop, B, Lq, Lkv, D, H);
        };
        if (cross)
          deferral("multihead_attention_backward (cross)", {{&dx, n}, {&dxkv, nk}}, {&dx, &dxkv, &dwq, &dwk, &dwv, &dwo}, 0, backward);
        else
          deferral("multihead_attention_backward (self)", {{&dx, n}}, {&dx, &dwq, &dwk, &dwv, &dwo}, 0, backward);
      }
      gpu::release(dvalid);
    }
  }

  // decoding's own operations: log-softmax; rows appended to and gathered from a cache
  {
    Buf logits(r.vec((size_t)M * V, -8, 8)), out(zeros((size_t)M * V));
    out.poison();
    cpu::log_softmax(out.h.data(), logits.h.data(), M, V);
    gpu::log_softmax(out.d, logits.d, M, V);
    rep.same(out, "log_softmax");
    const int rows = 5, cap = 7;
    const std::vector<int> parent = {3, 0, 3, 4, 1};
    int* dparent = gpu::alloc_ints(rows);
    gpu::upload(dparent, parent.data(), rows);
    Buf cache(r.vec((size_t)rows * cap * D)), step(r.vec((size_t)rows * D)), gathered(zeros((size_t)rows * cap * D));
    cpu::copy_rows(cache.h.data() + 2 * D, (size_t)cap * D, step.h.data(), (size_t)D, nullptr, rows, (size_t)D);
    gpu::copy_rows(cache.d + 2 * D, (size_t)cap * D, step.d, (size_t)D, nullptr, rows, (size_t)D);
    rep.same(cache, "copy_rows (append position 2)");
    gathered.poison();
    cpu::copy_rows(gathered.h.data(), (size_t)cap * D, cache.h.data(), (size_t)cap * D, parent.data(), rows, (size_t)cap * D);
    gpu::copy_rows(gathered.d, (size_t)cap * D, cache.d, (size_t)cap * D, dparent, rows, (size_t)cap * D);
    rep.same(gathered, "copy_rows (reorder by parent)");
    gpu::release(dparent);
  }

  // CUDA graphs: the training step replayed from graphs is the step run op by op, bit for bit (losses,
  // parameters, Adam's moments) where the GPU's sums are deterministic (the emulated GPU in order or in
  // reverse). Under a shuffled order or on a GPU, atomics add in the order they land: the losses must then
  // agree within the parity tolerance, and the parameters are not compared (Adam divides by sqrt(v), so an
  // element whose gradient is near zero moves by up to the learning rate either way). Over a sequence of steps that captures (the second time a shape comes), replays, drops the graphs when a
  // larger batch reallocates the arena, and accumulates two batches in a step (another micro index); the
  // op-by-op model gets the batches padded as the graph step rounds them up (lengths to a multiple of 8).
  // Every dropout is on and the step changes each time: a graph that kept its capture's step would differ.
  // The update is a graph too (from the second step on), with clipping on: some steps' gradients are
  // clipped, some not, which the graph decides on the device. Every other step leaves its loss on the
  // device (as ./train does on a GPU): the update keeps it in the ring of losses, and one read after the
  // last step gives all 11, each against the op-by-op loss.
  {
    Config c = config_preset("tiny");
    c.N = 2, c.D = 12, c.F = 20, c.H = 3, c.V = 37, c.max_len = 24, c.p_attn = 0.1, c.p_relu = 0.1, c.warmup = 4;
    c.clip_norm = 0.8;
    Transformer<float> graphed(c, 9), op_by_op(c, 9);
    transformer_to_device(graphed, Device::cuda), transformer_to_device(op_by_op, Device::cuda);
    Rand rg{77};  // its own numbers: the tests after this one see the data they always saw
    const Batch small = random_batch(rg, 4, 6, c.V), large = random_batch(rg, 7, 13, c.V);  // S, T: 10, 7 and 16, 14
    const auto up = [](int L) { return (L + 7) / 8 * 8; };
    const std::vector<std::vector<const Batch*>> steps = {{&small}, {&small}, {&small}, {&large}, {&small}, {&small},
                                                          {&large}, {&large}, {&small, &large}, {&small, &large}, {&small, &large}};
    double worst = 0;
#ifdef TRANSFORMER_EMULATED_GPU
    size_t replayed_steps = 0;    // steps whose every forward, backward and update was a graph launch
    size_t replayed_clipped = 0;  // ... and among them, those whose gradients were clipped
    const bool same_bits = emu::state().order != emu::Order::shuffle;
#else
    const bool same_bits = false;
#endif
    std::vector<double> op_losses;
    std::vector<long> step_tokens;
    for (size_t k = 0; k < steps.size(); ++k) {
      const bool deferred = k % 2 == 1;  // its loss is read with the others after the last step
      std::vector<Batch> shaped;
      std::vector<const Batch*> shaped_ptrs;
      std::vector<int> micro;
      long tokens = 0;
      for (const Batch* b : steps[k]) shaped.push_back(padded(*b, up(b->S), up(b->T))), tokens += b->target_tokens();
      for (size_t i = 0; i < shaped.size(); ++i) shaped_ptrs.push_back(&shaped[i]), micro.push_back((int)i);
#ifdef TRANSFORMER_EMULATED_GPU
      emu::reset_counts();
#endif
      set_cuda_graphs(true);
      const double lg = accumulate_gradients(graphed, steps[k], micro, tokens, !deferred);
      transformer_update(graphed);
#ifdef TRANSFORMER_EMULATED_GPU
      const emu::Counts& n = emu::counts();
      size_t kernels = 0;
      for (const auto& [name, count] : n.launches) kernels += count;
      const bool replayed = n.graph_launches == 2 * steps[k].size() + 1;  // every forward and backward, and the update
      if (replayed) {
        const size_t host_kernels = kernels - n.graph_kernels;  // launches the host made itself
        std::printf("  %-44s %zu graph launches of %zu nodes; %zu kernels launched by the host, %zu reads\n",
                    ("CUDA graphs: step " + std::to_string(k + 1)).c_str(), n.graph_launches, n.graph_nodes, host_kernels, n.to_host);
        ck.expect(n.to_host == (deferred ? 0u : 1u), "CUDA graphs: step %zu read from the device %zu times (%s)", k + 1, n.to_host,
                  deferred ? "never: its loss stays there" : "once: the step's loss");
        // zero_grad's fill; with two batches, the accumulation's scaling (twice)
        ck.expect(host_kernels == (steps[k].size() == 1 ? 1u : 3u), "CUDA graphs: step %zu launched %zu kernels itself besides its graphs", k + 1,
                  host_kernels);
      }
#endif
      set_cuda_graphs(false);
      const double lo = accumulate_gradients(op_by_op, shaped_ptrs, micro, tokens);
#ifdef TRANSFORMER_EMULATED_GPU
      if (replayed) {
        transformer_download(op_by_op);
        replayed_steps += 1, replayed_clipped += cpu::grad_norm(op_by_op.grads.data(), op_by_op.grads.size()) > c.clip_norm;
      }
#endif
      transformer_update(op_by_op);
      op_losses.push_back(lo), step_tokens.push_back(tokens);
      ck.expect(deferred == std::isnan(lg), "CUDA graphs: step %zu returned the loss %g (NaN when it stays on the device)", k + 1, lg);
      if (deferred) continue;
      if (same_bits) ck.expect(lg == lo, "CUDA graphs: step %zu's loss %.17g, op by op %.17g", k + 1, lg, lo);
      else ck.close(lg, lo, kTol, kTol * kFloor, ("CUDA graphs: step " + std::to_string(k + 1) + "'s loss against op by op").c_str());
      worst = std::fmax(worst, std::fabs(lg - lo));
    }
#ifdef TRANSFORMER_EMULATED_GPU
    emu::reset_counts();
#endif
    const std::vector<double> kept = graphed.device->step_loss_sums(1, (long)steps.size());  // every step's, read now
#ifdef TRANSFORMER_EMULATED_GPU
    ck.expect(emu::counts().to_host == 1, "CUDA graphs: the ring of losses took %zu reads (one)", emu::counts().to_host);
#endif
    for (size_t k = 0; k < steps.size(); ++k) {
      const double lg = kept[k] / step_tokens[k], lo = op_losses[k];
      if (same_bits) ck.expect(lg == lo, "CUDA graphs: step %zu's loss kept on the device %.17g, op by op %.17g", k + 1, lg, lo);
      else ck.close(lg, lo, kTol, kTol * kFloor, ("CUDA graphs: step " + std::to_string(k + 1) + "'s kept loss against op by op").c_str());
      worst = std::fmax(worst, std::fabs(lg - lo));
    }
    for (const auto& [first, count] : {std::pair<long, long>{0, 2}, {11, 2}}) {  // step 0 was never taken, step 12 not yet
      bool refused = false;
      try {
        graphed.device->step_loss_sums(first, count);
      } catch (const std::logic_error&) {
        refused = true;
      }
      ck.expect(refused, "CUDA graphs: the ring of losses gave steps %ld to %ld", first, first + count - 1);
    }
    transformer_download(graphed), transformer_download(op_by_op);
    size_t differ = 0;
    for (size_t i = 0; i < graphed.params.size(); ++i)
      differ += graphed.params[i] != op_by_op.params[i] || graphed.adam_m[i] != op_by_op.adam_m[i] || graphed.adam_v[i] != op_by_op.adam_v[i];
    std::printf("  %-44s loss diff %.3g, %zu of %zu parameters (or Adam moments) differ (%s)\n", "CUDA graphs: 11 steps against op by op",
                worst, differ, graphed.params.size(), same_bits ? "tol 0: the same bits" : "atomics in any order: losses within 1e-5");
    if (same_bits) ck.expect(differ == 0, "CUDA graphs: after 11 steps %zu parameters or moments differ from the op-by-op model's", differ);
#ifdef TRANSFORMER_EMULATED_GPU
    std::printf("  %-44s %zu of 11 steps ran from graphs only, %zu of them clipped\n", "CUDA graphs: replays", replayed_steps,
                replayed_clipped);
    ck.expect(replayed_steps >= 5, "CUDA graphs: only %zu steps were replayed from graphs (5 expected)", replayed_steps);
    ck.expect(replayed_clipped > 0 && replayed_clipped < replayed_steps,
              "CUDA graphs: %zu of %zu replayed updates clipped: the graph's clipping must be seen both ways", replayed_clipped, replayed_steps);
#endif
    // without dropout, the rounded-up shape changes nothing but the order of sums: the graph step against
    // the CPU at the batch's own shape, within the parity tolerance
    c.p_drop = c.p_attn = c.p_relu = 0;
    Transformer<float> on_cpu(c, 9), on_gpu(c, 9);
    transformer_to_device(on_gpu, Device::cuda);
    set_cuda_graphs(true);
    double lc = 0, lg = 0;
    for (int k = 0; k < 3; ++k) {  // run op by op, captured, replayed
      zero_grad(on_cpu), zero_grad(on_gpu);
      lc = transformer_forward(on_cpu, large, true), lg = transformer_forward(on_gpu, large, true);
      transformer_backward(on_cpu, large, true), transformer_backward(on_gpu, large, true);
    }
    ck.close(lg, lc, kTol, kTol * kFloor, "CUDA graphs: loss at the rounded-up shape, no dropout");
    transformer_download(on_gpu);
    double worst_grad = 0;
    for (size_t i = 0; i < on_cpu.grads.size(); ++i) {
      worst_grad = std::fmax(worst_grad, std::fabs((double)on_gpu.grads[i] - on_cpu.grads[i]) / std::fmax(std::fabs((double)on_cpu.grads[i]), kFloor));
      ck.close(on_gpu.grads[i], on_cpu.grads[i], kTol, kTol * kFloor, "CUDA graphs: gradient at the rounded-up shape, no dropout");
    }
    std::printf("  %-44s loss %.7g vs %.7g, gradients max rel err %.3g (tol %.0e)\n", "CUDA graphs: rounded-up shape vs CPU", lg, lc,
                worst_grad, kTol);
    // a step of two batches: the GPU sums their losses on the device and reads the step's once
    const std::vector<const Batch*> two = {&small, &large};
    const long tokens = small.target_tokens() + large.target_tokens();
    for (int k = 0; k < 3; ++k)  // run op by op, captured, replayed
      lc = accumulate_gradients(on_cpu, two, {0, 1}, tokens), lg = accumulate_gradients(on_gpu, two, {0, 1}, tokens);
    std::printf("  %-44s loss %.7g vs %.7g (tol %.0e)\n", "CUDA graphs: a step of two batches vs CPU", lg, lc, kTol);
    ck.close(lg, lc, kTol, kTol * kFloor, "CUDA graphs: the loss of a step of two batches, summed on the device");
#ifdef TRANSFORMER_EMULATED_GPU
    // a captured backward that fails: a cuBLAS call fails (injected) while the backward is captured, after
    // weight gradients' products were forked (the loss's, the last FFN's dW2 and db2); the failure
    // invalidates the capture. The backward throws that call's error, its products joined back and the
    // capture's own error cleared, and the model goes on: its backward captured again, then replayed, gives
    // the CPU's loss and gradients.
    Transformer<float> failing(c, 9), reference(c, 9);
    transformer_to_device(failing, Device::cuda);
    std::string error, after;
    for (int k = 0; k < 4; ++k) {  // op by op, captured (and failed), captured, replayed
      try {
        zero_grad(failing);
        lg = transformer_forward(failing, large, true);
        if (k == 1) emu::fail_blas_call(6);
        transformer_backward(failing, large, true);
      } catch (const std::exception& x) {
        (k == 1 ? error : after) = x.what();
      }
      emu::fail_blas_call(0);
    }
    zero_grad(reference);
    lc = transformer_forward(reference, large, true);
    transformer_backward(reference, large, true);
    std::printf("  %-44s %s\n", "CUDA graphs: a captured backward that fails", error.c_str());
    ck.expect(error.find("CUBLAS_STATUS_EXECUTION_FAILED") != std::string::npos,
              "CUDA graphs: a captured backward whose cuBLAS call fails throws that call's error, not another (%s)", error.c_str());
    ck.expect(after.empty(), "CUDA graphs: after a captured backward failed, the next passes fail too: %s", after.c_str());
    ck.close(lg, lc, kTol, kTol * kFloor, "CUDA graphs: the loss after a captured backward failed");
    transformer_download(failing);
    for (size_t i = 0; i < reference.grads.size(); ++i)
      ck.close(failing.grads[i], reference.grads[i], kTol, kTol * kFloor, "CUDA graphs: a gradient after a captured backward failed");
#endif
  }
  // The rest compares the GPU with the CPU at the batch's own shape: op by op.
  set_cuda_graphs(false);

  // the whole model: one training step (loss, every gradient tensor, the parameters after Adam), then
  // ten steps whose losses agree within 1e-4; post-LN and pre-LN, every dropout on
  for (bool pre_ln : {false, true}) {
    Config c = config_preset("tiny");
    c.N = 2, c.D = 12, c.F = 20, c.H = 3, c.V = 37, c.max_len = 16, c.pre_ln = pre_ln, c.p_attn = 0.1, c.p_relu = 0.1;
    c.warmup = 4;
    Transformer<float> on_cpu(c, 9), on_gpu(c, 9);
    transformer_to_device(on_gpu, Device::cuda);
    std::vector<std::vector<int>> src(4), tgt(4);
    for (int i = 0; i < 4; ++i) {
      src[i].resize(3 + 2 * i), tgt[i].resize(6 - i);  // different lengths: padding on both sides
      for (int& id : src[i]) id = 4 + (int)(r.uniform(0, 1) * (c.V - 4)) % (c.V - 4);
      for (int& id : tgt[i]) id = 4 + (int)(r.uniform(0, 1) * (c.V - 4)) % (c.V - 4);
    }
    std::vector<const std::vector<int>*> ps, pt;
    for (int i = 0; i < 4; ++i) ps.push_back(&src[i]), pt.push_back(&tgt[i]);
    const Batch batch = make_batch(ps, pt);
    const std::string tag = pre_ln ? " (pre-LN)" : " (post-LN)";
    double worst_loss = 0;
    for (int step = 0; step < 10; ++step) {
      zero_grad(on_cpu), zero_grad(on_gpu);
      const double lc = transformer_forward(on_cpu, batch, true), lg = transformer_forward(on_gpu, batch, true);
      transformer_backward(on_cpu, batch, true), transformer_backward(on_gpu, batch, true);
      if (step == 0) {
        ck.close(lg, lc, kTol, kTol * kFloor, ("model loss, step 1" + tag).c_str());
        transformer_download(on_gpu);
        for (const TensorInfo& ti : on_cpu.table) {
          double worst = 0;
          for (size_t i = ti.offset; i < ti.offset + ti.size; ++i) {
            const double want = on_cpu.grads[i], got = on_gpu.grads[i];
            worst = std::fmax(worst, std::fabs(got - want) / std::fmax(std::fabs(want), kFloor));
            ck.close(got, want, kTol, kTol * kFloor, ("gradient " + ti.name + tag).c_str());
          }
          std::printf("  %-44s max rel err %.3g (tol %.0e, floor %.0e)\n", ("gradient " + ti.name + tag).c_str(), worst, kTol, kFloor);
        }
      }
      transformer_update(on_cpu), transformer_update(on_gpu);
      if (step == 0) {
        transformer_download(on_gpu);
        double worst = 0;
        for (size_t i = 0; i < on_cpu.params.size(); ++i) {
          worst = std::fmax(worst, std::fabs((double)on_gpu.params[i] - on_cpu.params[i]) / std::fmax(std::fabs((double)on_cpu.params[i]), kFloor));
          ck.close(on_gpu.params[i], on_cpu.params[i], kTol, kTol * kFloor, ("parameters after Adam" + tag).c_str());
        }
        std::printf("  %-44s max rel err %.3g (tol %.0e, floor %.0e)\n", ("parameters after Adam" + tag).c_str(), worst, kTol, kFloor);
      }
      worst_loss = std::fmax(worst_loss, std::fabs(lg - lc) / std::fabs(lc));
      ck.close(lg, lc, 1e-4, 1e-4 * kFloor, ("loss over 10 steps" + tag).c_str());
    }
    std::printf("  %-44s max rel err %.3g (tol 1e-04)\n", ("10 training steps, loss" + tag).c_str(), worst_loss);

    // [§6] decoding on the GPU (K/V caches on the device) against the CPU, from identical parameters
    Transformer<float> dec_cpu(c, 10), dec_gpu(c, 10);
    transformer_to_device(dec_gpu, Device::cuda);
    const std::vector<float> fc = decoder_logprobs(dec_cpu, src[3], tgt[0]), fg = decoder_logprobs(dec_gpu, src[3], tgt[0]);
    double worst = 0;
    for (size_t i = 0; i < fc.size(); ++i) {
      if (std::isinf(fc[i]) && fc[i] == fg[i]) continue;  // <pad> and <s>: never predicted
      worst = std::fmax(worst, std::fabs((double)fg[i] - fc[i]) / std::fmax(std::fabs((double)fc[i]), kFloor));
      ck.close(fg[i], fc[i], kTol, kTol * kFloor, ("decoder_logprobs" + tag).c_str());
    }
    std::printf("  %-44s max rel err %.3g (tol %.0e, floor %.0e)\n", ("decoder_logprobs" + tag).c_str(), worst, kTol, kFloor);
    DecodeOptions opt;
    opt.beam = 3, opt.n_best = 2, opt.max_extra = 6;
    const std::vector<Hypothesis> gc = greedy_decode(dec_cpu, src, 6), gg = greedy_decode(dec_gpu, src, 6);
    const auto bc = beam_search(dec_cpu, src, opt), bg = beam_search(dec_gpu, src, opt);
    // the GPU's n-best lists against the CPU's: their scores checked, the hypotheses whose tokens differ counted
    const auto beams_differ = [&](const auto& cpu, const auto& gpu, const std::string& what) {
      int n = 0;
      for (size_t i = 0; i < cpu.size(); ++i)
        for (size_t j = 0; j < cpu[i].size(); ++j) {
          n += j >= gpu[i].size() || cpu[i][j].tokens != gpu[i][j].tokens;
          if (j < gpu[i].size()) ck.close(gpu[i][j].score, cpu[i][j].score, 1e-4, 1e-4 * kFloor, what.c_str());
        }
      return n;
    };
    int differ = beams_differ(bc, bg, "beam_search score" + tag);
    for (size_t i = 0; i < src.size(); ++i) {
      differ += gc[i].tokens != gg[i].tokens;
      ck.close(gg[i].logprob, gc[i].logprob, 1e-4, 1e-4 * kFloor, ("greedy_decode log-probability" + tag).c_str());
    }
    std::printf("  %-44s %d outputs differ\n", ("greedy and beam 3 (2-best) tokens" + tag).c_str(), differ);
    ck.expect(differ == 0, "greedy and beam tokens%s: %d outputs differ between the GPU and the CPU", tag.c_str(), differ);
    // The sources in another order (lengths 9, 3, 7, 5, so output limits 15, 9, 13, 11): sentences whose
    // beams end or fall below 3 in the middle of the range leave rows that do not lie by source, and the
    // encoder-decoder attention gathers them (SourceLayout). Every step launches one attention a layer for
    // all the sources (and one for self-attention), and the encoder one a layer: counted on the emulated
    // GPU, whatever the sources' rows.
    const std::vector<std::vector<int>> mixed = {src[3], src[0], src[2], src[1]};
#ifdef TRANSFORMER_EMULATED_GPU
    emu::reset_counts();
#endif
    const auto mc = beam_search(dec_cpu, mixed, opt), mg = beam_search(dec_gpu, mixed, opt);
    const int mixed_differ = beams_differ(mc, mg, "beam_search score, sources reordered" + tag);
    ck.expect(mixed_differ == 0, "beam tokens, sources reordered%s: %d outputs differ between the GPU and the CPU", tag.c_str(),
              mixed_differ);
#ifdef TRANSFORMER_EMULATED_GPU
    size_t attention = 0, steps = 0, copies = 0;
    for (const auto& [name, n] : emu::counts().launches) {
      attention += name.rfind("attention_forward", 0) == 0 ? n : 0;
      steps += name == "log_softmax_kernel" ? n : 0;
      copies += name == "copy_rows_kernel" ? n : 0;
    }
    // a step appends to the self-attention caches (2 a layer) and, but for the last, reorders them (2 a layer):
    // the copies past those are the layouts' gathers (2 a layer)
    const long gathers = (long)copies - 2L * c.N * (2 * (long)steps - 1);
    const size_t want = c.N + 2 * c.N * steps;
    std::printf("  %-44s %zu steps, %zu attention launches (want %zu), %ld steps laid out by gathers\n",
                ("beam 3, sources reordered" + tag).c_str(), steps, attention, want, gathers / (2L * c.N));
    ck.expect(attention == want, "beam search%s: %zu attention launches in %zu steps of %d layers (want %zu: the encoder's, and 2 a layer and step)",
              tag.c_str(), attention, steps, c.N, want);
    ck.expect(gathers > 0 && gathers % (2 * c.N) == 0, "beam search%s: %ld copies past the caches' (want the gathers of some steps)",
              tag.c_str(), gathers);
#endif
  }

  // ---- attention on the tensor cores (TF32; --precision tf32 and bf16, Dk a multiple of 16) ------------------
  // The forward's scores are sums of products of q and k rounded to TF32: p is the CPU's on q and k so rounded,
  // at the fp32 tolerance (a tile misplaced, or operands not rounded as the tensor cores need, is far outside
  // it). Its weighted sums also round p' to TF32: ctx is within a TF32 bound of the CPU's on rounded q, k and v.
  // The backward (on the tensor cores where the keys fit one tile) rounds ds and p' too: dq, dk and dv within
  // the bound of the CPU's on rounded q, k, v and dctx. Dk 16 to 96 (one and two 16 x 16 tiles a warp), one and
  // several query and key tiles, key padding with a sentence whose every key is masked, causal masks, dropout.
  std::printf("parity_gpu: TF32 attention (tensor cores)\n");
  set_precision(Precision::tf32);
  {
    // p' rounded to TF32 moves ctx_i by up to 2^-11 sum_j p'_ij |v_j|, which is several times ctx's RMS where
    // the weights spread over many keys whose values cancel
    constexpr double kTf32Tol = 4e-3;
    struct Case {
      int lq, lk, Dk, heads;
      bool causal;
      DropoutKey key;
    };
    for (const Case& c : {Case{7, 5, 16, 2, false, drop}, Case{9, 9, 32, 1, true, none}, Case{32, 32, 64, 2, false, drop},
                          Case{70, 40, 96, 1, false, drop}, Case{40, 70, 64, 1, false, none}, Case{33, 33, 48, 2, true, drop}}) {
      const int b3 = 3, d = c.Dk * c.heads;
      const std::string tag = " (" + std::to_string(c.lq) + " x " + std::to_string(c.lk) + ", Dk " + std::to_string(c.Dk) +
                              (c.causal ? ", causal" : "") + (c.key.p > 0 ? ", dropout" : "") + ")";
      std::vector<uint8_t> valid((size_t)b3 * c.lk, 1);
      valid[c.lk - 1] = 0;                                                        // sentence 0 ends in padding
      for (int j = 0; j < c.lk; ++j) valid[(size_t)2 * c.lk + j] = c.causal;  // sentence 2: every key masked (not causal)
      uint8_t* dvalid = gpu::alloc_bytes(valid.size());
      gpu::upload(dvalid, valid.data(), valid.size());
      Buf q(r.vec((size_t)b3 * c.lq * d, -2, 2)), k(r.vec((size_t)b3 * c.lk * d, -2, 2)), v(r.vec((size_t)b3 * c.lk * d));
      Buf ctx(zeros((size_t)b3 * c.lq * d)), p(zeros((size_t)b3 * c.heads * c.lq * c.lk));
      ctx.poison(), p.poison();
      const std::vector<float> qr = tf32_rounded(q.h), kr = tf32_rounded(k.h), vr = tf32_rounded(v.h);  // the GPU gets them unrounded
      cpu::attention_forward(ctx.h.data(), p.h.data(), qr.data(), kr.data(), vr.data(), valid.data(), c.causal, c.key, b3, c.lq, c.lk, d, c.heads);
      gpu::attention_forward(ctx.d, p.d, q.d, k.d, v.d, dvalid, c.causal, c.key, b3, c.lq, c.lk, d, c.heads);
      rep.same(p, "TF32 attention_forward p" + tag);
      same_bf16(ck, ctx.get(), ctx.h, kTf32Tol, "TF32 attention_forward ctx" + tag);
      // the backward from each side's p: on the tensor cores where the keys fit one tile, else the fp32 kernel
      Buf dctx(r.vec((size_t)b3 * c.lq * d)), dq(r.vec((size_t)b3 * c.lq * d)), dk(r.vec((size_t)b3 * c.lk * d)), dv(r.vec((size_t)b3 * c.lk * d));
      const std::vector<float> dctxr = tf32_rounded(dctx.h);
      cpu::attention_backward(dq.h.data(), dk.h.data(), dv.h.data(), dctxr.data(), p.h.data(), qr.data(), kr.data(), vr.data(), c.key, b3,
                              c.lq, c.lk, d, c.heads);
      gpu::attention_backward(dq.d, dk.d, dv.d, dctx.d, p.d, q.d, k.d, v.d, c.key, b3, c.lq, c.lk, d, c.heads);
      for (auto [g, name] : {std::pair{&dq, "dq"}, std::pair{&dk, "dk"}, std::pair{&dv, "dv"}})
        same_bf16(ck, g->get(), g->h, kTf32Tol, std::string("TF32 attention_backward ") + name + tag);
      gpu::release(dvalid);
    }
  }

  // ---- bf16 precision: the products' operands in bf16, fp32 sums, everything else fp32 ----------------
  std::printf("parity_gpu: bf16 products\n");
  set_precision(Precision::bf16);
  // gemm: exactly the CPU's fp32 product of the operands rounded to bf16 (so the fp32 parity tolerance)
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {  // padded leading dimensions: the rounded span is (rows - 1) * ld + cols
      const int m = 13, n = 9, k = 11, lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 1;
      Buf A(r.vec((size_t)(ta ? k : m) * lda)), Bm(r.vec((size_t)(tb ? n : k) * ldb)), C(r.vec((size_t)m * ldc));
      const std::vector<float> ar = bf16_rounded(A.h), br = bf16_rounded(Bm.h);
      cpu::gemm<float>(ta, tb, m, n, k, ar.data(), lda, br.data(), ldb, C.h.data(), ldc, true);
      gpu::gemm(ta, tb, m, n, k, A.d, lda, Bm.d, ldb, C.d, ldc, true);
      rep.same(C, "bf16 gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " (operands rounded, padded)");
    }
  {  // a parameter buffer's bf16 copy: made from it, read by the products, rewritten by adam_update's pass
    const size_t n = 4099;
    Buf p(r.vec(n)), g(r.vec(n)), m(r.vec(n, -0.1f, 0.1f)), v(r.vec(n, 0, 0.1f));
    gpu::keep_bf16_copy(p.d, n);
    ck.expect(gpu::bf16_copy(p.d, n) == bf16_rounded(p.h), "keep_bf16_copy: the copy is the buffer rounded to bf16");
    cpu::adam_update(p.h.data(), g.h.data(), m.h.data(), v.h.data(), n, 1e-3, 0.9, 0.98, 1e-9, 3);
    gpu::AdamStep* step = device_adam_step(1e-3, 3);
    gpu::adam_update(p.d, g.d, m.d, v.d, n, step, 0.9, 0.98, 1e-9);
    gpu::release(step);
    rep.same(p, "bf16: adam_update params (fp32)");
    const std::vector<float> after = p.get();
    ck.expect(gpu::bf16_copy(p.d, n) == bf16_rounded(after), "adam_update: the bf16 copy is the new parameters rounded");
    ck.expect(bf16_rounded(after) != bf16_rounded(std::vector<float>(p.h.size())), "adam_update: the parameters are not all zero");
    const int rows = 5, k = 7;  // a product that reads the copy: the same as rounding the updated values
    Buf x(r.vec((size_t)rows * k)), y(zeros((size_t)rows * 3));
    const std::vector<float> xr = bf16_rounded(x.h), pr = bf16_rounded(after);
    cpu::gemm<float>(false, false, rows, 3, k, xr.data(), k, pr.data() + 100, 3, y.h.data(), 3, false);
    gpu::gemm(false, false, rows, 3, k, x.d, k, p.d + 100, 3, y.d, 3, false);
    rep.same(y, "bf16 gemm reading a parameter's copy");
#ifdef TRANSFORMER_EMULATED_GPU
    emu::reset_counts();  // the copy is read, not made again: one rounding (of x), one bf16 product
    gpu::gemm(false, false, rows, 3, k, x.d, k, p.d + 100, 3, y.d, 3, false);
    const auto& launches = emu::counts().launches;
    const auto& blas = emu::counts().blas_calls;
    const size_t rounded = launches.count("to_bf16_kernel") ? launches.at("to_bf16_kernel") : 0;
    const size_t products = blas.count("cublasGemmEx") ? blas.at("cublasGemmEx") : 0;
    ck.expect(rounded == 1 && products == 1 && blas.size() == 1,
              "a product of an activation and a parameter: %zu roundings (1), %zu cublasGemmEx (1), %zu cuBLAS functions", rounded,
              products, blas.size());
#endif
    gpu::drop_bf16_copy(p.d);
  }
  // An op with one product per output; one that chains products (attention: the projections, then W^O of
  // the context) rounds twice. Measured worst below: see NOTES, "bf16 products".
  constexpr double kBf16Tol = 2e-2, kBf16Chain = 5e-2;
  {
    const int I = 11, O = 7;
    Buf in(r.vec((size_t)M * I)), w(r.vec((size_t)I * O)), b(r.vec(O)), out(zeros((size_t)M * O));
    Buf dout(r.vec((size_t)M * O)), din(r.vec((size_t)M * I)), dw(r.vec((size_t)I * O)), db(r.vec(O));
    cpu::linear_forward(out.h.data(), in.h.data(), w.h.data(), b.h.data(), M, I, O);
    gpu::linear_forward(out.d, in.d, w.d, b.d, M, I, O);
    same_bf16(ck, out.get(), out.h, kBf16Tol, "bf16 linear_forward");
    cpu::linear_backward(din.h.data(), dw.h.data(), db.h.data(), dout.h.data(), in.h.data(), w.h.data(), M, I, O);
    gpu::linear_backward(din.d, dw.d, db.d, dout.d, in.d, w.d, M, I, O);
    same_bf16(ck, din.get(), din.h, kBf16Tol, "bf16 linear_backward din");
    same_bf16(ck, dw.get(), dw.h, kBf16Tol, "bf16 linear_backward dw");
    rep.same(db, "bf16 linear_backward db (an fp32 sum)");
  }
  {
    Buf y(r.vec((size_t)M * D)), emb(r.vec((size_t)V * D)), logits(zeros((size_t)M * V)), dlogits(r.vec((size_t)M * V));
    Buf dy(r.vec((size_t)M * D)), demb(r.vec((size_t)V * D));
    cpu::output_projection_forward(logits.h.data(), y.h.data(), emb.h.data(), M, D, V);
    gpu::output_projection_forward(logits.d, y.d, emb.d, M, D, V);
    same_bf16(ck, logits.get(), logits.h, kBf16Tol, "bf16 output_projection_forward");
    cpu::output_projection_backward(dy.h.data(), demb.h.data(), dlogits.h.data(), y.h.data(), emb.h.data(), M, D, V);
    gpu::output_projection_backward(dy.d, demb.d, dlogits.d, y.d, emb.d, M, D, V);
    same_bf16(ck, dy.get(), dy.h, kBf16Tol, "bf16 output_projection_backward dy");
    same_bf16(ck, demb.get(), demb.h, kBf16Tol, "bf16 output_projection_backward demb");
  }
  // The FFN against the CPU: its first product writes hpre's rounding alone, which the gate's pass turns into
  // h's in place, and the backward's first product dh's, which the gate's pass scales in place; hpre and dh
  // (poisoned) are neither written nor read. Two products in a row, so the chain's bound.
  {
    Rand rf{13};  // its own numbers, as the case below
    const size_t n = (size_t)M * F;
    Buf in(rf.vec((size_t)M * D)), w1(rf.vec((size_t)D * F)), b1(rf.vec(F)), w2(rf.vec((size_t)F * D)), b2(rf.vec(D)),
        dout(rf.vec((size_t)M * D)), hpre(zeros(n)), h(zeros(n)), dh(zeros(n)), out(zeros((size_t)M * D)), din(rf.vec((size_t)M * D)),
        dw1(rf.vec((size_t)D * F)), db1(rf.vec(F)), dw2(rf.vec((size_t)F * D)), db2(rf.vec(D));
    hpre.poison(), dh.poison();
    const FfnWeights<float> wh{w1.h.data(), b1.h.data(), w2.h.data(), b2.h.data()}, wd{w1.d, b1.d, w2.d, b2.d};
    cpu::ffn_forward(out.h.data(), FfnActs<float>{hpre.h.data(), h.h.data()}, in.h.data(), wh, drop, M, D, F);
    gpu::ffn_forward(out.d, FfnActs<float>{hpre.d, h.d}, in.d, wd, drop, M, D, F);
    same_bf16(ck, out.get(), out.h, kBf16Chain, "bf16 ffn_forward");
    cpu::ffn_backward(din.h.data(), FfnWeights<float>{dw1.h.data(), db1.h.data(), dw2.h.data(), db2.h.data()}, dh.h.data(),
                      dout.h.data(), FfnActs<float>{hpre.h.data(), h.h.data()}, in.h.data(), wh, drop, M, D, F);
    gpu::ffn_backward(din.d, FfnWeights<float>{dw1.d, db1.d, dw2.d, db2.d}, dh.d, dout.d, FfnActs<float>{hpre.d, h.d}, in.d, wd, drop, M,
                      D, F);
    for (const auto& [b, name] : {std::pair{&din, "din"}, {&dw1, "dW1"}, {&db1, "db1"}, {&dw2, "dW2"}, {&db2, "db2"}})
      same_bf16(ck, b->get(), b->h, kBf16Chain, std::string("bf16 ffn_backward ") + name);
    size_t written = 0;
    for (const Buf* b : {&hpre, &dh})
      for (float x : b->get()) written += !std::isnan(x);
    ck.expect(written == 0, "bf16 ffn: hpre and dh written at %zu of %zu elements (want 0: only their bf16 roundings)", written, 2 * n);
    std::printf("  %-44s hpre and dh written at %zu of %zu elements\n", "bf16 ffn: fp32 hidden units", written, 2 * n);
  }
  // The FFN's h with a twin listed alone, as in a training step: the forward writes the twin and not h, and
  // the backward takes the ReLU's and the dropout's mask from the twin's signs. Every output has the same
  // bits as with h written in fp32 and rounded into scratch, where the backward reads the mask from h.
  {
    Rand rf{7};  // its own numbers: the cases after it get the inputs they had before it came
    Buf in(rf.vec((size_t)M * D)), w1(rf.vec((size_t)D * F)), b1(rf.vec(F)), w2(rf.vec((size_t)F * D)), b2(rf.vec(D)),
        dout(rf.vec((size_t)M * D));
    const size_t n = (size_t)M * F;
    const auto run = [&](bool alone, size_t* h_written) {
      Buf hpre(zeros(n)), h(zeros(n)), out(zeros((size_t)M * D)), dh(zeros(n)), din(zeros((size_t)M * D));
      Buf dw1(zeros((size_t)D * F)), db1(zeros(F)), dw2(zeros((size_t)F * D)), db2(zeros(D));
      h.poison();
      if (alone) gpu::set_bf16_twins({{h.d, n, true}}, nullptr);  // in h's own bytes
      gpu::ffn_forward(out.d, FfnActs<float>{hpre.d, h.d}, in.d, FfnWeights<float>{w1.d, b1.d, w2.d, b2.d}, drop, M, D, F);
      gpu::ffn_backward(din.d, FfnWeights<float>{dw1.d, db1.d, dw2.d, db2.d}, dh.d, dout.d, FfnActs<float>{hpre.d, h.d}, in.d,
                        FfnWeights<float>{w1.d, b1.d, w2.d, b2.d}, drop, M, D, F);
      if (alone) gpu::set_bf16_twins({}, nullptr);
      *h_written = written_past_twin(h.d, n);
      std::vector<float> all;
      for (const Buf* b : {&out, &din, &dw1, &db1, &dw2, &db2}) {
        const std::vector<float> v = b->get();
        all.insert(all.end(), v.begin(), v.end());
      }
      return all;
    };
    same_with_twin_alone(ck, "ffn", "h", n, run);
  }
  // The attention's ctx with a twin listed alone, as in a training step: the forward writes the twin from its
  // sums and not ctx; the output projection W^O and its weight's gradient read the twin. Every output has the
  // same bits as with ctx written in fp32 and rounded into scratch. Dk 4 (attention_forward_kernel) and 16
  // (attention_forward_tensor_core_kernel).
  for (const auto& [D, H] : {std::pair{D, H}, std::pair{32, 2}}) {
    Rand ra{11};
    std::vector<uint8_t> valid((size_t)B * Lk, 1);
    valid[Lk - 1] = 0;
    uint8_t* dvalid = gpu::alloc_bytes(valid.size());
    gpu::upload(dvalid, valid.data(), valid.size());
    Buf xq(ra.vec((size_t)M * D)), xkv(ra.vec((size_t)B * Lk * D)), wq(ra.vec(D * D)), wk(ra.vec(D * D)), wv(ra.vec(D * D)),
        wo(ra.vec(D * D)), dout(ra.vec((size_t)M * D));
    const size_t n = (size_t)M * D;
    // (the loop's structured bindings captured by name: a lambda may not capture them by [&] before C++20)
    const auto run = [&, D = D, H = H](bool alone, size_t* ctx_written) {
      Buf aq(zeros(n)), ak(zeros((size_t)B * Lk * D)), av(zeros((size_t)B * Lk * D)), ap(zeros((size_t)B * H * Lq * Lk)), actx(zeros(n)),
          out(zeros(n)), sq(zeros(n)), sk(zeros((size_t)B * Lk * D)), sv(zeros((size_t)B * Lk * D)), sctx(zeros(n));
      Buf dxq(zeros(n)), dxkv(zeros((size_t)B * Lk * D)), dwq(zeros(D * D)), dwk(zeros(D * D)), dwv(zeros(D * D)), dwo(zeros(D * D));
      actx.poison();
      if (alone) gpu::set_bf16_twins({{actx.d, n, true}}, nullptr);  // in ctx's own bytes
      const AttentionActs<float> a{aq.d, ak.d, av.d, ap.d, actx.d}, s{sq.d, sk.d, sv.d, nullptr, sctx.d};
      const AttentionWeights<float> w{wq.d, wk.d, wv.d, wo.d}, dw{dwq.d, dwk.d, dwv.d, dwo.d};
      gpu::multihead_attention_forward(out.d, a, xq.d, xkv.d, w, dvalid, false, drop, B, Lq, Lk, D, H);
      gpu::multihead_attention_backward(dxq.d, dxkv.d, dw, dout.d, a, s, xq.d, xkv.d, w, drop, B, Lq, Lk, D, H);
      if (alone) gpu::set_bf16_twins({}, nullptr);
      *ctx_written = written_past_twin(actx.d, n);
      std::vector<float> all;
      for (const Buf* b : {&out, &dxq, &dxkv, &dwq, &dwk, &dwv, &dwo}) {
        const std::vector<float> v = b->get();
        all.insert(all.end(), v.begin(), v.end());
      }
      return all;
    };
    same_with_twin_alone(ck, ("attention, Dk " + std::to_string(D / H)).c_str(), "ctx", n, run);
    gpu::release(dvalid);
  }
  // The logits with a twin listed alone, as in a training step: the output projection writes the twin and not
  // the logits, and the loss's forward and backward read the twin. lse and the logits' gradient have the same
  // bits as from fp32 logits that hold the twin's values (the product writes them in fp32, and then the
  // twin's values are uploaded over them: on a GPU cuBLAS may round an fp32 result and a bf16 one by other
  // paths), and the loss the same value but for the order of its rows' atomic adds in double, which neither
  // a GPU nor the emulated one under a shuffled order fixes (it differed in its last bit under
  // CUDA_EMULATOR_ORDER=shuffle). 300 logits a row: a lane reads two of its batches of 8, the second
  // partial; padding's rows get no gradient.
  {
    Rand rl{13};
    const int Vl = 300;
    Buf y(rl.vec((size_t)M * D, -2, 2)), emb(rl.vec((size_t)Vl * D, -2, 2));
    std::vector<int> targets(M);
    for (int i = 0; i < M; ++i) targets[i] = i % 5 == 4 ? kPadId : 4 + (7 * i) % (Vl - 4);
    int* dt = gpu::alloc_ints(M);
    gpu::upload(dt, targets.data(), M);
    const size_t n = (size_t)M * Vl;
    std::vector<float> twin;  // the twin's values, which the run alone (the first) leaves for the other
    double losses[2] = {};    // apart, alone
    const auto run = [&](bool alone, size_t* logits_written) {
      Buf logits(zeros(n)), lse(zeros(M)), dlogits(zeros(n));
      logits.poison();
      if (alone) gpu::set_bf16_twins({{logits.d, n, true}}, nullptr);  // in the logits' own bytes
      gpu::output_projection_forward(logits.d, y.d, emb.d, M, D, Vl);
      if (alone) twin = gpu::bf16_copy(logits.d, n);
      else gpu::upload(logits.d, twin.data(), n);
      const double loss = gpu::label_smoothed_xent_forward(lse.d, logits.d, dt, M, Vl, 0.1, LabelSmoothing::others_only, kPadId);
      gpu::fill(dlogits.d, 0, n);
      gpu::label_smoothed_xent_backward(dlogits.d, logits.d, lse.d, dt, M, Vl, 0.1, LabelSmoothing::others_only, kPadId);
      if (alone) gpu::set_bf16_twins({}, nullptr);
      *logits_written = written_past_twin(logits.d, n);
      losses[alone] = loss;
      std::vector<float> all;
      for (const Buf* b : {&lse, &dlogits}) {
        const std::vector<float> v = b->get();
        all.insert(all.end(), v.begin(), v.end());
      }
      return all;
    };
    same_with_twin_alone(ck, "loss", "logits", n, run);
    const double loss_diff = std::fabs(losses[1] - losses[0]) / std::fabs(losses[0]), loss_bound = 1e-13;
    std::printf("  %-44s rel diff %.3g (bound %.0e: the rows' atomic adds in another order)\n", "bf16 loss, logits's twin alone: the loss",
                loss_diff, loss_bound);
    ck.expect(loss_diff <= loss_bound, "bf16 loss with logits's twin alone: the loss %.17g against %.17g rounded apart (rel diff %.3g > %.0e)",
              losses[1], losses[0], loss_diff, loss_bound);
    gpu::release(dt);
  }
  // Attention's inputs q, k, v and dctx read from bf16 twins listed alone, as a training step's attention reads
  // what its products wrote (copy_head_tile widens them into its tiles): every output has the same bits as from
  // fp32 inputs that hold those roundings, and the fp32 inputs (poisoned) are not read. Without the tensor cores
  // (attention_forward_kernel, the one-key-tile backward): Dk 3 (an element at a time), 4 (4 a load) and 8 (4 a
  // load, 4 columns of padding); on them: Dk 16, the twins 8-byte aligned (4 a load) or not (shifted by an
  // element: one at a time), and Dk 16 with 37 queries and 45 keys (tiles in turn; attention_backward_kernel).
  for (const auto& [d, heads, lq, lk, shift] : {std::tuple{D, 4, Lq, Lk, 0}, std::tuple{D, 3, Lq, Lk, 0}, std::tuple{16, 2, Lq, Lk, 0},
                                                std::tuple{32, 2, Lq, Lk, 0}, std::tuple{32, 2, Lq, Lk, 1}, std::tuple{32, 2, 37, 45, 0}}) {
    Rand ra{17};
    const size_t nq = (size_t)B * lq * d, nk = (size_t)B * lk * d, np = (size_t)B * heads * lq * lk;
    std::vector<uint8_t> valid((size_t)B * lk, 1);
    valid[lk - 1] = 0;
    uint8_t* dvalid = gpu::alloc_bytes(valid.size());
    gpu::upload(dvalid, valid.data(), valid.size());
    const std::vector<float> q = bf16_rounded(ra.vec(nq)), k = bf16_rounded(ra.vec(nk)), v = bf16_rounded(ra.vec(nk)),
                             dctx = bf16_rounded(ra.vec(nq));
    std::vector<uint8_t> bits;  // their bf16 bytes, one after another, as the twins hold them
    for (const std::vector<float>* x : {&q, &k, &v, &dctx})
      for (float e : *x) {
        uint32_t b;
        std::memcpy(&b, &e, 4);
        bits.push_back(b >> 16 & 0xff), bits.push_back(b >> 24);
      }
    // (the loop's structured bindings captured by name: a lambda may not capture them by [&] before C++20)
    const auto run = [&, d = d, heads = heads, lq = lq, lk = lk, shift = shift](bool twins) {
      Buf bq(q), bk(k), bv(v), bdctx(dctx), ctx(zeros(nq)), p(zeros(np)), dq(zeros(nq)), dk(zeros(nk)), dv(zeros(nk));
      // listed alone, the twins in their buffers' own bytes; shifted, beside the fp32 values, in storage off 8-byte alignment
      uint8_t* twin = twins && shift ? gpu::alloc_bytes(bits.size() + 2) : nullptr;
      if (twins) {
        bq.poison(), bk.poison(), bv.poison(), bdctx.poison();
        size_t at = 0;  // bytes into bits
        for (const auto& [b, n] : {std::pair{&bq, nq}, std::pair{&bk, nk}, std::pair{&bv, nk}, std::pair{&bdctx, nq}}) {
          gpu::upload(shift ? twin + 2 + at : reinterpret_cast<uint8_t*>(b->d), bits.data() + at, 2 * n);
          at += 2 * n;
        }
        gpu::set_bf16_twins({{bq.d, nq, !shift}, {bk.d, nk, !shift}, {bv.d, nk, !shift}, {bdctx.d, nq, !shift}}, shift ? twin + 2 : nullptr);
      }
      gpu::attention_forward(ctx.d, p.d, bq.d, bk.d, bv.d, dvalid, false, drop, B, lq, lk, d, heads);
      gpu::attention_backward(dq.d, dk.d, dv.d, bdctx.d, p.d, bq.d, bk.d, bv.d, drop, B, lq, lk, d, heads);
      std::vector<float> all;
      for (const Buf* b : {&ctx, &p, &dq, &dk, &dv}) {
        const std::vector<float> x = b->get();
        all.insert(all.end(), x.begin(), x.end());
      }
      if (twins) gpu::set_bf16_twins({}, nullptr), gpu::release(twin);
      return all;
    };
    const std::vector<float> from_twins = run(true), from_fp32 = run(false);
    const size_t differ = differing_bits(from_twins, from_fp32);
    const std::string what = "bf16 attention inputs from twins (Dk " + std::to_string(d / heads) + ", " + std::to_string(lq) + " x " +
                             std::to_string(lk) + (shift ? ", unaligned)" : ")");
    std::printf("  %-44s %zu of %zu outputs differ in their bits from fp32 inputs\n", what.c_str(), differ, from_twins.size());
    ck.expect(differ == 0, "%s: %zu of %zu outputs differ from the same values read in fp32", what.c_str(), differ, from_twins.size());
    gpu::release(dvalid);
  }
  // The whole step in bf16 against the fp32 CPU step. Element by element that is no bound: this tiny model
  // (d 12) is ill-conditioned, and rounding its weights alone to bf16, in double on the CPU, moves single
  // gradient tensors by up to 32% (L2). So the gradient is held as a whole: its relative L2 error over every
  // parameter, and each tensor's direction (cosine); the gradient of another batch must fail both bounds.
  constexpr double kLossTol = 5e-3, kGradL2 = 0.15, kGradCos = 0.95;
  struct Agreement {
    double l2, worst_cos;
    std::string where;
  };
  const auto agreement = [](const std::vector<TensorInfo>& table, const std::vector<float>& got, const std::vector<float>& want) {
    Agreement a{0, 1, ""};
    double diff = 0, norm = 0;
    for (const TensorInfo& ti : table) {
      double dot = 0, gg = 0, ww = 0;
      for (size_t i = ti.offset; i < ti.offset + ti.size; ++i)
        dot += (double)got[i] * want[i], gg += (double)got[i] * got[i], ww += (double)want[i] * want[i];
      diff += gg - 2 * dot + ww, norm += ww;
      const double cos = dot / std::sqrt(gg * ww);
      if (!(cos >= a.worst_cos)) a.worst_cos = cos, a.where = ti.name;
    }
    a.l2 = std::sqrt(std::fmax(diff, 0) / norm);
    return a;
  };
  // attention's projections: each input rounded once for its products; Dk 4 (the fp32 kernels) and 16 (the
  // tensor cores'); and with q, k, v and ctx listed as twins alone, as in a training step (q, k, v, then dctx
  // too, read in bf16: one more rounding each)
  for (const auto& [D, H] : {std::pair{D, H}, std::pair{32, 2}})
  for (bool self : {false, true})
  for (bool twins : {false, true}) {
    const int lk = self ? Lq : Lk;
    std::vector<uint8_t> valid((size_t)B * lk, 1);
    valid[lk - 1] = 0;
    uint8_t* dvalid = gpu::alloc_bytes(valid.size());
    gpu::upload(dvalid, valid.data(), valid.size());
    const float w = std::sqrt(12.f / D);  // the weights' range: the scores' spread of D 12 at D 32 too (bf16 peaks a softmax less)
    Buf xq(r.vec((size_t)M * D)), xkv(r.vec((size_t)B * lk * D)), wq(r.vec(D * D, -w, w)), wk(r.vec(D * D, -w, w)), wv(r.vec(D * D, -w, w)),
        wo(r.vec(D * D, -w, w));
    Buf aq(zeros((size_t)M * D)), ak(zeros((size_t)B * lk * D)), av(zeros((size_t)B * lk * D)), ap(zeros((size_t)B * H * Lq * lk)),
        actx(zeros((size_t)M * D)), out(zeros((size_t)M * D)), sq(zeros((size_t)M * D)), sk(zeros((size_t)B * lk * D)),
        sv(zeros((size_t)B * lk * D)), sctx(zeros((size_t)M * D));
    Buf dout(r.vec((size_t)M * D)), dxq(r.vec((size_t)M * D)), dxkv(r.vec((size_t)B * lk * D));
    Buf dwq(r.vec(D * D)), dwk(r.vec(D * D)), dwv(r.vec(D * D)), dwo(r.vec(D * D));
    const float* hkv = self ? xq.h.data() : xkv.h.data();  // self-attention: the same input on both sides
    const float* dkv = self ? xq.d : xkv.d;
    float* dxkv_h = self ? dxq.h.data() : dxkv.h.data();
    float* dxkv_d = self ? dxq.d : dxkv.d;
    auto host = [](Buf& a, Buf& b, Buf& c, Buf& d) { return AttentionWeights<float>{a.h.data(), b.h.data(), c.h.data(), d.h.data()}; };
    auto dev = [](Buf& a, Buf& b, Buf& c, Buf& d) { return AttentionWeights<float>{a.d, b.d, c.d, d.d}; };
    AttentionActs<float> ha{aq.h.data(), ak.h.data(), av.h.data(), ap.h.data(), actx.h.data()}, da{aq.d, ak.d, av.d, ap.d, actx.d};
    AttentionActs<float> hs{sq.h.data(), sk.h.data(), sv.h.data(), nullptr, sctx.h.data()}, ds{sq.d, sk.d, sv.d, nullptr, sctx.d};
    const std::string tag = std::string(self ? " (self, causal" : " (cross") + ", Dk " + std::to_string(D / H) + (twins ? ", twins)" : ")");
    if (twins) {
      aq.poison(), ak.poison(), av.poison(), actx.poison();
      gpu::set_bf16_twins({{aq.d, aq.h.size(), true}, {ak.d, ak.h.size(), true}, {av.d, av.h.size(), true}, {actx.d, actx.h.size(), true}},
                          nullptr);  // in their own bytes
    }
    cpu::multihead_attention_forward(out.h.data(), ha, xq.h.data(), hkv, host(wq, wk, wv, wo), valid.data(), self, drop, B, Lq, lk, D, H);
    gpu::multihead_attention_forward(out.d, da, xq.d, dkv, dev(wq, wk, wv, wo), dvalid, self, drop, B, Lq, lk, D, H);
    same_bf16(ck, out.get(), out.h, kBf16Chain, "bf16 multihead_attention_forward" + tag);
    cpu::multihead_attention_backward(dxq.h.data(), dxkv_h, host(dwq, dwk, dwv, dwo), dout.h.data(), ha, hs, xq.h.data(), hkv,
                                      host(wq, wk, wv, wo), drop, B, Lq, lk, D, H);
    sq.poison(), sk.poison(), sv.poison();  // the attention's kernel writes dq, dk and dv rounded, not these
    gpu::multihead_attention_backward(dxq.d, dxkv_d, dev(dwq, dwk, dwv, dwo), dout.d, da, ds, xq.d, dkv, dev(wq, wk, wv, wo), drop, B, Lq,
                                      lk, D, H);
    size_t written = 0;
    for (const Buf* b : {&sq, &sk, &sv})
      for (float x : b->get()) written += !std::isnan(x);
    std::printf("  %-44s %zu of %zu elements written\n", ("bf16 attention backward: dq, dk, dv in fp32" + tag).c_str(), written,
                sq.h.size() + sk.h.size() + sv.h.size());
    ck.expect(written == 0, "bf16 multihead_attention_backward%s: %zu elements of dq, dk, dv written in fp32 (the products read their roundings)",
              tag.c_str(), written);
    same_bf16(ck, dxq.get(), dxq.h, kBf16Chain, "bf16 multihead_attention_backward dxq" + tag);
    if (!self) same_bf16(ck, dxkv.get(), dxkv.h, kBf16Chain, "bf16 multihead_attention_backward dxkv" + tag);
    for (auto [b, name] : {std::pair{&dwq, "dWq"}, std::pair{&dwk, "dWk"}, std::pair{&dwv, "dWv"}, std::pair{&dwo, "dWo"}})
      same_bf16(ck, b->get(), b->h, kBf16Chain, std::string("bf16 multihead_attention_backward ") + name + tag);
    if (twins) gpu::set_bf16_twins({}, nullptr);
    gpu::release(dvalid);
  }
  // post-LN and pre-LN at d 12 (Dk 4: the fp32 attention kernels), post-LN at d 32 (Dk 16: the tensor cores')
  for (const auto& [pre_ln, D, H] : {std::tuple{false, 12, 3}, std::tuple{true, 12, 3}, std::tuple{false, 32, 2}}) {
    Config c = config_preset("tiny");
    c.N = 2, c.D = D, c.F = 20, c.H = H, c.V = 37, c.max_len = 16, c.pre_ln = pre_ln;
    c.warmup = 1, c.lr_scale = 0.02;  // a first update large enough to move the loss
    Transformer<float> on_cpu(c, 9), on_gpu(c, 9), other(c, 9);
    transformer_to_device(on_gpu, Device::cuda);
    std::vector<std::vector<int>> src(6), tgt(6);
    for (int i = 0; i < 6; ++i) {
      src[i].resize(3 + i), tgt[i].resize(8 - i);
      for (int& id : src[i]) id = 4 + (int)(r.uniform(0, 1) * (c.V - 4)) % (c.V - 4);
      for (int& id : tgt[i]) id = 4 + (int)(r.uniform(0, 1) * (c.V - 4)) % (c.V - 4);
    }
    std::vector<const std::vector<int>*> ps, pt;
    for (int i = 0; i < 6; ++i) ps.push_back(&src[i]), pt.push_back(&tgt[i]);
    const Batch batch = make_batch(ps, pt), reversed = make_batch(pt, ps);  // another batch: sides swapped
    const std::string tag = std::string(pre_ln ? " (pre-LN" : " (post-LN") + (D / H == 16 ? ", Dk 16)" : ")");
    zero_grad(on_cpu), zero_grad(on_gpu), zero_grad(other);
    const double lc = transformer_forward(on_cpu, batch, true), lg = transformer_forward(on_gpu, batch, true);
    transformer_forward(other, reversed, true);
    transformer_backward(on_cpu, batch, true), transformer_backward(on_gpu, batch, true), transformer_backward(other, reversed, true);
    transformer_download(on_gpu);
    std::printf("  %-44s %.7g vs %.7g (rel err %.2g, bound %.0e)\n", ("bf16 step: loss" + tag).c_str(), lg, lc, std::fabs(lg - lc) / lc,
                kLossTol);
    ck.close(lg, lc, kLossTol, 0, ("bf16 step: loss" + tag).c_str());
    const Agreement a = agreement(on_cpu.table, on_gpu.grads, on_cpu.grads), n = agreement(on_cpu.table, other.grads, on_cpu.grads);
    std::printf("  %-44s L2 rel err %.3g (bound %.2g), worst cosine %.5f at %s (bound %.2f)\n", ("bf16 step: gradient" + tag).c_str(),
                a.l2, kGradL2, a.worst_cos, a.where.c_str(), kGradCos);
    std::printf("  %-44s L2 rel err %.3g, worst cosine %.5f at %s: must fail the bounds\n", ("another batch's gradient" + tag).c_str(),
                n.l2, n.worst_cos, n.where.c_str());
    ck.expect(a.l2 <= kGradL2 && a.worst_cos >= kGradCos, "bf16 step%s: gradient L2 rel err %.3g (bound %.2g), worst cosine %.5f at %s (bound %.2f)",
              tag.c_str(), a.l2, kGradL2, a.worst_cos, a.where.c_str(), kGradCos);
    ck.expect(n.l2 > kGradL2 && n.worst_cos < kGradCos, "bf16 step%s: another batch's gradient passes the bounds (L2 %.3g, cosine %.5f)",
              tag.c_str(), n.l2, n.worst_cos);
    // The activations' bf16 twins, which the products read instead of rounding them: each is its buffer
    // rounded, as its producer wrote both (a twin left stale, by a producer that does not write it, is not).
    // Post-LN: each attention's q, k, v and ctx, each FFN's h and each sub-layer connection's output; pre-LN
    // the first two; both, the embedded inputs and the gradients of the logits and of a sub-layer's output.
    // Listed alone, their fp32 values not written: the attentions' q, k, v and ctx, the FFNs' h, the logits and
    // the logits' gradient (each producer's own case above checks it writes the twin alone). The arena carves
    // each of them with the twin's bytes alone, half the fp32 ones: fp32 values written past a twin would land
    // in the next buffer (or past the arena, which the emulated GPU refuses).
    {
      const auto twins = gpu::bf16_twins();
      // 3 N attentions (4 each), 2 N FFNs, post-LN 5 N connections; x0 twice, the logits, their gradient and a
      // sub-layer's gradient
      const size_t want = (size_t)c.N * (pre_ln ? 12 + 2 : 12 + 2 + 5) + 5, want_alone = 14 * (size_t)c.N + 2;
      size_t stale = 0, elements = 0, alone = 0;
      for (const gpu::Bf16Twin& t : twins) {
        elements += t.n;
        if (t.alone) {
          ++alone;
          continue;
        }
        std::vector<float> f(t.n);
        gpu::download(f.data(), t.p, t.n);
        stale += gpu::bf16_copy(t.p, t.n) != bf16_rounded(f);
      }
      std::printf("  %-44s %zu twins (want %zu), %zu alone (want %zu), %zu elements, %zu not their buffer rounded\n",
                  ("bf16 step: activations' twins" + tag).c_str(), twins.size(), want, alone, want_alone, elements, stale);
      ck.expect(twins.size() == want && alone == want_alone && stale == 0,
                "bf16 step%s: %zu activations with a bf16 twin (want %zu), %zu alone (want %zu), %zu of them not their buffer rounded",
                tag.c_str(), twins.size(), want, alone, want_alone, stale);
    }
    // The update rewrites the parameters' bf16 copy, which the next step's products read: its loss agrees
    // again, and differs from the first step's by more than the bound (a stale copy would not follow).
    transformer_update(on_cpu), transformer_update(on_gpu);
    const double lc2 = transformer_forward(on_cpu, batch, true), lg2 = transformer_forward(on_gpu, batch, true);
    std::printf("  %-44s %.7g vs %.7g (rel err %.2g, bound %.0e; the first step's %.7g)\n", ("bf16 step: loss after Adam" + tag).c_str(), lg2,
                lc2, std::fabs(lg2 - lc2) / lc2, kLossTol, lc);
    ck.close(lg2, lc2, kLossTol, 0, ("bf16 step: loss after Adam" + tag).c_str());
    ck.expect(std::fabs(lc2 - lc) > 3 * kLossTol * lc, "bf16 step%s: the update moved the loss by only %.3g", tag.c_str(), lc2 - lc);
    // The same model and shape in fp32 next: the arena is carved again, with the FFN's fp32 hidden units that
    // bf16 leaves out (the fp32 FFN writes them), and the step agrees with bf16's within the bound.
    set_precision(Precision::fp32);
    const double lf = transformer_forward(on_gpu, batch, true);
    transformer_backward(on_gpu, batch, true);
    set_precision(Precision::bf16);
    std::printf("  %-44s %.7g vs bf16's %.7g (rel err %.2g, bound %.0e)\n", ("then fp32, same shape: loss" + tag).c_str(), lf, lg2,
                std::fabs(lf - lg2) / lg2, kLossTol);
    ck.close(lf, lg2, kLossTol, 0, ("then fp32, same shape: loss" + tag).c_str());
  }
  set_precision(Precision::fp32);
  return ck.finish();
}
#endif
