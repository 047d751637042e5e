// fuzz_bleu: BLEU's 13a tokeniser and scorer (bleu.h) on arbitrary bytes, valid UTF-8 or not. The input
// is split at its first 0xFF byte (never part of UTF-8) into hypotheses and references, one a line,
// padded with empty lines to the same count. Properties: corpus and sentence BLEU, mixed case and
// lowercase (sentences: the first three), are never NaN and lie in [0, 100]; matches <= n-grams <= words; a corpus scored against
// itself matches every n-gram; 13a leaves single spaces; the printed line is one line.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../../bleu.h"
#include "fuzz.h"

static std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= s.size();) {
    size_t end = s.find('\n', at);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

static void check_score(const BleuScore& s, const char* what) {
  FUZZ_CHECK(s.score >= 0 && s.score <= 100, "%s BLEU is %g", what, s.score);  // false for NaN too
  for (int n = 0; n < 4; ++n) {
    FUZZ_CHECK(s.counts[n] >= 0 && s.counts[n] <= s.totals[n], "%s: %ld matches of %ld %d-grams", what, s.counts[n], s.totals[n], n + 1);
    FUZZ_CHECK(s.totals[n] <= s.hyp_len, "%s: %ld %d-grams in %ld words", what, s.totals[n], n + 1, s.hyp_len);
    FUZZ_CHECK(s.precisions[n] >= 0 && s.precisions[n] <= 100, "%s: precision %g", what, s.precisions[n]);
  }
  FUZZ_CHECK(s.bp >= 0 && s.bp <= 1 && std::isfinite(s.ratio) && s.ratio >= 0, "%s: BP %g ratio %g", what, s.bp, s.ratio);
  FUZZ_CHECK(s.format().find('\n') == std::string::npos, "%s: the score line holds a newline", what);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes((const char*)data, size);
  const size_t cut = bytes.find('\xFF');
  std::vector<std::string> hyps = lines_of(bytes.substr(0, cut)),
                           refs = cut == std::string::npos ? hyps : lines_of(bytes.substr(cut + 1));
  hyps.resize(std::max(hyps.size(), refs.size())), refs.resize(hyps.size());
  for (bool lowercase : {false, true}) {
    check_score(corpus_bleu(hyps, refs, lowercase), lowercase ? "corpus (lowercase)" : "corpus");
    for (size_t i = 0; i < hyps.size() && i < 3; ++i) check_score(sentence_bleu(hyps[i], refs[i], lowercase), "sentence");
  }
  const BleuScore self = corpus_bleu(hyps, hyps);
  check_score(self, "corpus against itself");
  FUZZ_CHECK(self.counts == self.totals && self.hyp_len == self.ref_len, "a corpus against itself misses an n-gram");
  for (size_t i = 0; i < hyps.size() && i < 3; ++i) {
    const std::string t = tokenize_13a(hyps[i]);
    FUZZ_CHECK(t.find("  ") == std::string::npos && (t.empty() || (t.front() != ' ' && t.back() != ' ')),
               "13a left a double or outer space: \"%s\"", t.c_str());
  }
  return 0;
}
