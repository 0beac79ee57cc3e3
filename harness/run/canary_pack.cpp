#include "canary_pack.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "canary_file.h"
#include "data_source.h"
#include "canary_run.h"
#include "canary.h"
#include "receipt/hdf5_file.h"
#include "registry.h"
#include "run_setup.h"
#include "stack_info.h"

namespace harness::run {
namespace {

namespace fs = std::filesystem;

constexpr hsize_t kBatchChunkRows = 16;

canary::CanaryConfig validated_config(const PackOptions& o) {
  canary::CanaryConfig config;
  try {
    config = canary::load_canary(o.canary);
    canary::make_data_source(config);  // a token file that changed since: refused before any file is written
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("--canary: {}", e.what()));
  }
  if (o.steps) config.steps = checked_steps(*o.steps);
  if (o.seed) config.init_seed = *o.seed;
  if (config.init_seed < 0) throw UsageError("--seed: must be between 0 and 9223372036854775807");
  return config;
}

std::string partial_path(const std::string& out) { return out + ".partial"; }

void check_output_path(const PackOptions& o) {
  check_output_file(o.out, o.force, "pack", "tiny-pack.h5");
  std::error_code ec;
  const fs::path partial(partial_path(o.out));
  if (fs::exists(fs::symlink_status(partial, ec)) && !fs::is_regular_file(fs::symlink_status(partial, ec))) {
    throw UsageError(fmt::format("--out: '{}' (where the pack is written before it is renamed into place) exists "
                                 "and is not a file; remove it or choose another --out",
                                 partial.string()));
  }
}

void write_manifest(hid_t file, const canary::CanaryConfig& config, std::int64_t seed) {
  const h5::Handle manifest = h5::create_group(file, "manifest");
  const StackInfo stack = collect_stack_info();
  h5::write_attr(manifest, "pack_version", kPackVersion);
  // Exactly what a receipt's manifest `canary` holds for a run of these steps.
  h5::write_attr(manifest, "canary", config.to_json().dump());
  h5::write_attr(manifest, "seed", seed);
  h5::write_attr(manifest, "data_seed", static_cast<std::int64_t>(config.data_seed));
  h5::write_attr(manifest, "steps", static_cast<std::int64_t>(config.steps));
  h5::write_attr(manifest, "created_utc", utc_timestamp());
  h5::write_attr(manifest, "git_commit", stack.git_commit);
}

// The parameters at the start of step 0, exactly as a run initialises them: the model's
// own initialisation uploaded to a cpu-ref engine and read back.
std::int64_t write_init(hid_t file, const canary::CanaryConfig& config, std::uint64_t seed, std::size_t& count) {
  const RunSetup setup = set_up_run(config, make_engine("cpu-ref"));
  upload_initial_parameters(setup, seed);
  const canary::Canary& model = *setup.model;
  Engine* const engine = setup.engine.get();
  const h5::Handle init = h5::create_group(file, "init");
  std::vector<std::string> names;
  std::int64_t elements = 0;
  for (TensorId p : model.parameters()) {
    const TensorDesc& d = model.tensors()[p];
    const std::span<const float> values = engine->read(p);
    if (static_cast<std::int64_t>(values.size()) != d.numel()) {
      throw std::logic_error(fmt::format("export: {} read {} values for {} elements", d.name, values.size(), d.numel()));
    }
    const std::vector<hsize_t> shape(d.shape.begin(), d.shape.end());
    h5::write_dataset(init, d.name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, shape, values.data());
    names.push_back(d.name);
    elements += d.numel();
  }
  h5::write_string_dataset(init, "names", names);
  count = names.size();
  return elements;
}

void write_batches(hid_t file, const canary::CanaryConfig& config) {
  const std::unique_ptr<canary::DataSource> data = canary::make_data_source(config);
  const h5::Handle batches = h5::create_group(file, "batches");
  const hsize_t rows = static_cast<hsize_t>(config.batch_size), columns = static_cast<hsize_t>(config.context_length + 1);
  h5::GrowingDataset tokens(batches, "tokens", H5T_STD_I32LE, {rows, columns}, kBatchChunkRows);
  for (int step = 0; step < config.steps; ++step) {
    const canary::Batch batch = data->batch(step);
    if (batch.tokens.size() != rows * columns) {
      throw std::logic_error(fmt::format("export: batch {} holds {} tokens, not {}", step, batch.tokens.size(), rows * columns));
    }
    tokens.append(batch.tokens.data(), H5T_NATIVE_INT32);
  }
}

// The canary's held-out batch, when it evaluates one ([eval]; docs/logit-kl.md): another
// stack's lane evaluates the same tokens at the same steps, and its /eval compares.
void write_held_out(hid_t file, const canary::CanaryConfig& config) {
  if (config.eval_every == 0) return;
  const canary::Batch batch = canary::held_out_batch(*canary::make_data_source(config));
  const h5::Handle eval = h5::create_group(file, "eval");
  h5::write_attr(eval, "every", std::int64_t{config.eval_every});
  h5::write_attr(eval, "rows", std::int64_t{config.eval_rows});
  h5::write_attr(eval, "held_out_hash", fmt::format("{:016x}", canary::batch_hash(batch)));
  h5::write_attr(eval, "source", fmt::format("batch {} of the canary's data", canary::kHeldOutBatch));
  const auto rows = static_cast<hsize_t>(config.batch_size), columns = static_cast<hsize_t>(config.context_length + 1);
  h5::write_dataset(eval, "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, {rows, columns}, batch.tokens.data());
}

// A file of HDF5's core driver that never touches the disk, in the checksummed 1.10 format
// of every receipt (hdf5_file.h's create_file, in memory). `name` only names it in errors.
h5::Handle create_in_memory(const std::string& name) {
  const h5::Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access properties");
  if (H5Pset_libver_bounds(access, H5F_LIBVER_V110, H5F_LIBVER_V110) < 0 ||
      H5Pset_fapl_core(access, std::size_t{1} << 20, /*backing_store=*/0) < 0) {
    throw h5::Hdf5Error(fmt::format("{}: HDF5 cannot set up an in-memory file", name));
  }
  return h5::Handle(H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access), H5Fclose, "create " + name + " in memory");
}

// Bob Jenkins' lookup3 hashlittle(), as HDF5 checksums its metadata (H5_checksum_lookup3).
std::uint32_t lookup3(const unsigned char* k, std::size_t length) {
  const auto rot = [](std::uint32_t x, int r) { return (x << r) | (x >> (32 - r)); };
  const auto word = [](const unsigned char* p) {
    return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24;
  };
  std::uint32_t a = 0xdeadbeefu + static_cast<std::uint32_t>(length), b = a, c = a;
  while (length > 12) {
    a += word(k), b += word(k + 4), c += word(k + 8);
    a -= c, a ^= rot(c, 4), c += b;
    b -= a, b ^= rot(a, 6), a += c;
    c -= b, c ^= rot(b, 8), b += a;
    a -= c, a ^= rot(c, 16), c += b;
    b -= a, b ^= rot(a, 19), a += c;
    c -= b, c ^= rot(b, 4), b += a;
    length -= 12, k += 12;
  }
  if (length == 0) return c;
  unsigned char tail[12] = {};
  std::memcpy(tail, k, length);
  a += word(tail), b += word(tail + 4), c += word(tail + 8);
  c ^= b, c -= rot(b, 14);
  a ^= c, a -= rot(c, 11);
  b ^= a, b -= rot(a, 25);
  c ^= b, c -= rot(b, 16);
  a ^= c, a -= rot(c, 4);
  b ^= a, b -= rot(a, 14);
  c ^= b, c -= rot(b, 24);
  return c;
}

// HDF5 1.10.8's H5Fget_file_image clears the superblock's file-status flags in the copy
// but keeps the checksum computed with them set, so the image fails to open ("incorrect
// metadata checksum"). Recompute it (superblock versions 2 and 3: the checksum follows
// 12 bytes and four addresses); a no-op where the library got it right.
void fix_superblock_checksum(std::vector<char>& image, const std::string& name) {
  const auto* bytes = reinterpret_cast<unsigned char*>(image.data());
  if (image.size() < 12 || std::memcmp(bytes, "\x89HDF\r\n\x1a\n", 8) != 0 || (bytes[8] != 2 && bytes[8] != 3)) {
    throw h5::Hdf5Error(fmt::format("{}: HDF5 made a file image without a version 2/3 superblock", name));
  }
  const std::size_t checked = 12 + 4 * std::size_t{bytes[9]};
  if (image.size() < checked + 4) throw h5::Hdf5Error(fmt::format("{}: HDF5 made a truncated file image", name));
  const std::uint32_t sum = lookup3(bytes, checked);
  for (int i = 0; i < 4; ++i) image[checked + i] = static_cast<char>((sum >> (8 * i)) & 0xFF);
}

// Opens the finished image in memory and reads /init/names back: a pack that HDF5 cannot
// read is an error here, before anything reaches the disk.
void check_image_reads_back(std::vector<char>& image, const std::string& name, std::size_t tensors) {
  const h5::Handle access(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "file access properties");
  if (H5Pset_fapl_core(access, std::size_t{1} << 20, 0) < 0 || H5Pset_file_image(access, image.data(), image.size()) < 0) {
    throw h5::Hdf5Error(fmt::format("{}: HDF5 cannot open the pack's image in memory", name));
  }
  const h5::Handle file(H5Fopen(name.c_str(), H5F_ACC_RDONLY, access), H5Fclose, "read back the pack " + name);
  if (h5::read_strings(file, "/init/names").size() != tensors || h5::read_attr_int(h5::open_group(file, "manifest"), "pack_version") != kPackVersion) {
    throw h5::Hdf5Error(fmt::format("{}: the pack's image does not read back", name));
  }
}

// `bytes` into `partial` (synced), then renamed to `out`. On any error the partial file is
// removed and the error names it; a killed process leaves at most the partial file.
void write_file_atomically(const std::vector<char>& bytes, const std::string& partial, const std::string& out) {
  const auto fail = [&](const std::string& what, int error) {
    std::error_code ignored;
    fs::remove(partial, ignored);
    throw std::runtime_error(fmt::format("{}: cannot {} ({}); nothing was written to {}", partial, what,
                                         std::strerror(error), out));
  };
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error = errno;
    throw std::runtime_error(fmt::format("{}: cannot create the pack ({}); nothing was written to {}", partial,
                                         std::strerror(error), out));
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      ::close(fd);
      fail("write the pack", error);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    fail("sync the pack to disk", error);
  }
  if (::close(fd) != 0) fail("close the pack", errno);
  std::error_code ec;
  fs::rename(partial, out, ec);  // replaces an existing pack only with --force (checked before)
  if (ec) fail("rename it to " + out, ec.value());
}

}  // namespace

PackSummary export_pack(const PackOptions& o) {
  const canary::CanaryConfig config = validated_config(o);
  check_output_path(o);

  PackSummary summary;
  summary.path = o.out;
  summary.canary = config.name;
  summary.seed = config.init_seed;
  summary.steps = config.steps;
  summary.batch_size = config.batch_size;
  summary.row_length = config.context_length + 1;

  // The pack is assembled in memory (HDF5's core driver) and reaches the disk as one
  // image: an I/O error (a full disk, a file size limit) is then a plain write error with
  // the partial file removed, never an HDF5 file that fails to close (HDF5 1.10.8 crashes
  // at exit on a file whose close failed).
  const std::string partial = partial_path(o.out);
  std::vector<char> image;
  {
    h5::Handle file = create_in_memory(partial);
    write_manifest(file, config, config.init_seed);
    summary.parameters = write_init(file, config, static_cast<std::uint64_t>(config.init_seed), summary.tensors);
    write_batches(file, config);
    write_held_out(file, config);
    if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) throw h5::Hdf5Error(fmt::format("{}: HDF5 cannot flush the pack", partial));
    const ssize_t size = H5Fget_file_image(file, nullptr, 0);
    if (size <= 0) throw h5::Hdf5Error(fmt::format("{}: HDF5 cannot size the pack's file image", partial));
    image.resize(static_cast<std::size_t>(size));
    if (H5Fget_file_image(file, image.data(), image.size()) != size) {
      throw h5::Hdf5Error(fmt::format("{}: HDF5 cannot copy the pack's file image", partial));
    }
  }
  fix_superblock_checksum(image, partial);
  check_image_reads_back(image, partial, summary.tensors);
  write_file_atomically(image, partial, o.out);
  return summary;
}

}  // namespace harness::run
