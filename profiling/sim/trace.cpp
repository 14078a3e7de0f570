#include "profiling/sim/trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "csrc/base/size.h"
#include "csrc/base/text.h"
#include "csrc/config/config.h"

namespace pins::sim {

using nlohmann::json;

int Sequence::prompt_at(int run) const {
  const int n = static_cast<int>(prompts.size());
  if (run < n) return prompts[run];
  return prompts[repeat_from + (run - n) % period()];
}

int Trace::model_index(const std::string& n) const {
  for (size_t i = 0; i < models.size(); ++i)
    if (models[i].name == n) return static_cast<int>(i);
  return -1;
}

const Sequence& Trace::sequence(const std::string& n) const {
  std::string names;
  for (const Sequence& s : sequences) {
    if (s.name == n) return s;
    names += (names.empty() ? "" : ", ") + s.name;
  }
  throw TraceError(path + ": no sequence \"" + n + "\" (sequences: " + names + ")");
}

uint64_t Trace::largest_layer() const {
  uint64_t m = 0;
  for (const Model& x : models) m = std::max(m, x.largest_layer);
  return m;
}

uint64_t Trace::total_weight_bytes() const {
  uint64_t t = 0;
  for (const Model& x : models) t += x.bytes;
  return t;
}

// ------------------------------------------------------------------ units

namespace {

// What a size or a bandwidth looks like, for the error messages.
constexpr const char* kSizeForm =
    "a size such as 4096, \"32GiB\" or \"2.5GB\" (K, M, G, T, KiB, MiB, GiB, TiB binary; KB, MB, GB, TB decimal)";
constexpr const char* kBandwidthForm = "a positive bandwidth such as \"3GB/s\" or \"25GiB/s\"";

}  // namespace

std::optional<double> parse_bandwidth(std::string_view text) {
  std::string_view t = trim(text);
  if (t.size() >= 2 && lower(t.substr(t.size() - 2)) == "/s") t.remove_suffix(2);
  double v = 0;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v, std::chars_format::fixed);
  if (ec != std::errc() || !std::isfinite(v)) return std::nullopt;
  const std::optional<double> unit = size_unit(std::string_view(end, t.data() + t.size() - end));
  if (!unit || !(v * *unit > 0)) return std::nullopt;
  return v * *unit;
}

// ------------------------------------------------------------------ parameter lists

namespace {

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : s) {
    if (c == '.') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  return parts;
}

bool is_number(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

std::string join(const std::vector<std::string>& parts, size_t n) {
  std::string s;
  for (size_t i = 0; i < n && i < parts.size(); ++i) s += (i ? "." : "") + parts[i];
  return s;
}

// The block of `name` at split depth `depth`: the name through its (depth+1)-th
// numeric component; the module (name less its last component) when it has fewer.
std::string block_of(const std::string& name, int depth) {
  const std::vector<std::string> parts = split_dots(name);
  int seen = 0;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (is_number(parts[i]) && seen++ == depth) return join(parts, i + 1);
  }
  return parts.size() > 1 ? join(parts, parts.size() - 1) : name;
}

struct Group {
  std::string name;
  std::vector<const model_params::Tensor*> tensors;
  uint64_t numel = 0;
};

// Consecutive runs of tensors with the same key.
std::vector<Group> runs_by(const std::vector<const model_params::Tensor*>& ts,
                           const std::function<std::string(const model_params::Tensor&)>& key) {
  std::vector<Group> out;
  for (const model_params::Tensor* t : ts) {
    const std::string k = key(*t);
    if (out.empty() || out.back().name != k) out.push_back({k, {}, 0});
    out.back().tensors.push_back(t);
    out.back().numel += t->numel;
  }
  return out;
}

void group_blocks(const std::vector<const model_params::Tensor*>& ts, int depth, uint64_t bpp, uint64_t max_bytes,
                  std::vector<Layer>& out) {
  for (Group& g : runs_by(ts, [depth](const model_params::Tensor& t) { return block_of(t.name, depth); })) {
    const uint64_t bytes = g.numel * bpp;
    bool can_split = false;
    if (max_bytes > 0 && bytes > max_bytes && g.tensors.size() > 1) {
      const std::string first = block_of(g.tensors.front()->name, depth + 1);
      for (const model_params::Tensor* t : g.tensors) can_split |= block_of(t->name, depth + 1) != first;
    }
    if (can_split) group_blocks(g.tensors, depth + 1, bpp, max_bytes, out);
    else out.push_back({g.name, bytes});
  }
}

}  // namespace

std::vector<Layer> group_layers(const std::vector<model_params::Tensor>& tensors, const std::string& group,
                                uint64_t bpp, uint64_t max_layer_bytes) {
  std::vector<const model_params::Tensor*> ts;
  for (const model_params::Tensor& t : tensors) ts.push_back(&t);
  std::vector<Layer> out;
  if (group == "tensor") {
    for (const model_params::Tensor* t : ts) out.push_back({t->name, t->numel * bpp});
  } else if (group == "module") {
    for (Group& g : runs_by(ts, [](const model_params::Tensor& t) { return block_of(t.name, 1 << 20); }))
      out.push_back({g.name, g.numel * bpp});
  } else if (group == "block") {
    group_blocks(ts, 0, bpp, max_layer_bytes, out);
  } else {
    throw std::invalid_argument("expected \"block\", \"module\" or \"tensor\", got \"" + group + "\"");
  }
  // Names identify layers in dumps: make repeats unique.
  std::map<std::string, int> seen;
  for (Layer& l : out)
    if (int n = seen[l.name]++; n > 0) l.name += "#" + std::to_string(n + 1);
  return out;
}

// ------------------------------------------------------------------ the trace file

namespace {

// A JSON value and the path that names it in errors.
struct Field {
  const json& v;
  std::string path;
  const std::string& origin;

  [[noreturn]] void fail(const std::string& what) const {
    throw TraceError(origin + ": " + (path.empty() ? "(top level)" : path) + ": " + what);
  }
  bool has(const char* k) const { return v.is_object() && v.contains(k); }
  Field at(const char* k) const {
    if (!v.is_object()) fail("expected an object");
    if (!v.contains(k)) {
      const std::string p = path.empty() ? k : path + "." + k;
      throw TraceError(origin + ": " + p + ": missing (required)");
    }
    return {v.at(k), path.empty() ? std::string(k) : path + "." + k, origin};
  }
  Field item(size_t i) const { return {v.at(i), path + "[" + std::to_string(i) + "]", origin}; }
  size_t size() const { return v.size(); }
  void expect_object(const std::set<std::string>& keys) const {
    if (!v.is_object()) fail("expected an object, got " + std::string(v.type_name()));
    for (auto& [k, x] : v.items())
      if (!keys.count(k)) {
        std::string known;
        for (const std::string& s : keys) known += (known.empty() ? "" : ", ") + s;
        throw TraceError(origin + ": " + (path.empty() ? k : path + "." + k) + ": unknown field (known: " + known +
                         ")");
      }
  }
  const json& array() const {
    if (!v.is_array()) fail("expected a list, got " + std::string(v.type_name()));
    return v;
  }
  std::string str() const {
    if (!v.is_string()) fail("expected a string, got " + std::string(v.type_name()));
    return v.get<std::string>();
  }
  int integer(int lo, int hi) const {
    if (!v.is_number_integer()) fail("expected an integer, got " + v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
      fail("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
    return static_cast<int>(x);
  }
  uint64_t bytes() const {
    if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) return v.get<uint64_t>();
    if (v.is_string())
      if (const std::optional<uint64_t> b = parse_size(v.get<std::string>())) return *b;
    fail(std::string("expected ") + kSizeForm + ", got " + v.dump());
  }
  double bandwidth() const {
    if (v.is_number() && v.get<double>() > 0) return v.get<double>();
    if (v.is_string())
      if (const std::optional<double> b = parse_bandwidth(v.get<std::string>())) return *b;
    fail(std::string("expected ") + kBandwidthForm + ", got " + v.dump());
  }
};

std::string dir_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

void parse_machine(const Field& f, Machine& m) {
  f.expect_object({"ram", "vram", "disk_read_bw", "ram_copy_bw", "h2d_bw", "headroom", "other_ram", "swap",
                   "vram_reserve", "note"});
  m.ram = f.at("ram").bytes();
  m.vram = f.at("vram").bytes();
  m.disk_read_bw = f.at("disk_read_bw").bandwidth();
  m.ram_copy_bw = f.at("ram_copy_bw").bandwidth();
  m.h2d_bw = f.at("h2d_bw").bandwidth();
  // Note [Derived budget]: a machine without a headroom gets the one pins
  // derives from its RAM.
  m.headroom_derived = !f.has("headroom");
  m.headroom = m.headroom_derived ? derive_budget(m.ram, 0).headroom : f.at("headroom").bytes();
  m.other_ram = f.has("other_ram") ? f.at("other_ram").bytes() : 4 * GiB;
  m.swap = f.has("swap") ? f.at("swap").bytes() : 0;
  m.vram_reserve = f.has("vram_reserve") ? f.at("vram_reserve").bytes() : 1229 * MiB;
  if (m.ram == 0) f.at("ram").fail("must be positive");
  if (m.vram == 0) f.at("vram").fail("must be positive");
  if (m.other_ram >= m.ram) f.at("other_ram").fail("must be less than ram");
  if (m.vram_reserve >= m.vram) f.at("vram_reserve").fail("must be less than vram");
}

// The parameter list, read when the first "params" model asks for it.
struct ParamList {
  std::string path;
  std::optional<std::vector<model_params::Model>> models;

  const std::vector<model_params::Model>& get() {
    if (!models) {
      try {
        models = model_params::read(path);
      } catch (const std::runtime_error& e) {
        throw TraceError(e.what());
      }
    }
    return *models;
  }
};

void parse_model(const Field& f, Model& m, ParamList& params) {
  f.expect_object({"name", "params", "group", "max_layer_bytes", "bytes_per_param", "layers", "bytes", "layer_count",
                   "inference_bytes", "source", "note"});
  m.name = f.at("name").str();
  if (m.name.empty()) f.at("name").fail("must not be empty");
  const int forms = f.has("params") + f.has("layers") + f.has("bytes");
  if (forms != 1) f.fail("give exactly one of \"params\", \"layers\" or \"bytes\" (with \"layer_count\")");
  if (f.has("params")) {
    const Field p = f.at("params");
    std::vector<std::string> names;
    if (p.v.is_string()) names.push_back(p.str());
    else
      for (size_t i = 0; i < p.array().size(); ++i) names.push_back(p.item(i).str());
    if (names.empty()) p.fail("must name at least one model of the parameter list");
    const uint64_t bpp = f.has("bytes_per_param") ? f.at("bytes_per_param").integer(1, 8) : 2;
    const std::string group = f.has("group") ? f.at("group").str() : "block";
    const uint64_t max_layer = f.has("max_layer_bytes") ? f.at("max_layer_bytes").bytes() : GiB;
    for (const std::string& n : names) {
      const model_params::Model* model = model_params::find(params.get(), n);
      if (model == nullptr) {
        std::string known;
        for (const model_params::Model& x : params.get()) known += (known.empty() ? "" : ", ") + x.name;
        p.fail("no model \"" + n + "\" in " + params.path + " (it has: " + known + ")");
      }
      std::vector<Layer> ls;
      try {
        ls = group_layers(model->tensors, group, bpp, max_layer);
      } catch (const std::invalid_argument& e) {
        f.at("group").fail(e.what());
      }
      for (Layer& l : ls) {
        if (names.size() > 1) l.name = n + ":" + l.name;
        m.layers.push_back(std::move(l));
      }
    }
  } else if (f.has("layers")) {
    const Field ls = f.at("layers");
    ls.array();
    if (ls.size() == 0) ls.fail("must list at least one layer");
    for (size_t i = 0; i < ls.size(); ++i) {
      const Field l = ls.item(i);
      Layer layer;
      if (l.v.is_object()) {
        l.expect_object({"name", "bytes"});
        layer.name = l.at("name").str();
        layer.bytes = l.at("bytes").bytes();
      } else {
        layer.name = "layer" + std::to_string(i);
        layer.bytes = l.bytes();
      }
      if (layer.bytes == 0) l.fail("a layer must have a positive size");
      m.layers.push_back(layer);
    }
  } else {
    const uint64_t bytes = f.at("bytes").bytes();
    const int count = f.at("layer_count").integer(1, 1 << 20);
    if (bytes < static_cast<uint64_t>(count)) f.at("bytes").fail("must be at least layer_count bytes");
    for (int i = 0; i < count; ++i) {
      const uint64_t b = bytes / count + (i == count - 1 ? bytes % count : 0);
      m.layers.push_back({"layer" + std::to_string(i), b});
    }
  }
  if (f.has("layer_count") && !f.has("bytes")) f.at("layer_count").fail("goes with \"bytes\"");
  m.inference_bytes = f.has("inference_bytes") ? f.at("inference_bytes").bytes() : 0;
  for (const Layer& l : m.layers) {
    m.bytes += l.bytes;
    m.largest_layer = std::max(m.largest_layer, l.bytes);
  }
  std::set<std::string> seen;
  for (const Layer& l : m.layers)
    if (!seen.insert(l.name).second) f.fail("layer name \"" + l.name + "\" appears twice");
}

void parse_lora(const Field& f, Trace& t, Lora& l) {
  f.expect_object({"name", "model", "bytes", "targets", "source", "note"});
  l.name = f.at("name").str();
  const std::string model = f.at("model").str();
  l.model = t.model_index(model);
  if (l.model < 0) f.at("model").fail("unknown model \"" + model + "\"");
  l.bytes = f.at("bytes").bytes();
  if (l.bytes == 0) f.at("bytes").fail("must be positive");
  if (f.has("targets")) {
    const Field ts = f.at("targets");
    for (size_t i = 0; i < ts.array().size(); ++i) l.targets.push_back(ts.item(i).str());
  }
  const Model& m = t.models[l.model];
  uint64_t patched = 0;
  std::vector<bool> hit(m.layers.size(), false);
  for (size_t i = 0; i < m.layers.size(); ++i) {
    bool match = l.targets.empty();
    for (const std::string& p : l.targets) match |= m.layers[i].name.rfind(p, 0) == 0;
    hit[i] = match;
    if (match) patched += m.layers[i].bytes;
  }
  if (patched == 0) f.at("targets").fail("matches no layer of model \"" + m.name + "\"");
  // Split `bytes` over the patched layers in proportion to their size; the
  // rounding remainder goes to the last patched layer.
  l.layer_bytes.assign(m.layers.size(), 0);
  uint64_t given = 0;
  size_t last = 0;
  for (size_t i = 0; i < m.layers.size(); ++i) {
    if (!hit[i]) continue;
    const long double share = static_cast<long double>(l.bytes) * m.layers[i].bytes / patched;
    l.layer_bytes[i] = std::max<uint64_t>(1, static_cast<uint64_t>(share));
    given += l.layer_bytes[i];
    last = i;
  }
  if (given < l.bytes) l.layer_bytes[last] += l.bytes - given;
}

void parse_step(const Field& f, const Trace& t, Step& s) {
  f.expect_object({"model", "steps", "loras", "note"});
  const std::string model = f.at("model").str();
  s.model = t.model_index(model);
  if (s.model < 0) {
    std::string known;
    for (const Model& m : t.models) known += (known.empty() ? "" : ", ") + m.name;
    f.at("model").fail("unknown model \"" + model + "\" (models: " + known + ")");
  }
  s.steps = f.has("steps") ? f.at("steps").integer(1, 100000) : 1;
  if (f.has("loras")) {
    const Field ls = f.at("loras");
    for (size_t i = 0; i < ls.array().size(); ++i) {
      const std::string n = ls.item(i).str();
      int idx = -1;
      for (size_t j = 0; j < t.loras.size(); ++j)
        if (t.loras[j].name == n) idx = static_cast<int>(j);
      if (idx < 0) ls.item(i).fail("unknown lora \"" + n + "\"");
      if (t.loras[idx].model != s.model)
        ls.item(i).fail("lora \"" + n + "\" is for model \"" + t.models[t.loras[idx].model].name + "\", not \"" +
                        model + "\"");
      s.loras.push_back(idx);
    }
  }
}

}  // namespace

Trace parse_trace(const std::string& text, const std::string& origin, const std::string& params_csv) {
  json doc;
  try {
    doc = json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number past a double
    throw TraceError(origin + ": not valid JSON: " + e.what());
  }
  const Field top{doc, "", origin};
  top.expect_object(
      {"name", "description", "sources", "params_file", "machine", "models", "loras", "prompts", "sequences", "note"});
  Trace t;
  t.path = origin;
  t.name = top.at("name").str();
  if (top.has("description")) t.description = top.at("description").str();
  if (top.has("sources")) {
    const Field s = top.at("sources");
    for (size_t i = 0; i < s.array().size(); ++i) t.sources.push_back(s.item(i).str());
  }
  ParamList params{params_csv, std::nullopt};
  if (params.path.empty())
    params.path =
        top.has("params_file") ? dir_of(origin) + "/" + top.at("params_file").str() : model_params::default_path();
  parse_machine(top.at("machine"), t.machine);

  const Field models = top.at("models");
  if (models.array().empty()) models.fail("must list at least one model");
  for (size_t i = 0; i < models.size(); ++i) {
    Model m;
    parse_model(models.item(i), m, params);
    if (t.model_index(m.name) >= 0) models.item(i).at("name").fail("model \"" + m.name + "\" is defined twice");
    t.models.push_back(std::move(m));
  }
  if (top.has("loras")) {
    const Field ls = top.at("loras");
    for (size_t i = 0; i < ls.array().size(); ++i) {
      Lora l;
      parse_lora(ls.item(i), t, l);
      for (const Lora& o : t.loras)
        if (o.name == l.name) ls.item(i).at("name").fail("lora \"" + l.name + "\" is defined twice");
      t.loras.push_back(std::move(l));
    }
  }
  const Field prompts = top.at("prompts");
  if (prompts.array().empty()) prompts.fail("must list at least one prompt");
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Field p = prompts.item(i);
    p.expect_object({"name", "steps", "note"});
    Prompt pr;
    pr.name = p.at("name").str();
    for (const Prompt& o : t.prompts)
      if (o.name == pr.name) p.at("name").fail("prompt \"" + pr.name + "\" is defined twice");
    const Field steps = p.at("steps");
    if (steps.array().empty()) steps.fail("a prompt runs at least one step");
    for (size_t j = 0; j < steps.size(); ++j) {
      Step s;
      parse_step(steps.item(j), t, s);
      pr.steps.push_back(std::move(s));
    }
    t.prompts.push_back(std::move(pr));
  }
  if (top.has("sequences")) {
    const Field seqs = top.at("sequences");
    for (size_t i = 0; i < seqs.array().size(); ++i) {
      const Field f = seqs.item(i);
      f.expect_object({"name", "description", "prompts", "repeat_from", "runs", "note"});
      Sequence s;
      s.name = f.at("name").str();
      for (const Sequence& o : t.sequences)
        if (o.name == s.name) f.at("name").fail("sequence \"" + s.name + "\" is defined twice");
      if (f.has("description")) s.description = f.at("description").str();
      const Field ps = f.at("prompts");
      if (ps.array().empty()) ps.fail("must list at least one prompt");
      for (size_t j = 0; j < ps.size(); ++j) {
        const std::string n = ps.item(j).str();
        int idx = -1;
        for (size_t k = 0; k < t.prompts.size(); ++k)
          if (t.prompts[k].name == n) idx = static_cast<int>(k);
        if (idx < 0) ps.item(j).fail("unknown prompt \"" + n + "\"");
        s.prompts.push_back(idx);
      }
      s.repeat_from = f.has("repeat_from") ? f.at("repeat_from").integer(0, static_cast<int>(s.prompts.size()) - 1) : 0;
      s.runs = f.has("runs") ? f.at("runs").integer(1, 100000) : 6;
      t.sequences.push_back(std::move(s));
    }
  } else {
    // No sequences: the prompts in order, repeated.
    Sequence s;
    s.name = "all";
    for (size_t i = 0; i < t.prompts.size(); ++i) s.prompts.push_back(static_cast<int>(i));
    s.runs = std::max<int>(6, static_cast<int>(t.prompts.size()));
    t.sequences.push_back(std::move(s));
  }
  return t;
}

Trace load_trace(const std::string& path, const std::string& params_csv) {
  std::ifstream f(path);
  if (!f) throw TraceError(path + ": cannot open the trace file");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_trace(ss.str(), path, params_csv);
}

void set_machine_field(Machine& m, const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos) throw std::invalid_argument("--machine expects FIELD=VALUE, got \"" + assignment + "\"");
  const std::string k(trim(std::string_view(assignment).substr(0, eq)));
  const std::string v = assignment.substr(eq + 1);
  const auto size = [&] {
    const std::optional<uint64_t> b = parse_size(v);
    if (!b) throw std::invalid_argument("--machine " + k + ": expected " + kSizeForm + ", got \"" + v + "\"");
    return *b;
  };
  const auto bandwidth = [&] {
    const std::optional<double> b = parse_bandwidth(v);
    if (!b) throw std::invalid_argument("--machine " + k + ": expected " + kBandwidthForm + ", got \"" + v + "\"");
    return *b;
  };
  if (k == "ram") {
    m.ram = size();
    if (m.headroom_derived) m.headroom = derive_budget(m.ram, 0).headroom;  // the new RAM's
  } else if (k == "headroom") {
    m.headroom = size();
    m.headroom_derived = false;
  } else if (k == "vram") m.vram = size();
  else if (k == "other_ram") m.other_ram = size();
  else if (k == "swap") m.swap = size();
  else if (k == "vram_reserve") m.vram_reserve = size();
  else if (k == "disk_read_bw") m.disk_read_bw = bandwidth();
  else if (k == "ram_copy_bw") m.ram_copy_bw = bandwidth();
  else if (k == "h2d_bw") m.h2d_bw = bandwidth();
  else
    throw std::invalid_argument(
        "--machine: unknown machine field \"" + k +
        "\" (fields: ram, vram, disk_read_bw, ram_copy_bw, h2d_bw, headroom, other_ram, swap, vram_reserve)");
  if (m.other_ram >= m.ram) throw std::invalid_argument("--machine: other_ram must be less than ram");
  if (m.vram_reserve >= m.vram) throw std::invalid_argument("--machine: vram_reserve must be less than vram");
}

}  // namespace pins::sim
