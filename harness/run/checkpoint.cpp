#include "checkpoint.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>

#include "canary_run.h"
#include "receipt/hdf5_file.h"

namespace harness::run {
namespace {

// Engine array keys contain '/' (fp8/<site>/<role>/history): one dataset each, named
// with ':' instead, so that HDF5 does not read them as groups.
std::string dataset_name(std::string key) {
  for (char& c : key) c = c == '/' ? ':' : c;
  return key;
}
std::string key_of(std::string dataset) {
  for (char& c : dataset) c = c == ':' ? '/' : c;
  return dataset;
}

TensorKind kind_of(std::size_t family) {
  constexpr TensorKind kinds[] = {TensorKind::Parameter, TensorKind::AdamM, TensorKind::AdamV};
  return kinds[family];
}

void write_checkpoint_file(const std::string& path, const Checkpoint& c) {
  const h5::Handle file = h5::create_file(path, true);
  h5::write_attr(file, "checkpoint_version", kCheckpointVersion);
  h5::write_attr(file, "step", std::int64_t{c.step});
  h5::write_attr(file, "lane", c.lane);
  h5::write_attr(file, "seed", c.seed);
  h5::write_attr(file, "data_seed", static_cast<std::int64_t>(c.data_seed));
  h5::write_attr(file, "data_cursor", c.data_cursor);
  h5::write_string_dataset(file, "names", c.names);
  for (std::size_t f = 0; f < 3; ++f) {
    const h5::Handle group = h5::create_group(file, kCheckpointFamilies[f]);
    for (std::size_t k = 0; k < c.names.size(); ++k) {
      const std::vector<float>& values = c.tensors[f][k];
      h5::write_dataset(group, c.names[k], H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {values.size()}, values.data());
    }
  }
  const h5::Handle engine = h5::create_group(file, "engine");
  for (const auto& [key, values] : c.engine.arrays) {
    h5::write_dataset(engine, dataset_name(key), H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {values.size()}, values.data());
  }
  for (const auto& [key, value] : c.engine.facts) h5::write_attr(engine, key, value);
  errno = 0;
  if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) {
    const int error = errno;
    throw h5::Hdf5Error(fmt::format("{}: HDF5 cannot flush the checkpoint{}; free space (or raise the file size limit) "
                                    "and run again",
                                    path, error != 0 ? fmt::format(" ({})", std::strerror(error)) : ""));
  }
}

Checkpoint read_checkpoint_file(const std::string& path) {
  const h5::Handle file = h5::open_file(path, false);
  Checkpoint c;
  if (h5::read_attr_int(file, "checkpoint_version") != kCheckpointVersion) {
    throw h5::Hdf5Error(fmt::format("checkpoint_version is not {}", kCheckpointVersion));
  }
  const std::int64_t step = h5::read_attr_int(file, "step");
  if (step < 1 || step > std::numeric_limits<int>::max()) {
    throw h5::Hdf5Error(fmt::format("step {} is not a checkpoint's step (1..{})", step, std::numeric_limits<int>::max()));
  }
  c.step = static_cast<int>(step);
  c.lane = h5::read_attr_string(file, "lane");
  c.seed = h5::read_attr_int(file, "seed");
  c.data_seed = static_cast<std::uint64_t>(h5::read_attr_int(file, "data_seed"));
  c.data_cursor = h5::read_attr_int(file, "data_cursor");
  c.names = h5::read_strings(file, "names");
  for (std::size_t f = 0; f < 3; ++f) {
    for (const std::string& name : c.names) {
      c.tensors[f].push_back(h5::read_f32(file, fmt::format("/{}/{}", kCheckpointFamilies[f], name)));
    }
  }
  const h5::Handle engine = h5::open_group(file, "engine");
  for (const h5::DatasetInfo& d : h5::list_datasets(file)) {
    if (d.path.starts_with("/engine/")) c.engine.arrays[key_of(d.path.substr(8))] = h5::read_f32(file, d.path);
  }
  for (const std::string& key : h5::attr_names(engine)) c.engine.facts[key] = h5::read_attr_string(engine, key);
  return c;
}

}  // namespace

std::string checkpoint_dir(const std::string& receipt_path) { return receipt_path + ".ckpt"; }

std::string checkpoint_file_name(int step) { return fmt::format("step_{:06d}.h5", step); }

Checkpoint capture_checkpoint(Engine& engine, const canary::Canary& model, int step, const std::string& lane,
                              std::int64_t seed) {
  Checkpoint c;
  c.step = step;
  c.lane = lane;
  c.seed = seed;
  c.data_seed = model.config().data_seed;
  c.data_cursor = step;
  for (TensorId p : model.parameters()) {
    c.names.push_back(model.tensors()[p].name);
    for (std::size_t f = 0; f < 3; ++f) {
      const TensorId id = f == 0 ? p : model.tensors().shadow(p, kind_of(f));
      const std::span<const float> values = engine.read(id);
      c.tensors[f].emplace_back(values.begin(), values.end());
    }
  }
  c.engine = engine.save_state();
  return c;
}

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  const std::string partial = path + ".partial";
  try {
    write_checkpoint_file(partial, checkpoint);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    throw;
  }
  std::filesystem::rename(partial, path);
}

Checkpoint load_checkpoint(const std::string& path) {
  try {
    return read_checkpoint_file(path);
  } catch (const h5::Hdf5Error& e) {
    throw UsageError(fmt::format("{}: not a readable checkpoint ({}); write it again with --checkpoint-every", path, e.what()));
  }
}

void restore_checkpoint(const Checkpoint& c, Engine& engine, const canary::Canary& model) {
  const auto& params = model.parameters();
  if (c.names.size() != params.size()) {
    throw UsageError(fmt::format("checkpoint of step {}: {} parameters where the model has {}", c.step, c.names.size(),
                                 params.size()));
  }
  for (std::size_t k = 0; k < params.size(); ++k) {
    const TensorDesc& d = model.tensors()[params[k]];
    for (std::size_t f = 0; f < 3; ++f) {
      if (c.names[k] != d.name || static_cast<std::int64_t>(c.tensors[f][k].size()) != d.numel()) {
        throw UsageError(fmt::format("checkpoint of step {}: {} {} does not fit the model's {}", c.step,
                                     kCheckpointFamilies[f], c.names[k], d.name));
      }
      engine.upload(f == 0 ? params[k] : model.tensors().shadow(params[k], kind_of(f)), c.tensors[f][k]);
    }
  }
  try {
    engine.restore_state(c.engine);
  } catch (const std::invalid_argument& e) {
    throw UsageError(fmt::format("checkpoint of step {}: {}", c.step, e.what()));
  }
}

}  // namespace harness::run
