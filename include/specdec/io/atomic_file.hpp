// AtomicFileWriter: a file written whole or not at all. open() creates `path.tmp`; write()
// appends bytes to it; commit() closes it and renames it to `path`. A failed write, close or
// rename, or a writer destroyed before commit() (an error on the way), removes `path.tmp`, so
// `path` is either the complete new file or what it was before. Errors name the file and the
// system's reason. RAII; neither copied nor moved. write_file_atomically(path, bytes) writes a
// whole file that way in one call.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "specdec/core/status.hpp"

namespace specdec::io {

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {}
  AtomicFileWriter(AtomicFileWriter const&) = delete;
  AtomicFileWriter& operator=(AtomicFileWriter const&) = delete;
  ~AtomicFileWriter() { discard(); }

  std::string const& path() const { return path_; }
  std::string const& tmp_path() const { return tmp_; }

  Status open() {
    if (file_ != nullptr) {
      return Status::Internal("AtomicFileWriter: " + tmp_ + " is already open");
    }
    file_ = std::fopen(tmp_.c_str(), "wb");
    if (file_ == nullptr) {
      return Status::InvalidArgument("cannot create " + tmp_ + ": " + std::strerror(errno));
    }
    error_ = 0;
    return Status::Ok();
  }

  // Appends n bytes. False once a write has failed (then nothing more is written, and commit()
  // names the error).
  bool write(void const* data, size_t n) {
    if (file_ == nullptr) {
      if (error_ == 0) error_ = EBADF;
      return false;
    }
    if (error_ == 0 && n > 0 && std::fwrite(data, 1, n, file_) != n) error_ = errno ? errno : EIO;
    return error_ == 0;
  }

  // Closes the temporary file and renames it over `path`.
  Status commit() {
    if (file_ == nullptr) {
      return Status::Internal("AtomicFileWriter: commit of " + tmp_ + " without an open file");
    }
    int error = error_;
    if (std::fclose(std::exchange(file_, nullptr)) != 0 && error == 0) error = errno ? errno : EIO;
    if (error != 0) {
      std::remove(tmp_.c_str());
      return Status::InvalidArgument("cannot write " + tmp_ + ": " + std::strerror(error));
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      int const e = errno;
      std::remove(tmp_.c_str());
      return Status::InvalidArgument("cannot rename " + tmp_ + " to " + path_ + ": " +
                                     std::strerror(e));
    }
    return Status::Ok();
  }

 private:
  void discard() {
    if (file_ == nullptr) return;
    std::fclose(std::exchange(file_, nullptr));
    std::remove(tmp_.c_str());
  }

  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
  int error_ = 0;  // errno of the first failed write
};

// `path` holds exactly `bytes` afterwards, or (on an error, which names the file and the reason)
// what it held before.
inline Status write_file_atomically(std::string const& path, std::string_view bytes) {
  AtomicFileWriter file(path);
  SPECDEC_RETURN_IF_ERROR(file.open());
  file.write(bytes.data(), bytes.size());
  return file.commit();
}

}  // namespace specdec::io
