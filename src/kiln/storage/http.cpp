#include "kiln/storage/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>

#include "kiln/core/error.h"

namespace kiln {
namespace {

constexpr size_t kMaxErrorBody = 64 * 1024;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { KILN_CHECK(curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK, "libcurl failed to start"); });
}

// Per-thread multi handle and a pool of easy handles: connections are cached by the multi handle.
struct ThreadCurl {
  CURLM* multi = nullptr;
  std::vector<CURL*> idle;
  ThreadCurl() {
    global_init();
    multi = curl_multi_init();
    KILN_CHECK(multi != nullptr, "libcurl: cannot create a multi handle");
  }
  ~ThreadCurl() {
    for (CURL* easy : idle) curl_easy_cleanup(easy);
    curl_multi_cleanup(multi);
  }
  CURL* take() {
    if (idle.empty()) {
      CURL* easy = curl_easy_init();
      KILN_CHECK(easy != nullptr, "libcurl: cannot create an easy handle");
      return easy;
    }
    CURL* easy = idle.back();
    idle.pop_back();
    curl_easy_reset(easy);
    return easy;
  }
};

ThreadCurl& thread_curl() {
  thread_local ThreadCurl curl;
  return curl;
}

struct Transfer {
  const HttpRequest* request = nullptr;
  HttpResponse* response = nullptr;
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  char error[CURL_ERROR_SIZE] = {};
  bool overflow = false;
  bool in_multi = false;
};

// Returns a transfer's handle to the thread's pool, also when an error unwinds mid-batch, so the
// multi handle never keeps a transfer whose buffers are gone.
void finish(ThreadCurl& curl, Transfer& transfer) {
  if (!transfer.in_multi) return;
  curl_multi_remove_handle(curl.multi, transfer.easy);
  curl_slist_free_all(transfer.headers);
  transfer.headers = nullptr;
  curl.idle.push_back(transfer.easy);
  transfer.in_multi = false;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto& transfer = *static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  long status = 0;
  curl_easy_getinfo(transfer.easy, CURLINFO_RESPONSE_CODE, &status);
  HttpResponse& response = *transfer.response;
  if (status >= 300 || transfer.request->into.empty()) {
    const size_t room = status >= 300 ? kMaxErrorBody - std::min(kMaxErrorBody, response.body.size()) : bytes;
    response.body.append(data, std::min(bytes, room));
  } else {
    const std::span<uint8_t> into = transfer.request->into;
    if (response.received + bytes > into.size()) {
      transfer.overflow = true;
      return 0;  // aborts the transfer with CURLE_WRITE_ERROR
    }
    std::memcpy(into.data() + response.received, data, bytes);
  }
  response.received += bytes;
  return bytes;
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto& response = *static_cast<HttpResponse*>(user);
  const std::string_view line(data, size * count);
  if (line.starts_with("HTTP/")) {
    response.headers.clear();  // a new response (after 100-continue or a redirect)
  } else if (const size_t colon = line.find(':'); colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) value.remove_suffix(1);
    response.headers.emplace_back(std::move(name), std::string(value));
  }
  return size * count;
}

void configure(Transfer& transfer, const HttpTimeouts& timeouts) {
  CURL* easy = transfer.easy;
  const HttpRequest& request = *transfer.request;
  curl_easy_setopt(easy, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, transfer.error);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &transfer);
  curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(easy, CURLOPT_HEADERDATA, transfer.response);
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, timeouts.connect_ms);
  curl_easy_setopt(easy, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(easy, CURLOPT_LOW_SPEED_TIME, timeouts.stall_seconds);
  curl_easy_setopt(easy, CURLOPT_TCP_KEEPALIVE, 1L);
  if (request.method == "HEAD") {
    curl_easy_setopt(easy, CURLOPT_NOBODY, 1L);
  } else if (request.method == "PUT") {
    curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, "PUT");
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  } else if (request.method != "GET") {
    curl_easy_setopt(easy, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  }
  for (const std::string& header : request.headers) transfer.headers = curl_slist_append(transfer.headers, header.c_str());
  transfer.headers = curl_slist_append(transfer.headers, "Expect:");  // no 100-continue round trip
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, transfer.headers);
  curl_easy_setopt(easy, CURLOPT_PRIVATE, &transfer);
}

}  // namespace

const std::string* HttpResponse::header(std::string_view name) const {
  for (const auto& [key, value] : headers)
    if (key == name) return &value;
  return nullptr;
}

std::vector<HttpResponse> http_perform(std::span<const HttpRequest> requests, int max_in_flight,
                                       const HttpTimeouts& timeouts) {
  ThreadCurl& curl = thread_curl();
  std::vector<HttpResponse> responses(requests.size());
  std::vector<Transfer> transfers(requests.size());
  struct Cleanup {
    ThreadCurl& curl;
    std::vector<Transfer>& transfers;
    ~Cleanup() {
      for (Transfer& transfer : transfers) finish(curl, transfer);
    }
  } cleanup{curl, transfers};
  size_t next = 0, running = 0;
  const auto start_next = [&] {
    Transfer& transfer = transfers[next];
    transfer.request = &requests[next];
    transfer.response = &responses[next];
    transfer.easy = curl.take();
    configure(transfer, timeouts);
    curl_multi_add_handle(curl.multi, transfer.easy);
    transfer.in_multi = true;
    ++next;
    ++running;
  };
  const size_t limit = static_cast<size_t>(std::max(1, max_in_flight));
  while (next < requests.size() && running < limit) start_next();
  while (running > 0) {
    int still_running = 0;
    const CURLMcode code = curl_multi_perform(curl.multi, &still_running);
    KILN_CHECK(code == CURLM_OK, "libcurl: {}", curl_multi_strerror(code));
    int queued = 0;
    while (CURLMsg* message = curl_multi_info_read(curl.multi, &queued)) {
      if (message->msg != CURLMSG_DONE) continue;
      Transfer* transfer = nullptr;
      curl_easy_getinfo(message->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&transfer));
      HttpResponse& response = *transfer->response;
      if (message->data.result == CURLE_OK) {
        curl_easy_getinfo(transfer->easy, CURLINFO_RESPONSE_CODE, &response.status);
      } else {
        response.status = 0;
        response.transport_error = transfer->overflow ? std::string("the response is longer than requested")
                                   : transfer->error[0] ? std::string(transfer->error)
                                                        : std::string(curl_easy_strerror(message->data.result));
      }
      finish(curl, *transfer);
      --running;
      if (next < requests.size()) start_next();
    }
    if (running > 0) curl_multi_poll(curl.multi, nullptr, 0, 100, nullptr);
  }
  return responses;
}

}  // namespace kiln
