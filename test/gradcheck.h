// What gradcheck and the course grader (course/grade.cpp) share: a seeded random source, the check of one
// forward/backward pair against central finite differences in double, and the check of the whole model.
// The method is described at the top of test/gradcheck.cpp.
#pragma once
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "../transformer.h"
#include "check.h"

using Vec = std::vector<double>;
inline const double kTol = 1e-6, kFloor = 1e-9, kStep = 1e-5;

struct Rand {
  uint64_t s;
  uint64_t next() {  // SplitMix64: mix64 of a counter stepped by the golden ratio
    const uint64_t r = mix64(s);
    s += 0x9E3779B97F4A7C15ull;
    return r;
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * (double)(next() >> 11) / 9007199254740992.0; }
  int below(int n) { return (int)(next() % (uint64_t)n); }
  Vec vec(size_t n, double scale = 1.0) {
    Vec v(n);
    for (auto& x : v) x = uniform(-scale, scale);
    return v;
  }
};

struct Input {
  std::string name;
  Vec* x;  // the values perturbed
  Vec* g;  // where the backward adds the analytic gradient
};

// Checks one forward/backward pair. forward(out) computes the op's output from the current inputs;
// backward(dout) adds the gradients into the inputs' g.
inline void check_pair(Checker& ck, const std::string& op, std::vector<Input> inputs, size_t out_size,
                       const std::function<void(Vec&)>& forward, const std::function<void(const Vec&)>& backward,
                       Rand& rng) {
  Vec out(out_size), R = rng.vec(out_size);
  auto objective = [&] {
    forward(out);
    double s = 0;
    for (size_t i = 0; i < out_size; ++i) s += R[i] * out[i];
    return s;
  };
  objective();
  // The gradients start from random values: a backward must add into them, not overwrite them.
  std::vector<Vec> before;
  for (auto& in : inputs) before.push_back(*in.g = rng.vec(in.x->size()));
  backward(R);
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Input& in = inputs[k];
    for (size_t i = 0; i < in.x->size(); ++i) {
      double x0 = (*in.x)[i];
      auto numeric = [&](double h) {
        (*in.x)[i] = x0 + h;
        double fp = objective();
        (*in.x)[i] = x0 - h;
        double fm = objective();
        (*in.x)[i] = x0;
        return (fp - fm) / (2 * h);
      };
      double num = numeric(kStep), ana = (*in.g)[i] - before[k][i];
      double rel = std::fabs(ana - num) / std::fmax(std::fabs(num), kFloor / kTol);
      if (!(rel <= kTol)) num = numeric(kStep / 10);
      std::string what = op + " d" + in.name + "[" + std::to_string(i) + "]";
      ck.close(ana, num, kTol, kFloor, what.c_str());
    }
  }
  objective();  // leave the op's state as it was
}

inline std::vector<uint8_t> random_mask(Rand& rng, int B, int L, double p_valid) {
  std::vector<uint8_t> m((size_t)B * L);
  for (auto& v : m) v = rng.uniform(0, 1) < p_valid;
  return m;
}

// A batch of B sentence pairs with random lengths, padded; tgt_out is tgt_in shifted left with </s>.
inline Batch random_batch(Rand& rng, int B, int S, int T, int V) {
  Batch b;
  b.B = B, b.S = S, b.T = T;
  b.src.assign((size_t)B * S, kPadId);
  b.tgt_in.assign((size_t)B * T, kPadId);
  b.tgt_out.assign((size_t)B * T, kPadId);
  for (int s = 0; s < B; ++s) {
    int ls = s == 0 ? S : 2 + rng.below(S - 1), lt = s == 0 ? T : 2 + rng.below(T - 1);
    for (int i = 0; i < ls; ++i) b.src[(size_t)s * S + i] = i == ls - 1 ? 3 : 4 + rng.below(V - 4);
    b.tgt_in[(size_t)s * T] = 2;
    for (int i = 1; i < lt; ++i) b.tgt_in[(size_t)s * T + i] = 4 + rng.below(V - 4);
    for (int i = 0; i < lt; ++i) b.tgt_out[(size_t)s * T + i] = i + 1 < lt ? b.tgt_in[(size_t)s * T + i + 1] : 3;
  }
  return b;
}

inline Config tiny_config(bool pre_ln, bool dropout) {
  Config c;
  c.N = 2, c.D = 6, c.F = 7, c.H = 2, c.V = 11, c.max_len = 8, c.pre_ln = pre_ln;
  c.p_drop = dropout ? 0.2 : 0.0;
  c.p_attn = dropout ? 0.15 : 0.0;
  c.p_relu = dropout ? 0.1 : 0.0;
  return c;
}

inline void check_model(Checker& ck, Rand& rng, bool pre_ln, bool dropout) {
  Config c = tiny_config(pre_ln, dropout);
  Transformer<double> m(c, 42);
  m.step = 17;  // dropout masks depend on (seed, step); the step stays fixed while checking
  for (auto& p : m.params) p += rng.uniform(-0.1, 0.1);  // LayerNorm gains and biases off 1 and 0
  Batch batch = random_batch(rng, 3, 7, 6, c.V);
  zero_grad(m);
  transformer_forward(m, batch, dropout);
  transformer_backward(m, batch, dropout);
  std::string tag = std::string("model(") + (pre_ln ? "pre-LN" : "post-LN") + (dropout ? ", dropout)" : ")");
  for (const TensorInfo& t : m.table) {
    for (size_t i = 0; i < t.size; ++i) {
      double& x = m.params[t.offset + i];
      const double x0 = x;
      auto numeric = [&](double h) {
        x = x0 + h;
        double fp = transformer_forward(m, batch, dropout);
        x = x0 - h;
        double fm = transformer_forward(m, batch, dropout);
        x = x0;
        return (fp - fm) / (2 * h);
      };
      double ana = m.grads[t.offset + i], num = numeric(kStep);
      if (!(std::fabs(ana - num) / std::fmax(std::fabs(num), kFloor / kTol) <= kTol)) num = numeric(kStep / 10);
      std::string what = tag + " " + t.name + "[" + std::to_string(i) + "]";
      ck.close(ana, num, kTol, kFloor, what.c_str());
    }
  }
}

