// The course grader's checks: for every task (a solution region `// BEGIN SOLUTION task=ID`), its cases
// and what each case checks. Included by course/grade.cpp (which runs them) and, in the solution tree, by
// course/snapshots.cpp (which writes the expected values of the forward tasks).
//
// Four kinds of check (README, "Course assignments"):
//   gradient   central finite differences in double against the student's backward (test/gradcheck.h),
//              one check per (case, input); gradients start from random values, so overwriting fails;
//   snapshot   the student's forward outputs against values the solution wrote (course/snapshots/, or
//              HIDDEN/snapshots/ for hidden cases), one check per (case, output);
//   model      the whole model's gradient (post-LN and pre-LN) for the sub-layer connection;
//   kernel     a CUDA kernel on the emulated GPU (cuda_emulator.h) against the CPU definition in fp32.
// A case is a line of key=value words ("M=5 D=9 seed=1"); hidden cases come from HIDDEN/cases.txt, one
// "TASK key=value ..." a line. Each task lists the other tasks its checks call (depends): a task whose
// dependency is still a stub fails those checks with the stub's message.
#pragma once
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../bleu.h"
#include "../data/numbers.h"
#include "../test/gradcheck.h"
#include "../tokenizer.h"
#include "../transformer.h"

#ifndef TRANSFORMER_CUDA
#error "the course grader is built against the emulated GPU (the Makefile's build/grade/)"
#endif

namespace course {

struct Case {
  std::string text;  // "M=5 D=9 seed=1": the case's name in tables and snapshots
  std::map<std::string, std::string> kv;
  explicit Case(const std::string& t) : text(t) {
    std::istringstream in(t);
    std::string word;
    while (in >> word) {
      const size_t eq = word.find('=');
      if (eq == std::string::npos || eq == 0) throw std::runtime_error("case '" + t + "': '" + word + "' is not key=value");
      kv[word.substr(0, eq)] = word.substr(eq + 1);
    }
  }
  std::string s(const std::string& k, const std::string& def) const {
    auto it = kv.find(k);
    return it == kv.end() ? def : it->second;
  }
  double d(const std::string& k, double def) const {
    auto it = kv.find(k);
    if (it == kv.end()) return def;
    char* end = nullptr;
    const double v = std::strtod(it->second.c_str(), &end);
    if (end == it->second.c_str() || *end) throw std::runtime_error("case '" + text + "': " + k + " is not a number");
    return v;
  }
  int i(const std::string& k, int def) const {
    const double v = d(k, def);
    if (v != (int)v || v < 0 || v > 1e6) throw std::runtime_error("case '" + text + "': " + k + " must be an integer in 0..1e6");
    return (int)v;
  }
};

// The outputs of a forward task for one case: (output name, words), numbers printed with %.17g.
using Outputs = std::vector<std::pair<std::string, std::vector<std::string>>>;
using CheckFn = std::function<void(Checker&)>;

struct Task {
  std::string id;
  std::vector<std::string> depends;  // tasks whose code the checks call
  std::vector<std::string> cases;    // the visible cases
  // gradient and model tasks: the checks of a case, named, without running anything
  std::function<std::vector<std::pair<std::string, CheckFn>>(const Case&)> checks;
  // snapshot tasks: the outputs of a case, compared word by word with the snapshot (numbers at tol)
  std::function<Outputs(const Case&)> outputs;
  double tol = 0;
};

inline std::string num(double x) {
  char b[40];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}
template <typename It> std::vector<std::string> nums(It begin, It end) {
  std::vector<std::string> out;
  for (It it = begin; it != end; ++it) out.push_back(num((double)*it));
  return out;
}
inline std::string hex(const std::string& s) {  // a piece of text as one word
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) out += digits[c >> 4], out += digits[c & 15];
  return out.empty() ? "-" : out;
}

// ---- gradient tasks: one check per (case, input) ------------------------------------------------------

// Runs check_pair on one input of an op whose forward and backward read every input: all gradients are
// sized, only `which` is compared.
struct GradientOp {
  std::vector<Input> inputs;
  size_t out_size = 0;
  std::function<void(Vec&)> forward;
  std::function<void(const Vec&)> backward;
};
using OpFactory = std::function<GradientOp(Rand&)>;  // builds the op's inputs from a seeded source

// One check per input of the op; each check builds the op afresh from the case's seed.
inline std::vector<std::pair<std::string, CheckFn>> per_input(const Case& c, const std::string& op,
                                                             const std::vector<std::string>& input_names, OpFactory make) {
  std::vector<std::pair<std::string, CheckFn>> out;
  for (const std::string& name : input_names)
    out.push_back({c.text + ": d" + name, [=](Checker& ck) {
                     Rand rng{(uint64_t)c.i("seed", 1) * 7919u + 17u};
                     GradientOp g = make(rng);
                     for (auto& in : g.inputs) in.g->assign(in.x->size(), 0.0);
                     std::vector<Input> one;
                     for (auto& in : g.inputs)
                       if (in.name == name) one.push_back(in);
                     if (one.empty()) throw std::logic_error("grader: no input " + name);
                     check_pair(ck, op, one, g.out_size, g.forward, g.backward, rng);
                   }});
  return out;
}

// The op's storage lives in a shared_ptr'd struct captured by the closures.
template <typename S> std::shared_ptr<S> hold() { return std::make_shared<S>(); }

inline std::vector<std::pair<std::string, CheckFn>> linear_checks(const Case& c) {
  const int M = c.i("M", 7), I = c.i("I", 5), O = c.i("O", 3);
  const bool bias = c.i("bias", 1);
  std::vector<std::string> names = {"in", "w"};
  if (bias) names.push_back("b");
  return per_input(c, "linear", names, [=](Rand& rng) {
    struct S { Vec x, w, b, dx, dw, db; };
    auto s = hold<S>();
    s->x = rng.vec((size_t)M * I), s->w = rng.vec((size_t)I * O), s->b = rng.vec(O);
    GradientOp g;
    g.inputs = {{"in", &s->x, &s->dx}, {"w", &s->w, &s->dw}, {"b", &s->b, &s->db}};
    g.out_size = (size_t)M * O;
    g.forward = [=](Vec& out) { cpu::linear_forward(out.data(), s->x.data(), s->w.data(), bias ? s->b.data() : nullptr, M, I, O); };
    g.backward = [=](const Vec& d) {
      cpu::linear_backward(s->dx.data(), s->dw.data(), bias ? s->db.data() : nullptr, d.data(), s->x.data(), s->w.data(), M, I, O);
    };
    return g;
  });
}

inline std::vector<std::pair<std::string, CheckFn>> layernorm_checks(const Case& c) {
  const int M = c.i("M", 5), D = c.i("D", 9);
  const double offset = c.d("offset", 0.0);  // inputs far from zero mean: the mean term matters more
  return per_input(c, "layernorm", {"in", "g", "b"}, [=](Rand& rng) {
    struct S { Vec x, g, b, mean, rstd, dx, dg, db; };
    auto s = hold<S>();
    s->x = rng.vec((size_t)M * D, 2.0), s->g = rng.vec(D), s->b = rng.vec(D);
    for (auto& v : s->x) v += offset;
    s->mean.resize(M), s->rstd.resize(M);
    GradientOp g;
    g.inputs = {{"in", &s->x, &s->dx}, {"g", &s->g, &s->dg}, {"b", &s->b, &s->db}};
    g.out_size = (size_t)M * D;
    g.forward = [=](Vec& out) {
      cpu::layernorm_forward(out.data(), s->mean.data(), s->rstd.data(), s->x.data(), s->g.data(), s->b.data(), M, D, 1e-6);
    };
    g.backward = [=](const Vec& d) {
      cpu::layernorm_backward(s->dx.data(), s->dg.data(), s->db.data(), d.data(), s->x.data(), s->g.data(), s->mean.data(),
                              s->rstd.data(), M, D);
    };
    return g;
  });
}

inline std::vector<std::pair<std::string, CheckFn>> attention_checks(const Case& c) {
  const int B = c.i("B", 2), Lq = c.i("Lq", 5), Lk = c.i("Lk", 7), H = c.i("H", 3), D = H * c.i("Dk", 3);
  const bool causal = c.i("causal", 0), empty_row = c.i("empty_row", 0);
  const double p = c.d("p", 0.0);
  return per_input(c, "attention", {"q", "k", "v"}, [=](Rand& rng) {
    struct S { Vec q, k, v, p, dq, dk, dv; std::vector<uint8_t> valid; };
    auto s = hold<S>();
    s->q = rng.vec((size_t)B * Lq * D, 1.5), s->k = rng.vec((size_t)B * Lk * D, 1.5), s->v = rng.vec((size_t)B * Lk * D);
    s->p.resize((size_t)B * H * Lq * Lk);
    s->valid = random_mask(rng, B, Lk, 0.7);
    for (int b = 0; b < B; ++b) s->valid[(size_t)b * Lk] = 1;  // causal rows need their first key
    if (empty_row)
      for (int j = 0; j < Lk; ++j) s->valid[(size_t)(B - 1) * Lk + j] = 0;
    const DropoutKey drop = dropout_key(7, 3, 11, p);
    GradientOp g;
    g.inputs = {{"q", &s->q, &s->dq}, {"k", &s->k, &s->dk}, {"v", &s->v, &s->dv}};
    g.out_size = (size_t)B * Lq * D;
    g.forward = [=](Vec& out) {
      cpu::attention_forward(out.data(), s->p.data(), s->q.data(), s->k.data(), s->v.data(), s->valid.data(), causal, drop, B, Lq, Lk,
                             D, H);
    };
    g.backward = [=](const Vec& d) {
      cpu::attention_backward(s->dq.data(), s->dk.data(), s->dv.data(), d.data(), s->p.data(), s->q.data(), s->k.data(), s->v.data(),
                              drop, B, Lq, Lk, D, H);
    };
    return g;
  });
}

inline std::vector<std::pair<std::string, CheckFn>> multihead_checks(const Case& c) {
  const bool self = c.i("self", 0);
  const int B = c.i("B", 2), Lq = c.i("Lq", 5), Lk = self ? Lq : c.i("Lk", 6), H = c.i("H", 3), D = H * c.i("Dk", 3);
  const double p = c.d("p", 0.0);
  std::vector<std::string> names = {"xq", "wq", "wk", "wv", "wo"};
  if (!self) names.push_back("xkv");
  return per_input(c, "multihead_attention", names, [=](Rand& rng) {
    struct S { Vec xq, xkv, wq, wk, wv, wo, dxq, dxkv, gq, gk, gv, go, a[5], t[4]; std::vector<uint8_t> valid; };
    auto s = hold<S>();
    s->xq = rng.vec((size_t)B * Lq * D), s->xkv = rng.vec((size_t)B * Lk * D);
    s->wq = rng.vec((size_t)D * D, 0.6), s->wk = rng.vec((size_t)D * D, 0.6), s->wv = rng.vec((size_t)D * D, 0.6),
    s->wo = rng.vec((size_t)D * D, 0.6);
    const size_t q = (size_t)B * Lq * D, k = (size_t)B * Lk * D;
    s->a[0].resize(q), s->a[1].resize(k), s->a[2].resize(k), s->a[3].resize((size_t)B * H * Lq * Lk), s->a[4].resize(q);
    s->t[0].resize(q), s->t[1].resize(k), s->t[2].resize(k), s->t[3].resize(q);
    s->valid = random_mask(rng, B, Lk, 0.7);
    for (int b = 0; b < B; ++b) s->valid[(size_t)b * Lk] = 1;
    const DropoutKey drop = dropout_key(1, 2, 3, p);
    auto acts = [s] { return AttentionActs<double>{s->a[0].data(), s->a[1].data(), s->a[2].data(), s->a[3].data(), s->a[4].data()}; };
    auto w = [s] { return AttentionWeights<double>{s->wq.data(), s->wk.data(), s->wv.data(), s->wo.data()}; };
    GradientOp g;
    g.inputs = {{"xq", &s->xq, &s->dxq}, {"xkv", &s->xkv, &s->dxkv}, {"wq", &s->wq, &s->gq},
                {"wk", &s->wk, &s->gk},  {"wv", &s->wv, &s->gv},     {"wo", &s->wo, &s->go}};
    g.out_size = q;
    g.forward = [=](Vec& out) {
      cpu::multihead_attention_forward(out.data(), acts(), s->xq.data(), self ? s->xq.data() : s->xkv.data(), w(), s->valid.data(),
                                       self, drop, B, Lq, Lk, D, H);
    };
    g.backward = [=](const Vec& d) {
      AttentionWeights<double> dw{s->gq.data(), s->gk.data(), s->gv.data(), s->go.data()};
      AttentionActs<double> scratch{s->t[0].data(), s->t[1].data(), s->t[2].data(), nullptr, s->t[3].data()};
      cpu::multihead_attention_backward(s->dxq.data(), self ? s->dxq.data() : s->dxkv.data(), dw, d.data(), acts(), scratch,
                                        s->xq.data(), self ? s->xq.data() : s->xkv.data(), w(), drop, B, Lq, Lk, D, H);
    };
    return g;
  });
}

inline std::vector<std::pair<std::string, CheckFn>> ffn_checks(const Case& c) {
  const int M = c.i("M", 7), D = c.i("D", 5), F = c.i("F", 11);
  const double p = c.d("p", 0.0);
  return per_input(c, "ffn", {"in", "w1", "b1", "w2", "b2"}, [=](Rand& rng) {
    struct S { Vec x, w1, b1, w2, b2, hpre, h, dh, dx, dw1, db1, dw2, db2; };
    auto s = hold<S>();
    s->x = rng.vec((size_t)M * D), s->w1 = rng.vec((size_t)D * F), s->b1 = rng.vec(F), s->w2 = rng.vec((size_t)F * D),
    s->b2 = rng.vec(D);
    s->hpre.resize((size_t)M * F), s->h.resize((size_t)M * F), s->dh.resize((size_t)M * F);
    const DropoutKey drop = dropout_key(5, 9, 2, p);
    auto w = [s] { return FfnWeights<double>{s->w1.data(), s->b1.data(), s->w2.data(), s->b2.data()}; };
    GradientOp g;
    g.inputs = {{"in", &s->x, &s->dx}, {"w1", &s->w1, &s->dw1}, {"b1", &s->b1, &s->db1}, {"w2", &s->w2, &s->dw2}, {"b2", &s->b2, &s->db2}};
    g.out_size = (size_t)M * D;
    g.forward = [=](Vec& out) { cpu::ffn_forward(out.data(), FfnActs<double>{s->hpre.data(), s->h.data()}, s->x.data(), w(), drop, M, D, F); };
    g.backward = [=](const Vec& d) {
      FfnWeights<double> dw{s->dw1.data(), s->db1.data(), s->dw2.data(), s->db2.data()};
      cpu::ffn_backward(s->dx.data(), dw, s->dh.data(), d.data(), FfnActs<double>{s->hpre.data(), s->h.data()}, s->x.data(), w(), drop, M,
                        D, F);
    };
    return g;
  });
}

inline std::vector<std::pair<std::string, CheckFn>> embedding_checks(const Case& c) {
  const int V = c.i("V", 6), B = c.i("B", 2), L = c.i("L", 5), D = c.i("D", 8);
  return per_input(c, "embedding", {"emb"}, [=](Rand& rng) {
    struct S { Vec emb, demb; std::vector<int> ids; };
    auto s = hold<S>();
    s->emb = rng.vec((size_t)V * D);
    s->ids.resize((size_t)B * L);
    for (auto& id : s->ids) id = rng.below(V);
    if (s->ids.size() > 1) s->ids[1] = s->ids[0];  // a repeated token: its gradients add up
    GradientOp g;
    g.inputs = {{"emb", &s->emb, &s->demb}};
    g.out_size = (size_t)B * L * D;
    g.forward = [=](Vec& out) { cpu::embedding_forward(out.data(), s->ids.data(), s->emb.data(), B, L, D); };
    g.backward = [=](const Vec& d) { cpu::embedding_backward(s->demb.data(), d.data(), s->ids.data(), B, L, D); };
    return g;
  });
}

inline std::vector<std::pair<std::string, CheckFn>> output_projection_checks(const Case& c) {
  const int M = c.i("M", 5), D = c.i("D", 7), V = c.i("V", 9);
  return per_input(c, "output_projection", {"y", "emb"}, [=](Rand& rng) {
    struct S { Vec y, emb, dy, demb; };
    auto s = hold<S>();
    s->y = rng.vec((size_t)M * D), s->emb = rng.vec((size_t)V * D);
    GradientOp g;
    g.inputs = {{"y", &s->y, &s->dy}, {"emb", &s->emb, &s->demb}};
    g.out_size = (size_t)M * V;
    g.forward = [=](Vec& out) { cpu::output_projection_forward(out.data(), s->y.data(), s->emb.data(), M, D, V); };
    g.backward = [=](const Vec& d) {
      cpu::output_projection_backward(s->dy.data(), s->demb.data(), d.data(), s->y.data(), s->emb.data(), M, D, V);
    };
    return g;
  });
}

inline std::vector<std::pair<std::string, CheckFn>> xent_checks(const Case& c) {
  const int M = c.i("M", 7), V = c.i("V", 9), pads = c.i("pads", 2);
  const double eps = c.d("eps", 0.1);
  const LabelSmoothing form = c.s("form", "others") == "uniform" ? LabelSmoothing::uniform_all : LabelSmoothing::others_only;
  return per_input(c, "label_smoothed_xent", {"logits"}, [=](Rand& rng) {
    struct S { Vec z, lse, dz; std::vector<int> tgt; };
    auto s = hold<S>();
    s->z = rng.vec((size_t)M * V, 3.0), s->lse.resize(M);
    s->tgt.resize(M);
    for (auto& t : s->tgt) t = 1 + rng.below(V - 1);
    for (int i = 0; i < pads && i < M; ++i) s->tgt[(size_t)(2 * i + 1) % M] = kPadId;
    GradientOp g;
    g.inputs = {{"logits", &s->z, &s->dz}};
    g.out_size = 1;
    g.forward = [=](Vec& out) { out[0] = cpu::label_smoothed_xent_forward(s->lse.data(), s->z.data(), s->tgt.data(), M, V, eps, form, kPadId); };
    g.backward = [=](const Vec& d) {  // dout is one number: the gradient of d * loss
      Vec gz(s->z.size(), 0.0);
      cpu::label_smoothed_xent_backward(gz.data(), s->z.data(), s->lse.data(), s->tgt.data(), M, V, eps, form, kPadId);
      for (size_t i = 0; i < gz.size(); ++i) s->dz[i] += d[0] * gz[i];
    };
    return g;
  });
}

// The residual connection with the sub-layer's dropout on its own (post-LN: and LayerNorm), and the whole
// model through the sub-layer connections.
inline std::vector<std::pair<std::string, CheckFn>> sublayer_checks(const Case& c) {
  if (c.s("part", "") == "residual") {
    const int M = c.i("M", 3), D = c.i("D", 11);
    const size_t n = (size_t)M * D;
    const DropoutKey drop = dropout_key(3, 1, 4, c.d("p", 0));
    if (c.i("layernorm", 0) == 0)
      return per_input(c, "residual_dropout", {"x", "y"}, [=](Rand& rng) {
        struct S { Vec x, y, dx, dy; };
        auto s = hold<S>();
        s->x = rng.vec(n), s->y = rng.vec(n);
        GradientOp g;
        g.inputs = {{"x", &s->x, &s->dx}, {"y", &s->y, &s->dy}};
        g.out_size = n;
        g.forward = [=](Vec& out) { cpu::residual_dropout_forward(out.data(), s->x.data(), s->y.data(), drop, n); };
        g.backward = [=](const Vec& d) { cpu::residual_dropout_backward(s->dx.data(), s->dy.data(), d.data(), drop, n); };
        return g;
      });
    return per_input(c, "residual_dropout_layernorm", {"x", "y", "g", "b"}, [=](Rand& rng) {
      struct S { Vec x, y, g, b, sum, mean, rstd, dsum, dx, dy, dg, db; };
      auto s = hold<S>();
      s->x = rng.vec(n), s->y = rng.vec(n), s->g = rng.vec(D), s->b = rng.vec(D);
      s->sum.resize(n), s->mean.resize(M), s->rstd.resize(M), s->dsum.resize(n);
      GradientOp g;
      g.inputs = {{"x", &s->x, &s->dx}, {"y", &s->y, &s->dy}, {"g", &s->g, &s->dg}, {"b", &s->b, &s->db}};
      g.out_size = n;
      g.forward = [=](Vec& out) {
        cpu::residual_dropout_layernorm_forward(out.data(), s->sum.data(), s->mean.data(), s->rstd.data(), s->x.data(), s->y.data(),
                                                drop, s->g.data(), s->b.data(), M, D, 1e-6);
      };
      g.backward = [=](const Vec& d) {
        cpu::residual_dropout_layernorm_backward(s->dx.data(), s->dy.data(), s->dg.data(), s->db.data(), s->dsum.data(), d.data(),
                                                 s->sum.data(), s->g.data(), s->mean.data(), s->rstd.data(), drop, M, D);
      };
      return g;
    });
  }
  const bool pre_ln = c.s("part", "") == "model-preln", dropout = c.i("dropout", 0);
  return {{c.text + ": every parameter", [=](Checker& ck) {
             Rand rng{(uint64_t)c.i("seed", 1) * 7919u + 17u};
             check_model(ck, rng, pre_ln, dropout);
           }}};
}

// ---- CUDA kernel tasks: the GPU path on the emulated GPU against the CPU definition, in fp32 -------------

// A host vector and its device copy; outputs start as NaN so that an element the kernel never writes fails.
struct DeviceVec {
  std::vector<float> h;
  float* d;
  explicit DeviceVec(std::vector<float> v) : h(std::move(v)), d(gpu::alloc(h.size())) { gpu::upload(d, h.data(), h.size()); }
  explicit DeviceVec(size_t n) : h(n), d(gpu::alloc(n)) { gpu::fill(d, NAN, n); }
  DeviceVec(const DeviceVec&) = delete;
  ~DeviceVec() { gpu::release(d); }
  std::vector<float> get() const {
    std::vector<float> o(h.size());
    gpu::synchronize();
    gpu::download(o.data(), d, o.size());
    return o;
  }
};
inline std::vector<float> fvec(Rand& rng, size_t n, double lo, double hi) {
  std::vector<float> v(n);
  for (float& x : v) x = (float)rng.uniform(lo, hi);
  return v;
}
inline Vec dvec(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }
// The fp32 kernel against the CPU definition run in double on the same inputs: relative 1e-5 with an
// absolute floor of 1e-5 (the values are O(1); fp32 sums over 1000 elements that nearly cancel are good to
// a few 1e-7, and a wrong kernel is off by far more).
inline void compare_floats(Checker& ck, const std::string& what, const std::vector<float>& got, const Vec& want) {
  for (size_t i = 0; i < want.size(); ++i)
    if (!ck.close(got[i], want[i], 1e-5, 1e-5, (what + "[" + std::to_string(i) + "]").c_str())) return;
}

inline std::vector<std::pair<std::string, CheckFn>> layernorm_kernel_checks(const Case& c) {
  const int M = c.i("M", 5), D = c.i("D", 9);
  const double offset = c.d("offset", 0.0);
  std::vector<std::pair<std::string, CheckFn>> out;
  for (const char* output : {"out", "mean", "rstd"})
    out.push_back({c.text + ": " + output, [=](Checker& ck) {
                     Rand rng{(uint64_t)c.i("seed", 1) * 7919u + 17u};
                     DeviceVec in(fvec(rng, (size_t)M * D, offset - 2, offset + 2)), g(fvec(rng, D, -1, 1)), b(fvec(rng, D, -1, 1));
                     DeviceVec y((size_t)M * D), mean(M), rstd(M);
                     Vec y_cpu(y.h.size()), mean_cpu(M), rstd_cpu(M), in_d = dvec(in.h), g_d = dvec(g.h), b_d = dvec(b.h);
                     cpu::layernorm_forward(y_cpu.data(), mean_cpu.data(), rstd_cpu.data(), in_d.data(), g_d.data(), b_d.data(), M, D, 1e-6);
                     gpu::layernorm_forward(y.d, mean.d, rstd.d, in.d, g.d, b.d, M, D, 1e-6);
                     const std::string o = output;
                     if (o == "out") compare_floats(ck, "out", y.get(), y_cpu);
                     if (o == "mean") compare_floats(ck, "mean", mean.get(), mean_cpu);
                     if (o == "rstd") compare_floats(ck, "rstd", rstd.get(), rstd_cpu);
                   }});
  return out;
}

inline std::vector<std::pair<std::string, CheckFn>> attention_kernel_checks(const Case& c) {
  const int B = c.i("B", 2), Lq = c.i("Lq", 5), Lk = c.i("Lk", 7), H = c.i("H", 2), D = H * c.i("Dk", 4);
  const bool causal = c.i("causal", 0), empty_row = c.i("empty_row", 0);
  const double p = c.d("p", 0.0);
  std::vector<std::pair<std::string, CheckFn>> out;
  for (const char* output : {"ctx", "p"})
    out.push_back({c.text + ": " + output, [=](Checker& ck) {
                     Rand rng{(uint64_t)c.i("seed", 1) * 7919u + 17u};
                     DeviceVec q(fvec(rng, (size_t)B * Lq * D, -1.5, 1.5)), k(fvec(rng, (size_t)B * Lk * D, -1.5, 1.5)),
                         v(fvec(rng, (size_t)B * Lk * D, -1, 1));
                     std::vector<uint8_t> valid = random_mask(rng, B, Lk, 0.7);
                     for (int s = 0; s < B; ++s) valid[(size_t)s * Lk] = 1;
                     if (empty_row)
                       for (int j = 0; j < Lk; ++j) valid[(size_t)(B - 1) * Lk + j] = 0;
                     uint8_t* dvalid = gpu::alloc_bytes(valid.size());
                     gpu::upload(dvalid, valid.data(), valid.size());
                     const DropoutKey drop = dropout_key(7, 3, 11, p);
                     DeviceVec ctx((size_t)B * Lq * D), pr((size_t)B * H * Lq * Lk);
                     Vec ctx_cpu(ctx.h.size()), p_cpu(pr.h.size()), q_d = dvec(q.h), k_d = dvec(k.h), v_d = dvec(v.h);
                     cpu::attention_forward(ctx_cpu.data(), p_cpu.data(), q_d.data(), k_d.data(), v_d.data(), valid.data(), causal, drop, B, Lq,
                                            Lk, D, H);
                     gpu::attention_forward(ctx.d, pr.d, q.d, k.d, v.d, dvalid, causal, drop, B, Lq, Lk, D, H);
                     if (std::string(output) == "ctx") compare_floats(ck, "ctx", ctx.get(), ctx_cpu);
                     else compare_floats(ck, "p", pr.get(), p_cpu);
                     gpu::release(dvalid);
                   }});
  return out;
}

// ---- snapshot tasks: outputs compared with the solution's ---------------------------------------------

inline Outputs positional_encoding_outputs(const Case& c) {
  const int L = c.i("L", 9), D = c.i("D", 8), pos0 = c.i("pos0", 0);
  std::vector<double> v;
  for (int pos = pos0; pos < pos0 + L; ++pos)
    for (int i = 0; i < D; ++i) v.push_back(positional_encoding(pos, i, D));
  return {{"PE", nums(v.begin(), v.end())}};
}

inline Outputs learning_rate_outputs(const Case& c) {
  const int D = c.i("D", 512), warmup = c.i("warmup", 4000);
  const double scale = c.d("scale", 1.0);
  std::vector<double> v;
  for (long step : {1L, 2L, 10L, (long)warmup / 2, (long)warmup - 1, (long)warmup, (long)warmup + 1, 2L * warmup, 100000L})
    v.push_back(learning_rate(step, D, warmup, scale));
  return {{"lrate", nums(v.begin(), v.end())}};
}

inline Outputs adam_outputs(const Case& c) {
  const int n = c.i("n", 37), steps = c.i("steps", 1), t0 = c.i("t", 1);
  const double lr = c.d("lr", 1e-3), b1 = c.d("beta1", 0.9), b2 = c.d("beta2", 0.98), eps = c.d("eps", 1e-9);
  Rand rng{(uint64_t)c.i("seed", 1)};
  Vec p = rng.vec(n), m = rng.vec(n, 0.01), v = rng.vec(n, 0.01);
  for (auto& x : v) x = std::fabs(x);  // second moments are never negative
  if (t0 == 1) std::fill(m.begin(), m.end(), 0.0), std::fill(v.begin(), v.end(), 0.0);  // a fresh optimizer
  for (int s = 0; s < steps; ++s) {
    Vec g = rng.vec(n);
    if (s == 0 && n > 0) g[0] = 0;  // a zero gradient still moves a parameter with momentum
    cpu::adam_update(p.data(), g.data(), m.data(), v.data(), (size_t)n, lr, b1, b2, eps, (long)t0 + s);
  }
  return {{"params", nums(p.begin(), p.end())}, {"m", nums(m.begin(), m.end())}, {"v", nums(v.begin(), v.end())}};
}

// A small random model with peaky outputs, in double, and random sources: what the decoding tasks run.
inline std::unique_ptr<Transformer<double>> decoding_model(const Case& c) {
  Config cfg = config_preset("tiny");
  cfg.N = 2, cfg.D = 16, cfg.F = 24, cfg.H = 2, cfg.V = c.i("V", 13), cfg.max_len = 40, cfg.pre_ln = c.i("pre_ln", 0);
  auto m = std::make_unique<Transformer<double>>(cfg, (uint64_t)c.i("seed", 1));
  Rand rng{(uint64_t)c.i("seed", 1) + 500};
  for (auto& p : m->params) p += rng.uniform(-0.5, 0.5);  // far from initialisation: outputs depend on the source
  for (int d = 0; d < cfg.D; ++d) m->W.emb[(size_t)kEosId * cfg.D + d] *= c.d("eos", 1.5);  // sentences end
  return m;
}
inline std::vector<std::vector<int>> decoding_sources(const Case& c, int V) {
  Rand rng{(uint64_t)c.i("seed", 1) + 1000};
  std::vector<std::vector<int>> src(c.i("B", 3));
  for (auto& s : src) {
    s.resize(1 + rng.below(c.i("max_src", 6)));
    for (int& id : s) id = 4 + rng.below(V - 4);
  }
  return src;
}
inline std::vector<std::string> hypothesis_words(const Hypothesis& h) {
  std::vector<std::string> w = {"finished=" + std::to_string(h.finished), "logprob", num(h.logprob), "score", num(h.score), "tokens"};
  for (int t : h.tokens) w.push_back(std::to_string(t));
  return w;
}

inline Outputs greedy_outputs(const Case& c) {
  auto m = decoding_model(c);
  auto src = decoding_sources(c, m->cfg.V);
  auto hyps = greedy_decode(*m, src, c.i("max_extra", 5));
  Outputs out;
  for (size_t b = 0; b < hyps.size(); ++b) out.push_back({"sentence " + std::to_string(b), hypothesis_words(hyps[b])});
  return out;
}

inline Outputs beam_outputs(const Case& c) {
  auto m = decoding_model(c);
  auto src = decoding_sources(c, m->cfg.V);
  DecodeOptions opt;
  opt.beam = c.i("beam", 4), opt.alpha = c.d("alpha", 0.6), opt.max_extra = c.i("max_extra", 5), opt.n_best = c.i("n_best", 2);
  auto lists = beam_search(*m, src, opt);
  Outputs out;
  for (size_t b = 0; b < lists.size(); ++b) {
    std::vector<std::string> w = {"hypotheses", std::to_string(lists[b].size())};
    for (const Hypothesis& h : lists[b]) {
      auto hw = hypothesis_words(h);
      w.insert(w.end(), hw.begin(), hw.end());
      w.push_back("|");
    }
    out.push_back({"sentence " + std::to_string(b), w});
  }
  return out;
}

// Training text for BPE: number words (English and German), or a fixed multilingual sample.
inline std::vector<std::string> bpe_corpus(const Case& c) {
  const std::string which = c.s("corpus", "numbers");
  if (which == "numbers") {
    NumberCorpus nc = number_corpus((uint64_t)c.i("seed", 1), c.i("lines", 200), 0, 0);
    std::vector<std::string> lines;
    for (const auto& p : nc.train) lines.push_back(p.en), lines.push_back(p.de);
    return lines;
  }
  if (which == "mixed")
    return {"A man in a blue shirt is riding a bike.", "Ein Mann in einem blauen Hemd fährt Fahrrad.",
            "Two dogs play in the snow; one dog runs.", "Zwei Hunde spielen im Schnee, ein Hund rennt.",
            "Die Straße ist naß — 3 Kinder spielen.", "Café, crème brûlée and naïve résumés.",
            "A woman sings: \"la la la\" at 10:30 pm.", "Eine Frau singt um 22:30 Uhr.", "ÄÖÜ äöü ß ẞ", "emoji 🙂🙂 and 🙂"};
  if (which == "ties") return {"ab cd ef", "ab cd ef", "ba dc fe", "ba dc fe"};  // equal counts: ties by text
  throw std::runtime_error("case '" + c.text + "': corpus is numbers, mixed or ties");
}

inline Outputs bpe_outputs(const Case& c) {
  const std::vector<std::string> lines = bpe_corpus(c);
  const Tokenizer t = Tokenizer::learn(lines, c.i("merges", 50));
  std::vector<std::string> vocab, ids;
  for (int i = 0; i < t.vocab_size(); ++i) vocab.push_back(hex(t.piece(i)));
  for (const std::string& line : {std::string("three hundred and twenty-four"), std::string("dreihundertvierundzwanzig"),
                                  std::string("Ein Mann fährt Fahrrad."), lines.empty() ? std::string() : lines.back()})
    for (int id : t.encode(line)) ids.push_back(std::to_string(id));
  return {{"merges", {std::to_string(t.merge_count())}}, {"vocabulary", vocab}, {"encoded", ids}};
}

inline std::vector<std::pair<std::string, std::string>> bleu_pairs(const Case& c) {
  const std::string set = c.s("set", "basic");
  if (set == "basic")
    return {{"the cat is on the mat", "the cat sat on the mat"},
            {"the the the the the the the", "the cat is on the mat"},  // clipping: "the" matches twice
            {"", "a reference with words"},
            {"It is a guide to action which ensures that the military always obeys the commands of the party.",
             "It is a guide to action that ensures that the military will forever heed Party commands."},
            {"one two three four five", "one two three four five"},
            {"a a a b b", "a b a b a"}};
  if (set == "tokenised")  // 13a splits punctuation off words; numbers keep their points and commas
    return {{"Hello, world! It costs $3.50 (or 1,000 yen).", "Hello world! It costs $3.50, or 1,000 yen."},
            {"Ein Mann fährt ein rotes Fahrrad.", "Ein Mann fährt Fahrrad."},
            {"well-known 2-3 e.g. U.S.A.", "well - known 2 - 3 e.g. U.S.A."}};
  if (set == "random") {  // sentences over a small vocabulary: many repeated n-grams
    Rand rng{(uint64_t)c.i("seed", 1)};
    const char* words[] = {"a", "b", "c", "d", "the", "cat"};
    auto sentence = [&] {
      std::string s;
      for (int n = rng.below(c.i("len", 12)); n > 0; --n) s += std::string(s.empty() ? "" : " ") + words[rng.below(6)];
      return s;
    };
    std::vector<std::pair<std::string, std::string>> out;
    for (int i = c.i("n", 8); i > 0; --i) out.push_back({sentence(), sentence()});
    return out;
  }
  throw std::runtime_error("case '" + c.text + "': set is basic, tokenised or random");
}

inline Outputs bleu_outputs(const Case& c) {
  const bool lowercase = c.i("lowercase", 0);
  Outputs out;
  std::vector<std::string> hyps, refs;
  int k = 0;
  for (const auto& [h, r] : bleu_pairs(c)) {
    const BleuStatistics st = bleu_statistics(h, r, lowercase);
    std::vector<std::string> w = {"len", std::to_string(st.hyp_len), std::to_string(st.ref_len), "matches"};
    for (long x : st.matches) w.push_back(std::to_string(x));
    w.push_back("totals");
    for (long x : st.totals) w.push_back(std::to_string(x));
    out.push_back({"pair " + std::to_string(k++), w});
    hyps.push_back(h), refs.push_back(r);
  }
  out.push_back({"corpus BLEU", {num(corpus_bleu(hyps, refs, lowercase).score)}});
  return out;
}

// ---- the task table: the order of the grade table ------------------------------------------------------

inline const std::vector<Task>& tasks() {
  static const std::vector<Task> all = [] {
    std::vector<Task> t;
    auto grad = [&](const char* id, std::vector<std::string> deps, std::vector<std::string> cases,
                    std::function<std::vector<std::pair<std::string, CheckFn>>(const Case&)> f) {
      Task k;
      k.id = id, k.depends = std::move(deps), k.cases = std::move(cases), k.checks = std::move(f);
      t.push_back(k);
    };
    auto snap = [&](const char* id, std::vector<std::string> deps, std::vector<std::string> cases, std::function<Outputs(const Case&)> f,
                    double tol) {
      Task k;
      k.id = id, k.depends = std::move(deps), k.cases = std::move(cases), k.outputs = std::move(f), k.tol = tol;
      t.push_back(k);
    };
    grad("embedding_backward", {"positional_encoding"}, {"V=6 B=2 L=5 D=8 seed=1", "V=3 B=3 L=4 D=6 seed=2"}, embedding_checks);
    grad("linear_backward", {}, {"M=7 I=5 O=3 bias=1 seed=1", "M=4 I=6 O=9 bias=0 seed=2", "M=3 I=2 O=70 bias=1 seed=3"}, linear_checks);
    grad("attention_backward", {},
         {"B=3 Lq=5 Lk=7 H=3 Dk=3 causal=0 empty_row=1 seed=1", "B=2 Lq=7 Lk=7 H=3 Dk=5 causal=1 seed=2",
          "B=2 Lq=5 Lk=5 H=1 Dk=3 causal=1 p=0.3 seed=3"},
         attention_checks);
    grad("multihead_attention_backward", {"linear_backward", "attention_backward"},
         {"self=0 B=2 Lq=5 Lk=6 H=3 Dk=3 seed=1", "self=1 B=2 Lq=5 H=3 Dk=3 p=0.2 seed=2"}, multihead_checks);
    grad("ffn_backward", {"linear_backward"}, {"M=7 D=5 F=11 p=0 seed=1", "M=4 D=6 F=9 p=0.25 seed=2"}, ffn_checks);
    grad("layernorm_backward", {}, {"M=5 D=9 seed=1", "M=3 D=70 offset=3 seed=2"}, layernorm_checks);
    grad("sublayer_connection_backward",
         {"embedding_backward", "linear_backward", "attention_backward", "multihead_attention_backward", "ffn_backward",
          "layernorm_backward", "output_projection_backward", "label_smoothed_xent_backward", "positional_encoding"},
         {"part=residual M=3 D=11 p=0.4 seed=1", "part=residual layernorm=1 M=3 D=11 p=0.4 seed=3", "part=model-postln seed=1",
          "part=model-preln seed=2"},
         sublayer_checks);
    grad("output_projection_backward", {}, {"M=5 D=7 V=9 seed=1", "M=3 D=4 V=70 seed=2"}, output_projection_checks);
    grad("label_smoothed_xent_backward", {},
         {"M=7 V=9 eps=0.1 form=others pads=2 seed=1", "M=6 V=11 eps=0.2 form=uniform pads=1 seed=2", "M=3 V=5 eps=0 pads=0 seed=3"},
         xent_checks);
    snap("adam_update", {}, {"n=37 t=1 steps=1 seed=1", "n=37 t=1 steps=3 seed=2", "n=20 t=100 steps=2 lr=0.01 beta2=0.999 seed=3"},
         adam_outputs, 1e-12);
    snap("learning_rate", {}, {"D=512 warmup=4000 scale=1", "D=256 warmup=100 scale=2", "D=1024 warmup=8000 scale=0.5"},
         learning_rate_outputs, 1e-12);
    snap("positional_encoding", {}, {"L=9 D=8", "L=4 D=512 pos0=100", "L=3 D=10 pos0=5000"}, positional_encoding_outputs, 1e-12);
    snap("greedy_decode", {"positional_encoding"}, {"seed=1 B=1", "seed=2 B=4 max_extra=3", "seed=3 B=3 pre_ln=1 max_extra=8"},
         greedy_outputs, 1e-9);
    snap("beam_search", {"positional_encoding"},
         {"seed=1 B=3 beam=4 alpha=0.6 n_best=2", "seed=2 B=2 beam=1 alpha=0 n_best=1", "seed=3 B=3 beam=5 alpha=1.5 n_best=3 max_extra=2",
          "seed=4 B=2 beam=3 alpha=0 n_best=3 max_extra=8"},
         beam_outputs, 1e-9);
    snap("bpe_learn", {}, {"corpus=numbers lines=150 merges=60 seed=1", "corpus=mixed merges=40", "corpus=ties merges=3", "corpus=ties merges=50"},
         bpe_outputs, 0);
    snap("bleu_statistics", {}, {"set=basic", "set=basic lowercase=1", "set=tokenised", "set=random n=10 seed=1"}, bleu_outputs, 1e-12);
    grad("layernorm_kernel", {}, {"M=5 D=9 seed=1", "M=3 D=300 seed=2", "M=2 D=1000 offset=3 seed=3"}, layernorm_kernel_checks);
    grad("attention_kernel", {},
         {"B=2 Lq=5 Lk=7 H=2 Dk=4 seed=1 empty_row=1", "B=2 Lq=6 Lk=6 H=3 Dk=5 causal=1 seed=2", "B=1 Lq=4 Lk=4 H=2 Dk=3 causal=1 p=0.3 seed=3",
          "B=1 Lq=3 Lk=300 H=1 Dk=80 seed=4"},
         attention_kernel_checks);
    return t;
  }();
  return all;
}

inline const Task* find_task(const std::string& id) {
  for (const Task& t : tasks())
    if (t.id == id) return &t;
  return nullptr;
}

// ---- snapshots: "CASE<TAB>OUTPUT<TAB>words" lines, one file per task -------------------------------------

using Snapshot = std::map<std::pair<std::string, std::string>, std::vector<std::string>>;  // (case, output) -> words

inline Snapshot read_snapshot(const std::string& path) {
  Snapshot s;
  std::ifstream in(path);
  if (!in) return s;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const size_t a = line.find('\t'), b = a == std::string::npos ? a : line.find('\t', a + 1);
    if (b == std::string::npos) throw std::runtime_error(path + " line " + std::to_string(n) + ": not CASE<TAB>OUTPUT<TAB>values");
    std::istringstream words(line.substr(b + 1));
    std::vector<std::string> w;
    std::string x;
    while (words >> x) w.push_back(x);
    s[{line.substr(0, a), line.substr(a + 1, b - a - 1)}] = w;
  }
  return s;
}

inline void write_snapshot(std::ostream& out, const std::string& case_text, const Outputs& outputs) {
  for (const auto& [name, words] : outputs) {
    out << case_text << '\t' << name << '\t';
    for (size_t i = 0; i < words.size(); ++i) out << (i ? " " : "") << words[i];
    out << '\n';
  }
}

// Compares one output with its snapshot: numbers within tol (relative, absolute floor tol), words exactly.
inline void compare_words(Checker& ck, const std::string& what, const std::vector<std::string>& got,
                          const std::vector<std::string>& want, double tol) {
  if (!ck.expect(got.size() == want.size(), "%s: %zu values, expected %zu", what.c_str(), got.size(), want.size())) return;
  for (size_t i = 0; i < want.size(); ++i) {
    char* end = nullptr;
    const double w = std::strtod(want[i].c_str(), &end);
    const bool number = tol > 0 && end != want[i].c_str() && !*end;
    const std::string at = what + " [" + std::to_string(i) + "]";
    if (number) {
      const double g = std::strtod(got[i].c_str(), &end);
      if (!ck.close(end != got[i].c_str() && !*end ? g : NAN, w, tol, tol, at.c_str())) return;
    } else if (!ck.expect(got[i] == want[i], "%s: got '%s', expected '%s'", at.c_str(), got[i].c_str(), want[i].c_str())) {
      return;  // one message per output: the first difference
    }
  }
}

// ---- what the grader runs ---------------------------------------------------------------------------------

struct Check {
  std::string name;
  bool hidden;
  CheckFn run;
};

// The cases of a task: visible ones, then (hidden) those of HIDDEN/cases.txt.
inline std::vector<std::pair<std::string, bool>> task_cases(const Task& t, const std::string& hidden_dir) {
  std::vector<std::pair<std::string, bool>> out;
  for (const std::string& c : t.cases) out.push_back({c, false});
  if (hidden_dir.empty()) return out;
  std::ifstream in(hidden_dir + "/cases.txt");
  if (!in) throw std::runtime_error(hidden_dir + "/cases.txt: cannot read (a hidden folder holds cases.txt and snapshots/)");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string id;
    words >> id;
    if (!find_task(id)) throw std::runtime_error(hidden_dir + "/cases.txt: unknown task '" + id + "'");
    if (id != t.id) continue;
    std::string rest;
    std::getline(words, rest);
    rest.erase(0, rest.find_first_not_of(' '));
    Case parsed(rest);  // refuses a malformed case here, before anything runs
    out.push_back({rest, true});
  }
  return out;
}

// The checks of a task, named, in order. Snapshot tasks take their output names from the snapshot.
inline std::vector<Check> task_checks(const Task& t, const std::string& snapshot_dir, const std::string& hidden_dir) {
  std::vector<Check> out;
  const Snapshot visible = t.outputs ? read_snapshot(snapshot_dir + "/" + t.id + ".txt") : Snapshot{};
  const Snapshot hidden = t.outputs && !hidden_dir.empty() ? read_snapshot(hidden_dir + "/snapshots/" + t.id + ".txt") : Snapshot{};
  // the outputs of a case are computed once, by the first check that needs them
  auto cache = std::make_shared<std::map<std::string, std::pair<Outputs, std::string>>>();
  for (const auto& [text, is_hidden] : task_cases(t, hidden_dir)) {
    const Case c(text);
    if (t.checks) {
      for (auto& [name, fn] : t.checks(c)) out.push_back({name, is_hidden, fn});
      continue;
    }
    std::vector<std::pair<std::string, std::vector<std::string>>> expected;
    for (const auto& [key, words] : is_hidden ? hidden : visible)
      if (key.first == text) expected.push_back({key.second, words});
    if (expected.empty()) {
      out.push_back({text + ": expected values", is_hidden, [text = text](Checker& ck) {
                       ck.expect(false, "no snapshot for case '%s' (the solution writes them: make snapshots)", text.c_str());
                     }});
      continue;
    }
    for (const auto& output : expected)
      out.push_back({text + ": " + output.first, is_hidden, [=, &t](Checker& ck) {
                       const std::string& name = output.first;
                       const std::vector<std::string>& want = output.second;
                       auto it = cache->find(c.text);
                       if (it == cache->end()) {
                         std::pair<Outputs, std::string> r;
                         try {
                           r.first = t.outputs(c);
                         } catch (const std::exception& e) {
                           r.second = e.what();
                         }
                         it = cache->emplace(c.text, r).first;
                       }
                       if (!it->second.second.empty()) throw std::runtime_error(it->second.second);
                       for (const auto& [got_name, got] : it->second.first)
                         if (got_name == name) return compare_words(ck, name, got, want, t.tol);
                       ck.expect(false, "%s: not among the outputs", name.c_str());
                     }});
  }
  return out;
}

}  // namespace course
