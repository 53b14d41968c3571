// fluxon_sim_soak: the whole-cluster chaos run (tests/sim/chaos.hpp) over any number of seeds.
//
//   fluxon_sim_soak --seeds N [--from S] [--jobs J] [--variant mixed|plain|tiers|failovers] [--verbose]
//
// Each seed runs in a child process of its own (a crash or a failed REQUIRE ends that seed only),
// J at a time; its output is kept and printed only when it fails, with the command that replays it.
// `mixed` (the default) takes the variant from the seed: plain, the master's tiers, or master
// failovers, in turn. Exit status 0 when every seed passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "chaos.hpp"

namespace {

uint64_t g_seed = 0;
std::string g_variant;

const char* variant_of(uint64_t seed, const std::string& v) {
  if (v != "mixed") return v.c_str();
  static const char* const kinds[] = {"plain", "tiers", "failovers"};
  return kinds[seed % 3];
}

}  // namespace

TEST_CASE("soak: one seed") {
  fluxon::test::chaos_run(g_seed, g_variant == "tiers", g_variant == "failovers");
}

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: fluxon_sim_soak --seeds N [--from S] [--jobs J] [--variant mixed|plain|tiers|failovers] "
               "[--verbose]\n");
  return 2;
}

// A seed's child: runs the one test case with its output in `out_fd`; exit status 0 when it passed.
[[noreturn]] void run_child(uint64_t seed, const std::string& variant, int out_fd) {
  dup2(out_fd, 1);
  dup2(out_fd, 2);
  close(out_fd);
  g_seed = seed;
  g_variant = variant;
  doctest::Context ctx;
  ctx.setOption("test-case", "soak: one seed");
  ctx.setOption("no-version", true);
  ctx.setOption("no-intro", true);
  const int rc = ctx.run();
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(rc == 0 ? 0 : 1);
}

struct Running {
  uint64_t seed;
  std::string variant;
  int out_fd;
  std::chrono::steady_clock::time_point started;
};

std::string read_all(int fd) {
  std::string s;
  lseek(fd, 0, SEEK_SET);
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) s.append(buf, size_t(n));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seeds = 0, from = 1;
  int jobs = int(sysconf(_SC_NPROCESSORS_ONLN));
  std::string variant = "mixed";
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--seeds" && (v = next())) seeds = std::strtoull(v, nullptr, 10);
    else if (a == "--from" && (v = next())) from = std::strtoull(v, nullptr, 10);
    else if (a == "--jobs" && (v = next())) jobs = std::max(1, std::atoi(v));
    else if (a == "--variant" && (v = next())) variant = v;
    else if (a == "--verbose") verbose = true;
    else return usage();
  }
  if (seeds == 0 || (variant != "mixed" && variant != "plain" && variant != "tiers" && variant != "failovers"))
    return usage();
  const auto t0 = std::chrono::steady_clock::now();
  std::map<pid_t, Running> running;
  std::vector<std::pair<uint64_t, std::string>> failed;
  std::map<std::string, uint64_t> per_variant;
  uint64_t next = from, done = 0;
  while (done < seeds) {
    while (next < from + seeds && running.size() < size_t(jobs)) {
      const uint64_t seed = next++;
      const std::string var = variant_of(seed, variant);
      const int fd = int(::syscall(SYS_memfd_create, "fluxon-soak", 1u /*MFD_CLOEXEC*/));
      if (fd < 0) {
        std::perror("memfd_create");
        return 1;
      }
      std::fflush(stdout);
      const pid_t pid = fork();
      if (pid < 0) {
        std::perror("fork");
        return 1;
      }
      if (pid == 0) run_child(seed, var, fd);
      running[pid] = {seed, var, fd, std::chrono::steady_clock::now()};
    }
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      std::perror("waitpid");
      return 1;
    }
    auto it = running.find(pid);
    if (it == running.end()) continue;
    Running r = it->second;
    running.erase(it);
    done++;
    per_variant[r.variant]++;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.started).count();
    const std::string replay =
        "tools/soak --seeds 1 --from " + std::to_string(r.seed) + " --variant " + r.variant + " --verbose";
    if (!ok) {
      std::string why = WIFSIGNALED(status) ? std::string("killed by signal ") + std::to_string(WTERMSIG(status))
                                            : "exit status " + std::to_string(WEXITSTATUS(status));
      std::printf("FAILED seed %llu (%s, %s, %.1f s); replay: %s\n%s\n", (unsigned long long)r.seed,
                  r.variant.c_str(), why.c_str(), secs, replay.c_str(), read_all(r.out_fd).c_str());
      failed.emplace_back(r.seed, r.variant);
    } else if (verbose) {
      std::printf("%s", read_all(r.out_fd).c_str());
      std::printf("seed %llu (%s) passed in %.1f s\n", (unsigned long long)r.seed, r.variant.c_str(), secs);
    }
    close(r.out_fd);
    std::fflush(stdout);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string mix;
  for (const auto& [v, n] : per_variant) mix += (mix.empty() ? "" : ", ") + std::to_string(n) + " " + v;
  std::printf("soak: %llu seeds from %llu (%s) in %.1f s with %d jobs: %llu passed, %zu failed\n",
              (unsigned long long)seeds, (unsigned long long)from, mix.c_str(), secs, jobs,
              (unsigned long long)(seeds - failed.size()), failed.size());
  for (const auto& [s, v] : failed)
    std::printf("  failed: seed %llu (%s): tools/soak --seeds 1 --from %llu --variant %s --verbose\n",
                (unsigned long long)s, v.c_str(), (unsigned long long)s, v.c_str());
  return failed.empty() ? 0 : 1;
}
