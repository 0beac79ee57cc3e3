#include "accel_config.h"

#include <array>
#include <charconv>
#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace harness::accel {
namespace {

struct ZoneName {
  unsigned zone;
  std::string_view name;
};
constexpr std::array<ZoneName, 4> kZones{{{kZoneQkv, "qkv"},
                                          {kZoneAttnProj, "attn_proj"},
                                          {kZoneMlpFc, "mlp_fc"},
                                          {kZoneMlpProj, "mlp_proj"}}};

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

std::vector<std::string> split(const std::string& text, std::string_view separators) {
  std::vector<std::string> items;
  std::string current;
  for (char c : text) {
    if (separators.find(c) != std::string_view::npos) {
      items.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  items.push_back(current);
  return items;
}

// A zone name or "all" -> its bits; 0 if the word is not a zone.
unsigned zone_bits(const std::string& word) {
  if (word == "all") return kAllZones;
  for (const ZoneName& z : kZones) {
    if (word == z.name) return z.zone;
  }
  return 0;
}

void parse_features(const std::string& text, AccelConfig& c) {
  if (text.empty()) return;
  bool in_zone_list = false;  // "fp8=qkv,mlp_fc": a zone after fp8= continues the list
  for (const std::string& item : split(text, ",")) {
    if (item == "bf16") {
      c.bf16 = true;
      in_zone_list = false;
    } else if (item.rfind("fp8=", 0) == 0 || (in_zone_list && zone_bits(item) != 0)) {
      const std::string zones = item.rfind("fp8=", 0) == 0 ? item.substr(4) : item;
      for (const std::string& zone : split(zones, "+")) {
        const unsigned bits = zone_bits(zone);
        if (bits == 0) {
          fail(fmt::format("--features: unknown fp8 zone '{}' (zones: qkv, attn_proj, mlp_fc, mlp_proj, all)", zone));
        }
        c.fp8_zones |= bits;
      }
      in_zone_list = true;
    } else {
      fail(fmt::format("--features: unknown feature '{}' for engine accel (features: bf16, fp8=ZONES)", item));
    }
  }
  if (c.fp8() && !c.bf16) fail("--features: fp8 needs bf16 too (FP8 zones sit inside a bf16 model): use bf16,fp8=...");
}

int parse_int(const std::string& flag, const std::string& text, int low, int high, std::string_view what) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < low || value > high) {
    fail(fmt::format("--{}: '{}' is not {}", flag, text, what));
  }
  return value;
}

std::uint64_t parse_seed(const std::string& text) {
  const bool hex = text.rfind("0x", 0) == 0 || text.rfind("0X", 0) == 0;
  const std::string digits = hex ? text.substr(2) : text;
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value, hex ? 16 : 10);
  // 63 bits, as the manifest's int64 noise_seed attribute holds it.
  constexpr std::uint64_t kMax = 0x7FFFFFFFFFFFFFFFull;
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || value > kMax) {
    fail(fmt::format("--noise-seed: '{}' is not a seed in 0..9223372036854775807 (decimal or 0x-hex; "
                     "copy the manifest's noise_seed)", text));
  }
  return value;
}

// Each FP8 setting needs FP8 zones (the features are parsed before the flags).
void need_fp8(const AccelConfig& c, std::string_view flag) {
  if (!c.fp8()) fail(fmt::format("--{}: needs FP8 zones (e.g. --features bf16,fp8=all)", flag));
}

void parse_noise(const std::string& v, AccelConfig& c) {
  if (v == "seeded") c.noise = NoiseMode::Seeded;
  else if (v == "racy") c.noise = NoiseMode::Racy;
  else if (v == "off") c.noise = NoiseMode::Off;
  else fail(fmt::format("--noise: unknown mode '{}' (seeded, racy, off)", v));
}

void parse_noise_seed(const std::string& v, AccelConfig& c) {
  if (c.noise != NoiseMode::Seeded) fail("--noise-seed: only --noise seeded takes a seed");
  c.noise_seed = parse_seed(v);
}

void parse_split_k(const std::string& v, AccelConfig& c) {
  if (v == "fixed") c.split_k = SplitK::Fixed;
  else if (v == "rows") c.split_k = SplitK::Rows;
  else fail(fmt::format("--split-k: unknown choice '{}' (fixed, rows)", v));
}

// "ZONE@BLOCK,...": each a zone of --features' FP8 zones in one block.
// `fp8_only`: the zone must be one of --features' FP8 zones (else any zone, under bf16).
std::set<ZoneUnit> parse_units(const std::string& flag, const std::string& v, const AccelConfig& c,
                               bool fp8_only = true) {
  if (fp8_only) need_fp8(c, flag);
  if (!c.bf16) fail(fmt::format("--{}: needs bf16 (e.g. --features bf16)", flag));
  std::set<ZoneUnit> units;
  for (const std::string& item : split(v, ",")) {
    const std::size_t at = item.find('@');
    const unsigned zone = at == std::string::npos ? 0 : zone_bits(item.substr(0, at));
    if (zone == 0 || zone == kAllZones) {
      fail(fmt::format("--{}: '{}' is not ZONE@BLOCK (zones qkv, attn_proj, mlp_fc, mlp_proj; e.g. mlp_fc@1)", flag,
                       item));
    }
    if (fp8_only && (c.fp8_zones & zone) == 0) {
      fail(fmt::format("--{}: zone {} is not one of --features' FP8 zones", flag, item.substr(0, at)));
    }
    units.insert({zone, parse_int(flag, item.substr(at + 1), 0, 1023, "a block index in 0..1023 after '@'")});
  }
  return units;
}

void parse_fp8_off(const std::string& v, AccelConfig& c) { c.fp8_off = parse_units("fp8-off", v, c); }
void parse_fp8_e5m2(const std::string& v, AccelConfig& c) { c.fp8_e5m2 = parse_units("fp8-e5m2", v, c); }
void parse_fp8_saturate(const std::string& v, AccelConfig& c) {
  c.fp8_saturate = parse_units("fp8-saturate", v, c);
}
void parse_bf16_off(const std::string& v, AccelConfig& c) { c.bf16_off = parse_units("bf16-off", v, c, false); }

void parse_fp8_recipe(const std::string& v, AccelConfig& c) {
  need_fp8(c, "fp8-recipe");
  if (v == "delayed") c.scaling.recipe = numerics::Fp8Recipe::Delayed;
  else if (v == "current") c.scaling.recipe = numerics::Fp8Recipe::Current;
  else fail(fmt::format("--fp8-recipe: unknown recipe '{}' (delayed, current)", v));
}

void parse_amax_history(const std::string& v, AccelConfig& c) {
  need_fp8(c, "amax-history");
  c.scaling.amax_history_len = parse_int("amax-history", v, 1, 1 << 20, "a history length in 1..1048576");
}

void parse_amax_algo(const std::string& v, AccelConfig& c) {
  need_fp8(c, "amax-algo");
  if (v == "max") c.scaling.amax_algo = numerics::AmaxAlgo::Max;
  else if (v == "most_recent") c.scaling.amax_algo = numerics::AmaxAlgo::MostRecent;
  else fail(fmt::format("--amax-algo: unknown algorithm '{}' (max, most_recent)", v));
}

void parse_margin(const std::string& v, AccelConfig& c) {
  need_fp8(c, "margin");
  c.scaling.margin = parse_int("margin", v, 0, 64, "a margin in 0..64 (powers of two)");
}

void parse_fp8_accumulate(const std::string& v, AccelConfig& c) {
  need_fp8(c, "fp8-accumulate");
  if (v == "full") c.accumulate_interval = 0;
  else if (v == "limited") c.accumulate_interval = 128;
  else if (v.rfind("limited:", 0) == 0) {
    c.accumulate_interval = parse_int("fp8-accumulate", v.substr(8), 1, 1 << 20, "limited:N with N in 1..1048576");
  } else {
    fail(fmt::format("--fp8-accumulate: '{}' is not full, limited or limited:N", v));
  }
}

// accel's flags, described once; parsed in this order (--noise before --noise-seed).
constexpr FlagParser<AccelConfig> kAccelFlags[] = {
    {{"noise", "accel reduction order: seeded (default), racy or off"}, parse_noise},
    {{"noise-seed", "accel: replay the noise of a seeded run (its manifest's noise_seed)", false, {}, true},
     parse_noise_seed},
    {{"split-k", "accel GEMM split-K: fixed (default, chunks of 64) or rows (chosen by the row count: batch-variant)",
      false, "noise"},
     parse_split_k},
    {{"fp8-recipe", "accel FP8 scaling: delayed (default) or current", false, "fp8"}, parse_fp8_recipe},
    {{"amax-history", "accel delayed scaling: amax history length (default 1024)", false, "fp8"}, parse_amax_history},
    {{"amax-algo", "accel delayed scaling: max (default) or most_recent", false, "fp8"}, parse_amax_algo},
    {{"margin", "accel FP8 scaling margin in powers of two (default 0)", false, "fp8"}, parse_margin},
    {{"fp8-accumulate", "accel FP8 GEMM accumulator: full (default) or limited[:N] (promote every N, default 128)",
      false, "fp8"},
     parse_fp8_accumulate},
    {{"fp8-off", "accel: FP8 units kept in bf16, ZONE@BLOCK,... (e.g. mlp_fc@1; what harness triage switches)", false,
      "fp8"},
     parse_fp8_off},
    {{"bf16-off", "accel: units computed in fp32 (FP8 included), ZONE@BLOCK,... (what harness triage switches)",
      false, "bf16"},
     parse_bf16_off},
    {{"fp8-e5m2", "accel fault: FP8 units whose forward operands are cast to E5M2 (coarser), ZONE@BLOCK,...", false,
      "fp8"},
     parse_fp8_e5m2},
    {{"fp8-saturate", "accel fault: FP8 units quantised with a scale 2^10 too large (operands clip), ZONE@BLOCK,...",
      false, "fp8"},
     parse_fp8_saturate},
};

}  // namespace

unsigned zone_bit(Fp8Zone zone) {
  switch (zone) {
    case Fp8Zone::None: return 0;
    case Fp8Zone::Qkv: return kZoneQkv;
    case Fp8Zone::AttnProj: return kZoneAttnProj;
    case Fp8Zone::MlpFc: return kZoneMlpFc;
    case Fp8Zone::MlpProj: return kZoneMlpProj;
  }
  return 0;
}

std::string units_text(const std::set<ZoneUnit>& units) {
  std::vector<std::string> words;
  for (const ZoneName& z : kZones) {
    for (const auto& [zone, block] : units) {
      if (zone == z.zone) words.push_back(fmt::format("{}@{}", z.name, block));
    }
  }
  return fmt::format("{}", fmt::join(words, ","));
}

std::string zone_name(unsigned zone) {
  for (const ZoneName& z : kZones) {
    if (z.zone == zone) return std::string(z.name);
  }
  return "none";
}

std::vector<std::string> AccelConfig::budget_features() const {
  std::vector<std::string> out{"noise"};
  if (bf16) out.emplace_back("bf16");
  if (fp8()) {
    out.emplace_back("fp8");
    if (accumulate_interval != 0) out.emplace_back("fp8-limited");
  }
  return out;
}

std::string AccelConfig::canonical_features() const {
  std::vector<std::string> parts;
  if (bf16) parts.emplace_back("bf16");
  if (fp8()) {
    std::string zones;
    if (fp8_zones == kAllZones) {
      zones = "all";
    } else {
      for (const ZoneName& z : kZones) {
        if ((fp8_zones & z.zone) == 0) continue;
        if (!zones.empty()) zones += ',';
        zones += z.name;
      }
    }
    parts.push_back(fmt::format("fp8={}", zones));
    const numerics::Fp8ScalingConfig defaults;
    if (scaling.recipe != defaults.recipe) parts.push_back(fmt::format("fp8-recipe={}", to_string(scaling.recipe)));
    if (scaling.amax_history_len != defaults.amax_history_len) {
      parts.push_back(fmt::format("amax-history={}", scaling.amax_history_len));
    }
    if (scaling.amax_algo != defaults.amax_algo) parts.push_back(fmt::format("amax-algo={}", to_string(scaling.amax_algo)));
    if (scaling.margin != defaults.margin) parts.push_back(fmt::format("margin={}", scaling.margin));
    if (accumulate_interval != 0) parts.push_back(fmt::format("fp8-accumulate=limited:{}", accumulate_interval));
    if (!fp8_off.empty()) parts.push_back(fmt::format("fp8-off={}", units_text(fp8_off)));
    if (!fp8_e5m2.empty()) parts.push_back(fmt::format("fp8-e5m2={}", units_text(fp8_e5m2)));
    if (!fp8_saturate.empty()) parts.push_back(fmt::format("fp8-saturate={}", units_text(fp8_saturate)));
  }
  if (!bf16_off.empty()) parts.push_back(fmt::format("bf16-off={}", units_text(bf16_off)));
  if (noise != NoiseMode::Seeded) parts.push_back(fmt::format("noise={}", to_string(noise)));
  if (split_k == SplitK::Rows) parts.emplace_back("split-k=rows");
  return fmt::format("{}", fmt::join(parts, "+"));
}

std::vector<EngineFlag> accel_flags() { return flags_of(kAccelFlags); }

AccelConfig parse_accel_config(const EngineSettings& settings) {
  AccelConfig c;
  parse_features(settings.features, c);
  apply_flags(kAccelFlags, settings, c);
  return c;
}

namespace {

// `config`'s units of the zones `zones` over `layers` blocks, less those in `off`.
std::vector<PrecisionUnit> switchable_units(unsigned zones, int layers, const std::set<ZoneUnit>& off) {
  std::vector<PrecisionUnit> units;
  for (const ZoneName& z : kZones) {
    if ((zones & z.zone) == 0) continue;
    for (int block = 0; block < layers; ++block) {
      if (off.count({z.zone, block}) == 0) units.push_back({std::string(z.name), block, units_text({{z.zone, block}})});
    }
  }
  return units;
}

}  // namespace

std::vector<PrecisionSwitch> precision_switches(const AccelConfig& config, int layers) {
  std::vector<PrecisionSwitch> switches;
  if (config.fp8()) {
    switches.push_back({"fp8", "fp8-off", "bf16", switchable_units(config.fp8_zones, layers, config.fp8_off)});
  }
  if (config.bf16) {
    switches.push_back({"bf16", "bf16-off", "fp32", switchable_units(kAllZones, layers, config.bf16_off)});
  }
  return switches;
}

}  // namespace harness::accel
