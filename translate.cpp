// ./translate: translates sentences with a trained checkpoint (greedy or beam search, §6), scores
// translations with sacreBLEU-identical BLEU, and draws attention maps.
//
//   ./translate -m runs/x/model.bin < in.txt > out.txt        beam 4, alpha 0.6 (§6)
//   ./translate -m runs/x/model.bin                           at a terminal: each line translated as typed
//   ./translate -m MODEL -i in.txt --ref ref.txt              translate and print BLEU on stderr
//   ./translate --score hyp.txt --ref ref.txt                 BLEU of a file, no model needed
//   ./translate -m MODEL --attention att.svg <<< "a sentence" attention heat maps of the first sentence
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

#include "bleu.h"
#include "svg.h"
#include "tokenizer.h"
#include "transformer.h"

namespace {

struct Options {
  std::string model, vocab, input, output, ref, score, attention, device;  // device "": cuda when a GPU is present
  std::string precision;  // the GPU's products; "": default_precision()
  DecodeOptions decode;
  bool greedy = false, lowercase = false, stats = false, interactive = false;
  bool beam_given = false, alpha_given = false;  // on the command line (else decoding.txt's, if any)
  bool tune = false, grid_given = false;         // --tune: BLEU for every beam and alpha below
  std::vector<int> beams = {1, 2, 4, 5, 6, 8};
  std::vector<double> alphas = {0, 0.3, 0.6, 0.8, 1.0, 1.2, 1.5, 2.0};
  int batch = -1;  // sentences decoded together; -1: 32 on the CPU, 200 on the GPU
  int attention_layer = -1, attention_head = -1;  // from 1; -1: every layer, every head
};

void usage(FILE* f) {
  DecodeOptions d;
  std::fprintf(f,
               "usage: ./translate -m CHECKPOINT [options] < input > output\n"
               "       ./translate --score HYP --ref REF [--lowercase]\n"
               "  -m, --model FILE     checkpoint written by ./train (required unless --score)\n"
               "  --vocab FILE         BPE vocabulary (default: vocab.bpe beside the checkpoint)\n"
               "  -i, --input FILE     sentences to translate, one per line (default: stdin)\n"
               "  -o, --output FILE    translations, one per line, in input order (default: stdout)\n"
               "  --beam K             beam size (default: decoding.txt's beside the checkpoint, else %d) [§6]\n"
               "  --alpha A            length penalty ((5+|Y|)/6)^A (default: decoding.txt's, else %.1f) [§6]\n"
               "  --max-extra N        output length <= source length + N (default %d) [§6]\n"
               "  --greedy             greedy decoding instead of beam search\n"
               "  --n-best K           K hypotheses per sentence, Moses' n-best format:\n"
               "                       'ID ||| translation ||| score ||| log-prob', IDs from 0 (the input line - 1)\n"
               "  --batch N            sentences decoded together (default 32 on the CPU, 200 on the GPU)\n"
               "  --device cpu|cuda    where to decode (default: cuda when a GPU is present, else cpu)\n"
               "  --precision fp32|tf32|bf16  the GPU's matrix products (default bf16 on a GPU that has it, else fp32)\n"
               "  --ref FILE           reference translations: print sacreBLEU's BLEU on stderr\n"
               "  --score FILE         score FILE against --ref (no model)\n"
               "  --lowercase          case-insensitive BLEU\n"
               "  --interactive        translate each line as soon as it is read, flushing its translation\n"
               "                       (the default when stdin is a terminal; Ctrl-D or Ctrl-C ends, status 0);\n"
               "                       otherwise the input is read and translated a window of 8 batches at a time\n"
               "  --attention FILE     draw the attention weights of the first sentence as an SVG\n"
               "  --attention-layer L  draw layer L only (from 1)\n"
               "  --attention-head H   draw head H only (from 1); with --attention-layer: one head's maps, large\n"
               "  --tune               with -i and --ref (a validation set): BLEU of beam search for every --beams and\n"
               "                       --alphas, as a table; the best is written to decoding.txt beside the checkpoint\n"
               "  --beams K,K,...      (default 1,2,4,5,6,8)\n"
               "  --alphas A,A,...     (default 0,0.3,0.6,0.8,1,1.2,1.5,2)\n"
               "  --stats              print decoding time, sentences/s and target tokens/s on stderr\n"
               "  -h, --help           this help\n",
               d.beam, d.alpha, d.max_extra);
}

[[noreturn]] void fail(const std::string& msg) {
  std::fprintf(stderr, "translate: %s\n", msg.c_str());
  std::exit(1);
}

int to_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || x < 0 || x > 1000000) fail(flag + " needs an integer in [0, 1000000], got '" + v + "'");
  return (int)x;
}

double to_alpha(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || !(x >= 0 && x <= 1e6)) fail(flag + " needs a number >= 0, got '" + v + "'");
  return x;
}

// "1,4,5" -> each item through `one`
template <typename F>
auto to_list(const std::string& flag, const std::string& v, F one) {
  std::vector<decltype(one(flag, v))> out;
  size_t at = 0;
  for (size_t comma; (comma = v.find(',', at)) != std::string::npos; at = comma + 1) out.push_back(one(flag, v.substr(at, comma - at)));
  out.push_back(one(flag, v.substr(at)));
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(a + " needs a value (see --help)");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") usage(stdout), std::exit(0);
    else if (a == "-m" || a == "--model") o.model = value();
    else if (a == "--vocab") o.vocab = value();
    else if (a == "-i" || a == "--input") o.input = value();
    else if (a == "-o" || a == "--output") o.output = value();
    else if (a == "--beam") o.decode.beam = to_int(a, value()), o.beam_given = true;
    else if (a == "--alpha") o.decode.alpha = to_alpha(a, value()), o.alpha_given = true;
    else if (a == "--tune") o.tune = true;
    else if (a == "--beams") o.beams = to_list(a, value(), to_int), o.grid_given = true;
    else if (a == "--alphas") o.alphas = to_list(a, value(), to_alpha), o.grid_given = true;
    else if (a == "--max-extra") o.decode.max_extra = to_int(a, value());
    else if (a == "--greedy") o.greedy = true;
    else if (a == "--n-best") o.decode.n_best = to_int(a, value());
    else if (a == "--batch") o.batch = to_int(a, value());
    else if (a == "--device") o.device = value();
    else if (a == "--precision") o.precision = value();
    else if (a == "--ref") o.ref = value();
    else if (a == "--score") o.score = value();
    else if (a == "--lowercase") o.lowercase = true;
    else if (a == "--attention") o.attention = value();
    else if (a == "--attention-layer") o.attention_layer = to_int(a, value());
    else if (a == "--attention-head") o.attention_head = to_int(a, value());
    else if (a == "--interactive") o.interactive = true;
    else if (a == "--stats") o.stats = true;
    else fail("unknown option '" + a + "' (see --help)");
  }
  if (o.decode.beam < 1) fail("--beam must be at least 1");
  if (o.decode.n_best < 1) fail("--n-best must be at least 1");
  if (o.greedy && o.decode.n_best > 1) fail("--n-best needs beam search, not --greedy");
  if (o.greedy && (o.beam_given || o.alpha_given)) fail("--greedy decodes without a beam: give --greedy or --beam and --alpha, not both");
  if (o.lowercase && o.ref.empty()) fail("--lowercase is BLEU's: it needs --ref REF (or --score HYP --ref REF)");
  if (o.batch == 0) fail("--batch must be at least 1");
  if (!o.device.empty() && o.device != "cpu" && o.device != "cuda") fail("--device must be cpu or cuda, got '" + o.device + "'");
  if (o.score.empty() && o.model.empty()) fail("no model: give -m CHECKPOINT (or --score HYP --ref REF)");
  if (!o.score.empty() && o.ref.empty()) fail("--score needs --ref REF");
  if ((o.attention_layer >= 0 || o.attention_head >= 0) && o.attention.empty())
    fail("--attention-layer and --attention-head need --attention FILE");
  if (o.attention_layer == 0 || o.attention_head == 0) fail("--attention-layer and --attention-head count from 1");
  if (o.tune) {
    if (o.input.empty() || o.ref.empty()) fail("--tune needs -i SOURCE and --ref REFERENCE (a validation set)");
    if (o.greedy || o.beam_given || o.alpha_given || o.decode.n_best > 1 || o.interactive || !o.attention.empty() || !o.output.empty())
      fail("--tune takes --beams and --alphas, not --greedy, --beam, --alpha, --n-best, --interactive, --attention or -o");
    if (std::find(o.beams.begin(), o.beams.end(), 0) != o.beams.end()) fail("--beams must be at least 1");
  } else if (o.grid_given) {
    fail("--beams and --alphas are the grid of --tune: translate with --beam and --alpha");
  }
  return o;
}

void print_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs, bool lowercase) {
  BleuScore s = corpus_bleu(hyps, refs, lowercase);
  std::fprintf(stderr, "%s\n%s\n", s.format().c_str(), bleu_signature(lowercase).c_str());
}

// ---- attention maps -----------------------------------------------------------------------------------
// Figures 3-5 of the paper show attention weights as heat maps. The layout is computed from upper bounds
// of the text's extent (svg.h): every label inside the canvas, none over another or over a map;
// test/svg_check.py checks the drawing against the same bounds.

// A token as a label: at most 12 characters (the rest elided); the full token is in the cell's tooltip.
std::string label_of(const std::string& piece) {
  if (utf8_characters(piece) <= 12) return piece;
  size_t at = 0;
  for (int n = 0; n < 11; ++n)
    do ++at;
    while (at < piece.size() && ((unsigned char)piece[at] & 0xC0) == 0x80);
  return piece.substr(0, at) + "…";
}

struct AttentionMap {
  std::string title;
  int rows, cols;  // queries, keys
  const float* p;  // (rows, cols), each row sums to 1
  const std::vector<std::string>* queries;
  const std::vector<std::string>* keys;
};

// One heat map with its top-left corner at (x0, y0): "head h" on top, key tokens reading upwards above
// the columns, query tokens to the left of the rows. `left` and `top` are the room left for the labels.
std::string heat_map(double x0, double y0, const AttentionMap& mp, const std::string& head, double cell, double font, double head_font,
                     double left, double top) {
  std::string o = svg_text(x0 + left, y0 + kAscent * head_font, head_font, head);
  const double gx = x0 + left, gy = y0 + (kAscent + kDescent) * head_font + 6 + top;  // the grid's top-left corner
  const double centre = font * (kAscent - kDescent) / 2;  // from a label's baseline to the middle of its box
  for (int j = 0; j < mp.cols; ++j)
    o += svg_text(gx + (j + 0.5) * cell + centre, gy - 4, font, label_of((*mp.keys)[j]), "start", false, true);
  for (int i = 0; i < mp.rows; ++i) o += svg_text(gx - 4, gy + (i + 0.5) * cell + centre, font, label_of((*mp.queries)[i]), "end");
  o += "<g class=\"map\" data-title=\"" + svg_escape(mp.title) + "\">\n";
  for (int i = 0; i < mp.rows; ++i)
    for (int j = 0; j < mp.cols; ++j) {
      const double w = std::clamp((double)mp.p[(size_t)i * mp.cols + j], 0.0, 1.0);
      const int shade = (int)std::lround(255 * (1 - w));  // white (0) to blue (1)
      o += "<rect x=\"" + svg_number(gx + j * cell) + "\" y=\"" + svg_number(gy + i * cell) + "\" width=\"" + svg_number(cell) +
           "\" height=\"" + svg_number(cell) + "\" fill=\"rgb(" + std::to_string(shade) + "," + std::to_string(shade) + ",255)\"><title>" +
           svg_escape((*mp.queries)[i] + " -> " + (*mp.keys)[j] + ": " + svg_number(w)) + "</title></rect>\n";
    }
  return o + "</g>\n";
}

// Runs the teacher-forced model on (source, its translation) and draws the encoder self-attention, the
// decoder self-attention and the encoder-decoder attention: a row of heads per kind and layer. `layer` and
// `head` (from 1; -1: all) select; the fewer maps in a row, the larger each is drawn.
void write_attention_svg(const std::string& path, Transformer<float>& m, const Tokenizer& tok, const std::vector<int>& src,
                         const std::vector<int>& out, int layer, int head) {
  Batch b = make_batch({&src}, {&out});
  transformer_forward(m, b, false);
  const Config& c = m.cfg;
  std::vector<std::string> s_tok, t_tok;
  for (int id : src) s_tok.push_back(tok.piece(id));
  s_tok.push_back("</s>");
  t_tok.push_back("<s>");
  for (int id : out) t_tok.push_back(tok.piece(id));
  const int S = b.S, T = b.T;
  std::vector<int> layers, heads;
  for (int l = 0; l < c.N; ++l)
    if (layer < 0 || l == layer - 1) layers.push_back(l);
  for (int h = 0; h < c.H; ++h)
    if (head < 0 || h == head - 1) heads.push_back(h);
  struct Kind { const char* name; int rows, cols; const std::vector<std::string>* q; const std::vector<std::string>* k; };
  const Kind kinds[] = {{"encoder self-attention", S, S, &s_tok, &s_tok},
                        {"decoder self-attention", T, T, &t_tok, &t_tok},
                        {"encoder-decoder attention", T, S, &t_tok, &s_tok}};
  const double head_font = 13, title_font = 15, pad = 12, gap = 24;
  const std::string heading = "attention weights: a row per query, a column per key; white 0, blue 1";
  std::string body = svg_text(pad, pad + kAscent * 12, 12, heading);
  double width = svg_text_width(heading, 12), y = pad + (kAscent + kDescent) * 12 + gap;
  for (int kind = 0; kind < 3; ++kind)
    for (int l : layers) {
      const Kind& k = kinds[kind];
      // Sizes: a row's cells fill about 1200 px, between 12 px (long sentences, many heads) and 32 px
      // (one head); a label's box (kAscent + kDescent of its font) fits its cell; fonts 9 to 14 px.
      const double cell = std::clamp(1200.0 / (heads.size() * std::max(k.rows, k.cols)), 12.0, 32.0), font = std::min(0.75 * cell, 14.0);
      double left = 0, top = 0;  // room for the query labels and for the key labels
      for (int i = 0; i < k.rows; ++i) left = std::max(left, svg_text_width(label_of((*k.q)[i]), font) + 6);
      for (int j = 0; j < k.cols; ++j) top = std::max(top, svg_text_width(label_of((*k.k)[j]), font) + 6);
      const std::string row_title = std::string(k.name) + ", layer " + std::to_string(l + 1);
      body += svg_text(pad, y + kAscent * title_font, title_font, row_title, "start", true);
      width = std::max(width, svg_text_width(row_title, title_font, true));
      y += (kAscent + kDescent) * title_font + 8;
      const double panel = std::max(left + k.cols * cell, svg_text_width("head " + std::to_string(c.H), head_font) + left) + gap;
      for (size_t n = 0; n < heads.size(); ++n) {
        const int h = heads[n];
        const float* p = kind == 0 ? m.acts.enc_layers[l].self.p : kind == 1 ? m.acts.dec_layers[l].self.p : m.acts.dec_layers[l].cross.p;
        AttentionMap mp{row_title + ", head " + std::to_string(h + 1), k.rows, k.cols, p + (size_t)h * k.rows * k.cols, k.q, k.k};  // p: (B=1, H, rows, cols)
        body += heat_map(pad + n * panel, y, mp, "head " + std::to_string(h + 1), cell, font, head_font, left, top);
      }
      width = std::max(width, heads.size() * panel - gap);
      y += (kAscent + kDescent) * head_font + 6 + top + k.rows * cell + gap;
    }
  const std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + svg_number(std::ceil(width + 2 * pad)) + "\" height=\"" +
                          svg_number(std::ceil(y - gap + pad)) + "\" font-family=\"DejaVu Sans, sans-serif\">\n" +
                          "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n" + body + "</svg>\n";
  write_file_atomically(path, svg);
}

// ---- decoding and output ----------------------------------------------------------------------------

std::string directory_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The n-best list of each sentence of `chunk`, the best first (one hypothesis when greedy).
std::vector<std::vector<Hypothesis>> translate_chunk(Transformer<float>& m, const std::vector<std::vector<int>>& chunk, const Options& o) {
  if (!o.greedy) return beam_search(m, chunk, o.decode);
  std::vector<std::vector<Hypothesis>> r;
  for (Hypothesis& h : greedy_decode(m, chunk, o.decode.max_extra)) r.push_back({std::move(h)});
  return r;
}

// Sentence `id`'s output: its best translation, or with --n-best its list in Moses' n-best format,
// 'ID ||| translation ||| score ||| log-probability', IDs from 0. An empty line stays an empty line.
void write_translation(std::ostream& out, size_t id, const std::vector<Hypothesis>& hyps, const Tokenizer& tok, int n_best) {
  if (n_best == 1) {
    out << (hyps.empty() ? std::string() : tok.decode(hyps[0].tokens)) << "\n";
    return;
  }
  if (hyps.empty()) out << id << " |||  ||| 0 ||| 0\n";
  for (const Hypothesis& h : hyps) out << id << " ||| " << tok.decode(h.tokens) << " ||| " << h.score << " ||| " << h.logprob << "\n";
}

// Every non-empty source's n-best list (of a window of the input, or of --tune's whole set), decoded in
// batches of similar length (less padding), the longest first (the buffers the first batch grows fit every
// later one); an empty source gets an empty list. On the CPU, --batch is lowered (with a warning) to what
// memory holds.
std::vector<std::vector<Hypothesis>> decode_all(Transformer<float>& m, const std::vector<std::vector<int>>& src, Options& o) {
  std::vector<size_t> order;
  for (size_t i = 0; i < src.size(); ++i)
    if (!src[i].empty()) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return src[a].size() > src[b].size(); });
  if (o.device == "cpu" && !order.empty()) {  // as many sentences at a time as memory holds
    const int rows_each = o.greedy ? 1 : o.decode.beam, longest = (int)src[order.front()].size();
    auto bytes = [&](size_t sentences) {
      return decoding_bytes(m.cfg, (int)sentences, longest + 1, max_output_length(m.cfg, longest, o.decode.max_extra),
                            (int)sentences * rows_each);
    };
    const size_t available = available_memory(), wanted = std::min((size_t)o.batch, order.size());
    if (bytes(1) > available)
      fail("decoding one sentence of " + std::to_string(longest) + " tokens with beam " + std::to_string(rows_each) + " needs " +
           std::to_string(bytes(1) >> 20) + " MB, but " + std::to_string(available >> 20) + " MB are available: lower --beam");
    size_t fits = wanted;
    while (bytes(fits) > available) fits /= 2;
    if (fits < wanted) {
      std::fprintf(stderr, "translate: warning: --batch %zu needs %zu MB with beam %d, %zu MB are available: decoding %zu sentences at a time\n",
                   wanted, bytes(wanted) >> 20, rows_each, available >> 20, fits);
      o.batch = (int)fits;
    }
  }
  std::vector<std::vector<Hypothesis>> result(src.size());
  for (size_t at = 0; at < order.size(); at += o.batch) {
    std::vector<std::vector<int>> chunk;
    const size_t end = std::min(order.size(), at + o.batch);
    for (size_t j = at; j < end; ++j) chunk.push_back(src[order[j]]);
    std::vector<std::vector<Hypothesis>> r = translate_chunk(m, chunk, o);
    for (size_t j = at; j < end; ++j) result[order[j]] = std::move(r[j - at]);
  }
  return result;
}

// The best translation of each line (empty for an empty source).
std::vector<std::string> best_translations(const std::vector<std::vector<Hypothesis>>& result, const Tokenizer& tok) {
  std::vector<std::string> hyps;
  for (const std::vector<Hypothesis>& r : result) hyps.push_back(r.empty() ? std::string() : tok.decode(r[0].tokens));
  return hyps;
}

// --tune: corpus BLEU of beam search on a validation set for every beam size and length penalty, printed
// as a table (a row per beam, a column per alpha); the best (the first of equals: smaller beams and
// alphas first) is written to decoding.txt beside the checkpoint.
void tune_decoding(Transformer<float>& m, const Tokenizer& tok, const std::vector<std::vector<int>>& src,
                   const std::vector<std::string>& refs, Options& o, const std::string& defaults_path) {
  std::printf("BLEU of beam search on %s (%zu sentences) against %s: a row per beam size, a column per length penalty alpha\n",
              o.input.c_str(), src.size(), o.ref.c_str());
  std::printf("%-6s", "beam");
  for (double a : o.alphas) std::printf(" %7g", a);
  std::printf("\n");
  DecodeOptions best = o.decode;
  double best_bleu = -1;
  for (int beam : o.beams) {
    std::printf("%-6d", beam);
    for (double alpha : o.alphas) {
      o.decode.beam = beam, o.decode.alpha = alpha;
      const double bleu = corpus_bleu(best_translations(decode_all(m, src, o), tok), refs, o.lowercase).score;
      std::printf(" %7.2f", bleu);
      std::fflush(stdout);
      if (bleu > best_bleu) best_bleu = bleu, best = o.decode;
    }
    std::printf("\n");
  }
  char line[160];
  std::snprintf(line, sizeof line, "beam %d, alpha %g: BLEU %.2f on %zu sentences of %s", best.beam, best.alpha, best_bleu, src.size(), o.input.c_str());
  save_decoding_defaults(defaults_path, best, std::string("chosen by ./translate --tune: ") + line);
  std::printf("best: %s; written to %s, which ./translate -m %s uses unless given --beam or --alpha\n", line, defaults_path.c_str(),
              o.model.c_str());
}

// Ctrl-C in an interactive session: waiting at the prompt, everything asked for is written and flushed,
// so the program ends at once; while a line is being translated, it ends after writing its translation.
volatile std::sig_atomic_t interrupted = 0, waiting_for_input = 0;
void on_interrupt(int) {
  if (waiting_for_input) {
    if (write(STDERR_FILENO, "\n", 1) < 0) {}  // the shell's prompt on a line of its own
    _exit(0);
  }
  interrupted = 1;
}

// ---- the session's stages ---------------------------------------------------------------------------

// What the stages share: the options (decoding.txt's defaults and the device filled in), the model and its
// vocabulary, the references, and what the report needs of the translations, gathered as they are written.
struct Session {
  Options o;
  std::unique_ptr<Transformer<float>> model;
  Tokenizer tok;
  std::string defaults_path;  // decoding.txt beside the checkpoint
  std::vector<std::string> refs;
  std::ofstream file;                     // -o
  size_t lines = 0, sentences = 0;        // input lines written, and those with a translation (not empty)
  long tokens = 0;                        // target tokens translated, </s> included
  std::vector<std::string> hyps;          // every line's best translation, with --ref
  size_t first_line = 0;                  // the first line with a translation, from 1 (0: none yet): --attention's
  std::vector<int> first_src, first_out;  // its source and translation
  double seconds = 0;                     // spent decoding
  bool rejected = false;                  // a line was not valid UTF-8

  explicit Session(Options options) : o(std::move(options)) {}
  std::string input_name() const { return o.input.empty() ? "stdin" : o.input; }
  std::vector<std::vector<int>> encode(const std::vector<std::string>& lines, size_t first_line) const {  // encode_lines, warnings printed
    const int max_src = model->cfg.max_len - 1;  // room for </s>
    std::vector<std::string> warnings;
    std::vector<std::vector<int>> ids = encode_lines(tok, lines, input_name(), max_src, &warnings, first_line);
    for (const std::string& w : warnings) std::fprintf(stderr, "translate: warning: %s\n", w.c_str());
    return ids;
  }
  // A line that is not UTF-8 is reported and translated as an empty line; the exit status is then 1.
  std::vector<int> encode_line(const std::string& line, size_t number) {
    try {
      return encode({line}, number)[0];
    } catch (const std::runtime_error& e) {
      std::fprintf(stderr, "translate: %s\n", e.what());
      rejected = true;
      return {};
    }
  }
  void note(const std::vector<int>& src, const std::vector<Hypothesis>& result) {  // a line written: what report() needs
    ++lines;
    if (!o.ref.empty()) hyps.push_back(result.empty() ? std::string() : tok.decode(result[0].tokens));
    if (result.empty()) return;
    ++sentences;
    tokens += (long)result[0].tokens.size() + result[0].finished;  // target tokens count </s>
    if (first_line == 0) first_line = lines, first_src = src, first_out = result[0].tokens;
  }
  void check_refs(size_t input_lines) const {
    if (!o.ref.empty() && refs.size() != input_lines)
      fail(o.ref + " has " + std::to_string(refs.size()) + " lines but the input has " + std::to_string(input_lines));
  }
  std::ostream& open_output() {
    if (o.output.empty()) return std::cout;
    file.open(o.output, std::ios::binary);
    if (!file) fail("cannot write " + o.output + ": " + std::strerror(errno));
    return file;
  }
  void check_written(std::ostream& out) const {
    if (!out.flush()) fail("cannot write " + (o.output.empty() ? std::string("stdout") : o.output));
  }
};

// -o and --attention must not name the model, its vocabulary or an input, which writing them would destroy
// (a checkpoint was once replaced by its own translation, exit 0). Files are compared as files (device and
// inode): model.bin, a link, is the checkpoint it names. --attention's folder must take the file before
// anything is translated.
void check_outputs(const Options& o) {
  auto same = [](const std::string& a, const std::string& b) {
    struct stat x, y;
    return !a.empty() && !b.empty() && stat(a.c_str(), &x) == 0 && S_ISREG(x.st_mode) && stat(b.c_str(), &y) == 0 &&
           x.st_dev == y.st_dev && x.st_ino == y.st_ino;
  };
  const std::string vocab = !o.vocab.empty() || o.model.empty() ? o.vocab : directory_of(o.model) + "/vocab.bpe";
  for (const auto& [flag, out] : {std::pair{"-o", &o.output}, std::pair{"--attention", &o.attention}})
    for (const auto& [what, in] : {std::pair{"the model", &o.model}, std::pair{"the vocabulary", &vocab}, std::pair{"the input", &o.input},
                                   std::pair{"the reference", &o.ref}})
      if (same(*out, *in)) fail(std::string(flag) + " " + *out + " is " + what + " (" + *in + "): writing it would destroy it; choose another file");
  if (!o.attention.empty() && access(directory_of(o.attention).c_str(), W_OK) != 0)
    fail("--attention " + o.attention + ": cannot write to " + directory_of(o.attention) + ": " + std::strerror(errno));
}

// --score: BLEU of a file, no model
void score_file(const Options& o) {
  std::vector<std::string> hyps = read_text_lines(o.score), refs = read_text_lines(o.ref);
  if (hyps.size() != refs.size())
    fail(o.score + " has " + std::to_string(hyps.size()) + " lines but " + o.ref + " has " + std::to_string(refs.size()));
  BleuScore s = corpus_bleu(hyps, refs, o.lowercase);
  std::printf("%s\n%s\n", s.format().c_str(), bleu_signature(o.lowercase).c_str());
}

// The checkpoint, and the vocabulary it was trained with.
void load_model(Session& s) {
  const Options& o = s.o;
  CheckpointMeta meta{};
  s.model = checkpoint_load(o.model, &meta);
  const std::string vocab_path = o.vocab.empty() ? directory_of(o.model) + "/vocab.bpe" : o.vocab;
  s.tok = Tokenizer::load(vocab_path);
  if (s.tok.hash() != meta.vocab_hash)
    fail(vocab_path + " is not the vocabulary " + o.model + " was trained with (hash mismatch)");
  if (s.tok.vocab_size() != s.model->cfg.V)
    fail(vocab_path + " has " + std::to_string(s.tok.vocab_size()) + " tokens but the model has " + std::to_string(s.model->cfg.V));
}

// the run folder's decoding defaults, where the command line is silent
void use_decoding_defaults(Session& s) {
  Options& o = s.o;
  s.defaults_path = directory_of(o.model) + "/decoding.txt";
  DecodeOptions defaults;
  const bool have_defaults = !o.tune && load_decoding_defaults(s.defaults_path, &defaults);
  if (have_defaults && !o.beam_given) o.decode.beam = defaults.beam;
  if (have_defaults && !o.alpha_given) o.decode.alpha = defaults.alpha;
  if (!o.greedy && o.decode.n_best > o.decode.beam)
    fail("--n-best " + std::to_string(o.decode.n_best) + " is more than the beam of " + std::to_string(o.decode.beam) +
         (have_defaults && !o.beam_given ? " (" + s.defaults_path + ")" : "") + ": give a --beam of at least as many");
}

// The options checked against the model.
void check_against_model(const Session& s) {
  const Options& o = s.o;
  const Config& c = s.model->cfg;
  // Options that would only make work explode are refused or capped here, with one line each.
  const int predictable = c.V - 2;  // decoding never predicts <pad> or <s>
  for (int beam : o.tune ? o.beams : std::vector<int>{o.greedy ? 1 : o.decode.beam})
    if (beam > predictable)
      fail("a beam of " + std::to_string(beam) + " is more than the " + std::to_string(predictable) +
           " tokens the model can predict: choose at most that many");
  if (o.decode.max_extra >= c.max_len)
    std::fprintf(stderr, "translate: warning: --max-extra %d cannot be met: outputs stop at the model's max_len of %d tokens\n",
                 o.decode.max_extra, c.max_len);
  if (o.attention_layer > c.N) fail("--attention-layer " + std::to_string(o.attention_layer) + ": the model has " + std::to_string(c.N) + " layers");
  if (o.attention_head > c.H) fail("--attention-head " + std::to_string(o.attention_head) + ": the model has " + std::to_string(c.H) + " heads");
}

void choose_device(Session& s) {
  Options& o = s.o;
  if (o.device.empty()) o.device = gpu_available() && !gpu_emulated() ? "cuda" : "cpu";
  if (!o.precision.empty() && o.device != "cuda") fail("--precision is a GPU option: it needs --device cuda");
  if (o.device == "cuda") {
    transformer_to_device(*s.model, Device::cuda);  // decoding and its K/V caches on the GPU
    set_precision(o.precision.empty() ? default_precision() : parse_precision(o.precision));
  }
  if (o.batch < 0) o.batch = o.device == "cuda" ? 200 : 32;
}

// The lines of -i (or stdin), reading up to `count` into `lines`; false when there are none left. With a
// prompt (an interactive session at a terminal), one before each; Ctrl-C while waiting ends the program.
bool read_window(LineReader& in, std::vector<std::string>& lines, size_t count, bool prompt) {
  lines.clear();
  for (std::string line; lines.size() < count;) {
    waiting_for_input = 1;
    if (prompt) std::fputs("> ", stderr);
    const bool more = in.next(line);
    waiting_for_input = 0;
    if (!more) break;
    lines.push_back(std::move(line));
  }
  return !lines.empty();
}

// The input as a stream: a window of lines is read, encoded, decoded in batches of similar length
// (decode_all) and written in input order and flushed, then the next. Memory holds a window (8 batches'
// lines), not the file. Interactively (stdin a terminal, or --interactive) a window is one line, translated
// as soon as it is complete; Ctrl-D ends the input (then --ref, --stats and --attention report), Ctrl-C
// the session, with nothing more (exit status 0, as ./train's Ctrl-C).
void translate_stream(Session& s, bool interactive) {
  const bool prompt = interactive && isatty(STDIN_FILENO) && isatty(STDERR_FILENO);
  if (interactive) std::signal(SIGINT, on_interrupt);
  if (prompt) std::fprintf(stderr, "translate: type a sentence and press Enter; Ctrl-D or Ctrl-C ends\n");
  std::ifstream in_file;
  if (!s.o.input.empty()) open_for_reading(in_file, s.o.input);
  LineReader in(s.o.input.empty() ? std::cin : in_file, s.input_name());
  std::ostream& out = s.open_output();
  const size_t window = interactive ? 1 : 8 * (size_t)s.o.batch;
  std::vector<std::string> lines;
  while (!interrupted && read_window(in, lines, window, prompt)) {
    std::vector<std::vector<int>> src;
    for (size_t i = 0; i < lines.size(); ++i) src.push_back(s.encode_line(lines[i], s.lines + i + 1));
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<std::vector<Hypothesis>> result = decode_all(*s.model, src, s.o);
    s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = 0; i < src.size(); ++i) {
      write_translation(out, s.lines, result[i], s.tok, s.o.decode.n_best);
      s.note(src[i], result[i]);
    }
    s.check_written(out);
  }
}

// The references, and with -i a regular file, its line count checked against them before anything is
// translated (a pipe's or stdin's is checked at its end: it can be read once).
void read_references(Session& s) {
  if (s.o.ref.empty()) return;
  s.refs = read_text_lines(s.o.ref);
  struct stat st;
  if (s.o.input.empty() || s.o.tune || stat(s.o.input.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
  std::ifstream file;
  open_for_reading(file, s.o.input);
  LineReader in(file, s.o.input);
  size_t lines = 0;
  for (std::string line; in.next(line);) ++lines;
  s.check_refs(lines);
}

// --tune's validation set, whole: every line encoded (one that is not UTF-8 stops the run).
std::vector<std::vector<int>> read_input(const Session& s) {
  std::vector<std::string> lines = read_text_lines(s.o.input);
  s.check_refs(lines.size());
  return s.encode(lines, 1);
}

// After the translations: --stats, BLEU against --ref, and --attention's maps of the first non-empty line.
void report(Session& s) {
  const Options& o = s.o;
  if (o.stats)  // the decoding alone: encoder, decoder steps and search
    std::fprintf(stderr, "translate: %zu sentences, %ld target tokens in %.2f s on %s (%s): %.1f sentences/s, %.0f tokens/s\n",
                 s.sentences, s.tokens, s.seconds, o.device.c_str(), o.greedy ? "greedy" : ("beam " + std::to_string(o.decode.beam)).c_str(),
                 s.sentences / s.seconds, s.tokens / s.seconds);
  if (!o.ref.empty()) print_bleu(s.hyps, s.refs, o.lowercase);
  if (!o.attention.empty()) {
    if (s.first_line == 0) fail("--attention: the input has no non-empty sentence to draw");
    transformer_to_device(*s.model, Device::cpu);  // the maps are read from the CPU pass's saved activations
    write_attention_svg(o.attention, *s.model, s.tok, s.first_src, s.first_out, o.attention_layer, o.attention_head);
    std::fprintf(stderr, "translate: attention maps of line %zu written to %s\n", s.first_line, o.attention.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  Session s(parse(argc, argv));
  try {
    if (!s.o.precision.empty()) parse_precision(s.o.precision);  // a bad name is an error before any work
    if (!s.o.score.empty()) {
      score_file(s.o);
      return 0;
    }
    check_outputs(s.o);
    load_model(s);
    use_decoding_defaults(s);
    check_against_model(s);
    choose_device(s);
    read_references(s);
    if (s.o.tune) {
      tune_decoding(*s.model, s.tok, read_input(s), s.refs, s.o, s.defaults_path);
      return 0;
    }
    translate_stream(s, s.o.interactive || (s.o.input.empty() && isatty(STDIN_FILENO)));
    if (interrupted) return 0;
    s.check_refs(s.lines);
    report(s);
    return s.rejected ? 1 : 0;
  } catch (const std::exception& e) {
    fail(e.what());
  }
}
