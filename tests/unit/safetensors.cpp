// safetensors reading and writing, and the dtype helpers: hand-made files written by the test
// (exact bytes worked out in comments), every validation error (code, file, tensor named), the
// writer's layout (sorted names, alignment, no gaps), single-file and sharded checkpoints, and
// bf16 / fp16 conversions (hand-picked values, ties to even, exhaustive round trips).
#include "specdec/io/safetensors.hpp"
#include "support/testing.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using specdec::Dtype;
using specdec::Status;
using specdec::StatusCode;
using specdec::io::SafetensorsCheckpoint;
using specdec::io::SafetensorsFile;
using specdec::io::SafetensorsHeader;
using specdec::io::TensorToWrite;
using specdec::io::TensorView;

using specdec::testing::TempDir;

std::vector<std::byte> bytes_of(std::string const& s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

template <typename T>
std::vector<std::byte> bytes_of(std::vector<T> const& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

// 8-byte little-endian `n` (the header length as written, not necessarily json.size()), then
// `json`, then `data` bytes.
std::vector<std::byte> raw_file(std::string const& json, std::vector<std::byte> const& data,
                                uint64_t n) {
  std::vector<std::byte> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((n >> (8 * i)) & 0xff));
  auto const j = bytes_of(json);
  out.insert(out.end(), j.begin(), j.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}
std::vector<std::byte> raw_file(std::string const& json, size_t data_bytes = 0) {
  return raw_file(json, std::vector<std::byte>(data_bytes, std::byte{0x5a}), json.size());
}

void write_bytes(std::string const& path, std::vector<std::byte> const& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<char const*>(b.data()), static_cast<std::streamsize>(b.size()));
  REQUIRE(f.good());
}

bool contains(std::string const& s, std::string const& part) {
  return s.find(part) != std::string::npos;
}

// Writes `b` to a file, opens it, and returns the status (which must be an error whose message
// names the file).
Status open_error(std::vector<std::byte> const& b) {
  TempDir dir;
  std::string const path = dir.file("bad.safetensors");
  write_bytes(path, b);
  SafetensorsFile f;
  Status s = SafetensorsFile::open(path, &f);
  CHECK_FALSE(s.ok());
  CHECK_MESSAGE(contains(s.message(), path), s.message());
  return s;
}

// An entry `"name": {...}` with F32 and the given shape / offsets JSON.
std::string entry(std::string const& name, std::string const& shape, std::string const& offsets,
                  std::string const& dtype = "F32") {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

void check_error(std::vector<std::byte> const& b, StatusCode code,
                 std::vector<std::string> const& parts) {
  Status const s = open_error(b);
  CHECK_MESSAGE(s.code() == code, s.to_string());
  for (auto const& p : parts)
    CHECK_MESSAGE(contains(s.message(), p), "want '", p, "' in: ", s.message());
}

std::vector<float> floats(TensorView const& v) {
  std::vector<float> out(v.bytes.size() / 4);
  if (!out.empty()) std::memcpy(out.data(), v.bytes.data(), v.bytes.size());
  return out;
}

}  // namespace

TEST_CASE("dtype: sizes, names, parse") {
  CHECK(specdec::dtype_size(Dtype::kBF16) == 2);
  CHECK(specdec::dtype_size(Dtype::kF16) == 2);
  CHECK(specdec::dtype_size(Dtype::kF32) == 4);
  CHECK(specdec::dtype_size(Dtype::kI32) == 4);
  CHECK(specdec::dtype_size(Dtype::kI64) == 8);
  CHECK(specdec::dtype_size(Dtype::kBool) == 1);
  for (Dtype d : specdec::kAllDtypes) {
    CHECK(specdec::parse_dtype(specdec::dtype_name(d)) == d);
  }
  CHECK(std::string(specdec::dtype_name(Dtype::kBool)) == "BOOL");
  CHECK_FALSE(specdec::parse_dtype("F64").has_value());
  CHECK_FALSE(specdec::parse_dtype("bf16").has_value());  // case-sensitive, as written on disk
  CHECK_FALSE(specdec::parse_dtype("").has_value());
}

TEST_CASE("dtype: bf16 conversions, ties to even") {
  using specdec::bf16_to_float;
  using specdec::float_to_bf16;
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(bf16_to_float(0xc000) == -2.0f);
  CHECK(bf16_to_float(0x3fc0) == 1.5f);
  CHECK(std::isinf(bf16_to_float(0x7f80)));
  CHECK(std::isnan(bf16_to_float(0x7fc0)));
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(-2.0f) == 0xc000);
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  CHECK(float_to_bf16(from_bits(0x3f808000u)) == 0x3f80);      // 1 + 2^-8: tie, down to even
  CHECK(float_to_bf16(from_bits(0x3f818000u)) == 0x3f82);      // tie, up to even
  CHECK(float_to_bf16(from_bits(0x3f808001u)) == 0x3f81);      // just above the tie
  CHECK(float_to_bf16(from_bits(0x3f807fffu)) == 0x3f80);      // just below
  CHECK(float_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80);      // FLT_MAX rounds to +inf
  uint16_t const nan = float_to_bf16(from_bits(0x7f800001u));  // signalling NaN, low payload
  CHECK(std::isnan(bf16_to_float(nan)));
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    uint16_t const b = static_cast<uint16_t>(h);
    float const f = bf16_to_float(b);
    if (std::isnan(f)) continue;
    REQUIRE_MESSAGE(float_to_bf16(f) == b, "bf16 bits ", h);
  }
}

TEST_CASE("dtype: fp16 conversions, subnormals, overflow, ties to even") {
  using specdec::float_to_fp16;
  using specdec::fp16_to_float;
  CHECK(fp16_to_float(0x3c00) == 1.0f);
  CHECK(fp16_to_float(0xc000) == -2.0f);
  CHECK(fp16_to_float(0x7bff) == 65504.0f);
  CHECK(fp16_to_float(0x0400) == std::ldexp(1.0f, -14));  // smallest normal
  CHECK(fp16_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(fp16_to_float(0x8001) == -std::ldexp(1.0f, -24));
  CHECK(fp16_to_float(0x03ff) == std::ldexp(1023.0f, -24));
  CHECK(std::isinf(fp16_to_float(0x7c00)));
  CHECK(std::isnan(fp16_to_float(0x7e00)));
  CHECK(float_to_fp16(65504.0f) == 0x7bff);
  CHECK(float_to_fp16(65519.0f) == 0x7bff);  // below the midpoint 65520
  CHECK(float_to_fp16(65520.0f) == 0x7c00);  // the tie rounds to even = inf
  CHECK(float_to_fp16(-1e9f) == 0xfc00);
  CHECK(float_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie, down to even
  CHECK(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie, up to even
  CHECK(float_to_fp16(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(float_to_fp16(std::ldexp(1.0f, -25)) == 0x0000);  // tie between 0 and 1: 0
  CHECK(float_to_fp16(std::ldexp(1.5f, -25)) == 0x0001);  // above the tie
  CHECK(float_to_fp16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 ulp: tie, up to even 2
  CHECK(float_to_fp16(std::ldexp(1.0f, -26)) == 0x0000);
  CHECK(float_to_fp16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)) == 0x0400);  // carries
  CHECK(float_to_fp16(-0.0f) == 0x8000);
  CHECK(std::isnan(fp16_to_float(float_to_fp16(std::nanf("")))));
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    uint16_t const b = static_cast<uint16_t>(h);
    float const f = fp16_to_float(b);
    if (std::isnan(f)) continue;
    REQUIRE_MESSAGE(float_to_fp16(f) == b, "fp16 bits ", h);
  }
}

TEST_CASE("MappedFile: maps, moves, names the path in errors") {
  TempDir dir;
  std::string const path = dir.file("x.bin");
  write_bytes(path, bytes_of(std::string("hello")));
  specdec::io::MappedFile m;
  REQUIRE(specdec::io::MappedFile::open(path, &m).ok());
  CHECK(m.size() == 5);
  std::byte const* data = m.bytes().data();
  specdec::io::MappedFile moved = std::move(m);
  CHECK(moved.bytes().data() == data);  // the mapping travels with the move
  CHECK(m.bytes().empty());
  CHECK(std::memcmp(moved.bytes().data(), "hello", 5) == 0);

  write_bytes(dir.file("empty.bin"), {});
  specdec::io::MappedFile e;
  REQUIRE(specdec::io::MappedFile::open(dir.file("empty.bin"), &e).ok());
  CHECK(e.bytes().empty());

  Status s = specdec::io::MappedFile::open(dir.file("absent.bin"), &e);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(contains(s.message(), dir.file("absent.bin")));
  CHECK(contains(s.message(), "No such file"));
  s = specdec::io::MappedFile::open(dir.path.string(), &e);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(contains(s.message(), "not a regular file"));
}

TEST_CASE("safetensors: a hand-made file reads back") {
  // a: F32 [2] = {1.5, -2} at [0, 8); b: I64 [] (scalar) = 7 at [8, 16); c: BOOL [0] at [16, 16).
  // The header is padded with trailing spaces, as writers do.
  std::string const json = "{" + entry("b", "[]", "[8,16]", "I64") + "," +
                           entry("a", "[2]", "[0,8]") + "," + entry("c", "[0]", "[16,16]", "BOOL") +
                           ",\"__metadata__\":{\"format\":\"pt\"}}   ";
  std::vector<std::byte> data = bytes_of(std::vector<float>{1.5f, -2.0f});
  auto const b = bytes_of(std::vector<int64_t>{7});
  data.insert(data.end(), b.begin(), b.end());
  TempDir dir;
  std::string const path = dir.file("m.safetensors");
  write_bytes(path, raw_file(json, data, json.size()));

  SafetensorsFile f;
  Status const s = SafetensorsFile::open(path, &f);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(f.path() == path);
  CHECK(f.size() == 3);
  CHECK(f.names() == std::vector<std::string_view>{"a", "b", "c"});
  CHECK(f.metadata() == std::map<std::string, std::string>{{"format", "pt"}});
  CHECK(f.header().data_start == 8 + json.size());
  CHECK(f.header().data_size == 16);

  auto a = f.find("a");
  REQUIRE(a.has_value());
  CHECK(a->name == "a");
  CHECK(a->dtype == Dtype::kF32);
  CHECK(a->shape == std::vector<int64_t>{2});
  CHECK(a->numel() == 2);
  CHECK(floats(*a) == std::vector<float>{1.5f, -2.0f});
  auto bv = f.find("b");
  REQUIRE(bv.has_value());
  CHECK(bv->shape.empty());
  CHECK(bv->numel() == 1);
  int64_t seven = 0;
  REQUIRE(bv->bytes.size() == 8);
  std::memcpy(&seven, bv->bytes.data(), 8);
  CHECK(seven == 7);
  auto c = f.find("c");
  REQUIRE(c.has_value());
  CHECK(c->bytes.empty());
  CHECK(c->numel() == 0);
  CHECK_FALSE(f.find("d").has_value());
  CHECK_FALSE(f.find("__metadata__").has_value());

  // Views survive moving the file object.
  SafetensorsFile g = std::move(f);
  CHECK(floats(*a) == std::vector<float>{1.5f, -2.0f});
  CHECK(g.find("a")->bytes.data() == a->bytes.data());
}

TEST_CASE("safetensors: an empty table loads; gaps and trailing bytes are refused by name") {
  SafetensorsHeader h;
  auto const empty = raw_file("{}");
  REQUIRE(specdec::io::parse_safetensors(empty, "mem", &h).ok());
  CHECK(h.tensors.empty());
  // a [0,4) and b [8,12): bytes 4..8 unused.
  check_error(raw_file("{" + entry("a", "[1]", "[0,4]") + "," + entry("b", "[1]", "[8,12]") + "}",
                       12),
              StatusCode::kMalformedInput,
              {"\"b\"", "byte range [8, 12) leaves a gap of 4 bytes after tensor \"a\" [0, 4)"});
  // The first tensor at byte 4.
  check_error(raw_file("{" + entry("a", "[1]", "[4,8]") + "}", 8), StatusCode::kMalformedInput,
              {"\"a\"", "gap of 4 bytes after the start of the data section"});
  // a [0,4) in an 8-byte data section; and an empty table over 3 bytes.
  check_error(raw_file("{" + entry("a", "[1]", "[0,4]") + "}", 8), StatusCode::kMalformedInput,
              {"the tensors end at byte 4 of the 8-byte data section: 4 trailing bytes"});
  check_error(raw_file("{}", 3), StatusCode::kMalformedInput,
              {"end at byte 0 of the 3-byte data section: 3 trailing bytes"});
  // An empty tensor where the one before it ends: e [4,4) after a [0,4), before b [4,8).
  auto const with_empty = raw_file("{" + entry("a", "[1]", "[0,4]") + "," +
                                   entry("e", "[0]", "[4,4]") + "," + entry("b", "[1]", "[4,8]") +
                                   "}",
                                   8);
  Status const s = specdec::io::parse_safetensors(with_empty, "mem", &h);
  CHECK_MESSAGE(s.ok(), s.to_string());
  CHECK(h.tensors.size() == 3);
}

TEST_CASE("safetensors: file and header-length errors") {
  check_error(std::vector<std::byte>(5, std::byte{1}), StatusCode::kMalformedInput,
              {"5 bytes, shorter than the 8-byte header length"});
  check_error({}, StatusCode::kMalformedInput, {"0 bytes"});
  // Declares 100 header bytes, has 3 + 4.
  check_error(raw_file("{} ", std::vector<std::byte>(4), 100), StatusCode::kMalformedInput,
              {"header length 100 is beyond the file (7 bytes"});
  check_error(raw_file("{}", {}, uint64_t{1} << 40), StatusCode::kMalformedInput,
              {"header length 1099511627776 exceeds the 100000000-byte limit"});
  check_error(raw_file("{}", {}, 100'000'001), StatusCode::kMalformedInput, {"exceeds"});
}

TEST_CASE("safetensors: JSON errors") {
  check_error(raw_file("{\"a\":"), StatusCode::kMalformedInput, {"not valid JSON", "parse error"});
  check_error(raw_file(""), StatusCode::kMalformedInput, {"not valid JSON"});
  check_error(raw_file("[1,2]"), StatusCode::kMalformedInput,
              {"is a JSON array, expected an object"});
  check_error(raw_file("{\"a\": 3}"), StatusCode::kMalformedInput,
              {"tensor \"a\"", "entry is a JSON number, expected an object"});
  // Duplicate tensor names: nlohmann would keep the second silently.
  check_error(
      raw_file("{" + entry("w", "[1]", "[0,4]") + "," + entry("w", "[1]", "[4,8]") + "}", 8),
      StatusCode::kMalformedInput, {"duplicate key \"w\" at the top level"});
  check_error(raw_file("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],"
                       "\"data_offsets\":[0,4]}}",
                       4),
              StatusCode::kMalformedInput, {"duplicate key \"dtype\" in a nested object"});
  check_error(raw_file("{\"__metadata__\": [1]}"), StatusCode::kMalformedInput,
              {"\"__metadata__\" is a JSON array, expected an object"});
  check_error(raw_file("{\"__metadata__\": {\"k\": 1}}"), StatusCode::kMalformedInput,
              {"\"__metadata__\" field \"k\" is a JSON number, expected a string"});
}

TEST_CASE("safetensors: entry field errors name the tensor and the field") {
  using P = std::vector<std::string>;
  check_error(raw_file("{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
              StatusCode::kMalformedInput, P{"tensor \"t\"", "missing field \"dtype\""});
  check_error(raw_file("{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4),
              StatusCode::kMalformedInput, P{"tensor \"t\"", "missing field \"shape\""});
  check_error(raw_file("{\"t\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4), StatusCode::kMalformedInput,
              P{"tensor \"t\"", "missing field \"data_offsets\""});
  check_error(raw_file("{\"t\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
              StatusCode::kMalformedInput, P{"tensor \"t\"", "\"dtype\" is a JSON number"});
  check_error(raw_file("{" + entry("t", "\"1\"", "[0,4]") + "}", 4), StatusCode::kMalformedInput,
              P{"tensor \"t\"", "\"shape\" is a JSON string, expected an array"});
  check_error(raw_file("{" + entry("t", "[1]", "[0]") + "}", 4), StatusCode::kMalformedInput,
              P{"tensor \"t\"", "\"data_offsets\" is [0], expected [begin, end]"});
  check_error(raw_file("{" + entry("t", "[1]", "[0,\"4\"]") + "}", 4), StatusCode::kMalformedInput,
              P{"tensor \"t\"", "data_offsets"});
  check_error(raw_file("{" + entry("t", "[1]", "[-1,3]") + "}", 4), StatusCode::kMalformedInput,
              P{"tensor \"t\"", "data_offsets"});
  check_error(raw_file("{" + entry("t", "[1]", "{\"a\":0}") + "}", 4), StatusCode::kMalformedInput,
              P{"tensor \"t\"", "data_offsets"});
  check_error(raw_file("{" + entry("t", "[1]", "[0,8]", "F64") + "}", 8), StatusCode::kUnsupported,
              P{"tensor \"t\"", "unsupported dtype \"F64\""});
  check_error(raw_file("{" + entry("t", "[2,-2]", "[0,4]") + "}", 4), StatusCode::kMalformedInput,
              P{"tensor \"t\"", "shape[1] is -2, expected a non-negative integer"});
  check_error(raw_file("{" + entry("t", "[2.5]", "[0,4]") + "}", 4), StatusCode::kMalformedInput,
              P{"tensor \"t\"", "shape[0] is 2.5"});
  check_error(raw_file("{" + entry("t", "[1.0]", "[0,4]") + "}", 4), StatusCode::kMalformedInput,
              P{"tensor \"t\"", "shape[0] is 1.0"});
  check_error(raw_file("{" + entry("t", "[true]", "[0,4]") + "}", 4), StatusCode::kMalformedInput,
              P{"tensor \"t\"", "shape[0] is true"});
  // 2^63 does not fit int64.
  check_error(raw_file("{" + entry("t", "[9223372036854775808]", "[0,4]") + "}", 4),
              StatusCode::kMalformedInput, P{"tensor \"t\"", "shape[0] is 9223372036854775808"});
}

TEST_CASE("safetensors: offset and size errors") {
  using P = std::vector<std::string>;
  check_error(raw_file("{" + entry("t", "[1]", "[8,4]") + "}", 8), StatusCode::kMalformedInput,
              P{"tensor \"t\"", "data_offsets [8, 4]: end < begin"});
  check_error(raw_file("{" + entry("t", "[4]", "[0,16]") + "}", 12), StatusCode::kMalformedInput,
              P{"tensor \"t\"", "end 16 is beyond the data section (12 bytes)"});
  check_error(
      raw_file("{" + entry("t", "[3]", "[0,8]") + "}", 8), StatusCode::kMalformedInput,
      P{"tensor \"t\"", "byte size 8 (data_offsets) != 12 = product of shape [3] * 4 (F32)"});
  check_error(
      raw_file("{" + entry("t", "[2,3]", "[0,24]", "BF16") + "}", 24), StatusCode::kMalformedInput,
      P{"tensor \"t\"", "byte size 24 (data_offsets) != 12 = product of shape [2, 3] * 2 (BF16)"});
  // 2^32 * 2^32 elements: the element count overflows; 2^62 F32: the byte count overflows.
  check_error(raw_file("{" + entry("t", "[4294967296,4294967296]", "[0,0]") + "}"),
              StatusCode::kMalformedInput, P{"tensor \"t\"", "overflows"});
  check_error(raw_file("{" + entry("t", "[4611686018427387904]", "[0,0]") + "}"),
              StatusCode::kMalformedInput, P{"tensor \"t\"", "overflows"});
  // A zero dim makes a huge product harmless: 0 bytes.
  SafetensorsHeader h;
  CHECK(specdec::io::parse_safetensors(
            raw_file("{" + entry("t", "[0,4611686018427387904]", "[0,0]") + "}"), "m", &h)
            .ok());
}

TEST_CASE("safetensors: overlapping byte ranges name both tensors") {
  // a [0,8), b [4,12): overlap at 4..8. Reported on the later-starting tensor.
  check_error(
      raw_file("{" + entry("a", "[2]", "[0,8]") + "," + entry("b", "[2]", "[4,12]") + "}", 12),
      StatusCode::kMalformedInput,
      {"tensor \"b\"", "byte range [4, 12) overlaps tensor \"a\" [0, 8)"});
  // Same start.
  check_error(
      raw_file("{" + entry("x", "[1]", "[0,4]") + "," + entry("y", "[1]", "[0,4]") + "}", 4),
      StatusCode::kMalformedInput, {"overlaps tensor \"x\""});
  // A zero-size tensor inside another's range: the reference library refuses its offsets too.
  check_error(
      raw_file("{" + entry("a", "[2]", "[0,8]") + "," + entry("z", "[0]", "[4,4]") + "}", 8),
      StatusCode::kMalformedInput, {"tensor \"z\"", "byte range [4, 4) overlaps tensor \"a\""});
}

TEST_CASE("write_safetensors: exact bytes of a one-tensor file") {
  // {"x":{"data_offsets":[0,4],"dtype":"F32","shape":[1]}} is 54 bytes; padded to 56 with two
  // spaces so the data starts at 64.
  std::vector<float> const x = {3.25f};
  auto const xb = bytes_of(x);
  std::vector<TensorToWrite> t = {{"x", Dtype::kF32, {1}, xb}};
  std::vector<std::byte> out;
  REQUIRE(specdec::io::encode_safetensors(t, {}, &out).ok());
  std::string const json = "{\"x\":{\"data_offsets\":[0,4],\"dtype\":\"F32\",\"shape\":[1]}}  ";
  CHECK(out == raw_file(json, xb, 56));
}

TEST_CASE("write_safetensors: layout, alignment and round trip") {
  TempDir dir;
  std::string const path = dir.file("w.safetensors");
  std::vector<uint16_t> const h3 = {0x3f80, 0xc000, 0x3fc0};  // BF16 [3]: 1, -2, 1.5
  std::vector<float> const f4 = {1, 2, 3, 4};                 // F32 [2, 2]
  std::vector<int64_t> const i1 = {-5};                       // I64 [1]
  std::vector<uint8_t> const b5 = {1, 0, 1, 1, 0};            // BOOL [5]
  std::vector<int32_t> const i2 = {7, -8};                    // I32 [2]
  auto const bh3 = bytes_of(h3), bf4 = bytes_of(f4), bi1 = bytes_of(i1), bb5 = bytes_of(b5),
             bi2 = bytes_of(i2);
  std::vector<TensorToWrite> const t = {{"z.half", Dtype::kBF16, {3}, bh3},
                                        {"m.float", Dtype::kF32, {2, 2}, bf4},
                                        {"a.long", Dtype::kI64, {1}, bi1},
                                        {"b.mask", Dtype::kBool, {5}, bb5},
                                        {"c.int", Dtype::kI32, {2}, bi2}};
  REQUIRE(specdec::io::write_safetensors(path, t, {{"format", "pt"}, {"k", "v"}}).ok());
  CHECK_FALSE(fs::exists(path + ".tmp"));

  SafetensorsFile f;
  Status const s = SafetensorsFile::open(path, &f);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(f.header().data_start % 8 == 0);
  // Data order by element size then name: a.long [0,8), c.int [8,16), m.float [16,32),
  // z.half [32,38), b.mask [38,43); no gaps, the last end is the data size.
  auto range = [&](std::string_view n) {
    for (auto const& e : f.header().tensors) {
      if (e.name == n) return std::pair<uint64_t, uint64_t>{e.begin, e.end};
    }
    return std::pair<uint64_t, uint64_t>{999, 999};
  };
  CHECK(range("a.long") == std::pair<uint64_t, uint64_t>{0, 8});
  CHECK(range("c.int") == std::pair<uint64_t, uint64_t>{8, 16});
  CHECK(range("m.float") == std::pair<uint64_t, uint64_t>{16, 32});
  CHECK(range("z.half") == std::pair<uint64_t, uint64_t>{32, 38});
  CHECK(range("b.mask") == std::pair<uint64_t, uint64_t>{38, 43});
  CHECK(f.header().data_size == 43);
  // Names are listed sorted in the JSON text.
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t const pa = text.find("\"a.long\""), pb = text.find("\"b.mask\""),
               pc = text.find("\"c.int\""), pm = text.find("\"m.float\""),
               pz = text.find("\"z.half\"");
  CHECK((pa < pb && pb < pc && pc < pm && pm < pz && pz != std::string::npos));

  CHECK(f.metadata() == std::map<std::string, std::string>{{"format", "pt"}, {"k", "v"}});
  for (auto const& w : t) {
    auto v = f.find(w.name);
    REQUIRE(v.has_value());
    CHECK(v->dtype == w.dtype);
    CHECK(v->shape == w.shape);
    REQUIRE(v->bytes.size() == w.bytes.size());
    CHECK(std::memcmp(v->bytes.data(), w.bytes.data(), w.bytes.size()) == 0);
    CHECK(reinterpret_cast<uintptr_t>(v->bytes.data()) % specdec::dtype_size(w.dtype) == 0);
  }
  CHECK(specdec::bf16_to_float(
            *reinterpret_cast<uint16_t const*>(f.find("z.half")->bytes.data() + 2)) == -2.0f);
}

TEST_CASE("write_safetensors: errors name the tensor and leave no file") {
  TempDir dir;
  std::string const path = dir.file("w.safetensors");
  std::vector<float> const f2 = {1, 2};
  auto const b = bytes_of(f2);
  auto write_error = [&](std::vector<TensorToWrite> const& t, std::vector<std::string> const& parts,
                         std::map<std::string, std::string> const& md = {}) {
    Status const s = specdec::io::write_safetensors(path, t, md);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    for (auto const& p : parts)
      CHECK_MESSAGE(contains(s.message(), p), "want '", p, "' in: ", s.message());
    CHECK_FALSE(fs::exists(path));
    CHECK_FALSE(fs::exists(path + ".tmp"));
  };
  write_error({{"w", Dtype::kF32, {3}, b}},
              {path, "tensor \"w\"", "8 bytes given, shape [3] of F32 needs 12"});
  write_error({{"w", Dtype::kF32, {2}, b}, {"w", Dtype::kF32, {2}, b}},
              {"tensor \"w\"", "appears twice"});
  write_error({{"__metadata__", Dtype::kF32, {2}, b}},
              {"\"__metadata__\"", "not a usable tensor name"});
  write_error({{"", Dtype::kF32, {2}, b}}, {"not a usable tensor name"});
  write_error({{"w", Dtype::kF32, {-2}, b}}, {"tensor \"w\"", "negative dim in shape [-2]"});
  write_error({{"w", Dtype::kF32, {int64_t{1} << 62, 8}, b}}, {"tensor \"w\"", "more than 2^64"});
  write_error({{"bad\xff", Dtype::kF32, {2}, b}}, {"cannot encode the header"});
  write_error({{"w", Dtype::kF32, {2}, b}}, {"cannot encode the header"}, {{"k", "bad\xfe"}});

  Status const s = specdec::io::write_safetensors(dir.file("no/such/dir.safetensors"),
                                                  {{TensorToWrite{"w", Dtype::kF32, {2}, b}}});
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(contains(s.message(), dir.file("no/such/dir.safetensors.tmp")));
}

namespace {

// Writes `name` in `dir` with F32 tensors of the given names; tensor i holds {i, i + 0.5}.
void write_f32_file(std::string const& path, std::vector<std::string> const& names) {
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorToWrite> t;
  for (size_t i = 0; i < names.size(); ++i) {
    data.push_back(bytes_of(std::vector<float>{float(i), float(i) + 0.5f}));
  }
  for (size_t i = 0; i < names.size(); ++i) t.push_back({names[i], Dtype::kF32, {2}, data[i]});
  REQUIRE(specdec::io::write_safetensors(path, t).ok());
}

void write_text(std::string const& path, std::string const& text) {
  write_bytes(path, bytes_of(text));
}

}  // namespace

TEST_CASE("SafetensorsCheckpoint: single file") {
  TempDir dir;
  write_f32_file(dir.file("model.safetensors"), {"model.norm.weight", "lm_head.weight"});
  SafetensorsCheckpoint c;
  Status s = SafetensorsCheckpoint::open(dir.path.string(), &c);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(c.num_shards() == 1);
  CHECK(c.size() == 2);
  CHECK(c.names() == std::vector<std::string_view>{"lm_head.weight", "model.norm.weight"});
  CHECK(c.shard_of("lm_head.weight") == "model.safetensors");
  CHECK(c.contains("model.norm.weight"));

  TensorView v;
  s = c.get("model.norm.weight", Dtype::kF32, {2}, &v);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(floats(v) == std::vector<float>{0.0f, 0.5f});  // written first -> i = 0
  CHECK(v.name == "model.norm.weight");
  REQUIRE(c.get("lm_head.weight", Dtype::kF32, {2}, &v).ok());
  CHECK(floats(v) == std::vector<float>{1.0f, 1.5f});  // written second -> i = 1

  s = c.get("model.norm.weight", Dtype::kBF16, {2}, &v);
  CHECK(s.code() == StatusCode::kMalformedInput);
  CHECK(contains(s.message(), dir.file("model.safetensors")));
  CHECK(contains(s.message(),
                 "tensor \"model.norm.weight\": dtype or shape not what the model "
                 "expects: expected BF16 [2], found F32 [2]"));
  s = c.get("lm_head.weight", Dtype::kF32, {2, 1}, &v);
  CHECK(contains(s.message(), "expected F32 [2, 1], found F32 [2]"));

  s = c.get("model.embed_tokens.weight", Dtype::kF32, {2}, &v);
  CHECK(s.code() == StatusCode::kMalformedInput);
  CHECK(contains(s.message(), dir.path.string()));
  CHECK(
      contains(s.message(),
               "missing tensor \"model.embed_tokens.weight\" (looked in shard model.safetensors)"));
  CHECK_FALSE(c.find("model.embed_tokens.weight").has_value());
}

TEST_CASE("SafetensorsCheckpoint: sharded through the index") {
  TempDir dir;
  write_f32_file(dir.file("s1.safetensors"),
                 {"language_model.model.norm.weight", "language_model.lm_head.weight"});
  write_f32_file(dir.file("s2.safetensors"),
                 {"language_model.model.embed_tokens.weight", "unlisted"});
  write_text(dir.file("model.safetensors.index.json"),
             R"({"metadata": {"total_size": 24},
                 "weight_map": {"language_model.model.norm.weight": "s1.safetensors",
                                "language_model.lm_head.weight": "s1.safetensors",
                                "language_model.model.embed_tokens.weight": "s2.safetensors"}})");
  SafetensorsCheckpoint c;
  Status s = SafetensorsCheckpoint::open(dir.path.string(), &c);
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(c.num_shards() == 2);  // each shard opened once
  CHECK(c.size() == 3);        // the weight_map's names; "unlisted" is not one
  CHECK(c.names() == std::vector<std::string_view>{"language_model.lm_head.weight",
                                                   "language_model.model.embed_tokens.weight",
                                                   "language_model.model.norm.weight"});
  CHECK(c.index_metadata()["total_size"] == 24);
  CHECK(c.shard_of("language_model.model.embed_tokens.weight") == "s2.safetensors");
  CHECK_FALSE(c.find("unlisted").has_value());
  TensorView v;
  REQUIRE(c.get("language_model.model.embed_tokens.weight", Dtype::kF32, {2}, &v).ok());
  CHECK(floats(v) == std::vector<float>{0.0f, 0.5f});
  REQUIRE(c.get("language_model.model.norm.weight", Dtype::kF32, {2}, &v).ok());
  CHECK(floats(v) == std::vector<float>{0.0f, 0.5f});
  REQUIRE(c.get("language_model.lm_head.weight", Dtype::kF32, {2}, &v).ok());
  CHECK(floats(v) == std::vector<float>{1.0f, 1.5f});
  s = c.get("model.norm.weight", Dtype::kF32, {2}, &v);
  CHECK(contains(s.message(),
                 "missing tensor \"model.norm.weight\" (looked in 2 shards listed by "
                 "model.safetensors.index.json)"));
  s = c.get("language_model.model.norm.weight", Dtype::kF32, {3}, &v);
  CHECK(contains(s.message(), dir.file("s1.safetensors")));
  CHECK(contains(s.message(), "expected F32 [3], found F32 [2]"));

  // Views outlive a move of the checkpoint.
  SafetensorsCheckpoint moved = std::move(c);
  CHECK(floats(v) == std::vector<float>{1.0f, 1.5f});
  CHECK(moved.find("language_model.lm_head.weight")->bytes.data() == v.bytes.data());
}

TEST_CASE("SafetensorsCheckpoint: directory and index errors") {
  auto open_dir = [](TempDir const& dir) {
    SafetensorsCheckpoint c;
    Status s = SafetensorsCheckpoint::open(dir.path.string(), &c);
    CHECK_FALSE(s.ok());
    return s;
  };
  auto expect = [](Status const& s, StatusCode code, std::vector<std::string> const& parts) {
    CHECK_MESSAGE(s.code() == code, s.to_string());
    for (auto const& p : parts)
      CHECK_MESSAGE(contains(s.message(), p), "want '", p, "' in: ", s.message());
  };
  std::string const idx = "model.safetensors.index.json";
  {
    TempDir dir;
    expect(open_dir(dir), StatusCode::kInvalidArgument,
           {dir.path.string(), "no model.safetensors and no model.safetensors.index.json"});
  }
  {
    TempDir dir;
    write_f32_file(dir.file("model.safetensors"), {"a"});
    write_text(dir.file(idx), R"({"weight_map": {"a": "model.safetensors"}})");
    expect(open_dir(dir), StatusCode::kInvalidArgument, {"both model.safetensors and"});
  }
  {
    TempDir dir;  // a corrupt single file: its own error, naming it
    write_bytes(dir.file("model.safetensors"), raw_file("{\"a\":", 0));
    expect(open_dir(dir), StatusCode::kMalformedInput,
           {dir.file("model.safetensors"), "not valid JSON"});
  }
  struct IndexCase {
    std::string text;
    StatusCode code;
    std::vector<std::string> parts;
  };
  std::vector<IndexCase> const cases = {
      {"{\"weight_map\": ", StatusCode::kMalformedInput, {"not valid JSON"}},
      {"[]", StatusCode::kMalformedInput, {"is a JSON array, expected an object"}},
      {"{}", StatusCode::kMalformedInput, {"missing field \"weight_map\""}},
      {R"({"weight_map": []})", StatusCode::kMalformedInput, {"\"weight_map\" is a JSON array"}},
      {R"({"weight_map": {}})", StatusCode::kMalformedInput, {"\"weight_map\" is empty"}},
      {R"({"metadata": 3, "weight_map": {"a": "s1.safetensors"}})",
       StatusCode::kMalformedInput,
       {"field \"metadata\" is a JSON number"}},
      {R"({"weight_map": {"a": 1}})",
       StatusCode::kMalformedInput,
       {"weight_map[\"a\"] is a JSON number, expected a shard file name"}},
      {R"({"weight_map": {"a": "s1.safetensors", "a": "s1.safetensors"}})",
       StatusCode::kMalformedInput,
       {"duplicate key \"a\""}},
      {R"({"weight_map": {"a": "../s1.safetensors"}})",
       StatusCode::kMalformedInput,
       {"weight_map[\"a\"] = \"../s1.safetensors\" is not a file name inside"}},
      {R"({"weight_map": {"a": "/etc/passwd"}})",
       StatusCode::kMalformedInput,
       {"\"/etc/passwd\" is not a file name inside"}},
      {R"({"weight_map": {"a": ""}})", StatusCode::kMalformedInput, {"is not a file name inside"}},
      {R"({"weight_map": {"a": "s1.safetensors", "zz": "s1.safetensors"}})",
       StatusCode::kMalformedInput,
       {"tensor \"zz\" is listed in weight_map but missing from shard s1.safetensors"}},
      {R"({"weight_map": {"a": "s1.safetensors", "b": "absent.safetensors"}})",
       StatusCode::kInvalidArgument,
       {"absent.safetensors", "No such file"}},
      {R"({"weight_map": {"a": "s1.safetensors", "b": "bad.safetensors"}})",
       StatusCode::kMalformedInput,
       {"bad.safetensors", "tensor \"b\"", "end < begin"}},
  };
  for (auto const& c : cases) {
    CAPTURE(c.text);
    TempDir dir;
    write_f32_file(dir.file("s1.safetensors"), {"a"});
    std::string bad_header = "{";  // built in steps: g++ 12 misreports -Wrestrict on "{" + ...
    bad_header += entry("b", "[1]", "[4,0]");
    bad_header += "}";
    write_bytes(dir.file("bad.safetensors"), raw_file(bad_header, 4));
    write_text(dir.file(idx), c.text);
    Status const s = open_dir(dir);
    expect(s, c.code, c.parts);
    if (c.code == StatusCode::kMalformedInput &&
        c.parts[0].find("bad.safetensors") == std::string::npos) {
      CHECK_MESSAGE(contains(s.message(), dir.file(idx)), s.message());
    }
  }
}
