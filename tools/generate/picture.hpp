#pragma once
// specdec-generate's --report: a picture of one run, as a self-contained SVG file or an HTML page
// that embeds it (no script, no external resource). Three panels: the acceptance rate by depth
// (bars), the tokens committed per step over the run (the accepted drafts and the bonus token of
// each step, stacked), and the draft tree of one step drawn as a tree, root on the left, with the
// accepted path marked and the bonus token after it.

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "specdec/core/draft_tree.hpp"
#include "specdec/core/types.hpp"
#include "specdec/core/verify_result.hpp"

namespace generate {

//! One verified step as the picture needs it: its draft tree and the verifier's decision.
struct step_record {
  std::vector<specdec::token_id> tokens;        //!< [nodes] the tree's tokens, the root first
  std::vector<specdec::node_index> parents;     //!< [nodes] parent of each node (-1 for the root)
  std::vector<specdec::node_index> accepted;    //!< the accepted nodes, in depth order
  specdec::token_id bonus = specdec::no_token;  //!< the step's bonus token
  std::size_t emitted = 0;                      //!< tokens committed (after the stop checks)
};

//! Copies what `tree` and `result` say into a record.
inline step_record record_step(specdec::draft_tree const& tree,
                               specdec::verify_result const& result) {
  step_record r;
  r.tokens.assign(tree.tokens().begin(), tree.tokens().end());
  r.parents.assign(tree.parents().begin(), tree.parents().end());
  r.accepted = result.accepted_nodes;
  r.bonus = result.bonus();
  return r;
}

//! What the picture shows of a run.
struct run_picture {
  std::string title;                          //!< the strategy and its settings
  std::string subtitle;                       //!< verifier, tokens, steps
  std::vector<double> acceptance_by_depth;    //!< [depth] accepted / drafted at depth d + 1
  std::vector<std::size_t> drafted_at_depth;  //!< [depth] steps whose tree reached depth d + 1
  std::vector<step_record> steps;             //!< every step, in order
  std::size_t shown_step = 0;                 //!< the step whose tree is drawn
  std::function<std::string(specdec::token_id)> text;  //!< a token's text, for labels
};

//! The step whose tree the report draws by default: the first with the longest accepted path,
//! and among those the most drafted nodes.
inline std::size_t default_shown_step(std::vector<step_record> const& steps) {
  std::size_t best = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    step_record const& s = steps[i];
    step_record const& b = steps[best];
    if (s.accepted.size() > b.accepted.size() ||
        (s.accepted.size() == b.accepted.size() && s.tokens.size() > b.tokens.size()))
      best = i;
  }
  return best;
}

namespace detail {

//! `s` escaped for XML text and attributes; control bytes become U+FFFD-free visible escapes.
inline std::string xml_escape(std::string_view s) {
  std::string out;
  for (char ch : s) {
    auto const c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += ch == '\n' ? std::string("\\n") : std::string(buf);
        } else {
          out += ch;
        }
    }
  }
  return out;
}

//! A number for SVG coordinates.
inline std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

//! A token's label: its text quoted, kept short (UTF-8 cut at a character boundary).
inline std::string token_label(run_picture const& p, specdec::token_id t) {
  std::string text = p.text ? p.text(t) : std::to_string(t);
  if (text.size() > 14) {
    std::size_t cut = 12;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0u) == 0x80u) --cut;
    text = text.substr(0, cut) + "\xe2\x80\xa6";
  }
  return "\xe2\x80\x9c" + text + "\xe2\x80\x9d";
}

// Colours.
inline constexpr char const* ink = "#1f2937";
inline constexpr char const* faint = "#9ca3af";
inline constexpr char const* grid = "#e5e7eb";
inline constexpr char const* accepted_fill = "#16a34a";
inline constexpr char const* bonus_fill = "#f59e0b";
inline constexpr char const* rejected_fill = "#e5e7eb";
inline constexpr char const* root_fill = "#2563eb";
inline constexpr char const* bar_fill = "#2563eb";

//! A panel title at (x, y).
inline void title(std::string& svg, double x, double y, std::string_view text) {
  svg += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" class=\"h\">" + xml_escape(text) +
         "</text>\n";
}

}  // namespace detail

//! The picture as one SVG document.
inline std::string render_svg(run_picture const& p) {
  using detail::num;
  using detail::xml_escape;
  constexpr double width = 1100, margin = 40;
  std::string body;

  // Panel 1: acceptance rate by depth.
  double y = 80;
  detail::title(body, margin, y, "Acceptance rate by depth");
  double const chart_h = 160, chart_w = width - 2 * margin - 40;
  double const top = y + 20, left = margin + 40;
  for (int pct = 0; pct <= 100; pct += 25) {
    double const gy = top + chart_h * (1.0 - pct / 100.0);
    body += "<line x1=\"" + num(left) + "\" y1=\"" + num(gy) + "\" x2=\"" + num(left + chart_w) +
            "\" y2=\"" + num(gy) + "\" stroke=\"" + detail::grid + "\"/>\n";
    body += "<text x=\"" + num(left - 6) + "\" y=\"" + num(gy + 4) + "\" class=\"a\">" +
            std::to_string(pct) + "%</text>\n";
  }
  std::size_t const depths = p.acceptance_by_depth.size();
  if (depths == 0) {
    body += "<text x=\"" + num(left + 10) + "\" y=\"" + num(top + chart_h / 2) +
            "\" class=\"n\">nothing was drafted</text>\n";
  }
  for (std::size_t d = 0; d < depths; ++d) {
    double const slot = chart_w / static_cast<double>(std::max<std::size_t>(depths, 8));
    double const h = chart_h * std::clamp(p.acceptance_by_depth[d], 0.0, 1.0);
    double const x = left + slot * static_cast<double>(d) + slot * 0.15;
    body += "<rect x=\"" + num(x) + "\" y=\"" + num(top + chart_h - h) + "\" width=\"" +
            num(slot * 0.7) + "\" height=\"" + num(h) + "\" fill=\"" + detail::bar_fill +
            "\"><title>depth " + std::to_string(d + 1) + ": " +
            num(100.0 * p.acceptance_by_depth[d]) + "% of " +
            std::to_string(d < p.drafted_at_depth.size() ? p.drafted_at_depth[d] : 0) +
            " steps</title></rect>\n";
    body += "<text x=\"" + num(x + slot * 0.35) + "\" y=\"" + num(top + chart_h + 16) +
            "\" class=\"m\">" + std::to_string(d + 1) + "</text>\n";
    body += "<text x=\"" + num(x + slot * 0.35) + "\" y=\"" + num(top + chart_h - h - 5) +
            "\" class=\"m\">" + num(100.0 * p.acceptance_by_depth[d]) + "%</text>\n";
  }
  body += "<text x=\"" + num(left + chart_w / 2) + "\" y=\"" + num(top + chart_h + 34) +
          "\" class=\"m\">depth in the draft</text>\n";

  // Panel 2: tokens committed per step.
  y = top + chart_h + 80;
  detail::title(body, margin, y, "Tokens committed per step (accepted drafts + the bonus token)");
  double const top2 = y + 20, chart2_h = 140;
  std::size_t most = 1;
  for (auto const& s : p.steps) most = std::max(most, s.emitted);
  for (std::size_t k = 0; k <= most; k += std::max<std::size_t>(1, most / 4)) {
    double const gy = top2 + chart2_h * (1.0 - static_cast<double>(k) / static_cast<double>(most));
    body += "<line x1=\"" + num(left) + "\" y1=\"" + num(gy) + "\" x2=\"" + num(left + chart_w) +
            "\" y2=\"" + num(gy) + "\" stroke=\"" + detail::grid + "\"/>\n";
    body += "<text x=\"" + num(left - 6) + "\" y=\"" + num(gy + 4) + "\" class=\"a\">" +
            std::to_string(k) + "</text>\n";
  }
  if (!p.steps.empty()) {
    double const slot = chart_w / static_cast<double>(p.steps.size());
    double const unit = chart2_h / static_cast<double>(most);
    for (std::size_t i = 0; i < p.steps.size(); ++i) {
      step_record const& s = p.steps[i];
      std::size_t const drafted = std::min(s.accepted.size(), s.emitted);
      std::size_t const bonus = s.emitted - drafted;
      double const x = left + slot * static_cast<double>(i);
      double const w = std::max(slot * 0.8, 0.5);
      double const h1 = unit * static_cast<double>(drafted);
      double const h2 = unit * static_cast<double>(bonus);
      std::string const tip = "<title>step " + std::to_string(i) + ": " + std::to_string(drafted) +
                              " accepted + " + std::to_string(bonus) + " bonus</title>";
      if (h1 > 0)
        body += "<rect x=\"" + num(x) + "\" y=\"" + num(top2 + chart2_h - h1) + "\" width=\"" +
                num(w) + "\" height=\"" + num(h1) + "\" fill=\"" + detail::accepted_fill + "\">" +
                tip + "</rect>\n";
      if (h2 > 0)
        body += "<rect x=\"" + num(x) + "\" y=\"" + num(top2 + chart2_h - h1 - h2) + "\" width=\"" +
                num(w) + "\" height=\"" + num(h2) + "\" fill=\"" + detail::bonus_fill + "\">" +
                tip + "</rect>\n";
      if (i == p.shown_step)
        body += "<path d=\"M" + num(x + w / 2) + " " + num(top2 + chart2_h + 4) +
                " l-5 9 h10 z\" fill=\"" + detail::ink + "\"/>\n";
    }
  }
  body += "<text x=\"" + num(left + chart_w / 2) + "\" y=\"" + num(top2 + chart2_h + 30) +
          "\" class=\"m\">step (" + std::to_string(p.steps.size()) +
          " in all; the marked one is drawn below)</text>\n";
  // Legend.
  double const ly = top2 - 12;
  body += "<rect x=\"" + num(width - 330) + "\" y=\"" + num(ly - 10) +
          "\" width=\"12\" height=\"12\" fill=\"" + detail::accepted_fill + "\"/>\n";
  body += "<text x=\"" + num(width - 313) + "\" y=\"" + num(ly) +
          "\" class=\"l\">accepted draft</text>\n";
  body += "<rect x=\"" + num(width - 190) + "\" y=\"" + num(ly - 10) +
          "\" width=\"12\" height=\"12\" fill=\"" + detail::bonus_fill + "\"/>\n";
  body +=
      "<text x=\"" + num(width - 173) + "\" y=\"" + num(ly) + "\" class=\"l\">bonus token</text>\n";

  // Panel 3: the draft tree of the shown step.
  y = top2 + chart2_h + 80;
  double tree_bottom = y + 40;
  if (p.steps.empty() || p.steps[std::min(p.shown_step, p.steps.size() - 1)].tokens.empty()) {
    detail::title(body, margin, y,
                  p.steps.empty() ? "Draft tree: no step ran"
                                  : "Draft tree: none (this strategy drafts nothing)");
  } else {
    std::size_t const shown = std::min(p.shown_step, p.steps.size() - 1);
    step_record const& s = p.steps[shown];
    detail::title(body, margin, y,
                  "Draft tree of step " + std::to_string(shown) + " (" +
                      std::to_string(s.tokens.size() - 1) + " drafted nodes, " +
                      std::to_string(s.accepted.size()) + " accepted)");
    std::size_t const n = s.tokens.size();
    std::vector<std::vector<std::size_t>> children(n);
    std::vector<std::size_t> depth(n, 0);
    for (std::size_t i = 1; i < n; ++i) {
      auto const par = static_cast<std::size_t>(s.parents[i]);
      children[par].push_back(i);
      depth[i] = depth[par] + 1;
    }
    std::vector<bool> on_path(n, false);
    on_path[0] = true;
    for (specdec::node_index a : s.accepted) on_path[static_cast<std::size_t>(a)] = true;
    // Rows: leaves in depth-first order; an inner node sits at the row of its first child.
    std::vector<double> row(n, 0.0);
    double next_row = 0;
    std::function<void(std::size_t)> place = [&](std::size_t i) {
      if (children[i].empty()) {
        row[i] = next_row++;
        return;
      }
      for (std::size_t c : children[i]) place(c);
      row[i] = row[children[i].front()];
    };
    place(0);
    std::size_t max_depth = 0;
    for (std::size_t d : depth) max_depth = std::max(max_depth, d);
    double const col =
        std::min(150.0, (width - 2 * margin - 140) /
                            static_cast<double>(std::max<std::size_t>(max_depth + 1, 1)));
    double const row_h = 30, node_w = std::min(124.0, col - 14), node_h = 22;
    double const tree_top = y + 24 + row_h;  // row -1 holds the bonus token
    auto const cx = [&](std::size_t d) { return margin + static_cast<double>(d) * col; };
    auto const cy = [&](double r) { return tree_top + r * row_h; };
    for (std::size_t i = 1; i < n; ++i) {
      auto const par = static_cast<std::size_t>(s.parents[i]);
      bool const path = on_path[i] && on_path[par];
      body += "<path d=\"M" + num(cx(depth[par]) + node_w) + " " + num(cy(row[par]) + node_h / 2) +
              " C" + num(cx(depth[par]) + node_w + 12) + " " + num(cy(row[par]) + node_h / 2) +
              " " + num(cx(depth[i]) - 12) + " " + num(cy(row[i]) + node_h / 2) + " " +
              num(cx(depth[i])) + " " + num(cy(row[i]) + node_h / 2) +
              "\" fill=\"none\" stroke=\"" + (path ? detail::accepted_fill : detail::faint) +
              "\" stroke-width=\"" + (path ? "2.5" : "1.2") + "\"/>\n";
    }
    auto const node = [&](double x, double yy, char const* fill, char const* text_class,
                          std::string const& label, std::string const& tip, bool dashed) {
      body += "<g><title>" + xml_escape(tip) + "</title><rect x=\"" + num(x) + "\" y=\"" + num(yy) +
              "\" width=\"" + num(node_w) + "\" height=\"" + num(node_h) + "\" rx=\"5\" fill=\"" +
              fill + "\" stroke=\"" + detail::ink + "\" stroke-width=\"" +
              (dashed ? "1.5\" stroke-dasharray=\"4 3" : "0.6") + "\"/><text x=\"" +
              num(x + node_w / 2) + "\" y=\"" + num(yy + 15) + "\" class=\"" + text_class + "\">" +
              xml_escape(label) + "</text></g>\n";
    };
    for (std::size_t i = 0; i < n; ++i) {
      char const* fill = i == 0       ? detail::root_fill
                         : on_path[i] ? detail::accepted_fill
                                      : detail::rejected_fill;
      std::string const kind = i == 0       ? "root (last committed token)"
                               : on_path[i] ? "accepted, depth " + std::to_string(depth[i])
                                            : "rejected, depth " + std::to_string(depth[i]);
      node(cx(depth[i]), cy(row[i]), fill, i == 0 || on_path[i] ? "w" : "k",
           detail::token_label(p, s.tokens[i]),
           "node " + std::to_string(i) + ": token " + std::to_string(s.tokens[i]) + ", " + kind,
           false);
    }
    // The bonus token after the last accepted node, in the row above the tree.
    std::size_t const last = s.accepted.empty() ? 0 : static_cast<std::size_t>(s.accepted.back());
    double const bx = cx(depth[last] + 1), by = cy(-1.0);
    body += "<path d=\"M" + num(cx(depth[last]) + node_w) + " " + num(cy(row[last]) + node_h / 2) +
            " L" + num(bx) + " " + num(by + node_h / 2) + "\" stroke=\"" + detail::bonus_fill +
            "\" stroke-width=\"2.5\" stroke-dasharray=\"5 3\" fill=\"none\"/>\n";
    node(bx, by, detail::bonus_fill, "k", detail::token_label(p, s.bonus),
         "bonus token " + std::to_string(s.bonus) + " (drawn from the target after the path)",
         true);
    tree_bottom = std::max(cy(next_row) + 10, by + node_h + 20);
    // Legend.
    double const lx = width - 470, ly2 = y;
    auto const key = [&](double x, char const* fill, char const* text) {
      body += "<rect x=\"" + num(x) + "\" y=\"" + num(ly2 - 10) +
              "\" width=\"12\" height=\"12\" rx=\"2\" fill=\"" + fill + "\" stroke=\"" +
              detail::ink + "\" stroke-width=\"0.6\"/><text x=\"" + num(x + 17) + "\" y=\"" +
              num(ly2) + "\" class=\"l\">" + text + "</text>\n";
    };
    key(lx, detail::root_fill, "root");
    key(lx + 70, detail::accepted_fill, "accepted");
    key(lx + 170, detail::rejected_fill, "rejected");
    key(lx + 270, detail::bonus_fill, "bonus token");
  }

  double const height = tree_bottom + 20;
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) +
                    "\" height=\"" + num(height) + "\" viewBox=\"0 0 " + num(width) + " " +
                    num(height) + "\" font-family=\"sans-serif\">\n";
  svg += "<style>.t{font-size:20px;font-weight:bold;fill:" + std::string(detail::ink) +
         "}.s{font-size:13px;fill:#4b5563}.h{font-size:15px;font-weight:bold;fill:" +
         std::string(detail::ink) +
         "}.a{font-size:11px;fill:#6b7280;text-anchor:end}"
         ".m{font-size:11px;fill:#4b5563;text-anchor:middle}.n{font-size:13px;fill:#6b7280}"
         ".l{font-size:12px;fill:#374151}.w{font-size:12px;fill:#ffffff;text-anchor:middle}"
         ".k{font-size:12px;fill:#111827;text-anchor:middle}</style>\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  svg +=
      "<text x=\"" + num(margin) + "\" y=\"34\" class=\"t\">" + xml_escape(p.title) + "</text>\n";
  svg += "<text x=\"" + num(margin) + "\" y=\"54\" class=\"s\">" + xml_escape(p.subtitle) +
         "</text>\n";
  svg += body;
  svg += "</svg>\n";
  return svg;
}

//! The picture as a self-contained HTML page (the SVG inline; no script, no external resource).
inline std::string render_html(run_picture const& p) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
         detail::xml_escape(p.title) +
         "</title>\n<style>body{margin:0;background:#f9fafb}svg{display:block;margin:12px auto;"
         "background:#fff;box-shadow:0 1px 3px rgba(0,0,0,.15)}</style>\n</head>\n<body>\n" +
         render_svg(p) + "</body>\n</html>\n";
}

}  // namespace generate
