// training: (its schedule of workers and shards, its consistency rule) and
// optimizer: (its type, hyperparameters and learning-rate schedule).
#include "common/spec/internal/sections.h"

#include <yaml-cpp/yaml.h>

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/spec/internal/yaml_fields.h"
#include "common/status_macros.h"

namespace tally::spec_internal {

namespace {

// training.consistency's mode and lr_scaling, by name.
absl::Status ParseConsistencyNames(const YAML::Node& n, const std::string& p,
                                   ConsistencySpec* c) {
  std::string mode = "bsp";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "mode", &mode));
  if (mode == "bsp") {
    c->mode = ConsistencyMode::kBsp;
  } else if (mode == "ssp") {
    c->mode = ConsistencyMode::kSsp;
  } else if (mode == "async") {
    c->mode = ConsistencyMode::kAsync;
  } else {
    return FieldError(Join(p, "mode"),
                      absl::StrCat("unknown mode '", mode,
                                   "' (bsp, ssp or async)"));
  }
  std::string tables = "sync";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "tables", &tables));
  if (tables != "sync" && tables != "async") {
    return FieldError(Join(p, "tables"),
                      absl::StrCat("unknown rule '", tables,
                                   "' (sync: as the mode; async: each "
                                   "push's rows stepped as it comes)"));
  }
  // Async closes no steps: its rows are stepped as they come.
  if (c->mode == ConsistencyMode::kAsync && tables == "sync" && n["tables"]) {
    return FieldError(Join(p, "tables"),
                      "sync needs steps that close (mode bsp or ssp); mode "
                      "async steps the rows as they come");
  }
  c->tables_async = tables == "async" || c->mode == ConsistencyMode::kAsync;
  std::string scaling = "none";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "lr_scaling", &scaling));
  if (scaling == "none") {
    c->lr_scaling = LrScaling::kNone;
  } else if (scaling == "staleness") {
    c->lr_scaling = LrScaling::kStaleness;
  } else {
    return FieldError(Join(p, "lr_scaling"),
                      absl::StrCat("unknown scaling '", scaling,
                                   "' (none or staleness)"));
  }
  return absl::OkStatus();
}

absl::Status ParseConsistency(const YAML::Node& n, const TrainingSpec& t,
                              ConsistencySpec* c) {
  const std::string p = "training.consistency";
  if (!n) return absl::OkStatus();
  if (!n.IsMap()) return FieldError(p, "must be a mapping");
  TALLY_RETURN_IF_ERROR(CheckKeys(
      n, p,
      {"mode", "staleness", "lr_scaling", "max_staleness", "backup_workers",
       "tables"}));
  TALLY_RETURN_IF_ERROR(ParseConsistencyNames(n, p, c));
  const bool bsp = c->mode == ConsistencyMode::kBsp;
  const bool ssp = c->mode == ConsistencyMode::kSsp;
  if (n["staleness"] && !ssp) {
    return FieldError(Join(p, "staleness"), "applies to mode ssp only");
  }
  if (ssp && !n["staleness"]) {
    return FieldError(Join(p, "staleness"), "is required with mode ssp");
  }
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "staleness", 0, 1000, &c->staleness));
  if (bsp && c->lr_scaling != LrScaling::kNone) {
    return FieldError(Join(p, "lr_scaling"),
                      "has no effect with mode bsp (every gradient is fresh)");
  }
  if (n["max_staleness"] && bsp) {
    return FieldError(Join(p, "max_staleness"),
                      "has no effect with mode bsp (every gradient is fresh)");
  }
  if (n["max_staleness"] && ssp) {
    // Below staleness it would refuse what the rule lets workers compute;
    // at or above it, it refuses nothing.
    return FieldError(Join(p, "max_staleness"),
                      "applies to mode async only (in ssp, staleness bounds "
                      "it)");
  }
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "max_staleness", 0, 1000000, &c->max_staleness));
  if (n["backup_workers"] && !bsp) {
    return FieldError(Join(p, "backup_workers"), "applies to mode bsp only");
  }
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "backup_workers", 0, 1023, &c->backup_workers));
  if (c->backup_workers > 0 && c->backup_workers >= t.workers) {
    return FieldError(Join(p, "backup_workers"),
                      absl::StrCat("must be less than training.workers (",
                                   t.workers, ")"));
  }
  if (c->backup_workers > 0 && t.shards > 1) {
    // Each shard would pick its own late pushes: they could disagree.
    return FieldError(Join(p, "backup_workers"),
                      "needs the job on one shard (training.shards: 1 or "
                      "unset)");
  }
  return absl::OkStatus();
}

// training.ranks: fixed ranks, held by between workers.min and
// workers.max worker processes (unset: from 1 up to one a rank).
absl::Status ParseRanks(const YAML::Node& n, const std::string& p,
                        TrainingSpec* t) {
  if (!n["ranks"]) return absl::OkStatus();
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "ranks", 1, 1024, &t->ranks));
  if (!n["workers"]) {
    t->workers = 1;
    t->max_workers = t->ranks;
  }
  if (t->max_workers > t->ranks) {
    return FieldError(Join(p, "workers"),
                      absl::StrCat("at most training.ranks (", t->ranks,
                                   ") workers: each holds a rank or more, "
                                   "got ", t->max_workers));
  }
  return absl::OkStatus();
}

// What fixed ranks (training.ranks) need of the consistency rule: steps
// that close, each with every rank.
absl::Status CheckRanksConsistency(const YAML::Node& n, const TrainingSpec& t) {
  const std::string p = "training.consistency";
  if (t.ranks == 0) return absl::OkStatus();
  if (t.consistency.mode == ConsistencyMode::kAsync) {
    return FieldError(Join(p, "mode"),
                      "async closes no steps for training.ranks to wait on "
                      "(bsp or ssp)");
  }
  if (n && n["backup_workers"]) {
    return FieldError(Join(p, "backup_workers"),
                      "not with training.ranks: every rank counts in every "
                      "step");
  }
  return absl::OkStatus();
}

// training.workers: a number, or a range {min, max} (the job starts with
// min and grows as free workers come, up to max).
absl::Status ParseWorkers(const YAML::Node& n, const std::string& p,
                          TrainingSpec* t) {
  const YAML::Node w = n["workers"];
  if (!w || !w.IsMap()) {
    TALLY_RETURN_IF_ERROR(ReadInt(n, p, "workers", 1, 1024, &t->workers));
    t->max_workers = t->workers;
    return absl::OkStatus();
  }
  const std::string wp = Join(p, "workers");
  TALLY_RETURN_IF_ERROR(CheckKeys(w, wp, {"min", "max"}));
  if (!w["min"] || !w["max"]) return FieldError(wp, "needs min and max");
  TALLY_RETURN_IF_ERROR(ReadInt(w, wp, "min", 1, 1024, &t->workers));
  TALLY_RETURN_IF_ERROR(ReadInt(w, wp, "max", 1, 1024, &t->max_workers));
  if (t->max_workers < t->workers) {
    return FieldError(Join(wp, "max"),
                      absl::StrCat("must be at least min (", t->workers,
                                   "), got ", t->max_workers));
  }
  return absl::OkStatus();
}

// optimizer.schedule: {type: constant|step|cosine, warmup_steps, step_size,
// gamma, min_lr}.
absl::Status ParseSchedule(const YAML::Node& n, OptimizerConfig* o) {
  const std::string p = "optimizer.schedule";
  if (!n) return absl::OkStatus();
  TALLY_RETURN_IF_ERROR(CheckKeys(
      n, p, {"type", "warmup_steps", "step_size", "gamma", "min_lr"}));
  std::string type = "constant";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "type", &type));
  if (type == "constant") {
    o->schedule = OptimizerConfig::Schedule::kConstant;
  } else if (type == "step") {
    o->schedule = OptimizerConfig::Schedule::kStep;
    if (!n["step_size"]) return FieldError(p, "type step needs step_size");
  } else if (type == "cosine") {
    o->schedule = OptimizerConfig::Schedule::kCosine;
  } else {
    return FieldError(p + ".type", absl::StrCat("unknown schedule '", type,
                                                "' (known: constant, step, "
                                                "cosine)"));
  }
  constexpr int64_t kMaxSteps = int64_t{1} << 40;
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "warmup_steps", 0, kMaxSteps, &o->warmup_steps));
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "step_size", 1, kMaxSteps, &o->step_size));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "gamma", &o->gamma));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "min_lr", &o->min_lr));
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseTraining(const YAML::Node& n, TrainingSpec* t) {
  const std::string p = "training";
  if (!n) return absl::OkStatus();
  TALLY_RETURN_IF_ERROR(CheckKeys(n, p,
                                  {"epochs", "batch_size", "max_steps", "seed",
                                   "workers", "ranks", "shards", "replicas",
                                   "tf32", "wire_dtype", "consistency"}));
  TALLY_RETURN_IF_ERROR(ReadBool(n, p, "tf32", &t->tf32));
  std::string wire = "float32";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "wire_dtype", &wire));
  if (wire == "float32") {
    t->wire_dtype = WireDtype::kFloat32;
  } else if (wire == "bfloat16") {
    t->wire_dtype = WireDtype::kBfloat16;
  } else {
    return FieldError(
        "training.wire_dtype",
        absl::StrCat("unknown dtype '", wire, "' (float32 or bfloat16)"));
  }
  TALLY_RETURN_IF_ERROR(ParseWorkers(n, p, t));
  TALLY_RETURN_IF_ERROR(ParseRanks(n, p, t));
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "shards", 0, 1024, &t->shards));
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "replicas", 1, 2, &t->replicas));
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "epochs", 1, 1000000, &t->epochs));
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "batch_size", 1, 1 << 20, &t->batch_size));
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "max_steps", 0, int64_t{1} << 40, &t->max_steps));
  int64_t seed = static_cast<int64_t>(t->seed);
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "seed", 0, std::numeric_limits<int64_t>::max(), &seed));
  t->seed = static_cast<uint64_t>(seed);
  TALLY_RETURN_IF_ERROR(
      ParseConsistency(n["consistency"], *t, &t->consistency));
  return CheckRanksConsistency(n["consistency"], *t);
}

absl::Status ParseOptimizer(const YAML::Node& n, OptimizerConfig* o) {
  const std::string p = "optimizer";
  if (!n) return absl::OkStatus();
  if (!n.IsMap()) return FieldError(p, "must be a mapping");
  std::string type = "sgd";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "type", &type));
  auto t = ParseOptimizerType(type);
  if (!t.ok()) return FieldError("optimizer.type", t.status().message());
  o->type = *t;
  if (o->type == OptimizerType::kSgd) {
    TALLY_RETURN_IF_ERROR(CheckKeys(
        n, p,
        {"type", "lr", "momentum", "dampening", "nesterov", "weight_decay",
         "schedule", "clip_grad_norm"}));
  } else {
    TALLY_RETURN_IF_ERROR(CheckKeys(
        n, p,
        {"type", "lr", "betas", "beta1", "beta2", "eps", "weight_decay",
         "schedule", "clip_grad_norm"}));
    // PyTorch's AdamW defaults to weight_decay 0.01.
    if (o->type == OptimizerType::kAdamW) o->weight_decay = 0.01;
    o->lr = 0.001;
  }
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "lr", &o->lr));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "momentum", &o->momentum));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "dampening", &o->dampening));
  TALLY_RETURN_IF_ERROR(ReadBool(n, p, "nesterov", &o->nesterov));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "weight_decay", &o->weight_decay));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "beta1", &o->beta1));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "beta2", &o->beta2));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "eps", &o->eps));
  TALLY_RETURN_IF_ERROR(
      ReadDouble(n, p, "clip_grad_norm", &o->clip_grad_norm));
  if (const YAML::Node betas = n["betas"]) {
    if (!betas.IsSequence() || betas.size() != 2) {
      return FieldError("optimizer.betas", "must be a list of two numbers");
    }
    YAML::Node pair(YAML::NodeType::Map);
    pair["beta1"] = betas[0];
    pair["beta2"] = betas[1];
    TALLY_RETURN_IF_ERROR(
        ReadDouble(pair, "optimizer.betas", "beta1", &o->beta1));
    TALLY_RETURN_IF_ERROR(
        ReadDouble(pair, "optimizer.betas", "beta2", &o->beta2));
  }
  TALLY_RETURN_IF_ERROR(ParseSchedule(n["schedule"], o));
  if (absl::Status s = ValidateOptimizerConfig(*o); !s.ok()) {
    return FieldError(p, s.message());
  }
  return absl::OkStatus();
}

}  // namespace tally::spec_internal
