// fuzz_vocab: the vocabulary loader (Tokenizer::load) on arbitrary files. It must refuse with one line or
// load; it never crashes, hangs or allocates more than the file warrants. The hash line guards the
// file, so most mutations stop there: when the loader reports a hash mismatch, the target writes the
// hash the loader computed into the file and loads again, reaching everything past the check. A
// vocabulary that loads must save and load back to the same hash, encode and decode a few sentences
// losslessly, and decode every one of its ids to valid UTF-8.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../../tokenizer.h"
#include "fuzz.h"

static bool load(const std::string& path, Tokenizer* tok, std::string* error) {
  try {
    *tok = Tokenizer::load(path);
    return true;
  } catch (const std::exception& e) {
    *error = e.what();
    FUZZ_CHECK(error->find('\n') == std::string::npos && !error->empty(), "the error is not one line: \"%s\"", e.what());
    return false;
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = scratch_file("vocab"), saved = path + ".saved";
  std::string text((const char*)data, size);
  write_file(path, text);
  Tokenizer tok;
  std::string error;
  bool ok = load(path, &tok, &error);
  const std::string tag = "its contents give ";
  const size_t at = error.find(tag), line2 = text.find('\n'), line3 = line2 == std::string::npos ? line2 : text.find('\n', line2 + 1);
  if (!ok && at != std::string::npos && line3 != std::string::npos) {  // a hash mismatch: repair the hash, load again
    text.replace(line2 + 1, line3 - line2 - 1, "hash " + error.substr(at + tag.size(), 16));
    write_file(path, text);
    ok = load(path, &tok, &error);
    FUZZ_CHECK(ok || error.find("hash mismatch") == std::string::npos, "the repaired hash is refused: %s", error.c_str());
  }
  if (!ok) return 0;
  tok.save(saved);
  Tokenizer again;
  FUZZ_CHECK(load(saved, &again, &error), "a saved vocabulary does not load: %s", error.c_str());
  FUZZ_CHECK(again.hash() == tok.hash() && again.vocab_size() == tok.vocab_size(), "save and load changed the vocabulary");
  for (const char* s : {"three hundred and twenty-four", "dreihundertvierundzwanzig", "Ça coûte 3,50 € !", "日本語 \xF0\x9F\x98\x80"}) {
    const std::vector<int> ids = tok.encode(s);
    FUZZ_CHECK(tok.decode(ids) == Tokenizer::normalise(s), "\"%s\" does not decode back", s);
  }
  for (int id = 0; id < tok.vocab_size(); ++id)
    FUZZ_CHECK(first_invalid_utf8(tok.decode({id})) == std::string::npos, "id %d decodes to invalid UTF-8", id);
  return 0;
}
