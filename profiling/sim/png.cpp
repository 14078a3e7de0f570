#include "profiling/sim/png.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>

namespace pins::sim {

namespace {

// 5x7 glyphs, one string per row, '#' for a dot.
const std::map<char, std::array<const char*, 7>>& font() {
  static const std::map<char, std::array<const char*, 7>> f = {
      {' ', {".....", ".....", ".....", ".....", ".....", ".....", "....."}},
      {'0', {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."}},
      {'1', {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."}},
      {'2', {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"}},
      {'3', {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."}},
      {'4', {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."}},
      {'5', {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."}},
      {'6', {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."}},
      {'7', {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."}},
      {'8', {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."}},
      {'9', {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."}},
      {'A', {".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
      {'B', {"####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."}},
      {'C', {".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."}},
      {'D', {"###..", "#..#.", "#...#", "#...#", "#...#", "#..#.", "###.."}},
      {'E', {"#####", "#....", "#....", "####.", "#....", "#....", "#####"}},
      {'F', {"#####", "#....", "#....", "####.", "#....", "#....", "#...."}},
      {'G', {".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".####"}},
      {'H', {"#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
      {'I', {".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."}},
      {'J', {"..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."}},
      {'K', {"#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"}},
      {'L', {"#....", "#....", "#....", "#....", "#....", "#....", "#####"}},
      {'M', {"#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"}},
      {'N', {"#...#", "#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#"}},
      {'O', {".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
      {'P', {"####.", "#...#", "#...#", "####.", "#....", "#....", "#...."}},
      {'Q', {".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#"}},
      {'R', {"####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"}},
      {'S', {".####", "#....", "#....", ".###.", "....#", "....#", "####."}},
      {'T', {"#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."}},
      {'U', {"#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
      {'V', {"#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."}},
      {'W', {"#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#."}},
      {'X', {"#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"}},
      {'Y', {"#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."}},
      {'Z', {"#####", "....#", "...#.", "..#..", ".#...", "#....", "#####"}},
      {'.', {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."}},
      {',', {".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."}},
      {':', {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."}},
      {'-', {".....", ".....", ".....", "#####", ".....", ".....", "....."}},
      {'+', {".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."}},
      {'=', {".....", ".....", "#####", ".....", "#####", ".....", "....."}},
      {'/', {".....", "....#", "...#.", "..#..", ".#...", "#....", "....."}},
      {'_', {".....", ".....", ".....", ".....", ".....", ".....", "#####"}},
      {'(', {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."}},
      {')', {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."}},
      {'[', {".###.", ".#...", ".#...", ".#...", ".#...", ".#...", ".###."}},
      {']', {".###.", "...#.", "...#.", "...#.", "...#.", "...#.", ".###."}},
      {'%', {"##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"}},
      {'<', {"...#.", "..#..", ".#...", "#....", ".#...", "..#..", "...#."}},
      {'>', {".#...", "..#..", "...#.", "....#", "...#.", "..#..", ".#..."}},
      {'#', {".#.#.", ".#.#.", "#####", ".#.#.", "#####", ".#.#.", ".#.#."}},
      {'*', {".....", "..#..", "#.#.#", ".###.", "#.#.#", "..#..", "....."}},
      {'?', {".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.."}},
  };
  return f;
}

uint32_t crc32(const std::string& s, size_t from) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = from; i < s.size(); ++i) c = table[(c ^ static_cast<uint8_t>(s[i])) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

void put32(std::string& s, uint32_t v) {
  for (int i = 3; i >= 0; --i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
}

class BitWriter {
 public:
  // Extra bits and header fields: least significant bit first.
  void bits(uint32_t v, int n) {
    for (int i = 0; i < n; ++i) bit((v >> i) & 1);
  }
  // Huffman codes: most significant bit first.
  void code(uint32_t v, int n) {
    for (int i = n - 1; i >= 0; --i) bit((v >> i) & 1);
  }
  std::string finish() {
    if (nbits_) out_ += static_cast<char>(cur_);
    nbits_ = 0;
    cur_ = 0;
    return out_;
  }

 private:
  void bit(uint32_t b) {
    cur_ |= static_cast<uint8_t>(b << nbits_);
    if (++nbits_ == 8) {
      out_ += static_cast<char>(cur_);
      cur_ = 0;
      nbits_ = 0;
    }
  }
  std::string out_;
  uint8_t cur_ = 0;
  int nbits_ = 0;
};

void literal(BitWriter& w, uint32_t v) {
  if (v < 144) w.code(0x30 + v, 8);
  else if (v < 256) w.code(0x190 + (v - 144), 9);
  else if (v < 280) w.code(v - 256, 7);
  else w.code(0xC0 + (v - 280), 8);
}

void match(BitWriter& w, int length, int distance) {
  static const int lbase[] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27,
                              31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
  static const int lextra[] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
  static const int dbase[] = {1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129,
                              193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
  static const int dextra[] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
  int li = 28;
  while (lbase[li] > length) --li;
  literal(w, 257 + li);
  w.bits(length - lbase[li], lextra[li]);
  int di = 29;
  while (dbase[di] > distance) --di;
  w.code(di, 5);
  w.bits(distance - dbase[di], dextra[di]);
}

}  // namespace

std::string zlib_compress(const std::vector<uint8_t>& data, size_t row_bytes) {
  std::string out;
  out += static_cast<char>(0x78);
  out += static_cast<char>(0x01);
  BitWriter w;
  w.bits(1, 1);  // BFINAL
  w.bits(1, 2);  // BTYPE 01: fixed Huffman codes
  const size_t n = data.size();
  size_t i = 0;
  const auto run_at = [&](size_t d) -> int {
    if (d == 0 || d > i || d > 32768) return 0;
    int len = 0;
    while (len < 258 && i + len < n && data[i + len] == data[i + len - d]) ++len;
    return len;
  };
  while (i < n) {
    int best = 0, dist = 0;
    for (size_t d : {size_t{3}, row_bytes}) {
      const int len = run_at(d);
      if (len > best) {
        best = len;
        dist = static_cast<int>(d);
      }
    }
    if (best >= 3) {
      match(w, best, dist);
      i += best;
    } else {
      literal(w, data[i]);
      ++i;
    }
  }
  literal(w, 256);
  out += w.finish();
  uint32_t a = 1, b = 0;
  for (uint8_t x : data) {
    a = (a + x) % 65521;
    b = (b + a) % 65521;
  }
  put32(out, (b << 16) | a);
  return out;
}

Canvas::Canvas(int width, int height, Rgb bg) : w_(width), h_(height), px_(static_cast<size_t>(width) * height * 3) {
  for (size_t i = 0; i < px_.size(); i += 3) {
    px_[i] = bg.r;
    px_[i + 1] = bg.g;
    px_[i + 2] = bg.b;
  }
}

void Canvas::rect(int x, int y, int w, int h, Rgb c) {
  for (int yy = std::max(0, y); yy < std::min(h_, y + h); ++yy)
    for (int xx = std::max(0, x); xx < std::min(w_, x + w); ++xx) {
      uint8_t* p = &px_[(static_cast<size_t>(yy) * w_ + xx) * 3];
      p[0] = c.r;
      p[1] = c.g;
      p[2] = c.b;
    }
}

void Canvas::hline(int x0, int x1, int y, Rgb c, int thickness, int dash) {
  for (int x = x0; x <= x1; ++x)
    if (dash == 0 || ((x - x0) / dash) % 2 == 0) rect(x, y - thickness / 2, 1, thickness, c);
}

void Canvas::vline(int x, int y0, int y1, Rgb c) { rect(x, std::min(y0, y1), 1, std::abs(y1 - y0) + 1, c); }

void Canvas::text(int x, int y, const std::string& s, Rgb c, int scale) {
  const auto& f = font();
  for (size_t k = 0; k < s.size(); ++k) {
    auto it = f.find(static_cast<char>(std::toupper(static_cast<unsigned char>(s[k]))));
    if (it == f.end()) it = f.find('?');
    for (int row = 0; row < 7; ++row)
      for (int col = 0; col < 5; ++col)
        if (it->second[row][col] == '#') rect(x + static_cast<int>(k) * 6 * scale + col * scale, y + row * scale, scale, scale, c);
  }
}

Rgb Canvas::at(int x, int y) const {
  const uint8_t* p = &px_[(static_cast<size_t>(y) * w_ + x) * 3];
  return {p[0], p[1], p[2]};
}

std::string Canvas::png() const {
  std::string out = "\x89PNG\r\n\x1a\n";
  const auto chunk = [&out](const char* type, const std::string& data) {
    put32(out, static_cast<uint32_t>(data.size()));
    const size_t start = out.size();
    out += type;
    out += data;
    put32(out, crc32(out, start));
  };
  std::string ihdr;
  put32(ihdr, static_cast<uint32_t>(w_));
  put32(ihdr, static_cast<uint32_t>(h_));
  ihdr += static_cast<char>(8);  // bit depth
  ihdr += static_cast<char>(2);  // RGB
  ihdr += std::string(3, '\0');  // deflate, adaptive filtering, no interlace
  chunk("IHDR", ihdr);
  const size_t row = 1 + static_cast<size_t>(w_) * 3;
  std::vector<uint8_t> raw;
  raw.reserve(row * h_);
  for (int y = 0; y < h_; ++y) {
    raw.push_back(0);  // filter: none
    raw.insert(raw.end(), px_.begin() + static_cast<size_t>(y) * w_ * 3, px_.begin() + static_cast<size_t>(y + 1) * w_ * 3);
  }
  chunk("IDAT", zlib_compress(raw, row));
  chunk("IEND", "");
  return out;
}

void Canvas::save(const std::string& path) const {
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot write " + path);
  const std::string data = png();
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace pins::sim
