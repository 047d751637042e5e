// gradcheck: every forward/backward pair of transformer.cu against central finite differences in double,
// each op on its own with odd shapes and masks, then the whole model (post-LN and pre-LN, dropout off
// and on). Also the mask properties: what is masked cannot change what is not.
//
// For an op out = f(inputs), the check draws a random R and compares the analytic gradient of
// <R, f(inputs)> (the backward called with dout = R) with (g(x + h) - g(x - h)) / 2h element by element.
// Error measure: |analytic - numeric| / max(|numeric|, 1e-3), i.e. an absolute floor of 1e-9 at the
// tolerance 1e-6. Where an element fails at h = 1e-5, it is measured again at h = 1e-6: a ReLU kink
// crossed by the perturbation shows up as a difference that shrinks with h, a wrong gradient does not.
// The gradients start from random values, so a backward that overwrites them instead of adding fails.
// check_pair and check_model live in gradcheck.h, shared with the course grader (course/grade.cpp).
#include <cstdio>
#include <string>
#include <vector>

#include "../transformer.h"
#include "gradcheck.h"

static void check_ops(Checker& ck, Rand& rng) {
  // linear
  for (bool bias : {true, false}) {
    const int M = 7, I = 5, O = 3;
    Vec x = rng.vec(M * I), w = rng.vec(I * O), b = rng.vec(O), dx, dw, db;
    std::vector<Input> ins = {{"in", &x, &dx}, {"w", &w, &dw}};
    if (bias) ins.push_back({"b", &b, &db});
    check_pair(ck, bias ? "linear" : "linear(no bias)", ins, M * O,
               [&](Vec& out) { cpu::linear_forward(out.data(), x.data(), w.data(), bias ? b.data() : nullptr, M, I, O); },
               [&](const Vec& d) {
                 cpu::linear_backward(dx.data(), dw.data(), bias ? db.data() : nullptr, d.data(), x.data(), w.data(), M, I, O);
               },
               rng);
  }
  // layernorm
  {
    const int M = 5, D = 9;
    Vec x = rng.vec(M * D, 2.0), g = rng.vec(D), b = rng.vec(D), mean(M), rstd(M), dx, dg, db;
    check_pair(ck, "layernorm", {{"in", &x, &dx}, {"g", &g, &dg}, {"b", &b, &db}}, M * D,
               [&](Vec& out) { cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), g.data(), b.data(), M, D, 1e-6); },
               [&](const Vec& d) {
                 cpu::layernorm_backward(dx.data(), dg.data(), db.data(), d.data(), x.data(), g.data(), mean.data(), rstd.data(), M, D);
               },
               rng);
  }
  // scaled dot-product attention: cross (padding, one fully masked sentence), causal self, with dropout
  struct Case { const char* name; int B, Lq, Lk, H, Dk; bool causal; double p; bool empty_row; };
  for (Case cs : {Case{"attention(cross, padded)", 3, 5, 7, 3, 3, false, 0.0, true},
                  Case{"attention(causal)", 2, 7, 7, 3, 5, true, 0.0, false},
                  Case{"attention(dropout 0.3)", 2, 5, 5, 1, 3, true, 0.3, false}}) {
    const int B = cs.B, Lq = cs.Lq, Lk = cs.Lk, H = cs.H, D = cs.H * cs.Dk;
    Vec q = rng.vec(B * Lq * D, 1.5), k = rng.vec(B * Lk * D, 1.5), v = rng.vec(B * Lk * D), p((size_t)B * H * Lq * Lk);
    Vec dq, dk, dv;
    auto valid = random_mask(rng, B, Lk, 0.7);
    valid[0] = 1;  // causal rows need their first key
    if (cs.empty_row)
      for (int j = 0; j < Lk; ++j) valid[(size_t)(B - 1) * Lk + j] = 0;
    DropoutKey drop = dropout_key(7, 3, 11, cs.p);
    check_pair(ck, cs.name, {{"q", &q, &dq}, {"k", &k, &dk}, {"v", &v, &dv}}, (size_t)B * Lq * D,
               [&](Vec& out) {
                 cpu::attention_forward(out.data(), p.data(), q.data(), k.data(), v.data(), valid.data(), cs.causal, drop, B, Lq, Lk, D, H);
               },
               [&](const Vec& d) {
                 cpu::attention_backward(dq.data(), dk.data(), dv.data(), d.data(), p.data(), q.data(), k.data(), v.data(), drop, B, Lq, Lk, D, H);
               },
               rng);
    if (cs.empty_row) {  // the fully masked sentence: defined (zero) output and zero gradients
      Vec out((size_t)B * Lq * D);
      cpu::attention_forward(out.data(), p.data(), q.data(), k.data(), v.data(), valid.data(), cs.causal, drop, B, Lq, Lk, D, H);
      bool finite_zero = true;
      for (int i = 0; i < Lq * D; ++i) finite_zero &= out[(size_t)(B - 1) * Lq * D + i] == 0.0;
      ck.expect(finite_zero, "a fully masked attention row must give zero output, never NaN");
    }
  }
  // multi-head attention: cross (separate query and key/value inputs) and self (one input, both roles)
  for (bool self : {false, true}) {
    const int B = 2, Lq = 5, Lk = self ? 5 : 6, H = 3, D = 9;
    Vec xq = rng.vec(B * Lq * D), xkv = rng.vec(B * Lk * D), dxq, dxkv;
    Vec wq = rng.vec(D * D, 0.6), wk = rng.vec(D * D, 0.6), wv = rng.vec(D * D, 0.6), wo = rng.vec(D * D, 0.6);
    Vec gq, gk, gv, go;
    Vec sq(B * Lq * D), sk(B * Lk * D), sv(B * Lk * D), sp((size_t)B * H * Lq * Lk), sc(B * Lq * D);
    Vec tq(B * Lq * D), tk(B * Lk * D), tv(B * Lk * D), tc(B * Lq * D);
    auto valid = random_mask(rng, B, Lk, 0.7);
    valid[0] = valid[Lk] = 1;
    AttentionActs<double> acts{sq.data(), sk.data(), sv.data(), sp.data(), sc.data()};
    AttentionActs<double> scratch{tq.data(), tk.data(), tv.data(), nullptr, tc.data()};
    DropoutKey drop = dropout_key(1, 2, 3, 0.2);
    std::vector<Input> ins = {{"xq", &xq, &dxq}, {"wq", &wq, &gq}, {"wk", &wk, &gk}, {"wv", &wv, &gv}, {"wo", &wo, &go}};
    if (!self) ins.push_back({"xkv", &xkv, &dxkv});
    check_pair(ck, self ? "multihead_attention(self, causal)" : "multihead_attention(cross)", ins, (size_t)B * Lq * D,
               [&](Vec& out) {
                 AttentionWeights<double> w{wq.data(), wk.data(), wv.data(), wo.data()};
                 cpu::multihead_attention_forward(out.data(), acts, xq.data(), self ? xq.data() : xkv.data(), w, valid.data(), self,
                                                  drop, B, Lq, Lk, D, H);
               },
               [&](const Vec& d) {
                 AttentionWeights<double> w{wq.data(), wk.data(), wv.data(), wo.data()};
                 AttentionWeights<double> g{gq.data(), gk.data(), gv.data(), go.data()};
                 cpu::multihead_attention_backward(dxq.data(), self ? dxq.data() : dxkv.data(), g, d.data(), acts, scratch, xq.data(),
                                                   self ? xq.data() : xkv.data(), w, drop, B, Lq, Lk, D, H);
               },
               rng);
  }
  // FFN, without and with ReLU dropout
  for (double p : {0.0, 0.25}) {
    const int M = 7, D = 5, F = 11;
    Vec x = rng.vec(M * D), w1 = rng.vec(D * F), b1 = rng.vec(F), w2 = rng.vec(F * D), b2 = rng.vec(D);
    Vec hpre(M * F), h(M * F), dh(M * F), dx, dw1, db1, dw2, db2;
    DropoutKey drop = dropout_key(5, 9, 2, p);
    check_pair(ck, p > 0 ? "ffn(relu dropout)" : "ffn",
               {{"in", &x, &dx}, {"w1", &w1, &dw1}, {"b1", &b1, &db1}, {"w2", &w2, &dw2}, {"b2", &b2, &db2}}, M * D,
               [&](Vec& out) {
                 FfnWeights<double> w{w1.data(), b1.data(), w2.data(), b2.data()};
                 cpu::ffn_forward(out.data(), FfnActs<double>{hpre.data(), h.data()}, x.data(), w, drop, M, D, F);
               },
               [&](const Vec& d) {
                 FfnWeights<double> w{w1.data(), b1.data(), w2.data(), b2.data()};
                 FfnWeights<double> g{dw1.data(), db1.data(), dw2.data(), db2.data()};
                 cpu::ffn_backward(dx.data(), g, dh.data(), d.data(), FfnActs<double>{hpre.data(), h.data()}, x.data(), w, drop, M, D, F);
               },
               rng);
  }
  // embedding (+ scaling + positional encoding), repeated ids included
  {
    const int V = 6, B = 2, L = 5, D = 7 + 1;
    Vec emb = rng.vec(V * D), demb;
    std::vector<int> ids((size_t)B * L);
    for (auto& id : ids) id = rng.below(V);
    ids[1] = ids[0];
    check_pair(ck, "embedding", {{"emb", &emb, &demb}}, (size_t)B * L * D,
               [&](Vec& out) { cpu::embedding_forward(out.data(), ids.data(), emb.data(), B, L, D); },
               [&](const Vec& d) { cpu::embedding_backward(demb.data(), d.data(), ids.data(), B, L, D); }, rng);
  }
  // dropout, and the residual connection with the sub-layer's dropout (post-LN: and LayerNorm) as one op
  {
    const int M = 3, D = 11;
    const size_t n = (size_t)M * D;
    Vec x = rng.vec(n), y = rng.vec(n), g = rng.vec(D), b = rng.vec(D), sum(n), mean(M), rstd(M), dsum(n), dx, dy, dg, db;
    DropoutKey drop = dropout_key(3, 1, 4, 0.4);
    check_pair(ck, "dropout", {{"in", &x, &dx}}, n, [&](Vec& out) { cpu::dropout_forward(out.data(), x.data(), drop, n); },
               [&](const Vec& d) { cpu::dropout_backward(dx.data(), d.data(), drop, n); }, rng);
    check_pair(ck, "residual_dropout", {{"x", &x, &dx}, {"y", &y, &dy}}, n,
               [&](Vec& out) { cpu::residual_dropout_forward(out.data(), x.data(), y.data(), drop, n); },
               [&](const Vec& d) { cpu::residual_dropout_backward(dx.data(), dy.data(), d.data(), drop, n); }, rng);
    check_pair(ck, "residual_dropout_layernorm", {{"x", &x, &dx}, {"y", &y, &dy}, {"g", &g, &dg}, {"b", &b, &db}}, n,
               [&](Vec& out) {
                 cpu::residual_dropout_layernorm_forward(out.data(), sum.data(), mean.data(), rstd.data(), x.data(), y.data(), drop,
                                                         g.data(), b.data(), M, D, 1e-6);
               },
               [&](const Vec& d) {
                 cpu::residual_dropout_layernorm_backward(dx.data(), dy.data(), dg.data(), db.data(), dsum.data(), d.data(),
                                                          sum.data(), g.data(), mean.data(), rstd.data(), drop, M, D);
               },
               rng);
  }
  // output projection through the shared embedding matrix
  {
    const int M = 5, D = 7, V = 9;
    Vec y = rng.vec(M * D), emb = rng.vec(V * D), dy, demb;
    check_pair(ck, "output_projection", {{"y", &y, &dy}, {"emb", &emb, &demb}}, M * V,
               [&](Vec& out) { cpu::output_projection_forward(out.data(), y.data(), emb.data(), M, D, V); },
               [&](const Vec& d) { cpu::output_projection_backward(dy.data(), demb.data(), d.data(), y.data(), emb.data(), M, D, V); },
               rng);
  }
  // label-smoothed cross-entropy, both target distributions, padding positions ignored
  for (LabelSmoothing form : {LabelSmoothing::others_only, LabelSmoothing::uniform_all}) {
    const int M = 7, V = 9;
    Vec z = rng.vec(M * V, 3.0), lse(M), dz;
    std::vector<int> tgt(M);
    for (auto& t : tgt) t = 1 + rng.below(V - 1);
    tgt[2] = tgt[5] = kPadId;
    check_pair(ck, form == LabelSmoothing::others_only ? "label_smoothed_xent(t2t)" : "label_smoothed_xent(uniform)",
               {{"logits", &z, &dz}}, 1,
               [&](Vec& out) { out[0] = cpu::label_smoothed_xent_forward(lse.data(), z.data(), tgt.data(), M, V, 0.1, form, kPadId); },
               [&](const Vec& d) {
                 Vec g(z.size(), 0.0);
                 cpu::label_smoothed_xent_backward(g.data(), z.data(), lse.data(), tgt.data(), M, V, 0.1, form, kPadId);
                 for (size_t i = 0; i < g.size(); ++i) dz[i] += d[0] * g[i];
               },
               rng);
  }
}

// Changing what a mask hides changes no output it protects: future target tokens (causal mask), and the
// embedding row of <pad> (padding masks on every attention) leave the real positions' logits unchanged.
static void check_masks(Checker& ck, Rand& rng) {
  for (bool pre_ln : {false, true}) {
    Config c = tiny_config(pre_ln, false);
    Transformer<double> m(c, 7);
    Batch batch = random_batch(rng, 3, 7, 6, c.V);
    const int T = batch.T, V = c.V;
    transformer_forward(m, batch, false);
    std::vector<double> base(m.acts.logits, m.acts.logits + (size_t)batch.B * T * V);
    // future tokens: change tgt_in at position t of sentence 0; positions < t must not move
    for (int t = 1; t < T; ++t) {
      Batch changed = batch;
      changed.tgt_in[t] = changed.tgt_in[t] == 4 ? 5 : 4;
      transformer_forward(m, changed, false);
      bool same = true;
      for (int u = 0; u < t; ++u)
        for (int v = 0; v < V; ++v) same &= m.acts.logits[(size_t)u * V + v] == base[(size_t)u * V + v];
      ck.expect(same, "causal mask: changing target token %d changed an earlier position's logits", t);
    }
    // padding: a different <pad> embedding changes no real position's logits (except the <pad> class)
    for (int d = 0; d < c.D; ++d) m.W.emb[(size_t)kPadId * c.D + d] += rng.uniform(-1, 1);
    transformer_forward(m, batch, false);
    bool same = true;
    for (int s = 0; s < batch.B; ++s)
      for (int t = 0; t < T; ++t) {
        if (batch.tgt_in[(size_t)s * T + t] == kPadId) continue;
        for (int v = 0; v < V; ++v)
          if (v != kPadId) same &= m.acts.logits[((size_t)s * T + t) * V + v] == base[((size_t)s * T + t) * V + v];
      }
    ck.expect(same, "padding mask (%s): the <pad> embedding changed a real position's logits", pre_ln ? "pre-LN" : "post-LN");
  }
}

int main() {
  Checker ck("gradcheck");
  Rand rng{2017};
  check_ops(ck, rng);
  for (bool pre_ln : {false, true})
    for (bool dropout : {false, true}) check_model(ck, rng, pre_ln, dropout);
  check_masks(ck, rng);
  return ck.finish();
}
