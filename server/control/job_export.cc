#include "server/control/job_export.h"

#include <algorithm>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/io/safetensors.h"
#include "common/status_macros.h"
#include "proto/errors.h"
#include "server/control/job_store.h"

namespace tally {

namespace {

// An ended job's table homes: as it ended, or after a restart the live
// shards at the addresses it kept, whose tables are read by job alone
// (*map_version 0: the placement's number is not kept); empty, with *away
// naming the shard, when one is not here.
std::vector<std::shared_ptr<ShardControl>> TableHomes(
    const JobEntry& job, const Registry& registry, int64_t* map_version,
    std::string* away) {
  if (!job.table_homes.empty() || job.table_home_addresses.empty())
    return job.table_homes;
  std::vector<std::shared_ptr<ShardControl>> homes;
  for (const std::string& address : job.table_home_addresses) {
    std::shared_ptr<ShardControl> found = registry.LiveShardAt(address);
    if (found == nullptr) {
      *away = address.empty() ? "the coordinator's own shard (restarted)"
                              : absl::StrCat("shard ", address);
      return {};
    }
    homes.push_back(std::move(found));
  }
  *map_version = 0;
  return homes;
}

// The export of an ended job's tables from their homes, or null with
// *note saying why the file has none.
std::unique_ptr<TableExport> TablesOf(const JobEntry& job,
                                      const Registry& registry,
                                      std::string* note) {
  const JobSpec& spec = job.spec;
  if (spec.embeddings.empty()) return nullptr;
  if (!job.retired) {
    *note = job.ended() ? "not included yet: the shards are still closing "
                          "the job; fetch again in a moment"
                        : "not included: the job is running (they are once "
                          "it has ended)";
    return nullptr;
  }
  int64_t map_version = job.map_version;
  std::string away;
  const std::vector<std::shared_ptr<ShardControl>> homes =
      TableHomes(job, registry, &map_version, &away);
  if (homes.empty()) {
    *note = away.empty()
                ? "lost: a shard of the job was away when it ended"
                : absl::StrCat("not reachable: ", away,
                               " kept them and has not registered since the "
                               "coordinator restarted");
    return nullptr;
  }
  return std::make_unique<TableExport>(job.id(), map_version, spec.embeddings,
                                       spec.training.seed, homes);
}

}  // namespace

absl::StatusOr<JobExport> JobExport::Take(const JobEntry& job,
                                          const Registry& registry) {
  JobExport out;
  out.job_id_ = job.id();
  out.layout_ = job.spec.layout;
  out.name_ = job.spec.name;
  out.python_ = job.spec.python;
  out.buffers_ = job.final_buffers;
  out.total_steps_ = job.schedule.total_steps;
  out.map_version_ = job.map_version;
  out.tables_ = TablesOf(job, registry, &out.tables_note_);
  if (job.final_weights != nullptr) {
    out.weights_ = job.final_weights;
    out.version_ = job.proto.metrics().step();
  } else if (!job.ranges.empty() && job.installed) {
    for (const v1::RangeStatus& r : registry.RangeStatuses(job))
      out.version_ = std::max(out.version_, r.version());
    for (const Placement& p : job.ranges) {
      out.ranges_.push_back(
          {registry.shard(p.shard_id).control, p.offset, p.count});
    }
  } else if (job.start != nullptr) {
    const ShardState& start = job.start->state;
    out.weights_ = start.weights;
    out.version_ = start.metrics.version;
    if (start.buffers != nullptr) out.buffers_ = *start.buffers;
  } else {
    return WithReason(absl::FailedPreconditionError(absl::StrCat(
                          job.id(), " has not started: it has no weights yet")),
                      v1::JOB_NOT_STARTED);
  }
  return out;
}

absl::Status JobExport::Make(std::string* head,
                             std::unique_ptr<TableExport>* tables,
                             std::string* buffers_note) {
  if (weights_ == nullptr) {
    TALLY_ASSIGN_OR_RETURN(
        StoredJob saved,
        SaveRanges(job_id_, map_version_, ranges_, version_, total_steps_,
                   layout_.num_params, /*weights_only=*/true));
    weights_ = saved.state.weights;
    version_ = saved.state.metrics.version;
    // The buffer region, as the first range has it.
    if (saved.state.buffers != nullptr) buffers_ = *saved.state.buffers;
  }
  if (tables_ != nullptr) TALLY_RETURN_IF_ERROR(tables_->Prepare());
  *buffers_note = BuffersNote(python_, buffers_);
  *head = File(layout_.params, *weights_, python_, buffers_, job_id_, name_,
               version_, tables_.get(), tables_note_);
  *tables = std::move(tables_);
  return absl::OkStatus();
}

// A file without them is refused by load_state_dict(strict=True), so it is
// never written silently: the note goes into its metadata and to the
// client.
std::string JobExport::BuffersNote(const PythonModelSpec& py,
                                   const std::string& buffers) {
  if (py.buffers.empty() ||
      static_cast<int64_t>(buffers.size()) == py.buffer_bytes)
    return "";
  return absl::StrCat(
      "missing: no step of the job had closed with them (", py.buffers.size(),
      " buffers, ", py.buffers.front().name,
      " first); load the file with load_state_dict(..., strict=False)");
}

std::string JobExport::File(const std::vector<ParamInfo>& params,
                            const std::vector<float>& weights,
                            const PythonModelSpec& py,
                            const std::string& buffers,
                            const std::string& job_id, const std::string& name,
                            int64_t version, const TableExport* tables,
                            const std::string& tables_note) {
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"job", job_id},
      {"name", name},
      {"version", absl::StrCat(version)}};
  if (!tables_note.empty()) metadata["tables"] = tables_note;
  if (const std::string note = BuffersNote(py, buffers); !note.empty())
    metadata["buffers"] = note;
  if (!py.aliases.empty())
    metadata["aliases"] = nlohmann::json(py.aliases).dump();
  std::vector<RawTensor> extra;
  if (static_cast<int64_t>(buffers.size()) == py.buffer_bytes) {
    int64_t at = 0;
    for (const BufferInfo& b : py.buffers) {
      extra.push_back({b.name, b.dtype, b.shape, buffers.substr(at, b.bytes)});
      at += b.bytes;
    }
  }
  return EncodeSafetensors(params, weights.data(), metadata, extra,
                           tables != nullptr ? tables->Tensors()
                                             : std::vector<LaterTensor>{});
}

}  // namespace tally
