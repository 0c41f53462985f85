// io::AtomicFileWriter: the file appears whole at commit() or not at all, the temporary file
// never outlives the writer, and every failure names the file and the reason.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "specdec/io/atomic_file.hpp"
#include "support/status_checks.hpp"
#include "support/testing.hpp"

using specdec::Status;
using specdec::StatusCode;
using specdec::io::AtomicFileWriter;
namespace fs = std::filesystem;

namespace {

std::string read_all(fs::path const& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_all(fs::path const& p, std::string const& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

}  // namespace

TEST_CASE("AtomicFileWriter: commit puts the whole file in place, replacing the old one") {
  specdec::testing::TempDir dir;
  fs::path const path = fs::path(dir.path) / "out.bin";
  write_all(path, "old contents");
  AtomicFileWriter file(path.string());
  CHECK(file.tmp_path() == path.string() + ".tmp");
  REQUIRE(file.open().ok());
  CHECK(file.write("abc", 3));
  CHECK(file.write(nullptr, 0));  // an empty piece writes nothing and is no error
  CHECK(file.write("defg", 4));
  CHECK(fs::exists(file.tmp_path()));
  CHECK(read_all(path) == "old contents");  // untouched until commit
  Status const s = file.commit();
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(read_all(path) == "abcdefg");
  CHECK_FALSE(fs::exists(file.tmp_path()));
}

TEST_CASE("AtomicFileWriter: a writer dropped before commit leaves the old file alone") {
  specdec::testing::TempDir dir;
  fs::path const path = fs::path(dir.path) / "out.bin";
  fs::path const fresh = fs::path(dir.path) / "fresh.bin";
  write_all(path, "old contents");
  {
    AtomicFileWriter file(path.string());
    REQUIRE(file.open().ok());
    CHECK(file.write("partial", 7));
    AtomicFileWriter other(fresh.string());
    REQUIRE(other.open().ok());
  }
  CHECK(read_all(path) == "old contents");
  CHECK_FALSE(fs::exists(path.string() + ".tmp"));
  CHECK_FALSE(fs::exists(fresh));
  CHECK_FALSE(fs::exists(fresh.string() + ".tmp"));
}

TEST_CASE("AtomicFileWriter: failures name the file and the reason") {
  specdec::testing::TempDir dir;
  // The directory does not exist: open names the temporary file.
  std::string const missing = (fs::path(dir.path) / "no_such_dir" / "out.bin").string();
  AtomicFileWriter lost(missing);
  specdec::testing::check_error(lost.open(), StatusCode::kInvalidArgument,
                                {"cannot create", missing + ".tmp", "No such file"});
  CHECK_FALSE(lost.write("x", 1));
  specdec::testing::check_error(lost.commit(), StatusCode::kInternal,
                                {"commit of", "without an open file"});

  // The target is a directory that is not empty: the rename fails, the temporary file goes and
  // the directory stays.
  fs::path const target = fs::path(dir.path) / "taken";
  fs::create_directories(target);
  write_all(target / "inside", "keep");
  AtomicFileWriter blocked(target.string());
  REQUIRE(blocked.open().ok());
  CHECK(blocked.write("abc", 3));
  specdec::testing::check_error(blocked.commit(), StatusCode::kInvalidArgument,
                                {"cannot rename", target.string() + ".tmp", target.string()});
  CHECK_FALSE(fs::exists(target.string() + ".tmp"));
  CHECK(read_all(target / "inside") == "keep");

  // Opening twice is a programming error, named; the first file stays open and commits.
  fs::path const twice = fs::path(dir.path) / "twice.bin";
  AtomicFileWriter again(twice.string());
  REQUIRE(again.open().ok());
  specdec::testing::check_error(again.open(), StatusCode::kInternal, {"already open"});
  CHECK(again.write("ok", 2));
  REQUIRE(again.commit().ok());
  CHECK(read_all(twice) == "ok");
}

TEST_CASE("write_file_atomically: the whole text replaces the file; a failure leaves it alone") {
  specdec::testing::TempDir dir;
  fs::path const path = fs::path(dir.path) / "config.json";
  write_all(path, "old contents");
  Status const s = specdec::io::write_file_atomically(path.string(), "{\"a\": 1}\n");
  REQUIRE_MESSAGE(s.ok(), s.to_string());
  CHECK(read_all(path) == "{\"a\": 1}\n");
  CHECK_FALSE(fs::exists(path.string() + ".tmp"));
  // A directory in the way of the rename: named, and nothing is left behind.
  fs::path const blocked = fs::path(dir.path) / "blocked";
  fs::create_directories(blocked / "child");
  specdec::testing::check_error(specdec::io::write_file_atomically(blocked.string(), "x"),
                                StatusCode::kInvalidArgument,
                                {"cannot rename", blocked.string() + ".tmp"});
  CHECK(fs::is_directory(blocked / "child"));
  CHECK_FALSE(fs::exists(blocked.string() + ".tmp"));
  std::string const missing = (fs::path(dir.path) / "no_such_dir" / "c.json").string();
  specdec::testing::check_error(specdec::io::write_file_atomically(missing, "x"),
                                StatusCode::kInvalidArgument, {"cannot create", missing + ".tmp"});
}
