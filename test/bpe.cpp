// bpe: the tokenizer (tokenizer.h).
//   bpe                 worked example of Sennrich et al. (2016), normalisation rules, round trips of hard
//                       strings, byte fallback, invalid UTF-8, determinism, the vocabulary file and its hash
//   bpe --multi30k DIR  round trip of every line of Multi30k train/val/test in en, de and fr with a
//                       vocabulary of 10,000 merges learned on train en+de (exit 77 when DIR lacks it;
//                       DIR may hold the .gz files or plain text; $MULTI30K_DIR is tried first)
//   bpe --bench DIR     learning time, vocabulary size, encode and decode MB/s on Multi30k (not a test)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "../tokenizer.h"
#include "../transformer.h"  // mix64
#include "check.h"

static bool exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

// Lines of DIR/NAME (plain) or DIR/NAME.gz; false when neither exists.
static bool read_corpus(const std::string& dir, const std::string& name, std::vector<std::string>* lines) {
  std::string plain = dir + "/" + name, gz = plain + ".gz";
  FILE* f = nullptr;
  bool piped = false;
  if (exists(plain)) f = std::fopen(plain.c_str(), "rb");
  else if (exists(gz)) f = popen(("gzip -dc '" + gz + "'").c_str(), "r"), piped = true;
  if (!f) return false;
  std::string line;
  for (int ch; (ch = std::fgetc(f)) != EOF;) {
    if (ch == '\n') lines->push_back(line), line.clear();
    else line += (char)ch;
  }
  if (!line.empty()) lines->push_back(line);
  if (piped) pclose(f);
  else std::fclose(f);
  return true;
}

static std::string corpus_dir(const std::string& arg) {
  const char* env = std::getenv("MULTI30K_DIR");
  for (std::string d : {std::string(env ? env : ""), arg, std::string("../data/multi30k"), std::string("data/multi30k")})
    if (!d.empty() && (exists(d + "/train.en") || exists(d + "/train.en.gz"))) return d;
  return "";
}

static void round_trip(Checker& ck, const Tokenizer& t, const std::string& s, const std::string& what) {
  std::string want = Tokenizer::normalise(s), got = t.decode(t.encode(s));
  ck.expect(got == want, "%s: round trip of '%s' gave '%s'", what.c_str(), s.c_str(), got.c_str());
}

static std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

static bool load_fails(const std::string& path, const std::string& text, const std::string& expect) {
  { std::ofstream(path, std::ios::binary) << text; }
  try {
    Tokenizer::load(path);
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).find(expect) != std::string::npos) return true;
    std::fprintf(stderr, "load error '%s' does not mention '%s'\n", e.what(), expect.c_str());
    return false;
  }
  return false;
}


// Sennrich et al.'s Algorithm 1 as written: recount every pair after every merge. The incremental learner
// must choose the same merges (ties: the pair whose texts sort first). Words are letter runs, so each is
// one pre-token, starting with the marker.
static std::vector<std::pair<std::string, std::string>> naive_merges(const std::vector<std::string>& words, int merges) {
  std::map<std::vector<std::string>, long> vocab;
  for (const std::string& w : words) {
    std::vector<std::string> sym = {"\xE2\x96\x81"};
    for (char c : w) sym.push_back(std::string(1, c));
    ++vocab[sym];
  }
  std::vector<std::pair<std::string, std::string>> out;
  while ((int)out.size() < merges) {
    std::map<std::pair<std::string, std::string>, long> pairs;
    for (const auto& [sym, f] : vocab)
      for (size_t i = 0; i + 1 < sym.size(); ++i) pairs[{sym[i], sym[i + 1]}] += f;
    std::pair<std::string, std::string> best;
    long best_count = 0;
    for (const auto& [pr, f] : pairs)  // map order: ties go to the pair that sorts first
      if (f > best_count) best = pr, best_count = f;
    if (best_count < 2) break;
    out.push_back(best);
    std::map<std::vector<std::string>, long> next;
    for (const auto& [sym, f] : vocab) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < sym.size(); ++i) {
        if (i + 1 < sym.size() && sym[i] == best.first && sym[i + 1] == best.second) {
          merged.push_back(sym[i] + sym[i + 1]);
          ++i;
        } else {
          merged.push_back(sym[i]);
        }
      }
      next[merged] += f;
    }
    vocab.swap(next);
  }
  return out;
}

// The merges section of a saved vocabulary file
static std::vector<std::pair<std::string, std::string>> saved_merges(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t at = text.find("\nmerges ");
  long n = std::atol(text.c_str() + at + 8);
  at = text.find('\n', at + 1) + 1;
  for (long i = 0; i < n; ++i) {
    size_t end = text.find('\n', at), space = text.find(' ', at);
    out.push_back({text.substr(at, space - at), text.substr(space + 1, end - space - 1)});
    at = end + 1;
  }
  return out;
}

static int unit_tests() {
  Checker ck("bpe");
  // Sennrich et al. (2016), Algorithm 1: {low: 5, lower: 2, newest: 6, widest: 3}. The paper marks word
  // ends with </w>; we mark word starts with U+2581, so its "est</w>" merge has no counterpart here.
  std::vector<std::string> toy;
  for (auto [w, n] : std::vector<std::pair<std::string, int>>{{"low", 5}, {"lower", 2}, {"newest", 6}, {"widest", 3}})
    for (int i = 0; i < n; ++i) toy.push_back(w);
  Tokenizer t = Tokenizer::learn(toy, 6);
  const std::vector<std::string> want = {"es", "est", "lo", "low", "\xE2\x96\x81low", "ew"};
  ck.expect(t.merge_count() == 6, "toy example: %d merges, want 6", t.merge_count());
  for (int i = 0; i < 6 && i < t.merge_count(); ++i)
    ck.expect(t.piece(t.vocab_size() - 6 + i) == want[i], "toy merge %d is '%s', want '%s'", i + 1,
              t.piece(t.vocab_size() - 6 + i).c_str(), want[i].c_str());
  auto p = t.pieces("lowest");
  ck.expect(p == std::vector<std::string>({"\xE2\x96\x81low", "est"}), "'lowest' splits into %zu pieces, want ▁low est", p.size());
  ck.expect(Tokenizer::learn(toy, 1000).merge_count() < 1000, "learning stops when no pair occurs twice");

  // the incremental learner against the algorithm as written, on 3000 random words over 5 letters
  std::vector<std::string> words;
  uint64_t state = 42;
  for (int i = 0; i < 3000; ++i) {
    std::string w(1 + mix64(state++) % 8, ' ');
    for (char& c : w) c = (char)('a' + mix64(state++) % 5);
    words.push_back(w);
  }
  std::vector<std::string> lines;
  for (size_t i = 0; i < words.size(); i += 10) {
    std::string line;
    for (size_t j = i; j < i + 10; ++j) line += words[j] + " ";
    lines.push_back(line);
  }
  Tokenizer::learn(lines, 400).save("bpe_test_naive.vocab");
  const auto want_merges = naive_merges(words, 400), got_merges = saved_merges(slurp("bpe_test_naive.vocab"));
  std::remove("bpe_test_naive.vocab");
  ck.expect(got_merges.size() == want_merges.size(), "%zu merges learned, the algorithm as written learns %zu", got_merges.size(), want_merges.size());
  for (size_t i = 0; i < got_merges.size() && i < want_merges.size(); ++i)
    if (!ck.expect(got_merges[i] == want_merges[i], "merge %zu is '%s %s', the algorithm as written gives '%s %s'", i + 1,
                   got_merges[i].first.c_str(), got_merges[i].second.c_str(), want_merges[i].first.c_str(), want_merges[i].second.c_str()))
      break;

  // normalisation: NFC, whitespace runs, ends
  ck.expect(Tokenizer::normalise("  a \t\t b  ") == "a b", "whitespace runs and ends");
  ck.expect(Tokenizer::normalise("e\xCC\x81") == "\xC3\xA9", "NFC composes e + U+0301 into U+00E9");
  ck.expect(Tokenizer::normalise("a\xC2\xA0" "b") == "a b", "U+00A0 (no-break space) is whitespace");
  ck.expect(Tokenizer::normalise("a\xE2\x80\x8B" "b") == "a\xE2\x80\x8B" "b", "U+200B (zero width space) is kept");
  ck.expect(Tokenizer::normalise("a\xE2\x80\xA8" "b\r\n") == "a b", "line separator and CR LF are whitespace");
  ck.expect(Tokenizer::normalise("").empty() && t.encode("").empty() && t.decode({}).empty(), "empty line");
  ck.expect(t.encode("   \t ").empty(), "a line of whitespace encodes to nothing");

  // invalid UTF-8: the byte offset is reported
  for (auto [s, at] : std::vector<std::pair<std::string, size_t>>{{"ab\xFF", 2}, {"\xC0\x80", 0}, {"x\xED\xA0\x80", 1}, {"abc\xE2\x96", 3}}) {
    bool thrown = false;
    try {
      t.encode(s);
    } catch (const InvalidUtf8& e) {
      thrown = e.offset == at;
      if (!thrown) std::fprintf(stderr, "offset %zu, want %zu\n", e.offset, at);
    }
    ck.expect(thrown, "invalid UTF-8 at byte %zu not reported", at);
  }

  // hard strings round trip, with a vocabulary that has never seen most of their characters (byte
  // fallback) and with one learned on them
  const std::vector<std::string> hard = {
      "Cafe\xCC\x81 vs Caf\xC3\xA9",                          // decomposed vs precomposed
      "Stra\xC3\x9F" "e, STRASSE, \xE1\xBA\x9E",              // ß and capital ẞ
      "A\xCC\x8A\xCC\x81 o\xCC\x88\xCC\xB2",                  // stacked combining marks
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 family",  // ZWJ sequence
      "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xE2\x9D\xA4\xEF\xB8\x8F",  // skin tone, variation selector
      "\xE6\x9D\xB1\xE4\xBA\xAC\xE3\x81\xAB\xE8\xA1\x8C\xE3\x81\x8F",  // CJK
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD8\xA8\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7\xD9\x84\xD9\x85",  // Arabic
      "no\xC2\xA0" "break and zero\xE2\x80\x8Bwidth",         // U+00A0, U+200B
      "tabs\tand  spaces  ",
      "\xE2\x96\x81 literal marker \xE2\x96\x81\xE2\x96\x81x",  // U+2581 in the text itself
      "<s> </s> <pad> <unk> <0x41> \\x20",                    // special-looking text
      "don't (stop) -- 3.14 1,000,000 C++ e-mail",
      "\xEF\xBF\xBD replacement char",
  };
  for (const std::string& s : hard) round_trip(ck, t, s, "toy vocabulary");
  std::vector<std::string> corpus = hard;
  for (int i = 0; i < 3; ++i) corpus.insert(corpus.end(), hard.begin(), hard.end());
  Tokenizer h = Tokenizer::learn(corpus, 200);
  for (const std::string& s : hard) round_trip(ck, h, s, "hard-string vocabulary");
  std::vector<int> unseen = t.encode("\xE6\x9D\xB1");  // the word marker, then three bytes
  ck.expect(unseen.size() == 4 && t.piece(unseen[0]) == "\xE2\x96\x81", "an unseen word starts with the marker");
  for (size_t i = 1; i < unseen.size(); ++i)
    ck.expect(unseen[i] >= Tokenizer::kFirstByte && unseen[i] < Tokenizer::kFirstByte + 256, "an unseen character falls back to bytes");
  ck.expect(t.decode({Tokenizer::kFirstByte + 0xFF, Tokenizer::kUnk}) == "\xEF\xBF\xBD\xEF\xBF\xBD", "invalid bytes and <unk> decode to U+FFFD");
  ck.expect(t.decode({Tokenizer::kBos, Tokenizer::kPad, Tokenizer::kEos}).empty(), "specials decode to nothing");
  bool out_of_range = false;
  try {
    t.decode({t.vocab_size()});
  } catch (const std::out_of_range&) {
    out_of_range = true;
  }
  ck.expect(out_of_range, "decoding an id outside the vocabulary throws");

  // a very long line: one 200,000-letter word and 20,000 words
  std::string long_word(200000, 'a'), many;
  for (int i = 0; i < 20000; ++i) many += "word" + std::to_string(i % 97) + " ";
  round_trip(ck, h, long_word, "200,000-letter word");
  round_trip(ck, h, many, "20,000 words");

  // determinism and the vocabulary file
  const std::string a = "bpe_test_a.vocab", b = "bpe_test_b.vocab";
  h.save(a);
  Tokenizer::learn(corpus, 200).save(b);
  const std::string text = slurp(a);
  ck.expect(!text.empty() && text == slurp(b), "learning twice gives the same vocabulary file");
  Tokenizer back = Tokenizer::load(a);
  ck.expect(back.hash() == h.hash() && back.vocab_size() == h.vocab_size(), "load gives back the same vocabulary");
  for (const std::string& s : hard) ck.expect(back.encode(s) == h.encode(s), "loaded vocabulary encodes '%s' differently", s.c_str());
  // a wrong hash, an edited merge, a truncated file, another version: refused
  std::string edited = text;
  size_t hash_at = edited.find("hash ") + 5;
  edited[hash_at] = edited[hash_at] == '0' ? '1' : '0';
  ck.expect(load_fails(b, edited, "hash mismatch"), "a vocabulary with a wrong hash is refused");
  size_t merges_at = text.find('\n', text.find("merges ")) + 1, merge_end = text.find('\n', merges_at);
  std::string swapped = text;
  {  // swap the first two merge lines: same pieces, another order
    size_t second_end = text.find('\n', merge_end + 1);
    swapped = text.substr(0, merges_at) + text.substr(merge_end + 1, second_end - merge_end) +
              text.substr(merges_at, merge_end - merges_at + 1) + text.substr(second_end + 1);
  }
  ck.expect(swapped != text && load_fails(b, swapped, ""), "reordered merges are refused");
  ck.expect(load_fails(b, text.substr(0, text.size() / 2), "truncated"), "a truncated vocabulary is refused");
  ck.expect(load_fails(b, "bpe-vocabulary 9\n" + text.substr(text.find('\n') + 1), "version"), "another version is refused");
  ck.expect(load_fails("no/such/dir/x.vocab", "", "cannot"), "a missing file is refused");
  // fuzz_vocab found "280\xD9x" read as id 280 with the piece "\xD9x", which decoded to invalid UTF-8
  const std::string last_id = std::to_string(h.vocab_size() - 1) + " ";
  const size_t last_at = text.rfind("\n" + last_id) + 1;
  std::string glued = text, not_utf8 = text;
  glued.replace(last_at + last_id.size() - 1, 1, "\xD9");
  not_utf8.insert(last_at + last_id.size(), "\xD9");
  ck.expect(load_fails(b, glued, "expected '" + last_id + "PIECE'"), "a piece glued to its id is refused");
  ck.expect(load_fails(b, not_utf8, "the piece is not UTF-8 (invalid UTF-8 at byte 0)"), "a piece that is not UTF-8 is refused");
  std::remove(a.c_str());
  std::remove(b.c_str());
  return ck.finish();
}

static int multi30k(const std::string& arg, bool bench) {
  const std::string dir = corpus_dir(arg);
  if (dir.empty()) {
    std::printf("bpe: Multi30k not found ($MULTI30K_DIR, %s, data/multi30k): skipped\n", arg.c_str());
    return 77;
  }
  std::vector<std::string> train;
  read_corpus(dir, "train.en", &train);
  read_corpus(dir, "train.de", &train);
  auto t0 = std::chrono::steady_clock::now();
  Tokenizer t = Tokenizer::learn(train, 10000);
  double learn_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (bench) {
    std::vector<std::string> text;
    for (const char* name : {"train.en", "train.de"}) read_corpus(dir, name, &text);
    size_t bytes = 0;
    for (auto& s : text) bytes += s.size() + 1;
    Tokenizer fresh = Tokenizer::load((t.save("bpe_bench.vocab"), "bpe_bench.vocab"));  // a cold cache
    std::remove("bpe_bench.vocab");
    std::vector<std::vector<int>> ids;
    auto e0 = std::chrono::steady_clock::now();
    for (auto& s : text) ids.push_back(fresh.encode(s));
    double enc_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count();
    auto d0 = std::chrono::steady_clock::now();
    size_t out_bytes = 0;
    for (auto& x : ids) out_bytes += fresh.decode(x).size() + 1;
    double dec_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
    std::printf("BPE learn 10000 merges on %zu lines (train en+de): %.2f s, vocabulary %d\n", train.size(), learn_s, t.vocab_size());
    std::printf("BPE encode %.1f MB/s, decode %.1f MB/s (%.1f MB, one thread, cold cache)\n", bytes / enc_s / 1e6,
                out_bytes / dec_s / 1e6, bytes / 1e6);
    return 0;
  }
  Checker ck("bpe_multi30k");
  std::printf("learned 10000 merges on %zu lines in %.2f s: vocabulary %d\n", train.size(), learn_s, t.vocab_size());
  long lines = 0;
  for (const char* split : {"train", "val", "test_2016_flickr"})
    for (const char* lang : {"en", "de", "fr"}) {
      std::vector<std::string> text;
      std::string name = std::string(split) + "." + lang;
      if (!read_corpus(dir, name, &text)) {
        ck.expect(false, "%s/%s missing", dir.c_str(), name.c_str());
        continue;
      }
      for (const std::string& s : text) {
        std::string want = Tokenizer::normalise(s), got = t.decode(t.encode(s));
        ck.expect(got == want, "%s: round trip of '%s' gave '%s'", name.c_str(), s.c_str(), got.c_str());
      }
      lines += (long)text.size();
    }
  std::printf("round trip of %ld lines (train/val/test x en/de/fr)\n", lines);
  return ck.finish();
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--multi30k") return multi30k(argv[2], false);
  if (argc == 3 && std::string(argv[1]) == "--bench") return multi30k(argv[2], true);
  if (argc != 1) {
    std::fprintf(stderr, "usage: bpe [--multi30k DIR | --bench DIR]\n");
    return 2;
  }
  return unit_tests();
}
