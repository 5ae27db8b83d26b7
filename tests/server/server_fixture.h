// The fixture the HTTP-level tests share: a real OpenAiServer on an ephemeral 127.0.0.1 port over
// a scripted FakeEngine and tiny-coder's tokenizer, with the client helpers of test_support.h.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/openai_server.h"
#include "test_support.h"

namespace deltaserve::testing {

inline const std::string kTinyCoderDir = std::string(DELTASERVE_SOURCE_DIR) + "/models/tiny-coder";

class ServerFixture : public ::testing::Test {
 protected:
  // Serves as model "tiny" with this chat renderer; before_listen runs on the server before it
  // starts (e.g. set_server_info).
  void start_server(ServerConfig cfg, ChatRenderFn render,
                    const std::function<void(OpenAiServer&)>& before_listen = {}) {
    auto tok = Tokenizer::load(kTinyCoderDir);
    ASSERT_TRUE(tok.is_ok()) << tok.status().message();
    tokenizer_ = std::make_unique<Tokenizer>(*tok);
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    cfg.served_model_name = "tiny";
    server_ = std::make_unique<OpenAiServer>(cfg, engine_, *tokenizer_, std::move(render),
                                             *load_generation_defaults(kTinyCoderDir, 0));
    if (before_listen) before_listen(*server_);
    auto st = server_->start();
    ASSERT_TRUE(st.is_ok()) << st.message();
    port_ = server_->port();
  }
  void TearDown() override {
    if (server_) server_->stop();
  }
  HttpResult post(const std::string& path, const std::string& body, std::vector<std::string> headers = {}) {
    return http(port_, "POST", path, body, headers);
  }
  static nlohmann::json error_of(const HttpResult& r) {
    nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.body;
    EXPECT_TRUE(j.contains("error")) << r.body;
    return j.is_discarded() ? nlohmann::json() : j["error"];
  }
  void expect_idle() {
    EXPECT_TRUE(wait_until([&] { return server_->active_jobs() == 0 && engine_.n_live() == 0; }))
        << "active jobs " << server_->active_jobs() << ", live " << engine_.n_live();
  }

  FakeEngine engine_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<OpenAiServer> server_;
  int port_ = 0;
};

}  // namespace deltaserve::testing
