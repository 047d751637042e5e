// ./translate: translates sentences with a trained checkpoint (greedy or beam search, §6), scores
// translations with sacreBLEU-identical BLEU, and draws attention maps.
//
//   ./translate -m runs/x/model.bin < in.txt > out.txt        beam 4, alpha 0.6 (§6)
//   ./translate -m MODEL -i in.txt --ref ref.txt              translate and print BLEU on stderr
//   ./translate --score hyp.txt --ref ref.txt                 BLEU of a file, no model needed
//   ./translate -m MODEL --attention att.svg <<< "a sentence" attention heat maps of the first sentence
#include <algorithm>
#include <chrono>
#include <cmath>
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
#include <vector>

#include "bleu.h"
#include "tokenizer.h"
#include "transformer.h"

namespace {

struct Options {
  std::string model, vocab, input, output, ref, score, attention, device;  // device "": cuda when a GPU is present
  DecodeOptions decode;
  bool greedy = false, lowercase = false, stats = false;
  int batch = -1;  // sentences decoded together; -1: 32 on the CPU, 200 on the GPU
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
               "  --beam K             beam size (default %d) [§6]\n"
               "  --alpha A            length penalty ((5+|Y|)/6)^A (default %.1f) [§6]\n"
               "  --max-extra N        output length <= source length + N (default %d) [§6]\n"
               "  --greedy             greedy decoding instead of beam search\n"
               "  --n-best K           K hypotheses per sentence: 'LINE ||| translation ||| score ||| log-prob'\n"
               "  --batch N            sentences decoded together (default 32 on the CPU, 200 on the GPU)\n"
               "  --device cpu|cuda    where to decode (default: cuda when a GPU is present, else cpu)\n"
               "  --ref FILE           reference translations: print sacreBLEU's BLEU on stderr\n"
               "  --score FILE         score FILE against --ref (no model)\n"
               "  --lowercase          case-insensitive BLEU\n"
               "  --attention FILE     draw the attention weights of the first sentence as an SVG\n"
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
  if (v.empty() || *end || x < 0 || x > 1000000) fail(flag + " needs a non-negative integer, got '" + v + "'");
  return (int)x;
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
    else if (a == "--beam") o.decode.beam = to_int(a, value());
    else if (a == "--alpha") {
      std::string v = value();
      char* end = nullptr;
      o.decode.alpha = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(o.decode.alpha >= 0)) fail("--alpha needs a number >= 0, got '" + v + "'");
    } else if (a == "--max-extra") o.decode.max_extra = to_int(a, value());
    else if (a == "--greedy") o.greedy = true;
    else if (a == "--n-best") o.decode.n_best = to_int(a, value());
    else if (a == "--batch") o.batch = to_int(a, value());
    else if (a == "--device") o.device = value();
    else if (a == "--ref") o.ref = value();
    else if (a == "--score") o.score = value();
    else if (a == "--lowercase") o.lowercase = true;
    else if (a == "--attention") o.attention = value();
    else if (a == "--stats") o.stats = true;
    else fail("unknown option '" + a + "' (see --help)");
  }
  if (o.decode.beam < 1) fail("--beam must be at least 1");
  if (o.decode.n_best < 1 || o.decode.n_best > o.decode.beam)
    fail("--n-best must be between 1 and --beam (" + std::to_string(o.decode.beam) + ")");
  if (o.greedy && o.decode.n_best > 1) fail("--n-best needs beam search, not --greedy");
  if (o.batch == 0) fail("--batch must be at least 1");
  if (!o.device.empty() && o.device != "cpu" && o.device != "cuda") fail("--device must be cpu or cuda, got '" + o.device + "'");
  if (o.score.empty() && o.model.empty()) fail("no model: give -m CHECKPOINT (or --score HYP --ref REF)");
  if (!o.score.empty() && o.ref.empty()) fail("--score needs --ref REF");
  return o;
}

void print_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs, bool lowercase) {
  BleuScore s = corpus_bleu(hyps, refs, lowercase);
  std::fprintf(stderr, "%s\n%s\n", s.format().c_str(), bleu_signature(lowercase).c_str());
}

// ---- attention maps -----------------------------------------------------------------------------------

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

// One heat map: weights (rows queries x cols keys), query tokens down the left, key tokens along the top.
void heat_map(std::ostream& svg, double x0, double y0, const std::string& title, const float* w, int rows, int cols,
              const std::vector<std::string>& qtok, const std::vector<std::string>& ktok, double cell, double label) {
  svg << "<text x=\"" << x0 + label << "\" y=\"" << y0 + 12 << "\" font-weight=\"bold\">" << xml_escape(title) << "</text>\n";
  const double gx = x0 + label, gy = y0 + label + 16;
  for (int j = 0; j < cols; ++j)
    svg << "<text transform=\"translate(" << gx + (j + 0.7) * cell << "," << gy - 4 << ") rotate(-60)\">"
        << xml_escape(ktok[j]) << "</text>\n";
  for (int i = 0; i < rows; ++i) {
    svg << "<text x=\"" << gx - 4 << "\" y=\"" << gy + (i + 0.7) * cell << "\" text-anchor=\"end\">" << xml_escape(qtok[i])
        << "</text>\n";
    for (int j = 0; j < cols; ++j) {
      const double p = std::clamp((double)w[(size_t)i * cols + j], 0.0, 1.0);
      const int shade = (int)std::lround(255 * (1 - p));  // white (0) to dark blue (1)
      svg << "<rect x=\"" << gx + j * cell << "\" y=\"" << gy + i * cell << "\" width=\"" << cell << "\" height=\"" << cell
          << "\" fill=\"rgb(" << shade << "," << shade << ",255)\"><title>" << xml_escape(qtok[i]) << " -> "
          << xml_escape(ktok[j]) << ": " << p << "</title></rect>\n";
    }
  }
}

// Runs the teacher-forced model on (source, its translation) and draws, per layer and head, the encoder
// self-attention, the decoder self-attention and the encoder-decoder attention (Figures 3-5 of the paper).
void write_attention_svg(const std::string& path, Transformer<float>& m, const Tokenizer& tok, const std::vector<int>& src,
                         const std::vector<int>& out) {
  Batch b = make_batch({&src}, {&out});
  transformer_forward(m, b, false);
  const Config& c = m.cfg;
  std::vector<std::string> s_tok, t_tok;
  for (int id : src) s_tok.push_back(tok.piece(id));
  s_tok.push_back("</s>");
  t_tok.push_back("<s>");
  for (int id : out) t_tok.push_back(tok.piece(id));
  const int S = b.S, Tl = b.T;
  const double cell = 14, label = 90;
  struct Map { std::string name; int layer, rows, cols; const float* p; const std::vector<std::string>* q; const std::vector<std::string>* k; };
  std::vector<Map> maps;
  for (int l = 0; l < c.N; ++l) maps.push_back({"encoder self-attention", l, S, S, m.acts.enc_layers[l].self.p, &s_tok, &s_tok});
  for (int l = 0; l < c.N; ++l) maps.push_back({"decoder self-attention", l, Tl, Tl, m.acts.dec_layers[l].self.p, &t_tok, &t_tok});
  for (int l = 0; l < c.N; ++l) maps.push_back({"encoder-decoder attention", l, Tl, S, m.acts.dec_layers[l].cross.p, &t_tok, &s_tok});
  const double panel_w = label + std::max(S, Tl) * cell + 20, panel_h = label + 16 + std::max(S, Tl) * cell + 20;
  std::ofstream svg(path);
  if (!svg) fail("cannot write " + path);
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << panel_w * c.H << "\" height=\"" << panel_h * maps.size()
      << "\" font-family=\"sans-serif\" font-size=\"10\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t r = 0; r < maps.size(); ++r)
    for (int h = 0; h < c.H; ++h) {
      const Map& mp = maps[r];
      const float* w = mp.p + (size_t)h * mp.rows * mp.cols;  // (B=1, H, rows, cols)
      heat_map(svg, h * panel_w, r * panel_h, mp.name + ", layer " + std::to_string(mp.layer + 1) + ", head " + std::to_string(h + 1),
               w, mp.rows, mp.cols, *mp.q, *mp.k, cell, label);
    }
  svg << "</svg>\n";
  if (!svg.flush()) fail("cannot write " + path);
}

// ---- reading input ------------------------------------------------------------------------------------

std::vector<std::string> read_lines_from(std::istream& in) {
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read " + path + ": " + std::strerror(errno));
  return read_lines_from(in);
}

std::string directory_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  try {
    if (!o.score.empty()) {  // BLEU of a file, no model
      std::vector<std::string> hyps = read_lines(o.score), refs = read_lines(o.ref);
      if (hyps.size() != refs.size())
        fail(o.score + " has " + std::to_string(hyps.size()) + " lines but " + o.ref + " has " + std::to_string(refs.size()));
      BleuScore s = corpus_bleu(hyps, refs, o.lowercase);
      std::printf("%s\n%s\n", s.format().c_str(), bleu_signature(o.lowercase).c_str());
      return 0;
    }
    CheckpointMeta meta{};
    std::unique_ptr<Transformer<float>> model = checkpoint_load(o.model, &meta);
    Transformer<float>& m = *model;
    const std::string vocab_path = o.vocab.empty() ? directory_of(o.model) + "/vocab.bpe" : o.vocab;
    Tokenizer tok = Tokenizer::load(vocab_path);
    if (tok.hash() != meta.vocab_hash)
      fail(vocab_path + " is not the vocabulary " + o.model + " was trained with (hash mismatch)");
    if (tok.vocab_size() != m.cfg.V)
      fail(vocab_path + " has " + std::to_string(tok.vocab_size()) + " tokens but the model has " + std::to_string(m.cfg.V));
    if (o.device.empty()) o.device = gpu_available() && !gpu_emulated() ? "cuda" : "cpu";
    if (o.device == "cuda") transformer_to_device(m, Device::cuda);  // decoding and its K/V caches on the GPU
    if (o.batch < 0) o.batch = o.device == "cuda" ? 200 : 32;

    // Encode everything first: a bad line stops the run before any output is written.
    const std::string input_name = o.input.empty() ? "stdin" : o.input;
    std::vector<std::string> lines = o.input.empty() ? read_lines_from(std::cin) : read_lines(o.input);
    std::vector<std::vector<int>> src(lines.size());
    const int max_src = m.cfg.max_len - 1;  // room for </s>
    for (size_t i = 0; i < lines.size(); ++i) {
      try {
        src[i] = tok.encode(lines[i]);
      } catch (const InvalidUtf8& e) {
        fail(input_name + ":" + std::to_string(i + 1) + ": invalid UTF-8 at byte " + std::to_string(e.offset));
      }
      if ((int)src[i].size() > max_src) {
        std::fprintf(stderr, "translate: warning: %s:%zu: %zu tokens, truncated to the model's maximum of %d\n",
                     input_name.c_str(), i + 1, src[i].size(), max_src);
        src[i].resize(max_src);
      }
    }
    std::vector<std::string> refs;
    if (!o.ref.empty()) {
      refs = read_lines(o.ref);
      if (refs.size() != lines.size())
        fail(o.ref + " has " + std::to_string(refs.size()) + " lines but the input has " + std::to_string(lines.size()));
    }

    // Decode in batches of similar length (less padding), write in input order. Empty lines stay empty.
    std::vector<size_t> order;
    for (size_t i = 0; i < src.size(); ++i)
      if (!src[i].empty()) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return src[a].size() < src[b].size(); });
    std::vector<std::vector<Hypothesis>> result(src.size());
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t at = 0; at < order.size(); at += o.batch) {
      std::vector<std::vector<int>> chunk;
      const size_t end = std::min(order.size(), at + o.batch);
      for (size_t j = at; j < end; ++j) chunk.push_back(src[order[j]]);
      if (o.greedy) {
        std::vector<Hypothesis> g = greedy_decode(m, chunk, o.decode.max_extra);
        for (size_t j = at; j < end; ++j) result[order[j]] = {g[j - at]};
      } else {
        std::vector<std::vector<Hypothesis>> bs = beam_search(m, chunk, o.decode);
        for (size_t j = at; j < end; ++j) result[order[j]] = bs[j - at];
      }
    }
    if (o.stats) {  // the decoding alone: encoder, decoder steps and search; target tokens count </s>
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      long tokens = 0;
      for (const auto& r : result)
        if (!r.empty()) tokens += (long)r[0].tokens.size() + r[0].finished;
      std::fprintf(stderr, "translate: %zu sentences, %ld target tokens in %.2f s on %s (%s): %.1f sentences/s, %.0f tokens/s\n",
                   order.size(), tokens, seconds, o.device.c_str(), o.greedy ? "greedy" : ("beam " + std::to_string(o.decode.beam)).c_str(),
                   order.size() / seconds, tokens / seconds);
    }

    std::ofstream file;
    if (!o.output.empty()) {
      file.open(o.output, std::ios::binary);
      if (!file) fail("cannot write " + o.output + ": " + std::strerror(errno));
    }
    std::ostream& out = o.output.empty() ? std::cout : file;
    std::vector<std::string> hyps(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      hyps[i] = result[i].empty() ? std::string() : tok.decode(result[i][0].tokens);
      if (o.decode.n_best > 1) {
        if (result[i].empty()) out << i + 1 << " |||  ||| 0 ||| 0\n";  // an empty line stays a (scored) empty line
        for (const Hypothesis& h : result[i])
          out << i + 1 << " ||| " << tok.decode(h.tokens) << " ||| " << h.score << " ||| " << h.logprob << "\n";
      } else {
        out << hyps[i] << "\n";
      }
    }
    if (!out.flush()) fail("cannot write " + (o.output.empty() ? std::string("stdout") : o.output));
    if (!o.ref.empty()) print_bleu(hyps, refs, o.lowercase);

    if (!o.attention.empty()) {
      if (order.empty()) fail("--attention: the input has no non-empty sentence to draw");
      const size_t first = *std::min_element(order.begin(), order.end());
      transformer_to_device(m, Device::cpu);  // the maps are read from the CPU pass's saved activations
      write_attention_svg(o.attention, m, tok, src[first], result[first][0].tokens);
      std::fprintf(stderr, "translate: attention maps of line %zu written to %s\n", first + 1, o.attention.c_str());
    }
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return 0;
}
