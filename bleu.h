// BLEU (Papineni et al., 2002) exactly as sacreBLEU 2.x computes it with its defaults: one reference,
// 13a tokenisation, exponential smoothing, mixed case (or --lowercase). The paper reports BLEU (§6);
// comparable figures need sacreBLEU's definition, which this reproduces to the last printed digit
// (test/bleu_golden.cpp checks it against sacreBLEU 2.6.0's own output).
#pragma once
#include <utf8proc.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace bleu_detail {

// What Python's str.split() and str.rstrip() treat as whitespace (sacreBLEU uses both).
inline bool python_space(int32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Code points of UTF-8 text with their byte spans; invalid bytes pass through as U+FFFD of length 1.
struct Char { int32_t cp; size_t at, len; };
inline std::vector<Char> chars_of(const std::string& s) {
  std::vector<Char> out;
  for (size_t i = 0; i < s.size();) {
    int32_t cp;
    utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t*)s.data() + i, (utf8proc_ssize_t)(s.size() - i), &cp);
    if (n <= 0) cp = 0xFFFD, n = 1;
    out.push_back({cp, i, (size_t)n});
    i += n;
  }
  return out;
}

// Python's str.lower(): the Unicode lowercase mapping; U+0130 is its one multi-character case.
inline std::string lowercase(const std::string& s) {
  std::string o;
  for (const Char& c : chars_of(s)) {
    if (c.cp == 0x130) {
      o += "i\xCC\x87";
      continue;
    }
    utf8proc_uint8_t buf[4];
    utf8proc_ssize_t n = utf8proc_encode_char(utf8proc_tolower(c.cp), buf);
    o.append((const char*)buf, n);
  }
  return o;
}

inline void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size()) s.replace(at, from.size(), to);
}

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

// sacreBLEU's 13a punctuation class [\{-\~\[-\` -\&\(-\+\:-\@\/]: ASCII symbols except ' , - .
inline bool punct_13a(char c) {
  return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') || (c >= '(' && c <= '+') ||
         (c >= ':' && c <= '@') || c == '/';
}

}  // namespace bleu_detail

// mteval-v13a's tokenisation, as sacreBLEU's TokenizerV13a: unescape a few entities, split ASCII
// punctuation off, split periods and commas unless between digits, split a dash after a digit, then
// collapse whitespace. (Byte-wise scanning equals sacreBLEU's per-character regexes: every pattern's
// special characters are ASCII, and UTF-8 continuation bytes never are.)
inline std::string tokenize_13a(const std::string& line) {
  using namespace bleu_detail;
  std::string s = line;
  replace_all(s, "<skipped>", "");
  replace_all(s, "-\n", "");
  replace_all(s, "\n", " ");
  if (s.find('&') != std::string::npos) {
    replace_all(s, "&quot;", "\"");
    replace_all(s, "&amp;", "&");
    replace_all(s, "&lt;", "<");
    replace_all(s, "&gt;", ">");
  }
  s = " " + s + " ";
  std::string a;  // ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> " \1 "
  for (char c : s) {
    if (punct_13a(c)) a += ' ', a += c, a += ' ';
    else a += c;
  }
  std::string b;  // ([^0-9])([\.,]) -> "\1 \2 "
  for (size_t i = 0; i < a.size(); ++i) {
    if (i + 1 < a.size() && !is_digit(a[i]) && (a[i + 1] == '.' || a[i + 1] == ',')) {
      b += a[i], b += ' ', b += a[i + 1], b += ' ';
      ++i;
    } else b += a[i];
  }
  std::string c;  // ([\.,])([^0-9]) -> " \1 \2"
  for (size_t i = 0; i < b.size(); ++i) {
    if (i + 1 < b.size() && (b[i] == '.' || b[i] == ',') && !is_digit(b[i + 1])) {
      c += ' ', c += b[i], c += b[i + 1];
      ++i;
    } else c += b[i];
  }
  std::string d;  // ([0-9])(-) -> "\1 \2 "
  for (size_t i = 0; i < c.size(); ++i) {
    if (i + 1 < c.size() && is_digit(c[i]) && c[i + 1] == '-') {
      d += c[i], d += " - ";
      ++i;
    } else d += c[i];
  }
  std::string out;  // ' '.join(line.split())
  bool gap = false;
  for (const Char& ch : chars_of(d)) {
    if (python_space(ch.cp)) {
      gap = !out.empty();
      continue;
    }
    if (gap) out += ' ';
    gap = false;
    out.append(d, ch.at, ch.len);
  }
  return out;
}

struct BleuScore {
  double score = 0;                    // 0 .. 100
  std::array<long, 4> counts{}, totals{};  // matching and total n-grams, n = 1 .. 4
  std::array<double, 4> precisions{};  // percentages
  double bp = 0, ratio = 0;            // brevity penalty, hyp_len / ref_len
  long hyp_len = 0, ref_len = 0;
  // "BLEU = 33.93 63.0/39.7/27.6/19.2 (BP = 1.000 ratio = 1.059 hyp_len = 12816 ref_len = 12106)"
  std::string format() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f ratio = %.3f hyp_len = %ld ref_len = %ld)", score,
                  precisions[0], precisions[1], precisions[2], precisions[3], bp, ratio, hyp_len, ref_len);
    return buf;
  }
};

// sacreBLEU's configuration string
inline std::string bleu_signature(bool lowercase) {
  return std::string("nrefs:1|case:") + (lowercase ? "lc" : "mixed") + "|eff:no|tok:13a|smooth:exp";
}

// The score from the sufficient statistics, as sacreBLEU's compute_bleu with 'exp' smoothing: an n-gram
// order without matches gets precision 100 / (2^k total), k counting such orders so far. With
// effective_order (sentence BLEU), orders beyond the longest n-gram the hypothesis has are left out.
inline BleuScore bleu_from_statistics(const std::array<long, 4>& counts, const std::array<long, 4>& totals, long hyp_len,
                                      long ref_len, bool effective_order) {
  BleuScore s;
  s.counts = counts, s.totals = totals, s.hyp_len = hyp_len, s.ref_len = ref_len;
  s.ratio = ref_len > 0 ? (double)hyp_len / ref_len : 0.0;
  s.bp = hyp_len < ref_len ? (hyp_len > 0 ? std::exp(1.0 - (double)ref_len / hyp_len) : 0.0) : 1.0;
  if (counts[0] == 0 && counts[1] == 0 && counts[2] == 0 && counts[3] == 0) return s;  // no match at all: 0
  double smooth = 1, log_sum = 0;
  int order = 4;
  for (int n = 0; n < 4; ++n) {
    if (totals[n] == 0) break;
    if (effective_order) order = n + 1;
    if (counts[n] == 0) {
      smooth *= 2;
      s.precisions[n] = 100.0 / (smooth * totals[n]);
    } else {
      s.precisions[n] = 100.0 * counts[n] / totals[n];
    }
  }
  for (int n = 0; n < order; ++n) log_sum += s.precisions[n] == 0 ? -9999999999.0 : std::log(s.precisions[n]);
  s.score = s.bp * std::exp(log_sum / order);
  return s;
}

namespace bleu_detail {

// Adds one segment's n-gram matches and totals (n = 1 .. 4) and lengths.
inline void add_segment(const std::string& hyp, const std::string& ref, bool lowercase, std::array<long, 4>& counts,
                        std::array<long, 4>& totals, long& hyp_len, long& ref_len) {
  auto words = [&](const std::string& text) {
    std::string t = text;
    std::vector<Char> cs = chars_of(t);  // rstrip(), as sacreBLEU does before tokenising
    size_t end = t.size();
    for (size_t i = cs.size(); i-- > 0 && python_space(cs[i].cp);) end = cs[i].at;
    t.resize(end);
    if (lowercase) t = bleu_detail::lowercase(t);
    std::vector<std::string> w;
    std::string tok = tokenize_13a(t);
    for (size_t i = 0; i < tok.size();) {
      size_t j = tok.find(' ', i);
      if (j == std::string::npos) j = tok.size();
      w.push_back(tok.substr(i, j - i));
      i = j + 1;
    }
    return w;
  };
  const std::vector<std::string> h = words(hyp), r = words(ref);
  hyp_len += (long)h.size();
  ref_len += (long)r.size();
  for (int n = 1; n <= 4; ++n) {
    std::map<std::vector<std::string>, long> ref_ngrams;
    for (size_t i = 0; i + n <= r.size(); ++i) ++ref_ngrams[std::vector<std::string>(r.begin() + i, r.begin() + i + n)];
    std::map<std::vector<std::string>, long> hyp_ngrams;
    for (size_t i = 0; i + n <= h.size(); ++i) ++hyp_ngrams[std::vector<std::string>(h.begin() + i, h.begin() + i + n)];
    for (const auto& [g, k] : hyp_ngrams) {
      auto it = ref_ngrams.find(g);
      if (it != ref_ngrams.end()) counts[n - 1] += std::min(k, it->second);  // clipped counts
      totals[n - 1] += k;
    }
  }
}

}  // namespace bleu_detail

// Corpus BLEU: n-gram statistics summed over all segments, then one score (sacreBLEU's corpus_bleu).
inline BleuScore corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs, bool lowercase = false) {
  if (hyps.size() != refs.size())
    throw std::invalid_argument("BLEU: " + std::to_string(hyps.size()) + " hypotheses but " + std::to_string(refs.size()) + " references");
  std::array<long, 4> counts{}, totals{};
  long hyp_len = 0, ref_len = 0;
  for (size_t i = 0; i < hyps.size(); ++i) bleu_detail::add_segment(hyps[i], refs[i], lowercase, counts, totals, hyp_len, ref_len);
  return bleu_from_statistics(counts, totals, hyp_len, ref_len, false);
}

// Sentence BLEU (sacreBLEU's sentence_bleu: effective order on, as it defaults to).
inline BleuScore sentence_bleu(const std::string& hyp, const std::string& ref, bool lowercase = false) {
  std::array<long, 4> counts{}, totals{};
  long hyp_len = 0, ref_len = 0;
  bleu_detail::add_segment(hyp, ref, lowercase, counts, totals, hyp_len, ref_len);
  return bleu_from_statistics(counts, totals, hyp_len, ref_len, true);
}
