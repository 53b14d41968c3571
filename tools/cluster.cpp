#include "cluster.hpp"
#include "fluxon/runtime/segment.hpp"

#include "fluxon/runtime/campaign.hpp"
#include "fluxon/runtime/etcd.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <fstream>
#include <thread>
#include <vector>

namespace fluxon::tools {

namespace {

struct Proc {
  std::string name;  // etcd, master (master-0, ... in the HA mode), owner-1, ...
  std::vector<std::string> args;
  std::string host;
  uint16_t port;
  std::string exe;  // empty: fluxon itself
};

// A loopback port no one listens on now (the kernel's choice).
uint16_t free_loopback_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

// The etcd `cluster up` starts for an HA config whose first endpoint is on this host and not
// served yet: one member, its data in run_dir, a 50 ms raft heartbeat (leases of 1 s are granted).
// Its peer port serves only itself: any free one (a fixed client+1 may be taken).
std::optional<Proc> etcd_proc(const ClusterConfig& cfg, const std::string& dir) {
  if (!cfg.ha()) return std::nullopt;
  auto hp = parse_http_endpoint(cfg.etcd.endpoints[0]);
  if (!hp.ok() || (hp->first != "127.0.0.1" && hp->first != "localhost")) return std::nullopt;
  const std::string url = cfg.etcd.endpoints[0];
  const std::string peer = "http://127.0.0.1:" + std::to_string(free_loopback_port());
  return Proc{"etcd",
              {"--name", "fluxon", "--data-dir", dir + "/etcd-data", "--listen-client-urls", url,
               "--advertise-client-urls", url, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", "fluxon=" + peer, "--heartbeat-interval", "50", "--election-timeout", "500"},
              "127.0.0.1",
              hp->second,
              "etcd"};
}

std::vector<Proc> procs_of(const std::string& config_path, const ClusterConfig& cfg) {
  std::vector<Proc> v;
  if (auto e = etcd_proc(cfg, run_dir_of(cfg))) v.push_back(*e);
  for (size_t i = 0; i < cfg.masters.size(); ++i)
    v.push_back({"master-" + std::to_string(i), {"master", "--config", config_path, "--index", std::to_string(i)},
                 cfg.masters[i].listen_host, cfg.masters[i].port, ""});
  if (!cfg.ha()) v.push_back({"master", {"master", "--config", config_path}, cfg.master.listen_host, cfg.master.port, ""});
  for (const auto& o : cfg.owners)
    v.push_back({"owner-" + std::to_string(o.node_id),
                 {"owner", "--config", config_path, "--node-id", std::to_string(o.node_id)},
                 o.listen_host,
                 o.port,
                 ""});
  return v;
}

int read_pid(const std::string& file) {
  std::ifstream f(file);
  int pid = 0;
  f >> pid;
  return pid;
}

// Running, and not a zombie waiting for a parent that does not reap it.
bool alive(int pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  auto close_paren = line.rfind(')');
  return close_paren == std::string::npos || close_paren + 2 >= line.size() || line[close_paren + 2] != 'Z';
}

}  // namespace

std::string run_dir_of(const ClusterConfig& cfg) {
  return cfg.run_dir.empty() ? "/tmp/fluxon-" + cfg.cluster_name : cfg.run_dir;
}

bool port_open(const std::string& host, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, connect_host(host).c_str(), &a.sin_addr);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

int cluster_up(const std::string& config_path, const ClusterConfig& cfg, const std::string& self_exe) {
  const std::string dir = run_dir_of(cfg);
  mkdir(dir.c_str(), 0700);
  char abs[4096];
  std::string cfg_abs = realpath(config_path.c_str(), abs) ? abs : config_path;
  for (auto& p : procs_of(cfg_abs, cfg)) {
    const std::string pidf = dir + "/" + p.name + ".pid";
    if (alive(read_pid(pidf))) {
      std::printf("%-10s already running (pid %d)\n", p.name.c_str(), read_pid(pidf));
      continue;
    }
    if (p.name == "etcd" && port_open(p.host, p.port)) {
      std::printf("%-10s already served at %s:%u (not started here)\n", p.name.c_str(), p.host.c_str(), p.port);
      continue;
    }
    if (port_open(p.host, p.port)) {
      std::fprintf(stderr, "%s: port %s:%u is taken by another process\n", p.name.c_str(), p.host.c_str(), p.port);
      return 1;
    }
    const std::string log = dir + "/" + p.name + ".log";
    pid_t pid = fork();
    if (pid == 0) {
      setsid();
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      dup2(fd, 1);
      dup2(fd, 2);
      int nul = open("/dev/null", O_RDONLY);
      dup2(nul, 0);
      const std::string exe = p.exe.empty() ? self_exe : p.exe;
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(exe.c_str()));
      for (auto& a : p.args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      if (p.exe.empty()) execv(exe.c_str(), argv.data());
      else execvp(exe.c_str(), argv.data());  // etcd: from PATH (Debian's etcd-server)
      std::fprintf(stderr, "cannot start %s: %s\n", exe.c_str(), std::strerror(errno));
      _exit(127);
    }
    std::ofstream(pidf) << pid << "\n";
    // Wait until it listens (the owner also needs the master, started just before).
    bool up = false;
    for (int i = 0; i < 300 && !up; ++i) {
      if (!alive(pid)) break;
      up = port_open(p.host, p.port);
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (!up && i == 20) {  // a second already: say what it waits for
        std::printf("%-10s starting (pid %d): waiting for %s:%u to listen, up to 15 s (log %s)\n", p.name.c_str(), pid,
                    p.host.c_str(), p.port, log.c_str());
        std::fflush(stdout);
      }
    }
    if (!up) {
      std::fprintf(stderr, "%s did not come up; see %s\n", p.name.c_str(), log.c_str());
      return 1;
    }
    std::printf("%-10s up  pid %-7d %s:%u  log %s\n", p.name.c_str(), pid, p.host.c_str(), p.port, log.c_str());
  }
  return 0;
}

int cluster_down(const ClusterConfig& cfg) {
  const std::string dir = run_dir_of(cfg);
  auto procs = procs_of("", cfg);
  // Owners first: they remove their segments; then the master.
  for (auto it = procs.rbegin(); it != procs.rend(); ++it) {
    const std::string pidf = dir + "/" + it->name + ".pid";
    int pid = read_pid(pidf);
    if (!alive(pid)) {
      unlink(pidf.c_str());
      continue;
    }
    kill(pid, SIGTERM);
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
      waitpid(pid, nullptr, WNOHANG);
      gone = !alive(pid);
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!gone) {
      kill(pid, SIGKILL);
      std::printf("%-10s killed (pid %d did not stop in 5 s)\n", it->name.c_str(), pid);
    } else {
      std::printf("%-10s down\n", it->name.c_str());
    }
    unlink(pidf.c_str());
    if (it->name == "etcd") std::filesystem::remove_all(dir + "/etcd-data");  // only election state: gone with it
  }
  // An owner killed earlier (and its guardian with it) left its segment: gone with the cluster.
  cluster_cleanup(cfg, true);
  return 0;
}

int cluster_cleanup(const ClusterConfig& cfg, bool quiet) {
  const SegmentSweep s = sweep_dead_segments(cfg.cluster_name, true);
  uint64_t freed = 0;
  for (const SegmentFile& f : s.dead) {
    std::printf("removed    /dev/shm%s (%.1f MiB; its owner is gone)\n", f.name.c_str(), double(f.bytes) / (1 << 20));
    freed += f.bytes;
  }
  for (const SegmentFile& f : s.live)
    std::printf("kept       /dev/shm%s (%.1f MiB; its owner is alive)\n", f.name.c_str(), double(f.bytes) / (1 << 20));
  if (!quiet || !s.dead.empty())
    std::printf("cleanup    cluster '%s': %zu dead segment(s) removed (%.1f MiB), %zu live kept\n", cfg.cluster_name.c_str(),
                s.dead.size(), double(freed) / (1 << 20), s.live.size());
  return 0;
}

int cluster_status(const ClusterConfig& cfg) {
  const std::string dir = run_dir_of(cfg);
  int down = 0;
  for (auto& p : procs_of("", cfg)) {
    int pid = read_pid(dir + "/" + p.name + ".pid");
    const bool a = alive(pid), l = port_open(p.host, p.port);
    std::printf("%-10s %-8s pid %-7d %s:%u %s\n", p.name.c_str(), a ? "running" : "stopped", a ? pid : 0,
                p.host.c_str(), p.port, l ? "listening" : "not listening");
    if (!a || !l) down++;
  }
  if (cfg.ha()) {  // who leads, as etcd says
    EtcdClient etcd(cfg.etcd.endpoints, 1000);
    auto k = etcd.get(leader_key(cfg.cluster_name));
    if (!k.ok()) {
      std::printf("leader     unknown: %s\n", k.status().to_string().c_str());
      down++;
    } else if (!*k) {
      std::printf("leader     none (no master holds the leadership key)\n");
      down++;
    } else {
      std::string which;
      for (size_t i = 0; i < cfg.masters.size(); ++i)
        if ((*k)->value == cfg.masters[i].address())
          which = "master-" + std::to_string(i) + " ";
      std::printf("leader     %s%s term %lld\n", which.c_str(), (*k)->value.c_str(), (long long)(*k)->create_revision);
    }
  }
  return down == 0 ? 0 : 3;
}

// A Prometheus scrape config for the cluster's metrics ports: a job for the masters, one for the
// owners, each target labelled with the cluster (and the owner's node). Daemons without a metrics
// port are left out, said in a comment; none at all is an error.
int cluster_prometheus_config(const ClusterConfig& cfg, const std::string& path, const std::string& interval) {
  std::vector<std::string> masters, missing;
  size_t owners = 0;
  for (size_t i = 0; i < (cfg.ha() ? cfg.masters.size() : 1); ++i) {
    const MasterConfig& m = cfg.ha() ? cfg.masters[i] : cfg.master;
    const std::string name = cfg.ha() ? "masters[" + std::to_string(i) + "]" : "master";
    if (m.metrics_port) masters.push_back(connect_host(m.listen_host) + ":" + std::to_string(m.metrics_port));
    else missing.push_back(name);
  }
  std::string owner_targets;
  for (size_t i = 0; i < cfg.owners.size(); ++i) {
    const OwnerConfig& o = cfg.owners[i];
    if (!o.metrics_port) {
      missing.push_back("owners[" + std::to_string(i) + "]");
      continue;
    }
    owner_targets += "      - targets: ['" + connect_host(o.listen_host) + ":" + std::to_string(o.metrics_port) +
                     "']\n        labels: {cluster: '" + cfg.cluster_name + "', node: '" + std::to_string(o.node_id) +
                     "'}\n";
    owners++;
  }
  if (masters.empty() && owners == 0) {
    std::fprintf(stderr, "fluxon cluster prometheus-config: %s: no daemon has a metrics_port (set master.metrics_port "
                         "and owners[].metrics_port)\n", path.c_str());
    return 2;
  }
  std::printf("# Prometheus scrape config for Fluxon cluster '%s' (fluxon cluster prometheus-config %s).\n",
              cfg.cluster_name.c_str(), path.c_str());
  if (!missing.empty()) {
    std::string m;
    for (auto& x : missing) m += (m.empty() ? "" : ", ") + x;
    std::printf("# Not scraped (metrics_port 0): %s.\n", m.c_str());
  }
  std::printf("global:\n  scrape_interval: %s\n  evaluation_interval: %s\nscrape_configs:\n", interval.c_str(),
              interval.c_str());
  if (!masters.empty()) {
    std::printf("  - job_name: fluxon_master\n    static_configs:\n      - targets: [");
    for (size_t i = 0; i < masters.size(); ++i) std::printf("%s'%s'", i ? ", " : "", masters[i].c_str());
    std::printf("]\n        labels: {cluster: '%s'}\n", cfg.cluster_name.c_str());
  }
  if (owners) std::printf("  - job_name: fluxon_owner\n    static_configs:\n%s", owner_targets.c_str());
  return 0;
}

}  // namespace fluxon::tools
