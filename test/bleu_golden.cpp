// bleu_golden: bleu.h reproduces sacreBLEU 2.6.0 (../shared/golden/bleu/golden.json, made by sacreBLEU
// itself): every corpus score with its counts, totals and lengths, every sentence score, and the 13a
// tokenisation of every listed string, to 4 decimals; then the printed line, the signature and edge cases.
// Usage: bleu_golden GOLDEN_DIR MULTI30K_DIR   (exit 77 when the golden file is absent)
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../bleu.h"
#include "check.h"

// ---- a small JSON reader, enough for golden.json ----------------------------------------------------
struct Json {
  enum Kind { null, boolean, number, string, array, object } kind = null;
  double num = 0;
  std::string str;
  std::vector<Json> arr;
  std::map<std::string, Json> obj;
  const Json& operator[](const std::string& k) const {
    static const Json none;
    auto it = obj.find(k);
    return it == obj.end() ? none : it->second;
  }
};

struct JsonParser {
  const std::string& s;
  size_t i = 0;
  void ws() { while (i < s.size() && std::isspace((unsigned char)s[i])) ++i; }
  [[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "golden.json: %s at byte %zu\n", what, i);
    std::exit(1);
  }
  void utf8(uint32_t cp, std::string& o) {
    utf8proc_uint8_t b[4];
    o.append((const char*)b, utf8proc_encode_char((utf8proc_int32_t)cp, b));
  }
  std::string string_literal() {
    std::string o;
    ++i;  // opening quote
    while (i < s.size() && s[i] != '"') {
      char c = s[i++];
      if (c != '\\') { o += c; continue; }
      char e = s[i++];
      switch (e) {
        case 'n': o += '\n'; break;
        case 't': o += '\t'; break;
        case 'r': o += '\r'; break;
        case 'b': o += '\b'; break;
        case 'f': o += '\f'; break;
        case 'u': {
          uint32_t cp = std::stoul(s.substr(i, 4), nullptr, 16);
          i += 4;
          if (cp >= 0xD800 && cp < 0xDC00 && s.compare(i, 2, "\\u") == 0) {  // surrogate pair
            uint32_t lo = std::stoul(s.substr(i + 2, 4), nullptr, 16);
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            i += 6;
          }
          utf8(cp, o);
          break;
        }
        default: o += e;
      }
    }
    if (i >= s.size()) fail("unterminated string");
    ++i;
    return o;
  }
  Json value() {
    ws();
    Json v;
    if (i >= s.size()) fail("unexpected end");
    if (s[i] == '{') {
      v.kind = Json::object;
      ++i;
      for (ws(); s[i] != '}'; ws()) {
        std::string k = (ws(), string_literal());
        ws();
        if (s[i++] != ':') fail("expected ':'");
        v.obj[k] = value();
        ws();
        if (s[i] == ',') ++i;
      }
      ++i;
    } else if (s[i] == '[') {
      v.kind = Json::array;
      ++i;
      for (ws(); s[i] != ']'; ws()) {
        v.arr.push_back(value());
        ws();
        if (s[i] == ',') ++i;
      }
      ++i;
    } else if (s[i] == '"') {
      v.kind = Json::string;
      v.str = string_literal();
    } else if (s.compare(i, 4, "true") == 0 || s.compare(i, 5, "false") == 0) {
      v.kind = Json::boolean;
      v.num = s[i] == 't';
      i += s[i] == 't' ? 4 : 5;
    } else if (s.compare(i, 4, "null") == 0) {
      i += 4;
    } else {
      v.kind = Json::number;
      size_t used = 0;
      v.num = std::stod(s.substr(i, 40), &used);
      i += used;
    }
    return v;
  }
};

static std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  FILE* f = gz ? popen(("gzip -dc '" + path + "' 2>/dev/null").c_str(), "r") : std::fopen(path.c_str(), "rb");
  if (!f) return lines;
  std::string line;
  for (int c; (c = std::fgetc(f)) != EOF;) {
    if (c == '\n') lines.push_back(line), line.clear();
    else line += (char)c;
  }
  if (!line.empty()) lines.push_back(line);
  gz ? pclose(f) : std::fclose(f);
  return lines;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: bleu_golden GOLDEN_DIR MULTI30K_DIR\n");
    return 2;
  }
  const std::string dir = argv[1], data = argv[2];
  std::ifstream f(dir + "/golden.json");
  if (!f) {
    std::printf("bleu_golden: %s/golden.json not found: skipped\n", dir.c_str());
    return 77;
  }
  const std::string text((std::istreambuf_iterator<char>(f)), {});
  JsonParser parser{text};
  const Json golden = parser.value();
  Checker ck("bleu_golden");
  const double tol = 5e-5;  // "to 4 decimals": every score within half a unit of the 4th decimal

  // 13a tokenisation
  for (const Json& t : golden["tokenize_13a"].arr) {
    std::string got = tokenize_13a(t["in"].str);
    ck.expect(got == t["out"].str, "13a of '%s': got '%s' want '%s'", t["in"].str.c_str(), got.c_str(), t["out"].str.c_str());
  }

  // corpus scores
  const std::vector<std::string> refs = read_lines(data + "/test_2016_flickr.de.gz");
  if (refs.size() != 1000) {
    std::fprintf(stderr, "bleu_golden: %s/test_2016_flickr.de.gz has %zu lines, want 1000\n", data.c_str(), refs.size());
    return 1;
  }
  int corpus_cases = 0;
  for (const Json& c : golden["corpus"].arr) {
    const std::string name = c["name"].str;
    const bool lc = c["options"]["lowercase"].kind == Json::boolean && c["options"]["lowercase"].num != 0;
    std::vector<std::string> hyps, rs = refs;
    const std::string file = name.substr(0, name.find('+'));
    if (name == "reference_vs_itself") {
      hyps = refs;
    } else if (file.rfind("hyp_", 0) == 0) {
      hyps = read_lines(dir + "/" + file);
      if (name.find("+first100") != std::string::npos) hyps.resize(100), rs.resize(100);
    } else if (name == "shorter_hyp_brevity") {  // the first 200 references, each cut to the first half of its words
      rs.resize(200);
      for (const std::string& r : rs) {
        std::vector<std::string> w;
        for (size_t i = 0, j; i < r.size(); i = j + 1) {
          j = r.find(' ', i);
          if (j == std::string::npos) j = r.size();
          if (j > i) w.push_back(r.substr(i, j - i));
        }
        std::string h;
        for (size_t i = 0; i < w.size() / 2; ++i) h += (i ? " " : "") + w[i];
        hyps.push_back(h);
      }
    } else if (name == "empty_lines_mixed") {  // the first 60 references, every third hypothesis empty
      rs.resize(60);
      for (size_t i = 0; i < rs.size(); ++i) hyps.push_back(i % 3 == 0 ? "" : rs[i]);
    } else {
      ck.expect(false, "unknown corpus case %s", name.c_str());
      continue;
    }
    if (hyps.size() != rs.size()) {
      ck.expect(false, "%s: %zu hypotheses for %zu references", name.c_str(), hyps.size(), rs.size());
      continue;
    }
    BleuScore s = corpus_bleu(hyps, rs, lc);
    ++corpus_cases;
    ck.close(s.score, c["score"].num, tol / 100, tol, (name + " score").c_str());
    ck.close(s.bp, c["bp"].num, tol / 100, tol, (name + " BP").c_str());
    for (int n = 0; n < 4; ++n) {
      ck.expect(s.counts[n] == (long)c["counts"].arr[n].num, "%s: %d-gram matches %ld, want %.0f", name.c_str(), n + 1, s.counts[n], c["counts"].arr[n].num);
      ck.expect(s.totals[n] == (long)c["totals"].arr[n].num, "%s: %d-gram totals %ld, want %.0f", name.c_str(), n + 1, s.totals[n], c["totals"].arr[n].num);
    }
    ck.expect(s.hyp_len == (long)c["sys_len"].num && s.ref_len == (long)c["ref_len"].num, "%s: lengths %ld/%ld", name.c_str(), s.hyp_len, s.ref_len);
    std::string sig = c["signature"].str;
    ck.expect(sig.substr(0, sig.find("|version:")) == bleu_signature(lc), "%s: signature %s, want %s", name.c_str(),
              bleu_signature(lc).c_str(), sig.c_str());
  }
  ck.expect(corpus_cases == (int)golden["corpus"].arr.size(), "only %d corpus cases computed from text", corpus_cases);

  // sentence scores
  for (const Json& t : golden["sentence"].arr)
    ck.close(sentence_bleu(t["hyp"].str, t["ref"].str).score, t["score"].num, tol / 100, tol, "sentence score");

  // the printed line, as sacreBLEU prints it
  const std::string line = corpus_bleu(read_lines(dir + "/hyp_small_test2016.de"), refs).format();
  ck.expect(line == "BLEU = 33.93 63.0/39.7/27.6/19.2 (BP = 1.000 ratio = 1.059 hyp_len = 12816 ref_len = 12106)",
            "printed '%s'", line.c_str());

  // edge cases
  ck.expect(corpus_bleu({}, {}).score == 0, "empty corpus scores 0");
  ck.expect(corpus_bleu({""}, {"a b c"}).score == 0 && corpus_bleu({""}, {"a b c"}).bp == 0, "empty hypothesis scores 0 with BP 0");
  ck.expect(corpus_bleu({"x y z w"}, {"a b c d"}).score == 0, "no matching n-gram scores 0");
  BleuScore one = corpus_bleu({"a b c d e"}, {"a b x d e"});  // 4/5 unigrams, 2/4 bigrams, 0/3, 0/2
  ck.close(one.precisions[2], 100.0 / (2 * 3), 1e-12, 1e-12, "exp smoothing of the first empty order: 100 / (2 * total)");
  ck.close(one.precisions[3], 100.0 / (4 * 2), 1e-12, 1e-12, "exp smoothing of the second: 100 / (4 * total)");
  ck.expect(corpus_bleu({"The Cat"}, {"the cat"}, true).score == 0 && corpus_bleu({"The Cat"}, {"the cat"}, true).counts[0] == 2,
            "lowercase matches across case");
  ck.expect(corpus_bleu({"The Cat"}, {"the cat"}).counts[0] == 0, "mixed case does not");
  bool threw = false;
  try {
    corpus_bleu({"a"}, {"a", "b"});
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  ck.expect(threw, "different hypothesis and reference counts are refused");
  return ck.finish();
}
