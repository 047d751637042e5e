// decoding: greedy and beam search with K/V caches (§6) against the teacher-forced model.
//  1. the incremental decoder gives the logits of transformer_forward for the same prefix (post-LN and
//     pre-LN, float and double, sources of different lengths padded in one batch);
//  2. cached greedy decoding equals greedy decoding by full recomputation of every prefix;
//  3. beam 1 equals greedy; decoding a batch equals decoding each sentence alone;
//  4. a small model where beam 4 finds a higher-scoring output than greedy, with every reported
//     log-probability recomputed from the model;
//  5. the output length limit (source length + max_extra, and the model's max_len) holds; n-best lists
//     are sorted and distinct.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "../transformer.h"
#include "check.h"

static Config toy_config(bool pre_ln) {
  Config c = config_preset("tiny");
  c.N = 2, c.D = 16, c.F = 24, c.H = 2, c.V = 13, c.max_len = 40, c.pre_ln = pre_ln;
  return c;
}

// Random sentences of ids in [4, V): no specials.
static std::vector<std::vector<int>> random_sentences(uint64_t seed, int n, int min_len, int max_len, int V) {
  std::vector<std::vector<int>> out(n);
  uint64_t s = seed;
  auto next = [&]() { s = s * 6364136223846793005ull + 1442695040888963407ull; return (int)(s >> 33); };
  for (auto& x : out) {
    x.resize(min_len + next() % (max_len - min_len + 1));
    for (int& id : x) id = 4 + next() % (V - 4);
  }
  return out;
}

// Makes a random model's output distributions peaky, so that greedy and beam search disagree: the
// embedding (shared with the output projection) is scaled up.
template <typename T> static void sharpen(Transformer<T>& m, double factor) {
  for (size_t i = 0; i < (size_t)m.cfg.V * m.cfg.D; ++i) m.W.emb[i] *= T(factor);
}

// log-softmax of row `row` of logits (rows of V)
template <typename T> static double log_softmax_at(const T* logits, int V, int row, int v) {
  const T* z = logits + (size_t)row * V;
  double mx = -INFINITY, sum = 0;
  for (int u = 0; u < V; ++u) mx = std::max(mx, (double)z[u]);
  for (int u = 0; u < V; ++u) sum += std::exp((double)z[u] - mx);
  return (double)z[v] - mx - std::log(sum);
}
// the same, from the logits the last transformer_forward left in the activations
template <typename T> static double forced_logprob(const Transformer<T>& m, int row, int v) {
  return log_softmax_at(m.acts.logits, m.cfg.V, row, v);
}

template <typename T> static void incremental_equals_forced(Checker& ck, bool pre_ln, double rtol, const char* what) {
  Transformer<T> m(toy_config(pre_ln), 11);
  sharpen(m, 3.0);
  auto src = random_sentences(5, 4, 1, 9, m.cfg.V);
  auto tgt = random_sentences(6, 4, 0, 8, m.cfg.V);
  std::vector<const std::vector<int>*> s, t;
  for (int i = 0; i < 4; ++i) s.push_back(&src[i]), t.push_back(&tgt[i]);
  Batch batch = make_batch(s, t);
  transformer_forward(m, batch, false);
  // decoding reuses the activation arena: keep the teacher-forced logits
  const std::vector<T> logits(m.acts.logits, m.acts.logits + (size_t)batch.B * batch.T * m.cfg.V);
  for (int i = 0; i < 4; ++i) {
    std::vector<T> lp = decoder_logprobs(m, src[i], tgt[i]);
    for (int pos = 0; pos <= (int)tgt[i].size(); ++pos)
      for (int v = 0; v < m.cfg.V; ++v) {
        if (v == kPadId || v == kBosId) {  // never predicted by the decoder
          ck.expect(std::isinf(lp[(size_t)pos * m.cfg.V + v]), "%s: <pad>/<s> must get -inf", what);
          continue;
        }
        ck.close(lp[(size_t)pos * m.cfg.V + v], log_softmax_at(logits.data(), m.cfg.V, i * batch.T + pos, v), rtol, rtol, what);
      }
  }
}

// Greedy decoding by recomputing the whole decoder for every prefix (no caches).
static std::vector<int> greedy_by_recomputation(Transformer<float>& m, const std::vector<int>& src, int max_extra,
                                                double* logprob) {
  std::vector<int> y;
  *logprob = 0;
  const int limit = max_output_length(m.cfg, (int)src.size(), max_extra);
  while ((int)y.size() < limit) {
    Batch b = make_batch({&src}, {&y});
    transformer_forward(m, b, false);
    const int row = (int)y.size();
    int best = -1;
    double best_lp = -INFINITY;
    for (int v = 0; v < m.cfg.V; ++v)
      if (v != kPadId && v != kBosId && forced_logprob(m, row, v) > best_lp) best = v, best_lp = forced_logprob(m, row, v);
    *logprob += best_lp;
    if (best == kEosId) break;
    y.push_back(best);
  }
  return y;
}

// log P(y | x) with </s> when finished, from the teacher-forced model
static double sequence_logprob(Transformer<float>& m, const std::vector<int>& src, const Hypothesis& h) {
  Batch b = make_batch({&src}, {&h.tokens});
  transformer_forward(m, b, false);
  double lp = 0;
  for (size_t t = 0; t < h.tokens.size(); ++t) lp += forced_logprob(m, (int)t, h.tokens[t]);
  if (h.finished) lp += forced_logprob(m, (int)h.tokens.size(), kEosId);
  return lp;
}

int main() {
  Checker ck("decoding");
  incremental_equals_forced<double>(ck, false, 1e-10, "incremental vs forced (double, post-LN)");
  incremental_equals_forced<double>(ck, true, 1e-10, "incremental vs forced (double, pre-LN)");
  incremental_equals_forced<float>(ck, false, 1e-5, "incremental vs forced (float, post-LN)");
  incremental_equals_forced<float>(ck, true, 1e-5, "incremental vs forced (float, pre-LN)");

  Transformer<float> m(toy_config(false), 3);
  sharpen(m, 3.0);
  auto src = random_sentences(9, 12, 1, 10, m.cfg.V);

  // 2. cached greedy == recomputed greedy
  std::vector<Hypothesis> greedy = greedy_decode(m, src, 6);
  for (size_t i = 0; i < src.size(); ++i) {
    double lp;
    std::vector<int> y = greedy_by_recomputation(m, src[i], 6, &lp);
    ck.expect(y == greedy[i].tokens, "sentence %zu: cached greedy differs from recomputed greedy", i);
    ck.close(greedy[i].logprob, lp, 1e-5, 1e-5 * 1e-5, "greedy log-probability, cached vs recomputed");
  }

  // 3. beam 1 == greedy; batch == one at a time
  DecodeOptions one;
  one.beam = 1, one.max_extra = 6;
  auto beam1 = beam_search(m, src, one);
  for (size_t i = 0; i < src.size(); ++i) {
    ck.expect(beam1[i].size() == 1 && beam1[i][0].tokens == greedy[i].tokens, "sentence %zu: beam 1 differs from greedy", i);
    ck.close(beam1[i][0].logprob, greedy[i].logprob, 1e-6, 1e-6, "beam 1 vs greedy log-probability");
  }
  DecodeOptions four;
  four.beam = 4, four.max_extra = 6;
  auto beam4 = beam_search(m, src, four);
  for (size_t i = 0; i < src.size(); ++i) {
    auto alone = beam_search(m, {src[i]}, four);
    ck.expect(alone[0][0].tokens == beam4[i][0].tokens, "sentence %zu: beam 4 in a batch differs from alone", i);
    auto alone_greedy = greedy_decode(m, {src[i]}, 6);
    ck.expect(alone_greedy[0].tokens == greedy[i].tokens, "sentence %zu: greedy in a batch differs from alone", i);
  }

  // 4. beam search beats greedy somewhere, and its scores are the model's
  int improved = 0;
  double worst_gap = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    const Hypothesis& b = beam4[i][0];
    ck.close(b.logprob, sequence_logprob(m, src[i], b), 1e-5, 1e-5, "beam log-probability vs recomputed");
    const int len = (int)b.tokens.size() + b.finished;
    ck.close(b.score, b.logprob / length_penalty(len, four.alpha), 1e-12, 1e-12, "beam score = logprob / lp");
    const int glen = (int)greedy[i].tokens.size() + greedy[i].finished;
    const double gscore = greedy[i].logprob / length_penalty(glen, four.alpha);
    if (b.score > gscore + 1e-6) ++improved;
    worst_gap = std::min(worst_gap, b.score - gscore);
  }
  std::printf("beam 4 beat greedy on %d of %zu sentences (worst beam - greedy score %.3g)\n", improved, src.size(), worst_gap);
  ck.expect(improved > 0, "beam 4 never found a higher-scoring output than greedy");

  // 5. length limits and n-best lists
  for (int extra : {0, 2, 5}) {
    DecodeOptions o = four;
    o.max_extra = extra, o.n_best = 3;
    auto out = beam_search(m, src, o);
    auto g = greedy_decode(m, src, extra);
    for (size_t i = 0; i < src.size(); ++i) {
      const size_t limit = src[i].size() + extra;
      ck.expect(g[i].tokens.size() <= limit, "greedy output longer than source + %d", extra);
      ck.expect(!out[i].empty() && (int)out[i].size() <= 3, "n-best list of %zu entries", out[i].size());
      for (size_t j = 0; j < out[i].size(); ++j) {
        ck.expect(out[i][j].tokens.size() <= limit, "beam output longer than source + %d", extra);
        if (j > 0) {
          ck.expect(out[i][j - 1].score >= out[i][j].score, "n-best list not sorted by score");
          ck.expect(out[i][j - 1].tokens != out[i][j].tokens || out[i][j - 1].finished != out[i][j].finished,
                    "n-best list repeats a hypothesis");
        }
      }
    }
  }
  Config small_max = toy_config(false);
  small_max.max_len = 12;
  Transformer<float> capped(small_max, 3);
  auto long_src = random_sentences(4, 3, 10, 11, small_max.V);
  for (const auto& h : greedy_decode(capped, long_src, 50))
    ck.expect(h.tokens.size() <= 12, "greedy output of %zu tokens exceeds max_len 12", h.tokens.size());
  for (const auto& hs : beam_search(capped, long_src, four))
    ck.expect(hs[0].tokens.size() <= 12, "beam output of %zu tokens exceeds max_len 12", hs[0].tokens.size());
  return ck.finish();
}
