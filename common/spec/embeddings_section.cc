// model.embeddings: a Python model's tables whose rows live on the shards
// (their rows, ids, combiner, initialiser, optimizer and input columns).
#include "common/spec/internal/sections.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/spec/internal/yaml_fields.h"
#include "common/status_macros.h"

namespace tally::spec_internal {

namespace {

// model.embeddings: [{name, dim, num_embeddings, ids, combiner, init,
// init_scale, optimizer: {type, lr, weight_decay, eps,
// initial_accumulator_value}}], for a Python model (the tables are its
// nn.Embedding / nn.EmbeddingBag modules of those names).
constexpr int64_t kMaxTables = 256;
constexpr int64_t kMaxTableDim = 4096;
constexpr int64_t kMaxTableRows = int64_t{1} << 40;

// A table's lazy Adam (torch.optim.SparseAdam: lr, betas, eps; no
// weight decay).
absl::Status ParseTableAdam(const YAML::Node& n, const std::string& p,
                            TableOptimizer* o) {
  o->type = TableOptimizer::Type::kAdam;
  o->eps = 1e-8;
  TALLY_RETURN_IF_ERROR(CheckKeys(n, p, {"type", "lr", "betas", "eps"}));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "lr", &o->lr));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "eps", &o->eps));
  if (const YAML::Node betas = n["betas"]) {
    if (!betas.IsSequence() || betas.size() != 2) {
      return FieldError(p + ".betas", "must be a list of two numbers");
    }
    YAML::Node pair(YAML::NodeType::Map);
    pair["beta1"] = betas[0];
    pair["beta2"] = betas[1];
    TALLY_RETURN_IF_ERROR(ReadDouble(pair, p + ".betas", "beta1", &o->beta1));
    TALLY_RETURN_IF_ERROR(ReadDouble(pair, p + ".betas", "beta2", &o->beta2));
  }
  if (o->lr <= 0) return FieldError(p + ".lr", "must be positive");
  if (o->eps <= 0) return FieldError(p + ".eps", "must be positive");
  if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
    return FieldError(p + ".betas", "must each be in [0, 1)");
  return absl::OkStatus();
}

absl::Status ParseTableOptimizer(const YAML::Node& n, const std::string& p,
                                 double job_lr, TableOptimizer* o) {
  o->lr = job_lr;
  if (!n) return absl::OkStatus();
  std::string type = "sgd";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "type", &type));
  if (type == "sgd") {
    o->type = TableOptimizer::Type::kSgd;
  } else if (type == "adagrad") {
    o->type = TableOptimizer::Type::kAdagrad;
  } else if (type == "adam") {
    return ParseTableAdam(n, p, o);
  } else {
    return FieldError(p + ".type",
                      absl::StrCat("unknown table optimizer '", type,
                                   "' (known: sgd, adagrad, adam)"));
  }
  TALLY_RETURN_IF_ERROR(CheckKeys(n, p,
                                  {"type", "lr", "weight_decay", "eps",
                                   "initial_accumulator_value"}));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "lr", &o->lr));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "weight_decay", &o->weight_decay));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "eps", &o->eps));
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "initial_accumulator_value",
                                   &o->initial_accumulator_value));
  if (o->lr <= 0) return FieldError(p + ".lr", "must be positive");
  if (o->weight_decay < 0)
    return FieldError(p + ".weight_decay", "must be >= 0");
  if (o->eps <= 0) return FieldError(p + ".eps", "must be positive");
  if (o->initial_accumulator_value < 0)
    return FieldError(p + ".initial_accumulator_value", "must be >= 0");
  return absl::OkStatus();
}

// A table's ids, combiner and initialiser.
absl::Status ParseTableLookup(const YAML::Node& n, const std::string& p,
                              EmbeddingTableSpec* t) {
  std::string ids = "hashed";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "ids", &ids));
  if (t->dynamic()) {
    if (n["ids"]) {
      return FieldError(p + ".ids",
                        "is for a fixed table; a dynamic table's rows are "
                        "keyed by the ids themselves");
    }
  } else if (ids == "hashed") {
    t->ids = TableIds::kHashed;
  } else if (ids == "direct") {
    t->ids = TableIds::kDirect;
  } else {
    return FieldError(p + ".ids", absl::StrCat("must be hashed or direct, got '",
                                               ids, "'"));
  }
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "combiner", &t->combiner));
  if (!t->combiner.empty() && t->combiner != "sum" && t->combiner != "mean") {
    return FieldError(p + ".combiner",
                      absl::StrCat("must be sum or mean (nn.EmbeddingBag's "
                                   "mode), got '", t->combiner, "'"));
  }
  std::string init = "normal";
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "init", &init));
  if (init == "normal") {
    t->init = TableInit::kNormal;
    t->init_scale = 1.0;
  } else if (init == "uniform") {
    t->init = TableInit::kUniform;
    if (t->dynamic() && !n["init_scale"]) {
      return FieldError(p + ".init_scale",
                        "is required with init: uniform on a dynamic table "
                        "(there is no num_embeddings to take sqrt(1/n) of)");
    }
    if (!t->dynamic())
      t->init_scale = std::sqrt(1.0 / static_cast<double>(t->num_embeddings));
  } else if (init == "zeros") {
    t->init = TableInit::kZeros;
  } else {
    return FieldError(p + ".init", absl::StrCat("must be normal, uniform or "
                                                "zeros, got '", init, "'"));
  }
  TALLY_RETURN_IF_ERROR(ReadDouble(n, p, "init_scale", &t->init_scale));
  if (t->init_scale < 0) return FieldError(p + ".init_scale", "must be >= 0");
  return absl::OkStatus();
}

// The input columns a table looks up (features).
absl::Status ParseTableFeatures(const YAML::Node& f, const std::string& p,
                                EmbeddingTableSpec* t) {
  if (f) {
    if (!f.IsSequence() || f.size() == 0 || f.size() > 4096) {
      return FieldError(p,
                        "must list the input columns the table looks up");
    }
    for (size_t i = 0; i < f.size(); ++i) {
      YAML::Node one(YAML::NodeType::Map);
      one["c"] = f[i];
      int64_t c = 0;
      TALLY_RETURN_IF_ERROR(ReadInt(one, absl::StrCat(p, "[", i, "]"),
                                    "c", 0, kMaxDim - 1, &c));
      t->features.push_back(c);
    }
  }
  return absl::OkStatus();
}

// A fixed table's num_embeddings, or a dynamic one's bounds.
absl::Status ParseTableRows(const YAML::Node& n, const std::string& p,
                            EmbeddingTableSpec* t) {
  bool dynamic = false;
  TALLY_RETURN_IF_ERROR(ReadBool(n, p, "dynamic", &dynamic));
  if (!dynamic) {
    for (const char* key : {"max_rows", "evict_after_steps", "min_count"}) {
      if (n[key]) {
        return FieldError(absl::StrCat(p, ".", key),
                          "is for a dynamic table (dynamic: true)");
      }
    }
    if (!n["num_embeddings"])
      return FieldError(p + ".num_embeddings", "is required");
    return ReadInt(n, p, "num_embeddings", 1, kMaxTableRows,
                   &t->num_embeddings);
  }
  if (n["num_embeddings"]) {
    return FieldError(p + ".num_embeddings",
                      "is for a fixed table; a dynamic table makes a row for "
                      "each id it is given (bound it with max_rows)");
  }
  t->ids = TableIds::kDynamic;
  TALLY_RETURN_IF_ERROR(
      ReadInt(n, p, "max_rows", 0, kMaxTableRows, &t->max_rows));
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "evict_after_steps", 0,
                                int64_t{1} << 40, &t->evict_after_steps));
  return ReadInt(n, p, "min_count", 1, 255, &t->min_count);
}

absl::Status ParseTable(const YAML::Node& n, const std::string& p,
                        double job_lr, EmbeddingTableSpec* t) {
  TALLY_RETURN_IF_ERROR(CheckKeys(
      n, p,
      {"name", "dim", "num_embeddings", "dynamic", "max_rows",
       "evict_after_steps", "min_count", "ids", "combiner", "init",
       "init_scale", "optimizer", "features"}));
  TALLY_RETURN_IF_ERROR(ReadString(n, p, "name", &t->name));
  if (t->name.empty() || t->name.size() > 256) {
    return FieldError(p + ".name",
                      "must name the model's nn.Embedding or nn.EmbeddingBag "
                      "(its module path, e.g. emb or tables.3)");
  }
  if (!n["dim"]) return FieldError(p + ".dim", "is required");
  TALLY_RETURN_IF_ERROR(ReadInt(n, p, "dim", 1, kMaxTableDim, &t->dim));
  TALLY_RETURN_IF_ERROR(ParseTableRows(n, p, t));
  TALLY_RETURN_IF_ERROR(ParseTableLookup(n, p, t));
  TALLY_RETURN_IF_ERROR(
      ParseTableOptimizer(n["optimizer"], p + ".optimizer", job_lr,
                          &t->optimizer));
  TALLY_RETURN_IF_ERROR(
      ParseTableFeatures(n["features"], p + ".features", t));
  t->salt = TableSalt(t->name);
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseEmbeddings(const YAML::Node& n, JobSpec* spec) {
  if (!n) return absl::OkStatus();
  const std::string p = "model.embeddings";
  if (!n.IsSequence()) return FieldError(p, "must be a list of tables");
  if (!spec->is_python) {
    return FieldError(p, "tables are a Python model's nn.Embedding and "
                         "nn.EmbeddingBag modules: they need model.python");
  }
  if (static_cast<int64_t>(n.size()) > kMaxTables) {
    return FieldError(p, absl::StrCat(n.size(), " tables, over the limit of ",
                                      kMaxTables));
  }
  std::set<std::string> names;
  for (size_t i = 0; i < n.size(); ++i) {
    EmbeddingTableSpec t;
    TALLY_RETURN_IF_ERROR(ParseTable(n[i], absl::StrCat(p, "[", i, "]"),
                                     spec->optimizer.lr, &t));
    if (!names.insert(t.name).second) {
      return FieldError(absl::StrCat(p, "[", i, "].name"),
                        absl::StrCat("table '", t.name, "' is listed twice"));
    }
    spec->embeddings.push_back(std::move(t));
  }
  return absl::OkStatus();
}

}  // namespace tally::spec_internal
