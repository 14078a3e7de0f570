// Note [Safetensors layout]: every field checked, every error naming the file
// and the field.
#include "csrc/safetensors/header.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "csrc/base/check.h"
#include "tests/csrc/files/temp_file.h"

namespace pins::safetensors {
namespace {

// A file's bytes: the 8-byte length of `json`, `json`, then `data` bytes.
std::string file_bytes(const std::string& json, uint64_t data, uint64_t claimed_length = UINT64_MAX) {
  const uint64_t n = claimed_length == UINT64_MAX ? json.size() : claimed_length;
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return b + json + std::string(data, '\x5a');
}

Header parse(const std::string& bytes) { return parse_header(bytes, bytes.size(), "m.safetensors"); }

// The message of the ValueError parsing `bytes` throws ("" if none).
std::string error_of(const std::string& bytes, uint64_t file_size = UINT64_MAX) {
  try {
    parse_header(bytes, file_size == UINT64_MAX ? bytes.size() : file_size, "m.safetensors");
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsHeader, ParsesEveryFieldOfAGoodFile) {
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2,3],"data_offsets":[16,28]},)"
      R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"e":{"dtype":"I64","shape":[0,5],"data_offsets":[28,28]},)"
      R"("q":{"dtype":"F4","shape":[4],"data_offsets":[28,30]}})";
  const Header h = parse(file_bytes(json, 30));
  EXPECT_EQ(h.data_start, 8 + json.size());
  ASSERT_EQ(h.tensors.size(), 4u);
  // In the order of their bytes.
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[0].dtype, Dtype::F32);
  EXPECT_EQ(h.tensors[0].shape, (std::vector<uint64_t>{4}));
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[1].begin, 16u);
  EXPECT_EQ(h.tensors[1].end, 28u);
  EXPECT_EQ(h.tensors[2].name, "e");
  EXPECT_EQ(h.tensors[2].nbytes(), 0u);
  EXPECT_EQ(h.tensors[3].name, "q");  // 4 elements of 4 bits: 2 bytes
  EXPECT_EQ(h.tensors[3].nbytes(), 2u);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_STREQ(to_string(Dtype::BF16), "BF16");
  EXPECT_EQ(bits(Dtype::F8_E4M3), 8);
}

TEST(SafetensorsHeader, AnEmptyFileOfTensorsIsFine) {
  EXPECT_TRUE(parse(file_bytes("{}", 0)).tensors.empty());
}

TEST(SafetensorsHeader, EveryMalformedFieldIsNamed) {
  const auto t = [](const std::string& fields) { return R"({"w":{)" + fields + "}}"; };
  const std::string ok = R"("dtype":"F16","shape":[2],)";
  struct Case {
    std::string bytes;
    std::string says;
  };
  const std::vector<Case> cases = {
      {std::string("\x05\x00\x00", 3), "shorter than the 8-byte header length"},
      {file_bytes("{}", 0, 1000), "header length 1000 runs past the end of the file"},
      {file_bytes("{}", 0, uint64_t{1} << 62), "exceeds the format's limit"},
      {file_bytes("{\"w\": [", 0), "header: not valid JSON"},
      {file_bytes("[1, 2]", 0), "header: expected a JSON object, got [1,2]"},
      {file_bytes(R"({"w": 3})", 0), "tensor \"w\": expected an object"},
      {file_bytes(t(R"("dtype":"F16","shape":[2])"), 4), "expected the fields dtype, shape and data_offsets"},
      {file_bytes(t(ok + R"("data_offsets":[0,4],"x":1)"), 4), "tensor \"w\": unknown field \"x\""},
      {file_bytes(t(R"("dtype":"F17","shape":[2],"data_offsets":[0,4])"), 4), "dtype: unknown dtype \"F17\""},
      {file_bytes(t(R"("dtype":7,"shape":[2],"data_offsets":[0,4])"), 4), "dtype: expected a string"},
      {file_bytes(t(R"("dtype":"F16","shape":[-2],"data_offsets":[0,4])"), 4), "shape: expected a non-negative integer"},
      {file_bytes(t(R"("dtype":"F16","shape":[2.5],"data_offsets":[0,4])"), 4), "shape: expected a non-negative integer"},
      {file_bytes(t(R"("dtype":"F16","shape":"2","data_offsets":[0,4])"), 4), "shape: expected an array"},
      {file_bytes(t(R"("dtype":"F16","shape":[4294967296,4294967296],"data_offsets":[0,4])"), 4),
       "the element count overflows 64 bits"},
      {file_bytes(t(R"("dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,4])"), 4),
       "the size in bits overflows 64 bits"},
      {file_bytes(t(R"("dtype":"F4","shape":[3],"data_offsets":[0,2])"), 2), "do not fill whole bytes"},
      {file_bytes(t(ok + R"("data_offsets":[0,6])"), 6), "hold 6 bytes, but shape [2] of F16 needs 4"},
      {file_bytes(t(ok + R"("data_offsets":[4,0])"), 4), "data_offsets [4, 0]: end before begin"},
      {file_bytes(t(ok + R"("data_offsets":[0,4])"), 3), "past the end of the data section (3 bytes)"},
      {file_bytes(t(ok + R"("data_offsets":[18446744073709551612,18446744073709551616])"), 4),
       "data_offsets: expected a non-negative integer"},
      {file_bytes(t(ok + R"("data_offsets":[0])"), 4), "data_offsets: expected [begin, end]"},
      {file_bytes(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
                  5),
       "overlap tensor \"a\" [0, 4]"},
      {file_bytes(R"({"__metadata__":{"k":1}})", 0), "__metadata__ \"k\": expected a string"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    const std::string msg = error_of(c.bytes);
    EXPECT_NE(msg.find("m.safetensors: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
  }
}

// A value nested `depth` arrays deep: the quoting of it in an error must not
// recurse as deep (it stops at the characters it shows).
std::string nested(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(SafetensorsHeader, ADeeplyNestedValueIsAnErrorNotAStackOverflow) {
  const size_t depth = 100000;  // a 200 KB header
  struct Case {
    std::string json;
    std::string says;
  };
  const std::vector<Case> cases = {
      {R"({"w":)" + nested(depth) + "}", "tensor \"w\": expected an object with dtype, shape and data_offsets, got [[[["},
      {R"({"w":{"dtype":"F16","shape":)" + nested(depth) + R"(,"data_offsets":[0,0]}})",
       "shape: expected a non-negative integer, got [[[["},
      {R"({"__metadata__":)" + nested(depth) + "}", "__metadata__: expected an object of strings, got [[[["},
      {R"({"__metadata__":{"k":)" + nested(depth) + "}}", "__metadata__ \"k\": expected a string, got [[[["},
      {nested(depth), "header: expected a JSON object, got [[[["},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    const std::string msg = error_of(file_bytes(c.json, 0));
    EXPECT_NE(msg.find(c.says), std::string::npos) << msg.substr(0, 300);
    EXPECT_LT(msg.size(), 400u) << "an error quotes at most 80 characters of the header";
  }
}

TEST(SafetensorsHeader, AHeaderThatIsNotUtf8IsNamedAtItsByte) {
  // Bytes a text decoder refuses: the error says where, and is itself printable.
  const std::vector<std::string> bad = {"\xff", "\xc0\xaf", "\xe0\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                        "\xc3", "\xe2\x82"};
  for (const std::string& b : bad) {
    const std::string json = R"({"w)" + b + R"(":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
    const std::string msg = error_of(file_bytes(json, 1));
    EXPECT_NE(msg.find("header: not UTF-8 at byte 3 of the header"), std::string::npos) << msg;
    for (const char c : msg) EXPECT_LT(static_cast<unsigned char>(c), 0x80) << msg;
  }
  // Well-formed multi-byte names are fine, and so quoted.
  const std::string ok = R"({"é€😀":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_EQ(parse(file_bytes(ok, 1)).tensors.at(0).name, "é€😀");
  const std::string msg = error_of(file_bytes(R"({"é€😀":{"dtype":"U9","shape":[1],"data_offsets":[0,1]}})", 1));
  EXPECT_NE(msg.find("tensor \"é€😀\": dtype: unknown dtype \"U9\""), std::string::npos) << msg;
}

TEST(SafetensorsHeader, AcceptsWhatSafetensorsReaderAcceptsAndRefusesWhatItRefuses) {
  // "__metadata__": null is no metadata.
  const Header h = parse(file_bytes(R"({"__metadata__":null,"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", 2));
  EXPECT_TRUE(h.metadata.empty());
  EXPECT_EQ(h.tensors.size(), 1u);
  // An empty tensor of a shape whose strides would overflow: its bytes are none.
  const Header e = parse(file_bytes(R"({"e":{"dtype":"F32","shape":[0,4294967296,4294967296,4294967296],)"
                                    R"("data_offsets":[0,0]}})",
                                    0));
  EXPECT_EQ(e.tensors.at(0).nbytes(), 0u);
  // The tensors tile the data section: no gap before, between or after them.
  struct Case {
    std::string json;
    uint64_t data;
    std::string says;
  };
  const std::vector<Case> cases = {
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})", 12,
       "tensor \"b\": data_offsets [8, 12] leave a gap of 4 bytes after tensor \"a\" [0, 4]"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6,
       "tensor \"a\": data_offsets [2, 6] leave the data section's first 2 bytes to no tensor"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 12, "holds 8 bytes past the last tensor's end"},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})", 4,
       "tensor \"e\": data_offsets [2, 2] overlap tensor \"a\" [0, 4]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.says);
    const std::string msg = error_of(file_bytes(c.json, c.data));
    EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
  }
}

TEST(SafetensorsHeader, AQuotedNameIsCutShort) {
  const std::string name(100000, 'n');
  const std::string msg =
      error_of(file_bytes(R"({")" + name + R"(":{"dtype":"U9","shape":[1],"data_offsets":[0,1]}})", 1));
  EXPECT_NE(msg.find("dtype: unknown dtype \"U9\""), std::string::npos) << msg.substr(0, 300);
  EXPECT_LT(msg.size(), 300u) << msg.substr(0, 300);
}

TEST(SafetensorsHeader, AHeaderNotAllReadIsTruncatedNotReadPastItsEnd) {
  const std::string whole = file_bytes("{}", 10);
  // The caller read only 9 bytes of a file that holds them all.
  EXPECT_NE(error_of(whole.substr(0, 9), whole.size()).find("truncated"), std::string::npos);
}

TEST(SafetensorsHeader, ReadHeaderReadsOnlyTheHeaderAndNamesThePath) {
  const pins::testing::TempFile file(0, 0, "pins_header_test");
  const std::string& path = file.path;
  const std::string json = R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}})";
  file.write(file_bytes(json, 6));
  const Header h = read_header(path);
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].dtype, Dtype::BF16);
  EXPECT_EQ(h.file_size, 8 + json.size() + 6);
  file.write(file_bytes(json, 0, 1u << 20));  // length past the end
  try {
    read_header(path);
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": header length 1048576 runs past the end"),
              std::string::npos)
        << e.what();
  }
  std::remove(path.c_str());
  EXPECT_THROW(read_header(path), ResourceError);
}

}  // namespace
}  // namespace pins::safetensors
