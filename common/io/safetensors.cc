#include "common/io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace tally {

namespace {
static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; add byte swapping");
}  // namespace

std::string EncodeSafetensors(
    const std::vector<ParamInfo>& layout, const float* params,
    const std::map<std::string, std::string>& metadata,
    const std::vector<RawTensor>& extra,
    const std::vector<LaterTensor>& later) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const ParamInfo& p : layout) {
    const int64_t bytes = p.numel * static_cast<int64_t>(sizeof(float));
    header[p.name] = {{"dtype", "F32"},
                      {"shape", p.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  for (const RawTensor& t : extra) {
    const int64_t bytes = static_cast<int64_t>(t.bytes.size());
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  const int64_t here = offset;  // the bytes in the result
  for (const LaterTensor& t : later) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string json = header.dump();
  // Pad the header with spaces so the data starts 8-byte aligned.
  while (json.size() % 8 != 0) json.push_back(' ');
  std::string out;
  out.reserve(8 + json.size() + here);
  uint64_t n = json.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out.append(json);
  for (const ParamInfo& p : layout) {
    out.append(reinterpret_cast<const char*>(params + p.offset),
               p.numel * sizeof(float));
  }
  for (const RawTensor& t : extra) out.append(t.bytes);
  return out;
}

absl::StatusOr<TensorMap> DecodeSafetensors(absl::string_view bytes) {
  if (bytes.size() < 8) {
    return absl::InvalidArgumentError(
        "safetensors: shorter than its 8-byte header length");
  }
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: header length ", n, " exceeds the ",
                     bytes.size(), "-byte file"));
  }
  nlohmann::json header =
      nlohmann::json::parse(std::string_view(bytes.data() + 8, n), nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(
        "safetensors: header is not a JSON object");
  }
  const absl::string_view data = bytes.substr(8 + n);
  TensorMap out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const nlohmann::json& t = it.value();
    const std::string where =
        absl::StrCat("safetensors: tensor '", it.key(), "'");
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") ||
        !t.contains("data_offsets") || !t["dtype"].is_string() ||
        !t["shape"].is_array() || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": needs dtype, shape and data_offsets"));
    }
    if (t["dtype"] != "F32") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": dtype ", t["dtype"].get<std::string>(),
                       " is not supported (Tally reads F32)"));
    }
    HostTensor ht;
    int64_t numel = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": bad shape"));
      }
      ht.shape.push_back(d.get<int64_t>());
      numel *= ht.shape.back();
    }
    const auto& off = t["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": bad data_offsets"));
    }
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data.size() || e - b != static_cast<uint64_t>(numel) * 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": data_offsets [", b, ", ", e, ") do not match shape ",
          ShapeString(ht.shape), " within ", data.size(), " data bytes"));
    }
    ht.data.resize(numel);
    std::memcpy(ht.data.data(), data.data() + b, e - b);
    out.emplace(it.key(), std::move(ht));
  }
  return out;
}

absl::StatusOr<std::vector<float>> FlattenTensors(
    const TensorMap& tensors, const std::vector<ParamInfo>& layout) {
  int64_t total = 0;
  for (const ParamInfo& p : layout) total += p.numel;
  std::vector<float> flat(total);
  for (const ParamInfo& p : layout) {
    auto it = tensors.find(p.name);
    if (it == tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights lack tensor '", p.name, "'"));
    }
    if (it->second.shape != p.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", p.name, "' has shape ", ShapeString(it->second.shape),
          ", the model wants ", ShapeString(p.shape)));
    }
    std::memcpy(flat.data() + p.offset, it->second.data.data(),
                p.numel * sizeof(float));
  }
  if (tensors.size() != layout.size()) {
    for (const auto& [name, t] : tensors) {
      bool known = false;
      for (const ParamInfo& p : layout) known = known || p.name == name;
      if (!known) {
        return absl::InvalidArgumentError(absl::StrCat(
            "weights hold tensor '", name, "' the model does not have"));
      }
    }
  }
  return flat;
}

absl::Status WriteFileAtomic(const std::string& path, absl::string_view bytes) {
  return WriteFileAtomic(path, std::vector<absl::string_view>{bytes});
}

absl::Status WriteFileAtomic(const std::string& path,
                             const std::vector<absl::string_view>& pieces) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  fs::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot create ", tmp,
                                               ": ", std::strerror(errno)));
  }
  for (absl::string_view bytes : pieces) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        const std::string err = std::strerror(errno);
        ::close(fd);
        ::unlink(tmp.c_str());
        return absl::UnavailableError(
            absl::StrCat(path, ": write failed: ", err));
      }
      done += static_cast<size_t>(w);
    }
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat(path, ": fsync failed: ", err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    return absl::UnavailableError(absl::StrCat(path, ": rename failed: ", err));
  }
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status SaveSafetensors(
    const std::string& path, const std::vector<ParamInfo>& layout,
    const float* params, const std::map<std::string, std::string>& metadata) {
  return WriteFileAtomic(path, EncodeSafetensors(layout, params, metadata));
}

absl::StatusOr<std::vector<float>> LoadSafetensors(
    const std::string& path, const std::vector<ParamInfo>& layout) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<TensorMap> tensors = DecodeSafetensors(*bytes);
  if (!tensors.ok()) {
    return absl::Status(tensors.status().code(),
                        absl::StrCat(path, ": ", tensors.status().message()));
  }
  return FlattenTensors(*tensors, layout);
}

}  // namespace tally
