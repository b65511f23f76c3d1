#pragma once
// Runs a program with arguments (no shell), capturing its exit status, stdout and stderr through
// files in a per-process temporary directory, and its wall time and peak resident memory.

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include "support/doctest.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace tools_test {

//! What a finished process left behind.
struct process_result {
  int status = -1;       //!< exit status, or -1 when it did not exit normally
  int signal = 0;        //!< the signal that ended it, or 0
  std::string out;       //!< everything written to stdout
  std::string err;       //!< everything written to stderr
  long max_rss_kib = 0;  //!< the largest resident memory it (or a child it waited for) reached
  double seconds = 0.0;  //!< wall time from start to exit
};

//! A directory for this test process's files, created on first use, removed at exit.
inline std::filesystem::path const& scratch_dir() {
  struct dir {
    std::filesystem::path path;
    dir() {
      path = std::filesystem::temp_directory_path() /
             ("specdec_tools_test_" + std::to_string(::getpid()));
      std::filesystem::create_directories(path);
    }
    ~dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static dir const d;
  return d.path;
}

//! The whole content of `path`.
inline std::string read_file(std::filesystem::path const& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

//! Writes `content` to `path`.
inline void write_file(std::filesystem::path const& path, std::string const& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
}

//! A process started by `start_process`, not yet waited for.
struct started_process {
  pid_t pid = 0;
  std::string out_path;  //!< where its stdout goes
  std::string err_path;  //!< where its stderr goes
  std::chrono::steady_clock::time_point start;
};

//! Starts `program` with `args` (stdout and stderr to files); `env` entries ("NAME=value") are
//! added to the environment. `finish_process` waits for it.
inline started_process start_process(std::string const& program,
                                     std::vector<std::string> const& args,
                                     std::vector<std::string> const& env = {}) {
  static int counter = 0;
  std::string const stem = (scratch_dir() / ("run" + std::to_string(counter++))).string();
  started_process p;
  p.out_path = stem + ".out";
  p.err_path = stem + ".err";

  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(program.c_str()));
  for (auto const& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, p.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, p.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (auto const& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  p.start = std::chrono::steady_clock::now();
  int const rc = posix_spawn(&p.pid, program.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE_MESSAGE(rc == 0, "cannot start " << program);
  return p;
}

//! Whether `p` is still running (it is not waited for).
inline bool still_running(started_process const& p) {
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, static_cast<id_t>(p.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0);
  return info.si_pid == 0;
}

//! Waits for `p` and collects what it left behind.
inline process_result finish_process(started_process const& p) {
  int wstatus = 0;
  struct rusage usage {};
  REQUIRE(::wait4(p.pid, &wstatus, 0, &usage) == p.pid);
  process_result r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - p.start).count();
  r.max_rss_kib = usage.ru_maxrss;
  r.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  r.signal = WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0;
  r.out = read_file(p.out_path);
  r.err = read_file(p.err_path);
  std::filesystem::remove(p.out_path);
  std::filesystem::remove(p.err_path);
  return r;
}

//! Runs `program` with `args` and waits for it; `env` entries ("NAME=value") are added to the
//! environment.
inline process_result run_process(std::string const& program, std::vector<std::string> const& args,
                                  std::vector<std::string> const& env = {}) {
  return finish_process(start_process(program, args, env));
}

// Checks a failed run `r` of the program `program` ("specdec-datastore"): exit status `status`,
// nothing on stdout, one line on stderr that starts with the program's name and contains `needle`.
inline void check_failure(process_result const& r, std::string const& program, int status,
                          std::string const& needle) {
  INFO("stderr: " << r.err);
  CHECK(r.status == status);
  CHECK(r.out.empty());
  REQUIRE(!r.err.empty());
  CHECK(r.err.rfind(program + ": ", 0) == 0);
  CHECK(r.err.find('\n') == r.err.size() - 1);  // exactly one line
  CHECK(r.err.find(needle) != std::string::npos);
}

}  // namespace tools_test
