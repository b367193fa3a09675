#pragma once
// The protobuf wire format, as much of it as our hand-encoded messages need (TensorBoard's `tensorflow.Event`,
// W&B's `wandb_internal.Record`): varints, tags, little-endian fixed-width numbers and length-delimited fields.
// Written by hand so that the loggers that produce these files carry no protobuf dependency. Torch-free.
#include <cstdint>
#include <string>
#include <string_view>

namespace hpctrain::detail {

inline void put_varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}
/// Wire types: 0 varint, 1 fixed 64-bit, 2 length-delimited, 5 fixed 32-bit.
inline void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, (static_cast<std::uint64_t>(field) << 3) | static_cast<std::uint64_t>(wire_type));
}
template <class T>
void put_fixed(std::string& out, T value) {  // little-endian, as the wire format and x86/ARM hosts have it
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}
inline void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}
/// A varint field (int32, int64, bool, enum); negative numbers take ten bytes, as protobuf writes an int32 or int64.
inline void put_varint_field(std::string& out, int field, std::int64_t value) {
  put_tag(out, field, 0);
  put_varint(out, static_cast<std::uint64_t>(value));
}

}  // namespace hpctrain::detail
