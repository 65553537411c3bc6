// Plain SVG charts for `mlakv eval` and `mlakv calibrate` (no plotting dependency: the
// charts are a few rectangles, lines and labels).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "mlakv/eval.h"

namespace mlakv {
namespace {

const char* kColors[] = {"#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#bbbbbb", "#000000"};

std::string esc(std::string_view s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else if (static_cast<unsigned char>(c) >= 0x20 || c == '\t') o += c;
  }
  return o;
}

// Log10 axis over [lo, hi] (both > 0) mapped to [y1, y0] (pixels, top = y0).
struct LogAxis {
  double lo, hi, y0, y1;
  double at(double v) const {
    const double t = (std::log10(std::max(v, lo)) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    return y1 - t * (y1 - y0);
  }
};

LogAxis log_axis(double mn, double mx, double y0, double y1) {
  if (!(mn > 0)) mn = 1e-6;
  if (!(mx > mn)) mx = mn * 10;
  return {std::pow(10.0, std::floor(std::log10(mn))), std::pow(10.0, std::ceil(std::log10(mx))), y0, y1};
}

void axis_ticks(std::string& s, const LogAxis& a, double x0, double x1) {
  for (double v = a.lo; v <= a.hi * 1.0001; v *= 10) {
    const double y = a.at(v);
    s += fmt::format("<line x1='{:.1f}' y1='{:.1f}' x2='{:.1f}' y2='{:.1f}' stroke='#dddddd'/>\n", x0, y, x1, y);
    s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='10' text-anchor='end'>{:g}</text>\n", x0 - 4, y + 3, v);
  }
}

std::string row_label(const EvalRow& r) {
  const std::string recipe = r.spec.recipe == "none" || r.spec.recipe.empty() ? "" : " " + r.spec.recipe;
  return std::string(format_name(r.spec.format)) + recipe +
         (r.spec.scales_label == "none" ? "" : " +" + r.spec.scales_label);
}

}  // namespace

std::string eval_plot_svg(const EvalReport& rep, std::string_view title) {
  const double W = 900, Hh = 400;
  std::string s = fmt::format("<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif'>\n"
                              "<rect width='100%' height='100%' fill='white'/>\n"
                              "<text x='{}' y='20' font-size='14' text-anchor='middle'>{}</text>\n",
                              W, Hh, W / 2, esc(title));
  double mn = 1e300, mx = 0;
  for (const EvalRow& r : rep.rows) {
    const double k = r.kld.kld_mean();
    if (k > 0) mn = std::min(mn, k), mx = std::max(mx, k);
    for (double b : r.kld.kld_by_bucket()) {
      if (b > 0 && std::isfinite(b)) mn = std::min(mn, b), mx = std::max(mx, b);
    }
  }
  const LogAxis ax = log_axis(mn, mx, 50, 320);
  // Left panel: mean KLD per row.
  s += "<text x='230' y='40' font-size='12' text-anchor='middle'>mean KLD vs float32 cache (nats / position)</text>\n";
  axis_ticks(s, ax, 60, 420);
  const double bw = 340.0 / std::max<std::size_t>(rep.rows.size(), 1);
  for (std::size_t i = 0; i < rep.rows.size(); ++i) {
    const double k = rep.rows[i].kld.kld_mean();
    const double x = 65 + i * bw, y = k > 0 ? ax.at(k) : ax.y1;
    s += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='{:.1f}' fill='{}'/>\n", x, y, bw * 0.8,
                     ax.y1 - y, kColors[i % 8]);
    s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='9' text-anchor='end' transform='rotate(-35 {:.1f} {:.1f})'>{}</text>\n",
                     x + bw * 0.4, ax.y1 + 12, x + bw * 0.4, ax.y1 + 12, esc(row_label(rep.rows[i])));
    s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='9' text-anchor='middle'>{:.3g}</text>\n", x + bw * 0.4,
                     y - 3, k);
  }
  // Right panel: KLD by position bucket.
  s += "<text x='690' y='40' font-size='12' text-anchor='middle'>KLD by position (log2 buckets)</text>\n";
  axis_ticks(s, ax, 520, 880);
  std::size_t nb = 0;
  for (const EvalRow& r : rep.rows) nb = std::max(nb, r.kld.kld_by_bucket().size());
  const double dx = 350.0 / std::max<std::size_t>(nb, 2);
  for (std::size_t b = 0; b < nb; b += 2) {
    s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='9' text-anchor='middle'>{}</text>\n", 525 + b * dx,
                     ax.y1 + 12, (int64_t{1} << b) - 1);
  }
  for (std::size_t i = 0; i < rep.rows.size(); ++i) {
    std::string pts;
    const auto bk = rep.rows[i].kld.kld_by_bucket();
    for (std::size_t b = 0; b < bk.size(); ++b) {
      if (!(bk[b] > 0) || !std::isfinite(bk[b])) continue;
      pts += fmt::format("{:.1f},{:.1f} ", 525 + b * dx, ax.at(bk[b]));
    }
    s += fmt::format("<polyline points='{}' fill='none' stroke='{}' stroke-width='1.5'/>\n", pts, kColors[i % 8]);
    s += fmt::format("<text x='875' y='{}' font-size='9' text-anchor='end' fill='{}'>{}</text>\n", 60 + 11 * i, kColors[i % 8],
                     esc(row_label(rep.rows[i])));
  }
  s += "</svg>\n";
  return s;
}

std::string scale_profile_svg(const OuterScales& sc, std::string_view title) {
  const double W = 700, Hh = 320;
  std::string s = fmt::format("<svg xmlns='http://www.w3.org/2000/svg' width='{}' height='{}' font-family='sans-serif'>\n"
                              "<rect width='100%' height='100%' fill='white'/>\n"
                              "<text x='{}' y='20' font-size='14' text-anchor='middle'>{}</text>\n",
                              W, Hh, W / 2, esc(title));
  const std::vector<double>& v = sc.max_abs.empty() ? sc.scales : sc.max_abs;
  double mn = 1e300, mx = 0;
  for (double x : v) if (x > 0) mn = std::min(mn, x), mx = std::max(mx, x);
  const LogAxis ax = log_axis(mn, mx, 40, 270);
  s += fmt::format("<text x='{}' y='36' font-size='11' text-anchor='middle'>{} per layer (s_l = max_abs / 2688)</text>\n",
                   W / 2, sc.max_abs.empty() ? "outer scale s_l" : "max |kv_c_normed|");
  axis_ticks(s, ax, 60, 680);
  const double bw = 610.0 / std::max<std::size_t>(v.size(), 1);
  for (std::size_t l = 0; l < v.size(); ++l) {
    const double x = 65 + l * bw, y = ax.at(v[l]);
    s += fmt::format("<rect x='{:.1f}' y='{:.1f}' width='{:.1f}' height='{:.1f}' fill='#4477aa'/>\n", x, y,
                     std::max(bw * 0.8, 1.0), ax.y1 - y);
    if (v.size() <= 32 || l % 4 == 0) {
      s += fmt::format("<text x='{:.1f}' y='{:.1f}' font-size='9' text-anchor='middle'>{}</text>\n", x + bw * 0.4,
                       ax.y1 + 12, l);
    }
  }
  s += fmt::format("<text x='{}' y='{}' font-size='11' text-anchor='middle'>layer</text>\n", W / 2, Hh - 16);
  s += "</svg>\n";
  return s;
}

}  // namespace mlakv
