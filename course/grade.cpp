// The course grader's runner (README, "Course assignments"); course/grade.py drives it, one process per
// task, so that a stub that throws, aborts or hangs costs that task's points only.
//
//   grade --list [--hidden DIR]          every task and its checks: "task ID DEPENDS" and "check ID N NAME HIDDEN"
//   grade --task ID [--hidden DIR]       runs the task's checks: "result N PASSED WORST TOL MESSAGE", one a check
//
// Fields are tab-separated. Exit status 2 when the grader itself cannot run (unknown task, bad hidden folder).
#include <cstdio>
#include <cstring>
#include <string>

#include "checks.h"

static std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return s.size() > 400 ? s.substr(0, 400) + "..." : s;
}

int main(int argc, char** argv) {
  std::string task, hidden, snapshots = "course/snapshots";
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--list") list = true;
    else if (a == "--task" && i + 1 < argc) task = argv[++i];
    else if (a == "--hidden" && i + 1 < argc) hidden = argv[++i];
    else if (a == "--snapshots" && i + 1 < argc) snapshots = argv[++i];
    else {
      std::fprintf(stderr, "usage: grade --list | --task ID [--hidden DIR] [--snapshots DIR]\n");
      return 2;
    }
  }
  try {
    if (list) {
      for (const course::Task& t : course::tasks()) {
        std::string deps;
        for (const auto& d : t.depends) deps += (deps.empty() ? "" : ",") + d;
        std::printf("task\t%s\t%s\n", t.id.c_str(), deps.c_str());
        const auto checks = course::task_checks(t, snapshots, hidden);
        for (size_t n = 0; n < checks.size(); ++n)
          std::printf("check\t%s\t%zu\t%s\t%d\n", t.id.c_str(), n, one_line(checks[n].name).c_str(), (int)checks[n].hidden);
      }
      return 0;
    }
    const course::Task* t = course::find_task(task);
    if (!t) {
      std::fprintf(stderr, "grade: unknown task '%s' (grade --list names them)\n", task.c_str());
      return 2;
    }
    const auto checks = course::task_checks(*t, snapshots, hidden);
    for (size_t n = 0; n < checks.size(); ++n) {
      Checker ck(t->id);
      std::string message;
      try {
        checks[n].run(ck);
      } catch (const std::exception& e) {
        message = e.what();
      }
      const bool passed = message.empty() && ck.checks > 0 && ck.failures == 0;
      if (message.empty()) message = ck.failures ? ck.first_failure : ck.checks ? "" : "no checks ran";
      std::printf("result\t%zu\t%d\t%.3g\t%.3g\t%s\n", n, (int)passed, ck.worst_rel, ck.worst_tol, one_line(message).c_str());
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grade: %s\n", one_line(e.what()).c_str());
    return 2;
  }
}
