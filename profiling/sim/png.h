// A small RGB canvas that writes PNG files with no library: rectangles, lines,
// a 5x7 bitmap font, and a fixed-Huffman deflate encoder (RFC 1950/1951/2083).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pins::sim {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

class Canvas {
 public:
  Canvas(int width, int height, Rgb background);
  int width() const { return w_; }
  int height() const { return h_; }
  void rect(int x, int y, int w, int h, Rgb c);
  void hline(int x0, int x1, int y, Rgb c, int thickness = 1, int dash = 0);
  void vline(int x, int y0, int y1, Rgb c);
  // Text in the 5x7 font (lowercase is drawn as uppercase), `scale` pixels per dot.
  void text(int x, int y, const std::string& s, Rgb c, int scale = 2);
  static int text_width(const std::string& s, int scale = 2) { return static_cast<int>(s.size()) * 6 * scale; }
  Rgb at(int x, int y) const;
  std::string png() const;
  void save(const std::string& path) const;  // throws std::runtime_error naming the path

 private:
  int w_, h_;
  std::vector<uint8_t> px_;  // RGB rows
};

// zlib stream of `data` (fixed Huffman codes, matches at distance 3 and one row up).
std::string zlib_compress(const std::vector<uint8_t>& data, size_t row_bytes);

}  // namespace pins::sim
