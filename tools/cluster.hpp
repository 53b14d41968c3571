#pragma once
#include <string>

#include "fluxon/runtime/config.hpp"

namespace fluxon::tools {

// `fluxon cluster up|down|status|cleanup CONFIG`: the master and every owner of CONFIG as background
// processes of this binary, with pid files and logs in the run directory.
int cluster_up(const std::string& config_path, const ClusterConfig& cfg, const std::string& self_exe);
int cluster_down(const ClusterConfig& cfg);
int cluster_status(const ClusterConfig& cfg);
// `fluxon cluster prometheus-config FILE [--interval D]`: a scrape config for Prometheus on stdout.
int cluster_prometheus_config(const ClusterConfig& cfg, const std::string& path, const std::string& interval);
// `fluxon cluster cleanup CONFIG`: removes the shared-memory segments of the cluster's dead owners
// (never a live owner's, never another cluster's) and says what it removed and kept. `quiet`: print
// only when something was removed (the tail of `cluster down`).
int cluster_cleanup(const ClusterConfig& cfg, bool quiet = false);
std::string run_dir_of(const ClusterConfig& cfg);
bool port_open(const std::string& host, uint16_t port);

int run_demo(const ClusterConfig& cfg, bool all_stats = false);  // all_stats: every figure, not the summary
int run_bench(const ClusterConfig& cfg, int argc, char** argv);

}  // namespace fluxon::tools
