#include "program.h"

#include <array>

#include "instructions.h"

namespace harness::tpu {
namespace {

template <typename T>
bool in_range(std::int32_t at, std::int32_t count, const std::vector<T>& pool) {
  return at >= 0 && count >= 0 && static_cast<std::size_t>(at) + static_cast<std::size_t>(count) <= pool.size();
}

}  // namespace

PartitionSpec Executable::spec_of(const Instr& in, int k) const {
  const auto i = static_cast<std::size_t>(in.specs_at + k);
  PartitionSpec spec;
  for (std::int32_t d = spec_offsets[i]; d < spec_offsets[i + 1]; ++d) {
    spec.dims.push_back({static_cast<Axis>(spec_dims[2 * static_cast<std::size_t>(d)]),
                         spec_dims[2 * static_cast<std::size_t>(d) + 1]});
  }
  return spec;
}

void Executable::append(InstrKind kind, std::int32_t node, std::span<const std::int32_t> buffers_in,
                        std::span<const std::int64_t> dims, std::span<const float> attrs, Axis axis,
                        std::span<const PartitionSpec> specs) {
  Instr in;
  in.kind = static_cast<std::int32_t>(kind);
  in.axis = static_cast<std::int32_t>(axis);
  in.node = node;
  in.buffers_at = static_cast<std::int32_t>(operand_buffers.size());
  in.buffers_count = static_cast<std::int32_t>(buffers_in.size());
  operand_buffers.insert(operand_buffers.end(), buffers_in.begin(), buffers_in.end());
  in.dims_at = static_cast<std::int32_t>(operand_dims.size());
  in.dims_count = static_cast<std::int32_t>(dims.size());
  operand_dims.insert(operand_dims.end(), dims.begin(), dims.end());
  in.attrs_at = static_cast<std::int32_t>(operand_attrs.size());
  in.attrs_count = static_cast<std::int32_t>(attrs.size());
  operand_attrs.insert(operand_attrs.end(), attrs.begin(), attrs.end());
  in.specs_at = static_cast<std::int32_t>(spec_offsets.size()) - 1;
  in.specs_count = static_cast<std::int32_t>(specs.size());
  for (const PartitionSpec& spec : specs) {
    for (const DimSharding& d : spec.dims) {
      spec_dims.push_back(static_cast<std::int32_t>(d.axis));
      spec_dims.push_back(d.groups);
    }
    spec_offsets.push_back(static_cast<std::int32_t>(spec_dims.size() / 2));
  }
  instrs.push_back(in);
}

namespace {
constexpr std::size_t kBufferFields = 11;
}

int Executable::add_buffer(BufferInfo info, std::string_view name) {
  info.name_at = static_cast<std::int32_t>(buffer_names.size());
  info.name_size = static_cast<std::int32_t>(name.size());
  buffer_names += name;
  buffers.push_back(info);
  return static_cast<int>(buffers.size()) - 1;
}

std::vector<std::int64_t> Executable::flatten_buffers() const {
  std::vector<std::int64_t> fields;
  fields.reserve(buffers.size() * kBufferFields);
  for (const BufferInfo& b : buffers) {
    fields.insert(fields.end(), {b.name_at, b.name_size, static_cast<std::int64_t>(b.category), b.persistent ? 1 : 0,
                                 b.tensor, b.int32 ? 1 : 0, b.micro_slice, b.numel, b.offset, b.first_use, b.last_use});
  }
  return fields;
}

void Executable::unflatten_buffers(const std::vector<std::int64_t>& fields) {
  if (fields.size() % kBufferFields != 0) throw std::runtime_error("executable: truncated buffer table");
  buffers.resize(fields.size() / kBufferFields);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const std::int64_t* f = fields.data() + i * kBufferFields;
    if (f[0] < 0 || f[1] < 0 || static_cast<std::size_t>(f[0] + f[1]) > buffer_names.size() || f[2] < 0 ||
        f[2] >= kMemoryCategories) {
      throw std::runtime_error("executable: bad buffer entry");
    }
    BufferInfo& b = buffers[i];
    b.name_at = static_cast<std::int32_t>(f[0]);
    b.name_size = static_cast<std::int32_t>(f[1]);
    b.category = static_cast<MemoryCategory>(f[2]);
    b.persistent = f[3] != 0;
    b.tensor = static_cast<TensorId>(f[4]);
    b.int32 = f[5] != 0;
    b.micro_slice = static_cast<std::int32_t>(f[6]);
    b.numel = f[7];
    b.offset = f[8];
    b.first_use = static_cast<std::int32_t>(f[9]);
    b.last_use = static_cast<std::int32_t>(f[10]);
  }
}

bool Executable::well_formed() const {
  if (spec_offsets.empty() || spec_offsets.front() != 0 || spec_dims.size() % 2 != 0 ||
      static_cast<std::size_t>(spec_offsets.back()) * 2 != spec_dims.size() || peak_bytes.size() != kMemoryCategories ||
      slab_numel < 0 || scratch_numel < 0 || micro_batches < 1) {
    return false;
  }
  for (std::size_t i = 1; i < spec_offsets.size(); ++i) {
    if (spec_offsets[i] < spec_offsets[i - 1]) return false;
  }
  for (std::size_t i = 0; i < spec_dims.size(); i += 2) {
    if (spec_dims[i] < 0 || spec_dims[i] > 2 || spec_dims[i + 1] < 1) return false;  // axis, groups >= 1
  }
  for (const BufferInfo& b : buffers) {
    if (b.numel < 0) return false;
    // Only inputs (persistent int32 token blocks) are read a micro-batch at a time.
    if (b.micro_slice != kWholeBuffer &&
        (!b.persistent || !b.int32 || b.micro_slice < kRunMicroBatch || b.micro_slice >= micro_batches)) {
      return false;
    }
    if (!b.persistent && b.first_use >= 0 && (b.offset < 0 || b.offset > slab_numel || b.numel > slab_numel - b.offset)) {
      return false;
    }
  }
  for (std::size_t index = 0; index < instrs.size(); ++index) {
    const Instr& in = instrs[index];
    if (!known_instruction(in.kind) || in.axis < 0 || in.axis > 2) return false;
    if (!in_range(in.buffers_at, in.buffers_count, operand_buffers) || !in_range(in.dims_at, in.dims_count, operand_dims) ||
        !in_range(in.attrs_at, in.attrs_count, operand_attrs) || in.specs_at < 0 || in.specs_count < 0 ||
        static_cast<std::size_t>(in.specs_at) + static_cast<std::size_t>(in.specs_count) + 1 > spec_offsets.size()) {
      return false;
    }
    const InstrSchema& schema = instruction(in.op()).schema;
    const int tensors = in.buffers_count - 1;  // GlobalNorm, Clip: the norm, then one buffer per tensor
    auto expected = [&](int count, int per_tensor) { return count == kPerTensor ? per_tensor : count; };
    if ((schema.buffers != kPerTensor && in.buffers_count != schema.buffers) || in.buffers_count < 1 ||
        in.attrs_count != schema.attrs || in.specs_count != expected(schema.specs, tensors)) {
      return false;
    }
    if (schema.dims == kPerTensor && !in.has_global_shape()) {
      if (in.dims_count != tensors) return false;
    } else if (schema.dims == kPerTensor) {  // a global shape, as long as the block's spec (a traced scalar: none)
      if ((in.dims_count < 1 && in.op() != InstrKind::Trace) || spec_offsets[static_cast<std::size_t>(in.specs_at) + 1] -
                                       spec_offsets[static_cast<std::size_t>(in.specs_at)] != in.dims_count) {
        return false;
      }
    } else if (in.dims_count != schema.dims) {
      return false;
    }
    for (std::int64_t d : dims_of(in)) {
      if (d < 0) return false;
    }
    const std::span<const std::int32_t> operands = buffers_of(in);
    for (std::size_t k = 0; k < operands.size(); ++k) {
      const std::int32_t b = operands[k];
      if (b == -1 && static_cast<int>(k) == schema.nullable) continue;
      if (b < 0 || b >= static_cast<std::int32_t>(buffers.size())) return false;
      const BufferInfo& info = buffers[static_cast<std::size_t>(b)];
      // A transient buffer is live wherever it is used; an elementwise op stays inside it.
      if (!info.persistent && (info.first_use > static_cast<std::int32_t>(index) ||
                               info.last_use < static_cast<std::int32_t>(index))) {
        return false;
      }
      if (schema.elementwise && dims_of(in)[0] > info.numel) return false;
    }
    if (in.op() == InstrKind::Trace) {  // the block the executor copies out lies inside the buffer
      const std::vector<std::int64_t> shape(dims_of(in).begin(), dims_of(in).end());
      if (local_numel(shape, spec_of(in, 0), mesh()) > buffers[static_cast<std::size_t>(operands[0])].numel) return false;
    }
  }
  return true;
}

}  // namespace harness::tpu
