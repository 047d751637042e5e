// fuzz_bpe: BPE encoding and decoding of arbitrary bytes (Tokenizer::encode, Tokenizer::decode).
// Properties, for a vocabulary learned on English and German numbers and a few other scripts:
//   - valid UTF-8 (by first_invalid_utf8, written from the RFC) encodes without error into ids of real
//     pieces (never a special token), and decodes back to exactly normalise(text): lossless;
//   - encoding normalise(text) gives the same ids (normalisation is idempotent);
//   - invalid UTF-8 is refused with InvalidUtf8 at the offset of the first bad byte;
//   - any sequence of ids decodes without error into valid UTF-8.
#include <cstdint>
#include <string>
#include <vector>

#include "../../data/numbers.h"
#include "../../tokenizer.h"
#include "fuzz.h"

static const Tokenizer& tokenizer() {
  static const Tokenizer tok = [] {
    std::vector<std::string> text;
    for (const NumberPair& p : number_corpus(7, 400, 0, 0).train) text.push_back(p.en), text.push_back(p.de);
    for (const char* s : {"Ein Mann fährt Fahrrad.", "Ça coûte 3,50 € !", "Ελληνικά κείμενα", "日本語の文章です",
                          "naïve café e\xCC\x81", "emoji \xF0\x9F\x98\x80\xE2\x80\x8D\xF0\x9F\x92\xBB"})
      text.push_back(s);
    return Tokenizer::learn(text, 300);
  }();
  return tok;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& tok = tokenizer();
  const std::string text((const char*)data, size);
  const size_t bad = first_invalid_utf8(text);
  if (bad == std::string::npos) {
    const std::vector<int> ids = tok.encode(text);
    for (int id : ids)
      FUZZ_CHECK(id > Tokenizer::kEos && id < tok.vocab_size(), "encode gave id %d (vocabulary %d)", id, tok.vocab_size());
    const std::string norm = Tokenizer::normalise(text), back = tok.decode(ids);
    FUZZ_CHECK(back == norm, "decode(encode(x)) = \"%s\", normalise(x) = \"%s\"", back.c_str(), norm.c_str());
    FUZZ_CHECK(tok.encode(norm) == ids, "encode(normalise(x)) differs from encode(x) for \"%s\"", norm.c_str());
  } else {
    size_t at = std::string::npos;
    try {
      tok.encode(text);
    } catch (const InvalidUtf8& e) {
      at = e.offset;
    }
    FUZZ_CHECK(at == bad, "invalid UTF-8 at byte %zu refused at %zu (npos: accepted)", bad, at);
  }
  // the bytes as token ids, two bytes each
  std::vector<int> ids;
  for (size_t i = 0; i + 1 < size; i += 2) ids.push_back((data[i] | data[i + 1] << 8) % tok.vocab_size());
  const std::string out = tok.decode(ids);
  FUZZ_CHECK(first_invalid_utf8(out) == std::string::npos, "decode gave invalid UTF-8 at byte %zu", first_invalid_utf8(out));
  return 0;
}
