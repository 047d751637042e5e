// Byte-pair encoding (Sennrich et al., 2016), the subword vocabulary of §5.1: one vocabulary learned
// jointly on source and target text, so that the model can tie its three embedding matrices (§3.4).
//
// Text goes through three stages (NOTES.md, "BPE"):
//   normalise:     NFC (utf8proc); every run of whitespace (Unicode White_Space: spaces of category Zs
//                  such as U+00A0, tabs, line and paragraph separators) becomes one U+0020; leading and
//                  trailing whitespace is removed. decode(encode(x)) == normalise(x), exactly.
//   pre-tokenise:  words are split at spaces, then into runs of letters (with their combining marks) and
//                  runs of digits; every other character (punctuation, symbols, emoji, format characters
//                  such as U+200B and U+200D) stands alone. U+2581 '▁' starts the first piece of a word.
//   BPE:           the merges, lowest rank first. Characters never seen in training fall back to their
//                  UTF-8 bytes (<0x00>..<0xFF> are always in the vocabulary): nothing becomes <unk>.
#pragma once
#include <cstdint>
#include <fstream>
#include <istream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

// Text input, one line at a time: a trailing "\r" is dropped, the last line may lack "\n", and a UTF-8
// byte-order mark at the start (Windows editors write one) is skipped. A line of more than kMaxLineBytes
// throws std::runtime_error "NAME:LINE: ...": no sentence is that long, and a file without newlines
// (/dev/zero, a binary file) would otherwise be read whole into one line.
class LineReader {
 public:
  static constexpr size_t kMaxLineBytes = 1 << 20;
  LineReader(std::istream& in, std::string name) : in_(in), name_(std::move(name)) {}
  bool next(std::string& line);               // false at the end of the input
  size_t line_number() const { return number_; }  // of the line next() gave last, from 1
 private:
  std::istream& in_;
  std::string name_;
  size_t number_ = 0;
};

// Opens PATH for reading; throws std::runtime_error "cannot read PATH: REASON" (a directory included).
void open_for_reading(std::ifstream& file, const std::string& path);
// The lines of a text file, as LineReader reads them; "-" reads stdin. Throws std::runtime_error naming
// the file when it cannot be read.
std::vector<std::string> read_text_lines(const std::string& path);
std::vector<std::string> read_lines(std::istream& in, const std::string& name = "stdin");  // the same, from a stream

// Writes `bytes` to PATH atomically: a temporary file beside it, flushed and synced, then renamed over
// PATH, so a reader (or a crash) sees the old file or the new one, never half of one. Throws
// std::runtime_error naming PATH when it cannot.
void write_file_atomically(const std::string& path, const std::string& bytes);

// Invalid UTF-8 in the input: what() names the byte offset; callers add the file and line.
struct InvalidUtf8 : std::runtime_error {
  size_t offset;
  explicit InvalidUtf8(size_t at) : std::runtime_error("invalid UTF-8 at byte " + std::to_string(at)), offset(at) {}
};

struct Tokenizer {
  static constexpr int kPad = 0, kUnk = 1, kBos = 2, kEos = 3;  // the same ids as transformer.h
  static constexpr int kFirstByte = 4;                           // <0x00> .. <0xFF> are ids 4 .. 259

  // Learns `merges` merges over all lines together (source and target text): start from characters,
  // repeatedly merge the most frequent adjacent pair within pre-tokens, weighted by pre-token frequency;
  // ties go to the pair whose (left, right) strings sort first. Stops early when no pair occurs twice.
  // Throws std::runtime_error naming the line and byte offset of invalid UTF-8.
  static Tokenizer learn(const std::vector<std::string>& lines, int merges);

  // A readable file: a version line, the hash, the merges in order, then the vocabulary (id, piece).
  void save(const std::string& path) const;
  // Throws std::runtime_error with one line: missing file, wrong version, malformed line, hash mismatch.
  static Tokenizer load(const std::string& path);

  // normalise, pre-tokenise, BPE; no <s> or </s>. Throws InvalidUtf8. Keeps a cache of encoded
  // pre-tokens, so one Tokenizer must not encode from several threads at once.
  std::vector<int> encode(const std::string& text) const;
  // Specials (<pad>, <s>, </s>) are skipped, <unk> and byte sequences that are not UTF-8 become U+FFFD.
  // Throws std::out_of_range for an id outside the vocabulary.
  std::string decode(const std::vector<int>& ids) const;
  std::vector<std::string> pieces(const std::string& text) const;  // encode's pieces, as text
  const std::string& piece(int id) const;                          // throws std::out_of_range
  int vocab_size() const { return (int)vocab_.size(); }
  int merge_count() const { return (int)merges_.size(); }
  uint64_t hash() const { return hash_; }  // of the merges and vocabulary: what checkpoints store

  static std::string normalise(const std::string& text);

 private:
  std::vector<std::string> vocab_;                      // id -> piece
  std::unordered_map<std::string, int> ids_;            // piece -> id
  std::vector<std::pair<int, int>> merges_;             // in rank order
  std::unordered_map<uint64_t, std::pair<int, int>> rank_;  // (left, right) -> (rank, merged id)
  uint64_t hash_ = 0;
  mutable std::unordered_map<std::string, std::vector<int>> cache_;  // pre-token -> ids

  static Tokenizer with_alphabet(const std::vector<std::string>& chars);
  int add_piece(const std::string& piece);
  void add_merge(int left, int right);
  void compute_hash();
  void encode_pretoken(const std::string& pretoken, std::vector<int>& out) const;
};

// Sentences to translate, one a line (./translate's input), each encoded; an empty line stays empty. A line
// that is not UTF-8 throws std::runtime_error "NAME:LINE: invalid UTF-8 at byte N"; a line of more than
// max_tokens tokens is cut to max_tokens, with a one-line warning naming it added to *warnings. Lines are
// numbered from first_line (an interactive session encodes one line at a time).
std::vector<std::vector<int>> encode_lines(const Tokenizer& tok, const std::vector<std::string>& lines, const std::string& name,
                                           int max_tokens, std::vector<std::string>* warnings, size_t first_line = 1);
