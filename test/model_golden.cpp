// model_golden: the whole model in double reproduces PyTorch float64 autograd on a tiny model
// (test/golden/model, post-LN and pre-LN): logits, loss and every parameter gradient within 1e-9
// relative. Gradient checks prove the backward matches the forward; this proves the forward is the paper's.
// Usage: model_golden FILE...   (a missing file is a failure: the reference is part of the repository)
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../transformer.h"
#include "check.h"

struct Golden {
  std::map<std::string, std::string> config;
  std::map<std::string, std::vector<double>> tensors;
  std::map<std::string, std::vector<int>> shapes;
};

static Golden read_golden(const std::string& path) {
  std::ifstream in(path);
  Golden g;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string word;
    ls >> word;
    if (word == "config") {
      std::string k, v;
      while (ls >> k >> v) g.config[k] = v;
    } else if (word == "tensor") {
      std::string name;
      ls >> name;
      int d;
      while (ls >> d) g.shapes[name].push_back(d);
      std::getline(in, line);
      std::istringstream vs(line);
      double x;
      while (vs >> x) g.tensors[name].push_back(x);
    }
  }
  return g;
}

static std::vector<int> ids(const std::vector<double>& v) { return std::vector<int>(v.begin(), v.end()); }

static void check_file(Checker& ck, const std::string& path) {
  Golden g = read_golden(path);
  Config c;
  c.N = std::stoi(g.config.at("N")), c.D = std::stoi(g.config.at("D")), c.H = std::stoi(g.config.at("H"));
  c.F = std::stoi(g.config.at("F")), c.V = std::stoi(g.config.at("V"));
  c.eps_ls = std::stod(g.config.at("eps_ls")), c.ln_eps = std::stod(g.config.at("ln_eps"));
  c.pre_ln = g.config.at("pre_ln") == "1";
  c.ls_form = LabelSmoothing::uniform_all;  // the reference's convention (PyTorch label_smoothing)
  c.p_drop = c.p_attn = c.p_relu = 0;
  ck.expect(std::stoi(g.config.at("pad")) == kPadId, "%s: pad id differs from ours", path.c_str());
  Transformer<double> m(c, 1);
  for (const TensorInfo& t : m.table) {
    const auto& v = g.tensors[t.name];
    if (!ck.expect(v.size() == t.size && g.shapes[t.name] == t.shape, "%s: tensor %s missing or of another shape",
                   path.c_str(), t.name.c_str()))
      return;
    std::copy(v.begin(), v.end(), m.params.begin() + t.offset);
  }
  Batch b;
  b.B = g.shapes["src"][0], b.S = g.shapes["src"][1], b.T = g.shapes["tgt_in"][1];
  b.src = ids(g.tensors["src"]), b.tgt_in = ids(g.tensors["tgt_in"]), b.tgt_out = ids(g.tensors["tgt_out"]);
  zero_grad(m);
  double loss = transformer_forward(m, b, false);
  transformer_backward(m, b, false);
  const std::string tag = c.pre_ln ? "pre-LN " : "post-LN ";
  const double tol = 1e-9, floor = 1e-15;
  ck.close(loss, g.tensors["loss"].at(0), tol, floor, (tag + "loss").c_str());
  const auto& logits = g.tensors["logits"];
  ck.expect(logits.size() == (size_t)b.B * b.T * c.V, "%s: logits of the wrong size", path.c_str());
  for (size_t i = 0; i < logits.size(); ++i)
    ck.close(m.acts.logits[i], logits[i], tol, floor, (tag + "logits[" + std::to_string(i) + "]").c_str());
  for (const TensorInfo& t : m.table) {
    const auto& want = g.tensors["grad." + t.name];
    if (!ck.expect(want.size() == t.size, "%s: grad.%s missing", path.c_str(), t.name.c_str())) continue;
    // relative to the tensor's largest gradient: entries that are exactly zero in one and 1e-18 in the
    // other are rounding, not disagreement
    double scale = 0;
    for (double x : want) scale = std::fmax(scale, std::fabs(x));
    for (size_t i = 0; i < t.size; ++i)
      ck.close(m.grads[t.offset + i], want[i], tol, tol * scale * 1e-3 + floor,
               (tag + "grad." + t.name + "[" + std::to_string(i) + "]").c_str());
  }
}

int main(int argc, char** argv) {
  Checker ck("model_golden");
  for (int i = 1; i < argc; ++i) {
    if (!ck.expect(std::ifstream(argv[i]).good(), "%s not found (test/golden/model is part of the repository)", argv[i]))
      continue;
    check_file(ck, argv[i]);
  }
  return ck.finish();
}
