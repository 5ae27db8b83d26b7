// Launch records: every `serve` start stores its effective configuration, the model's identity,
// the hardware, the version, start/stop times and measured figures in SQLite under --state-dir
// (<state-dir>/launches.sqlite). `deltaserve history` lists them, `config diff` compares them, and
// a new launch is warned when a faster configuration of the same model on this host is on record.
//
// Server side (cmd_serve.cpp):
//
//   LaunchRecorder rec = LaunchRecorder::start(opts, &plan, {{"device", "cuda"}}, DELTASERVE_VERSION);
//   if (!rec.warning().empty()) log_warn(rec.warning());          // DB trouble never stops serve
//   if (auto w = rec.faster_config_warning()) log_warn(*w);       // "launch #3 measured 71 tok/s ..."
//   ... GET /v1/server_info returns {"launch_id": rec.launch_id(), ...} (0 = not recorded)
//   rec.stop("stopped");                                          // at shutdown (the destructor
//                                                                 // records "failed" otherwise)
//
// A record without a stop time is "running" while its process (pid + boot id + the process's
// start time, so a reused pid is not mistaken for it) is alive, and "died" once it is gone
// (kill -9, OOM killer, power loss): launch_state().
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "options/serve_options.h"
#include "cache/memory_plan.h"
#include "util/status.h"

struct sqlite3;

namespace deltaserve {

using KeyValues = std::vector<std::pair<std::string, std::string>>;

struct ModelIdentity {
  std::string path;               // as given (absolute when it is a local directory)
  std::string config_hash;        // FNV-1a 64 of config.json ("" when not readable)
  std::string weight_index_hash;  // of model.safetensors.index.json, else of the safetensors names+sizes
};
ModelIdentity identify_model(const std::string& model_path);

struct Measurement {
  int64_t launch_id = 0;
  std::string measured_at;        // UTC ISO 8601
  std::string source = "bench";   // bench | server
  int64_t concurrency = 0;
  int64_t n_requests = 0;
  double output_tokens_per_s = 0;
  double request_throughput = 0;  // requests/s
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  double itl_p50_ms = 0, itl_p99_ms = 0;
  double e2e_p50_ms = 0, e2e_p99_ms = 0;
  double accept_length = 0;       // 0 = not reported
  std::string details_json;       // everything else
};

struct LaunchRecord {
  int64_t id = 0;
  std::string started_at, stopped_at, exit_status;  // UTC ISO 8601
  std::string hostname, host_summary, cpu_model, gpus;  // gpus: "name=bytes;..."
  std::string version;
  ModelIdentity model;
  KeyValues config;               // effective serve settings, every flag (table order)
  std::string damaged;            // "" or which stored JSON column could not be read (get() refuses it)
  std::vector<std::string> args;  // the explicit settings as a command line (secrets redacted)
  int64_t pid = 0;                // the serving process (0: recorded before pids were)
  std::string boot_id;            // /proc/sys/kernel/random/boot_id at launch
  int64_t pid_start_ticks = 0;    // the process's start time (clock ticks after boot, /proc/PID/stat)
  KeyValues derived;              // plan figures and other derived values
  // Filled by LaunchDb::list/get from the measurements.
  double best_output_tokens_per_s = 0;
  int64_t best_concurrency = 0;
  int64_t n_measurements = 0;

  std::string config_value(const std::string& key) const;  // "" if absent
};

class LaunchDb {
 public:
  // Opens (creating the folder and schema) <state_dir>/launches.sqlite. A file that is not a
  // SQLite database, or one with a foreign schema, is a clear error.
  static Result<std::unique_ptr<LaunchDb>> open(const std::filesystem::path& state_dir);
  // For commands that only read (history, config show/diff): opened SQLITE_OPEN_READONLY; nothing
  // is created or changed (no folder, file, table, column, schema version or permission), so a
  // mistyped --state-dir leaves no empty database behind and another program's SQLite file is left
  // as it was. No database there (or an empty file) gives nullptr; a foreign schema or another
  // schema version is an error that says so. busy_timeout_ms: how long a read waits for another
  // connection's write lock before it fails "database is locked" (the status page's background
  // refresh waits briefly and keeps its last value).
  static Result<std::unique_ptr<LaunchDb>> open_for_reading(const std::filesystem::path& state_dir,
                                                            int busy_timeout_ms = 5000);
  // Where the database of a state folder is.
  static std::filesystem::path file_in(const std::filesystem::path& state_dir) { return state_dir / "launches.sqlite"; }
  ~LaunchDb();
  LaunchDb(const LaunchDb&) = delete;
  LaunchDb& operator=(const LaunchDb&) = delete;

  Result<int64_t> insert_launch(const LaunchRecord& record);
  Status set_stopped(int64_t launch_id, const std::string& stopped_at, const std::string& exit_status);
  // Sets one derived value of a launch (added, or replacing the key's value).
  Status set_derived(int64_t launch_id, const std::string& key, const std::string& value);
  Status add_measurement(const Measurement& m);
  // Newest first; model_filter matches a substring of the model path ("" = all).
  Result<std::vector<LaunchRecord>> list(const std::string& model_filter = "", int limit = 1000);
  Result<LaunchRecord> get(int64_t launch_id);
  Result<std::vector<Measurement>> measurements(int64_t launch_id);

  const std::filesystem::path& path() const { return path_; }

 private:
  LaunchDb() = default;
  Status exec(const char* sql);
  sqlite3* db_ = nullptr;
  std::filesystem::path path_;
  // The launch columns list() and get() select: kLaunchColumns, with the columns a read-only open
  // found missing (added after schema 1's first release) replaced by their defaults.
  std::string launch_columns_;
};

// UTC now as "2026-11-30T01:02:03Z".
std::string utc_now_iso();

// This machine's boot id ("" if unknown) and a process's start time in clock ticks after boot
// (0 if the process does not exist).
std::string current_boot_id();
int64_t process_start_ticks(int64_t pid);

// What `history` shows: exit_status once stopped ("stopped", "failed: ...", ...); otherwise
// "running" if the recorded process is alive, "died" if it is gone, "running?" for records
// without a pid.
std::string launch_state(const LaunchRecord& record);

class LaunchRecorder {
 public:
  // Records the launch. Never fails: a DB problem leaves launch_id() 0 and sets warning().
  static LaunchRecorder start(const ServeOptions& opts, const MemoryPlan* plan, KeyValues derived,
                              const std::string& version);
  LaunchRecorder(LaunchRecorder&&) noexcept;
  LaunchRecorder& operator=(LaunchRecorder&&) noexcept;
  ~LaunchRecorder();

  int64_t launch_id() const { return launch_id_; }
  // The recorded start time (with launch_id, what tells this launch from another database's) and
  // the database it is in ("" when not recorded).
  const std::string& started_at() const { return started_at_; }
  std::string db_path() const { return db_ ? db_->path().string() : std::string(); }
  // The database trouble the last start / record_derived / stop call met ("" if none).
  const std::string& warning() const { return warning_; }
  // When this model on this host has a recorded launch that measured faster than this
  // configuration did (or this configuration was never measured), a warning with the diff.
  std::optional<std::string> faster_config_warning() const { return faster_warning_; }
  // Server-side figures (e.g. average throughput at shutdown).
  void record_measurement(Measurement m);
  // A value decided after the launch was recorded (e.g. "spec.num_steps", the MTP draft steps the
  // start-up probe chose).
  void record_derived(const std::string& key, const std::string& value);
  void stop(const std::string& exit_status = "stopped");

 private:
  LaunchRecorder() = default;
  std::unique_ptr<LaunchDb> db_;
  int64_t launch_id_ = 0;
  std::string started_at_;
  std::string warning_;
  std::optional<std::string> faster_warning_;
  bool stopped_ = false;
};

// The comparison the recorder makes, exposed for tests and `history`: among `launches` of the same
// model (config hash) on the same host, the fastest one measured faster than the best measurement
// of launches whose performance settings equal `current`'s. Returns the warning text.
std::optional<std::string> faster_launch_warning(const LaunchRecord& current,
                                                 const std::vector<LaunchRecord>& launches);

// The last `limit` launches (newest first) with their state, key settings, plan figures and their
// newest `measurements_per_launch` measurements (newest first), as a JSON array text: what the
// status page (`serve`'s /status.json "launches") shows. Secrets are never included.
Result<std::string> recent_launches_json(LaunchDb& db, int limit = 10, int measurements_per_launch = 5);

// A stable key over the settings that change speed or memory (for "same configuration"): the
// performance flags of `config` and every entry of `environment`.
std::string performance_fingerprint(const KeyValues& config, const KeyValues& environment = {});

// The environment variables that change what a launch does, as "env:NAME" = value, sorted: which
// GPUs (CUDA_VISIBLE_DEVICES, DELTASERVE_TP_DEVICES, DELTASERVE_TP_DEVICE_BARRIER) and the CUDA
// backend's overrides (backend/cuda_option_env.h). A launch records them among its derived values.
KeyValues launch_environment();
// Those entries of a record's derived values.
KeyValues recorded_environment(const LaunchRecord& record);
// What a launch resolved and where it ran, beside its settings: the plan's capacities (what
// "auto" became: plan.context_length, plan.max_running_requests, plan.kv_tokens,
// plan.state_slots, plan.mem_fraction_static), the device, the deltaserve version, the host and
// the model's identity (config and weight-index hashes). `config diff` of two launches compares
// them, so a relaunch whose flags are the same but whose "auto" resolved differently (other GPUs,
// other model files, other version) is explained.
KeyValues resolved_launch_values(const LaunchRecord& record);

}  // namespace deltaserve
