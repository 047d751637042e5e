// decoding.cuh: §6 decoding: greedy and beam search, the decoder one position at a time with K/V caches,
// on either device (templated on Ops, as the passes of transformer.cu are). Part of transformer.cu's
// translation unit (included at its end); the interface is in transformer.h.
#pragma once
#include "tokenizer.h"  // write_file_atomically (the decoding defaults)

// ---- §6 decoding: the decoder one position at a time, with K/V caches ------------------------------

double length_penalty(int length, double alpha) { return std::pow((5.0 + length) / 6.0, alpha); }

int max_output_length(const Config& cfg, int source_tokens, int max_extra) {
  // the decoder's inputs are <s> and every output token but the last: at most max_len positions
  return std::max(1, std::min(source_tokens + max_extra, cfg.max_len));
}

void save_decoding_defaults(const std::string& path, const DecodeOptions& d, const std::string& comment) {
  char body[64];
  std::snprintf(body, sizeof body, "beam %d\nalpha %.15g\n", d.beam, d.alpha);
  write_file_atomically(path, "# " + comment + "\n" + body);
}

bool load_decoding_defaults(const std::string& path, DecodeOptions* d) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    if (errno == ENOENT) return false;
    throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  }
  std::string line;
  for (int n = 1; std::getline(file, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    char key[8], extra;
    double v;
    const std::string where = path + ":" + std::to_string(n) + ": ";
    if (std::sscanf(line.c_str(), "%7s %lf %c", key, &v, &extra) != 2) throw std::runtime_error(where + "expected 'beam K' or 'alpha A', got '" + line + "'");
    if (std::string(key) == "beam" && v >= 1 && v <= 1000000 && v == std::floor(v)) d->beam = (int)v;
    else if (std::string(key) == "alpha" && v >= 0 && v <= 1e6) d->alpha = v;
    else throw std::runtime_error(where + "expected 'beam K' (K >= 1) or 'alpha A' (A >= 0), got '" + line + "'");
  }
  if (file.bad()) throw std::runtime_error("error reading " + path);
  return true;
}

// A model as decoding sees it, on one device: the configuration, the weights, and how to run the encoder
// over a batch of sources (returning its output (B, S, D), on the same device).
template <typename T> struct DecodingModel {
  const Config& cfg;
  const Weights<T>& W;
  std::function<const T*(const Batch&)> encode;
};

// What decoding keeps between steps for R rows (hypotheses), each attending to one of the sources. The
// buffers live where Ops computes; row_source and the masks' host copy stay on the host.
template <typename Ops, typename T> struct DecoderCache {
  template <typename U> using Buffer = typename Ops::template Buffer<U>;
  int R = 0, S = 0, capacity = 0, t = 0;     // rows, source length, positions allocated, positions filled
  int max_rows = 0;                          // rows allocated
  std::vector<int> row_source;               // (R) which source each row translates
  Buffer<uint8_t> src_valid;                 // (sources, S)
  std::vector<Buffer<T>> cross_k, cross_v;   // per layer (sources, S, D): computed once
  std::vector<Buffer<T>> self_k, self_v;     // per layer (max_rows, capacity, D): one position more a step
  Buffer<T> reordered;                       // (max_rows, capacity, D): where reorder_rows gathers
  std::vector<uint8_t> host_self_valid;      // (max_rows, capacity): positions 0..t are visible
  Buffer<uint8_t> self_valid;                // its copy on the device
  Buffer<int> ids;                           // (max_rows) this step's tokens, or reorder_rows' parents
  // the rows laid out by source for one encoder-decoder attention over all of them (SourceLayout)
  Buffer<int> layout;                        // (2 max_rows) a slot's row, then a row's slot
  Buffer<T> q_by_source, ctx_by_source;      // (max_rows, D)
  // scratch for one step
  Buffer<T> x, q, kv, ctx, p, hpre, h, logits;
  Buffer<T> sub[2];  // two sub-layer connections' outputs and statistics, ping-ponged
};

// The sources as an encoder batch: make_batch appends </s>; a one-position decoder input (never run)
// keeps validate_batch's checks.
static Batch encoder_batch(const std::vector<std::vector<int>>& src) {
  std::vector<const std::vector<int>*> rows;
  for (const auto& s : src) rows.push_back(&s);
  Batch batch = make_batch(rows, {});
  batch.T = 1;
  batch.tgt_in.assign(batch.B, kBosId);
  batch.tgt_out.assign(batch.B, kEosId);
  return batch;
}

// Runs the encoder over the sources and computes every layer's encoder-decoder keys and values; row r
// starts as source r. Room for max_rows rows of `capacity` positions.
template <typename Ops, typename T>
static DecoderCache<Ops, T> start_decoding(const DecodingModel<T>& dm, const std::vector<std::vector<int>>& src, int capacity,
                                           int max_rows) {
  const Config& c = dm.cfg;
  const Batch batch = encoder_batch(src);
  const T* enc_out = dm.encode(batch);
  DecoderCache<Ops, T> k;
  const int D = c.D, B = batch.B, S = batch.S;
  k.S = S, k.capacity = capacity, k.max_rows = max_rows;
  std::vector<uint8_t> src_valid(batch.src.size());
  for (size_t i = 0; i < src_valid.size(); ++i) src_valid[i] = batch.src[i] != kPadId;
  k.src_valid = decltype(k.src_valid)(src_valid.size());
  Ops::upload(k.src_valid.data(), src_valid.data(), src_valid.size());
  const size_t n = (size_t)B * S * D, cache = (size_t)max_rows * capacity * D, RD = (size_t)max_rows * D;
  for (int l = 0; l < c.N; ++l) {  // [§3.2.3] keys and values come from the encoder output
    k.cross_k.emplace_back(n), k.cross_v.emplace_back(n), k.self_k.emplace_back(cache), k.self_v.emplace_back(cache);
    Ops::linear_forward(k.cross_k[l].data(), enc_out, dm.W.dec[l].cross.wk, (const T*)nullptr, B * S, D, D);
    Ops::linear_forward(k.cross_v[l].data(), enc_out, dm.W.dec[l].cross.wv, (const T*)nullptr, B * S, D, D);
  }
  k.reordered = decltype(k.reordered)(cache);
  k.host_self_valid.assign((size_t)max_rows * capacity, 0);
  k.self_valid = decltype(k.self_valid)(k.host_self_valid.size());
  k.ids = decltype(k.ids)(max_rows);
  k.layout = decltype(k.layout)(2 * (size_t)max_rows);
  for (auto* b : {&k.x, &k.q, &k.kv, &k.ctx, &k.q_by_source, &k.ctx_by_source}) *b = decltype(k.x)(RD);
  k.p = decltype(k.p)((size_t)max_rows * c.H * std::max(capacity, S));
  k.hpre = decltype(k.hpre)((size_t)max_rows * c.F), k.h = decltype(k.h)((size_t)max_rows * c.F);
  k.logits = decltype(k.logits)((size_t)max_rows * c.V);
  for (auto& s : k.sub) s = decltype(k.x)(4 * RD + 2 * max_rows);
  k.R = B;  // one row per source to begin with
  k.row_source.resize(B);
  std::iota(k.row_source.begin(), k.row_source.end(), 0);
  return k;
}

size_t decoding_bytes(const Config& c, int sources, int S, int capacity, int rows) {
  Activations<float> a;  // the encoder runs as a batch with a one-position decoder input (encoder_batch)
  const size_t encoder = carve_activations<float>(a, c, sources, S, 1, nullptr);
  const size_t n = (size_t)sources * S * c.D, cache = (size_t)rows * capacity * c.D, RD = (size_t)rows * c.D;
  // start_decoding's buffers, in its order (floats), beam_search's log-probabilities on the host, and the
  // decoder's weights packed for the product (decoder_step_operands; up to 32 columns of padding each)
  const size_t D = c.D, F = c.F;
  const size_t packed = c.N * (6 * (D + 32) * D + (F + 32) * D + (D + 32) * F) + (c.V + 32) * D;
  const size_t floats = packed + c.N * (2 * n + 2 * cache) + cache + 6 * RD + (size_t)rows * c.H * std::max(capacity, S) +
                        2 * (size_t)rows * c.F + (size_t)rows * c.V + 2 * (4 * RD + 2 * (size_t)rows) + (size_t)rows * c.V;
  return sizeof(float) * (encoder + floats) + 2 * (size_t)rows * capacity + sizeof(int) * 3 * rows;
}

// Keeps the rows `parent` names (a row may be kept several times), in that order: beams reordered.
template <typename Ops, typename T> static void reorder_rows(DecoderCache<Ops, T>& k, const std::vector<int>& parent, int D) {
  const size_t row = (size_t)k.capacity * D;
  std::vector<int> source(parent.size());
  for (size_t r = 0; r < parent.size(); ++r) source[r] = k.row_source[parent[r]];
  Ops::upload(k.ids.data(), parent.data(), parent.size());
  for (auto* cache : {&k.self_k, &k.self_v})
    for (auto& layer : *cache) {
      Ops::copy_rows(k.reordered.data(), row, layer.data(), row, k.ids.data(), (int)parent.size(), (size_t)k.t * D);
      std::swap(layer, k.reordered);
    }
  k.row_source.swap(source);
  k.R = (int)parent.size();
}

// The rows of a decoding step laid out by source, so that one encoder-decoder attention serves them all: the
// sources first .. first + count - 1 (a source's rows are consecutive, the sources in order), each with
// `slots` queries, the most rows a source has. Where every source of that range has that many rows, the rows
// already lie so (`direct`). Else slot_row names the row whose query fills each slot (a source's rows, then
// its first row again, or row 0 for a source that has none: padding, whose attention is computed and not
// read), and row_slot each row's slot. On a GPU that is one launch a layer (3 with the two gathers) where a
// call a source was a launch a source: 1,200 a step for 200 sentences at 6 layers.
struct SourceLayout {
  int first = 0, count = 0, slots = 0;
  bool direct = true;
  std::vector<int> slot_row, row_slot;  // (count * slots), (R); both empty where direct
};
static SourceLayout source_layout(const std::vector<int>& row_source, int R) {
  if (R < 1 || (int)row_source.size() < R) throw std::logic_error("decoder_step: no rows, or rows without a source");
  for (int r = 1; r < R; ++r)
    if (row_source[r] < row_source[r - 1]) throw std::logic_error("decoder_step: rows not grouped by source in order");
  SourceLayout l;
  l.first = row_source[0], l.count = row_source[R - 1] - l.first + 1;
  std::vector<int> start(l.count + 1, 0);  // source first + i has the rows start[i] .. start[i + 1] - 1
  for (int r = 0; r < R; ++r) ++start[row_source[r] - l.first + 1];
  for (int i = 0; i < l.count; ++i) l.slots = std::max(l.slots, start[i + 1]), start[i + 1] += start[i];
  l.direct = R == l.count * l.slots;
  if (l.direct) return l;
  l.slot_row.resize((size_t)l.count * l.slots), l.row_slot.resize(R);
  for (int i = 0; i < l.count; ++i)
    for (int j = 0; j < l.slots; ++j) {
      const int r = start[i] + j, slot = i * l.slots + j;
      if (r < start[i + 1]) l.slot_row[slot] = r, l.row_slot[r] = slot;
      else l.slot_row[slot] = start[i] < start[i + 1] ? start[i] : 0;
    }
  return l;
}

// One decoder step for every row: token[r] is the decoder input at position k.t; writes the
// log-probabilities of the next token, logprob (R, V) on the host, and appends this position's keys and
// values.
template <typename Ops, typename T>
static void decoder_step(const DecodingModel<T>& dm, DecoderCache<Ops, T>& k, const int* token, T* logprob) {
  const Config& c = dm.cfg;
  const int R = k.R, D = c.D, H = c.H, t = k.t, cap = k.capacity;
  const size_t RD = (size_t)R * D, row = (size_t)cap * D;
  if (t >= cap) throw std::logic_error("decoder_step: past the cache's capacity");
  if (R > k.max_rows) throw std::logic_error("decoder_step: more rows than the cache has");
  auto acts = [&](int i) {  // a sub-layer connection's buffers for R rows (no backward: nothing is kept)
    T* b = k.sub[i].data();
    return SublayerActs<T>{b, b + RD, b + 2 * RD, b + 3 * RD, b + 4 * RD, b + 4 * RD + R};
  };
  const DropoutKey none{};
  for (int r = 0; r < k.max_rows; ++r) k.host_self_valid[(size_t)r * cap + t] = 1;  // every row has t+1 positions
  Ops::upload(k.self_valid.data(), k.host_self_valid.data(), (size_t)R * cap);
  Ops::upload(k.ids.data(), token, R);
  const SourceLayout by_source = source_layout(k.row_source, R);
  if ((size_t)by_source.count * by_source.slots > (size_t)k.max_rows)
    throw std::logic_error("decoder_step: the rows laid out by source need more than the cache's rows");
  const int* slot_row = k.layout.data();  // the layout's indices on the device, where it is not direct
  const int* row_slot = slot_row + by_source.slot_row.size();
  if (!by_source.direct) {
    std::vector<int> index = by_source.slot_row;
    index.insert(index.end(), by_source.row_slot.begin(), by_source.row_slot.end());
    Ops::upload(k.layout.data(), index.data(), index.size());
  }
  // [§3.4, §3.5] the embedded input at position t
  Ops::embedding_forward(k.x.data(), k.ids.data(), dm.W.emb, R, 1, D, t);
  const T* x = k.x.data();
  int cur = 0;
  for (int l = 0; l < c.N; ++l) {
    const DecoderLayerWeights<T>& w = dm.W.dec[l];
    T* K = k.self_k[l].data();
    T* V = k.self_v[l].data();
    // [§3.2.3] masked self-attention: this position attends to positions 0..t, all in the cache
    SublayerActs<T> self = acts(cur);
    sublayer_connection_forward<Ops>(self, x, w.ln1, c, none, R, [&](const T* in, T* y) {
      Ops::linear_forward(k.q.data(), in, w.self.wq, (const T*)nullptr, R, D, D);
      Ops::linear_forward(k.kv.data(), in, w.self.wk, (const T*)nullptr, R, D, D);
      Ops::copy_rows(K + (size_t)t * D, row, k.kv.data(), (size_t)D, (const int*)nullptr, R, (size_t)D);
      Ops::linear_forward(k.kv.data(), in, w.self.wv, (const T*)nullptr, R, D, D);
      Ops::copy_rows(V + (size_t)t * D, row, k.kv.data(), (size_t)D, (const int*)nullptr, R, (size_t)D);
      // [Eq. 1] each row's one query against its cached keys and values (positions past t are masked)
      Ops::attention_forward(k.ctx.data(), k.p.data(), k.q.data(), K, V, k.self_valid.data(), false, none, R, 1, cap, D, H);
      Ops::linear_forward(y, k.ctx.data(), w.self.wo, (const T*)nullptr, R, D, D);
    });
    cur = 1 - cur;
    // [§3.2.3] encoder-decoder attention against the keys and values computed once per source: a source's
    // rows are its queries, one attention for all the sources (SourceLayout)
    SublayerActs<T> cross = acts(cur);
    sublayer_connection_forward<Ops>(cross, self.out, w.ln2, c, none, R, [&](const T* in, T* y) {
      Ops::linear_forward(k.q.data(), in, w.cross.wq, (const T*)nullptr, R, D, D);
      const T* q = k.q.data();
      T* ctx = k.ctx.data();
      if (!by_source.direct) {
        Ops::copy_rows(k.q_by_source.data(), (size_t)D, q, (size_t)D, slot_row, (int)by_source.slot_row.size(), (size_t)D);
        q = k.q_by_source.data(), ctx = k.ctx_by_source.data();
      }
      const size_t first_key = (size_t)by_source.first * k.S;  // the first source's first key position
      Ops::attention_forward(ctx, k.p.data(), q, k.cross_k[l].data() + first_key * D, k.cross_v[l].data() + first_key * D,
                             k.src_valid.data() + first_key, false, none, by_source.count, by_source.slots, k.S, D, H);
      if (!by_source.direct) Ops::copy_rows(k.ctx.data(), (size_t)D, ctx, (size_t)D, row_slot, R, (size_t)D);
      Ops::linear_forward(y, k.ctx.data(), w.cross.wo, (const T*)nullptr, R, D, D);
    });
    cur = 1 - cur;
    // [Eq. 2] the feed-forward network
    SublayerActs<T> ffn = acts(cur);
    sublayer_connection_forward<Ops>(ffn, cross.out, w.ln3, c, none, R, [&](const T* in, T* y) {
      Ops::ffn_forward(y, FfnActs<T>{k.hpre.data(), k.h.data()}, in, w.ffn, none, R, D, c.F);
    });
    cur = 1 - cur;
    x = ffn.out;
  }
  if (c.pre_ln) {  // the decoder stack's final LayerNorm
    SublayerActs<T> fin = acts(cur);
    Ops::layernorm_forward(fin.out, fin.mean, fin.rstd, x, dm.W.dec_final.g, dm.W.dec_final.b, R, D, c.ln_eps);
    x = fin.out;
  }
  // [§3.4] logits = y E^T, then log-softmax; <pad> and <s> are never predicted
  Ops::output_projection_forward(k.logits.data(), x, dm.W.emb, R, D, c.V);
  Ops::log_softmax(k.logits.data(), k.logits.data(), R, c.V);
  Ops::download(logprob, k.logits.data(), (size_t)R * c.V);
  for (int r = 0; r < R; ++r) logprob[(size_t)r * c.V + kPadId] = logprob[(size_t)r * c.V + kBosId] = -std::numeric_limits<T>::infinity();
  k.t += 1;
}

template <typename Ops, typename T>
static std::vector<T> decoder_logprobs_on(const DecodingModel<T>& dm, const std::vector<int>& src, const std::vector<int>& y) {
  const int V = dm.cfg.V, steps = (int)y.size() + 1;
  DecoderCache<Ops, T> k = start_decoding<Ops>(dm, {src}, steps, 1);
  std::vector<T> out((size_t)steps * V);
  int token = kBosId;
  for (int t = 0; t < steps; ++t) {
    decoder_step(dm, k, &token, out.data() + (size_t)t * V);
    if (t < (int)y.size()) token = y[t];
  }
  return out;
}

template <typename Ops, typename T>
static std::vector<Hypothesis> greedy_decode_on(const DecodingModel<T>& dm, const std::vector<std::vector<int>>& src,
                                                int max_extra) {
  // BEGIN SOLUTION task=greedy_decode points=5
  const int V = dm.cfg.V, B = (int)src.size();
  std::vector<Hypothesis> out(B);
  if (B == 0) return out;
  std::vector<int> limit(B), live(B);  // live: the sentence of each row
  int longest = 0;
  for (int b = 0; b < B; ++b) {
    limit[b] = max_output_length(dm.cfg, (int)src[b].size(), max_extra);
    longest = std::max(longest, limit[b]);
    live[b] = b;
  }
  DecoderCache<Ops, T> k = start_decoding<Ops>(dm, src, longest, B);
  std::vector<int> token(B, kBosId);
  std::vector<T> logprob((size_t)B * V);
  while (!live.empty()) {
    decoder_step(dm, k, token.data(), logprob.data());
    std::vector<int> keep, next;
    for (int r = 0; r < k.R; ++r) {
      const T* lp = logprob.data() + (size_t)r * V;
      const int best = (int)(std::max_element(lp, lp + V) - lp);
      Hypothesis& h = out[live[r]];
      h.logprob += lp[best];
      if (best == kEosId) h.finished = true;
      else h.tokens.push_back(best);
      h.score = h.logprob;
      if (h.finished || (int)h.tokens.size() >= limit[live[r]]) continue;
      keep.push_back(r);
      next.push_back(best);
    }
    std::vector<int> sentences;
    for (int r : keep) sentences.push_back(live[r]);
    live.swap(sentences);
    token.swap(next);
    if (!live.empty()) reorder_rows(k, keep, dm.cfg.D);
  }
  return out;
  // END SOLUTION
}

template <typename Ops, typename T>
static std::vector<std::vector<Hypothesis>> beam_search_on(const DecodingModel<T>& dm, const std::vector<std::vector<int>>& src,
                                                           const DecodeOptions& opt) {
  // BEGIN SOLUTION task=beam_search points=8
  if (opt.beam < 1 || opt.n_best < 1 || opt.n_best > opt.beam || opt.alpha < 0 || opt.max_extra < 0)
    throw std::invalid_argument("beam search needs beam >= 1, 1 <= n_best <= beam, alpha >= 0, max_extra >= 0");
  const int V = dm.cfg.V, B = (int)src.size(), K = opt.beam;
  std::vector<std::vector<Hypothesis>> finished(B);
  if (B == 0) return finished;
  std::vector<Hypothesis> live(B);  // the live hypotheses of every sentence, one per cache row
  std::vector<int> limit(B), row_sentence(B);
  int longest = 0;
  for (int b = 0; b < B; ++b) {
    limit[b] = max_output_length(dm.cfg, (int)src[b].size(), opt.max_extra);
    longest = std::max(longest, limit[b]);
    row_sentence[b] = b;
  }
  DecoderCache<Ops, T> k = start_decoding<Ops>(dm, src, longest, B * K);
  std::vector<int> token(B, kBosId);
  std::vector<T> logprob;
  struct Candidate { double logprob; int row, token; };
  auto better = [](const Candidate& a, const Candidate& b) {
    return a.logprob != b.logprob ? a.logprob > b.logprob : a.row != b.row ? a.row < b.row : a.token < b.token;
  };
  auto by_score = [](const Hypothesis& a, const Hypothesis& b) { return a.score > b.score; };
  while (k.R > 0) {
    logprob.resize((size_t)k.R * V);
    decoder_step(dm, k, token.data(), logprob.data());
    std::vector<Hypothesis> next_live;
    std::vector<int> parent, next_token, next_sentence;
    for (int r0 = 0; r0 < k.R;) {  // the rows r0..r1-1 belong to one sentence
      const int b = row_sentence[r0];
      int r1 = r0;
      while (r1 < k.R && row_sentence[r1] == b) ++r1;
      // the K best extensions of this sentence's live hypotheses (each row's K best tokens suffice)
      std::vector<Candidate> cand;
      std::vector<int> best;  // a row's K best tokens so far, best first (of equal ones, the lower id first)
      for (int r = r0; r < r1; ++r) {
        const T* lp = logprob.data() + (size_t)r * V;
        best.clear();
        for (int v = 0; v < V; ++v) {  // one pass, most tokens rejected by one comparison
          if ((int)best.size() < K) best.push_back(v);
          else if (lp[v] > lp[best.back()]) best.back() = v;
          else continue;
          for (size_t i = best.size() - 1; i > 0 && lp[best[i]] > lp[best[i - 1]]; --i) std::swap(best[i], best[i - 1]);
        }
        for (int v : best) cand.push_back({live[r].logprob + lp[v], r, v});
      }
      std::sort(cand.begin(), cand.end(), better);
      if ((int)cand.size() > K) cand.resize(K);
      std::vector<Hypothesis> grown;
      std::vector<int> grown_parent, grown_token;
      for (const Candidate& cd : cand) {
        Hypothesis h = live[cd.row];  // the parent, extended below
        h.logprob = cd.logprob;
        if (cd.token == kEosId) {
          h.finished = true;
          h.score = h.logprob / length_penalty((int)h.tokens.size() + 1, opt.alpha);
          finished[b].push_back(h);
          continue;
        }
        h.tokens.push_back(cd.token);
        if ((int)h.tokens.size() >= limit[b]) {  // the length limit: finished as it stands
          h.score = h.logprob / length_penalty((int)h.tokens.size(), opt.alpha);
          finished[b].push_back(h);
          continue;
        }
        grown.push_back(h);
        grown_parent.push_back(cd.row);
        grown_token.push_back(cd.token);
      }
      // [§6] stop early once no live hypothesis can beat the n_best-th finished one
      std::sort(finished[b].begin(), finished[b].end(), by_score);
      bool done = grown.empty();
      if (!done && (int)finished[b].size() >= opt.n_best) {
        double bound = -INFINITY;
        for (const Hypothesis& h : grown) bound = std::max(bound, h.logprob / length_penalty(limit[b], opt.alpha));
        done = finished[b][opt.n_best - 1].score >= bound;
      }
      if (!done)
        for (size_t i = 0; i < grown.size(); ++i) {
          next_live.push_back(grown[i]);
          parent.push_back(grown_parent[i]);
          next_token.push_back(grown_token[i]);
          next_sentence.push_back(b);
        }
      r0 = r1;
    }
    live.swap(next_live);
    token.swap(next_token);
    row_sentence.swap(next_sentence);
    if (!parent.empty()) reorder_rows(k, parent, dm.cfg.D);
    else k.R = 0;
  }
  for (auto& f : finished) {
    std::stable_sort(f.begin(), f.end(), by_score);
    if ((int)f.size() > opt.n_best) f.resize(opt.n_best);
  }
  return finished;
  // END SOLUTION
}

// The model on the CPU, as decoding sees it.
template <typename T> static DecodingModel<T> host_decoding_model(Transformer<T>& m) {
  return {m.cfg, m.W, [&m](const Batch& batch) {
            prepare_host(m, batch);
            encoder_forward<CpuOps>(host_pass(m, batch, false));
            return (const T*)m.acts.enc.out;
          }};
}

// The weights every decoder step multiplies, for the CPU's float product to pack once per decoding
// rather than once per step (cpu::PackedOperands): a step multiplies each by only a few rows.
template <typename T> static std::vector<cpu::GemmOperand> decoder_step_operands(const Config& c, const Weights<T>& W) {
  std::vector<cpu::GemmOperand> operands;
  if constexpr (std::is_same_v<T, float>) {
    auto linear = [&](const float* w, int I, int O) { operands.push_back({false, O, I, w, O}); };  // in @ w
    for (const DecoderLayerWeights<float>& l : W.dec) {
      for (const float* w : {l.self.wq, l.self.wk, l.self.wv, l.self.wo, l.cross.wq, l.cross.wo}) linear(w, c.D, c.D);
      linear(l.ffn.w1, c.D, c.F), linear(l.ffn.w2, c.F, c.D);
    }
    operands.push_back({true, c.V, c.D, W.emb, c.D});  // y @ emb^T [§3.4]
  }
  return operands;
}

// Decoding runs where the model is: on its device (float only) when it has one, else on the CPU.
template <typename T>
std::vector<Hypothesis> greedy_decode(Transformer<T>& m, const std::vector<std::vector<int>>& src, int max_extra) {
  if constexpr (std::is_same_v<T, float>)
    if (m.device) return m.device->greedy_decode(src, max_extra);
  const cpu::PackedOperands packed(decoder_step_operands(m.cfg, m.W));
  return greedy_decode_on<CpuOps>(host_decoding_model(m), src, max_extra);
}

template <typename T>
std::vector<std::vector<Hypothesis>> beam_search(Transformer<T>& m, const std::vector<std::vector<int>>& src,
                                                 const DecodeOptions& opt) {
  if constexpr (std::is_same_v<T, float>)
    if (m.device) return m.device->beam_search(src, opt);
  const cpu::PackedOperands packed(decoder_step_operands(m.cfg, m.W));
  return beam_search_on<CpuOps>(host_decoding_model(m), src, opt);
}

template <typename T>
std::vector<T> decoder_logprobs(Transformer<T>& m, const std::vector<int>& src, const std::vector<int>& y) {
  if constexpr (std::is_same_v<T, float>)
    if (m.device) return m.device->decoder_logprobs(src, y);
  const cpu::PackedOperands packed(decoder_step_operands(m.cfg, m.W));
  return decoder_logprobs_on<CpuOps>(host_decoding_model(m), src, y);
}
