#include "tests/test_util.h"

#include <filesystem>

namespace tally::testing {

std::string SourcePath(const std::string& relative) {
  return std::string(TALLY_SOURCE_DIR) + "/" + relative;
}

TensorMap LoadGolden(const std::string& name) {
  auto bytes = ReadFile(SourcePath("tests/golden/" + name + ".safetensors"));
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return {};
  auto map = DecodeSafetensors(*bytes);
  EXPECT_TRUE(map.ok()) << map.status();
  return map.ok() ? *std::move(map) : TensorMap{};
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir = std::filesystem::path(base ? base : "/tmp") /
                              ("tally-test-" + std::to_string(getpid())) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace tally::testing
