// dsv4 plot: SVG charts of `dsv4 bench` CSVs — tokens/s and KV bytes against context —
// with several runs (lazy and eager, dsv4 and llama.cpp) on one chart.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "apps/app.h"

namespace dsv4::apps {

namespace {

struct Series {
    std::string label;
    std::map<std::string, std::vector<double>> cols;
};

Series read_csv(const std::string& path) {
    std::ifstream f(path);
    if (!f) fail("plot: cannot read ", path);
    Series s;
    s.label = std::filesystem::path(path).stem().string();
    std::string line;
    if (!std::getline(f, line)) fail("plot: ", path, " is empty");
    std::vector<std::string> names;
    std::stringstream hs(line);
    for (std::string n; std::getline(hs, n, ',');) names.push_back(n);
    if (std::find(names.begin(), names.end(), "ctx_tokens") == names.end())
        fail("plot: ", path, " has no ctx_tokens column (not a dsv4 bench CSV)");
    size_t row = 1;
    while (std::getline(f, line)) {
        ++row;
        if (line.empty()) continue;
        std::stringstream ls(line);
        size_t i = 0;
        for (std::string v; std::getline(ls, v, ','); ++i) {
            if (i >= names.size()) fail("plot: ", path, " line ", row, " has more fields than the header");
            try {
                s.cols[names[i]].push_back(std::stod(v));
            } catch (...) {
                fail("plot: ", path, " line ", row, ": '", v, "' is not a number");
            }
        }
    }
    return s;
}

// One panel: y columns of every series against ctx_tokens.
void panel(std::ostringstream& svg, double x0, double y0, double w, double h, const std::vector<Series>& ss,
           const std::vector<std::pair<std::string, std::string>>& ys, const std::string& title, double yscale,
           const std::string& yunit) {
    static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};
    double xmax = 1, ymax = 1e-9;
    for (const auto& s : ss) {
        auto it = s.cols.find("ctx_tokens");
        for (double v : it->second) xmax = std::max(xmax, v);
        for (const auto& [col, _] : ys)
            if (auto c = s.cols.find(col); c != s.cols.end())
                for (double v : c->second) ymax = std::max(ymax, v / yscale);
    }
    ymax *= 1.1;
    svg << "<g font-family='sans-serif' font-size='12'>\n";
    svg << "<text x='" << x0 + w / 2 << "' y='" << y0 - 8 << "' text-anchor='middle' font-size='14'>" << title
        << "</text>\n";
    svg << "<rect x='" << x0 << "' y='" << y0 << "' width='" << w << "' height='" << h
        << "' fill='none' stroke='#888'/>\n";
    for (int k = 0; k <= 4; ++k) {
        const double yv = ymax * k / 4, yy = y0 + h - h * k / 4;
        svg << "<line x1='" << x0 << "' x2='" << x0 + w << "' y1='" << yy << "' y2='" << yy << "' stroke='#eee'/>";
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.3g", yv);
        svg << "<text x='" << x0 - 4 << "' y='" << yy + 4 << "' text-anchor='end'>" << buf << "</text>\n";
        const double xv = xmax * k / 4, xx = x0 + w * k / 4;
        std::snprintf(buf, sizeof buf, "%.0f", xv);
        svg << "<text x='" << xx << "' y='" << y0 + h + 16 << "' text-anchor='middle'>" << buf << "</text>\n";
    }
    svg << "<text x='" << x0 + w / 2 << "' y='" << y0 + h + 32 << "' text-anchor='middle'>context (tokens)</text>\n";
    svg << "<text x='" << x0 - 44 << "' y='" << y0 + h / 2 << "' transform='rotate(-90 " << x0 - 44 << " "
        << y0 + h / 2 << ")' text-anchor='middle'>" << yunit << "</text>\n";
    int ci = 0, li = 0;
    for (const auto& s : ss) {
        const auto& xs = s.cols.at("ctx_tokens");
        for (const auto& [col, name] : ys) {
            auto c = s.cols.find(col);
            if (c == s.cols.end()) continue;
            const char* color = colors[ci++ % 6];
            svg << "<polyline fill='none' stroke='" << color << "' stroke-width='2' points='";
            for (size_t i = 0; i < xs.size() && i < c->second.size(); ++i)
                svg << x0 + w * xs[i] / xmax << "," << y0 + h - h * (c->second[i] / yscale) / ymax << " ";
            svg << "'/>\n";
            svg << "<text x='" << x0 + 8 << "' y='" << y0 + 16 + 14 * li++ << "' fill='" << color << "'>" << s.label
                << ": " << name << "</text>\n";
        }
    }
    svg << "</g>\n";
}

}  // namespace

void write_plot_svg(const std::vector<std::string>& csvs, const std::string& out) {
    std::vector<Series> ss;
    for (const auto& c : csvs) ss.push_back(read_csv(c));
    std::ostringstream svg;
    svg << "<svg xmlns='http://www.w3.org/2000/svg' width='1300' height='420' viewBox='0 0 1300 420'>\n"
        << "<rect width='100%' height='100%' fill='white'/>\n";
    panel(svg, 80, 40, 330, 320, ss, {{"prefill_tps", "prefill"}}, "prefill tokens/s", 1, "tokens/s");
    panel(svg, 500, 40, 330, 320, ss, {{"gen_tps", "decode"}}, "decode tokens/s", 1, "tokens/s");
    panel(svg, 920, 40, 330, 320, ss, {{"kv_committed_bytes", "committed"}, {"kv_live_bytes", "live"}},
          "KV memory", 1048576.0, "MiB");
    svg << "</svg>\n";
    std::ofstream f(out);
    if (!f) fail("plot: cannot write ", out);
    f << svg.str();
    if (!f) fail("plot: error writing ", out);
}

Runner add_plot(CLI::App& app) {
    auto* cmd = app.add_subcommand("plot", "SVG chart of dsv4 bench CSVs (several runs on one chart)");
    auto csvs = std::make_shared<std::vector<std::string>>();
    auto out = std::make_shared<std::string>();
    cmd->add_option("csv", *csvs, "bench CSV files")->required();
    cmd->add_option("-o,--output", *out, "SVG output")->required();
    return [csvs, out]() {
        write_plot_svg(*csvs, *out);
        return 0;
    };
}

}  // namespace dsv4::apps
