// SVG drawn by hand, for ./train's curves.svg and ./translate's attention maps. A program that does not
// load the font cannot measure its text, so text is placed from an upper bound of its extent:
//   width  <= characters x font size x kEm (kEmBold for bold). Measured in DejaVu Sans, the usual
//             sans-serif of Linux renderers: the widest ASCII glyph is '@', 1.0 em; in DejaVu Sans Bold
//             'W', 1.1 em (lowercase letters average 0.56 and 0.64 em).
//   height:   kAscent above the baseline, kDescent below it (DejaVu: 0.93 and 0.24 em).
// test/svg_check.py holds every drawing to these bounds: text inside the canvas, no two texts overlapping.
#pragma once
#include <cstdio>
#include <string>

constexpr double kEm = 1.0, kEmBold = 1.1, kAscent = 1.0, kDescent = 0.25;

inline int utf8_characters(const std::string& s) {
  int n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;  // count every byte that starts a character
  return n;
}

inline double svg_text_width(const std::string& s, double font_size, bool bold = false) {
  return utf8_characters(s) * font_size * (bold ? kEmBold : kEm);
}

inline std::string svg_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

inline std::string svg_number(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", x);
  return b;
}

// <text> with its baseline at (x, y); anchor "start", "middle" or "end"; vertical: turned 90 degrees
// counter-clockwise about (x, y), so that it reads upwards from there.
inline std::string svg_text(double x, double y, double font_size, const std::string& s, const char* anchor = "start",
                            bool bold = false, bool vertical = false, const std::string& fill = "") {
  std::string o = "<text x=\"" + svg_number(x) + "\" y=\"" + svg_number(y) + "\" font-size=\"" + svg_number(font_size) +
                  "\" text-anchor=\"" + anchor + "\"";
  if (bold) o += " font-weight=\"bold\"";
  if (vertical) o += " transform=\"rotate(-90 " + svg_number(x) + " " + svg_number(y) + ")\"";
  if (!fill.empty()) o += " fill=\"" + fill + "\"";
  return o + ">" + svg_escape(s) + "</text>\n";
}
