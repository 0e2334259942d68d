// dsv4: one binary, one subcommand per job.
#include <cstdio>
#include <map>

#include "apps/app.h"

int main(int argc, char** argv) {
    using namespace dsv4::apps;
    CLI::App app{"dsv4: an inference engine for DeepSeek V4 Flash"};
    app.require_subcommand(1);
    app.set_help_all_flag("--help-all", "Help for every subcommand");
    std::map<CLI::App*, Runner> runners;
    auto reg = [&](Runner (*add)(CLI::App&)) {
        const size_t before = app.get_subcommands({}).size();
        Runner r = add(app);
        auto subs = app.get_subcommands({});
        if (subs.size() > before) runners[subs.back()] = std::move(r);
    };
    reg(add_synth);
    reg(add_info);
    reg(add_logits);
    reg(add_tokenize);
    reg(add_run);
    reg(add_chat);
    reg(add_bench);
    reg(add_plot);
    reg(add_serve);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    try {
        for (auto& [sub, run] : runners)
            if (sub->parsed()) return run();
    } catch (const dsv4::Error& e) {
        std::fprintf(stderr, "dsv4: error: %s\n", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "dsv4: error: out of memory\n");
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dsv4: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
