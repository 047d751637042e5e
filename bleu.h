// BLEU (Papineni et al., 2002), the metric of the paper's Table 2 (§6.1), exactly as sacreBLEU 2.x computes
// it with its defaults: one reference, 13a tokenisation, exponential smoothing, mixed case; lowercase on
// request. The paper does not say which BLEU script it used; sacreBLEU's definition makes our figures
// comparable with everyone else's. test/bleu_golden.cpp checks every figure sacreBLEU 2.6.0 wrote into
// test/golden/bleu/golden.json.
//
// Header-only: ./translate, ./train's validation and the tests share these inline functions.
//
// sacreBLEU is Python: what it calls str.split(), str.rstrip() and str.lower() is reproduced here on
// UTF-8 bytes with utf8proc's character tables. Checked code point by code point against Python 3.11:
// identical except for characters that one Unicode version has and the other lacks (utf8proc 2.8 has
// Unicode 15, Python 3.11 Unicode 14).
#pragma once
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace bleu_detail {

// One code point of UTF-8 text and the bytes it spans; an invalid byte is taken alone, as U+FFFD.
struct CodePoint {
  int32_t cp;
  size_t at, len;
};

inline std::vector<CodePoint> code_points(const std::string& s) {
  std::vector<CodePoint> out;
  for (size_t i = 0; i < s.size();) {
    int32_t cp;
    utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data()) + i,
                                          static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) cp = 0xFFFD, n = 1;
    out.push_back({cp, i, static_cast<size_t>(n)});
    i += n;
  }
  return out;
}

inline void append_utf8(std::string& out, int32_t cp) {
  utf8proc_uint8_t buf[4];
  out.append(reinterpret_cast<const char*>(buf), utf8proc_encode_char(cp, buf));
}

// Python's str.isspace(): bidirectional class WS, B or S, or category Zs. str.split() and str.rstrip()
// cut at these.
inline bool python_isspace(int32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python's str.split() with no argument: the words between runs of whitespace.
inline std::vector<std::string> python_split(const std::string& s) {
  std::vector<std::string> words;
  bool in_word = false;
  for (const CodePoint& c : code_points(s)) {
    if (python_isspace(c.cp)) {
      in_word = false;
      continue;
    }
    if (!in_word) words.emplace_back();
    in_word = true;
    words.back().append(s, c.at, c.len);
  }
  return words;
}

// Python's str.rstrip() with no argument.
inline std::string python_rstrip(const std::string& s) {
  std::vector<CodePoint> cs = code_points(s);
  size_t end = s.size();
  for (size_t i = cs.size(); i-- > 0 && python_isspace(cs[i].cp);) end = cs[i].at;
  return s.substr(0, end);
}

// Unicode's Cased and Case_Ignorable properties, which decide Python's final-sigma rule. Cased: categories
// Lu, Ll, Lt, anything with a case mapping, and the Other_Lowercase/Other_Uppercase characters that have
// neither: the ordinal indicators ª º and the squared and negative circled/squared capitals A-Z (the
// other such characters are Lm, case-ignorable, so skipped before cased-ness is asked).
inline bool is_cased(int32_t c) {
  utf8proc_category_t cat = utf8proc_category(c);
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT ||
         utf8proc_tolower(c) != c || utf8proc_toupper(c) != c || c == 0xAA || c == 0xBA ||
         (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189);
}

// Case_Ignorable: categories Mn, Me, Cf, Lm, Sk, and Word_Break MidLetter, MidNumLet or Single_Quote.
inline bool is_case_ignorable(int32_t c) {
  utf8proc_category_t cat = utf8proc_category(c);
  if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_ME || cat == UTF8PROC_CATEGORY_CF ||
      cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_SK)
    return true;
  switch (c) {
    case 0x27: case 0x2E: case 0x3A: case 0xB7: case 0x387: case 0x55F: case 0x5F4: case 0x2018: case 0x2019:
    case 0x2024: case 0x2027: case 0xFE13: case 0xFE52: case 0xFE55: case 0xFF07: case 0xFF0E: case 0xFF1A:
      return true;
    default:
      return false;
  }
}

// Python's str.lower(): the full lowercase mapping. It differs from the simple one (utf8proc_tolower) in
// two places only: U+0130 İ becomes i + U+0307, and capital sigma becomes final ς at the end of a word
// (a cased letter before it and none after it, case-ignorable characters skipped both ways).
inline std::string python_lower(const std::string& s) {
  const std::vector<CodePoint> cs = code_points(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < cs.size(); ++i) {
    const int32_t c = cs[i].cp;
    if (c == 0x130) {
      out += "i\xCC\x87";
    } else if (c == 0x3A3) {
      size_t j = i;
      while (j > 0 && is_case_ignorable(cs[j - 1].cp)) --j;
      bool final_sigma = j > 0 && is_cased(cs[j - 1].cp);
      size_t k = i + 1;
      while (k < cs.size() && is_case_ignorable(cs[k].cp)) ++k;
      if (k < cs.size() && is_cased(cs[k].cp)) final_sigma = false;
      append_utf8(out, final_sigma ? 0x3C2 : 0x3C3);
    } else if (c == 0xFFFD && s.compare(cs[i].at, cs[i].len, "\xEF\xBF\xBD") != 0) {
      out.append(s, cs[i].at, cs[i].len);  // an invalid byte passes through unchanged
    } else {
      append_utf8(out, utf8proc_tolower(c));
    }
  }
  return out;
}

inline void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size()) s.replace(at, from.size(), to);
}

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_period_or_comma(char c) { return c == '.' || c == ','; }

// 13a's symbol class [\{-\~\[-\` -\&\(-\+\:-\@\/]: every printable ASCII character that is not a letter,
// a digit, ' , - or . (space is in it too, which only adds spaces).
inline bool is_13a_symbol(char c) {
  return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') || (c >= '(' && c <= '+') ||
         (c >= ':' && c <= '@') || c == '/';
}

// Python's re.sub(r'(A)(B)', pre + r'\1 \2' + post, s) for one-character classes A and B: a left-to-right
// scan whose matches do not overlap. Working on bytes gives what Python gets on code points, because
// A or B is always an ASCII class and UTF-8 never uses an ASCII byte inside a multi-byte character.
template <class First, class Second>
inline std::string split_pairs(const std::string& s, First first, Second second, const char* pre, const char* post) {
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  for (size_t i = 0; i < s.size(); ++i) {
    if (i + 1 < s.size() && first(s[i]) && second(s[i + 1])) {
      out += pre, out += s[i], out += ' ', out += s[i + 1], out += post;
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace bleu_detail

// mteval-v13a's tokenisation, as sacreBLEU's Tokenizer13a: drop "<skipped>", join lines, unescape four
// HTML entities, then set ASCII symbols apart, split periods and commas off words (not off numbers:
// 3.14 and 1,000 stay whole), split a dash that follows a digit, and leave single spaces between tokens.
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
  std::string spaced;  // ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> " \1 "
  for (char c : s) {
    if (is_13a_symbol(c)) spaced += ' ', spaced += c, spaced += ' ';
    else spaced += c;
  }
  auto not_digit = [](char c) { return !is_digit(c); };
  spaced = split_pairs(spaced, not_digit, is_period_or_comma, "", " ");  // ([^0-9])([\.,]) -> "\1 \2 "
  spaced = split_pairs(spaced, is_period_or_comma, not_digit, " ", "");  // ([\.,])([^0-9]) -> " \1 \2"
  spaced = split_pairs(spaced, is_digit, [](char c) { return c == '-'; }, "", " ");  // ([0-9])(-) -> "\1 \2 "
  std::string out;  // ' '.join(line.split())
  for (const std::string& w : python_split(spaced)) out += (out.empty() ? "" : " ") + w;
  return out;
}

// sacreBLEU's sufficient statistics of one segment or a sum of segments: the hypothesis and reference
// lengths in 13a tokens, and for n = 1..4 the clipped n-gram matches and the hypothesis n-grams.
struct BleuStatistics {
  long hyp_len = 0, ref_len = 0;
  std::array<long, 4> matches{}, totals{};
  BleuStatistics& operator+=(const BleuStatistics& o) {
    hyp_len += o.hyp_len, ref_len += o.ref_len;
    for (int n = 0; n < 4; ++n) matches[n] += o.matches[n], totals[n] += o.totals[n];
    return *this;
  }
};

struct BleuScore {
  double score = 0;                        // 0..100
  std::array<long, 4> counts{}, totals{};  // matched / total n-grams, n = 1..4
  std::array<double, 4> precisions{};      // percentages
  double bp = 0, ratio = 0;                // brevity penalty, hyp_len / ref_len
  long hyp_len = 0, ref_len = 0;

  // As sacreBLEU prints it:
  // "BLEU = 33.93 63.0/39.7/27.6/19.2 (BP = 1.000 ratio = 1.059 hyp_len = 12816 ref_len = 12106)"
  std::string format() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f ratio = %.3f hyp_len = %ld ref_len = %ld)",
                  score, precisions[0], precisions[1], precisions[2], precisions[3], bp, ratio, hyp_len, ref_len);
    return buf;
  }
};

// sacreBLEU's signature of corpus_bleu()'s settings, version included: the one this reproduces.
inline std::string bleu_signature(bool lowercase) {
  return std::string("nrefs:1|case:") + (lowercase ? "lc" : "mixed") + "|eff:no|tok:13a|smooth:exp|version:2.6.0";
}

namespace bleu_detail {

// What sacreBLEU scores of a segment: lowercased on request, trailing whitespace cut, 13a-tokenised, split.
inline std::vector<std::string> segment_words(const std::string& segment, bool lowercase) {
  return python_split(tokenize_13a(python_rstrip(lowercase ? python_lower(segment) : segment)));
}

// How often each n-gram of order n occurs; an n-gram is keyed by its words joined with spaces (13a
// tokens contain no space, so the key is unambiguous).
inline std::unordered_map<std::string, long> ngram_counts(const std::vector<std::string>& words, int n) {
  std::unordered_map<std::string, long> counts;
  for (size_t i = 0; i + n <= words.size(); ++i) {
    std::string key = words[i];
    for (int k = 1; k < n; ++k) key += ' ' + words[i + k];
    ++counts[key];
  }
  return counts;
}

}  // namespace bleu_detail

// One segment's statistics: each hypothesis n-gram matches at most as often as the reference has it
// (the "modified n-gram precision" of Papineni et al., §2.1).
inline BleuStatistics bleu_statistics(const std::string& hyp, const std::string& ref, bool lowercase) {
  // BEGIN SOLUTION task=bleu_statistics points=4
  using namespace bleu_detail;
  const std::vector<std::string> h = segment_words(hyp, lowercase), r = segment_words(ref, lowercase);
  BleuStatistics st;
  st.hyp_len = static_cast<long>(h.size());
  st.ref_len = static_cast<long>(r.size());
  for (int n = 1; n <= 4; ++n) {
    const auto ref_counts = ngram_counts(r, n);
    for (const auto& [ngram, count] : ngram_counts(h, n)) {
      auto it = ref_counts.find(ngram);
      if (it != ref_counts.end()) st.matches[n - 1] += std::min(count, it->second);
      st.totals[n - 1] += count;
    }
  }
  return st;
  // END SOLUTION
}

// The score from the statistics, as sacreBLEU's BLEU.compute_bleu with smooth_method 'exp':
//   BLEU = BP * exp(mean over n of log p_n),  BP = 1 if hyp_len >= ref_len else exp(1 - ref_len / hyp_len).
// No match at all scores 0. Exponential smoothing (NIST's, mteval-v13a's): the k-th order without a
// match gets p_n = 100 / (2^k * totals_n). An order with no hypothesis n-gram ends the loop and keeps
// p_n = 0, whose log sacreBLEU floors at -9999999999 (so the score is 0) unless `effective_order`
// (sentence BLEU) leaves such orders out of the mean.
inline BleuScore bleu_from_statistics(const BleuStatistics& st, bool effective_order) {
  BleuScore s;
  s.counts = st.matches, s.totals = st.totals, s.hyp_len = st.hyp_len, s.ref_len = st.ref_len;
  s.ratio = st.ref_len ? static_cast<double>(st.hyp_len) / st.ref_len : 0.0;
  s.bp = st.hyp_len >= st.ref_len ? 1.0 : st.hyp_len > 0 ? std::exp(1.0 - static_cast<double>(st.ref_len) / st.hyp_len) : 0.0;
  if (st.matches == std::array<long, 4>{}) return s;
  double smooth = 1;
  int order = 4;
  for (int n = 0; n < 4 && st.totals[n] > 0; ++n) {
    if (effective_order) order = n + 1;
    if (st.matches[n] == 0) {
      smooth *= 2;
      s.precisions[n] = 100.0 / (smooth * st.totals[n]);
    } else {
      s.precisions[n] = 100.0 * st.matches[n] / st.totals[n];
    }
  }
  // sacreBLEU takes exp(mean log p_n) of the percentages, which rounds a perfect match to 100.00000000000004
  // (found by test/fuzz/fuzz_bleu); the mean of log(p_n / 100) is never above 0, so the score stays within
  // [0, 100], and it differs from sacreBLEU's by a few units in the 15th digit at most.
  double log_sum = 0;
  for (int n = 0; n < order; ++n) log_sum += s.precisions[n] == 0 ? -9999999999.0 : std::log(s.precisions[n] / 100);
  s.score = 100 * s.bp * std::exp(log_sum / order);
  return s;
}

// Corpus BLEU (sacreBLEU's corpus_bleu): statistics summed over all segments, then one score. An empty
// corpus has all statistics 0 and scores 0 with BP 1.
inline BleuScore corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs,
                             bool lowercase = false) {
  if (hyps.size() != refs.size())
    throw std::invalid_argument("BLEU: " + std::to_string(hyps.size()) + " hypotheses but " +
                                std::to_string(refs.size()) + " references");
  BleuStatistics total;
  for (size_t i = 0; i < hyps.size(); ++i) total += bleu_statistics(hyps[i], refs[i], lowercase);
  return bleu_from_statistics(total, false);
}

// Sentence BLEU (sacreBLEU's sentence_bleu, whose default is effective order: a short hypothesis is
// scored on the n-gram orders it has).
inline BleuScore sentence_bleu(const std::string& hyp, const std::string& ref, bool lowercase = false) {
  return bleu_from_statistics(bleu_statistics(hyp, ref, lowercase), true);
}
