// Writes the expected values of the forward tasks (solution tree only; not in a handout): the outputs of
// every visible case into course/snapshots/TASK.txt, or with --hidden DIR those of DIR/cases.txt into
// DIR/snapshots/TASK.txt. `make snapshots [HIDDEN=dir]` runs it.
#include <cstdio>
#include <fstream>
#include <string>
#include <sys/stat.h>

#include "checks.h"

int main(int argc, char** argv) {
  std::string hidden;
  if (argc == 3 && std::string(argv[1]) == "--hidden") hidden = argv[2];
  else if (argc != 1) {
    std::fprintf(stderr, "usage: snapshots [--hidden DIR]\n");
    return 2;
  }
  const std::string dir = hidden.empty() ? "course/snapshots" : hidden + "/snapshots";
  mkdir(dir.c_str(), 0755);
  try {
    for (const course::Task& t : course::tasks()) {
      if (!t.outputs) continue;
      std::ofstream out;
      int written = 0;
      for (const auto& [text, is_hidden] : course::task_cases(t, hidden)) {
        if (is_hidden != !hidden.empty()) continue;
        if (!out.is_open()) out.open(dir + "/" + t.id + ".txt");
        course::write_snapshot(out, text, t.outputs(course::Case(text)));
        ++written;
      }
      if (written) std::printf("%s/%s.txt: %d cases\n", dir.c_str(), t.id.c_str(), written);
      if (out.is_open() && !out.good()) throw std::runtime_error(dir + "/" + t.id + ".txt: cannot write");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "snapshots: %s\n", e.what());
    return 1;
  }
  return 0;
}
