// RDMA detection (libibverbs). The data plane runs over TCP; this tells the operator what RDMA
// hardware the machine has, and `data_transport: rdma` fails at start, in words, without it.
#include "fluxon/runtime/transport.hpp"

#ifdef FLUXON_HAVE_IBVERBS
#include <infiniband/verbs.h>
#endif

namespace fluxon {

RdmaProbe rdma_probe() {
  RdmaProbe p;
#ifdef FLUXON_HAVE_IBVERBS
  p.compiled = true;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    p.detail = "ibv_get_device_list failed (no RDMA driver loaded)";
    return p;
  }
  for (int i = 0; i < n; ++i) {
    const char* name = ibv_get_device_name(list[i]);
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) continue;
    ibv_device_attr attr{};
    if (ibv_query_device(ctx, &attr) == 0) p.devices.push_back(name ? name : "?");
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  p.available = !p.devices.empty();
  if (n == 0) p.detail = "no RDMA device found (ibv_get_device_list returned 0 devices)";
  else if (!p.available) p.detail = std::to_string(n) + " RDMA device(s) listed, none could be opened";
  else {
    p.detail = "RDMA devices:";
    for (const auto& d : p.devices) p.detail += " " + d;
  }
#else
  p.detail = "built without libibverbs";
#endif
  return p;
}

}  // namespace fluxon
