// MappedFile: a whole file mapped read-only into memory (POSIX open + fstat + mmap), RAII and
// move-only. bytes() spans the file's size at open time; an empty file is a valid empty span
// (nothing is mapped). The mapping is private and read-only: writing through it is impossible,
// and the bytes stay valid until the MappedFile is destroyed or moved from (moving keeps the
// address, so spans taken before a move stay valid in the moved-to object).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "specdec/core/status.hpp"

namespace specdec::io {

class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(MappedFile const&) = delete;
  MappedFile& operator=(MappedFile const&) = delete;
  MappedFile(MappedFile&& other) noexcept
      : path_(std::move(other.path_)),
        data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  MappedFile& operator=(MappedFile&& other) noexcept {
    if (this != &other) {
      reset();
      path_ = std::move(other.path_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~MappedFile() { reset(); }

  // Maps `path` into *out (replacing what *out held). Errors name the path and the errno text.
  static Status open(std::string const& path, MappedFile* out) {
    int const fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return error(path, "cannot open");
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      Status s = error(path, "cannot stat");
      ::close(fd);
      return s;
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return Status::InvalidArgument(path + ": not a regular file");
    }
    MappedFile m;
    m.path_ = path;
    m.size_ = static_cast<size_t>(st.st_size);
    if (m.size_ > 0) {
      void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        Status s = error(path, "cannot mmap " + std::to_string(m.size_) + " bytes of");
        m.size_ = 0;
        ::close(fd);
        return s;
      }
      m.data_ = p;
    }
    ::close(fd);  // the mapping keeps the file alive
    *out = std::move(m);
    return Status::Ok();
  }

  std::span<std::byte const> bytes() const { return {static_cast<std::byte const*>(data_), size_}; }
  size_t size() const { return size_; }
  std::string const& path() const { return path_; }
  bool is_open() const { return !path_.empty(); }

 private:
  static Status error(std::string const& path, std::string const& what) {
    int const e = errno;
    return Status::InvalidArgument(what + " " + path + ": " + std::strerror(e));
  }

  void reset() {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
    path_.clear();
  }

  std::string path_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace specdec::io
