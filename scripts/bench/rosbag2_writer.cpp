// The real rosbag2 writer for scripts/bench-rosbag2.sh: rosbag2_cpp::Writer (SequentialWriter,
// sqlite3 storage plugin, rosbag2's default storage preset, message cache on) writes COUNT
// serialized std_msgs/msg/String messages of MESSAGE_BYTES bytes each on one topic, as fast as
// it takes them. Only the write loop and the writer's close are timed: close is where the cache
// consumer drains what is still queued, so the figure covers every message reaching SQLite.
//
// usage: rosbag2_writer OUT_DIR MESSAGE_BYTES COUNT [--cache BYTES] [--fresh]
//   OUT_DIR must not exist (rosbag2 refuses an existing bag directory).
//   --cache: max_cache_size in bytes. The default holds the whole run (COUNT * MESSAGE_BYTES
//   plus 1 MiB, at least the 100 MiB `ros2 bag record` uses): rosbag2's cache drops messages
//   once its producer buffer is full, and a benchmark that drops messages measures less work.
//   The calling script checks the row count of the bag to prove nothing was dropped.
//   --fresh: a newly allocated and filled payload per message, inside the timed loop, as a
//   recorder's subscription hands rosbag2 a new buffer per message. Off by default: that cost
//   belongs to the source, and ringbag's synthetic source reuses its buffers.
// Prints one JSON line:
//   {"messages":N,"payload_bytes":..,"seconds":..,"cpu_seconds":..,"cache_bytes":..,"fresh":..}
// where cpu_seconds is user+sys of the whole process (all threads) over the timed part.
//
// Builds against Humble (0.15) and Jazzy (0.26): the two differ in the message's stamp fields,
// which set_stamp() picks at compile time.

#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "rcutils/allocator.h"
#include "rcutils/types/uint8_array.h"
#include "rosbag2_cpp/converter_options.hpp"
#include "rosbag2_cpp/writer.hpp"
#include "rosbag2_storage/serialized_bag_message.hpp"
#include "rosbag2_storage/storage_options.hpp"
#include "rosbag2_storage/topic_metadata.hpp"

namespace
{

// Humble's message has `time_stamp`; from Iron on it has `recv_timestamp` and `send_timestamp`.
template<typename M, typename = void>
struct has_recv_timestamp : std::false_type {};
template<typename M>
struct has_recv_timestamp<M, std::void_t<decltype(std::declval<M &>().recv_timestamp)>>
  : std::true_type {};

template<typename M>
void set_stamp(M & msg, rcutils_time_point_value_t t)
{
  if constexpr (has_recv_timestamp<M>::value) {
    msg.recv_timestamp = t;
    msg.send_timestamp = t;
  } else {
    msg.time_stamp = t;
  }
}

bool parse_u64(const char * s, uint64_t & out)
{
  char * end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || s[0] == '-') {
    return false;
  }
  out = v;
  return true;
}

double cpu_seconds()
{
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

int usage()
{
  std::fprintf(
    stderr, "usage: rosbag2_writer OUT_DIR MESSAGE_BYTES COUNT [--cache BYTES] [--fresh]\n");
  return 2;
}

// A valid CDR std_msgs/msg/String of exactly `size` bytes: the 4-byte encapsulation header
// (little endian CDR), the uint32 string length counting its NUL, the characters, the NUL.
std::shared_ptr<rcutils_uint8_array_t> make_payload(size_t size)
{
  auto * raw = new rcutils_uint8_array_t(rcutils_get_zero_initialized_uint8_array());
  rcutils_allocator_t alloc = rcutils_get_default_allocator();
  if (rcutils_uint8_array_init(raw, size, &alloc) != RCUTILS_RET_OK) {
    delete raw;
    return nullptr;
  }
  std::shared_ptr<rcutils_uint8_array_t> array(
    raw, [](rcutils_uint8_array_t * a) {
      // fini fails only on an invalid allocator; this one is the default, so nothing to do.
      const rcutils_ret_t ret = rcutils_uint8_array_fini(a);
      (void)ret;
      delete a;
    });
  uint8_t * b = array->buffer;
  const uint32_t len = static_cast<uint32_t>(size - 8);  // characters + NUL
  const uint8_t header[4] = {0x00, 0x01, 0x00, 0x00};
  std::memcpy(b, header, 4);
  std::memcpy(b + 4, &len, 4);  // the hosts this runs on are little endian, as the header says
  std::memset(b + 8, 'x', len - 1);
  b[size - 1] = '\0';
  array->buffer_length = size;
  return array;
}

}  // namespace

int main(int argc, char ** argv)
{
  if (argc < 4) {
    return usage();
  }
  const std::string out_dir = argv[1];
  uint64_t size = 0, count = 0;
  if (!parse_u64(argv[2], size) || !parse_u64(argv[3], count)) {
    return usage();
  }
  // 8 bytes of header and length, at least one character and the NUL.
  if (size < 10) {
    std::fprintf(stderr, "rosbag2_writer: MESSAGE_BYTES must be at least 10, got %llu\n",
      static_cast<unsigned long long>(size));
    return 2;
  }
  if (count > (UINT64_MAX - (1u << 20)) / size) {
    std::fprintf(stderr, "rosbag2_writer: COUNT * MESSAGE_BYTES overflows 64 bits\n");
    return 2;
  }
  uint64_t cache = count * size + (1u << 20);
  if (cache < 100ull * 1024 * 1024) {
    cache = 100ull * 1024 * 1024;
  }
  bool fresh = false;
  for (int i = 4; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cache") == 0 && i + 1 < argc && parse_u64(argv[i + 1], cache)) {
      ++i;
    } else if (std::strcmp(argv[i], "--fresh") == 0) {
      fresh = true;
    } else {
      return usage();
    }
  }

  // By default one payload shared by every message: the cache keeps shared pointers and
  // SQLite copies out of it, so nothing writes into it after this (see --fresh).
  auto payload = make_payload(size);
  if (!payload) {
    std::fprintf(stderr, "rosbag2_writer: cannot allocate %llu bytes\n",
      static_cast<unsigned long long>(size));
    return 1;
  }

  try {
    rosbag2_storage::StorageOptions storage;
    storage.uri = out_dir;
    storage.storage_id = "sqlite3";
    storage.max_cache_size = cache;
    rosbag2_cpp::ConverterOptions converter;
    converter.input_serialization_format = "cdr";
    converter.output_serialization_format = "cdr";

    rosbag2_cpp::Writer writer;
    writer.open(storage, converter);
    rosbag2_storage::TopicMetadata topic;
    topic.name = "/bench";
    topic.type = "std_msgs/msg/String";
    topic.serialization_format = "cdr";
    writer.create_topic(topic);

    rcutils_time_point_value_t stamp = 1700000000000000000LL;
    const double cpu0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < count; ++i) {
      // A new message per write, as rosbag2's recorder makes one per received message.
      auto msg = std::make_shared<rosbag2_storage::SerializedBagMessage>();
      if (fresh) {
        msg->serialized_data = make_payload(size);
        if (!msg->serialized_data) {
          std::fprintf(stderr, "rosbag2_writer: cannot allocate %llu bytes\n",
            static_cast<unsigned long long>(size));
          return 1;
        }
      } else {
        msg->serialized_data = payload;
      }
      msg->topic_name = topic.name;
      set_stamp(*msg, stamp);
      stamp += 1000;
      writer.write(msg);
    }
    writer.close();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - t0;
    const double cpu = cpu_seconds() - cpu0;

    std::printf(
      "{\"messages\":%llu,\"payload_bytes\":%llu,\"seconds\":%.6f,\"cpu_seconds\":%.6f,"
      "\"cache_bytes\":%llu,\"fresh\":%s}\n",
      static_cast<unsigned long long>(count), static_cast<unsigned long long>(count * size),
      elapsed.count(), cpu, static_cast<unsigned long long>(cache), fresh ? "true" : "false");
  } catch (const std::exception & e) {
    std::fprintf(stderr, "rosbag2_writer: %s: %s\n", out_dir.c_str(), e.what());
    return 1;
  }
  return 0;
}
