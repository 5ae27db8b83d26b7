// Config sources (unit file, shell script, TOML, launch id) and their diff, on the story's fixtures:
// the tuned SGLang unit file vs the relaunch typed after a reboot.
#include "deploy/config_diff.h"

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include "deploy/launch_db.h"
#include "deploy/systemd_unit.h"
#include "deploy/unit_file.h"

namespace deltaserve {
namespace {

const std::string kFixtures = std::string(DELTASERVE_SOURCE_DIR) + "/tests/deploy/fixtures/";

std::map<std::string, DiffRow> by_key(const std::vector<DiffRow>& rows) {
  std::map<std::string, DiffRow> m;
  for (const auto& r : rows) m[r.key] = r;
  return m;
}

std::string setting(const ConfigSource& s, const std::string& key) {
  for (const auto& [k, v] : s.settings)
    if (k == key) return v;
  return "(missing)";
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ds-config-diff-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST(ShellWords, QuotesContinuationsVariablesRedirections) {
  auto w = split_command_words(
      "CUDA_VISIBLE_DEVICES=0,1 nohup python3 -m sglang.launch_server --model-path \"$MODEL\" \\\n"
      "  --served-model-name 'qwen 27b' --api-key ${KEY} > /var/log/x.log 2>&1 &",
      {{"MODEL", "Qwen/Qwen3.6-27B"}, {"KEY", "sk-1"}});
  ASSERT_TRUE(w) << w.status().message();
  std::vector<std::string> expected = {"CUDA_VISIBLE_DEVICES=0,1", "nohup", "python3", "-m", "sglang.launch_server",
                                       "--model-path", "Qwen/Qwen3.6-27B", "--served-model-name", "qwen 27b",
                                       "--api-key", "sk-1"};
  EXPECT_EQ(*w, expected);
  std::vector<std::string> args;
  KeyValues env;
  ASSERT_TRUE(find_server_args(*w, &args, &env));
  EXPECT_EQ(args.front(), "--model-path");
  ASSERT_EQ(env.size(), 1u);
  EXPECT_EQ(env[0].first, "env:CUDA_VISIBLE_DEVICES");
  EXPECT_FALSE(split_command_words("python -m x --a \"unterminated"));
  // Stop 54: an unquoted $ARGS splits into words at blanks (it was one word), an empty unquoted one
  // gives none (it was an empty argument), a quoted one stays one word.
  auto s = split_command_words("x $ARGS $EXTRA \"$ARGS\" a$EXTRA", {{"ARGS", "--tp 2  --context-length 8192"}, {"EXTRA", ""}});
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(*s, (std::vector<std::string>{"x", "--tp", "2", "--context-length", "8192", "--tp 2  --context-length 8192", "a"}));
}

TEST(ConfigSources, LaunchersAreRecognised) {
  for (const char* cmd : {"python -m sglang.launch_server --model-path /m --tp 2",
                          "python3 -m sglang.launch_server --model-path /m --tp 2",
                          "sglang serve --model-path /m --tp-size 2",
                          "/opt/venv/bin/sglang serve --model-path /m --tensor-parallel-size 2",
                          "/usr/local/bin/deltaserve serve --model-path /m --tp-size=2"}) {
    auto s = config_source_from_script(cmd, "cmd");
    ASSERT_TRUE(s) << cmd << ": " << s.status().message();
    EXPECT_EQ(s->options.tp_size, 2) << cmd;
    EXPECT_EQ(s->options.model_path, "/m") << cmd;
  }
  EXPECT_FALSE(config_source_from_script("python train.py --lr 3", "cmd"));
}

TEST(ConfigSources, StoryUnitFile) {
  auto unit = load_config_source(kFixtures + "sglang-qwen36-27b.service", "/nonexistent");
  ASSERT_TRUE(unit) << unit.status().message();
  EXPECT_EQ(unit->kind, "systemd-unit");
  EXPECT_EQ(unit->options.model_path, "Qwen/Qwen3.6-27B");  // ${MODEL} from Environment=
  EXPECT_EQ(setting(*unit, "speculative-num-steps"), "3");
  EXPECT_EQ(setting(*unit, "context-length"), "131072");
  EXPECT_EQ(setting(*unit, "max-running-requests"), "16");
  EXPECT_EQ(setting(*unit, "mem-fraction-static"), "0.88");
  EXPECT_EQ(setting(*unit, "mamba-full-memory-ratio"), "0.5");
  EXPECT_EQ(setting(*unit, "tp-size"), "2");
  EXPECT_EQ(setting(*unit, "port"), "30000");
  EXPECT_TRUE(unit->notes.empty());
  bool saw_cuda = false;
  for (const auto& [k, v] : unit->environment) saw_cuda |= (k == "env:CUDA_VISIBLE_DEVICES" && v == "0,1");
  EXPECT_TRUE(saw_cuda);
}

// systemd drops comment lines before it joins continuations (systemd.syntax(7)): a flag
// commented out inside ExecStart= must not cut the flags after it.
TEST(ConfigSources, UnitCommentInsideContinuationIsSkipped) {
  auto unit = config_source_from_unit(
      "[Service]\n"
      "# an old launcher \\\n"
      "ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m \\\n"
      "    --tp-size 2 \\\n"
      "#    --enable-hyperdrive \\\n"
      "    ; also a comment\n"
      "    --speculative-algorithm NEXTN --speculative-num-steps 3 \\\n"
      "    --context-length 131072\n",
      "commented.service");
  ASSERT_TRUE(unit) << unit.status().message();
  EXPECT_EQ(setting(*unit, "tp-size"), "2");
  EXPECT_EQ(setting(*unit, "speculative-algorithm"), "NEXTN");
  EXPECT_EQ(setting(*unit, "speculative-num-steps"), "3");
  EXPECT_EQ(setting(*unit, "context-length"), "131072");
}

// systemd reads "%%" as "%" in Environment= and ExecStart= (specifiers), and `deltaserve
// systemd-unit` writes a "%" that way: the unit reads back to what it was written from.
TEST(ConfigSources, UnitPercentSpecifierIsUnescaped) {
  ServeOptions o;
  ASSERT_TRUE(set_serve_option(o, "model-path", "/models/50%-pruned"));
  ASSERT_TRUE(set_serve_option(o, "served-model-name", "q%1"));
  UnitFileOptions u;
  u.executable = "/usr/local/bin/deltaserve";
  u.environment = {"TAG=100%"};
  auto unit = config_source_from_unit(make_systemd_unit(o, u), "written.service");
  ASSERT_TRUE(unit) << unit.status().message();
  EXPECT_EQ(unit->options.model_path, "/models/50%-pruned");
  EXPECT_EQ(setting(*unit, "served-model-name"), "q%1");
  ASSERT_FALSE(unit->environment.empty());
  EXPECT_EQ(unit->environment[0].second, "100%");
  auto instance = config_source_from_unit(
      "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m/%i\n", "x@.service");
  ASSERT_TRUE(instance) << instance.status().message();
  EXPECT_EQ(instance->options.model_path, "/m/%i");
  ASSERT_FALSE(instance->notes.empty());
  EXPECT_NE(instance->notes[0].find("%i"), std::string::npos);
}

// ExecStart= variables follow systemd, not the shell: "$VAR" alone is split into words,
// "${VAR}" is one word, "$$" is "$" (as `deltaserve systemd-unit` writes a "$").
TEST(ConfigSources, UnitVariablesExpandAsSystemdDoes) {
  auto split = config_source_from_unit(
      "[Service]\n"
      "Environment=\"SGLANG_ARGS=--tp-size 2 --context-length 65536\" MODEL=/models/q\n"
      "ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path ${MODEL} $SGLANG_ARGS\n",
      "args.service");
  ASSERT_TRUE(split) << split.status().message();
  EXPECT_EQ(split->options.model_path, "/models/q");
  EXPECT_EQ(setting(*split, "tp-size"), "2");
  EXPECT_EQ(setting(*split, "context-length"), "65536");

  ServeOptions o;
  ASSERT_TRUE(set_serve_option(o, "model-path", "/models/$weird"));
  ASSERT_TRUE(set_serve_option(o, "served-model-name", "a$$b"));
  UnitFileOptions u;
  u.executable = "/usr/local/bin/deltaserve";
  auto written = config_source_from_unit(make_systemd_unit(o, u), "written.service");
  ASSERT_TRUE(written) << written.status().message();
  EXPECT_EQ(written->options.model_path, "/models/$weird");
  EXPECT_EQ(setting(*written, "served-model-name"), "a$$b");

  // Unset: systemd passes nothing for "$X" alone and "" for "${X}"; a note says so.
  auto unset = config_source_from_unit(
      "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m $EXTRA\n", "unset.service");
  ASSERT_TRUE(unset) << unset.status().message();
  ASSERT_FALSE(unset->notes.empty());
  EXPECT_NE(unset->notes[0].find("$EXTRA"), std::string::npos) << unset->notes[0];
}

// `systemd-unit --env 'NAME=a$b'`: systemd expands no variables in Environment=, so the "$" is
// written as it is (a "$$" there would reach the server as "$$").
TEST(ConfigSources, WrittenEnvironmentKeepsDollar) {
  ServeOptions o;
  ASSERT_TRUE(set_serve_option(o, "model-path", "/m"));
  UnitFileOptions u;
  u.executable = "/usr/local/bin/deltaserve";
  u.environment = {"HF_TOKEN_FILE=/run/$ecret", "LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/opt/x"};
  const std::string text = make_systemd_unit(o, u);
  EXPECT_NE(text.find("Environment=\"HF_TOKEN_FILE=/run/$ecret\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Environment=\"LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/opt/x\"\n"), std::string::npos) << text;
  auto back = config_source_from_unit(text, "written.service");
  ASSERT_TRUE(back) << back.status().message();
  ASSERT_EQ(back->environment.size(), 2u);
  EXPECT_EQ(back->environment[0].second, "/run/$ecret");
  EXPECT_EQ(back->environment[1].second, "$LD_LIBRARY_PATH:/opt/x");
}

TEST(ConfigDiff, UnitFileVsRelaunchListsEverySpeedSetting) {
  auto a = load_config_source(kFixtures + "sglang-qwen36-27b.service", "/nonexistent");
  auto b = load_config_source(kFixtures + "relaunch.sh", "/nonexistent");
  ASSERT_TRUE(a) << a.status().message();
  ASSERT_TRUE(b) << b.status().message();
  EXPECT_EQ(b->kind, "command");
  auto rows = by_key(diff_sources(*a, *b));
  struct Want { const char* key; const char* a; const char* b; };
  for (Want w : {Want{"speculative-num-steps", "3", "1"}, Want{"speculative-num-draft-tokens", "4", "2"},
                 Want{"context-length", "131072", "auto"}, Want{"max-running-requests", "16", "auto"},
                 Want{"mem-fraction-static", "0.88", "auto"}, Want{"mamba-full-memory-ratio", "0.5", "0.9"}}) {
    ASSERT_TRUE(rows.count(w.key)) << w.key;
    EXPECT_EQ(rows[w.key].a, w.a) << w.key;
    EXPECT_EQ(rows[w.key].b, w.b) << w.key;
    EXPECT_TRUE(rows[w.key].affects_performance) << w.key;
    EXPECT_FALSE(rows[w.key].note.empty()) << w.key;
  }
  // Same on both sides: not listed.
  for (const char* same : {"tp-size", "model-path", "port", "host", "speculative-algorithm", "reasoning-parser"})
    EXPECT_FALSE(rows.count(same)) << same;
  // Six settings plus the unit's other environment (HF_HOME, HF_HUB_OFFLINE, MODEL); CUDA_VISIBLE_DEVICES
  // is 0,1 on both sides.
  int n_perf = 0;
  for (auto& [k, r] : rows) n_perf += r.affects_performance;
  EXPECT_EQ(n_perf, 6);
  EXPECT_EQ(rows.size(), 9u);
  EXPECT_TRUE(rows.count("env:HF_HOME"));
  std::string table = render_diff(diff_sources(*a, *b), "A", "B");
  EXPECT_NE(table.find("* speculative-num-steps"), std::string::npos) << table;
  auto j = nlohmann::json::parse(diff_json(diff_sources(*a, *b), *a, *b));
  EXPECT_EQ(j["differences"].size(), 9u);
}

TEST(ConfigDiff, TomlEqualsTheUnitFile) {
  auto a = load_config_source(kFixtures + "sglang-qwen36-27b.service", "/nonexistent");
  auto t = load_config_source(kFixtures + "qwen36-27b.toml", "/nonexistent");
  ASSERT_TRUE(a) << a.status().message();
  ASSERT_TRUE(t) << t.status().message();
  EXPECT_EQ(t->kind, "toml");
  EXPECT_TRUE(diff_settings(a->settings, t->settings).empty())
      << render_diff(diff_settings(a->settings, t->settings), "unit", "toml");
}

// Settings whose presence, not only value, changes what serve does: --allowed-origins turns CORS
// on (the effective config says so), and a given --mamba-full-memory-ratio is kept by the plan
// while the default is raised to fit --max-running-requests. Both once diffed as "no differences".
TEST(ConfigDiff, GivenOrDefaultIsADifferenceWhereServeTellsThemApart) {
  auto plain = config_source_from_script("deltaserve serve --model-path m", "a");
  auto cors = config_source_from_script("deltaserve serve --model-path m --allowed-origins '*'", "b");
  ASSERT_TRUE(plain && cors);
  auto rows = diff_sources(*plain, *cors);
  ASSERT_EQ(rows.size(), 1u) << render_diff(rows, "a", "b");
  EXPECT_EQ(rows[0].key, "enable-cors");
  auto auto_ratio = config_source_from_script("deltaserve serve --model-path m --max-running-requests 64", "a");
  auto pinned = config_source_from_script(
      "deltaserve serve --model-path m --max-running-requests 64 --mamba-full-memory-ratio 0.9", "b");
  ASSERT_TRUE(auto_ratio && pinned);
  rows = diff_sources(*auto_ratio, *pinned);
  ASSERT_EQ(rows.size(), 1u) << render_diff(rows, "a", "b");
  EXPECT_EQ(rows[0].key, "mamba-full-memory-ratio");
  EXPECT_EQ(rows[0].a, "0.9 (default)");
  EXPECT_EQ(rows[0].b, "0.9 (given)");
}

TEST_F(TempDir, LaunchIdAsASource) {
  auto db = LaunchDb::open(dir_);
  ASSERT_TRUE(db) << db.status().message();
  auto unit = load_config_source(kFixtures + "sglang-qwen36-27b.service", dir_);
  ASSERT_TRUE(unit);
  LaunchRecord r;
  r.model.path = "Qwen/Qwen3.6-27B";
  r.config = unit->settings;
  r.args = explicit_args(unit->options);
  auto id = (*db)->insert_launch(r);
  ASSERT_TRUE(id) << id.status().message();
  auto from_db = load_config_source(std::to_string(*id), dir_);
  ASSERT_TRUE(from_db) << from_db.status().message();
  EXPECT_EQ(from_db->label, "launch #" + std::to_string(*id));
  EXPECT_TRUE(diff_settings(unit->settings, from_db->settings).empty());
  EXPECT_EQ(from_db->options.speculative_num_steps, 3);
  auto missing = load_config_source("999", dir_);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("launch #999"), std::string::npos);
}

// Two launches with the same flags whose "auto" resolved differently (other GPUs, another version):
// `config diff` of the launch ids shows what serve actually used, not "no differences".
TEST_F(TempDir, LaunchDiffShowsWhatAutoResolvedTo) {
  auto db = LaunchDb::open(dir_);
  ASSERT_TRUE(db) << db.status().message();
  auto unit = load_config_source(kFixtures + "relaunch.sh", dir_);
  ASSERT_TRUE(unit) << unit.status().message();
  LaunchRecord r;
  r.model = {"Qwen/Qwen3.6-27B", "cfg1", "idx1"};
  r.config = unit->settings;
  r.args = explicit_args(unit->options);
  r.version = "0.1.0";
  r.host_summary = "2x NVIDIA RTX A6000 (48.0 GiB)";
  r.derived = {{"device", "cuda"}, {"plan.context_length", "131072"}, {"plan.max_running_requests", "16"},
               {"plan.kv_tokens", "600000"}};
  auto first = (*db)->insert_launch(r);
  r.version = "0.2.0";
  r.host_summary = "2x NVIDIA RTX A4000 (16.0 GiB)";
  r.derived = {{"device", "cuda"}, {"plan.context_length", "32768"}, {"plan.max_running_requests", "4"},
               {"plan.kv_tokens", "90000"}};
  auto second = (*db)->insert_launch(r);
  ASSERT_TRUE(first && second);
  auto a = load_config_source(std::to_string(*first), dir_);
  auto b = load_config_source(std::to_string(*second), dir_);
  ASSERT_TRUE(a && b);
  auto rows = by_key(diff_sources(*a, *b));
  ASSERT_TRUE(rows.count("plan.context_length")) << render_diff(diff_sources(*a, *b), "A", "B");
  EXPECT_EQ(rows["plan.context_length"].a, "131072");
  EXPECT_EQ(rows["plan.context_length"].b, "32768");
  EXPECT_TRUE(rows["plan.context_length"].affects_performance);
  EXPECT_TRUE(rows.count("plan.max_running_requests"));
  EXPECT_TRUE(rows.count("plan.kv_tokens"));
  EXPECT_TRUE(rows.count("version"));
  EXPECT_TRUE(rows.count("host"));
  EXPECT_FALSE(rows.count("device"));  // the same on both
  EXPECT_FALSE(rows.count("context-length"));  // auto on both: the flags did not change
  // A file on one side has no resolved values: nothing is compared with "(unset)".
  auto file_vs_launch = by_key(diff_sources(*unit, *a));
  EXPECT_FALSE(file_vs_launch.count("plan.context_length"));
  EXPECT_FALSE(file_vs_launch.count("version"));
}

// EnvironmentFile= is read (its settings override Environment='s); one that cannot be read and
// might set a variable ExecStart= uses is an error naming both, not "'' is not an integer".
TEST_F(TempDir, UnitEnvironmentFileIsRead) {
  const auto file = dir_ / "sglang.env";
  std::ofstream(file) << "# tuned\nCTX=131072\nSTEPS=\"3\"\nMODEL=/models/file\n";
  const std::string unit_text =
      "[Service]\nEnvironment=MODEL=/models/env STEPS=1\nEnvironmentFile=" + file.string() +
      "\nEnvironmentFile=-/nonexistent/optional.env\n"
      "ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path ${MODEL} --context-length ${CTX} "
      "--speculative-algorithm NEXTN --speculative-num-steps ${STEPS}\n";
  auto unit = config_source_from_unit(unit_text, "envfile.service");
  ASSERT_TRUE(unit) << unit.status().message();
  EXPECT_EQ(unit->options.model_path, "/models/file");
  EXPECT_EQ(setting(*unit, "context-length"), "131072");
  EXPECT_EQ(setting(*unit, "speculative-num-steps"), "3");
  int n_model = 0;
  for (const auto& [k, v] : unit->environment)
    if (k == "env:MODEL") {
      ++n_model;
      EXPECT_EQ(v, "/models/file");
    }
  EXPECT_EQ(n_model, 1);

  auto unread = config_source_from_unit(
      "[Service]\nEnvironmentFile=/nonexistent/sglang.env\n"
      "ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --context-length ${CTX}\n",
      "unread.service");
  ASSERT_FALSE(unread);
  EXPECT_NE(unread.status().message().find("$CTX"), std::string::npos) << unread.status().message();
  EXPECT_NE(unread.status().message().find("/nonexistent/sglang.env"), std::string::npos) << unread.status().message();
}

// The overrides `systemctl edit` writes (NAME.service.d/*.conf beside the unit) are read after it,
// in file-name order: an empty ExecStart= clears the command and the next line replaces it,
// Environment= adds to the unit's, a later file wins, and files not named *.conf are not read.
TEST_F(TempDir, UnitDropInsOverrideTheUnit) {
  const auto unit_path = dir_ / "sglang.service";
  std::ofstream(unit_path) << "[Service]\nEnvironment=CTX=32768\n"
                              "ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m "
                              "--context-length ${CTX} --speculative-num-steps 1\n";
  auto plain = load_config_source(unit_path.string(), dir_);
  ASSERT_TRUE(plain) << plain.status().message();
  EXPECT_EQ(setting(*plain, "context-length"), "32768");
  EXPECT_EQ(setting(*plain, "speculative-num-steps"), "1");

  std::filesystem::create_directories(dir_ / "sglang.service.d");
  std::ofstream(dir_ / "sglang.service.d" / "20-speed.conf")
      << "[Service]\nExecStart=\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m "
         "--context-length ${CTX} --speculative-algorithm NEXTN --speculative-num-steps 3 \\\n"
         "  --max-running-requests 16\n";
  std::ofstream(dir_ / "sglang.service.d" / "10-ctx.conf") << "[Service]\nEnvironment=CTX=131072\n";
  std::ofstream(dir_ / "sglang.service.d" / "30-ignored.conf.bak") << "[Service]\nEnvironment=CTX=1\n";
  auto edited = load_config_source(unit_path.string(), dir_);
  ASSERT_TRUE(edited) << edited.status().message();
  EXPECT_EQ(setting(*edited, "context-length"), "131072");
  EXPECT_EQ(setting(*edited, "speculative-num-steps"), "3");
  EXPECT_EQ(setting(*edited, "max-running-requests"), "16");
  std::string notes;
  for (const auto& n : edited->notes) notes += n + "\n";
  EXPECT_NE(notes.find("sglang.service.d/10-ctx.conf"), std::string::npos) << notes;
  EXPECT_NE(notes.find("sglang.service.d/20-speed.conf"), std::string::npos) << notes;
  EXPECT_EQ(notes.find("30-ignored"), std::string::npos) << notes;
  // The diff against the unit alone names what the overrides changed.
  auto rows = by_key(diff_sources(*plain, *edited));
  ASSERT_TRUE(rows.count("context-length"));
  EXPECT_EQ(rows["context-length"].b, "131072");

  // A drop-in that clears ExecStart= and sets none leaves the unit without a command.
  std::ofstream(dir_ / "sglang.service.d" / "40-clear.conf") << "[Service]\nExecStart=\n";
  auto cleared = load_config_source(unit_path.string(), dir_);
  ASSERT_FALSE(cleared);
  EXPECT_NE(cleared.status().message().find("no ExecStart="), std::string::npos) << cleared.status().message();
}

// Stop 54: an empty Environment= (or EnvironmentFile=) resets the list, as systemd.exec(5) says;
// ExecStart=@ takes the word after the program as argv[0], not as an argument; two API keys differ
// without either being shown.
TEST_F(TempDir, UnitEnvironmentResetArgv0AndSecretsThatDiffer) {
  const auto unit_path = dir_ / "x.service";
  std::ofstream(unit_path) << "[Service]\nEnvironment=CUDA_VISIBLE_DEVICES=0,1 CTX=4096\n"
                              "ExecStart=@/usr/bin/deltaserve deltaserve-main serve --model-path /m --context-length ${CTX}\n";
  std::filesystem::create_directories(dir_ / "x.service.d");
  std::ofstream(dir_ / "x.service.d" / "override.conf") << "[Service]\nEnvironment=\nEnvironment=CTX=8192\n";
  auto src = load_config_source(unit_path.string(), dir_);
  ASSERT_TRUE(src) << src.status().message();
  EXPECT_EQ(setting(*src, "context-length"), "8192");
  for (const auto& [k, v] : src->environment) EXPECT_NE(k, "env:CUDA_VISIBLE_DEVICES") << v;

  auto a = load_config_source("deltaserve serve --api-key aaa", dir_);
  auto b = load_config_source("deltaserve serve --api-key bbb", dir_);
  auto c = load_config_source("deltaserve serve --api-key aaa", dir_);
  ASSERT_TRUE(a && b && c);
  auto rows = by_key(diff_sources(*a, *b));
  ASSERT_TRUE(rows.count("api-key")) << render_diff(diff_sources(*a, *b), "a", "b");
  const std::string shown = render_diff(diff_sources(*a, *b), "a", "b");
  EXPECT_EQ(shown.find("aaa"), std::string::npos) << shown;
  EXPECT_EQ(shown.find("bbb"), std::string::npos) << shown;
  EXPECT_TRUE(diff_sources(*a, *c).empty());
}

// A unit in one of systemd's directories has its drop-ins read from all of them, as systemd does:
// a same-named file in a higher-priority directory (/etc over /run over /usr/lib) masks the lower
// one, a more specific directory masks a less specific one (NAME.d over a-.service.d over
// service.d), and the rest apply in file-name order across directories. A unit outside them reads
// only the drop-ins beside it.
TEST_F(TempDir, UnitDropInsAcrossSystemdsDirectories) {
  namespace fs = std::filesystem;
  const fs::path etc = dir_ / "etc", run = dir_ / "run", lib = dir_ / "lib";
  const std::vector<std::string> unit_dirs = {etc.string(), run.string(), lib.string()};
  for (const auto& d : {etc / "sg-lang.service.d", run / "sg-lang.service.d", lib / "sg-.service.d", etc / "service.d",
                        lib / "sg-lang.service.d"})
    fs::create_directories(d);
  std::ofstream(lib / "sg-lang.service") << "[Service]\nEnvironment=CTX=1 A=unit\n"
                                            "ExecStart=/usr/bin/serve --context-length ${CTX}\n";
  std::ofstream(run / "sg-lang.service.d" / "50-override.conf") << "[Service]\nEnvironment=CTX=2\n";
  std::ofstream(etc / "sg-lang.service.d" / "50-override.conf") << "[Service]\nEnvironment=CTX=3\n";  // masks /run's
  std::ofstream(run / "sg-lang.service.d" / "60-runtime.conf") << "[Service]\nEnvironment=B=run\n";
  std::ofstream(lib / "sg-.service.d" / "60-runtime.conf") << "[Service]\nEnvironment=B=prefix\n";  // masked
  std::ofstream(lib / "sg-.service.d" / "70-prefix.conf") << "[Service]\nEnvironment=C=prefix\n";
  std::ofstream(etc / "service.d" / "10-all.conf") << "[Service]\nEnvironment=A=all CTX=0\n";
  std::ofstream(lib / "sg-lang.service.d" / "80-vendor.conf") << "[Service]\nEnvironment=D=vendor\n";

  auto drop_ins = read_unit_drop_ins((lib / "sg-lang.service").string(), "sg-lang.service", unit_dirs);
  ASSERT_TRUE(drop_ins) << drop_ins.status().message();
  std::vector<std::string> names;
  for (const auto& d : *drop_ins) names.push_back(d.name);
  const std::vector<std::string> want = {(etc / "service.d" / "10-all.conf").string(),
                                         (etc / "sg-lang.service.d" / "50-override.conf").string(),
                                         (run / "sg-lang.service.d" / "60-runtime.conf").string(),
                                         (lib / "sg-.service.d" / "70-prefix.conf").string(),
                                         (lib / "sg-lang.service.d" / "80-vendor.conf").string()};
  EXPECT_EQ(names, want);
  std::ifstream in(lib / "sg-lang.service");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto unit = read_unit_exec(text, "sg-lang.service", *drop_ins);
  ASSERT_TRUE(unit) << unit.status().message();
  const std::vector<std::pair<std::string, std::string>> env = {
      {"CTX", "3"}, {"A", "all"}, {"B", "run"}, {"C", "prefix"}, {"D", "vendor"}};
  EXPECT_EQ(unit->environment, env);
  EXPECT_EQ(unit->words, (std::vector<std::string>{"/usr/bin/serve", "--context-length", "3"}));

  // The same unit copied elsewhere: only the drop-ins beside it.
  fs::create_directories(dir_ / "copy" / "sg-lang.service.d");
  fs::copy_file(lib / "sg-lang.service", dir_ / "copy" / "sg-lang.service");
  std::ofstream(dir_ / "copy" / "sg-lang.service.d" / "x.conf") << "[Service]\nEnvironment=CTX=9\n";
  auto beside = read_unit_drop_ins((dir_ / "copy" / "sg-lang.service").string(), "sg-lang.service", unit_dirs);
  ASSERT_TRUE(beside) << beside.status().message();
  ASSERT_EQ(beside->size(), 1u);
  EXPECT_EQ((*beside)[0].name, (dir_ / "copy" / "sg-lang.service.d" / "x.conf").string());
}

// systemd runs ExecStart= without a shell (systemd.syntax(7)): "|", "#" and "<" are characters of
// a word. A pipe or redirection written there reaches the server as arguments, which is an error
// naming it; the same command under /bin/sh -c '...' is read as that shell reads it, its $VARs from
// the unit's Environment=.
TEST_F(TempDir, UnitExecStartIsReadWithoutAShell) {
  auto load = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return load_config_source((dir_ / name).string(), dir_);
  };
  auto piped = load("piped.service", "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m "
                                     "--tp 2 | tee /var/log/sglang.log\n");
  ASSERT_FALSE(piped);
  EXPECT_NE(piped.status().message().find("passes '|'"), std::string::npos) << piped.status().message();
  auto redirected = load("redirected.service", "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server "
                                               "--model-path /m >/var/log/sglang.log\n");
  ASSERT_FALSE(redirected);
  EXPECT_NE(redirected.status().message().find("passes '>/var/log/sglang.log'"), std::string::npos)
      << redirected.status().message();

  auto literal = load("literal.service", "[Service]\nEnvironment=A=x|y B=1#2\n"
                                         "ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m#1 --tp 2\n");
  ASSERT_TRUE(literal) << literal.status().message();
  EXPECT_EQ(setting(*literal, "model-path"), "/m#1");
  EXPECT_EQ(setting(*literal, "tp-size"), "2");
  const KeyValues want_env = {{"env:A", "x|y"}, {"env:B", "1#2"}};
  EXPECT_EQ(literal->environment, want_env);
  // A lone ";" ends the command (systemd's separator of several); a quoted one is an argument.
  auto two = load("two.service", "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m ; "
                                 "/bin/true --tp 2\n");
  ASSERT_TRUE(two) << two.status().message();
  EXPECT_EQ(setting(*two, "tp-size"), "1");
  auto quoted = load("quoted.service", "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m "
                                       "--served-model-name \";\" --tp 2\n");
  ASSERT_TRUE(quoted) << quoted.status().message();
  EXPECT_EQ(setting(*quoted, "served-model-name"), ";");
  EXPECT_EQ(setting(*quoted, "tp-size"), "2");

  auto wrapped = load("wrapped.service",
                      "[Service]\nEnvironment=CTX=4096\n"
                      "ExecStart=/bin/sh -c 'exec python3 -m sglang.launch_server --model-path /m --tp 2 "
                      "--context-length $CTX 2>&1 | tee /var/log/sglang.log'\n");
  ASSERT_TRUE(wrapped) << wrapped.status().message();
  EXPECT_EQ(setting(*wrapped, "context-length"), "4096");
  EXPECT_EQ(setting(*wrapped, "tp-size"), "2");

  // The usual virtualenv wrapper: the script's commands are read in turn, up to the server's.
  auto venv = load("venv.service",
                   "[Service]\nEnvironment=CTX=8192\n"
                   "ExecStart=/bin/bash -c \"source /opt/venv/bin/activate && cd /srv; exec python3 -m "
                   "sglang.launch_server --model-path /m --tp 4 --context-length $CTX 2>&1 | tee /tmp/log\"\n");
  ASSERT_TRUE(venv) << venv.status().message();
  EXPECT_EQ(setting(*venv, "context-length"), "8192");
  EXPECT_EQ(setting(*venv, "tp-size"), "4");
  // And a launch script's line of commands, with the environment of the server's own.
  std::ofstream(dir_ / "launch.sh")
      << "#!/bin/sh\ncd /opt && . venv/bin/activate && CUDA_VISIBLE_DEVICES=0,1 python3 -m sglang.launch_server "
         "--model-path /m --tp 2 > log 2>&1 &\n";
  auto script = load_config_source((dir_ / "launch.sh").string(), dir_);
  ASSERT_TRUE(script) << script.status().message();
  EXPECT_EQ(setting(*script, "tp-size"), "2");
  const KeyValues script_env = {{"env:CUDA_VISIBLE_DEVICES", "0,1"}};
  EXPECT_EQ(script->environment, script_env);
}

// A launch id past int64 was an uncaught std::out_of_range (abort) in `config show/diff`.
TEST_F(TempDir, HugeLaunchIdIsAnError) {
  auto huge = load_config_source("99999999999999999999999", dir_);
  ASSERT_FALSE(huge);
  EXPECT_NE(huge.status().message().find("not a launch id"), std::string::npos) << huge.status().message();
}

TEST_F(TempDir, BadInputsGiveClearErrors) {
  auto bad = load_config_source(kFixtures + "bad-flag.service", dir_);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("--enable-hyperdrive"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("bad-flag.service"), std::string::npos);

  auto missing = load_config_source((dir_ / "nope.service").string(), dir_);
  ASSERT_FALSE(missing);

  auto unreadable = dir_ / "locked.service";
  std::ofstream(unreadable) << "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m\n";
  std::filesystem::permissions(unreadable, std::filesystem::perms::none);
  auto r = load_config_source(unreadable.string(), dir_);
  if (::geteuid() != 0) {  // root reads anything
    ASSERT_FALSE(r);
    EXPECT_NE(r.status().message().find("cannot read"), std::string::npos) << r.status().message();
  }

  auto no_exec = config_source_from_unit("[Unit]\nDescription=x\n[Service]\nType=simple\n", "empty.service");
  ASSERT_FALSE(no_exec);
  EXPECT_NE(no_exec.status().message().find("no ExecStart"), std::string::npos);

  auto other = config_source_from_unit("[Service]\nExecStart=/usr/bin/nginx -g daemon\n", "nginx.service");
  ASSERT_FALSE(other);
  EXPECT_NE(other.status().message().find("does not run"), std::string::npos);

  // A configuration that parses but would not start is reported, not refused.
  auto invalid = config_source_from_script(
      "python -m sglang.launch_server --model-path /m --speculative-algorithm NEXTN --speculative-num-steps 3 "
      "--speculative-num-draft-tokens 8", "cmd");
  ASSERT_TRUE(invalid) << invalid.status().message();
  ASSERT_FALSE(invalid->notes.empty());
  EXPECT_NE(invalid->notes[0].find("set --speculative-num-draft-tokens 4"), std::string::npos);
}

// An API key passed as `--api-key $SGLANG_API_KEY` is also the value of that variable: `config
// show` / `config diff` printed it with the environment. Any variable holding a secret's value (or
// containing it) is redacted; two different keys still differ, without either value shown.
TEST_F(TempDir, SecretInTheEnvironmentIsRedacted) {
  const auto unit_path = dir_ / "sglang.service";
  std::ofstream(unit_path) << "[Service]\nEnvironment=SGLANG_API_KEY=sk-very-secret-123 HF_HOME=/hf\n"
                              "ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m "
                              "--api-key $SGLANG_API_KEY\n";
  auto unit = load_config_source(unit_path.string(), dir_);
  ASSERT_TRUE(unit) << unit.status().message();
  EXPECT_EQ(setting(*unit, "api-key"), kRedactedValue);
  bool saw_key = false, saw_hf = false;
  for (const auto& [k, v] : unit->environment) {
    EXPECT_EQ(v.find("sk-very-secret-123"), std::string::npos) << k;
    saw_key |= k == "env:SGLANG_API_KEY" && v == kRedactedValue;
    saw_hf |= k == "env:HF_HOME" && v == "/hf";  // the others are shown as they are
  }
  EXPECT_TRUE(saw_key);
  EXPECT_TRUE(saw_hf);
  // A script's exported variable that contains the key.
  auto script = load_config_source(
      "export ARGS=\"--api-key sk-other-456 --port 3\"\npython -m sglang.launch_server --model-path /m $ARGS", dir_);
  ASSERT_TRUE(script) << script.status().message();
  for (const auto& [k, v] : script->environment) EXPECT_EQ(v.find("sk-other-456"), std::string::npos) << k;
  // The diff of two units whose keys differ says so, and prints neither key.
  const auto other_path = dir_ / "other.service";
  std::ofstream(other_path) << "[Service]\nEnvironment=SGLANG_API_KEY=sk-another-789 HF_HOME=/hf\n"
                               "ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m "
                               "--api-key $SGLANG_API_KEY\n";
  auto other = load_config_source(other_path.string(), dir_);
  ASSERT_TRUE(other) << other.status().message();
  const std::vector<DiffRow> rows = diff_sources(*unit, *other);
  const std::string shown = render_diff(rows, "a", "b") + diff_json(rows, *unit, *other);
  EXPECT_EQ(shown.find("sk-very-secret-123"), std::string::npos) << shown;
  EXPECT_EQ(shown.find("sk-another-789"), std::string::npos) << shown;
  auto by = by_key(rows);
  EXPECT_TRUE(by.count("api-key")) << shown;
  EXPECT_TRUE(by.count("env:SGLANG_API_KEY")) << shown;
  EXPECT_TRUE(diff_sources(*unit, *unit).empty());
}

// ExecStart=/bin/bash -lc '...' (and -ec, -xc, -l -c, -euo pipefail -c): the shell's options
// come before the script in any spelling; only an exact "-c" was recognised.
TEST(ConfigSources, ShellOptionsBeforeDashCAreRecognised) {
  for (const char* shell : {"/bin/bash -lc", "/bin/bash -ec", "/bin/sh -xc", "/bin/bash -l -c", "/bin/bash --login -c",
                            "/bin/bash -euo pipefail -c", "/bin/sh -c"}) {
    const std::string unit = std::string("[Service]\nEnvironment=TP=2\nExecStart=") + shell +
                             " 'source /opt/venv/bin/activate && exec python3 -m sglang.launch_server --model-path /m "
                             "--tp-size $TP 2>&1 | tee /var/log/sglang.log'\n";
    auto src = config_source_from_unit(unit, "x.service");
    ASSERT_TRUE(src) << shell << ": " << src.status().message();
    EXPECT_EQ(src->options.tp_size, 2) << shell;
    EXPECT_EQ(src->options.model_path, "/m") << shell;
  }
  // A shell without -c runs a script file: not read as a command.
  EXPECT_FALSE(config_source_from_unit("[Service]\nExecStart=/bin/bash -l /opt/run.sh\n", "x.service"));
}

// ${VAR:-default}, ${VAR-default}, ${VAR:=default} (and ${VAR=default}) in launch scripts: the
// default where the variable is unset (or, with ':', empty); := also sets it for what follows.
TEST(ConfigSources, ParameterExpansionDefaults) {
  auto w = split_command_words("x ${A:-1} ${B:-2} ${C-3} ${B-4} ${D:-${A}0} \"${E:-a b}\"", {{"A", "7"}, {"B", ""}});
  ASSERT_TRUE(w) << w.status().message();
  // (${B-4}: B is set, to "", which unquoted gives no word.)
  EXPECT_EQ(*w, (std::vector<std::string>{"x", "7", "2", "3", "70", "a b"}));
  KeyValues assigned;
  auto a = split_command_words(": ${PORT:=30001} ${PORT}", {}, WordSyntax::Shell, &assigned);
  ASSERT_TRUE(a) << a.status().message();
  EXPECT_EQ(*a, (std::vector<std::string>{":", "30001", "30001"}));
  EXPECT_EQ(assigned, (KeyValues{{"PORT", "30001"}}));
  auto script = config_source_from_script(
      "#!/bin/sh\n"
      "TP=${TP:-2}\n"
      ": ${PORT:=31000}\n"
      "CTX=\n"
      "python -m sglang.launch_server --model-path ${MODEL:-/models/qwen} --tp-size $TP --port $PORT "
      "--context-length ${CTX:-8192} --max-running-requests ${MRR-16}\n",
      "run.sh");
  ASSERT_TRUE(script) << script.status().message();
  EXPECT_EQ(script->options.model_path, "/models/qwen");
  EXPECT_EQ(script->options.tp_size, 2);
  EXPECT_EQ(script->options.port, 31000);
  EXPECT_EQ(script->options.context_length, 8192);
  EXPECT_EQ(script->options.max_running_requests, 16);
  // systemd itself expands ${NAME} only: the default form stays as written there.
  auto unit = split_command_words("x ${A:-1}", {}, WordSyntax::Systemd);
  ASSERT_TRUE(unit);
  EXPECT_EQ(unit->back(), "${A:-1}");
}

// Speculative decoding with the steps left out is the start-up probe's choice (it may turn MTP off),
// not the same configuration as --speculative-num-steps 3: the diff says auto vs 3.
TEST(ConfigDiff, SpeculativeStepsLeftToTheProbeDifferFromGivenSteps) {
  auto a = config_source_from_script("deltaserve serve --speculative-algorithm NEXTN", "a");
  auto b = config_source_from_script("deltaserve serve --speculative-algorithm NEXTN --speculative-num-steps 3", "b");
  ASSERT_TRUE(a && b);
  auto rows = by_key(diff_sources(*a, *b));
  ASSERT_TRUE(rows.count("speculative-num-steps")) << render_diff(diff_sources(*a, *b), "a", "b");
  EXPECT_EQ(rows["speculative-num-steps"].a, "auto");
  EXPECT_EQ(rows["speculative-num-steps"].b, "3");
  EXPECT_TRUE(rows["speculative-num-steps"].affects_performance);
  EXPECT_EQ(rows["speculative-num-draft-tokens"].b, "4");
}

// Synonyms are one value: SGLang's bfloat16 / bf16 KV cache, flashinfer / pytorch sampling (both
// auto here), float / float32, half / float16, safetensors / auto are not differences.
TEST(ConfigDiff, SynonymsAreNotDifferences) {
  for (const auto& [x, y] : std::vector<std::pair<std::string, std::string>>{
           {"--kv-cache-dtype bfloat16", "--kv-cache-dtype bf16"},
           {"--sampling-backend flashinfer", "--sampling-backend auto"},
           {"--sampling-backend pytorch", ""},
           {"--dtype float", "--dtype float32"},
           {"--dtype half", "--dtype float16"},
           {"--load-format safetensors", ""},
           {"--log-level critical", "--log-level error"},
           {"--speculative-algorithm MTP --speculative-num-steps 2", "--speculative-algorithm NEXTN --speculative-num-steps 2"}}) {
    auto a = config_source_from_script("python -m sglang.launch_server --model-path /m " + x, "a");
    auto b = config_source_from_script("python -m sglang.launch_server --model-path /m " + y, "b");
    ASSERT_TRUE(a && b) << x;
    EXPECT_TRUE(diff_sources(*a, *b).empty()) << x << " vs " << y << "\n" << render_diff(diff_sources(*a, *b), "a", "b");
  }
  // A launch recorded before (settings as typed) reads as the one value too.
  ConfigSource old = config_source_from_settings({{"kv-cache-dtype", "bfloat16"}, {"sampling-backend", "flashinfer"}},
                                                 {"--kv-cache-dtype", "bfloat16"}, "launch #1");
  EXPECT_EQ(setting(old, "kv-cache-dtype"), "bf16");
  EXPECT_EQ(setting(old, "sampling-backend"), "auto");
}

// Sizes are compared exactly: 1000000 and 999999 bytes were both "976.56KiB".
TEST(ConfigDiff, SizesThatDifferByAByteDiffer) {
  auto a = config_source_from_script("deltaserve serve --max-request-bytes 1000000", "a");
  auto b = config_source_from_script("deltaserve serve --max-request-bytes 999999", "b");
  ASSERT_TRUE(a && b);
  auto rows = by_key(diff_sources(*a, *b));
  ASSERT_TRUE(rows.count("max-request-bytes"));
  EXPECT_EQ(rows["max-request-bytes"].a, "1000000B");
  EXPECT_EQ(rows["max-request-bytes"].b, "999999B");
}

// SGLang's --config FILE.yaml, as a source of its own and inside a command line.
TEST_F(TempDir, YamlConfigFileIsASource) {
  const auto yaml = dir_ / "sglang.yaml";
  std::ofstream(yaml) << "model-path: /m  # comment\ntp-size: 2\nmem-fraction-static: 0.88\n";
  auto a = load_config_source(yaml.string(), dir_);
  ASSERT_TRUE(a) << a.status().message();
  EXPECT_EQ(a->kind, "yaml");
  EXPECT_EQ(setting(*a, "tp-size"), "2");
  auto b = load_config_source("python -m sglang.launch_server --config " + yaml.string(), dir_);
  ASSERT_TRUE(b) << b.status().message();
  EXPECT_EQ(setting(*b, "mem-fraction-static"), "0.88");
  auto rows = diff_sources(*a, *b);
  EXPECT_TRUE(rows.empty()) << render_diff(rows, "a", "b");
}

}  // namespace
}  // namespace deltaserve
