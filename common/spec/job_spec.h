// Job specifications: parsing (YAML or JSON) and validation.
//
// A job file has five sections; every field but the model and dataset has a
// default, and unknown keys are rejected (they are usually typos):
//
//   name: fashion-mnist-mlp
//   model:     {preset: mlp} | {layers: [flatten, {linear: {...}}, relu, ...]}
//              | {python: {file, build, code, params}, loss}
//   dataset:   {name: fashion-mnist, root: DIR} | {name: synthetic, ...}
//   training:  {epochs, batch_size, max_steps, seed}
//   optimizer: {type: sgd|adam|adamw, lr, momentum, ...}
//
// docs/job-spec.md describes every field. Validation runs shape inference
// through the model for the dataset's sample shape, so a model that cannot
// run is rejected at submission with the field named, e.g.
//   model.layers[4] (linear): in_features is 784 but the input has 1440
//   features
//
// All functions are thread-safe.
#ifndef TALLY_COMMON_SPEC_JOB_SPEC_H_
#define TALLY_COMMON_SPEC_JOB_SPEC_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data/clicks.h"
#include "common/data/data_file.h"
#include "common/data/dataset.h"
#include "common/data/image.h"
#include "common/data/npy.h"
#include "common/nn/layer_config.h"
#include "common/optim/optimizer.h"
#include "common/spec/consistency.h"
#include "common/spec/embedding.h"
#include "common/tensor.h"

namespace tally {

inline constexpr char kDefaultFashionMnistRoot[] =
    "/usr/share/datasets/fashion-mnist";

// dataset.name arrays: NumPy .npy files on the workers (common/data/npy.h).
struct ArraysSpec {
  // train: {inputs, labels} (.npy paths or globs) or {file, inputs, labels}
  // (a .npz or .safetensors path or glob, and the arrays' keys in it).
  ArrayFiles train;
  ArrayFiles test;  // optional: empty inputs
  Shape shape;          // one sample's shape
  int num_classes = 0;  // classes
  // Training samples: the schedule is fixed from it at submission (the
  // Python client fills it in from the files; each worker checks its own).
  int64_t train_size = 0;
};

// dataset.name csv: a table of numbers on the workers (common/data/csv.h).
struct CsvSpec {
  std::string train, test;            // paths; test optional
  std::string label;                  // the label column
  std::vector<std::string> features;  // empty: every other column
  int64_t num_features = 0;           // features' count (shape: [n])
  int num_classes = 0;
  int64_t train_size = 0;             // rows, as arrays' train_size
};

// dataset.name image_folder: a directory per class of PNG and JPEG files on
// the workers (common/data/image_folder.h).
struct ImageFolderSpec {
  std::string train, test;  // directories; test optional
  Shape shape;              // [channels (1 or 3), height, width]
  ImageFit fit = ImageFit::kCrop;  // resize: crop | stretch | none
  std::vector<float> mean, std;    // per channel; empty: none
  int crop_padding = 0;            // augment: {crop_padding, hflip}
  bool hflip = false;
  bool skip_bad = false;
  int num_classes = 0;     // class directories
  int64_t train_size = 0;  // images, as arrays' train_size
};

// dataset.name text: a corpus of files on the workers, as next-token
// windows (common/data/text.h).
struct TextSpec {
  // Paths or globs, read in the order given as one stream; test optional.
  std::vector<std::string> train, test;
  // Without test files: the share of the training stream's tokens, at its
  // end, held out as the test split.
  double test_fraction = 0.1;
  std::string vocab;   // a vocabulary file; empty: byte-level tokens
  int64_t seq_len = 128;
  int64_t vocab_size = 256;  // a vocabulary file's tokens (the client's)
  int64_t train_size = 0;    // windows, as arrays' train_size
};

// dataset.name criteo: click logs in Criteo's tab-separated format on the
// workers (common/data/criteo.h).
struct CriteoSpec {
  // Paths or globs, read in the order given as one stream; test optional.
  std::vector<std::string> train, test;
  // Without test files: the share of the training stream's lines, at its
  // end, held out as the test split.
  double test_fraction = 0.1;
  int64_t integer_features = 13;
  int64_t categorical_features = 26;
  int64_t train_size = 0;  // lines of the training split (the client's)
};

struct DatasetSpec {
  // "fashion-mnist", "synthetic", "arrays", "csv", "image_folder", "text",
  // "clicks" or "criteo"
  std::string name;
  std::string root = kDefaultFashionMnistRoot;  // fashion-mnist
  bool normalize = false;      // fashion-mnist: (x - 0.2860) / 0.3530
  SyntheticOptions synthetic;  // synthetic
  ArraysSpec arrays;           // arrays
  CsvSpec csv;                 // csv
  ImageFolderSpec images;      // image_folder
  TextSpec text;               // text
  ClicksOptions clicks;        // clicks
  CriteoSpec criteo;           // criteo
  // Threads that gather a batch (dataset.threads): decoding images is the
  // work worth sharing; the loader's own thread is one.
  int threads = 1;
};

// How gradients and weights travel between workers and the server.
enum class WireDtype { kFloat32, kBfloat16 };


struct TrainingSpec {
  int64_t epochs = 1;
  int64_t batch_size = 64;  // per worker
  int64_t max_steps = 0;    // 0: no limit; otherwise stop after this many
  uint64_t seed = 0;        // initial weights, shuffling, dropout
  // Workers a cluster job trains on: it starts with `workers` and, when
  // max_workers is more (training.workers: {min, max}), free workers join
  // at the start of a later epoch (docs/cluster.md, "Growing a job").
  int64_t workers = 1;
  int64_t max_workers = 1;
  // training.ranks: the job's data-parallel ranks, fixed (0: off, the
  // world is the workers). Each worker holds one or more; the global batch
  // is ranks x batch_size whoever computes them, and a step waits for every
  // rank (docs/cluster.md, "Ranks that outlive workers").
  int64_t ranks = 0;
  // The job's world: its ranks, or else the workers it starts with.
  int64_t World() const { return ranks > 0 ? ranks : workers; }
  // Parameter shards the job's vector is split over; 0: every live shard,
  // as many as keep each range at least 1 MiB (docs/cluster.md).
  int64_t shards = 0;
  // training.replicas: copies of each range, 1 or 2; 0 (unset): 2 for a
  // bsp job that allows two (RangeCopies). With 2, a backup on another shard
  // makes every version its primary makes, and takes over when the
  // primary's shard is lost (docs/cluster.md, "Replicated ranges"). A
  // shard holds one copy of a job: unless `shards` says how many, the
  // primaries take half the live shards.
  int64_t replicas = 0;
  bool tf32 = false;        // let GPU matrix products use TF32 tensor cores
  // bfloat16 halves the bytes of every push and pull; the server still
  // averages, steps and keeps the weights in float32.
  WireDtype wire_dtype = WireDtype::kFloat32;
  ConsistencySpec consistency;
};

// model.python: the submitter's own torch.nn.Module, built and trained by
// Python workers (python/tally/); servers never run it. The client fills in
// `code` (the file's text) and `params` (the module's parameters, in
// named_parameters() order) at submission.
// A persistent buffer of a Python model (BatchNorm's running statistics):
// in state_dict order, with its safetensors dtype ("F32", "I64", ...).
struct BufferInfo {
  std::string name;
  std::string dtype;
  Shape shape;
  int64_t bytes = 0;
};

// model.python: the submitter's own torch.nn.Module, built and trained by
// Python workers (python/tally/); servers never run it. The client fills in
// `code` (the file's text), `params` (the module's parameters, in
// named_parameters() order), `buffers` and `aliases` at submission.
struct PythonModelSpec {
  std::string file;                  // as the submitter named it
  // The function that returns the module; for a directory,
  // module.function (the module's path under it, dotted).
  std::string build = "make_model";
  std::string code;  // the file's text; or, for a directory:
  std::map<std::string, std::string> files;  // its .py files by path
  std::vector<BufferInfo> buffers;
  int64_t buffer_bytes = 0;  // all of them
  // state_dict names that are another parameter's (tied weights): alias ->
  // the name in params.
  std::map<std::string, std::string> aliases;
};

// What the model's output is trained against.
enum class LossKind {
  kCrossEntropy,  // the module returns logits [batch, classes]
  kMse,           // squared error against the one-hot label
  kModel,         // forward(x, y) returns the batch's mean loss itself
  // The module returns one logit a sample ([batch] or [batch, 1]) for 0/1
  // labels: log-loss, click accuracy, and the test split's ROC AUC.
  kBinaryCrossEntropy,
};
const char* LossName(LossKind loss);

struct JobSpec {
  std::string name;
  std::string model_preset;  // "" when layers were listed
  std::vector<LayerConfig> layers;
  bool is_python = false;    // model.python instead of layers
  PythonModelSpec python;
  // model.embeddings: the Python model's tables whose rows live on the
  // shards, not in the flat vector (common/spec/embedding.h).
  std::vector<EmbeddingTableSpec> embeddings;
  LossKind loss = LossKind::kCrossEntropy;
  DatasetSpec dataset;
  TrainingSpec training;
  OptimizerConfig optimizer;

  // Derived from the dataset during validation.
  Shape input_shape;  // per sample
  InputType input_type = InputType::kFloat32;
  Shape label_shape;  // per sample: empty (one label) or text's [seq_len]
  int num_classes = 0;  // text: the vocabulary's size
  ModelLayout layout;
};

// How many steps a cluster job runs, fixed by the coordinator and followed
// by every worker. Every rank runs the same number of steps per epoch, that
// of the largest data shard; a rank with a smaller shard pushes an empty
// contribution for the steps it has no batch for.
//
// A job that grows (training.workers: {min, max}) has several worlds, each
// from an epoch on (`worlds`): an epoch's split, and so its steps, are
// those of its world. The coordinator decides each change (GrowSchedule)
// and numbers the plans (`plan`); every shard and worker follows the
// latest.
//
// total_steps counts versions: in bsp and ssp a version is a step of every
// worker; in async it is one worker's push, so an async epoch is
// steps_per_epoch * world versions (the same samples), whichever workers
// push them. A step's place (Locate) is counted in a worker's steps: in
// bsp and ssp the version it makes, in async the worker's own clock.
struct WorldPeriod {
  int64_t first_epoch = 0;
  int world = 1;
};
struct Schedule {
  int64_t train_size = 0;       // samples in the training set
  int64_t steps_per_epoch = 0;  // the first world's: ceil(ceil(train_size /
                                // world) / batch), >= 1
  int64_t total_steps = 0;      // versions: see above; capped by max_steps
  int64_t versions_per_epoch = 0;  // the first world's; times world in async
  std::vector<WorldPeriod> worlds;  // in order, the first from epoch 0
  int64_t plan = 0;
  // From the spec, for the figures of other worlds.
  int64_t batch_size = 1;
  int64_t epochs = 1;
  bool async = false;

  // A world's steps per epoch, and versions per epoch.
  int64_t StepsPerEpoch(int world) const;
  int64_t VersionsPerEpoch(int world) const;
  struct Place {
    int64_t epoch = 0;
    int64_t index = 0;        // the step within its epoch
    int64_t steps_per_epoch = 1;
    int world = 1;
    // The first step of the next world (INT64_MAX: none).
    int64_t period_end = 0;
  };
  // Where a step falls (past the last epoch: in the last world's epochs).
  Place Locate(int64_t step) const;
  // The first step, and the first version, of `epoch`.
  int64_t EpochStart(int64_t epoch) const;
  int64_t EpochStartVersion(int64_t epoch) const;
  // The epoch version `v` is in (past the end: epochs - 1).
  int64_t EpochOfVersion(int64_t v) const;
  // The step a worker is at when the job is at version `v`: the version
  // itself in bsp and ssp; in async, where every member's push is a
  // version, the start of v's epoch plus its versions there over the
  // epoch's world.
  int64_t ClockOfVersion(int64_t v) const;
  // The first step at which rank `rank` has data: the start of the first
  // epoch whose world includes it (0 for the first world's ranks).
  int64_t FirstStepOfRank(int rank) const;
  // The world the job ends with.
  int last_world() const { return worlds.empty() ? 1 : worlds.back().world; }
};
Schedule MakeSchedule(const JobSpec& spec, int64_t train_size, int world);

// The copies of each range the job is to have where two shards are live:
// training.replicas when set, else 2 for a bsp job without backup
// workers that allows two (a plan that does not grow, no tables) and 1 for
// any other.
int64_t RangeCopies(const JobSpec& spec);

// `s` with `world` workers from `epoch` on (the worlds it had from there
// replaced), total_steps recomputed and the plan one more.
Schedule GrowSchedule(const Schedule& s, int64_t epoch, int world,
                      int64_t max_steps);
// The schedule of `worlds` (as GrowSchedule made them) at `plan`.
Schedule ScheduleOf(const JobSpec& spec, int64_t train_size,
                    const std::vector<WorldPeriod>& worlds, int64_t plan);

// The size of the training set a dataset spec names, known without loading
// it: synthetic, its train_size; fashion-mnist, 60000 (the dataset's
// definition; a worker whose files hold another count cannot train the job).
int64_t TrainSize(const DatasetSpec& spec);

// What a spec may ask for, checked before anything is allocated (sizes are
// multiplied with overflow checks). A spec past a limit is refused with
// kInvalidArgument naming the limit. The coordinator's are configurable
// (tally-server --max_spec_bytes, --max_params); workers and shards apply
// the defaults.
struct SpecLimits {
  int64_t max_spec_bytes = 2 << 20;      // the spec's text: 2 MiB
  // A Python model's code (model.python.code), inside the spec's text.
  int64_t max_model_bytes = 1 << 20;
  // A Python model's parameter tensors, and its buffers' bytes (a report
  // carries them: within the control plane's 4 MiB messages).
  int64_t max_model_tensors = 65536;
  // With the spec (max_spec_bytes), within one 4 MiB message: a range's
  // install carries both (its buffer region).
  int64_t max_buffer_bytes = 1 << 20;
  int64_t max_layers = 1024;
  int64_t max_params = int64_t{1} << 28;  // 268M float32 values: 1 GiB
  // Elements of one sample's largest activation (an image, a feature map).
  int64_t max_sample_elements = int64_t{1} << 24;
  // Values of a generated (synthetic) dataset, teacher network included.
  int64_t max_dataset_values = int64_t{1} << 28;
  // Values of one batch, inputs and labels (batch_size times a sample's):
  // each worker's loader holds a few such batches.
  int64_t max_batch_values = int64_t{1} << 28;
};

// Parses and validates. kInvalidArgument with the offending field's path.
absl::StatusOr<JobSpec> ParseJobSpec(absl::string_view text,
                                     const SpecLimits& limits = SpecLimits());
// Reads `path` and parses it; kNotFound when it cannot be read.
absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path);

// The sample shape, input type, label shape and class count that
// spec->dataset yields, into spec's derived fields (no data loaded).
absl::Status DescribeDataset(JobSpec* spec);

// The name of what a job's metrics call its loss: the model's (LossName),
// but "token_cross_entropy" for cross_entropy over text's next tokens,
// whose figures are per token and have no accuracy.
const char* MetricLossName(const JobSpec& spec);

// Every file and directory the dataset names (globs expanded) resolves
// under `roots`: kPermissionDenied naming the field and the roots for one
// outside them, kNotFound for one missing, kFailedPrecondition for a link
// loop. A worker checks this when it is assigned a job, before it opens
// anything (docs/security.md, "Data roots").
absl::Status CheckDataPaths(const DatasetSpec& spec, const DataRoots& roots);

// Loads (or generates) the train and test sets a spec names, after
// CheckDataPaths. Every file is opened as common/data/data_file.h says
// (regular files only, without blocking, within size bounds).
// DataRoots::Any() opens any path (a standalone run of one's own spec).
absl::StatusOr<TrainTest> OpenDataset(const DatasetSpec& spec,
                                      const DataRoots& roots);

// The layers of a preset for a sample shape and class count:
//   mlp: flatten, linear(in, 256), relu, linear(256, 128), relu,
//        linear(128, classes)
//   cnn: conv2d(C, 10, 5), relu, maxpool2d(2), flatten,
//        linear(10 * ((H-4)/2) * ((W-4)/2), classes)
absl::StatusOr<std::vector<LayerConfig>> PresetLayers(absl::string_view preset,
                                                      const Shape& input_shape,
                                                      int num_classes);

}  // namespace tally

#endif  // TALLY_COMMON_SPEC_JOB_SPEC_H_
