// accumulate: gradient accumulation (accumulate_gradients, [§5.1]). K batches of n tokens give the update of
// one batch of K*n tokens: two batches of different sizes, accumulated, against the same pairs merged into
// one batch (dropout off: a merged batch has other shapes, so other masks), in double (1e-12) and float
// (1e-5): the first step's gradients (relative to the largest), the loss over 10 Adam steps, and the
// parameters after them in 2-norm. Not element by element: where a gradient is rounding noise (about 0 for
// a nearly dead ReLU unit), Adam's step is about lr whatever its size, so two roundings of it move that
// parameter apart by up to 2 lr a step (measured: 1.1e-5 of the largest parameter in float after 10
// steps, 3.2e-7 in 2-norm). A step of one batch is bit for bit a step
// without accumulation, its loss included. Each batch of a step has its own dropout masks. The comparison can fail: the wrong
// normalisation (the mean of the batches' mean losses) is rejected by it.
//
//   accumulate                          the checks above
//   accumulate --compare A.bin B.bin    two checkpoints' parameters within 1e-6 relative (test/data_parallel.sh)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../transformer.h"
#include "check.h"

template <typename T> static double max_rel_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff = std::max(diff, std::fabs((double)a[i] - (double)b[i])), scale = std::max(scale, std::fabs((double)b[i]));
  return scale > 0 ? diff / scale : diff;
}

template <typename T> static double l2_rel_diff(const std::vector<T>& a, const std::vector<T>& b) {
  double diff2 = 0, norm2 = 0;
  for (size_t i = 0; i < a.size(); ++i) diff2 += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), norm2 += (double)b[i] * b[i];
  return norm2 > 0 ? std::sqrt(diff2 / norm2) : std::sqrt(diff2);
}

static Batch batch_of(const std::vector<std::vector<int>>& src, const std::vector<std::vector<int>>& tgt, size_t from, size_t to) {
  std::vector<const std::vector<int>*> s, t;
  for (size_t i = from; i < to; ++i) s.push_back(&src[i]), t.push_back(&tgt[i]);
  return make_batch(s, t);
}

template <typename T> static void equivalence(Checker& ck, const char* type, double tol) {
  Config c = config_preset("tiny");
  c.V = 40, c.N = 2, c.p_drop = c.p_attn = c.p_relu = 0, c.warmup = 400;  // steps 1-10 at lrate 1.6e-5 to 1.6e-4 [Eq. 3]
  // 7 pairs of different lengths: batch A holds 3 (fewer target tokens), batch B 4
  uint64_t state = 11;
  std::vector<std::vector<int>> src(7), tgt(7);
  for (int i = 0; i < 7; ++i) {
    src[i].resize(3 + i % 4), tgt[i].resize(2 + (i * 5) % 7);
    for (int& x : src[i]) x = 4 + (int)(mix64(state++) % (c.V - 4));
    for (int& x : tgt[i]) x = 4 + (int)(mix64(state++) % (c.V - 4));
  }
  const Batch A = batch_of(src, tgt, 0, 3), B = batch_of(src, tgt, 3, 7), AB = batch_of(src, tgt, 0, 7);
  const long nA = A.target_tokens(), nB = B.target_tokens(), n = AB.target_tokens();
  ck.expect(nA + nB == n && nA != nB, "%s: the batches have %ld and %ld target tokens, the merged one %ld", type, nA, nB, n);

  Transformer<T> acc(c, 5), merged(c, 5), wrong(c, 5);
  std::vector<T> g;
  double worst_loss = 0, first_grads = 0, wrong_grads = 0;
  for (int step = 0; step < 10; ++step) {
    const double l_acc = accumulate_gradients(acc, {&A, &B}, {0, 1}, n);
    const double l_merged = accumulate_gradients(merged, {&AB}, {0}, n);
    worst_loss = std::max(worst_loss, std::fabs(l_acc - l_merged) / std::fabs(l_merged));
    // the wrong normalisation: each batch's mean loss weighted alike
    accumulate_gradients(wrong, {&A}, {0}, nA);
    g = wrong.grads;
    accumulate_gradients(wrong, {&B}, {1}, nB);
    for (size_t i = 0; i < g.size(); ++i) wrong.grads[i] = (g[i] + wrong.grads[i]) / 2;
    if (step == 0)  // later steps compare gradients at parameters that differ by rounding (Adam amplifies it)
      first_grads = max_rel_diff(acc.grads, merged.grads), wrong_grads = max_rel_diff(wrong.grads, merged.grads);
    transformer_update(acc), transformer_update(merged), transformer_update(wrong);
  }
  const double params = max_rel_diff(acc.params, merged.params), params_l2 = l2_rel_diff(acc.params, merged.params),
               wrong_l2 = l2_rel_diff(wrong.params, merged.params);
  std::printf("%s: batches of %ld and %ld target tokens, accumulated vs merged: gradients of the first step %.3g, "
              "loss over 10 steps %.3g, parameters after them %.3g in 2-norm (tol %.0e; element-wise %.3g); the mean "
              "of the batches' mean losses: gradients %.3g, parameters %.3g\n", type, nA, nB, first_grads, worst_loss,
              params_l2, tol, params, wrong_grads, wrong_l2);
  ck.close(worst_loss, 0, tol, tol, (std::string(type) + " loss, accumulated vs merged").c_str());
  ck.close(first_grads, 0, tol, tol, (std::string(type) + " gradients, accumulated vs merged").c_str());
  ck.close(params_l2, 0, tol, tol, (std::string(type) + " parameters (2-norm), accumulated vs merged").c_str());
  ck.expect(wrong_grads > 100 * tol && wrong_l2 > 100 * tol,
            "%s: the comparison does not reject the mean of the batches' mean losses (gradients %.3g, parameters %.3g)", type,
            wrong_grads, wrong_l2);
}

static void one_batch_is_a_plain_step(Checker& ck) {
  Config c = config_preset("tiny");
  c.V = 40, c.N = 1;
  std::vector<std::vector<int>> src = {{5, 6, 7}, {8, 9}}, tgt = {{10, 11}, {12, 13, 14, 15}};
  const Batch b = batch_of(src, tgt, 0, 2);
  Transformer<float> plain(c, 3), acc(c, 3);
  zero_grad(plain);
  const double loss = transformer_forward(plain, b, true);
  transformer_backward(plain, b, true);
  const double share = accumulate_gradients(acc, {&b}, {0}, b.target_tokens());
  ck.expect(acc.grads == plain.grads, "one batch accumulated: the gradients differ from a plain step's");
  ck.expect(share == loss, "one batch accumulated: loss %.17g, a plain step's %.17g", share, loss);
  // micro 1 (a step's second batch) draws other dropout masks than micro 0
  const double second = accumulate_gradients(acc, {&b}, {1}, b.target_tokens());
  ck.expect(second != loss, "the second batch of a step has the first one's dropout masks (loss %.17g both)", loss);
  ck.expect(acc.micro == 0, "accumulate_gradients leaves micro at %d", acc.micro);
}

static int compare(const char* a_path, const char* b_path) {
  Checker ck("accumulate --compare");
  auto a = checkpoint_load(a_path, nullptr), b = checkpoint_load(b_path, nullptr);
  ck.expect(a->step == b->step, "steps %ld and %ld", a->step, b->step);
  ck.expect(a->params.size() == b->params.size(), "%zu and %zu parameters", a->params.size(), b->params.size());
  if (a->params.size() == b->params.size()) {
    double diff2 = 0, norm2 = 0, worst = 0;
    std::string where;
    for (const TensorInfo& t : a->table)
      for (size_t i = t.offset; i < t.offset + t.size; ++i) {
        const double d = std::fabs((double)a->params[i] - b->params[i]);
        diff2 += d * d, norm2 += (double)b->params[i] * b->params[i];
        if (d > worst) worst = d, where = t.name;
      }
    const double rel = std::sqrt(diff2 / norm2);
    std::printf("%s vs %s: parameters differ by %.3g relative (2-norm; tol 1e-06); the largest difference %.3g is in %s\n",
                a_path, b_path, rel, worst, where.c_str());
    ck.close(rel, 0, 1e-6, 1e-6, "parameters");
  }
  return ck.finish();
}

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--compare") try {
      return compare(argv[2], argv[3]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "accumulate --compare: %s\n", e.what());
      return 1;
    }
  if (argc != 1) {
    std::fprintf(stderr, "usage: accumulate [--compare A.bin B.bin]\n");
    return 2;
  }
  Checker ck("accumulate");
  equivalence<double>(ck, "double", 1e-12);
  equivalence<float>(ck, "float", 1e-5);
  one_batch_is_a_plain_step(ck);
  return ck.finish();
}
