#include "common/spec/job_spec.h"

#include <vector>

#include "common/data/dataset.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace tally {
namespace {

using ::tally::testing::SourcePath;
using ::tally::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kSynthetic[] = R"(
dataset: {name: synthetic, train_size: 256, test_size: 64, features: 8, classes: 3}
)";

std::string WithModel(const std::string& model, const std::string& extra = "") {
  return std::string(kSynthetic) + "model:\n" + model + extra;
}

TEST(JobSpecTest, ExamplesParse) {
  for (const char* f :
       {"examples/fashion-mnist-mlp.yaml", "examples/fashion-mnist-cnn.yaml"}) {
    auto spec = LoadJobSpec(SourcePath(f));
    ASSERT_TRUE(spec.ok()) << f << ": " << spec.status();
    EXPECT_EQ(spec->input_shape, (Shape{1, 28, 28}));
    EXPECT_EQ(spec->num_classes, 10);
    EXPECT_EQ(spec->training.epochs, 2);
    EXPECT_EQ(spec->optimizer.momentum, 0.9);
  }
  auto mlp = LoadJobSpec(SourcePath("examples/fashion-mnist-mlp.yaml"));
  ASSERT_TRUE(mlp.ok());
  EXPECT_EQ(mlp->layout.num_params,
            784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ(mlp->layout.params[0].name, "1.weight");
}

TEST(JobSpecTest, PresetsExpandForTheDataset) {
  auto cnn =
      ParseJobSpec("model: {preset: cnn}\ndataset: {name: fashion-mnist}\n");
  ASSERT_TRUE(cnn.ok()) << cnn.status();
  ASSERT_EQ(cnn->layers.size(), 5u);
  EXPECT_EQ(cnn->layers[4].in_features, 1440);
  auto mlp = ParseJobSpec(WithModel("  preset: mlp\n"));
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  EXPECT_EQ(mlp->layers[1].in_features, 8);
  EXPECT_EQ(mlp->layers[5].out_features, 3);
  EXPECT_THAT(
      ParseJobSpec(WithModel("  preset: cnn\n")),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.preset")));
  EXPECT_THAT(ParseJobSpec(WithModel("  preset: resnet\n")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown preset 'resnet'")));
}

TEST(JobSpecTest, DefaultsAndJson) {
  auto spec = ParseJobSpec(
      R"({"model": {"layers": [{"linear": {"in_features": 8, "out_features": 3}}]},
          "dataset": {"name": "synthetic", "features": 8, "classes": 3},
          "optimizer": {"type": "adamw"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->training.batch_size, 64);
  EXPECT_EQ(spec->training.epochs, 1);
  EXPECT_EQ(spec->optimizer.type, OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(spec->optimizer.lr, 0.001);
  EXPECT_DOUBLE_EQ(spec->optimizer.weight_decay, 0.01);
  EXPECT_EQ(spec->training.wire_dtype, WireDtype::kFloat32);
}

struct BadCase {
  const char* name;
  std::string text;
  const char* message;
  friend void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }
};

class BadSpecTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadSpecTest, RejectedWithTheFieldNamed) {
  EXPECT_THAT(ParseJobSpec(GetParam().text),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(GetParam().message)));
}

const char kLinear8x3[] =
    "  layers: [{linear: {in_features: 8, out_features: 3}}]\n";

INSTANTIATE_TEST_SUITE_P(
    Cases, BadSpecTest,
    ::testing::Values(
        BadCase{"not_yaml", "model: [unclosed", "not valid YAML"},
        BadCase{"not_mapping", "- a\n- b\n", "mapping at the top level"},
        BadCase{"unknown_top_field",
                WithModel(kLinear8x3, "trainig: {epochs: 2}\n"),
                "trainig: unknown field"},
        BadCase{"no_dataset", "model: {preset: mlp}\n", "dataset: is required"},
        BadCase{"unknown_dataset",
                "model: {preset: mlp}\ndataset: {name: cifar}\n",
                "dataset.name: unknown dataset 'cifar'"},
        BadCase{"arrays_without_train",
                "model: {preset: mlp}\ndataset: {name: arrays, classes: 3, "
                "shape: [8], train_size: 10}\n",
                "dataset.train: is required"},
        BadCase{"arrays_without_labels",
                "model: {preset: mlp}\ndataset: {name: arrays, train: {inputs: "
                "x.npy}, classes: 3, shape: [8], train_size: 10}\n",
                "dataset.train: needs inputs and labels"},
        BadCase{"arrays_without_size",
                "model: {preset: mlp}\ndataset: {name: arrays, train: {inputs: "
                "x.npy, labels: y.npy}, classes: 3, shape: [8]}\n",
                "dataset.train_size: is required: the schedule is fixed"},
        BadCase{"arrays_without_shape",
                "model: {preset: mlp}\ndataset: {name: arrays, train: {inputs: "
                "x.npy, labels: y.npy}, classes: 3, train_size: 10}\n",
                "dataset.shape: must list one sample's 1 to 4 sizes"},
        BadCase{"images_without_train",
                "model: {preset: mlp}\ndataset: {name: image_folder, shape: "
                "[1, 8, 8], classes: 3, train_size: 10}\n",
                "dataset.train: is required (a directory per class)"},
        BadCase{"images_two_channels",
                "model: {preset: mlp}\ndataset: {name: image_folder, train: "
                "/d, shape: [2, 8, 8], classes: 3, train_size: 10}\n",
                "dataset.shape: must be [channels (1 or 3), height, width]"},
        BadCase{"images_unknown_resize",
                "model: {preset: mlp}\ndataset: {name: image_folder, train: "
                "/d, shape: [1, 8, 8], resize: squash, classes: 3, "
                "train_size: 10}\n",
                "dataset.resize: unknown 'squash' (crop, stretch or none)"},
        BadCase{"images_mean_per_channel",
                "model: {preset: mlp}\ndataset: {name: image_folder, train: "
                "/d, shape: [3, 8, 8], mean: [0.5], std: [0.2], classes: 3, "
                "train_size: 10}\n",
                "dataset.mean: must list one number per channel (3)"},
        BadCase{"images_std_zero",
                "model: {preset: mlp}\ndataset: {name: image_folder, train: "
                "/d, shape: [1, 8, 8], mean: [0.5], std: [0], classes: 3, "
                "train_size: 10}\n",
                "dataset.std: must be positive"},
        BadCase{"images_augment_typo",
                "model: {preset: mlp}\ndataset: {name: image_folder, train: "
                "/d, shape: [1, 8, 8], augment: {flip: true}, classes: 3, "
                "train_size: 10}\n",
                "dataset.augment.flip: unknown field"},
        BadCase{"text_without_train",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: text, train_size: 10}\n",
                "dataset.train: is required (text files or globs)"},
        BadCase{"text_without_size",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: text, train: c.txt}\n",
                "dataset.train_size: is required: the training windows"},
        BadCase{"text_test_and_fraction",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: text, train: c.txt, test: t.txt, "
                "test_fraction: 0.2, train_size: 10}\n",
                "dataset.test_fraction: is for a corpus without test files"},
        BadCase{"text_fraction_one",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: text, train: c.txt, test_fraction: 1, "
                "train_size: 10}\n",
                "dataset.test_fraction: must be in [0, 1)"},
        BadCase{"text_bytes_vocab_size",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: text, train: c.txt, vocab_size: 300, "
                "train_size: 10}\n",
                "dataset.vocab_size"},
        BadCase{"text_vocab_without_size",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: text, train: c.txt, vocab: v.txt, "
                "train_size: 10}\n",
                "dataset.vocab_size: is required with a vocabulary file"},
        BadCase{"text_seq_len",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: text, train: c.txt, seq_len: 0, "
                "train_size: 10}\n",
                "dataset.seq_len"},
        BadCase{"text_for_layers",
                "model: {preset: mlp}\ndataset: {name: text, train: c.txt, "
                "train_size: 10}\n",
                "model: a text dataset's samples are int64 ids; train it "
                "with a Python model"},
        BadCase{"clicks_for_layers",
                "model: {preset: mlp}\ndataset: {name: clicks}\n",
                "model: a clicks dataset's samples are int64 ids"},
        BadCase{"clicks_zipf",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: clicks, zipf: 0}\n",
                "dataset.zipf: must be in (0, 4]"},
        BadCase{"criteo_no_train",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: criteo, train_size: 10}\n",
                "dataset.train: is required (Criteo TSV files or globs)"},
        BadCase{"criteo_no_size",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: criteo, train: day_0.tsv}\n",
                "dataset.train_size: is required: the training lines"},
        BadCase{"criteo_test_and_fraction",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: criteo, train: a.tsv, test: b.tsv, "
                "test_fraction: 0.2, train_size: 10}\n",
                "dataset.test_fraction: is for logs without test files"},
        BadCase{"criteo_no_categories",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: criteo, train: a.tsv, categorical_features: "
                "0, train_size: 10}\n",
                "dataset.categorical_features"},
        BadCase{"criteo_for_layers",
                "model: {preset: mlp}\ndataset: {name: criteo, train: a.tsv, "
                "train_size: 10}\n",
                "model: a criteo dataset's samples are int64 ids"},
        BadCase{"table_dynamic_rows",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, num_embeddings: 8, dynamic: "
                "true}]}\ndataset: {name: clicks}\n",
                "model.embeddings[0].num_embeddings: is for a fixed table"},
        BadCase{"table_dynamic_ids",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, dynamic: true, ids: direct}]}"
                "\ndataset: {name: clicks}\n",
                "model.embeddings[0].ids: is for a fixed table"},
        BadCase{"table_dynamic_uniform",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, dynamic: true, init: uniform}]}"
                "\ndataset: {name: clicks}\n",
                "model.embeddings[0].init_scale: is required with init: "
                "uniform on a dynamic table"},
        BadCase{"table_fixed_evicts",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, num_embeddings: 8, "
                "evict_after_steps: 10}]}\ndataset: {name: clicks}\n",
                "model.embeddings[0].evict_after_steps: is for a dynamic "
                "table"},
        BadCase{"table_min_count",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, dynamic: true, min_count: "
                "0}]}\ndataset: {name: clicks}\n",
                "model.embeddings[0].min_count"},
        BadCase{"table_for_layers",
                "model: {preset: mlp, embeddings: [{name: e, dim: 4, "
                "num_embeddings: 8}]}\ndataset: {name: synthetic}\n",
                "model.embeddings: tables are a Python model's"},
        BadCase{"table_twice",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, num_embeddings: 8}, {name: e, "
                "dim: 4, num_embeddings: 8}]}\ndataset: {name: clicks}\n",
                "model.embeddings[1].name: table 'e' is listed twice"},
        BadCase{"table_optimizer",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, num_embeddings: 8, optimizer: "
                "{type: rmsprop}}]}\ndataset: {name: clicks}\n",
                "model.embeddings[0].optimizer.type: unknown table optimizer "
                "'rmsprop' (known: sgd, adagrad, adam)"},
        BadCase{"table_adam_decay",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, num_embeddings: 8, optimizer: "
                "{type: adam, weight_decay: 0.1}}]}\ndataset: {name: clicks}\n",
                "model.embeddings[0].optimizer.weight_decay: unknown field"},
        BadCase{"table_features_on_text",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, num_embeddings: 8, features: "
                "[0]}]}\ndataset: {name: synthetic}\n",
                "model.embeddings[0].features: column 0 is not one of the "
                "samples' inputs"},
        BadCase{"table_features_past",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, num_embeddings: 8, features: "
                "[39]}]}\ndataset: {name: clicks}\n",
                "column 39 is not one of the samples' 39 int64 ids"},
        BadCase{"bce_classes",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "loss: binary_cross_entropy}\ndataset: {name: synthetic}\n",
                "model.loss: binary_cross_entropy takes 0/1 labels, one a "
                "sample; the dataset has 4 classes"},
        BadCase{"table_backups",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, num_embeddings: 8}]}\n"
                "dataset: {name: clicks}\ntraining: {workers: 3, consistency: "
                "{mode: bsp, backup_workers: 1}}\n",
                "model.embeddings: tables do not train with backup_workers"},
        BadCase{"table_async_sync",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, num_embeddings: 8}]}\n"
                "dataset: {name: clicks}\ntraining: {consistency: {mode: async, "
                "tables: sync}}\n",
                "training.consistency.tables: sync needs steps that close"},
        BadCase{"tables_rule",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "embeddings: [{name: e, dim: 4, num_embeddings: 8}]}\n"
                "dataset: {name: clicks}\ntraining: {consistency: {tables: "
                "later}}\n",
                "training.consistency.tables: unknown rule 'later'"},
        BadCase{"tables_async_without_tables",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: clicks}\ntraining: {consistency: {tables: "
                "async}}\n",
                "training.consistency.tables: applies to a model with tables"},
        BadCase{"text_mse",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
                "loss: mse}\ndataset: {name: text, train: c.txt, "
                "train_size: 10}\n",
                "model.loss: mse takes one class a sample"},
        BadCase{"batch_too_large",
                "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}"
                "\ndataset: {name: text, train: c.txt, seq_len: 65536, "
                "train_size: 10}\ntraining: {batch_size: 1048576}\n",
                "training.batch_size: batches of 1048576 samples of [65536] "
                "are over the limit of 268435456 values (max_batch_values)"},
        BadCase{"dataset_threads",
                "model: {preset: mlp}\ndataset: {name: synthetic, threads: "
                "0}\n",
                "dataset.threads"},
        BadCase{"no_model", kSynthetic, "model: is required"},
        BadCase{"unknown_layer", WithModel("  layers: [flatten, relux]\n"),
                "model.layers[1]: unknown layer type 'relux'"},
        BadCase{"layer_missing_arg",
                WithModel("  layers: [{linear: {in_features: 8}}]\n"),
                "model.layers[0].linear: needs in_features and out_features"},
        BadCase{"layer_unknown_arg",
                WithModel("  layers: [{linear: {in_features: 8, out_features: "
                          "3, bais: true}}]\n"),
                "model.layers[0].linear.bais: unknown field"},
        BadCase{
            "chain_mismatch",
            WithModel(
                "  layers: [{linear: {in_features: 8, out_features: 256}}, "
                "relu,\n"
                "           {linear: {in_features: 128, out_features: 3}}]\n"),
            "model.layers[2] (linear): in_features is 128 but the input has "
            "256 features"},
        // The classic mistake: view(-1, 1440) after a 5x5 conv needs the 2x2
        // pool.
        BadCase{
            "cnn_without_pool",
            "dataset: {name: fashion-mnist}\nmodel:\n  layers:\n"
            "    - conv2d: {in_channels: 1, out_channels: 10, kernel_size: 5}\n"
            "    - relu\n    - flatten\n"
            "    - linear: {in_features: 1440, out_features: 10}\n",
            "model.layers[3] (linear): in_features is 1440 but the input has "
            "5760 features"},
        BadCase{"linear_on_image",
                "dataset: {name: fashion-mnist}\nmodel:\n  layers:\n"
                "    - linear: {in_features: 784, out_features: 10}\n",
                "add a flatten layer"},
        BadCase{"conv_channels",
                "dataset: {name: fashion-mnist}\nmodel:\n  layers:\n"
                "    - conv2d: {in_channels: 3, out_channels: 10, kernel_size: "
                "5}\n",
                "model.layers[0] (conv2d): in_channels is 3 but the input has "
                "1 channels"},
        BadCase{"kernel_too_big",
                "dataset: {name: fashion-mnist}\nmodel:\n  layers:\n"
                "    - maxpool2d: {kernel_size: 40}\n",
                "kernel_size 40 does not fit the 28x28 input"},
        BadCase{
            "wrong_class_count",
            WithModel(
                "  layers: [{linear: {in_features: 8, out_features: 4}}]\n"),
            "yields [4] per sample but the dataset has 3 classes"},
        BadCase{"negative_lr",
                WithModel(kLinear8x3, "optimizer: {type: sgd, lr: -0.1}\n"),
                "optimizer: lr must be a finite number >= 0, got -0.1"},
        BadCase{"unknown_optimizer",
                WithModel(kLinear8x3, "optimizer: {type: lbfgs}\n"),
                "optimizer.type: unknown optimizer type 'lbfgs'"},
        BadCase{"sgd_with_betas",
                WithModel(kLinear8x3,
                          "optimizer: {type: sgd, betas: [0.9, 0.9]}\n"),
                "optimizer.betas: unknown field"},
        BadCase{"zero_batch",
                WithModel(kLinear8x3, "training: {batch_size: 0}\n"),
                "training.batch_size: must be in [1"},
        BadCase{"epochs_not_int",
                WithModel(kLinear8x3, "training: {epochs: two}\n"),
                "training.epochs: must be an integer, got 'two'"},
        BadCase{"dropout_p",
                WithModel("  layers: [{dropout: {p: 1.5}}, {linear: "
                          "{in_features: 8, out_features: 3}}]\n"),
                "model.layers[0].dropout.p: must be in [0, 1)"},
        BadCase{"unknown_consistency_mode",
                WithModel(kLinear8x3,
                          "training: {consistency: {mode: hogwild}}\n"),
                "training.consistency.mode: unknown mode 'hogwild'"},
        BadCase{"ssp_without_staleness",
                WithModel(kLinear8x3, "training: {consistency: {mode: ssp}}\n"),
                "training.consistency.staleness: is required with mode ssp"},
        BadCase{"staleness_for_bsp",
                WithModel(kLinear8x3,
                          "training: {consistency: {staleness: 2}}\n"),
                "training.consistency.staleness: applies to mode ssp only"},
        BadCase{"negative_staleness",
                WithModel(kLinear8x3, "training: {consistency: {mode: ssp, "
                                      "staleness: -1}}\n"),
                "training.consistency.staleness: must be in [0"},
        BadCase{"unknown_lr_scaling",
                WithModel(kLinear8x3, "training: {consistency: {mode: async, "
                                      "lr_scaling: sqrt}}\n"),
                "training.consistency.lr_scaling: unknown scaling 'sqrt'"},
        BadCase{"max_staleness_for_bsp",
                WithModel(kLinear8x3,
                          "training: {consistency: {max_staleness: 3}}\n"),
                "training.consistency.max_staleness: has no effect with mode "
                "bsp"},
        BadCase{"max_staleness_for_ssp",
                WithModel(kLinear8x3, "training: {consistency: {mode: ssp, "
                                      "staleness: 3, max_staleness: 2}}\n"),
                "training.consistency.max_staleness: applies to mode async "
                "only"},
        BadCase{"workers_range_backwards",
                WithModel(kLinear8x3, "training: {workers: {min: 3, max: 2}}\n"),
                "training.workers.max: must be at least min (3), got 2"},
        BadCase{"workers_range_half",
                WithModel(kLinear8x3, "training: {workers: {min: 2}}\n"),
                "training.workers: needs min and max"},
        BadCase{"workers_range_unknown_key",
                WithModel(kLinear8x3,
                          "training: {workers: {min: 1, max: 2, step: 1}}\n"),
                "training.workers.step: unknown field"},
        BadCase{"workers_range_too_many",
                WithModel(kLinear8x3,
                          "training: {workers: {min: 1, max: 2000}}\n"),
                "training.workers.max: must be in [1, 1024]"},
        BadCase{"ranks_fewer_than_workers",
                WithModel(kLinear8x3, "training: {ranks: 2, workers: 3}\n"),
                "training.workers: at most training.ranks (2) workers"},
        BadCase{"ranks_async",
                WithModel(kLinear8x3, "training: {ranks: 4, consistency: "
                                      "{mode: async}}\n"),
                "training.consistency.mode: async closes no steps for "
                "training.ranks"},
        BadCase{"ranks_backup_workers",
                WithModel(kLinear8x3, "training: {ranks: 4, workers: 3, "
                                      "consistency: {backup_workers: 1}}\n"),
                "training.consistency.backup_workers: not with "
                "training.ranks"},
        BadCase{"ranks_zero",
                WithModel(kLinear8x3, "training: {ranks: 0}\n"),
                "training.ranks: must be in [1, 1024]"},
        BadCase{"replicas_three",
                WithModel(kLinear8x3, "training: {replicas: 3}\n"),
                "training.replicas: must be in [1, 2]"},
        BadCase{"replicas_async",
                WithModel(kLinear8x3, "training: {replicas: 2, consistency: "
                                      "{mode: async}}\n"),
                "training.replicas: two copies need steps that close"},
        BadCase{"replicas_growing",
                WithModel(kLinear8x3, "training: {replicas: 2, workers: "
                                      "{min: 1, max: 3}}\n"),
                "training.replicas: two copies are for a job that does not "
                "grow"},
        BadCase{"backup_workers_for_async",
                WithModel(kLinear8x3, "training: {workers: 3, consistency: "
                                      "{mode: async, backup_workers: 1}}\n"),
                "training.consistency.backup_workers: applies to mode bsp "
                "only"},
        BadCase{"backup_workers_too_many",
                WithModel(kLinear8x3, "training: {workers: 2, consistency: "
                                      "{backup_workers: 2}}\n"),
                "training.consistency.backup_workers: must be less than "
                "training.workers (2)"},
        BadCase{"backup_workers_on_shards",
                WithModel(kLinear8x3, "training: {workers: 3, shards: 2, "
                                      "consistency: {backup_workers: 1}}\n"),
                "training.consistency.backup_workers: needs the job on one "
                "shard"},
        BadCase{"consistency_unknown_field",
                WithModel(kLinear8x3, "training: {consistency: {mode: ssp, "
                                      "staleness: 1, stalenes: 2}}\n"),
                "training.consistency.stalenes: unknown field"},
        BadCase{"both_preset_and_layers",
                WithModel("  preset: mlp\n" + std::string(kLinear8x3)),
                "one of preset, layers and python"},
        BadCase{"python_without_code",
                WithModel("  python: {file: m.py, params: [{name: w, shape: "
                          "[3, 8]}]}\n"),
                "model.python.code: is missing: submit with the Python "
                "client"},
        BadCase{"python_without_params",
                WithModel("  python: {file: m.py, code: x}\n"),
                "model.python.params: is missing"},
        BadCase{"python_param_twice",
                WithModel("  python: {code: x, params: [{name: w, shape: [3]}, "
                          "{name: w, shape: [2]}]}\n"),
                "model.python.params[1].name: must be a unique name"},
        BadCase{"python_param_zero_size",
                WithModel("  python: {code: x, params: [{name: w, shape: [3, "
                          "0]}]}\n"),
                "model.python.params[0].shape: sizes must be in [1, "},
        BadCase{"python_buffer_dtype",
                WithModel("  python: {code: x, params: [{name: w, shape: [3]}], "
                          "buffers: [{name: b, dtype: F128, shape: [2]}]}\n"),
                "model.python.buffers[0]: needs a name of 1 to 256 bytes and a "
                "dtype"},
        BadCase{"python_alias_of_nothing",
                WithModel("  python: {code: x, params: [{name: w, shape: [3]}], "
                          "aliases: {v: u}}\n"),
                "model.python.aliases: must map other names"},
        BadCase{"python_unknown_loss",
                WithModel("  python: {code: x, params: [{name: w, shape: [3]}]}"
                          "\n  loss: hinge\n"),
                "model.loss: unknown loss 'hinge'"},
        BadCase{"schedule_unknown",
                WithModel(kLinear8x3, "optimizer: {schedule: {type: linear}}\n"),
                "optimizer.schedule.type: unknown schedule 'linear'"},
        BadCase{"schedule_step_without_size",
                WithModel(kLinear8x3, "optimizer: {schedule: {type: step}}\n"),
                "optimizer.schedule: type step needs step_size"},
        BadCase{"python_code_and_files",
                WithModel("  python: {code: x, files: {a.py: y}, params: "
                          "[{name: w, shape: [3]}]}\n"),
                "model.python: has code and files"},
        BadCase{"python_file_outside",
                WithModel("  python: {files: {../a.py: y}, params: "
                          "[{name: w, shape: [3]}]}\n"),
                "model.python.files: '../a.py' is not a .py file's relative "
                "path"},
        BadCase{"python_file_not_py",
                WithModel("  python: {files: {a.txt: y}, params: "
                          "[{name: w, shape: [3]}]}\n"),
                "model.python.files: 'a.txt' is not a .py file's"},
        BadCase{"clip_negative",
                WithModel("  python: {code: x, params: [{name: w, shape: [3]}]}\n",
                          "optimizer: {clip_grad_norm: -1}\n"),
                "optimizer: clip_grad_norm must be a finite number >= 0, got -1"},
        BadCase{"clip_with_layers",
                WithModel(kLinear8x3, "optimizer: {clip_grad_norm: 1}\n"),
                "optimizer.clip_grad_norm: is for a Python model"},
        BadCase{"layers_with_mse",
                WithModel(std::string(kLinear8x3) + "  loss: mse\n"),
                "model.loss: a model of layers trains with cross_entropy"}),
    [](const auto& info) { return std::string(info.param.name); });

// Unset, training.replicas is 2 for a bsp job that can have two copies,
// and 1 for one that cannot (it grows, it is async or ssp, it has tables);
// set, it is what it says.
TEST(JobSpecTest, RangesHaveTwoCopiesWhereTheJobAllowsUnlessItSaysOne) {
  auto copies = [](const std::string& training) -> int64_t {
    absl::StatusOr<JobSpec> s = ParseJobSpec(WithModel(kLinear8x3, training));
    EXPECT_TRUE(s.ok()) << training << ": " << s.status();
    return s.ok() ? RangeCopies(*s) : -1;
  };
  EXPECT_EQ(copies(""), 2);
  EXPECT_EQ(copies("training: {ranks: 4}\n"), 2);
  EXPECT_EQ(copies("training: {replicas: 1}\n"), 1);
  EXPECT_EQ(copies("training: {workers: {min: 1, max: 3}}\n"), 1);
  EXPECT_EQ(copies("training: {consistency: {mode: async}}\n"), 1);
  EXPECT_EQ(copies("training: {consistency: {mode: ssp, staleness: 1}}\n"), 1);
  EXPECT_EQ(copies("training: {workers: 3, consistency: {backup_workers: "
                   "1}}\n"),
            1);
  EXPECT_EQ(copies("training: {replicas: 2, consistency: {mode: ssp, "
                   "staleness: 1}}\n"),
            2);
  absl::StatusOr<JobSpec> tables = ParseJobSpec(
      "model: {python: {file: m.py, code: x, params: [{name: w, shape: [2, "
      "4]}]}, embeddings: [{name: e, ids: direct, num_embeddings: 100, dim: "
      "1}]}\n"
      "dataset: {name: synthetic, features: 4, classes: 2}\n");
  ASSERT_TRUE(tables.ok()) << tables.status();
  EXPECT_EQ(RangeCopies(*tables), 1);
}

TEST(JobSpecTest, AnArraysDatasetGivesItsShapeClassesAndSize) {
  auto spec = ParseJobSpec(
      "model: {preset: cnn}\ndataset: {name: arrays, train: {inputs: /d/x.npy, "
      "labels: /d/y.npy}, test: {inputs: /d/tx.npy, labels: /d/ty.npy}, "
      "classes: 10, shape: [1, 28, 28], train_size: 60000}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->input_shape, (Shape{1, 28, 28}));
  EXPECT_EQ(spec->num_classes, 10);
  EXPECT_EQ(TrainSize(spec->dataset), 60000);
  EXPECT_EQ(spec->dataset.arrays.test.labels, "/d/ty.npy");
  // The files are the workers' to open: one that is not there says so.
  EXPECT_THAT(OpenDataset(spec->dataset, DataRoots::Any()),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("/d/x.npy: no such file")));
}

TEST(JobSpecTest, AnImageFolderGivesItsShapeAndOptions) {
  auto spec = ParseJobSpec(
      "model: {preset: cnn}\ndataset: {name: image_folder, train: /d/train, "
      "shape: [1, 28, 28], resize: stretch, mean: [0.3], std: [0.4], augment: "
      "{crop_padding: 2, hflip: true}, skip_bad: true, threads: 3, classes: "
      "10, train_size: 600}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->input_shape, (Shape{1, 28, 28}));
  EXPECT_EQ(TrainSize(spec->dataset), 600);
  const ImageFolderSpec& f = spec->dataset.images;
  EXPECT_EQ(f.fit, ImageFit::kStretch);
  EXPECT_EQ(f.std, (std::vector<float>{0.4f}));
  EXPECT_EQ(f.crop_padding, 2);
  EXPECT_TRUE(f.hflip && f.skip_bad);
  EXPECT_EQ(spec->dataset.threads, 3);
  EXPECT_THAT(OpenDataset(spec->dataset, DataRoots::Any()),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("/d/train: no such directory")));
}

TEST(JobSpecTest, ATextDatasetGivesTokenWindows) {
  auto spec = ParseJobSpec(
      "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}}\n"
      "dataset: {name: text, train: [/d/a.txt, '/d/b-*.txt'], seq_len: 64, "
      "test_fraction: 0.05, train_size: 1000}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->input_shape, (Shape{64}));
  EXPECT_EQ(spec->input_type, InputType::kInt64);
  EXPECT_EQ(spec->label_shape, (Shape{64}));
  EXPECT_EQ(spec->num_classes, 256);  // byte-level
  EXPECT_EQ(TrainSize(spec->dataset), 1000);
  EXPECT_EQ(spec->dataset.text.train,
            (std::vector<std::string>{"/d/a.txt", "/d/b-*.txt"}));
  EXPECT_DOUBLE_EQ(spec->dataset.text.test_fraction, 0.05);
  EXPECT_STREQ(MetricLossName(*spec), "token_cross_entropy");
  // Globs are expanded before any file is opened.
  EXPECT_THAT(OpenDataset(spec->dataset, DataRoots::Any()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("/d/b-*.txt: the pattern matches no file")));
  auto vocab = ParseJobSpec(
      "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, loss: "
      "model}\ndataset: {name: text, train: a.txt, test: t.txt, vocab: "
      "v.txt, vocab_size: 5000, train_size: 10}\n");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->num_classes, 5000);
  EXPECT_DOUBLE_EQ(vocab->dataset.text.test_fraction, 0);
  EXPECT_STREQ(MetricLossName(*vocab), "model");
}

TEST(JobSpecTest, APythonModelsLayoutComesFromItsParams) {
  auto spec = ParseJobSpec(WithModel(
      "  python: {file: m.py, build: build, code: 'import torch', params: "
      "[{name: fc.weight, shape: [3, 8]}, {name: fc.bias, shape: [3]}], "
      "buffers: [{name: bn.running_mean, dtype: F32, shape: [3]}, {name: "
      "bn.num_batches_tracked, dtype: I64, shape: []}], aliases: {head.weight: "
      "fc.weight}}\n  loss: model\n"));
  TALLY_ASSERT_OK(spec);
  EXPECT_TRUE(spec->is_python);
  EXPECT_EQ(spec->python.build, "build");
  EXPECT_EQ(spec->loss, LossKind::kModel);
  EXPECT_EQ(spec->layout.num_params, 27);
  ASSERT_EQ(spec->layout.params.size(), 2u);
  EXPECT_EQ(spec->layout.params[1].offset, 24);
  EXPECT_EQ(spec->python.buffer_bytes, 3 * 4 + 8);
  EXPECT_EQ(spec->python.aliases.at("head.weight"), "fc.weight");
  // The code's size is bounded before anything else is read.
  SpecLimits limits;
  limits.max_model_bytes = 4;
  EXPECT_THAT(ParseJobSpec(WithModel("  python: {code: 'import torch', "
                                     "params: [{name: w, shape: [3]}]}\n"),
                           limits),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("over the limit of 4 (max_model_bytes)")));
}

TEST(JobSpecTest, ConsistencyDefaultsAndAsyncSchedule) {
  auto bsp = ParseJobSpec(WithModel(kLinear8x3, ""));
  TALLY_ASSERT_OK(bsp);
  EXPECT_EQ(bsp->training.consistency.mode, ConsistencyMode::kBsp);
  EXPECT_EQ(bsp->training.consistency.max_staleness, -1);
  auto ssp = ParseJobSpec(WithModel(
      kLinear8x3, "training: {consistency: {mode: ssp, staleness: 3, "
                  "lr_scaling: staleness}}\n"));
  TALLY_ASSERT_OK(ssp);
  EXPECT_EQ(ssp->training.consistency.staleness, 3);
  EXPECT_EQ(ssp->training.consistency.FirstUsableVersion(10), 7);
  EXPECT_EQ(ssp->training.consistency.FirstUsableVersion(1), 0);
  // An async job runs the same samples: a version per push.
  auto async = ParseJobSpec(WithModel(
      kLinear8x3, "training: {epochs: 2, batch_size: 10, consistency: "
                  "{mode: async}}\n"));
  TALLY_ASSERT_OK(async);
  EXPECT_EQ(async->training.consistency.FirstUsableVersion(10), 0);
  const Schedule a = MakeSchedule(*async, 100, 2);
  const Schedule b = MakeSchedule(*bsp, 100, 2);
  EXPECT_EQ(a.steps_per_epoch, 5);
  EXPECT_EQ(a.versions_per_epoch, 10);
  EXPECT_EQ(a.total_steps, 20);
  EXPECT_EQ(b.versions_per_epoch, b.steps_per_epoch);
  EXPECT_FALSE(bsp->training.consistency.tables_async);
  // PERSIA's hybrid: the rows stepped as they come, the dense part bsp.
  auto hybrid = ParseJobSpec(
      "model: {python: {code: 'x', params: [{name: w, shape: [3]}]}, "
      "embeddings: [{name: e, dim: 4, num_embeddings: 8}]}\n"
      "dataset: {name: clicks}\ntraining: {consistency: {tables: async}}\n");
  TALLY_ASSERT_OK(hybrid);
  EXPECT_TRUE(hybrid->training.consistency.tables_async);
  EXPECT_EQ(hybrid->training.consistency.mode, ConsistencyMode::kBsp);
  // Async closes no steps: its rows are stepped as they come.
  EXPECT_TRUE(async->training.consistency.tables_async);
}

TEST(JobSpecTest, FixedRanksMakeTheWorldAndBoundTheWorkers) {
  // Unset workers: from one worker up to one a rank.
  auto ranks = ParseJobSpec(WithModel(kLinear8x3, "training: {ranks: 4}\n"));
  TALLY_ASSERT_OK(ranks);
  EXPECT_EQ(ranks->training.ranks, 4);
  EXPECT_EQ(ranks->training.World(), 4);
  EXPECT_EQ(ranks->training.workers, 1);
  EXPECT_EQ(ranks->training.max_workers, 4);
  auto two = ParseJobSpec(
      WithModel(kLinear8x3, "training: {ranks: 4, workers: 2}\n"));
  TALLY_ASSERT_OK(two);
  EXPECT_EQ(two->training.workers, 2);
  EXPECT_EQ(two->training.max_workers, 2);
  auto plain = ParseJobSpec(WithModel(kLinear8x3, "training: {workers: 3}\n"));
  TALLY_ASSERT_OK(plain);
  EXPECT_EQ(plain->training.ranks, 0);
  EXPECT_EQ(plain->training.World(), 3);
}

TEST(ScheduleTest, AJobGrowsAtAnEpochAndEverySampleIsSeenOncePerEpoch) {
  auto spec = ParseJobSpec(WithModel(
      kLinear8x3, "training: {epochs: 5, batch_size: 4, workers: {min: 1, "
                  "max: 3}}\n"));
  TALLY_ASSERT_OK(spec);
  EXPECT_EQ(spec->training.workers, 1);
  EXPECT_EQ(spec->training.max_workers, 3);
  // 30 samples: 8 steps an epoch on one worker, 3 on three (10 each).
  const Schedule one = MakeSchedule(*spec, 30, 1);
  EXPECT_EQ(one.total_steps, 40);
  const Schedule grown = GrowSchedule(one, 2, 3, 0);
  EXPECT_EQ(grown.plan, one.plan + 1);
  EXPECT_EQ(grown.total_steps, 2 * 8 + 3 * 3);
  EXPECT_EQ(grown.EpochStart(2), 16);
  EXPECT_EQ(grown.EpochStart(3), 19);
  EXPECT_EQ(grown.EpochOfVersion(15), 1);
  EXPECT_EQ(grown.EpochOfVersion(16), 2);
  EXPECT_EQ(grown.EpochOfVersion(24), 4);
  const Schedule::Place p = grown.Locate(20);
  EXPECT_EQ(p.epoch, 3);
  EXPECT_EQ(p.index, 1);
  EXPECT_EQ(p.world, 3);
  EXPECT_EQ(p.steps_per_epoch, 3);
  EXPECT_EQ(grown.Locate(15).world, 1);
  EXPECT_EQ(grown.Locate(15).period_end, 16);
  // Rebuilt from its worlds, as a worker does from its assignment.
  const Schedule again = ScheduleOf(*spec, 30, grown.worlds, grown.plan);
  EXPECT_EQ(again.total_steps, grown.total_steps);
  EXPECT_EQ(again.EpochStart(4), grown.EpochStart(4));
  // Each epoch, split by its own world, holds every sample once.
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    const int world = grown.Locate(grown.EpochStart(epoch)).world;
    std::vector<int> seen(30, 0);
    for (int rank = 0; rank < world; ++rank) {
      for (int64_t i : EpochOrder(30, 7, epoch, rank, world)) ++seen[i];
    }
    EXPECT_EQ(seen, std::vector<int>(30, 1)) << "epoch " << epoch;
  }
  // A later change replaces the worlds from its epoch on; max_steps caps.
  const Schedule twice = GrowSchedule(grown, 3, 2, 0);
  EXPECT_EQ(twice.worlds.size(), 3u);
  EXPECT_EQ(twice.total_steps, 16 + 3 + 2 * 4);
  EXPECT_EQ(GrowSchedule(one, 2, 3, 20).total_steps, 20);
  // Async counts a push a version: three workers' epochs are 9 versions.
  auto async = ParseJobSpec(WithModel(
      kLinear8x3, "training: {epochs: 5, batch_size: 4, workers: {min: 1, "
                  "max: 3}, consistency: {mode: async}}\n"));
  TALLY_ASSERT_OK(async);
  const Schedule a = GrowSchedule(MakeSchedule(*async, 30, 1), 2, 3, 0);
  EXPECT_EQ(a.total_steps, 2 * 8 + 3 * 9);
  EXPECT_EQ(a.EpochStart(3), 19);         // a worker's steps
  EXPECT_EQ(a.EpochStartVersion(3), 25);  // versions
  // Where a worker is at a version: one version a step on one worker,
  // three from the third epoch; bsp counts steps.
  EXPECT_EQ(a.ClockOfVersion(7), 7);
  EXPECT_EQ(a.ClockOfVersion(16), 16);
  EXPECT_EQ(a.ClockOfVersion(24), 18);
  EXPECT_EQ(a.ClockOfVersion(25), 19);
  EXPECT_EQ(grown.ClockOfVersion(20), 20);
  // The first step with data for a rank: its world's first epoch.
  EXPECT_EQ(grown.FirstStepOfRank(0), 0);
  EXPECT_EQ(grown.FirstStepOfRank(2), 16);
  EXPECT_EQ(twice.FirstStepOfRank(1), 16);
  EXPECT_EQ(twice.FirstStepOfRank(2), 16);
}

TEST(JobSpecTest, MissingFileIsNotFound) {
  EXPECT_THAT(LoadJobSpec("/nonexistent/job.yaml"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("/nonexistent/job.yaml")));
}

TEST(JobSpecTest, WireDtype) {
  auto spec =
      ParseJobSpec(WithModel(kLinear8x3, "training: {wire_dtype: bfloat16}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->training.wire_dtype, WireDtype::kBfloat16);
  EXPECT_THAT(
      ParseJobSpec(WithModel(kLinear8x3, "training: {wire_dtype: fp8}\n")),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("training.wire_dtype: unknown dtype 'fp8'")));
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// Specs that ask for more than a server could hold are refused before
// anything is allocated, naming the limit; counts that would wrap around
// int64 are caught, not multiplied.
TEST(JobSpecLimitsTest, AbsurdModelsAreRefusedNamingTheLimit) {
  const std::string synthetic =
      "dataset: {name: synthetic, features: 32, classes: 4}\n";
  // 10^12 parameters.
  EXPECT_THAT(
      ParseJobSpec("model: {layers: [{linear: {in_features: 32, out_features: "
                   "1000000}}, {linear: {in_features: 1000000, out_features: "
                   "1000000}}, {linear: {in_features: 1000000, out_features: "
                   "4}}]}\n" + synthetic),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_params")));
  // A convolution whose weight count wraps around int64.
  EXPECT_THAT(
      ParseJobSpec("model: {layers: [{conv2d: {in_channels: 1, out_channels: "
                   "16777216, kernel_size: 1}}, {conv2d: {in_channels: "
                   "16777216, out_channels: 16777216, kernel_size: 1024}}]}\n"
                   "dataset: {name: fashion-mnist}\n"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::AnyOf(HasSubstr("overflows"),
                                HasSubstr("max_"), HasSubstr("kernel"))));
  // A synthetic teacher of 4096 x 2^24.
  EXPECT_THAT(
      ParseJobSpec("model: {layers: [flatten, {linear: {in_features: 16777216, "
                   "out_features: 4}}]}\ndataset: {name: synthetic, features: "
                   "16777216, classes: 4, teacher_hidden: 4096, train_size: 1, "
                   "test_size: 0}\n"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("max_dataset_values")));
  // 300,000 layers, and a spec over 1 MiB.
  std::string many = "model: {layers: [";
  for (int i = 0; i < 2000; ++i) many += "relu, ";
  many += "{linear: {in_features: 32, out_features: 4}}]}\n" + synthetic;
  EXPECT_THAT(ParseJobSpec(many),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_layers")));
  EXPECT_THAT(ParseJobSpec(std::string(2 << 20, ' ') + synthetic),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_spec_bytes")));
  // The limits are the caller's: a server may allow more.
  SpecLimits big;
  big.max_params = int64_t{1} << 40;
  EXPECT_THAT(
      ParseJobSpec("model: {layers: [{linear: {in_features: 32, out_features: "
                   "100000}}, {linear: {in_features: 100000, out_features: "
                   "4000}}, {linear: {in_features: 4000, out_features: 4}}]}\n" +
                       synthetic,
                   big),
      ::tally::testing::IsOk());
}

}  // namespace
}  // namespace tally
