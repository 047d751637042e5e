// paper_values: values worked out by hand for the formulas the paper states, so that a convention error
// (an inverted exponent, a cosine on the wrong frequency, a schedule off by its warm-up) cannot hide.
#include <cmath>
#include <vector>

#include "../transformer.h"
#include "check.h"

static void positional_encodings(Checker& ck) {
  // [§3.5] PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D))
  ck.close(positional_encoding(0, 0, 4), 0.0, 1e-15, 1e-15, "PE(0, 0) = sin 0");
  ck.close(positional_encoding(0, 1, 4), 1.0, 1e-15, 1e-15, "PE(0, 1) = cos 0");
  ck.close(positional_encoding(1, 0, 4), 0.8414709848078965, 1e-15, 1e-15, "PE(1, 0) = sin 1");
  ck.close(positional_encoding(1, 1, 4), 0.5403023058681398, 1e-15, 1e-15, "PE(1, 1) = cos 1");
  // D = 4, columns 2 and 3 share the frequency 1 / 10000^(2/4) = 1/100
  ck.close(positional_encoding(1, 2, 4), 0.009999833334166664, 1e-15, 1e-15, "PE(1, 2) = sin(1/100)");
  ck.close(positional_encoding(1, 3, 4), 0.9999500004166653, 1e-15, 1e-15, "PE(1, 3) = cos(1/100)");
  // D = 512: the slowest pair, wavelength 2 pi 10000^(510/512)
  ck.close(positional_encoding(3, 510, 512), 0.00031098987351842704, 1e-12, 1e-15, "PE(3, 510), D = 512");
  ck.close(positional_encoding(3, 511, 512), 0.9999999516426481, 1e-12, 1e-15, "PE(3, 511), D = 512");
}

static void schedule(Checker& ck) {
  // [Eq. 3] lrate = 512^-0.5 min(step^-0.5, step 4000^-1.5)
  ck.close(learning_rate(1, 512, 4000, 1.0), 1.746928107421711e-07, 1e-12, 0, "lrate(step 1)");
  ck.close(learning_rate(4000, 512, 4000, 1.0), 0.0006987712429686843, 1e-12, 0, "lrate(step = warmup), the peak");
  ck.close(learning_rate(16000, 512, 4000, 1.0), 0.00034938562148434214, 1e-12, 0, "lrate(step = 4 warmup) = peak / 2");
  ck.close(learning_rate(4000, 512, 4000, 2.0), 2 * 0.0006987712429686843, 1e-12, 0, "lrate scale factor");
}

static void label_smoothing(Checker& ck) {
  // V = 4, logits log(1, 2, 3, 4): softmax (0.1, 0.2, 0.3, 0.4); target 2; a second row is padding
  const int V = 4;
  std::vector<double> z = {std::log(1.), std::log(2.), std::log(3.), std::log(4.), 5, 6, 7, 8}, lse(2);
  std::vector<int> tgt = {2, kPadId};
  // t2t: q = (0.1/3, 0.1/3, 0.9, 0.1/3); loss = -(0.1/3)(ln .1 + ln .2 + ln .4) - 0.9 ln .3
  double loss = cpu::label_smoothed_xent_forward(lse.data(), z.data(), tgt.data(), 2, V, 0.1, LabelSmoothing::others_only, kPadId);
  ck.close(loss, 1.2445193151367524, 1e-14, 0, "label-smoothed loss, eps/(V-1) form");
  std::vector<double> dz(8, 0.0);
  cpu::label_smoothed_xent_backward(dz.data(), z.data(), lse.data(), tgt.data(), 2, V, 0.1, LabelSmoothing::others_only, kPadId);
  const double want[8] = {0.1 - 0.1 / 3, 0.2 - 0.1 / 3, 0.3 - 0.9, 0.4 - 0.1 / 3, 0, 0, 0, 0};  // p - q; padding: 0
  for (int i = 0; i < 8; ++i) ck.close(dz[i], want[i], 1e-14, 1e-15, "d loss / d logits = p - q");
  // PyTorch: q = (0.025, 0.025, 0.925, 0.025)
  loss = cpu::label_smoothed_xent_forward(lse.data(), z.data(), tgt.data(), 2, V, 0.1, LabelSmoothing::uniform_all, kPadId);
  ck.close(loss, 1.2343826874340484, 1e-14, 0, "label-smoothed loss, eps/V form");
}

static void adam(Checker& ck) {
  // the first bias-corrected Adam step moves every parameter by lr * g / (|g| + eps) = lr sign(g)
  std::vector<double> p = {1.0, -2.0, 0.5}, g = {0.3, -4.0, 1e-3}, m(3, 0.0), v(3, 0.0);
  cpu::adam_update(p.data(), g.data(), m.data(), v.data(), 3, 0.01, 0.9, 0.98, 1e-9, 1);
  ck.close(p[0], 0.99, 1e-9, 0, "Adam step 1, g > 0");
  ck.close(p[1], -1.99, 1e-9, 0, "Adam step 1, g < 0");
  ck.close(p[2], 0.49, 1e-6, 0, "Adam step 1, small g");
}

static void dropout(Checker& ck) {
  // [§5.4] about p of the elements are zeroed and the rest scaled by 1 / (1 - p); the same key gives the
  // same mask, another step another mask
  const size_t n = 1 << 20;
  std::vector<float> x(n, 1.0f), y(n), y2(n);
  cpu::dropout_forward(y.data(), x.data(), dropout_key(1, 5, 9, 0.1), n);
  cpu::dropout_forward(y2.data(), x.data(), dropout_key(1, 6, 9, 0.1), n);
  size_t zeros = 0, differ = 0;
  bool scaled = true;
  for (size_t i = 0; i < n; ++i) {
    zeros += y[i] == 0;
    differ += y[i] != y2[i];
    scaled &= y[i] == 0 || std::fabs(y[i] - 1 / 0.9f) < 1e-6f;
  }
  ck.close((double)zeros / n, 0.1, 0.02, 0, "dropped fraction at p = 0.1 (2^20 draws)");
  ck.expect(scaled, "kept elements are scaled by 1 / (1 - p)");
  ck.close((double)differ / n, 2 * 0.1 * 0.9, 0.02, 0, "masks of two steps are independent");
  // the CPU makes masks a chunk at a time with the widest vector loop it has (dropout_keep_mask): element
  // for element they are dropout_keeps', over a length that ends inside a chunk, for two probabilities
  for (double p : {0.1, 0.3}) {
    const size_t m = (1 << 16) + 123;
    const DropoutKey key = dropout_key(7, 11, 3, p);
    std::vector<float> z(m);
    cpu::dropout_forward(z.data(), x.data(), key, m);
    size_t wrong = 0;
    for (size_t i = 0; i < m; ++i) wrong += (z[i] != 0) != dropout_keeps(key, i);
    ck.expect(wrong == 0, "p = %g: %zu of %zu mask elements differ from dropout_keeps()", p, wrong, m);
  }
}

int main() {
  Checker ck("paper_values");
  positional_encodings(ck);
  schedule(ck);
  label_smoothing(ck);
  adam(ck);
  dropout(ck);
  return ck.finish();
}
