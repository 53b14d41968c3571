#include "fluxon/runtime/etcd.hpp"

#include "fluxon/runtime/clock.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <utility>

namespace fluxon {

namespace {

// A JSON value, as much of JSON as etcd's gateway answers with. Numbers keep their text: the
// gateway writes int64 fields as strings anyway, and both forms are read by as_int().
struct Json {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject } type = Type::kNull;
  bool b = false;
  std::string text;  // number or string
  std::vector<Json> items;
  std::map<std::string, Json> fields;

  const Json* get(const std::string& k) const {
    auto it = fields.find(k);
    return it == fields.end() ? nullptr : &it->second;
  }
  int64_t as_int() const {
    if (type != Type::kNumber && type != Type::kString) return 0;
    try {
      return std::stoll(text);
    } catch (...) {
      return 0;
    }
  }
};

// The hex number that is all of `s` (a \u escape, a chunk size): false when s is empty, too long or
// not hex. Never throws: these bytes come from the network.
bool parse_hex(const std::string& s, size_t& out) {
  if (s.empty() || s.size() > 8) return false;
  out = 0;
  for (char c : s) {
    const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                  : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
                  : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                              : -1;
    if (d < 0) return false;
    out = out * 16 + size_t(d);
  }
  return true;
}

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}
  Result<Json> parse() {
    Json v;
    if (!value(v, 0)) return Status(Code::kMalformedMessage, "etcd: bad JSON at byte " + std::to_string(i_));
    return v;
  }
  size_t consumed() const { return i_; }

 private:
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool lit(const char* w) {
    const size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  bool str(std::string& out) {
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    ++i_;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= s_.size()) return false;
      c = s_[i_++];
      switch (c) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {  // etcd's messages are ASCII; a \u escape keeps its low byte
          size_t code = 0;
          if (i_ + 4 > s_.size() || !parse_hex(s_.substr(i_, 4), code)) return false;
          out += char(code & 0x7f);
          i_ += 4;
          break;
        }
        default: out += c;
      }
    }
    if (i_ >= s_.size()) return false;
    ++i_;
    return true;
  }
  bool value(Json& v, int depth) {
    if (depth > 32) return false;
    ws();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') {
      v.type = Json::Type::kObject;
      ++i_;
      ws();
      if (i_ < s_.size() && s_[i_] == '}') return ++i_, true;
      for (;;) {
        ws();
        std::string k;
        if (!str(k)) return false;
        ws();
        if (i_ >= s_.size() || s_[i_++] != ':') return false;
        if (!value(v.fields[k], depth + 1)) return false;
        ws();
        if (i_ >= s_.size()) return false;
        if (s_[i_] == ',') { ++i_; continue; }
        if (s_[i_] == '}') return ++i_, true;
        return false;
      }
    }
    if (c == '[') {
      v.type = Json::Type::kArray;
      ++i_;
      ws();
      if (i_ < s_.size() && s_[i_] == ']') return ++i_, true;
      for (;;) {
        v.items.emplace_back();
        if (!value(v.items.back(), depth + 1)) return false;
        ws();
        if (i_ >= s_.size()) return false;
        if (s_[i_] == ',') { ++i_; continue; }
        if (s_[i_] == ']') return ++i_, true;
        return false;
      }
    }
    if (c == '"') {
      v.type = Json::Type::kString;
      return str(v.text);
    }
    if (lit("true")) return v.type = Json::Type::kBool, v.b = true, true;
    if (lit("false")) return v.type = Json::Type::kBool, v.b = false, true;
    if (lit("null")) return v.type = Json::Type::kNull, true;
    const size_t start = i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || (s_[i_] && std::strchr("+-.eE", s_[i_])))) ++i_;
    if (i_ == start) return false;
    v.type = Json::Type::kNumber;
    v.text = s_.substr(start, i_ - start);
    return true;
  }
  const std::string& s_;
  size_t i_ = 0;
};

std::string quote(const std::string& s) { return "\"" + s + "\""; }  // base64 and digits only
std::string num(int64_t v) { return quote(std::to_string(v)); }      // int64 as the gateway writes it

Result<EtcdKv> kv_of(const Json& j) {
  EtcdKv kv;
  if (const Json* k = j.get("key")) {
    auto d = base64_decode(k->text);
    if (!d.ok()) return d.take_status();
    kv.key = *d;
  }
  if (const Json* v = j.get("value")) {
    auto d = base64_decode(v->text);
    if (!d.ok()) return d.take_status();
    kv.value = *d;
  }
  if (const Json* r = j.get("create_revision")) kv.create_revision = r->as_int();
  if (const Json* r = j.get("mod_revision")) kv.mod_revision = r->as_int();
  if (const Json* l = j.get("lease")) kv.lease = l->as_int();
  return kv;
}

// The first kv of a range response, or none.
Result<std::optional<EtcdKv>> first_kv(const Json& range) {
  const Json* kvs = range.get("kvs");
  if (!kvs || kvs->items.empty()) return std::optional<EtcdKv>{};
  auto kv = kv_of(kvs->items[0]);
  if (!kv.ok()) return kv.take_status();
  return std::optional<EtcdKv>{*kv};
}

Result<Json> parse_reply(const std::string& body, const std::string& what) {
  auto j = JsonParser(body).parse();
  if (!j.ok()) return Status(Code::kMalformedMessage, "etcd " + what + ": " + j.status().message());
  // A streaming call (keepalive) wraps its answer: {"result": {...}} or {"error": {...}}.
  if (const Json* e = j->get("error"))
    return Status(Code::kClosed, "etcd " + what + ": " + (e->get("message") ? e->get("message")->text : "error"));
  if (const Json* r = j->get("result")) return *r;
  return std::move(*j);
}

bool wait_fd(int fd, short ev, int64_t deadline) {
  const int64_t left = deadline - steady_now_ms();
  if (left <= 0) return false;
  pollfd p{fd, ev, 0};
  return poll(&p, 1, int(left)) == 1;
}

// A connected non-blocking socket to host:port by the deadline (the caller closes it).
Result<int> dial(const std::string& host, uint16_t port, int64_t deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return Status(Code::kClosed, "etcd " + host + ": " + gai_strerror(rc));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, freeaddrinfo);
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(Code::kClosed, std::string("etcd: socket: ") + std::strerror(errno));
  const std::string where = host + ":" + std::to_string(port);
  auto failed = [&](Status st) {
    close(fd);
    return st;
  };
  if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return failed(Status(Code::kClosed, "etcd " + where + ": " + std::strerror(errno)));
    if (!wait_fd(fd, POLLOUT, deadline)) return failed(Status(Code::kTimeout, "etcd " + where + ": connect timed out"));
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return failed(Status(Code::kClosed, "etcd " + where + ": " + std::strerror(err)));
  }
  return fd;
}

// A POST of a JSON body, whole, by the deadline.
Status send_post(int fd, const std::string& where, const std::string& path, const std::string& body, bool keep,
                 int64_t deadline) {
  const std::string req = "POST " + path + " HTTP/1.1\r\nHost: " + where +
                          "\r\nContent-Type: application/json\r\n" + (keep ? "" : "Connection: close\r\n") +
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  for (size_t sent = 0; sent < req.size();) {
    const ssize_t n = send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += size_t(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) return Status(Code::kClosed, "etcd " + where + ": send: " + std::strerror(errno));
    if (!wait_fd(fd, POLLOUT, deadline)) return Status(Code::kTimeout, "etcd " + where + ": send timed out");
  }
  return Status::ok();
}

// One HTTP/1.1 POST with a JSON body over a fresh connection; the body of the answer. The whole
// call (connect, send, read) is bounded by timeout_ms.
Result<std::string> http_post(const std::string& host, uint16_t port, const std::string& path,
                              const std::string& body, int timeout_ms) {
  const int64_t deadline = steady_now_ms() + timeout_ms;
  auto dialed = dial(host, port, deadline);
  if (!dialed.ok()) return dialed.take_status();
  const int fd = *dialed;
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  auto wait = [&](short ev) { return wait_fd(fd, ev, deadline); };
  const std::string where = host + ":" + std::to_string(port);
  if (Status st = send_post(fd, where, path, body, false, deadline); !st.ok()) return st;
  std::string in;
  size_t header_end = std::string::npos;
  int64_t content_length = -1;
  bool chunked = false;
  char buf[16384];
  for (;;) {
    if (header_end != std::string::npos) {
      const std::string body_in = in.substr(header_end);
      if (content_length >= 0 && int64_t(body_in.size()) >= content_length) return body_in.substr(0, size_t(content_length));
      if (chunked) {  // the streaming calls: the first complete chunk holds the one answer asked for
        const size_t crlf = body_in.find("\r\n");
        if (crlf != std::string::npos) {
          size_t len = 0;
          if (!parse_hex(body_in.substr(0, crlf), len))
            return Status(Code::kMalformedMessage, "etcd " + where + path + ": a bad chunk size");
          if (body_in.size() >= crlf + 2 + len) return body_in.substr(crlf + 2, len);
        }
      }
    }
    if (!wait(POLLIN)) return Status(Code::kTimeout, "etcd " + where + path + ": no answer in " + std::to_string(timeout_ms) + " ms");
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) {
      if (header_end != std::string::npos && content_length < 0 && !chunked) return in.substr(header_end);
      return Status(Code::kClosed, "etcd " + where + path + ": connection closed mid-answer");
    }
    in.append(buf, size_t(n));
    if (header_end == std::string::npos) {
      const size_t e = in.find("\r\n\r\n");
      if (e == std::string::npos) continue;
      header_end = e + 4;
      const std::string head = in.substr(0, e);
      if (head.compare(0, 9, "HTTP/1.1 ") != 0 && head.compare(0, 9, "HTTP/1.0 ") != 0)
        return Status(Code::kMalformedMessage, "etcd " + where + ": not an HTTP answer");
      const int code = std::atoi(head.c_str() + 9);
      std::string lower;
      for (char c : head) lower += char(std::tolower(static_cast<unsigned char>(c)));
      if (auto p = lower.find("\r\ncontent-length:"); p != std::string::npos) content_length = std::atoll(lower.c_str() + p + 17);
      chunked = lower.find("\r\ntransfer-encoding: chunked") != std::string::npos;
      if (code != 200) {
        // The gateway explains itself in the body: keep reading it for the message.
        if (content_length >= 0) {
          while (int64_t(in.size() - header_end) < content_length && wait(POLLIN)) {
            const ssize_t m = recv(fd, buf, sizeof(buf), 0);
            if (m <= 0) break;
            in.append(buf, size_t(m));
          }
        }
        return Status(Code::kClosed, "etcd " + where + path + ": HTTP " + std::to_string(code) + " " +
                                         in.substr(header_end, 300));
      }
    }
  }
}

}  // namespace

std::string base64_encode(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += t[v >> 18];
    out += t[(v >> 12) & 63];
    out += t[(v >> 6) & 63];
    out += t[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += t[v >> 18];
    out += t[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += t[v >> 18];
    out += t[(v >> 12) & 63];
    out += t[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

Result<std::string> base64_decode(const std::string& in) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < in.size() && in[i] != '='; ++i) {
    const int v = val(in[i]);
    if (v < 0) return Status(Code::kMalformedMessage, "base64: byte " + std::to_string(i) + " is not base64");
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xff);
    }
  }
  for (; i < in.size(); ++i)
    if (in[i] != '=') return Status(Code::kMalformedMessage, "base64: data after padding");
  return out;
}

Result<std::pair<std::string, uint16_t>> parse_http_endpoint(const std::string& e) {
  if (e.rfind("https://", 0) == 0)
    return invalid_argument("'" + e + "': https is not supported (the etcd client speaks plain HTTP on a trusted network)");
  if (e.rfind("http://", 0) != 0) return invalid_argument("'" + e + "': expected http://host:port");
  std::string rest = e.substr(7);
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) return invalid_argument("'" + e + "': expected http://host:port");
  const std::string host = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) == 0 || std::stoul(port) > 65535)
    return invalid_argument("'" + e + "': the port must be 1..65535");
  return std::make_pair(host, uint16_t(std::stoul(port)));
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints, int timeout_ms)
    : endpoints_(std::move(endpoints)), timeout_ms_(timeout_ms) {}

Result<std::string> EtcdClient::call(const std::string& path, const std::string& body) {
  if (endpoints_.empty()) return Status(Code::kClosed, "etcd: no endpoints");
  Status last = Status(Code::kClosed, "etcd: no endpoint answered");
  // The endpoint that answered last first, then the others, once each.
  for (size_t k = 0; k < endpoints_.size(); ++k) {
    const size_t i = (next_ + k) % endpoints_.size();
    auto hp = parse_http_endpoint(endpoints_[i]);
    if (!hp.ok()) return hp.take_status();
    auto r = http_post(hp->first, hp->second, path, body, timeout_ms_);
    if (r.ok()) {
      next_ = i;
      last_ = endpoints_[i];
      return r;
    }
    last = r.take_status();
  }
  return last;
}

Result<int64_t> EtcdClient::grant(int64_t ttl_seconds) {
  auto b = call("/v3/lease/grant", "{\"TTL\":" + num(ttl_seconds) + "}");
  if (!b.ok()) return b.take_status();
  auto j = parse_reply(*b, "grant");
  if (!j.ok()) return j.take_status();
  const Json* id = j->get("ID");
  if (!id || id->as_int() == 0) return Status(Code::kMalformedMessage, "etcd grant: no lease ID in " + b->substr(0, 200));
  return id->as_int();
}

Result<int64_t> EtcdClient::keepalive(int64_t lease) {
  auto b = call("/v3/lease/keepalive", "{\"ID\":" + num(lease) + "}");
  if (!b.ok()) return b.take_status();
  auto j = parse_reply(*b, "keepalive");
  if (!j.ok()) {
    // "requested lease not found": etcd answered, and the lease is gone.
    if (j.status().message().find("not found") != std::string::npos) return int64_t(0);
    return j.take_status();
  }
  const Json* ttl = j->get("TTL");
  return ttl ? ttl->as_int() : int64_t(0);  // the gateway leaves a zero out
}

Status EtcdClient::revoke(int64_t lease) {
  auto b = call("/v3/lease/revoke", "{\"ID\":" + num(lease) + "}");
  if (!b.ok()) return b.take_status();
  auto j = parse_reply(*b, "revoke");
  if (!j.ok() && j.status().message().find("not found") == std::string::npos) return j.take_status();
  return Status::ok();
}

Result<EtcdClient::Created> EtcdClient::create(const std::string& key, const std::string& value, int64_t lease) {
  const std::string k = quote(base64_encode(key));
  const std::string body =
      "{\"compare\":[{\"key\":" + k + ",\"result\":\"EQUAL\",\"target\":\"CREATE\",\"create_revision\":\"0\"}]," +
      "\"success\":[{\"request_put\":{\"key\":" + k + ",\"value\":" + quote(base64_encode(value)) +
      ",\"lease\":" + num(lease) + "}}],\"failure\":[{\"request_range\":{\"key\":" + k + "}}]}";
  auto b = call("/v3/kv/txn", body);
  if (!b.ok()) return b.take_status();
  auto j = parse_reply(*b, "txn");
  if (!j.ok()) return j.take_status();
  Created c;
  const Json* ok = j->get("succeeded");
  c.won = ok && ok->type == Json::Type::kBool && ok->b;
  if (c.won) {
    const Json* h = j->get("header");
    const Json* rev = h ? h->get("revision") : nullptr;
    if (!rev || rev->as_int() <= 0) return Status(Code::kMalformedMessage, "etcd txn: no revision in " + b->substr(0, 200));
    c.holder = EtcdKv{key, value, rev->as_int(), rev->as_int(), lease};
    return c;
  }
  const Json* rs = j->get("responses");
  const Json* range = rs && !rs->items.empty() ? rs->items[0].get("response_range") : nullptr;
  if (!range) return Status(Code::kMalformedMessage, "etcd txn: no range in the failure branch: " + b->substr(0, 200));
  auto kv = first_kv(*range);
  if (!kv.ok()) return kv.take_status();
  if (!*kv) return Status(Code::kClosed, "etcd txn: the key vanished between compare and range (retry)");
  c.holder = **kv;
  return c;
}

Result<std::optional<EtcdKv>> EtcdClient::get(const std::string& key) {
  auto b = call("/v3/kv/range", "{\"key\":" + quote(base64_encode(key)) + "}");
  if (!b.ok()) return b.take_status();
  auto j = parse_reply(*b, "range");
  if (!j.ok()) return j.take_status();
  return first_kv(*j);
}

Result<EtcdClient::Range> EtcdClient::range(const std::string& key) {
  auto b = call("/v3/kv/range", "{\"key\":" + quote(base64_encode(key)) + "}");
  if (!b.ok()) return b.take_status();
  auto j = parse_reply(*b, "range");
  if (!j.ok()) return j.take_status();
  Range r;
  const Json* h = j->get("header");
  const Json* rev = h ? h->get("revision") : nullptr;
  if (!rev || rev->as_int() <= 0) return Status(Code::kMalformedMessage, "etcd range: no revision in " + b->substr(0, 200));
  r.revision = rev->as_int();
  auto kv = first_kv(*j);
  if (!kv.ok()) return kv.take_status();
  r.kv = std::move(*kv);
  return r;
}

Status EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  std::string body = "{\"key\":" + quote(base64_encode(key)) + ",\"value\":" + quote(base64_encode(value));
  if (lease) body += ",\"lease\":" + num(lease);
  auto b = call("/v3/kv/put", body + "}");
  if (!b.ok()) return b.take_status();
  auto j = parse_reply(*b, "put");
  return j.ok() ? Status::ok() : j.take_status();
}

Status EtcdClient::remove_if_created_at(const std::string& key, int64_t create_revision) {
  const std::string k = quote(base64_encode(key));
  auto b = call("/v3/kv/txn", "{\"compare\":[{\"key\":" + k +
                                  ",\"result\":\"EQUAL\",\"target\":\"CREATE\",\"create_revision\":" +
                                  num(create_revision) + "}],\"success\":[{\"request_delete_range\":{\"key\":" + k + "}}]}");
  if (!b.ok()) return b.take_status();
  auto j = parse_reply(*b, "txn");
  return j.ok() ? Status::ok() : j.take_status();
}

Result<std::unique_ptr<EtcdWatch>> EtcdWatch::open(const std::vector<std::string>& endpoints, const std::string& key,
                                                   int64_t start_revision, int timeout_ms) {
  Status last = Status(Code::kClosed, "etcd watch: no endpoints");
  const std::string body = "{\"create_request\":{\"key\":" + quote(base64_encode(key)) +
                           ",\"start_revision\":" + num(start_revision) + "}}";
  for (const auto& e : endpoints) {
    auto hp = parse_http_endpoint(e);
    if (!hp.ok()) return hp.take_status();
    const int64_t deadline = steady_now_ms() + timeout_ms;
    auto fd = dial(hp->first, hp->second, deadline);
    if (!fd.ok()) {
      last = fd.take_status();
      continue;
    }
    std::unique_ptr<EtcdWatch> w(new EtcdWatch(*fd));
    const std::string where = hp->first + ":" + std::to_string(hp->second);
    if (Status st = send_post(*fd, where, "/v3/watch", body, true, deadline); !st.ok()) {
      last = st;
      continue;
    }
    // The head: 200 and a chunked stream, or the gateway's words.
    std::string in;
    size_t end = std::string::npos;
    char buf[4096];
    while ((end = in.find("\r\n\r\n")) == std::string::npos && in.size() < 65536) {
      if (!wait_fd(*fd, POLLIN, deadline)) break;
      const ssize_t n = recv(*fd, buf, sizeof(buf), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) break;
      in.append(buf, size_t(n));
    }
    if (end == std::string::npos) {
      last = Status(Code::kTimeout, "etcd " + where + "/v3/watch: no answer in " + std::to_string(timeout_ms) + " ms");
      continue;
    }
    std::string head;
    for (char c : in.substr(0, end)) head += char(std::tolower(static_cast<unsigned char>(c)));
    if (head.compare(0, 13, "http/1.1 200 ") != 0 || head.find("\r\ntransfer-encoding: chunked") == std::string::npos) {
      last = Status(Code::kClosed, "etcd " + where + "/v3/watch: " + in.substr(0, std::min<size_t>(end, 200)));
      continue;
    }
    auto first = w->feed(in.substr(end + 4));  // whatever came with the head
    if (!first.ok()) {
      last = first.take_status();
      continue;
    }
    w->early_ = std::move(*first);
    return w;
  }
  return last;
}

EtcdWatch::~EtcdWatch() {
  if (fd_ >= 0) close(fd_);
}

Result<std::vector<EtcdEvent>> EtcdWatch::next(int wait_ms) {
  if (!early_.empty()) return std::exchange(early_, {});
  if (fd_ < 0) return Status(Code::kClosed, "etcd watch: the stream ended");
  const int64_t deadline = steady_now_ms() + std::max(0, wait_ms);
  if (!wait_fd(fd_, POLLIN, deadline)) return std::vector<EtcdEvent>{};
  std::string got;
  char buf[16384];
  for (;;) {
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      got.append(buf, size_t(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    // The stream ended (etcd went away, or closed it): what came before still counts.
    auto events = feed(got);
    if (!events.ok()) return events;
    if (!events->empty()) {
      close(fd_);
      fd_ = -1;
      return events;  // the end shows on the next call
    }
    return Status(Code::kClosed, std::string("etcd watch: the stream ended") + (n < 0 ? std::string(": ") + std::strerror(errno) : ""));
  }
  return feed(got);
}

Result<std::vector<EtcdEvent>> EtcdWatch::feed(const std::string& bytes) {
  raw_ += bytes;
  // De-chunk every complete chunk.
  for (;;) {
    const size_t crlf = raw_.find("\r\n");
    if (crlf == std::string::npos) break;
    std::string size_text = raw_.substr(0, crlf);
    if (const size_t semi = size_text.find(';'); semi != std::string::npos) size_text.resize(semi);
    size_t len = 0;
    if (!parse_hex(size_text, len)) return Status(Code::kMalformedMessage, "etcd watch: a bad chunk size");
    if (len == 0) return Status(Code::kClosed, "etcd watch: the stream ended");
    if (raw_.size() < crlf + 2 + len + 2) break;
    body_.append(raw_, crlf + 2, len);
    raw_.erase(0, crlf + 2 + len + 2);
  }
  if (body_.size() > (size_t(16) << 20)) return Status(Code::kMalformedMessage, "etcd watch: a message over 16 MiB");
  // One JSON message per line.
  std::vector<EtcdEvent> out;
  size_t at = 0;
  for (size_t nl; (nl = body_.find('\n', at)) != std::string::npos; at = nl + 1) {
    const std::string line = body_.substr(at, nl - at);
    if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
    auto j = parse_reply(line, "watch");
    if (!j.ok()) return j.take_status();
    if (const Json* c = j->get("created"); c && c->b) created_ = true;
    if (const Json* c = j->get("canceled"); c && c->b) {
      const Json* why = j->get("cancel_reason");
      const Json* compact = j->get("compact_revision");
      return Status(Code::kClosed, "etcd watch: cancelled (" + (why ? why->text : std::string("no reason")) +
                                       (compact ? ", compacted at " + compact->text : std::string()) + ")");
    }
    if (const Json* evs = j->get("events"))
      for (const Json& ev : evs->items) {
        EtcdEvent e;
        const Json* type = ev.get("type");
        e.deleted = type && type->text == "DELETE";
        if (const Json* kv = ev.get("kv")) {
          auto k = kv_of(*kv);
          if (!k.ok()) return k.take_status();
          e.kv = std::move(*k);
        }
        out.push_back(std::move(e));
      }
  }
  body_.erase(0, at);
  return out;
}

}  // namespace fluxon
