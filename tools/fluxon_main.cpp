// The `fluxon` command line: daemons, local clusters, demo and bench.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cluster.hpp"
#include "fluxon/actors/runtime.hpp"
#include "fluxon/runtime/auth.hpp"
#include "example_configs.hpp"
#include "fluxon/runtime/log.hpp"

using namespace fluxon;

static int usage() {
  std::fprintf(stderr,
               "usage:\n"
               "  fluxon --version\n"
               "  fluxon master --config FILE [--index N] [--log-format text|json]  (N: its entry in masters:, HA)\n"
               "  fluxon owner  --config FILE [--node-id N] [--log-format text|json]\n"
               "  fluxon cluster up|down|status|cleanup FILE\n"
               "                                         (cleanup: removes the segments of the cluster's dead owners)\n"
               "  fluxon cluster prometheus-config FILE [--interval 5s]\n"
               "                                         (a Prometheus scrape config for the cluster's metrics ports)\n"
               "  fluxon config check FILE              (the resolved config, or the first error and its field)\n"
               "  fluxon config example [NAME]          (the example configs: their names, or one to start from)\n"
               "  fluxon keygen PATH                    (a new cluster key, mode 0600: name it in auth: {key_file: PATH})\n"
               "  fluxon auth check HOST:PORT [--key FILE] [--json]\n"
               "                                         (what a daemon's control port admits without the key, and with it)\n"
               "  fluxon demo   [--config FILE] [--stats] (embedded store when no FILE; --stats: every figure)\n"
               "  fluxon bench  FILE [--iters N] [--json] [--channel auto|shm|caf] [--batch B]... [--get-rounds R]\n"
               "                                         (starts the cluster of FILE if needed)\n"
               "  fluxon workload [ARGS]                 (python3 -m fluxon.workload: the multi-turn agent workload)\n"
               "  fluxon replay TRACE.jsonl [ARGS]       (python3 -m fluxon.replay: a public trace through the workload)\n"
               "  fluxon overload [ARGS]                 (python3 -m fluxon.overload: 10x the clients against one owner)\n"
               "  fluxon top FILE|HOST:PORT... [--once] (the cluster at a glance from the master's /api/status)\n");
  return 2;
}

static std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : "fluxon";
}

static Result<ClusterConfig> load(const std::string& path) {
  auto c = path.empty() ? parse_config_text("") : load_config_file(path);
  if (!c.ok()) std::fprintf(stderr, "fluxon: %s\n", c.status().to_string().c_str());
  return c;
}

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "version") {
    std::printf("fluxon %s\n", FLUXON_VERSION);
    return 0;
  }
  std::string config;
  uint32_t node_id = 0;
  int index = 0;
  bool all_stats = false;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--stats")) all_stats = true;
    if (!std::strcmp(argv[i], "--log-format") && i + 1 < argc) {
      // The daemons' log lines: text (default) or json; FLUXON_LOG_FORMAT says the same for
      // daemons started by `fluxon cluster up` (they inherit it).
      auto f = logging::parse_format(argv[i + 1]);
      if (!f.ok()) {
        std::fprintf(stderr, "fluxon: --log-format: %s\n", f.status().message().c_str());
        return 2;
      }
      logging::set_format(*f);
      setenv("FLUXON_LOG_FORMAT", argv[i + 1], 1);
    }
    if (!std::strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
    else if (!std::strcmp(argv[i], "--node-id") && i + 1 < argc) node_id = uint32_t(std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--index") && i + 1 < argc) index = std::atoi(argv[++i]);
  }
  if (cmd == "master" || cmd == "owner") {
    if (config.empty()) return usage();
    auto c = load(config);
    if (!c.ok()) return 2;
    return cmd == "master" ? run_master_daemon(*c, index) : run_owner_daemon(*c, node_id);
  }
  if (cmd == "keygen") {
    if (argc != 3) return usage();
    Status s = write_key_file(argv[2]);
    if (!s.is_ok()) {
      std::fprintf(stderr, "fluxon keygen: %s\n", s.message().c_str());
      return 1;
    }
    auto k = load_key_file(argv[2]);
    std::printf("fluxon keygen: wrote a cluster key to %s (mode 0600, key %s): give every host of the cluster a copy "
                "and name it in auth: {key_file: %s}\n",
                argv[2], k.ok() ? (*k)->fingerprint().c_str() : "?", argv[2]);
    return 0;
  }
  if (cmd == "auth") {
    if (argc < 4 || std::string(argv[2]) != "check") return usage();
    std::string key;
    bool json = false;
    for (int i = 4; i < argc; ++i) {
      if (!std::strcmp(argv[i], "--key") && i + 1 < argc) key = argv[++i];
      else if (!std::strcmp(argv[i], "--json")) json = true;
      else return usage();
    }
    return run_auth_check(argv[3], key, json);
  }
  if (cmd == "cluster") {
    if (argc < 4) return usage();
    const std::string sub = argv[2];
    auto c = load(argv[3]);
    if (!c.ok()) return 2;
    if (sub == "up") return tools::cluster_up(argv[3], *c, self_exe());
    if (sub == "down") return tools::cluster_down(*c);
    if (sub == "status") return tools::cluster_status(*c);
    if (sub == "cleanup") return tools::cluster_cleanup(*c);
    if (sub == "prometheus-config") {
      std::string interval = "5s";
      for (int i = 4; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--interval") && i + 1 < argc) {
          interval = argv[++i];
          const bool ok = interval.size() > 1 && (interval.back() == 's' || interval.back() == 'm') &&
                          interval.find_first_not_of("0123456789", 0) == interval.size() - 1;
          if (!ok) {
            std::fprintf(stderr, "fluxon cluster prometheus-config: --interval: '%s' is not a duration like 5s or 1m\n",
                         interval.c_str());
            return 2;
          }
        } else {
          return usage();
        }
      }
      return tools::cluster_prometheus_config(*c, argv[3], interval);
    }
    return usage();
  }
  if (cmd == "config" && argc >= 3 && std::string(argv[2]) == "example") {
    // `fluxon config example`: the example configs' names; `fluxon config example NAME`: one of them.
    const auto& all = tools::example_configs();
    if (argc == 3) {
      for (const auto& [name, text] : all) {
        std::string first = text.substr(0, text.find('\n'));
        if (first.rfind("# ", 0) == 0) first = first.substr(2);
        else first.clear();
        std::printf("%-20s %s\n", name.c_str(), first.c_str());
      }
      return 0;
    }
    std::string want = argv[3];
    if (want.size() > 5 && want.compare(want.size() - 5, 5, ".yaml") == 0) want.resize(want.size() - 5);
    for (const auto& [name, text] : all)
      if (name == want) {
        std::fputs(text.c_str(), stdout);
        return 0;
      }
    std::string names;
    for (const auto& [name, text] : all) names += (names.empty() ? "" : ", ") + name;
    std::fprintf(stderr, "fluxon config example: no example named '%s' (there are: %s)\n", argv[3], names.c_str());
    return 2;
  }
  if (cmd == "config") {
    // `fluxon config check FILE`: the resolved configuration, or the first error with its field.
    if (argc < 4 || std::string(argv[2]) != "check") return usage();
    auto c = load(argv[3]);
    if (!c.ok()) return 2;
    std::fputs(describe(*c).c_str(), stdout);
    return 0;
  }
  if (cmd == "demo") {
    auto c = load(config);
    if (!c.ok()) return 2;
    return tools::run_demo(*c, all_stats);
  }
  std::vector<std::string> top_args;
  if (cmd == "top") {
    // FILE: the master's (HA: every master's) metrics address from the config; anything else goes
    // to python3 -m fluxon.top as it is (HOST:PORT ..., --once, --interval S).
    if (argc < 3) return usage();
    for (int i = 2; i < argc; ++i) {
      const std::string a = argv[i];
      if (i == 2 && a.find(':') == std::string::npos && a.rfind("--", 0) != 0) {
        auto c = load(a);
        if (!c.ok()) return 2;
        for (const MasterConfig& m : c->ha() ? c->masters : std::vector<MasterConfig>{c->master}) {
          if (m.metrics_port == 0) {
            std::fprintf(stderr, "fluxon top: %s: master.metrics_port is 0: the master serves no status page "
                                 "(set metrics_port)\n", a.c_str());
            return 2;
          }
          top_args.push_back(connect_host(m.listen_host) + ":" + std::to_string(m.metrics_port));
        }
      } else {
        top_args.push_back(a);
      }
    }
  }
  if (cmd == "workload" || cmd == "overload" || cmd == "replay" || cmd == "top") {
    // The workload and the overload are Python (they drive the client API as SGLang does): run
    // them with this build's package.
    const std::string exe = self_exe();
    const std::string build = exe.substr(0, exe.rfind('/')) + "/..";
    const char* old = std::getenv("PYTHONPATH");
    const std::string pp = build + "/python" + (old ? std::string(":") + old : "");
    setenv("PYTHONPATH", pp.c_str(), 1);
    setenv("FLUXON_BIN", exe.c_str(), 0);
    std::vector<char*> args{const_cast<char*>("/usr/bin/python3"), const_cast<char*>("-m"),
                            const_cast<char*>(cmd == "workload" ? "fluxon.workload"
                                              : cmd == "replay"  ? "fluxon.replay"
                                              : cmd == "top"     ? "fluxon.top"
                                                                 : "fluxon.overload")};
    if (cmd == "top")
      for (auto& a : top_args) args.push_back(a.data());
    else
      for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
    args.push_back(nullptr);
    execv("/usr/bin/python3", args.data());
    std::perror(("fluxon " + cmd + ": /usr/bin/python3").c_str());
    return 127;
  }
  if (cmd == "bench") {
    if (argc < 3) return usage();
    auto c = load(argv[2]);
    if (!c.ok()) return 2;
    bool json = false;
    for (int i = 3; i < argc; ++i) json |= std::string(argv[i]) == "--json";
    // With --json stdout holds the JSON object only: the cluster's lines go to stderr.
    auto quiet = [&](auto fn) {
      if (!json) return fn();
      std::fflush(stdout);
      const int saved = dup(1);
      dup2(2, 1);
      auto r = fn();
      std::fflush(stdout);
      dup2(saved, 1);
      close(saved);
      return r;
    };
    const bool running = tools::port_open(c->owners.at(0).listen_host, c->owners.at(0).port);
    // A cluster the bench starts is its own: its run_dir (logs, pid files) goes with it unless the
    // bench failed (then the logs stay, and it says where).
    const std::string dir = tools::run_dir_of(*c);
    const bool fresh_dir = !running && !std::filesystem::exists(dir);
    if (!running && quiet([&] { return tools::cluster_up(argv[2], *c, self_exe()); }) != 0) return 1;
    int rc = tools::run_bench(*c, argc - 3, argv + 3);
    if (!running) quiet([&] { return tools::cluster_down(*c), 0; });
    if (fresh_dir && rc == 0) std::filesystem::remove_all(dir);
    else if (fresh_dir) std::fprintf(stderr, "fluxon bench: the daemons' logs are in %s\n", dir.c_str());
    return rc;
  }
  return usage();
}
