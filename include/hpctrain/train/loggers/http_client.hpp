#pragma once
// A small HTTP client over libcurl's easy interface, as much of it as the W&B logger's live stream needs
// (train/loggers/wandb_live.hpp): POST a JSON body with HTTP basic auth, bounded by timeouts, abortable from another
// thread, and the answer's status and body. A transport failure (no route, refused, timed out, TLS) is a response
// with status 0 and libcurl's message: the caller decides what a failure means, nothing here throws after
// construction. libcurl honours the site's https_proxy/no_proxy variables and verifies TLS with the system's CA
// certificates. Torch-free; links libcurl (CURL::libcurl, part of hpctrain::hpctrain). A build configured with
// HPCTRAIN_LIVE_WANDB=OFF (no libcurl: a bare GPU image, docs/gpu.md) defines HPCTRAIN_NO_LIBCURL: then a client
// cannot be made, and the W&B logger says so once and keeps to its offline run.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>

#ifndef HPCTRAIN_NO_LIBCURL
#include <curl/curl.h>
#endif

#include <hpctrain/error.hpp>
#include <hpctrain/error_ids.hpp>

namespace hpctrain {

/// What an HTTP request came back with: the status (0: no answer, see `error`), the body, libcurl's message.
struct HttpResponse {
  long status = 0;
  std::string body;
  std::string error;  ///< why there is no answer (status 0); empty otherwise

  /// A 2xx answer.
  bool ok() const { return status >= 200 && status < 300; }
};

/// How long a request may take: to connect, and in all.
struct HttpTimeouts {
  std::chrono::milliseconds connect{std::chrono::seconds(10)};
  std::chrono::milliseconds total{std::chrono::seconds(60)};
};

#ifdef HPCTRAIN_NO_LIBCURL
/// The client of a build without libcurl: making one throws, naming the switch.
class HttpClient {
 public:
  /// Throws RuntimeError `[hpctrain.runtime.wandb]`: this build has no HTTP client.
  HttpClient() {
    throw RuntimeError(errors::runtime_wandb,
                       "this build of hpctrain has no libcurl (configured with -DHPCTRAIN_LIVE_WANDB=OFF), so W&B's "
                       "live stream is compiled out");
  }
  HttpResponse post_json(const std::string&, const std::string&, const std::string&, const std::string&,
                         const std::string&, HttpTimeouts = {}, const std::atomic<bool>* = nullptr) {
    return {};
  }
};
#else
/// One libcurl easy handle (its connection kept alive between requests), used by one thread at a time.
class HttpClient {
 public:
  /// Throws RuntimeError `[hpctrain.runtime.wandb]` when libcurl cannot make a handle.
  HttpClient() {
    global_init();
    handle_ = curl_easy_init();
    if (handle_ == nullptr) throw RuntimeError(errors::runtime_wandb, "libcurl could not make an easy handle");
  }
  HttpClient(HttpClient&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
  HttpClient& operator=(HttpClient&&) = delete;
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;
  ~HttpClient() {
    if (handle_ != nullptr) curl_easy_cleanup(handle_);
  }

  /// POSTs `json` to `url` as `application/json`, with basic auth `user:password` when `user` is not empty. `abort`,
  /// when given and set by another thread, ends the request at once (status 0). Never throws.
  HttpResponse post_json(const std::string& url, const std::string& json, const std::string& user,
                         const std::string& password, const std::string& user_agent, HttpTimeouts timeouts,
                         const std::atomic<bool>* abort = nullptr) {
    HttpResponse response;
    curl_easy_reset(handle_);  // keeps the connection cache: the next request to the host reuses the connection
    char error[CURL_ERROR_SIZE] = "";
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Accept: application/json");
    curl_easy_setopt(handle_, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(handle_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(handle_, CURLOPT_POST, 1L);
    curl_easy_setopt(handle_, CURLOPT_POSTFIELDS, json.data());
    curl_easy_setopt(handle_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(json.size()));
    curl_easy_setopt(handle_, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(handle_, CURLOPT_USERAGENT, user_agent.c_str());
    if (!user.empty()) {
      curl_easy_setopt(handle_, CURLOPT_HTTPAUTH, static_cast<long>(CURLAUTH_BASIC));
      curl_easy_setopt(handle_, CURLOPT_USERNAME, user.c_str());
      curl_easy_setopt(handle_, CURLOPT_PASSWORD, password.c_str());
    }
    // No signals: the request runs on a background thread, where libcurl's SIGALRM-based DNS timeout is unsafe.
    curl_easy_setopt(handle_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(handle_, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeouts.connect.count()));
    curl_easy_setopt(handle_, CURLOPT_TIMEOUT_MS, static_cast<long>(timeouts.total.count()));
    curl_easy_setopt(handle_, CURLOPT_WRITEFUNCTION, &HttpClient::append_body);
    curl_easy_setopt(handle_, CURLOPT_WRITEDATA, &response.body);
    if (abort != nullptr) {
      curl_easy_setopt(handle_, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(handle_, CURLOPT_XFERINFOFUNCTION, &HttpClient::aborted);
      curl_easy_setopt(handle_, CURLOPT_XFERINFODATA, abort);
    }
    const CURLcode code = curl_easy_perform(handle_);
    curl_slist_free_all(headers);
    if (code != CURLE_OK) {
      response.error = error[0] != '\0' ? error : curl_easy_strerror(code);
      response.body.clear();
      return response;
    }
    curl_easy_getinfo(handle_, CURLINFO_RESPONSE_CODE, &response.status);
    return response;
  }

 private:
  // curl_global_init is not thread-safe: once, from the thread that makes the first client (the logger's start,
  // before its background thread exists). Never cleaned up: other libraries in the process may use libcurl too.
  static void global_init() {
    static const bool initialised = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
    if (!initialised) throw RuntimeError(errors::runtime_wandb, "libcurl could not be initialised");
  }
  static std::size_t append_body(char* data, std::size_t size, std::size_t count, void* body) {
    static_cast<std::string*>(body)->append(data, size * count);
    return size * count;
  }
  static int aborted(void* abort, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<const std::atomic<bool>*>(abort)->load() ? 1 : 0;
  }

  CURL* handle_ = nullptr;
};
#endif

}  // namespace hpctrain
