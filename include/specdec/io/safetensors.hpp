// safetensors: validated reading (memory-mapped) and writing of checkpoints.
//
// File format: u64 little-endian n | n bytes of JSON | data. The JSON is an object
//   {"<tensor>": {"dtype": "BF16"|"F16"|"F32"|"I32"|"I64"|"BOOL", "shape": [d0, d1, ...],
//                 "data_offsets": [begin, end]}, ..., "__metadata__": {"<key>": "<string>"}}
// with offsets relative to the data start (byte 8 + n); a tensor's bytes are row-major,
// little-endian. Shape [] is a scalar (1 element).
//
//   parse_safetensors(file bytes, label, &header)  the parser; runs on any byte span (the fuzz
//                                                   target feeds it arbitrary bytes)
//   SafetensorsFile::open(path, &file)             mmap + parse; find(name) -> TensorView
//   SafetensorsCheckpoint::open(dir, &ckpt)        model.safetensors, or the shards listed by
//                                                   model.safetensors.index.json; find / get
//   write_safetensors(path, tensors, metadata)     writes a file the reference library accepts
//
// Every check is an error naming the file and, where one applies, the tensor: a file shorter
// than 8 bytes; a header length beyond the file or above kMaxSafetensorsHeaderBytes; a header
// that is not a JSON object (or repeats a key at any depth: nlohmann would keep the last); an
// entry missing dtype / shape / data_offsets or with a wrong JSON type; an unsupported dtype; a
// shape dim that is not a non-negative integer; end < begin; end beyond the data section; a byte
// size != product(shape) * dtype size (overflow-checked); __metadata__ that is not an object of
// strings; in offset order, a tensor that does not start where the one before it ends (an
// overlap or a gap), or a data section longer than the tensors (trailing bytes), as the reference
// library checks. Unknown keys inside an entry are ignored (as the reference implementation does).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specdec/core/dtype.hpp"
#include "specdec/core/status.hpp"
#include "specdec/io/atomic_file.hpp"
#include "specdec/io/json_text.hpp"
#include "specdec/io/mapped_file.hpp"

namespace specdec::io {

// Same bound as the reference implementation (safetensors' MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;
inline constexpr char const* kSafetensorsSingleFile = "model.safetensors";
inline constexpr char const* kSafetensorsIndexFile = "model.safetensors.index.json";

// A tensor inside a mapped file: valid while the file (or checkpoint) that returned it lives.
struct TensorView {
  std::string_view name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  std::span<std::byte const> bytes;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;  // validated on parse: cannot overflow
    return n;
  }
};

// "[7168, 512]"
inline std::string format_shape(std::span<int64_t const> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// One row of a parsed header. begin/end are relative to the data section.
struct SafetensorsEntry {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // sorted by name, names unique
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // absolute file offset of the data section (8 + header length)
  uint64_t data_size = 0;   // file size - data_start
};

namespace detail {

inline Status header_error(std::string_view label, std::string_view what) {
  return Status::MalformedInput(std::string(label) + ": safetensors header: " + std::string(what));
}

inline Status tensor_error(std::string_view label, std::string_view tensor, std::string_view what,
                           StatusCode code = StatusCode::kMalformedInput) {
  return Status(
      code, std::string(label) + ": tensor \"" + std::string(tensor) + "\": " + std::string(what));
}

inline char const* json_type(nlohmann::json const& j) { return j.type_name(); }

// a * b into *out; false on overflow of uint64.
inline bool mul_checked(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

inline Status parse_entry(std::string_view label, std::string const& name,
                          nlohmann::json const& value, uint64_t data_size, SafetensorsEntry* out) {
  if (!value.is_object()) {
    return tensor_error(
        label, name, std::string("entry is a JSON ") + json_type(value) + ", expected an object");
  }
  out->name = name;
  auto const dtype_it = value.find("dtype");
  if (dtype_it == value.end()) return tensor_error(label, name, "missing field \"dtype\"");
  if (!dtype_it->is_string()) {
    return tensor_error(
        label, name,
        std::string("field \"dtype\" is a JSON ") + json_type(*dtype_it) + ", expected a string");
  }
  std::string const& dtype_name_str = dtype_it->get_ref<std::string const&>();
  std::optional<Dtype> const dtype = parse_dtype(dtype_name_str);
  if (!dtype) {
    return tensor_error(
        label, name,
        "unsupported dtype \"" + dtype_name_str + "\" (supported: BF16, F16, F32, I32, I64, BOOL)",
        StatusCode::kUnsupported);
  }
  out->dtype = *dtype;

  auto const shape_it = value.find("shape");
  if (shape_it == value.end()) return tensor_error(label, name, "missing field \"shape\"");
  if (!shape_it->is_array()) {
    return tensor_error(
        label, name,
        std::string("field \"shape\" is a JSON ") + json_type(*shape_it) + ", expected an array");
  }
  out->shape.clear();
  uint64_t numel = 1;
  bool numel_overflow = false;
  for (size_t i = 0; i < shape_it->size(); ++i) {
    nlohmann::json const& d = (*shape_it)[i];
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return tensor_error(
          label, name,
          "shape[" + std::to_string(i) + "] is " + d.dump() + ", expected a non-negative integer");
    }
    uint64_t const dim = d.get<uint64_t>();
    out->shape.push_back(static_cast<int64_t>(dim));
    if (!mul_checked(numel, dim, &numel)) numel_overflow = true;
  }

  auto const off_it = value.find("data_offsets");
  if (off_it == value.end()) return tensor_error(label, name, "missing field \"data_offsets\"");
  if (!off_it->is_array() || off_it->size() != 2 || !(*off_it)[0].is_number_unsigned() ||
      !(*off_it)[1].is_number_unsigned()) {
    return tensor_error(label, name,
                        "field \"data_offsets\" is " + off_it->dump() +
                            ", expected [begin, end] of two non-negative integers");
  }
  out->begin = (*off_it)[0].get<uint64_t>();
  out->end = (*off_it)[1].get<uint64_t>();
  if (out->end < out->begin) {
    return tensor_error(label, name,
                        "data_offsets [" + std::to_string(out->begin) + ", " +
                            std::to_string(out->end) + "]: end < begin");
  }
  if (out->end > data_size) {
    return tensor_error(label, name,
                        "data_offsets end " + std::to_string(out->end) +
                            " is beyond the data section (" + std::to_string(data_size) +
                            " bytes): file truncated?");
  }
  uint64_t bytes = 0;
  if (numel_overflow ||
      !mul_checked(numel, static_cast<uint64_t>(dtype_size(out->dtype)), &bytes)) {
    return tensor_error(label, name,
                        "shape " + format_shape(out->shape) + " of " + dtype_name(out->dtype) +
                            " overflows 64-bit byte counts");
  }
  if (bytes != out->end - out->begin) {
    return tensor_error(
        label, name,
        "byte size " + std::to_string(out->end - out->begin) + " (data_offsets) != " +
            std::to_string(bytes) + " = product of shape " + format_shape(out->shape) + " * " +
            std::to_string(dtype_size(out->dtype)) + " (" + dtype_name(out->dtype) + ")");
  }
  return Status::Ok();
}

}  // namespace detail

// Parses and validates the header of a safetensors file whose complete bytes are `file`.
// `label` (usually the path) starts every error message.
inline Status parse_safetensors(std::span<std::byte const> file, std::string_view label,
                                SafetensorsHeader* out) {
  if (file.size() < 8) {
    return detail::header_error(label, "file is " + std::to_string(file.size()) +
                                           " bytes, shorter than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint64_t>(file[static_cast<size_t>(i)]);
  if (n > kMaxSafetensorsHeaderBytes) {
    return detail::header_error(label, "header length " + std::to_string(n) + " exceeds the " +
                                           std::to_string(kMaxSafetensorsHeaderBytes) +
                                           "-byte limit (not a safetensors file?)");
  }
  if (n > file.size() - 8) {
    return detail::header_error(
        label, "header length " + std::to_string(n) + " is beyond the file (" +
                   std::to_string(file.size() - 8) + " bytes after the length): file truncated?");
  }
  std::string_view const text(reinterpret_cast<char const*>(file.data()) + 8,
                              static_cast<size_t>(n));
  nlohmann::json j;
  SPECDEC_RETURN_IF_ERROR(
      parse_json_no_duplicates(text, std::string(label) + ": safetensors header", &j));
  if (!j.is_object()) {
    return detail::header_error(label,
                                std::string("is a JSON ") + j.type_name() + ", expected an object");
  }

  SafetensorsHeader h;
  h.data_start = 8 + n;
  h.data_size = file.size() - h.data_start;
  h.tensors.reserve(j.size());
  for (auto const& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) {
        return detail::header_error(label, std::string("\"__metadata__\" is a JSON ") +
                                               value.type_name() + ", expected an object");
      }
      for (auto const& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return detail::header_error(label, "\"__metadata__\" field \"" + mk + "\" is a JSON " +
                                                 mv.type_name() + ", expected a string");
        }
        h.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    SafetensorsEntry e;
    SPECDEC_RETURN_IF_ERROR(detail::parse_entry(label, key, value, h.data_size, &e));
    h.tensors.push_back(std::move(e));
  }
  // nlohmann's object is a std::map: items come sorted by name already; keep that a guarantee.
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](auto const& a, auto const& b) { return a.name < b.name; });

  // Layout, as the reference library checks it: in offset order every tensor starts where the
  // one before it ends (the first at 0), and the last ends at the end of the data section; an
  // overlap, a gap or trailing bytes is an error naming where.
  std::vector<SafetensorsEntry const*> by_offset;
  for (auto const& e : h.tensors) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](auto const* a, auto const* b) {
    if (a->begin != b->begin) return a->begin < b->begin;
    return a->end != b->end ? a->end < b->end : a->name < b->name;
  });
  auto range = [](SafetensorsEntry const& e) {
    return "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ")";
  };
  uint64_t at = 0;
  SafetensorsEntry const* prev = nullptr;
  for (SafetensorsEntry const* cur : by_offset) {
    if (cur->begin < at) {
      return detail::tensor_error(label, cur->name,
                                  "byte range " + range(*cur) + " overlaps tensor \"" +
                                      prev->name + "\" " + range(*prev));
    }
    if (cur->begin > at) {
      return detail::tensor_error(
          label, cur->name,
          "byte range " + range(*cur) + " leaves a gap of " + std::to_string(cur->begin - at) +
              " bytes after " + (prev ? "tensor \"" + prev->name + "\" " + range(*prev)
                                      : std::string("the start of the data section")) +
              " (the reference library refuses gaps)");
    }
    at = cur->end;
    prev = cur;
  }
  if (at != h.data_size) {
    return Status::MalformedInput(
        std::string(label) + ": the tensors end at byte " + std::to_string(at) + " of the " +
        std::to_string(h.data_size) + "-byte data section: " + std::to_string(h.data_size - at) +
        " trailing bytes (the reference library refuses them: bytes appended to the file, or a "
        "header that lists too few tensors?)");
  }
  *out = std::move(h);
  return Status::Ok();
}

// One safetensors file, mapped and validated. Move-only; views stay valid across moves.
class SafetensorsFile {
 public:
  static Status open(std::string const& path, SafetensorsFile* out) {
    SafetensorsFile f;
    SPECDEC_RETURN_IF_ERROR(MappedFile::open(path, &f.map_));
    SPECDEC_RETURN_IF_ERROR(parse_safetensors(f.map_.bytes(), path, &f.header_));
    *out = std::move(f);
    return Status::Ok();
  }

  std::string const& path() const { return map_.path(); }
  size_t size() const { return header_.tensors.size(); }
  bool contains(std::string_view name) const { return entry(name) != nullptr; }

  std::optional<TensorView> find(std::string_view name) const {
    SafetensorsEntry const* e = entry(name);
    if (e == nullptr) return std::nullopt;
    return view(*e);
  }

  // Tensor names, sorted.
  std::vector<std::string_view> names() const {
    std::vector<std::string_view> out;
    out.reserve(header_.tensors.size());
    for (auto const& e : header_.tensors) out.push_back(e.name);
    return out;
  }

  std::map<std::string, std::string> const& metadata() const { return header_.metadata; }
  SafetensorsHeader const& header() const { return header_; }

 private:
  SafetensorsEntry const* entry(std::string_view name) const {
    auto it = std::lower_bound(
        header_.tensors.begin(), header_.tensors.end(), name,
        [](SafetensorsEntry const& e, std::string_view n) { return std::string_view(e.name) < n; });
    if (it == header_.tensors.end() || it->name != name) return nullptr;
    return &*it;
  }

  TensorView view(SafetensorsEntry const& e) const {
    auto const all = map_.bytes();
    return TensorView{e.name, e.dtype, e.shape,
                      all.subspan(static_cast<size_t>(header_.data_start + e.begin),
                                  static_cast<size_t>(e.end - e.begin))};
  }

  MappedFile map_;
  SafetensorsHeader header_;
};

// A checkpoint directory: `model.safetensors`, or `model.safetensors.index.json`
// ({"metadata": {...}, "weight_map": {"<tensor>": "<shard file>"}}) and its shards. Each shard is
// opened once; every weight_map entry must exist in its shard. Having both files is an error (which
// one is meant is unknowable). Names are those of the single file, or the weight_map's keys.
class SafetensorsCheckpoint {
 public:
  static Status open(std::string const& dir, SafetensorsCheckpoint* out) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path const single = fs::path(dir) / kSafetensorsSingleFile;
    fs::path const index = fs::path(dir) / kSafetensorsIndexFile;
    bool const has_single = fs::exists(single, ec);
    bool const has_index = fs::exists(index, ec);
    if (has_single && has_index) {
      return Status::InvalidArgument(dir + ": both " + kSafetensorsSingleFile + " and " +
                                     kSafetensorsIndexFile +
                                     " exist; remove the one that is not the checkpoint");
    }
    SafetensorsCheckpoint c;
    c.dir_ = dir;
    if (has_single) {
      c.shards_.emplace_back();
      SPECDEC_RETURN_IF_ERROR(SafetensorsFile::open(single.string(), &c.shards_.back()));
      c.shard_names_.push_back(kSafetensorsSingleFile);
      for (std::string_view n : c.shards_.back().names()) c.where_.emplace(std::string(n), 0);
      *out = std::move(c);
      return Status::Ok();
    }
    if (!has_index) {
      return Status::InvalidArgument(dir + ": no " + std::string(kSafetensorsSingleFile) +
                                     " and no " + kSafetensorsIndexFile +
                                     " (not a safetensors checkpoint directory?)");
    }
    SPECDEC_RETURN_IF_ERROR(c.open_index(index.string()));
    *out = std::move(c);
    return Status::Ok();
  }

  std::string const& dir() const { return dir_; }
  size_t num_shards() const { return shards_.size(); }
  size_t size() const { return where_.size(); }
  bool contains(std::string_view name) const { return where_.find(name) != where_.end(); }
  // The index's "metadata" object (null for a single file or an index without one).
  nlohmann::json const& index_metadata() const { return index_metadata_; }

  // Tensor names, sorted.
  std::vector<std::string_view> names() const {
    std::vector<std::string_view> out;
    out.reserve(where_.size());
    for (auto const& [n, shard] : where_) out.push_back(n);
    return out;
  }

  // The shard file name (relative to dir) holding `name`; empty when absent.
  std::string_view shard_of(std::string_view name) const {
    auto it = where_.find(name);
    return it == where_.end() ? std::string_view() : std::string_view(shard_names_[it->second]);
  }

  std::optional<TensorView> find(std::string_view name) const {
    auto it = where_.find(name);
    if (it == where_.end()) return std::nullopt;
    return shards_[it->second].find(name);
  }

  // The tensor `name` if it has exactly `dtype` and `shape`; otherwise an error naming the
  // tensor and both sides.
  Status get(std::string_view name, Dtype dtype, std::vector<int64_t> const& shape,
             TensorView* out) const {
    auto it = where_.find(name);
    if (it == where_.end()) {
      std::string looked = shards_.size() == 1 && shard_names_[0] == kSafetensorsSingleFile
                               ? "looked in shard " + shard_names_[0]
                               : "looked in " + std::to_string(shards_.size()) +
                                     " shards listed by " + kSafetensorsIndexFile;
      return Status::MalformedInput(dir_ + ": missing tensor \"" + std::string(name) + "\" (" +
                                    looked + ")");
    }
    std::optional<TensorView> v = shards_[it->second].find(name);
    if (!v) {  // cannot happen: open() checked every weight_map entry
      return Status::Internal(dir_ + ": tensor \"" + std::string(name) + "\" vanished from " +
                              shard_names_[it->second]);
    }
    if (v->dtype != dtype || v->shape != shape) {
      return Status::MalformedInput(shards_[it->second].path() + ": tensor \"" + std::string(name) +
                                    "\": dtype or shape not what the model expects: expected " +
                                    dtype_name(dtype) + " " + format_shape(shape) + ", found " +
                                    dtype_name(v->dtype) + " " + format_shape(v->shape));
    }
    *out = std::move(*v);
    return Status::Ok();
  }

 private:
  Status open_index(std::string const& index_path) {
    MappedFile m;
    SPECDEC_RETURN_IF_ERROR(MappedFile::open(index_path, &m));
    std::string_view const text(reinterpret_cast<char const*>(m.bytes().data()), m.size());
    nlohmann::json j;
    SPECDEC_RETURN_IF_ERROR(parse_json_no_duplicates(text, index_path, &j));
    if (!j.is_object()) {
      return Status::MalformedInput(index_path + ": is a JSON " + std::string(j.type_name()) +
                                    ", expected an object");
    }
    if (auto mit = j.find("metadata"); mit != j.end()) {
      if (!mit->is_object()) {
        return Status::MalformedInput(index_path + ": field \"metadata\" is a JSON " +
                                      std::string(mit->type_name()) + ", expected an object");
      }
      index_metadata_ = *mit;
    }
    auto wit = j.find("weight_map");
    if (wit == j.end())
      return Status::MalformedInput(index_path + ": missing field \"weight_map\"");
    if (!wit->is_object()) {
      return Status::MalformedInput(index_path + ": field \"weight_map\" is a JSON " +
                                    std::string(wit->type_name()) + ", expected an object");
    }
    if (wit->empty()) return Status::MalformedInput(index_path + ": \"weight_map\" is empty");
    std::map<std::string, size_t, std::less<>> shard_index;
    for (auto const& [tensor, shard] : wit->items()) {
      if (!shard.is_string()) {
        return Status::MalformedInput(index_path + ": weight_map[\"" + tensor + "\"] is a JSON " +
                                      std::string(shard.type_name()) +
                                      ", expected a shard file name");
      }
      std::string const& file = shard.get_ref<std::string const&>();
      std::filesystem::path const rel(file);
      bool bad = file.empty() || rel.is_absolute();
      for (auto const& part : rel) bad = bad || part == "..";
      if (bad) {
        return Status::MalformedInput(index_path + ": weight_map[\"" + tensor + "\"] = \"" + file +
                                      "\" is not a file name inside the checkpoint directory");
      }
      auto [sit, inserted] = shard_index.emplace(file, shards_.size());
      if (inserted) {
        shards_.emplace_back();
        shard_names_.push_back(file);
        SPECDEC_RETURN_IF_ERROR(
            SafetensorsFile::open((std::filesystem::path(dir_) / file).string(), &shards_.back()));
      }
      if (!shards_[sit->second].contains(tensor)) {
        return Status::MalformedInput(index_path + ": tensor \"" + tensor +
                                      "\" is listed in weight_map but missing from shard " + file);
      }
      where_.emplace(tensor, sit->second);
    }
    return Status::Ok();
  }

  std::string dir_;
  std::vector<SafetensorsFile> shards_;
  std::vector<std::string> shard_names_;  // parallel to shards_, as written in the index
  std::map<std::string, size_t, std::less<>> where_;  // tensor -> shard
  nlohmann::json index_metadata_;
};

// ---- writing ----

struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  std::span<std::byte const> bytes;  // row-major, little-endian, product(shape) * dtype size
};

// The bytes before the data section (length prefix + JSON padded with spaces to a multiple of 8)
// and the order of `tensors` in the data section: by dtype size, largest first, then by name, so
// every tensor starts aligned to its element size with no gaps (as the reference writer does).
// The JSON lists names sorted. `label` names the destination in errors.
inline Status plan_safetensors(std::span<TensorToWrite const> tensors,
                               std::map<std::string, std::string> const& metadata,
                               std::string_view label, std::string* prefix,
                               std::vector<size_t>* order) {
  std::vector<size_t> idx(tensors.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    int64_t const sa = dtype_size(tensors[a].dtype), sb = dtype_size(tensors[b].dtype);
    return sa != sb ? sa > sb : tensors[a].name < tensors[b].name;
  });
  nlohmann::json j = nlohmann::json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i : idx) {
    TensorToWrite const& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__") {
      return detail::tensor_error(label, t.name, "is not a usable tensor name",
                                  StatusCode::kInvalidArgument);
    }
    if (j.contains(t.name)) {
      return detail::tensor_error(label, t.name, "appears twice", StatusCode::kInvalidArgument);
    }
    uint64_t numel = 1;
    bool overflow = false;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return detail::tensor_error(label, t.name, "negative dim in shape " + format_shape(t.shape),
                                    StatusCode::kInvalidArgument);
      }
      overflow = overflow || !detail::mul_checked(numel, static_cast<uint64_t>(d), &numel);
    }
    uint64_t bytes = 0;
    overflow =
        overflow || !detail::mul_checked(numel, static_cast<uint64_t>(dtype_size(t.dtype)), &bytes);
    if (overflow || bytes != t.bytes.size()) {
      return detail::tensor_error(
          label, t.name,
          std::to_string(t.bytes.size()) + " bytes given, shape " + format_shape(t.shape) + " of " +
              dtype_name(t.dtype) + " needs " +
              (overflow ? std::string("more than 2^64") : std::to_string(bytes)),
          StatusCode::kInvalidArgument);
    }
    j[t.name] = {{"dtype", dtype_name(t.dtype)},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = j.dump();
  } catch (nlohmann::json::exception const& e) {
    return Status::InvalidArgument(std::string(label) +
                                   ": cannot encode the header (names and metadata must be "
                                   "UTF-8): " +
                                   e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t const n = text.size();
  prefix->clear();
  for (int i = 0; i < 8; ++i) prefix->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  *prefix += text;
  *order = std::move(idx);
  return Status::Ok();
}

// The complete file in memory (tests, fuzzing, small files).
inline Status encode_safetensors(std::span<TensorToWrite const> tensors,
                                 std::map<std::string, std::string> const& metadata,
                                 std::vector<std::byte>* out) {
  std::string prefix;
  std::vector<size_t> order;
  SPECDEC_RETURN_IF_ERROR(plan_safetensors(tensors, metadata, "<memory>", &prefix, &order));
  out->clear();
  auto const* p = reinterpret_cast<std::byte const*>(prefix.data());
  out->insert(out->end(), p, p + prefix.size());
  for (size_t i : order) out->insert(out->end(), tensors[i].bytes.begin(), tensors[i].bytes.end());
  return Status::Ok();
}

// Writes `path` (through `path.tmp` and a rename, so a failed write leaves no partial file).
inline Status write_safetensors(std::string const& path, std::span<TensorToWrite const> tensors,
                                std::map<std::string, std::string> const& metadata = {}) {
  std::string prefix;
  std::vector<size_t> order;
  SPECDEC_RETURN_IF_ERROR(plan_safetensors(tensors, metadata, path, &prefix, &order));
  AtomicFileWriter file(path);
  SPECDEC_RETURN_IF_ERROR(file.open());
  bool ok = file.write(prefix.data(), prefix.size());
  for (size_t i = 0; ok && i < order.size(); ++i) {
    auto const b = tensors[order[i]].bytes;
    ok = file.write(b.data(), b.size());
  }
  return file.commit();
}

}  // namespace specdec::io
