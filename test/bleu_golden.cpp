// bleu_golden: bleu.h reproduces sacreBLEU 2.6.0. GOLDEN_DIR/golden.json was written by sacreBLEU itself:
// every corpus score there (with its n-gram counts, totals, lengths, BP and signature), every sentence
// score and the 13a tokenisation of every listed string are recomputed here from text, scores to 4
// decimals, integers exactly. Then the printed line and hand-made edge cases: empty hypothesis, empty
// corpus, no match, exponential smoothing, effective order, lowercase, bad input.
//
// Usage: bleu_golden GOLDEN_DIR   (test/golden/bleu: golden.json, the hypotheses and the reference it names;
// a missing file is a failure)
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../bleu.h"
#include "check.h"

// ---- a minimal JSON reader: enough for golden.json -----------------------------------------------------

struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  double number = 0;  // also a bool's value, 0 or 1
  std::string text;
  std::vector<Json> items;                         // Array
  std::vector<std::pair<std::string, Json>> fields;  // Object, in file order

  const Json* find(const std::string& key) const {
    for (const auto& [k, v] : fields)
      if (k == key) return &v;
    return nullptr;
  }
  const Json& operator[](const std::string& key) const {
    if (const Json* v = find(key)) return *v;
    throw std::runtime_error("golden.json: no field '" + key + "'");
  }
  long integer() const { return static_cast<long>(number); }
};

class JsonReader {
 public:
  explicit JsonReader(const std::string& text) : s_(text) {}
  Json document() {
    Json v = value();
    skip_space();
    if (i_ != s_.size()) fail("text after the document");
    return v;
  }

 private:
  const std::string& s_;
  size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("golden.json: " + what + " at byte " + std::to_string(i_));
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool take(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) return ++i_, true;
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }
  unsigned hex4() {
    if (i_ + 4 > s_.size()) fail("short \\u escape");
    unsigned v = std::stoul(s_.substr(i_, 4), nullptr, 16);
    i_ += 4;
    return v;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) fail("unterminated escape");
      switch (char e = s_[i_++]) {
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && s_.compare(i_, 2, "\\u") == 0) {  // a surrogate pair
            i_ += 2;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4() - 0xDC00);
          }
          bleu_detail::append_utf8(out, static_cast<int32_t>(cp));
          break;
        }
        default: out += e;  // \" \\ \/
      }
    }
  }
  Json value() {
    skip_space();
    if (i_ >= s_.size()) fail("unexpected end");
    Json v;
    const char c = s_[i_];
    if (c == '{') {
      v.kind = Json::Object;
      ++i_;
      if (take('}')) return v;
      do {
        std::string key = string();
        expect(':');
        v.fields.emplace_back(std::move(key), value());
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      v.kind = Json::Array;
      ++i_;
      if (take(']')) return v;
      do v.items.push_back(value());
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::String;
      v.text = string();
    } else if (s_.compare(i_, 4, "true") == 0 || s_.compare(i_, 5, "false") == 0) {
      v.kind = Json::Bool;
      v.number = c == 't';
      i_ += c == 't' ? 4 : 5;
    } else if (s_.compare(i_, 4, "null") == 0) {
      i_ += 4;
    } else {
      v.kind = Json::Number;
      size_t used = 0;
      try {
        v.number = std::stod(s_.substr(i_, 32), &used);
      } catch (const std::exception&) {
        fail("bad value");
      }
      i_ += used;
    }
    return v;
  }
};

// ---- text files ----------------------------------------------------------------------------------------

static bool exists(const std::string& path) { return std::ifstream(path).good(); }

// The lines of a text file (a .gz one through gzip -dc), without their '\n'.
static std::vector<std::string> read_lines(const std::string& path) {
  std::string text;
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(("gzip -dc -- '" + path + "'").c_str(), "r"), pclose);
    if (!pipe) throw std::runtime_error("cannot run gzip on " + path);
    char buf[65536];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe.get())) > 0;) text.append(buf, n);
  } else {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path);
    std::ostringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return lines;
}

static std::vector<std::string> first(std::vector<std::string> lines, size_t n) {
  if (lines.size() > n) lines.resize(n);
  return lines;
}

// ---- the golden cases ----------------------------------------------------------------------------------

// "To 4 decimals": |got - want| <= 5e-5 on the 0..100 scale. Checker::close with rtol 5e-7 and atol 5e-5
// divides every error by max(|want|, 100) = 100, so this is exactly that bound.
constexpr double kRtol = 5e-7, kAtol = 5e-5;

// The hypotheses and references of one corpus case of golden.json, rebuilt from its name: a hypothesis
// file of GOLDEN_DIR ("+first100": its first 100 lines), the references against themselves, or one of
// the two cases made from the references (verified against sacreBLEU when this test was written).
static bool corpus_case(const std::string& name, const std::string& dir, const std::vector<std::string>& refs,
                        std::vector<std::string>& hyps, std::vector<std::string>& rs) {
  rs = refs;
  if (name == "reference_vs_itself") {
    hyps = refs;
  } else if (name == "shorter_hyp_brevity") {  // the first 200 references, each cut to the first half of its words
    rs = first(refs, 200);
    hyps.clear();
    for (const std::string& r : rs) {
      std::vector<std::string> words = bleu_detail::python_split(r);
      std::string h;
      for (size_t k = 0; k < words.size() / 2; ++k) h += (k ? " " : "") + words[k];
      hyps.push_back(h);
    }
  } else if (name == "empty_lines_mixed") {  // the first 60 references; every third hypothesis (0, 3, ...) empty
    rs = first(refs, 60);
    hyps.clear();
    for (size_t k = 0; k < rs.size(); ++k) hyps.push_back(k % 3 == 0 ? "" : rs[k]);
  } else {
    const std::string file = name.substr(0, name.find('+'));
    if (file.empty() || !exists(dir + "/" + file)) return false;
    hyps = read_lines(dir + "/" + file);
    if (name.find("+first100") != std::string::npos) hyps = first(hyps, 100), rs = first(refs, 100);
  }
  return true;
}

static int run(const std::string& dir) {
  if (!exists(dir + "/golden.json")) throw std::runtime_error(dir + "/golden.json not found (test/golden/bleu is part of the repository)");
  std::ifstream f(dir + "/golden.json", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const Json golden = JsonReader(text).document();

  // "reference": "shared/data/multi30k/test_2016_flickr.de.gz", where sacreBLEU read it; a copy of that file
  // lies in GOLDEN_DIR (its SHA-256 is the one data/get_multi30k.sh checks).
  const std::string ref_name = golden["reference"].text;
  const std::string ref_path = dir + "/" + ref_name.substr(ref_name.find_last_of('/') + 1);
  if (!exists(ref_path)) throw std::runtime_error("reference " + ref_path + " not found (test/golden/bleu is part of the repository)");
  const std::vector<std::string> refs = read_lines(ref_path);
  Checker ck("bleu_golden");
  std::printf("bleu_golden: sacreBLEU %s figures; reference %s, %zu lines\n", golden["sacrebleu_version"].text.c_str(),
              ref_path.c_str(), refs.size());

  // 13a tokenisation
  const auto& tokenize_cases = golden["tokenize_13a"].items;
  for (const Json& t : tokenize_cases) {
    const std::string got = tokenize_13a(t["in"].text);
    ck.expect(got == t["out"].text, "13a of \"%s\": got \"%s\", want \"%s\"", t["in"].text.c_str(), got.c_str(),
              t["out"].text.c_str());
  }

  // corpus scores
  const auto& corpus_cases = golden["corpus"].items;
  for (const Json& c : corpus_cases) {
    const std::string name = c["name"].text;
    const Json* lc_option = c["options"].find("lowercase");
    const bool lowercase = lc_option && lc_option->number != 0;
    std::vector<std::string> hyps, rs;
    if (!ck.expect(corpus_case(name, dir, refs, hyps, rs), "corpus case %s: cannot rebuild its text", name.c_str()))
      continue;
    const BleuScore s = corpus_bleu(hyps, rs, lowercase);
    ck.close(s.score, c["score"].number, kRtol, kAtol, (name + ": score").c_str());
    ck.close(s.bp, c["bp"].number, kRtol, kAtol, (name + ": BP").c_str());
    for (int n = 0; n < 4; ++n) {
      const long want_counts = c["counts"].items.at(n).integer(), want_totals = c["totals"].items.at(n).integer();
      ck.expect(s.counts[n] == want_counts, "%s: %d-gram matches %ld, want %ld", name.c_str(), n + 1, s.counts[n], want_counts);
      ck.expect(s.totals[n] == want_totals, "%s: %d-grams %ld, want %ld", name.c_str(), n + 1, s.totals[n], want_totals);
    }
    ck.expect(s.hyp_len == c["sys_len"].integer(), "%s: hyp_len %ld, want %ld", name.c_str(), s.hyp_len, c["sys_len"].integer());
    ck.expect(s.ref_len == c["ref_len"].integer(), "%s: ref_len %ld, want %ld", name.c_str(), s.ref_len, c["ref_len"].integer());
    ck.expect(bleu_signature(lowercase) == c["signature"].text, "%s: signature %s, want %s", name.c_str(),
              bleu_signature(lowercase).c_str(), c["signature"].text.c_str());
    std::printf("  %-34s %s\n", name.c_str(), s.format().c_str());
  }

  // sentence scores
  const auto& sentence_cases = golden["sentence"].items;
  for (const Json& t : sentence_cases)
    ck.close(sentence_bleu(t["hyp"].text, t["ref"].text).score, t["score"].number, kRtol, kAtol,
             ("sentence \"" + t["hyp"].text + "\"").c_str());
  std::printf("bleu_golden: %zu tokenisations, %zu corpus scores, %zu sentence scores from golden.json\n",
              tokenize_cases.size(), corpus_cases.size(), sentence_cases.size());
  ck.expect(!tokenize_cases.empty() && !corpus_cases.empty() && !sentence_cases.empty(), "golden.json has empty sections");

  // the printed line, as sacreBLEU 2.6.0 prints these corpora
  const std::vector<std::string> hyp_small = read_lines(dir + "/hyp_small_test2016.de"),
                                 hyp_base = read_lines(dir + "/hyp_base_test2016.de");
  const std::pair<std::string, std::string> printed[] = {
      {corpus_bleu(hyp_small, refs).format(),
       "BLEU = 33.93 63.0/39.7/27.6/19.2 (BP = 1.000 ratio = 1.059 hyp_len = 12816 ref_len = 12106)"},
      {corpus_bleu(hyp_base, refs, true).format(),
       "BLEU = 17.13 47.8/22.0/12.2/6.7 (BP = 1.000 ratio = 1.070 hyp_len = 12959 ref_len = 12106)"},
  };
  for (const auto& [got, want] : printed) ck.expect(got == want, "printed \"%s\", want \"%s\"", got.c_str(), want.c_str());
  return ck.finish();
}

// Hand-made cases; the expected figures follow from the definitions in bleu.h (and agree with sacreBLEU).
static int edge_cases() {
  Checker ck("bleu_edges");

  // Empty hypothesis: no n-grams, hyp_len 0 < ref_len, so BP = 0 and BLEU = 0.
  BleuScore empty_hyp = corpus_bleu({""}, {"Ein Hund rennt."});
  ck.expect(empty_hyp.score == 0 && empty_hyp.bp == 0 && empty_hyp.hyp_len == 0 && empty_hyp.ref_len == 4 &&
                empty_hyp.totals == std::array<long, 4>{},
            "empty hypothesis: %s", empty_hyp.format().c_str());
  ck.expect(sentence_bleu("", "Ein Hund rennt.").score == 0, "empty hypothesis, sentence BLEU is 0");
  ck.expect(sentence_bleu("", "").score == 0 && sentence_bleu("", "").bp == 1, "empty against empty: 0 with BP 1");

  // Empty corpus: every statistic 0; hyp_len = ref_len, so BP 1, ratio 0 (no reference), BLEU 0.
  const std::string empty_corpus = corpus_bleu({}, {}).format();
  ck.expect(empty_corpus == "BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 1.000 ratio = 0.000 hyp_len = 0 ref_len = 0)",
            "empty corpus printed \"%s\"", empty_corpus.c_str());

  // A perfect match scores exactly 100 (fuzz_bleu found 100.00000000000004, sacreBLEU's own rounding).
  const BleuScore perfect = corpus_bleu({"a b c d e"}, {"a b c d e"});
  ck.expect(perfect.score == 100 && sentence_bleu("a b c d e", "a b c d e").score == 100, "a perfect match scores %.17g",
            perfect.score);

  // No matching n-gram: BLEU 0 and every precision 0 (smoothing does not apply).
  BleuScore none = corpus_bleu({"x y z"}, {"a b c"});
  ck.expect(none.score == 0 && none.precisions == std::array<double, 4>{} && none.totals == std::array<long, 4>{3, 2, 1, 0},
            "no match: %s", none.format().c_str());

  // Exponential smoothing: 4/5 unigrams and 2/4 bigrams match, no trigram (of 3) or 4-gram (of 2); the first
  // order without a match gets 100 / (2 * 3), the second 100 / (4 * 2). sacreBLEU: 30.213753973567677.
  BleuScore smoothed = corpus_bleu({"a b c d e"}, {"a b x d e"});
  const std::array<double, 4> want_p = {80.0, 50.0, 100.0 / (2 * 3), 100.0 / (4 * 2)};
  for (int n = 0; n < 4; ++n) ck.close(smoothed.precisions[n], want_p[n], 1e-15, 1e-15, "smoothed precision");
  ck.close(smoothed.score, std::exp((std::log(want_p[0]) + std::log(want_p[1]) + std::log(want_p[2]) + std::log(want_p[3])) / 4),
           1e-15, 1e-15, "smoothed score");
  ck.close(smoothed.score, 30.213753973567677, kRtol, kAtol, "smoothed score against sacreBLEU");

  // Effective order: "a b" has no trigram, so sentence BLEU averages orders 1 and 2 only (both 100) and
  // keeps BP = exp(1 - 3/2); corpus BLEU keeps all four orders and scores 0.
  ck.close(sentence_bleu("a b", "a b c").score, 100 * std::exp(1.0 - 3.0 / 2.0), 1e-15, 1e-15, "sentence BLEU, effective order 2");
  ck.expect(corpus_bleu({"a b"}, {"a b c"}).score == 0, "corpus BLEU of a 2-word hypothesis is 0");

  // Lowercase: Python's str.lower(), final sigma and dotted İ included.
  ck.expect(corpus_bleu({"Der HUND läuft"}, {"der Hund LÄUFT"}).counts[0] == 0, "mixed case: no unigram matches");
  BleuScore lc = corpus_bleu({"Der HUND läuft"}, {"der Hund LÄUFT"}, true);
  ck.expect(lc.counts == std::array<long, 4>{3, 2, 1, 0}, "lowercase: every n-gram matches");
  ck.expect(corpus_bleu({"ΟΔΟΣ ΣΑ"}, {"οδος σα"}, true).counts[0] == 2, "lowercase: word-final Σ becomes ς, other Σ σ");
  ck.expect(corpus_bleu({"İ"}, {"i\xCC\x87"}, true).counts[0] == 1, "lowercase: İ becomes i + U+0307");
  ck.close(sentence_bleu("Der HUND läuft", "der Hund LÄUFT", true).score, 100, 1e-15, 1e-15, "lowercase sentence BLEU");

  // Python's whitespace (str.split): no-break, ideographic, next-line and separator characters divide
  // words; trailing whitespace is cut.
  ck.expect(tokenize_13a("a\xC2\xA0" "b\xE3\x80\x80" "c\xC2\x85" "d\x1C" "e") == "a b c d e",
            "13a splits at U+00A0, U+3000, U+0085 and U+001C");
  ck.close(corpus_bleu({"a b c d\t "}, {"a b c d"}).score, 100, 1e-15, 1e-15, "trailing whitespace ignored");

  // Different numbers of hypotheses and references: a one-line std::invalid_argument.
  std::string message;
  try {
    corpus_bleu({"a"}, {"a", "b"});
  } catch (const std::invalid_argument& e) {
    message = e.what();
  }
  ck.expect(!message.empty() && message.find('\n') == std::string::npos, "1 hypothesis for 2 references: \"%s\"",
            message.c_str());
  ck.expect(bleu_signature(false) == "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0" &&
                bleu_signature(true) == "nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:2.6.0",
            "signatures");
  return ck.finish();
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: bleu_golden GOLDEN_DIR\n");
    return 2;
  }
  try {
    const int edges = edge_cases();
    const int golden = run(argv[1]);
    if (edges != 0) return edges;
    return golden;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bleu_golden: %s\n", e.what());
    return 1;
  }
}
