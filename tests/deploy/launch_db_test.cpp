// Launch records: SQLite round trip, measurements, the "a faster configuration is on record"
// warning, corrupt databases, the recorder API serve uses, and the systemd unit writer.
#include "deploy/launch_db.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "deploy/config_diff.h"
#include "deploy/systemd_unit.h"

namespace deltaserve {
namespace {

// One integer a query on `file` answers, read-only (-1: no row, or the query failed).
int query_int(const std::filesystem::path& file, const char* sql) {
  sqlite3* raw = nullptr;
  int out = -1;
  if (sqlite3_open_v2(file.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* q = nullptr;
    if (sqlite3_prepare_v2(raw, sql, -1, &q, nullptr) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW)
      out = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
  }
  sqlite3_close(raw);
  return out;
}

const std::string kFixtures = std::string(DELTASERVE_SOURCE_DIR) + "/tests/deploy/fixtures/";

class LaunchDbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ds-launch-db-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

// One measurement at concurrency 1 for the recorder's launch.
void record_speed(LaunchRecorder& rec, double output_tokens_per_s) {
  Measurement m;
  m.concurrency = 1;
  m.output_tokens_per_s = output_tokens_per_s;
  rec.record_measurement(m);
}

ServeOptions options_of(const std::string& fixture) {
  auto src = load_config_source(kFixtures + fixture, "/nonexistent");
  EXPECT_TRUE(src) << src.status().message();
  return src->options;
}

TEST_F(LaunchDbTest, RoundTripAndMeasurements) {
  auto db = LaunchDb::open(dir_);
  ASSERT_TRUE(db) << db.status().message();
  EXPECT_TRUE(std::filesystem::exists(dir_ / "launches.sqlite"));
  LaunchRecord r;
  r.hostname = "gpu-box";
  r.host_summary = "2x NVIDIA RTX A6000 (47.99 GiB)";
  r.version = "0.1.0";
  r.model = {"/srv/models/Qwen3.6-27B", "abc", "def"};
  r.config = {{"model-path", "/srv/models/Qwen3.6-27B"}, {"tp-size", "2"}};
  r.args = {"--tp-size", "2"};
  r.derived = {{"plan.kv_tokens", "348976"}};
  auto id = (*db)->insert_launch(r);
  ASSERT_TRUE(id) << id.status().message();
  Measurement m;
  m.launch_id = *id;
  m.concurrency = 1;
  m.output_tokens_per_s = 70.5;
  ASSERT_TRUE((*db)->add_measurement(m));
  m.concurrency = 4;
  m.output_tokens_per_s = 180;
  ASSERT_TRUE((*db)->add_measurement(m));
  m.launch_id = 12345;
  Status bad = (*db)->add_measurement(m);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.message().find("launch #12345"), std::string::npos);
  ASSERT_TRUE((*db)->set_stopped(*id, "2026-11-30T02:00:00Z", "ok"));

  auto got = (*db)->get(*id);
  ASSERT_TRUE(got) << got.status().message();
  EXPECT_EQ(got->model.path, "/srv/models/Qwen3.6-27B");
  EXPECT_EQ(got->config_value("tp-size"), "2");
  EXPECT_EQ(got->args, r.args);
  EXPECT_EQ(got->derived, r.derived);
  EXPECT_EQ(got->stopped_at, "2026-11-30T02:00:00Z");
  EXPECT_DOUBLE_EQ(got->best_output_tokens_per_s, 180);
  EXPECT_EQ(got->best_concurrency, 4);
  EXPECT_EQ(got->n_measurements, 2);
  auto ms = (*db)->measurements(*id);
  ASSERT_TRUE(ms);
  EXPECT_EQ(ms->size(), 2u);
  auto filtered = (*db)->list("Qwen3.6");
  ASSERT_TRUE(filtered);
  EXPECT_EQ(filtered->size(), 1u);
  auto none = (*db)->list("Llama");
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
}

// What the status page shows: the newest launches first, with their settings, state and newest
// measurements first; the limits hold; secrets never appear.
TEST_F(LaunchDbTest, RecentLaunchesJson) {
  auto db = LaunchDb::open(dir_);
  ASSERT_TRUE(db) << db.status().message();
  std::vector<int64_t> ids;
  for (int i = 0; i < 4; ++i) {
    LaunchRecord r;
    r.started_at = "2026-12-01T10:0" + std::to_string(i) + ":00Z";
    r.model = {"/srv/models/m" + std::to_string(i), "h", "w"};
    r.config = {{"context-length", std::to_string(1024 * (i + 1))}, {"max-running-requests", "8"},
                {"kv-cache-dtype", "bf16"}, {"api-key", "<redacted>"}, {"model-path", "/srv/models/m"}};
    r.derived = {{"plan.kv_tokens", std::to_string(1000 + i)}};
    auto id = (*db)->insert_launch(r);
    ASSERT_TRUE(id) << id.status().message();
    ids.push_back(*id);
  }
  ASSERT_TRUE((*db)->set_stopped(ids[0], "2026-12-01T11:00:00Z", "stopped"));
  // Launch ids[2]: three measurements (newest last), the best in the middle.
  for (double tps : {10.0, 30.0, 20.0}) {
    Measurement m;
    m.launch_id = ids[2];
    m.concurrency = static_cast<int64_t>(tps);
    m.output_tokens_per_s = tps;
    m.ttft_p50_ms = tps * 2;
    ASSERT_TRUE((*db)->add_measurement(m));
  }
  auto text = recent_launches_json(**db, 3, 2);
  ASSERT_TRUE(text) << text.status().message();
  const auto j = nlohmann::json::parse(*text);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 3u);  // the limit
  EXPECT_EQ(j[0]["launch_id"], ids[3]);
  EXPECT_EQ(j[1]["launch_id"], ids[2]);
  EXPECT_EQ(j[2]["launch_id"], ids[1]);
  EXPECT_EQ(j[0]["settings"]["context-length"], "4096");
  EXPECT_EQ(j[0]["settings"]["kv-cache-dtype"], "bf16");
  EXPECT_FALSE(j[0]["settings"].contains("api-key"));
  EXPECT_EQ(j[0]["derived"]["plan.kv_tokens"], "1003");
  EXPECT_EQ(j[0]["model_path"], "/srv/models/m3");
  EXPECT_EQ(j[0]["n_measurements"], 0);
  EXPECT_TRUE(j[0]["measurements"].empty());
  const auto& measured = j[1];
  EXPECT_EQ(measured["n_measurements"], 3);
  EXPECT_EQ(measured["best_output_tokens_per_s"], 30.0);
  EXPECT_EQ(measured["best_concurrency"], 30);
  ASSERT_EQ(measured["measurements"].size(), 2u);  // measurements_per_launch
  EXPECT_EQ(measured["measurements"][0]["output_tokens_per_s"], 20.0);  // newest first
  EXPECT_EQ(measured["measurements"][0]["ttft_p50_ms"], 40.0);
  EXPECT_EQ(measured["measurements"][1]["output_tokens_per_s"], 30.0);
  // No stop time and this process recorded no pid: not "stopped".
  EXPECT_NE(j[0]["state"], "stopped");
  auto all = recent_launches_json(**db, 10, 5);
  ASSERT_TRUE(all);
  const auto every = nlohmann::json::parse(*all);
  ASSERT_EQ(every.size(), 4u);
  EXPECT_EQ(every[3]["state"], "stopped");
  EXPECT_EQ(every[3]["stopped_at"], "2026-12-01T11:00:00Z");
  EXPECT_EQ(all->find("redacted"), std::string::npos);
}

TEST_F(LaunchDbTest, CorruptDatabaseIsAClearError) {
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ / "launches.sqlite") << "this is not a database, just some bytes that are long enough "
                                             "to fill a header of one hundred bytes or so..........................";
  auto db = LaunchDb::open(dir_);
  ASSERT_FALSE(db);
  EXPECT_NE(db.status().message().find("unusable"), std::string::npos) << db.status().message();
  EXPECT_NE(db.status().message().find("move it aside"), std::string::npos);
  // The recorder turns it into a warning; serve goes on.
  ServeOptions opts;
  ASSERT_TRUE(set_serve_option(opts, "state-dir", dir_.string()));
  LaunchRecorder rec = LaunchRecorder::start(opts, nullptr, {}, "test");
  EXPECT_EQ(rec.launch_id(), 0);
  EXPECT_NE(rec.warning().find("launch not recorded"), std::string::npos);
}

// A database another process holds locked (past the 5 s busy timeout) is healthy: the error says
// it is locked, never "unusable ... move it aside" (which would throw the launch records away).
TEST_F(LaunchDbTest, LockedDatabaseIsNotCalledUnusable) {
  {
    auto db = LaunchDb::open(dir_);
    ASSERT_TRUE(db) << db.status().message();
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ / "launches.sqlite").c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "BEGIN EXCLUSIVE; INSERT INTO meta(key, value) VALUES('held', '1')", nullptr, nullptr,
                         nullptr),
            SQLITE_OK);
  auto locked = LaunchDb::open(dir_);
  sqlite3_exec(raw, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(raw);
  ASSERT_FALSE(locked);
  EXPECT_NE(locked.status().message().find("locked"), std::string::npos) << locked.status().message();
  EXPECT_EQ(locked.status().message().find("move it aside"), std::string::npos) << locked.status().message();
  EXPECT_TRUE(LaunchDb::open(dir_));  // and once the lock is gone, it opens
}

// The status page's background read (serve) waits briefly for a lock, not SQLite's 5 s: a reader
// given a short busy timeout fails "locked" within about that long, and reads once the lock is gone.
TEST_F(LaunchDbTest, ReadingALockedDatabaseWaitsOnlyItsBusyTimeout) {
  {
    auto db = LaunchDb::open(dir_);
    ASSERT_TRUE(db) << db.status().message();
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ / "launches.sqlite").c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "BEGIN EXCLUSIVE; INSERT INTO meta(key, value) VALUES('held', '1')", nullptr, nullptr,
                         nullptr),
            SQLITE_OK);
  const auto t0 = std::chrono::steady_clock::now();
  auto locked = LaunchDb::open_for_reading(dir_, 100);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sqlite3_exec(raw, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(raw);
  ASSERT_FALSE(locked);
  EXPECT_NE(locked.status().message().find("locked"), std::string::npos) << locked.status().message();
  EXPECT_LT(took, 2.0);  // (it waited 5 s before the timeout was a parameter)
  auto reading = LaunchDb::open_for_reading(dir_, 100);
  ASSERT_TRUE(reading) << reading.status().message();
  EXPECT_TRUE(*reading);
}

// Reading (history, config show/diff of a launch id) never creates a state folder or database: a
// mistyped --state-dir used to leave an empty launches.sqlite behind.
TEST_F(LaunchDbTest, ReadingCreatesNothing) {
  auto none = LaunchDb::open_for_reading(dir_ / "typo");
  ASSERT_TRUE(none) << none.status().message();
  EXPECT_EQ(*none, nullptr);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "typo"));
  auto by_id = load_config_source("3", dir_ / "typo");
  ASSERT_FALSE(by_id);
  EXPECT_NE(by_id.status().message().find("launch #3 is not in"), std::string::npos) << by_id.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir_ / "typo"));
  ASSERT_TRUE(LaunchDb::open(dir_));
  auto some = LaunchDb::open_for_reading(dir_);
  ASSERT_TRUE(some) << some.status().message();
  EXPECT_NE(*some, nullptr);
}

// The read-only commands (history, config show/diff) open the database read-only: another
// program's SQLite file got our tables and mode 0600, and a newer schema got ALTER TABLE before its
// version was checked. Now each is a clear error and the file is as it was.
TEST_F(LaunchDbTest, ReadingLeavesForeignAndNewerDatabasesAsTheyWere) {
  namespace fs = std::filesystem;
  fs::create_directories(dir_);
  const fs::path file = dir_ / "launches.sqlite";
  auto run = [&](const char* sql) {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(file.c_str(), &raw), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(raw, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sql;
    sqlite3_close(raw);
  };
  auto tables = [&] {
    std::string out;
    sqlite3* raw = nullptr;
    EXPECT_EQ(sqlite3_open_v2(file.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
    sqlite3_exec(
        raw, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name",
        [](void* o, int, char** v, char**) {
          *static_cast<std::string*>(o) += std::string(v[0]) + " ";
          return 0;
        },
        &out, nullptr);
    sqlite3_close(raw);
    return out;
  };
  // Another program's database.
  run("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)");
  fs::permissions(file, fs::perms(0644), fs::perm_options::replace);
  const auto foreign = LaunchDb::open_for_reading(dir_);
  ASSERT_FALSE(foreign);
  EXPECT_NE(foreign.status().message().find("not a deltaserve launch database"), std::string::npos)
      << foreign.status().message();
  EXPECT_NE(foreign.status().message().find("notes"), std::string::npos) << foreign.status().message();
  EXPECT_EQ(tables(), "notes ");
  EXPECT_EQ(fs::status(file).permissions(), fs::perms(0644));
  auto by_id = load_config_source("1", dir_);
  ASSERT_FALSE(by_id);
  EXPECT_NE(by_id.status().message().find("not a deltaserve launch database"), std::string::npos);
  EXPECT_EQ(tables(), "notes ");
  // Serve's open() refuses it too, rather than adding its tables to it.
  ASSERT_FALSE(LaunchDb::open(dir_));
  EXPECT_EQ(tables(), "notes ");

  // A newer deltaserve's database (schema version 2), whose launches table lacks the columns this
  // one would add: refused by version before anything is altered.
  fs::remove(file);
  run("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
      "INSERT INTO meta VALUES('schema_version', '2');"
      "CREATE TABLE launches (id INTEGER PRIMARY KEY, started_at TEXT);"
      "CREATE TABLE measurements (id INTEGER PRIMARY KEY)");
  for (bool reading : {true, false}) {
    auto newer = reading ? LaunchDb::open_for_reading(dir_) : LaunchDb::open(dir_);
    ASSERT_FALSE(newer) << reading;
    EXPECT_NE(newer.status().message().find("schema version 2"), std::string::npos) << newer.status().message();
  }
  EXPECT_EQ(query_int(file, "SELECT COUNT(*) FROM pragma_table_info('launches')"), 2);  // id, started_at: none added
}

// A schema-1 database written before the pid columns were added is read without adding them
// (reading changes nothing); open() for a launch adds them.
TEST_F(LaunchDbTest, ReadingAnOlderSchemaOneDatabaseAltersNothing) {
  {
    auto db = LaunchDb::open(dir_);
    ASSERT_TRUE(db) << db.status().message();
    LaunchRecord r;
    r.model = {"/m", "a", "b"};
    r.config = {{"model-path", "/m"}};
    ASSERT_TRUE((*db)->insert_launch(r));
  }
  const std::filesystem::path file = dir_ / "launches.sqlite";
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(file.c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw,
                         "ALTER TABLE launches DROP COLUMN pid; ALTER TABLE launches DROP COLUMN boot_id; "
                         "ALTER TABLE launches DROP COLUMN pid_start_ticks",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(raw);
  const auto mtime = std::filesystem::last_write_time(file);
  auto reading = LaunchDb::open_for_reading(dir_);
  ASSERT_TRUE(reading) << reading.status().message();
  ASSERT_NE(*reading, nullptr);
  auto list = (*reading)->list();
  ASSERT_TRUE(list) << list.status().message();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].pid, 0);
  EXPECT_EQ((*list)[0].model.path, "/m");
  reading->reset();
  EXPECT_EQ(std::filesystem::last_write_time(file), mtime);
  EXPECT_EQ(query_int(file, "SELECT COUNT(*) FROM pragma_table_info('launches') WHERE name = 'pid'"), 0);
}

// A row whose stored settings are not JSON is reported as damaged, never shown as an empty config.
TEST_F(LaunchDbTest, DamagedRowIsReportedNotShownEmpty) {
  auto db = LaunchDb::open(dir_);
  ASSERT_TRUE(db) << db.status().message();
  LaunchRecord r;
  r.model = {"/m", "a", "b"};
  r.config = {{"model-path", "/m"}};
  auto id = (*db)->insert_launch(r);
  ASSERT_TRUE(id) << id.status().message();
  ASSERT_TRUE((*db)->get(*id));
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open((dir_ / "launches.sqlite").c_str(), &raw), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(raw, "UPDATE launches SET config_json = 'not json'", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(raw);
  auto got = (*db)->get(*id);
  ASSERT_FALSE(got);
  EXPECT_NE(got.status().message().find("is damaged: its config_json is not valid JSON"), std::string::npos)
      << got.status().message();
  auto all = (*db)->list();
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ(launch_state((*all)[0]), "damaged");
}

TEST_F(LaunchDbTest, StateDirThatIsAFile) {
  std::ofstream(dir_.string()) << "x";
  auto db = LaunchDb::open(dir_ / "sub");
  EXPECT_FALSE(db);
  std::filesystem::remove(dir_);
}

// A CUDA backend override left in a unit file's Environment= changes speed without changing a flag:
// the launch records it, `config diff` of two launches shows it, and a launch without it is a
// different configuration for the faster-configuration warning.
TEST_F(LaunchDbTest, RecorderRecordsTheEnvironmentThatChangesALaunch) {
  ServeOptions tuned = options_of("sglang-qwen36-27b.service");
  ASSERT_TRUE(set_serve_option(tuned, "state-dir", dir_.string()));
  ASSERT_EQ(std::getenv("DELTASERVE_CUDA_GDN_STAGE"), nullptr);
  ASSERT_EQ(setenv("DELTASERVE_CUDA_GDN_STAGE", "2", 1), 0);
  const KeyValues env = launch_environment();
  EXPECT_NE(std::find(env.begin(), env.end(), std::pair<std::string, std::string>("env:DELTASERVE_CUDA_GDN_STAGE", "2")),
            env.end());
  int64_t staged_id = 0;
  {
    LaunchRecorder rec = LaunchRecorder::start(tuned, nullptr, {{"device", "cuda"}}, "0.1.0");
    unsetenv("DELTASERVE_CUDA_GDN_STAGE");
    ASSERT_GT(rec.launch_id(), 0);
    staged_id = rec.launch_id();
    record_speed(rec, 75);
    rec.stop("ok");
  }
  LaunchRecorder plain = LaunchRecorder::start(tuned, nullptr, {{"device", "cuda"}}, "0.1.0");
  ASSERT_GT(plain.launch_id(), staged_id);
  // Same flags, different environment: that launch is another configuration, and faster.
  auto w = plain.faster_config_warning();
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("env:DELTASERVE_CUDA_GDN_STAGE"), std::string::npos) << *w;
  EXPECT_EQ(w->find("speculative-num-steps"), std::string::npos) << *w;
  plain.stop();

  auto db = LaunchDb::open(dir_);
  ASSERT_TRUE(db);
  auto staged = (*db)->get(staged_id);
  ASSERT_TRUE(staged);
  EXPECT_EQ(recorded_environment(*staged),
            (KeyValues{{"env:DELTASERVE_CUDA_GDN_STAGE", "2"}}));
  auto a = load_config_source(std::to_string(staged_id), dir_);
  auto b = load_config_source(std::to_string(plain.launch_id()), dir_);
  ASSERT_TRUE(a && b);
  const std::vector<DiffRow> rows = diff_sources(*a, *b);
  ASSERT_EQ(rows.size(), 1u) << render_diff(rows, "a", "b");
  EXPECT_EQ(rows[0].key, "env:DELTASERVE_CUDA_GDN_STAGE");
  EXPECT_EQ(rows[0].a, "2");
  EXPECT_EQ(rows[0].b, "(unset)");
  EXPECT_TRUE(rows[0].affects_performance);
  EXPECT_NE(rows[0].note.find("CUDA backend override"), std::string::npos);
}

TEST_F(LaunchDbTest, RecorderAndFasterConfigWarning) {
  // The tuned unit file was launched and measured at 70 tok/s; then the relaunch starts.
  ServeOptions tuned = options_of("sglang-qwen36-27b.service");
  ASSERT_TRUE(set_serve_option(tuned, "state-dir", dir_.string()));
  int64_t tuned_id = 0;
  {
    LaunchRecorder rec = LaunchRecorder::start(tuned, nullptr, {{"device", "cuda"}}, "0.1.0");
    ASSERT_EQ(rec.warning(), "");
    ASSERT_GT(rec.launch_id(), 0);
    EXPECT_FALSE(rec.faster_config_warning());  // nothing measured yet
    tuned_id = rec.launch_id();
    record_speed(rec, 70);
    rec.stop("ok");
  }
  ServeOptions relaunch = options_of("relaunch.sh");
  ASSERT_TRUE(set_serve_option(relaunch, "state-dir", dir_.string()));
  LaunchRecorder rec = LaunchRecorder::start(relaunch, nullptr, {}, "0.1.0");
  ASSERT_GT(rec.launch_id(), tuned_id);
  auto w = rec.faster_config_warning();
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("launch #" + std::to_string(tuned_id)), std::string::npos) << *w;
  EXPECT_NE(w->find("70.0 output tok/s"), std::string::npos) << *w;
  EXPECT_NE(w->find("never been measured"), std::string::npos) << *w;
  EXPECT_NE(w->find("speculative-num-steps"), std::string::npos) << *w;
  EXPECT_NE(w->find("max-running-requests"), std::string::npos) << *w;

  // Once this configuration is measured at 40 tok/s, the warning compares the two figures.
  record_speed(rec, 40);
  rec.stop();
  LaunchRecorder again = LaunchRecorder::start(relaunch, nullptr, {}, "0.1.0");
  auto w2 = again.faster_config_warning();
  ASSERT_TRUE(w2);
  EXPECT_NE(w2->find("measured at best 40.0"), std::string::npos) << *w2;
  again.stop();

  // The tuned configuration itself gets no warning (it is the fastest).
  LaunchRecorder best = LaunchRecorder::start(tuned, nullptr, {}, "0.1.0");
  EXPECT_FALSE(best.faster_config_warning()) << *best.faster_config_warning();

  auto db = LaunchDb::open(dir_);
  ASSERT_TRUE(db);
  auto first = (*db)->get(tuned_id);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->exit_status, "ok");
  EXPECT_FALSE(first->stopped_at.empty());
  EXPECT_EQ(first->config_value("speculative-num-steps"), "3");
  EXPECT_FALSE(first->started_at.empty());
}

TEST_F(LaunchDbTest, SystemdUnitRoundTripAndVerify) {
  ServeOptions tuned = options_of("qwen36-27b.toml");
  UnitFileOptions u;
  u.executable = "/usr/local/bin/deltaserve";
  u.user = "llm";
  u.environment = {"CUDA_VISIBLE_DEVICES=0,1"};
  std::string text = make_systemd_unit(tuned, u);
  EXPECT_NE(text.find("ExecStart=/usr/local/bin/deltaserve serve"), std::string::npos) << text;
  EXPECT_NE(text.find("--speculative-num-steps 3"), std::string::npos) << text;
  // The unit reads back to the same settings (state-dir pinned, config dropped).
  auto back = config_source_from_unit(text, "deltaserve.service");
  ASSERT_TRUE(back) << back.status().message() << "\n" << text;
  ServeOptions resolved = tuned;
  resolve_serve_defaults(resolved);
  auto rows = diff_settings(effective_config(resolved), back->settings);
  for (const auto& r : rows) EXPECT_TRUE(r.key == "state-dir" || r.key == "config") << r.key;
  EXPECT_EQ(systemd_quote("a b$%\""), "\"a b$$%%\\\"\"");

  // systemd-analyze verify, when available; ExecStart must name an existing executable.
  if (std::system("command -v systemd-analyze >/dev/null 2>&1") != 0) GTEST_SKIP() << "systemd-analyze missing";
  std::filesystem::create_directories(dir_);
  u.executable = "/bin/true";
  u.user.clear();
  const auto unit_path = dir_ / "deltaserve-test.service";
  std::ofstream(unit_path) << make_systemd_unit(tuned, u);
  const std::string cmd = "systemd-analyze verify " + unit_path.string() + " > " + (dir_ / "verify.log").string() + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream log(dir_ / "verify.log");
  std::string out((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  if (rc != 0 && (out.find("bus") != std::string::npos || out.find("Failed to initialize manager") != std::string::npos ||
                  out.find("Failed to setup working directory") != std::string::npos))
    GTEST_SKIP() << "systemd-analyze cannot run here: " << out;
  EXPECT_EQ(rc, 0) << out;
  // Whatever the exit code, it must not complain about our unit's syntax.
  EXPECT_EQ(out.find("Unknown key"), std::string::npos) << out;
  EXPECT_EQ(out.find("Invalid"), std::string::npos) << out;
}

// ExecStart= tells flags from values by position: a value that starts with "--" is a quoted,
// escaped value (it was written bare, as if a flag, and systemd expanded its "%b").
TEST(SystemdUnit, ValuesThatStartWithDashesAreQuotedValues) {
  auto opts = parse_serve_args_raw({"--model-path", "/srv/m", "--api-key", "--a%b", "--enable-metrics",
                                    "--served-model-name", "--x y", "--state-dir", "/var/lib/ds"});
  ASSERT_TRUE(opts) << opts.status().message();
  UnitFileOptions u;
  u.executable = "/usr/local/bin/deltaserve";
  const std::string text = make_systemd_unit(*opts, u);
  EXPECT_NE(text.find("    --api-key \"--a%%b\" \\\n"), std::string::npos) << text;
  EXPECT_NE(text.find("    --served-model-name \"--x y\" \\\n"), std::string::npos) << text;
  // A switch: no value after it.
  EXPECT_TRUE(text.find("\n    --enable-metrics \\\n") != std::string::npos ||
              text.find("\n    --enable-metrics\n") != std::string::npos)
      << text;
  EXPECT_EQ(text.find("--a%b"), std::string::npos) << text;
  auto back = config_source_from_unit(text, "written.service");
  ASSERT_TRUE(back) << back.status().message() << "\n" << text;
  EXPECT_EQ(back->options.api_key, "--a%b");
  EXPECT_EQ(back->options.served_model_name, "--x y");
  EXPECT_EQ(back->options.state_dir, "/var/lib/ds");
}

// Description=, User= and WorkingDirectory= are written raw: "%" as "%%" (systemd expands
// specifiers there), and what cannot be written raw is refused naming the option.
TEST(SystemdUnit, RawValuesEscapeSpecifiersAndRefuseWhatSystemdMisreads) {
  ServeOptions o;
  ASSERT_TRUE(set_serve_option(o, "model-path", "/m"));
  UnitFileOptions u;
  u.executable = "/usr/local/bin/deltaserve";
  u.description = "50% of %H";
  u.user = "a%Z";
  u.working_directory = "/tmp/a%q";
  ASSERT_TRUE(check_unit_file_options(u).is_ok());
  const std::string text = make_systemd_unit(o, u);
  EXPECT_NE(text.find("\nDescription=50%% of %%H\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nUser=a%%Z\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nWorkingDirectory=/tmp/a%%q\n"), std::string::npos) << text;

  const auto refused = [](UnitFileOptions x, const std::string& names) {
    const Status s = check_unit_file_options(x);
    EXPECT_FALSE(s.is_ok()) << names;
    EXPECT_NE(s.message().find(names), std::string::npos) << s.message();
  };
  UnitFileOptions base;
  base.executable = "/usr/local/bin/deltaserve";
  EXPECT_TRUE(check_unit_file_options(base).is_ok());
  UnitFileOptions x = base;
  x.description = "my svc \\";  // would continue onto the next line (the unit lost ExecStart=)
  refused(x, "--description");
  x = base, x.working_directory = "/tmp/x\\";
  refused(x, "--working-directory");
  x = base, x.user = "llm\\";
  refused(x, "--user");
  x = base, x.description = "a\nExecStartPre=/bin/rm";
  refused(x, "--description");
  x = base, x.executable = "relative/ds";
  refused(x, "--executable");
  x = base, x.working_directory = "relative";
  refused(x, "--working-directory");
  x = base, x.environment = {"A B=x"};  // systemd ignores an invalid name
  refused(x, "--env");
  x = base, x.environment = {"1A=x"};
  refused(x, "--env");
  x = base, x.environment = {"=x"};
  refused(x, "--env");
  x = base, x.user = "llm", x.user_unit = true;
  refused(x, "--user-unit");
  x = base, x.environment = {"_A1=x y", "HF_HOME=/h"}, x.user_unit = true;
  EXPECT_TRUE(check_unit_file_options(x).is_ok());
}

// The service does not run where the unit was written: relative path settings become absolute.
TEST(SystemdUnit, RelativeServePathsAreMadeAbsolute) {
  auto opts = parse_serve_args_raw({"--model-path", "models/tiny-coder", "--chat-template", "t.jinja",
                                    "--tokenizer-path", "/abs/tok", "--state-dir", "state"});
  ASSERT_TRUE(opts) << opts.status().message();
  ASSERT_TRUE(make_serve_paths_absolute(*opts, "/home/u/work").is_ok());
  EXPECT_EQ(opts->model_path, "/home/u/work/models/tiny-coder");
  EXPECT_EQ(opts->chat_template, "/home/u/work/t.jinja");
  EXPECT_EQ(opts->tokenizer_path, "/abs/tok");
  EXPECT_EQ(opts->state_dir, "/home/u/work/state");
  EXPECT_TRUE(opts->speculative_token_map.empty());
  EXPECT_FALSE(opts->is_explicit("speculative-token-map"));
}

// The unit systemd verifies with specifiers in raw values (they failed verification unescaped).
TEST_F(LaunchDbTest, SystemdUnitWithSpecifiersInRawValuesVerifies) {
  if (std::system("command -v systemd-analyze >/dev/null 2>&1") != 0) GTEST_SKIP() << "systemd-analyze missing";
  ServeOptions o;
  ASSERT_TRUE(set_serve_option(o, "model-path", "/m"));
  ASSERT_TRUE(set_serve_option(o, "api-key", "--x%Z"));  // written bare, "%Z" failed verification
  std::filesystem::create_directories(dir_ / "a%Z");
  UnitFileOptions u;
  u.executable = "/bin/true";
  u.description = "100% %Z";
  u.working_directory = (dir_ / "a%Z").string();
  const auto unit_path = dir_ / "deltaserve-spec.service";
  std::ofstream(unit_path) << make_systemd_unit(o, u);
  const std::string cmd = "systemd-analyze verify " + unit_path.string() + " > " + (dir_ / "verify.log").string() + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream log(dir_ / "verify.log");
  std::string out((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  if (rc != 0 && (out.find("bus") != std::string::npos || out.find("Failed to initialize manager") != std::string::npos))
    GTEST_SKIP() << "systemd-analyze cannot run here: " << out;
  EXPECT_EQ(out.find("specifier"), std::string::npos) << out;
  EXPECT_EQ(out.find("Invalid"), std::string::npos) << out;
  EXPECT_EQ(out.find("Failed to resolve"), std::string::npos) << out;
}

TEST_F(LaunchDbTest, ApiKeyIsNeverStoredOrPrintedAndTheDbIsPrivate) {
  const std::string secret = "sk-very-secret-0123456789";
  auto opts = parse_serve_args_raw({"--model-path", "/srv/m", "--api-key", secret, "--state-dir", dir_.string()});
  ASSERT_TRUE(opts) << opts.status().message();
  {
    LaunchRecorder rec = LaunchRecorder::start(*opts, nullptr, {}, "0.1.0");
    ASSERT_GT(rec.launch_id(), 0) << rec.warning();
    rec.stop();
  }
  const auto file = dir_ / "launches.sqlite";
  std::ifstream in(file, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  EXPECT_EQ(bytes.str().find(secret), std::string::npos) << "the key is in the database file";
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  auto db = LaunchDb::open(dir_);
  ASSERT_TRUE(db);
  auto all = (*db)->list();
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].config_value("api-key"), kRedactedValue);
  bool redacted_arg = false;
  for (const auto& a : (*all)[0].args) {
    EXPECT_EQ(a.find(secret), std::string::npos);
    redacted_arg = redacted_arg || a == kRedactedValue;
  }
  EXPECT_TRUE(redacted_arg);
  // `config show` / `config diff` of the launch, and `config show --toml` of a command line.
  auto src = load_config_source(std::to_string((*all)[0].id), dir_);
  ASSERT_TRUE(src) << src.status().message();
  for (const auto& [k, v] : src->settings) EXPECT_EQ(v.find(secret), std::string::npos) << k;
  auto cmd = load_config_source("deltaserve serve --model-path /m --api-key " + secret, dir_);
  ASSERT_TRUE(cmd) << cmd.status().message();
  for (const auto& [k, v] : cmd->settings) EXPECT_EQ(v.find(secret), std::string::npos) << k;
  const std::string toml = serve_options_to_toml(*opts);
  EXPECT_EQ(toml.find(secret), std::string::npos) << toml;
  EXPECT_NE(toml.find("# api_key is set"), std::string::npos) << toml;
  EXPECT_EQ(redact_secret_args({"--api-key=abc", "--port", "1", "--api_key", "def"}),
            (std::vector<std::string>{"--api-key=<redacted>", "--port", "1", "--api_key", "<redacted>"}));

  // A record written by an older version (plaintext) is redacted when read.
  LaunchRecord old;
  old.config = {{"api-key", secret}};
  old.args = {"--api-key", secret};
  auto id = (*db)->insert_launch(old);
  ASSERT_TRUE(id);
  auto back = (*db)->get(*id);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->config_value("api-key"), kRedactedValue);
  EXPECT_EQ(back->args, (std::vector<std::string>{"--api-key", kRedactedValue}));
}

// `config show ID --toml` of a launch writes what it ran with, booleans included (they once
// came back as not given: serving the file again turned the radix cache and CUDA graphs back on).
TEST_F(LaunchDbTest, ConfigOfALaunchKeepsItsBooleanFlags) {
  auto opts = parse_serve_args_raw({"--model-path", "/srv/m", "--disable-radix-cache", "--disable-cuda-graph",
                                    "--enable-metrics=false", "--tp-size", "2", "--state-dir", dir_.string()});
  ASSERT_TRUE(opts) << opts.status().message();
  {
    LaunchRecorder rec = LaunchRecorder::start(*opts, nullptr, {}, "0.1.0");
    ASSERT_GT(rec.launch_id(), 0) << rec.warning();
    rec.stop();
  }
  auto db = LaunchDb::open(dir_);
  ASSERT_TRUE(db);
  auto all = (*db)->list();
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 1u);
  auto src = load_config_source(std::to_string((*all)[0].id), dir_);
  ASSERT_TRUE(src) << src.status().message();
  for (const char* name : {"disable-radix-cache", "disable-cuda-graph", "enable-metrics", "tp-size"})
    EXPECT_TRUE(src->options.is_explicit(name)) << name;
  const std::string toml = serve_options_to_toml(src->options);
  EXPECT_NE(toml.find("disable_radix_cache = true"), std::string::npos) << toml;
  EXPECT_NE(toml.find("disable_cuda_graph = true"), std::string::npos) << toml;
  EXPECT_NE(toml.find("enable_metrics = false"), std::string::npos) << toml;
  EXPECT_NE(toml.find("tp_size = 2"), std::string::npos) << toml;
}

// Stop 54: a model path or flag value with bytes that are not UTF-8 threw out of the JSON writer
// while the launch was recorded (serve aborted after its plan); the record keeps them as U+FFFD.
TEST_F(LaunchDbTest, SettingsThatAreNotUtf8AreRecorded) {
  auto opts = parse_serve_args_raw({"--model-path", "/srv/m\xff", "--served-model-name", "a\xfe", "--state-dir", dir_.string()});
  ASSERT_TRUE(opts) << opts.status().message();
  {
    LaunchRecorder rec = LaunchRecorder::start(*opts, nullptr, {{"note", "x\xff"}}, "0.1.0");
    ASSERT_GT(rec.launch_id(), 0) << rec.warning();
    rec.stop();
    EXPECT_EQ(rec.warning(), "");
  }
  auto db = LaunchDb::open(dir_);
  ASSERT_TRUE(db);
  auto all = (*db)->list();
  ASSERT_TRUE(all);
  ASSERT_EQ(all->size(), 1u);
  EXPECT_NE((*all)[0].config_value("served-model-name").find("a\xef\xbf\xbd"), std::string::npos)
      << (*all)[0].config_value("served-model-name");
  auto page = recent_launches_json(**db, 5, 5);
  ASSERT_TRUE(page) << page.status().message();
}

TEST_F(LaunchDbTest, LaunchStateFromPidBootIdAndStartTime) {
  auto db = LaunchDb::open(dir_);
  ASSERT_TRUE(db);
  // A child that is alive while recorded, then killed.
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pid_t child = ::fork();
  if (child == 0) {
    char c;
    (void)::read(pipefd[0], &c, 1);  // blocks until the parent closes the pipe
    ::_exit(0);
  }
  LaunchRecord r;
  r.pid = child;
  r.boot_id = current_boot_id();
  r.pid_start_ticks = process_start_ticks(child);
  ASSERT_FALSE(r.boot_id.empty());
  ASSERT_GT(r.pid_start_ticks, 0);
  auto id = (*db)->insert_launch(r);
  ASSERT_TRUE(id);
  EXPECT_EQ(launch_state(*(*db)->get(*id)), "running");
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(pipefd[0]);
  ::close(pipefd[1]);
  EXPECT_EQ(launch_state(*(*db)->get(*id)), "died");

  LaunchRecord me = r;
  me.pid = ::getpid();
  me.pid_start_ticks = process_start_ticks(me.pid);
  EXPECT_EQ(launch_state(me), "running");
  me.pid_start_ticks += 1;  // the pid now belongs to another process
  EXPECT_EQ(launch_state(me), "died");
  me.pid_start_ticks -= 1;
  me.boot_id = "another-boot";
  EXPECT_EQ(launch_state(me), "died");
  LaunchRecord legacy;  // recorded before pids were
  EXPECT_EQ(launch_state(legacy), "running?");
  legacy.stopped_at = "2026-01-01T00:00:00Z";
  legacy.exit_status = "stopped";
  EXPECT_EQ(launch_state(legacy), "stopped");

  // The recorder: its own pid while running; "failed" when destroyed without stop().
  auto opts = parse_serve_args_raw({"--model-path", "/srv/m", "--state-dir", dir_.string()});
  ASSERT_TRUE(opts);
  int64_t rec_id = 0;
  {
    LaunchRecorder rec = LaunchRecorder::start(*opts, nullptr, {}, "0.1.0");
    rec_id = rec.launch_id();
    auto live = (*db)->get(rec_id);
    ASSERT_TRUE(live);
    EXPECT_EQ(live->pid, ::getpid());
    EXPECT_EQ(launch_state(*live), "running");
  }
  EXPECT_EQ(launch_state(*(*db)->get(rec_id)), "failed");
}

}  // namespace
}  // namespace deltaserve
