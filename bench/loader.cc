// Tally's data loader alone: the training split of a job's dataset, read
// through the worker's BatchLoader (the same shuffle, decode, fit,
// normalisation and augmentation a training job gets) as fast as it
// produces batches, nothing computed on them.
//
//   tally-bench-loader --job=SPEC [--threads=1] [--epochs=1] [--repeats=3]
// prints one JSON object: samples_per_sec of each repeat and their median,
// the dataset's size and the threads.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/spec/job_spec.h"
#include "worker/batch_loader.h"

ABSL_FLAG(std::string, job, "", "The job spec whose dataset to read");
ABSL_FLAG(int, threads, 1, "Threads that gather a batch (dataset.threads)");
ABSL_FLAG(int, epochs, 1, "Epochs of the training split each repeat");
ABSL_FLAG(int, repeats, 3, "Timed repeats");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<tally::JobSpec> spec = tally::LoadJobSpec(absl::GetFlag(FLAGS_job));
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<tally::TrainTest> data =
      tally::OpenDataset(spec->dataset, tally::DataRoots::Any());
  if (!data.ok()) {
    std::fprintf(stderr, "%s\n", data.status().ToString().c_str());
    return 1;
  }
  std::vector<double> rates;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    tally::LoaderOptions o;
    o.batch_size = spec->training.batch_size;
    o.seed = spec->training.seed + r;
    o.first_epoch = r * absl::GetFlag(FLAGS_epochs);
    o.epochs = absl::GetFlag(FLAGS_epochs);
    o.threads = absl::GetFlag(FLAGS_threads);
    const absl::Time began = absl::Now();
    tally::BatchLoader loader(&data->train, o);
    int64_t samples = 0;
    while (true) {
      auto batch = loader.Next(absl::Minutes(5));
      if (absl::IsOutOfRange(batch.status())) break;
      if (!batch.ok()) {
        std::fprintf(stderr, "%s\n", batch.status().ToString().c_str());
        return 1;
      }
      samples += (*batch)->size;
      loader.Recycle(*std::move(batch));
    }
    rates.push_back(samples / absl::ToDoubleSeconds(absl::Now() - began));
  }
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  std::printf(
      "{\"samples_per_sec\": [%s], \"median\": %.1f, \"size\": %lld, "
      "\"threads\": %d}\n",
      absl::StrJoin(rates, ", ",
                    [](std::string* out, double v) {
                      absl::StrAppend(out, static_cast<int64_t>(v));
                    })
          .c_str(),
      sorted[sorted.size() / 2], static_cast<long long>(data->train.size()),
      absl::GetFlag(FLAGS_threads));
  return 0;
}
