// fuzz_translate_input: ./translate's input path, read_lines() then encode_lines(), on arbitrary bytes.
// Properties: the lines are the text split at '\n' (a last line may lack it), each without one trailing '\r',
// the first without a UTF-8 byte-order mark;
// a text that is not UTF-8 is refused with one line "stdin:LINE: invalid UTF-8 at byte N" naming the
// first bad line and byte; otherwise every line is encoded, no longer than the limit, an over-long line
// cut with one warning naming it, and a line within the limit decodes back to normalise(line).
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "../../data/numbers.h"
#include "../../tokenizer.h"
#include "fuzz.h"

static const Tokenizer& tokenizer() {
  static const Tokenizer tok = [] {
    std::vector<std::string> text;
    for (const NumberPair& p : number_corpus(11, 300, 0, 0).train) text.push_back(p.en), text.push_back(p.de);
    return Tokenizer::learn(text, 100);
  }();
  return tok;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& tok = tokenizer();
  const std::string bytes((const char*)data, size);
  const int max_tokens = size ? data[0] % 40 + 1 : 8;  // as a model's max_len - 1
  std::istringstream in(bytes);
  const std::vector<std::string> lines = read_lines(in);
  std::vector<std::string> want;  // split at '\n', a BOM and one trailing '\r' dropped, no empty line after the last '\n'
  for (size_t at = 0; at < bytes.size();) {
    size_t end = bytes.find('\n', at);
    if (end == std::string::npos) end = bytes.size();
    want.push_back(bytes.substr(at, end - at));
    if (at == 0 && want.back().compare(0, 3, "\xEF\xBB\xBF") == 0) want.back().erase(0, 3);  // a byte-order mark
    if (!want.back().empty() && want.back().back() == '\r') want.back().pop_back();
    at = end + 1;
  }
  FUZZ_CHECK(lines == want, "%zu lines read, %zu expected (or their text differs)", lines.size(), want.size());
  size_t first_bad_line = 0, first_bad_byte = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t bad = first_invalid_utf8(lines[i]);
    if (bad != std::string::npos && first_bad_line == 0) first_bad_line = i + 1, first_bad_byte = bad;
  }
  std::vector<std::string> warnings;
  try {
    const std::vector<std::vector<int>> src = encode_lines(tok, lines, "stdin", max_tokens, &warnings);
    FUZZ_CHECK(first_bad_line == 0, "line %zu is not UTF-8 (byte %zu) but was accepted", first_bad_line, first_bad_byte);
    FUZZ_CHECK(src.size() == lines.size(), "%zu sentences for %zu lines", src.size(), lines.size());
    size_t cut = 0;
    for (size_t i = 0; i < src.size(); ++i) {
      FUZZ_CHECK((int)src[i].size() <= max_tokens, "line %zu: %zu tokens over the limit %d", i + 1, src[i].size(), max_tokens);
      const std::vector<int> full = tok.encode(lines[i]);
      if ((int)full.size() > max_tokens) {
        FUZZ_CHECK(cut < warnings.size() && warnings[cut].rfind("stdin:" + std::to_string(i + 1) + ": ", 0) == 0 &&
                       warnings[cut].find('\n') == std::string::npos,
                   "no one-line warning for the cut line %zu", i + 1);
        ++cut;
      } else {
        FUZZ_CHECK(tok.decode(src[i]) == Tokenizer::normalise(lines[i]), "line %zu does not decode back", i + 1);
      }
    }
    FUZZ_CHECK(cut == warnings.size(), "%zu warnings for %zu cut lines", warnings.size(), cut);
  } catch (const std::runtime_error& e) {
    const std::string want_msg = "stdin:" + std::to_string(first_bad_line) + ": invalid UTF-8 at byte " + std::to_string(first_bad_byte);
    FUZZ_CHECK(first_bad_line != 0 && e.what() == want_msg, "refused with \"%s\", expected \"%s\"", e.what(), want_msg.c_str());
  }
  return 0;
}
