#include "profiling/sim/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "profiling/sim/png.h"

namespace pins::sim {

namespace {

Rgb color_of(const std::string& policy) {
  if (policy == "lru") return {214, 39, 40};
  if (policy == "mru") return {31, 119, 180};
  if (policy == "trace") return {44, 160, 44};
  if (policy == "oracle") return {148, 103, 189};
  return {127, 127, 127};
}

double nice_step(double max, int ticks) {
  const double raw = max / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= raw) return m * p;
  return 10 * p;
}

}  // namespace

void plot_png(const std::string& path, const Trace& t, const std::vector<SequenceResult>& results) {
  constexpr int kWidth = 1000, kPanel = 330, kLeft = 80, kRight = 20, kTop = 56, kPlot = 230;
  const Rgb white{255, 255, 255}, black{0, 0, 0}, grey{150, 150, 150}, light{228, 228, 228};
  Canvas c(kWidth, kPanel * static_cast<int>(results.size()) + 10, white);
  const double g = static_cast<double>(1ull << 30);
  for (size_t k = 0; k < results.size(); ++k) {
    const SequenceResult& r = results[k];
    const int y0 = static_cast<int>(k) * kPanel;
    c.text(10, y0 + 8, t.name + " - " + r.sequence->name + " (disk GiB per run)", black, 2);
    int lx = 10;
    for (const PolicyResult& p : r.policies) {
      c.rect(lx, y0 + 32, 14, 14, color_of(p.policy));
      c.text(lx + 20, y0 + 32, p.policy, black, 2);
      lx += 40 + Canvas::text_width(p.policy);
    }
    c.hline(lx, lx + 24, y0 + 39, black, 3);
    c.text(lx + 30, y0 + 32, "lower bound", black, 2);
    lx += 60 + Canvas::text_width("lower bound");
    c.hline(lx, lx + 24, y0 + 39, grey, 1, 4);
    c.text(lx + 30, y0 + 32, "W", black, 2);

    const size_t n = r.expansion.runs.size();
    double top = 1;
    for (const RunPlan& plan : r.expansion.runs) top = std::max(top, plan.bound.used / g);
    for (const PolicyResult& p : r.policies)
      for (const RunResult& rr : p.runs) top = std::max(top, rr.disk_bytes / g);
    const double step = nice_step(top, 5);
    top = std::ceil(top / step) * step;
    const int base = y0 + kTop + kPlot;
    const auto y_of = [&](double v) { return base - static_cast<int>(std::lround(v / top * kPlot)); };
    for (double v = 0; v <= top + 1e-9; v += step) {
      c.hline(kLeft, kWidth - kRight, y_of(v), v == 0 ? black : light);
      char buf[32];
      std::snprintf(buf, sizeof buf, step < 1 ? "%.1f" : "%.0f", v);
      c.text(kLeft - 8 - Canvas::text_width(buf), y_of(v) - 7, buf, black, 2);
    }
    c.vline(kLeft, y0 + kTop, base, black);
    const double group = static_cast<double>(kWidth - kLeft - kRight) / std::max<size_t>(n, 1);
    const int bars = std::max<int>(1, static_cast<int>(r.policies.size()));
    const int bar = std::max(2, static_cast<int>(group * 0.8 / bars));
    for (size_t i = 0; i < n; ++i) {
      const int gx = kLeft + static_cast<int>(i * group + group * 0.1);
      for (int b = 0; b < static_cast<int>(r.policies.size()); ++b) {
        const RunResult& rr = r.policies[b].runs[i];
        const int y = y_of(rr.disk_bytes / g);
        c.rect(gx + b * bar, y, bar - 1, base - y, color_of(r.policies[b].policy));
      }
      const int gw = bar * bars;
      c.hline(gx - 2, gx + gw + 1, y_of(r.expansion.runs[i].bound.used / g), grey, 1, 4);
      c.hline(gx - 2, gx + gw + 1, y_of(r.expansion.runs[i].bound.lower_bound / g), black, 3);
      const std::string label = std::to_string(i + 1);
      c.text(gx + gw / 2 - Canvas::text_width(label) / 2, base + 8, label, black, 2);
    }
    c.text(kWidth / 2 - Canvas::text_width("run") / 2, base + 28, "run", black, 2);
  }
  c.save(path);
}

}  // namespace pins::sim
