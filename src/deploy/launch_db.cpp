#include "deploy/launch_db.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <tuple>
#include <map>

#include <nlohmann/json.hpp>

#include "backend/cuda_option_env.h"
#include "deploy/config_diff.h"
#include "deploy/hardware.h"
#include "util/json_parse.h"

namespace deltaserve {
namespace fs = std::filesystem;
namespace {

constexpr int kSchemaVersion = 1;

const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS launches (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  started_at TEXT NOT NULL,
  stopped_at TEXT NOT NULL DEFAULT '',
  exit_status TEXT NOT NULL DEFAULT '',
  hostname TEXT NOT NULL DEFAULT '',
  host_summary TEXT NOT NULL DEFAULT '',
  cpu_model TEXT NOT NULL DEFAULT '',
  gpus TEXT NOT NULL DEFAULT '',
  version TEXT NOT NULL DEFAULT '',
  model_path TEXT NOT NULL DEFAULT '',
  model_config_hash TEXT NOT NULL DEFAULT '',
  weight_index_hash TEXT NOT NULL DEFAULT '',
  config_json TEXT NOT NULL DEFAULT '{}',
  args_json TEXT NOT NULL DEFAULT '[]',
  derived_json TEXT NOT NULL DEFAULT '{}',
  pid INTEGER NOT NULL DEFAULT 0,
  boot_id TEXT NOT NULL DEFAULT '',
  pid_start_ticks INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS measurements (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  launch_id INTEGER NOT NULL REFERENCES launches(id),
  measured_at TEXT NOT NULL,
  source TEXT NOT NULL,
  concurrency INTEGER NOT NULL DEFAULT 0,
  n_requests INTEGER NOT NULL DEFAULT 0,
  output_tokens_per_s REAL NOT NULL DEFAULT 0,
  request_throughput REAL NOT NULL DEFAULT 0,
  ttft_p50_ms REAL NOT NULL DEFAULT 0, ttft_p99_ms REAL NOT NULL DEFAULT 0,
  itl_p50_ms REAL NOT NULL DEFAULT 0, itl_p99_ms REAL NOT NULL DEFAULT 0,
  e2e_p50_ms REAL NOT NULL DEFAULT 0, e2e_p99_ms REAL NOT NULL DEFAULT 0,
  accept_length REAL NOT NULL DEFAULT 0,
  details_json TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS measurements_launch ON measurements(launch_id);
)sql";

// RAII prepared statement.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  bool ok() const { return rc_ == SQLITE_OK; }
  std::string error() const { return sqlite3_errmsg(db_); }
  void bind(int i, const std::string& v) { sqlite3_bind_text(s_, i, v.c_str(), static_cast<int>(v.size()), SQLITE_TRANSIENT); }
  void bind(int i, int64_t v) { sqlite3_bind_int64(s_, i, v); }
  void bind(int i, double v) { sqlite3_bind_double(s_, i, v); }
  int step() { return sqlite3_step(s_); }
  std::string text(int col) const {
    const unsigned char* t = sqlite3_column_text(s_, col);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
  int64_t i64(int col) const { return sqlite3_column_int64(s_, col); }
  double f64(int col) const { return sqlite3_column_double(s_, col); }

 private:
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
  int rc_;
};

std::string kv_to_json(const KeyValues& kv) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [k, v] : kv) j[k] = v;
  return dump_lossy(j);
}

KeyValues kv_from_json(const std::string& text) {
  KeyValues out;
  auto j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (!j.is_object()) return out;
  for (auto& [k, v] : j.items()) out.emplace_back(k, v.is_string() ? v.get<std::string>() : dump_lossy(v));
  return out;
}

std::vector<std::string> list_from_json(const std::string& text) {
  std::vector<std::string> out;
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_array()) return out;
  for (auto& v : j)
    if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

const char* kLaunchColumns =
    "l.id, l.started_at, l.stopped_at, l.exit_status, l.hostname, l.host_summary, l.cpu_model, l.gpus, "
    "l.version, l.model_path, l.model_config_hash, l.weight_index_hash, l.config_json, l.args_json, "
    "l.derived_json, "
    "(SELECT MAX(output_tokens_per_s) FROM measurements m WHERE m.launch_id = l.id), "
    "(SELECT concurrency FROM measurements m WHERE m.launch_id = l.id ORDER BY output_tokens_per_s DESC LIMIT 1), "
    "(SELECT COUNT(*) FROM measurements m WHERE m.launch_id = l.id), "
    "l.pid, l.boot_id, l.pid_start_ticks";

LaunchRecord read_launch(const Stmt& s) {
  LaunchRecord r;
  r.id = s.i64(0);
  r.started_at = s.text(1);
  r.stopped_at = s.text(2);
  r.exit_status = s.text(3);
  r.hostname = s.text(4);
  r.host_summary = s.text(5);
  r.cpu_model = s.text(6);
  r.gpus = s.text(7);
  r.version = s.text(8);
  r.model.path = s.text(9);
  r.model.config_hash = s.text(10);
  r.model.weight_index_hash = s.text(11);
  // Records written before secrets were redacted at recording time are redacted on reading.
  // A column that is not the JSON it should be is reported (history, config show), not read as empty.
  for (auto [col, text, want_array] : {std::tuple{"config_json", s.text(12), false}, {"args_json", s.text(13), true},
                                      {"derived_json", s.text(14), false}}) {
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (r.damaged.empty() && (want_array ? !j.is_array() : !j.is_object())) r.damaged = col;
  }
  r.config = redact_secret_settings(kv_from_json(s.text(12)));
  r.args = redact_secret_args(list_from_json(s.text(13)));
  r.derived = kv_from_json(s.text(14));
  r.best_output_tokens_per_s = s.f64(15);
  r.best_concurrency = s.i64(16);
  r.n_measurements = s.i64(17);
  r.pid = s.i64(18);
  r.boot_id = s.text(19);
  r.pid_start_ticks = s.i64(20);
  return r;
}

}  // namespace

std::string utc_now_iso() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string current_boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

int64_t process_start_ticks(int64_t pid) {
  if (pid <= 0) return 0;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; fields restart after
  // the last ')'. starttime is field 22, the 20th after the ')'.
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 1));
  std::string field;
  for (int i = 0; i < 20 && rest >> field; ++i) {
  }
  try {
    return std::stoll(field);
  } catch (...) {
    return 0;
  }
}

std::string launch_state(const LaunchRecord& r) {
  if (!r.damaged.empty()) return "damaged";  // (its stored settings cannot be read)
  if (!r.stopped_at.empty()) return r.exit_status.empty() ? "stopped" : r.exit_status;
  if (r.pid <= 0) return "running?";
  const bool same_boot = !r.boot_id.empty() && r.boot_id == current_boot_id();
  const bool alive = same_boot && process_start_ticks(r.pid) == r.pid_start_ticks && r.pid_start_ticks > 0;
  return alive ? "running" : "died";
}

std::string LaunchRecord::config_value(const std::string& key) const {
  for (const auto& [k, v] : config)
    if (k == key) return v;
  return "";
}

ModelIdentity identify_model(const std::string& model_path) {
  ModelIdentity id;
  std::error_code ec;
  fs::path p(model_path);
  id.path = fs::exists(p, ec) ? fs::absolute(p, ec).lexically_normal().string() : model_path;
  if (fs::is_directory(p, ec)) {
    id.config_hash = file_fingerprint((p / "config.json").string());
    std::string index = file_fingerprint((p / "model.safetensors.index.json").string());
    if (index.empty()) {
      std::vector<std::string> parts;
      for (const auto& e : fs::directory_iterator(p, ec))
        if (e.path().extension() == ".safetensors")
          parts.push_back(e.path().filename().string() + ":" + std::to_string(e.file_size(ec)));
      std::sort(parts.begin(), parts.end());
      std::string joined;
      for (const auto& s : parts) joined += s + "\n";
      if (!joined.empty()) index = text_fingerprint(joined);
    }
    id.weight_index_hash = index;
  } else if (fs::is_regular_file(p, ec)) {
    id.config_hash = file_fingerprint(p.string());
  }
  return id;
}

namespace {

// A SQLite error of the launch database, as the user can act on it: a database that another process
// holds locked past the busy timeout is fine (moving it aside would lose every record: wait); any
// other failure ("file is not a database") makes it unusable here.
Status db_error(sqlite3* db, const fs::path& path, const std::string& message) {
  const int rc = sqlite3_errcode(db);
  if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED)
    return error("launch database ", path.string(), " is locked by another process (", message,
                 "); try again once it has finished writing");
  return error("launch database ", path.string(), " is unusable (", message, "); move it aside to start a new one");
}

// What a database file holds, read before anything is written to it.
struct SchemaState {
  bool meta = false, launches = false, measurements = false;
  std::vector<std::string> other_tables;
  std::string version;  // meta's schema_version ("" if none)
  bool empty() const { return !meta && !launches && !measurements && other_tables.empty(); }
};

Result<SchemaState> inspect_schema(sqlite3* db, const fs::path& path) {
  SchemaState st;
  {
    Stmt q(db, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name");
    if (!q.ok()) return db_error(db, path, q.error());
    int rc;
    while ((rc = q.step()) == SQLITE_ROW) {
      const std::string name = q.text(0);
      if (name == "meta") st.meta = true;
      else if (name == "launches") st.launches = true;
      else if (name == "measurements") st.measurements = true;
      else if (name.rfind("sqlite_", 0) != 0) st.other_tables.push_back(name);
    }
    if (rc != SQLITE_DONE) return db_error(db, path, q.error());
  }
  if (st.meta) {
    Stmt q(db, "SELECT value FROM meta WHERE key = 'schema_version'");
    if (!q.ok()) return db_error(db, path, q.error());
    if (q.step() == SQLITE_ROW) st.version = q.text(0);
  }
  return st;
}

// A file with tables that are not this schema's, or of another schema version, is refused before
// anything is created or altered in it: it is someone else's database, or a newer deltaserve's.
Status refuse_foreign_schema(const SchemaState& st, const fs::path& path) {
  if (!st.empty() && (!st.meta || !st.launches)) {
    std::string tables;
    for (const auto& t : st.other_tables) tables += (tables.empty() ? "" : ", ") + t;
    return error("launch database ", path.string(), " is not a deltaserve launch database (",
                 tables.empty() ? std::string("no meta and launches tables") : "its tables: " + tables,
                 "); it was left as it is: give --state-dir a folder of its own, or move the file aside");
  }
  if (!st.version.empty() && st.version != std::to_string(kSchemaVersion))
    return error("launch database ", path.string(), " has schema version ", st.version, ", this deltaserve reads ",
                 kSchemaVersion, " (it was left as it is)");
  return Status::ok();
}

// Columns added after the first release of schema 1 (additive: older binaries still read it).
constexpr const char* kAddedLaunchColumns[] = {"pid INTEGER NOT NULL DEFAULT 0", "boot_id TEXT NOT NULL DEFAULT ''",
                                               "pid_start_ticks INTEGER NOT NULL DEFAULT 0"};

std::string column_name(const char* column) { return std::string(column).substr(0, std::string(column).find(' ')); }

Result<bool> has_launch_column(sqlite3* db, const fs::path& path, const std::string& name) {
  Stmt q(db, "SELECT COUNT(*) FROM pragma_table_info('launches') WHERE name = ?");
  if (!q.ok()) return error("launch database ", path.string(), ": ", q.error());
  q.bind(1, name);
  return q.step() == SQLITE_ROW && q.i64(0) > 0;
}

}  // namespace

Result<std::unique_ptr<LaunchDb>> LaunchDb::open(const fs::path& state_dir) {
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec) return error("cannot create state folder ", state_dir.string(), ": ", ec.message());
  std::unique_ptr<LaunchDb> db(new LaunchDb());
  db->path_ = file_in(state_dir);
  db->launch_columns_ = kLaunchColumns;
  // Owner-only (0600): the records hold command lines and paths. Created that way before SQLite
  // opens it (its journals copy the mode), and tightened below if an older file is wider.
  {
    const int fd = ::open(db->path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) ::close(fd);
  }
  if (sqlite3_open_v2(db->path_.c_str(), &db->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) != SQLITE_OK)
    return error("cannot open launch database ", db->path_.string(), ": ",
                 db->db_ ? sqlite3_errmsg(db->db_) : "out of memory");
  sqlite3_busy_timeout(db->db_, 5000);
  // A corrupt file fails here ("file is not a database"); a foreign or newer schema is refused
  // before the schema below creates or alters anything in it, or its mode is changed.
  DS_ASSIGN_OR_RETURN(SchemaState st, inspect_schema(db->db_, db->path_));
  DS_RETURN_IF_ERROR(refuse_foreign_schema(st, db->path_));
  fs::permissions(db->path_, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace, ec);
  if (Status s = db->exec(kSchema); !s) return db_error(db->db_, db->path_, s.message());
  for (const char* column : kAddedLaunchColumns) {
    DS_ASSIGN_OR_RETURN(bool present, has_launch_column(db->db_, db->path_, column_name(column)));
    if (!present) DS_RETURN_IF_ERROR(db->exec(("ALTER TABLE launches ADD COLUMN " + std::string(column)).c_str()));
  }
  if (st.version.empty())
    DS_RETURN_IF_ERROR(db->exec("INSERT OR IGNORE INTO meta(key, value) VALUES('schema_version', '1')"));
  return db;
}

Result<std::unique_ptr<LaunchDb>> LaunchDb::open_for_reading(const fs::path& state_dir, int busy_timeout_ms) {
  // Read-only, in every sense: SQLITE_OPEN_READONLY, nothing created (no folder, file, table or
  // schema version), no column added, no permission changed. The file may be another program's
  // (a mistyped --state-dir): a foreign schema is an error that says so, and the file is as it was.
  std::error_code ec;
  const fs::path path = file_in(state_dir);
  if (!fs::exists(path, ec)) return std::unique_ptr<LaunchDb>();
  std::unique_ptr<LaunchDb> db(new LaunchDb());
  db->path_ = path;
  db->launch_columns_ = kLaunchColumns;
  if (sqlite3_open_v2(path.c_str(), &db->db_, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK)
    return error("cannot open launch database ", path.string(), ": ", db->db_ ? sqlite3_errmsg(db->db_) : "out of memory");
  sqlite3_busy_timeout(db->db_, busy_timeout_ms);
  DS_ASSIGN_OR_RETURN(SchemaState st, inspect_schema(db->db_, path));
  if (st.empty()) return std::unique_ptr<LaunchDb>();  // created, never written: no launches yet
  DS_RETURN_IF_ERROR(refuse_foreign_schema(st, path));
  if (!st.measurements)
    return error("launch database ", path.string(), " is not a deltaserve launch database (no measurements table); "
                 "it was left as it is");
  // A schema-1 file written before the added columns: read as their defaults (open() adds them).
  for (const char* column : kAddedLaunchColumns) {
    const std::string name = column_name(column);
    DS_ASSIGN_OR_RETURN(bool present, has_launch_column(db->db_, path, name));
    if (present) continue;
    const std::string from = "l." + name, to = name == "boot_id" ? "''" : "0";
    std::string& cols = db->launch_columns_;
    for (size_t at = cols.find(from); at != std::string::npos; at = cols.find(from, at + 1)) {
      const size_t after = at + from.size();  // the whole name ("l.pid", not "l.pid_start_ticks")
      if (after < cols.size() && (std::isalnum(static_cast<unsigned char>(cols[after])) || cols[after] == '_')) continue;
      cols.replace(at, from.size(), to);
    }
  }
  return db;
}

LaunchDb::~LaunchDb() {
  if (db_) sqlite3_close(db_);
}

Status LaunchDb::exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    return Status::error(msg);
  }
  return Status::ok();
}

Result<int64_t> LaunchDb::insert_launch(const LaunchRecord& r) {
  Stmt s(db_,
         "INSERT INTO launches(started_at, stopped_at, exit_status, hostname, host_summary, cpu_model, gpus, "
         "version, model_path, model_config_hash, weight_index_hash, config_json, args_json, derived_json, "
         "pid, boot_id, pid_start_ticks) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  if (!s.ok()) return error("launch database: ", s.error());
  s.bind(1, r.started_at.empty() ? utc_now_iso() : r.started_at);
  s.bind(2, r.stopped_at);
  s.bind(3, r.exit_status);
  s.bind(4, r.hostname);
  s.bind(5, r.host_summary);
  s.bind(6, r.cpu_model);
  s.bind(7, r.gpus);
  s.bind(8, r.version);
  s.bind(9, r.model.path);
  s.bind(10, r.model.config_hash);
  s.bind(11, r.model.weight_index_hash);
  s.bind(12, kv_to_json(r.config));
  s.bind(13, dump_lossy(nlohmann::json(r.args)));
  s.bind(14, kv_to_json(r.derived));
  s.bind(15, r.pid);
  s.bind(16, r.boot_id);
  s.bind(17, r.pid_start_ticks);
  if (s.step() != SQLITE_DONE) return error("launch database: cannot record the launch: ", s.error());
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db_));
}

Status LaunchDb::set_stopped(int64_t id, const std::string& stopped_at, const std::string& exit_status) {
  Stmt s(db_, "UPDATE launches SET stopped_at = ?, exit_status = ? WHERE id = ?");
  if (!s.ok()) return error("launch database: ", s.error());
  s.bind(1, stopped_at);
  s.bind(2, exit_status);
  s.bind(3, id);
  if (s.step() != SQLITE_DONE) return error("launch database: ", s.error());
  return Status::ok();
}

Status LaunchDb::set_derived(int64_t id, const std::string& key, const std::string& value) {
  KeyValues derived;
  {
    Stmt q(db_, "SELECT derived_json FROM launches WHERE id = ?");
    if (!q.ok()) return error("launch database: ", q.error());
    q.bind(1, id);
    if (q.step() != SQLITE_ROW) return error("launch #", id, " is not in ", path_.string());
    derived = kv_from_json(q.text(0));
  }
  auto it = std::find_if(derived.begin(), derived.end(), [&](const auto& kv) { return kv.first == key; });
  if (it != derived.end()) it->second = value;
  else derived.emplace_back(key, value);
  Stmt s(db_, "UPDATE launches SET derived_json = ? WHERE id = ?");
  if (!s.ok()) return error("launch database: ", s.error());
  s.bind(1, kv_to_json(derived));
  s.bind(2, id);
  if (s.step() != SQLITE_DONE) return error("launch database: ", s.error());
  return Status::ok();
}

Status LaunchDb::add_measurement(const Measurement& m) {
  {
    Stmt q(db_, "SELECT COUNT(*) FROM launches WHERE id = ?");
    if (!q.ok()) return error("launch database: ", q.error());
    q.bind(1, m.launch_id);
    if (q.step() != SQLITE_ROW || q.i64(0) == 0)
      return error("launch #", m.launch_id, " is not in ", path_.string());
  }
  Stmt s(db_,
         "INSERT INTO measurements(launch_id, measured_at, source, concurrency, n_requests, output_tokens_per_s, "
         "request_throughput, ttft_p50_ms, ttft_p99_ms, itl_p50_ms, itl_p99_ms, e2e_p50_ms, e2e_p99_ms, "
         "accept_length, details_json) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  if (!s.ok()) return error("launch database: ", s.error());
  s.bind(1, m.launch_id);
  s.bind(2, m.measured_at.empty() ? utc_now_iso() : m.measured_at);
  s.bind(3, m.source);
  s.bind(4, m.concurrency);
  s.bind(5, m.n_requests);
  s.bind(6, m.output_tokens_per_s);
  s.bind(7, m.request_throughput);
  s.bind(8, m.ttft_p50_ms);
  s.bind(9, m.ttft_p99_ms);
  s.bind(10, m.itl_p50_ms);
  s.bind(11, m.itl_p99_ms);
  s.bind(12, m.e2e_p50_ms);
  s.bind(13, m.e2e_p99_ms);
  s.bind(14, m.accept_length);
  s.bind(15, m.details_json.empty() ? std::string("{}") : m.details_json);
  if (s.step() != SQLITE_DONE) return error("launch database: ", s.error());
  return Status::ok();
}

Result<std::vector<LaunchRecord>> LaunchDb::list(const std::string& model_filter, int limit) {
  std::string sql = "SELECT " + launch_columns_ +
                    " FROM launches l WHERE instr(l.model_path, ?) > 0 ORDER BY l.id DESC LIMIT ?";
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return error("launch database: ", s.error());
  s.bind(1, model_filter);
  s.bind(2, static_cast<int64_t>(limit));
  std::vector<LaunchRecord> out;
  int rc;
  while ((rc = s.step()) == SQLITE_ROW) out.push_back(read_launch(s));
  if (rc != SQLITE_DONE) return error("launch database: ", s.error());
  return out;
}

Result<LaunchRecord> LaunchDb::get(int64_t id) {
  std::string sql = "SELECT " + launch_columns_ + " FROM launches l WHERE l.id = ?";
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return error("launch database: ", s.error());
  s.bind(1, id);
  if (s.step() != SQLITE_ROW) return error("launch #", id, " is not in ", path_.string());
  LaunchRecord r = read_launch(s);
  if (!r.damaged.empty())
    return error("launch #", id, " in ", path_.string(), " is damaged: its ", r.damaged, " is not valid JSON");
  return r;
}

Result<std::vector<Measurement>> LaunchDb::measurements(int64_t id) {
  Stmt s(db_,
         "SELECT launch_id, measured_at, source, concurrency, n_requests, output_tokens_per_s, request_throughput, "
         "ttft_p50_ms, ttft_p99_ms, itl_p50_ms, itl_p99_ms, e2e_p50_ms, e2e_p99_ms, accept_length, details_json "
         "FROM measurements WHERE launch_id = ? ORDER BY id");
  if (!s.ok()) return error("launch database: ", s.error());
  s.bind(1, id);
  std::vector<Measurement> out;
  while (s.step() == SQLITE_ROW) {
    Measurement m;
    m.launch_id = s.i64(0);
    m.measured_at = s.text(1);
    m.source = s.text(2);
    m.concurrency = s.i64(3);
    m.n_requests = s.i64(4);
    m.output_tokens_per_s = s.f64(5);
    m.request_throughput = s.f64(6);
    m.ttft_p50_ms = s.f64(7);
    m.ttft_p99_ms = s.f64(8);
    m.itl_p50_ms = s.f64(9);
    m.itl_p99_ms = s.f64(10);
    m.e2e_p50_ms = s.f64(11);
    m.e2e_p99_ms = s.f64(12);
    m.accept_length = s.f64(13);
    m.details_json = s.text(14);
    out.push_back(std::move(m));
  }
  return out;
}

std::string performance_fingerprint(const KeyValues& config, const KeyValues& environment) {
  std::string joined;
  for (const auto& [k, v] : config) {
    const FlagSpec* f = find_serve_flag(k);
    if (f && f->affects_performance) joined += k + "=" + v + "\n";
  }
  for (const auto& [k, v] : environment) joined += k + "=" + v + "\n";
  return text_fingerprint(joined);
}

KeyValues launch_environment() {
  KeyValues env;
  for (const char* name : {"CUDA_VISIBLE_DEVICES", "DELTASERVE_TP_DEVICES", "DELTASERVE_TP_DEVICE_BARRIER"})
    if (const char* v = std::getenv(name)) env.emplace_back(std::string("env:") + name, v);
  for (const auto& [k, v] : cuda_option_variables()) env.emplace_back("env:" + k, v);
  std::sort(env.begin(), env.end());
  return env;
}

KeyValues recorded_environment(const LaunchRecord& record) {
  KeyValues env;
  for (const auto& [k, v] : record.derived)
    if (k.rfind("env:", 0) == 0) env.emplace_back(k, v);
  return env;
}

KeyValues resolved_launch_values(const LaunchRecord& r) {
  KeyValues out;
  for (const char* k : {"device", "plan.context_length", "plan.max_running_requests", "plan.kv_tokens",
                        "plan.state_slots", "plan.mem_fraction_static", "spec.num_steps"})
    for (const auto& [dk, dv] : r.derived)
      if (dk == k) out.emplace_back(dk, dv);
  out.emplace_back("version", r.version);
  out.emplace_back("host", r.host_summary);
  out.emplace_back("model.config_hash", r.model.config_hash);
  out.emplace_back("model.weight_index_hash", r.model.weight_index_hash);
  return out;
}

std::optional<std::string> faster_launch_warning(const LaunchRecord& current,
                                                 const std::vector<LaunchRecord>& launches) {
  const std::string fp = performance_fingerprint(current.config, recorded_environment(current));
  double mine = 0;
  const LaunchRecord* best = nullptr;
  for (const auto& l : launches) {
    if (l.id == current.id || l.model.config_hash != current.model.config_hash ||
        l.host_summary != current.host_summary || l.n_measurements == 0)
      continue;
    if (performance_fingerprint(l.config, recorded_environment(l)) == fp) {
      mine = std::max(mine, l.best_output_tokens_per_s);
    } else if (!best || l.best_output_tokens_per_s > best->best_output_tokens_per_s) {
      best = &l;
    }
  }
  if (!best || best->best_output_tokens_per_s <= mine) return std::nullopt;
  char head[512];
  if (mine > 0)
    std::snprintf(head, sizeof head,
                  "launch #%lld of this model on this host measured %.1f output tok/s (concurrency %lld, %s); "
                  "this configuration measured at best %.1f. Differences (that launch -> this one):\n",
                  static_cast<long long>(best->id), best->best_output_tokens_per_s,
                  static_cast<long long>(best->best_concurrency), best->started_at.c_str(), mine);
  else
    std::snprintf(head, sizeof head,
                  "launch #%lld of this model on this host measured %.1f output tok/s (concurrency %lld, %s); "
                  "this configuration has never been measured. Differences (that launch -> this one):\n",
                  static_cast<long long>(best->id), best->best_output_tokens_per_s,
                  static_cast<long long>(best->best_concurrency), best->started_at.c_str());
  auto rows = diff_settings(best->config, current.config);
  for (auto& r : diff_environment(recorded_environment(*best), recorded_environment(current))) rows.push_back(std::move(r));
  for (auto& r : diff_resolved(resolved_launch_values(*best), resolved_launch_values(current))) rows.push_back(std::move(r));
  return std::string(head) + render_diff(rows, "launch #" + std::to_string(best->id), "this launch") +
         "(`deltaserve config diff " + std::to_string(best->id) + " <this config>` shows it again)";
}

// ---- LaunchRecorder ----

LaunchRecorder::LaunchRecorder(LaunchRecorder&& o) noexcept { *this = std::move(o); }
LaunchRecorder& LaunchRecorder::operator=(LaunchRecorder&& o) noexcept {
  if (this != &o) {
    db_ = std::move(o.db_);
    launch_id_ = o.launch_id_;
    started_at_ = std::move(o.started_at_);
    warning_ = std::move(o.warning_);
    faster_warning_ = std::move(o.faster_warning_);
    stopped_ = o.stopped_;
    o.launch_id_ = 0;
    o.stopped_ = true;
  }
  return *this;
}

LaunchRecorder::~LaunchRecorder() {
  // Every orderly exit calls stop(); reaching here without it means start-up failed.
  if (!stopped_) stop("failed");
}

LaunchRecorder LaunchRecorder::start(const ServeOptions& opts, const MemoryPlan* plan, KeyValues derived,
                                     const std::string& version) {
  LaunchRecorder rec;
  const fs::path dir = opts.state_dir.empty() ? default_state_dir() : fs::path(opts.state_dir);
  auto db = LaunchDb::open(dir);
  if (!db) {
    rec.warning_ = "launch not recorded: " + db.status().message();
    rec.stopped_ = true;
    return rec;
  }
  rec.db_ = std::move(*db);
  HostInfo host = detect_host();
  LaunchRecord r;
  r.started_at = utc_now_iso();
  r.hostname = host.hostname;
  r.host_summary = host.summary();
  r.cpu_model = host.cpu_model;
  for (const auto& g : host.gpus) r.gpus += g.name + "=" + std::to_string(g.memory_bytes) + ";";
  r.version = version;
  r.pid = static_cast<int64_t>(::getpid());
  r.boot_id = current_boot_id();
  r.pid_start_ticks = process_start_ticks(r.pid);
  r.model = identify_model(opts.model_path);
  r.config = redact_secret_settings(effective_config(opts));  // never store the API key
  r.args = redact_secret_args(explicit_args(opts));
  if (plan) {
    derived.emplace_back("plan.weights_bytes_per_gpu", std::to_string(plan->weights_bytes_per_gpu));
    derived.emplace_back("plan.kv_bytes_per_token_per_gpu", std::to_string(plan->kv_bytes_per_token_per_gpu));
    derived.emplace_back("plan.state_bytes_per_request_per_gpu", std::to_string(plan->state_bytes_per_request_per_gpu));
    derived.emplace_back("plan.mem_fraction_static", std::to_string(plan->mem_fraction_static));
    derived.emplace_back("plan.kv_tokens", std::to_string(plan->kv_tokens));
    derived.emplace_back("plan.state_slots", std::to_string(plan->state_slots));
    derived.emplace_back("plan.max_running_requests", std::to_string(plan->max_running_requests));
    derived.emplace_back("plan.context_length", std::to_string(plan->context_length));
  }
  for (auto& kv : launch_environment()) derived.push_back(std::move(kv));
  r.derived = std::move(derived);
  auto id = rec.db_->insert_launch(r);
  if (!id) {
    rec.warning_ = "launch not recorded: " + id.status().message();
    rec.stopped_ = true;
    return rec;
  }
  rec.launch_id_ = *id;
  rec.started_at_ = r.started_at;
  r.id = *id;
  if (auto all = rec.db_->list("", 1000)) rec.faster_warning_ = faster_launch_warning(r, *all);
  return rec;
}

void LaunchRecorder::record_measurement(Measurement m) {
  if (!db_ || launch_id_ == 0) return;
  m.launch_id = launch_id_;
  if (m.source.empty()) m.source = "server";
  Status s = db_->add_measurement(m);
  if (!s) warning_ = s.message();
}

void LaunchRecorder::record_derived(const std::string& key, const std::string& value) {
  warning_.clear();  // (the caller logs what this call left)
  if (!db_ || launch_id_ == 0) return;
  Status s = db_->set_derived(launch_id_, key, value);
  if (!s) warning_ = s.message();
}

void LaunchRecorder::stop(const std::string& exit_status) {
  if (stopped_) return;
  warning_.clear();
  stopped_ = true;
  if (db_ && launch_id_ > 0) {
    // A database busy past its 5 s timeout (another process holding a write lock) is tried once
    // more: a lost stop reads as "died" in history.
    Status s = db_->set_stopped(launch_id_, utc_now_iso(), exit_status);
    if (!s) s = db_->set_stopped(launch_id_, utc_now_iso(), exit_status);
    if (!s) warning_ = "the launch's stop was not recorded: " + s.message();
  }
}

Result<std::string> recent_launches_json(LaunchDb& db, int limit, int measurements_per_launch) {
  auto launches = db.list("", limit);
  if (!launches) return launches.status();
  // The settings the page shows (a fixed list: config_json is redacted already, and this keeps
  // the page's payload small).
  static const char* const kSettings[] = {"device", "context-length", "max-running-requests", "max-total-tokens",
                                          "mem-fraction-static", "kv-cache-dtype", "speculative-algorithm",
                                          "speculative-num-steps", "tp-size", "mamba-full-memory-ratio"};
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const LaunchRecord& l : *launches) {
    nlohmann::ordered_json settings = nlohmann::ordered_json::object(), derived = nlohmann::ordered_json::object();
    for (const char* k : kSettings)
      if (std::string v = l.config_value(k); !v.empty()) settings[k] = v;
    for (const auto& [k, v] : l.derived) derived[k] = v;
    nlohmann::ordered_json ms = nlohmann::ordered_json::array();
    if (auto all = db.measurements(l.id)) {
      for (auto it = all->rbegin(); it != all->rend() && static_cast<int>(ms.size()) < measurements_per_launch; ++it) {
        ms.push_back({{"measured_at", it->measured_at}, {"source", it->source}, {"concurrency", it->concurrency},
                      {"n_requests", it->n_requests}, {"output_tokens_per_s", it->output_tokens_per_s},
                      {"request_throughput", it->request_throughput}, {"ttft_p50_ms", it->ttft_p50_ms},
                      {"itl_p50_ms", it->itl_p50_ms}, {"e2e_p50_ms", it->e2e_p50_ms},
                      {"accept_length", it->accept_length}});
      }
    } else {
      return all.status();
    }
    out.push_back({{"launch_id", l.id}, {"started_at", l.started_at}, {"stopped_at", l.stopped_at},
                   {"state", launch_state(l)}, {"model_path", l.model.path}, {"version", l.version},
                   {"hostname", l.hostname}, {"settings", settings}, {"derived", derived},
                   {"best_output_tokens_per_s", l.best_output_tokens_per_s}, {"best_concurrency", l.best_concurrency},
                   {"n_measurements", l.n_measurements}, {"measurements", ms}});
  }
  return dump_lossy(out);
}

}  // namespace deltaserve
